"""``jobfence locks list|show|break URL``: who holds which lock, and breaking one by hand.

The URL may come from ``JOBFENCE_URL`` and the namespace from ``JOBFENCE_NAMESPACE``. Output
is a Rich table on a terminal (not cut to 80 columns elsewhere), or JSON with ``--json``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..backends.base import LockHolder
from ..locks import Locks
from ._common import NAMESPACE_ENV, URL_ENV, client, console, url_and
from ._common import user as _user

log = logging.getLogger("jobfence.cli")


def _left(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}s"


def _as_dict(name: str, holder: LockHolder) -> dict[str, Any]:
    return {
        "name": name,
        "owner": holder.owner,
        "token": holder.token,
        "expires_in": None if holder.expires_in is None else round(holder.expires_in, 3),
    }


def _describe(holder: LockHolder) -> str:
    parts = [f"held by {holder.owner or '(unknown owner)'}"]
    if holder.token is not None:
        parts.append(f"token {holder.token}")
    if holder.expires_in is not None:
        parts.append(f"{_left(holder.expires_in)} left")
    return ", ".join(parts)


_URL = click.argument("url", envvar=URL_ENV, required=False)
_NAMESPACE = click.option(
    "--namespace",
    envvar=NAMESPACE_ENV,
    default="jobfence",
    show_default=True,
    help=f"Key/table prefix of the locks (or {NAMESPACE_ENV}).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group("locks")
def locks_group() -> None:
    """See who holds which lock; break a lock whose holder is stuck.

    URL is the lock backend (redis://, postgresql://, mysql://, sqlite:///...); when it is
    left out, JOBFENCE_URL is used.
    """


@locks_group.command("list")
@_URL
@click.option("--prefix", default="", help="Only names starting with this.")
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="At most this many leases.",
)
@_NAMESPACE
@_JSON
def list_locks(url: str | None, prefix: str, limit: int, namespace: str, as_json: bool) -> None:
    """The live leases at URL, by name: holder, fencing token, time left."""
    with client(url, lambda u: Locks(u, namespace=namespace)) as locks:
        held = locks.holders(prefix, limit)
    if as_json:
        for name, holder in held:
            click.echo(json.dumps(_as_dict(name, holder)))
        return
    table = Table(title=f"locks held in {namespace} ({len(held)})")
    for column in ("name", "owner", "token", "left"):
        table.add_column(column, justify="right" if column in ("token", "left") else "left")
    for name, holder in held:
        table.add_row(
            Text(name),
            Text(holder.owner or ""),
            "" if holder.token is None else str(holder.token),
            _left(holder.expires_in),
        )
    console().print(table)


@locks_group.command("show")
@_URL
@click.argument("name", required=False)
@_NAMESPACE
@_JSON
def show(url: str | None, name: str | None, namespace: str, as_json: bool) -> None:
    """Who holds the lock NAME at URL now; exits with 1 when nobody does."""
    url, name = url_and(url, name, "lock NAME")
    with client(url, lambda u: Locks(u, namespace=namespace)) as locks:
        holder = locks.holder(name)
    if as_json:
        click.echo(json.dumps(None if holder is None else _as_dict(name, holder)))
    elif holder is None:
        click.echo(f"{name!r} is not held")
    else:
        console().print(Text(f"{name}: {_describe(holder)}"))
    if holder is None:
        raise SystemExit(1)


@locks_group.command("break")
@_URL
@click.argument("name", required=False)
@_NAMESPACE
@click.option("--yes", is_flag=True, help="Really break it (required).")
def break_lock(url: str | None, name: str | None, namespace: str, yes: bool) -> None:
    """Drop the lease on NAME at URL whoever holds it (needs --yes).

    The holder is not stopped: it finds its lease lost at its next renewal, and its fencing
    token is refused by fenced writes once a new holder writes. Meanwhile another worker may
    take the lock, so break only a lock whose holder is stuck or gone. Logs who broke what
    at WARNING on the jobfence.cli logger. Exits with 1 when nobody held it.
    """
    url, name = url_and(url, name, "lock NAME")
    if not yes:
        click.echo(
            f"refusing to break {name!r} without --yes: its holder may still be working, "
            "and another worker may take the lock at once",
            err=True,
        )
        raise SystemExit(2)
    with client(url, lambda u: Locks(u, namespace=namespace)) as locks:
        holder = locks.holder(name)
        dropped = locks.force_release(name)
        where = locks.url
    if not dropped:
        click.echo(f"{name!r} was not held: nothing broken")
        raise SystemExit(1)
    described = _describe(holder) if holder is not None else "held (holder unknown)"
    log.warning(
        "lock %r in namespace %r at %s broken by %s@%s (pid %d): it was %s",
        name,
        namespace,
        where,
        _user(),
        socket.gethostname(),
        os.getpid(),
        described,
    )
    console().print(Text(f"broke {name}: it was {described}"))
