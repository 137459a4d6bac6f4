"""``jobfence inbox list|show|purge URL``: the inbox's records, one key's record, and deleting
expired records or chosen keys by hand.

The URL may come from ``JOBFENCE_URL`` and the table from ``JOBFENCE_INBOX_TABLE``. Output is a
Rich table on a terminal (not cut to 80 columns elsewhere), or JSON with ``--json``.
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

from .._core.inbox_support import DEFAULT_TABLE
from .._core.validate import MAX_LISTING
from ..backends.base import ClaimInfo, ClaimState
from ..inbox import Inbox
from ._common import URL_ENV, client, console, duration_text, url_and, user

log = logging.getLogger("jobfence.cli")

TABLE_ENV = "JOBFENCE_INBOX_TABLE"


def _as_dict(info: ClaimInfo) -> dict[str, Any]:
    age = info.age
    return {
        "key": info.key,
        "state": info.state.value,
        "owner": info.owner,
        "attempt": info.attempt,
        "fingerprint": info.fingerprint,
        "claimed_at": None if info.claimed_at is None else info.claimed_at.isoformat(),
        "age": None if age is None else round(age, 3),
        "expires_in": round(info.expires_in, 3),
        "stuck": info.stuck,
    }


def _describe(info: ClaimInfo) -> str:
    parts = [info.state.value + (" (stuck)" if info.stuck else ""), f"attempt {info.attempt}"]
    if info.owner is not None:
        parts.append(f"owner {info.owner}")
    if info.fingerprint is not None:
        parts.append(f"fingerprint {info.fingerprint}")
    if info.claimed_at is not None:
        parts.append(f"claimed at {info.claimed_at.isoformat()} ({duration_text(info.age)} ago)")
    what = "deadline" if info.state is ClaimState.IN_PROGRESS else "retention ends"
    if info.expires_in >= 0:
        parts.append(f"{what} in {duration_text(info.expires_in)}")
    else:
        parts.append(f"{what} passed {duration_text(-info.expires_in)} ago")
    return ", ".join(parts)


_URL = click.argument("url", envvar=URL_ENV, required=False)
_TABLE = click.option(
    "--table",
    envvar=TABLE_ENV,
    default=DEFAULT_TABLE,
    show_default=True,
    help=f"The inbox's table (SQL) or key prefix (Redis, memory) (or {TABLE_ENV}).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group("inbox")
def inbox_group() -> None:
    """See the inbox's records: which keys are in progress, stuck or completed; delete
    expired records, or forget a key so that its work runs again.

    URL is the inbox backend (redis://, postgresql://, mysql://, sqlite:///...); when it is
    left out, JOBFENCE_URL is used.
    """


@inbox_group.command("list")
@_URL
@click.option(
    "--state",
    type=click.Choice([ClaimState.IN_PROGRESS.value, ClaimState.COMPLETED.value]),
    default=None,
    help="Only records in this state.",
)
@click.option(
    "--stuck",
    is_flag=True,
    help="Only claims in progress past their deadline (a dead, hung or released worker's).",
)
@click.option("--prefix", default="", help="Only keys starting with this (taken literally).")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LISTING),
    default=100,
    show_default=True,
    help="At most this many records.",
)
@_TABLE
@_JSON
def list_records(
    url: str | None,
    state: str | None,
    stuck: bool,
    prefix: str,
    limit: int,
    table: str,
    as_json: bool,
) -> None:
    """The inbox's records at URL, by key: state, attempt, owner, age, time left."""
    if stuck and state == ClaimState.COMPLETED.value:
        raise click.UsageError(
            "--stuck lists claims in progress: it cannot go with --state completed"
        )
    with client(url, lambda u: Inbox(u, table=table)) as inbox:
        if stuck:  # the stuck ones among (at most MAX_LISTING) claims in progress
            found = inbox.claims(state=ClaimState.IN_PROGRESS, prefix=prefix, limit=MAX_LISTING)
            records = [info for info in found if info.stuck][:limit]
        else:
            records = inbox.claims(state=state, prefix=prefix, limit=limit)
        title = f"inbox {inbox.table} ({len(records)}{' stuck' if stuck else ''})"
    if as_json:
        for info in records:
            click.echo(json.dumps(_as_dict(info)))
        return
    grid = Table(title=title)
    for column in ("key", "state", "attempt", "owner", "age", "expires in"):
        grid.add_column(
            column, justify="right" if column in ("attempt", "age", "expires in") else "left"
        )
    for info in records:
        grid.add_row(
            Text(info.key),
            info.state.value + (" (stuck)" if info.stuck else ""),
            str(info.attempt),
            Text(info.owner or ""),
            duration_text(info.age),
            duration_text(info.expires_in),
        )
    console().print(grid)


@inbox_group.command("show")
@_URL
@click.argument("key", required=False)
@_TABLE
@_JSON
def show(url: str | None, key: str | None, table: str, as_json: bool) -> None:
    """The record of the idempotency KEY at URL; exits with 1 when there is none."""
    url, key = url_and(url, key, "idempotency KEY")
    with client(url, lambda u: Inbox(u, table=table)) as inbox:
        info = inbox.claim_info(key)
        where = inbox.table
    if as_json:
        click.echo(json.dumps(None if info is None else _as_dict(info)))
    elif info is None:
        click.echo(f"{key!r} has no record in the inbox {where}")
    else:
        console().print(Text(f"{key}: {_describe(info)}"))
    if info is None:
        raise SystemExit(1)


@inbox_group.command("purge")
@_URL
@click.option(
    "--key",
    "keys",
    multiple=True,
    help="Forget this key's record whatever its state (repeatable; needs --yes).",
)
@click.option("--yes", is_flag=True, help="Really forget the --key records (required with --key).")
@_TABLE
@_JSON
def purge(url: str | None, keys: tuple[str, ...], yes: bool, table: str, as_json: bool) -> None:
    """Delete the expired records at URL (completed ones past their retention, claims
    abandoned for longer than the default retention) and print how many. On Redis, where
    records expire by themselves, there is nothing to delete: it checks that the server
    answers and prints 0.

    With --key (and --yes): forget those keys instead, whatever their state. The next claim
    of a forgotten key runs its work again; a worker still holding it finds its claim lost
    (its complete() raises ClaimLost). Logs each key forgotten at WARNING on the jobfence.cli
    logger. Exits with 1 when a key had no record.
    """
    if keys and not yes:
        raise click.UsageError(
            f"refusing to forget {', '.join(repr(k) for k in keys)} without --yes: the next "
            "claim of a forgotten key runs its work again, and a worker still holding it "
            "loses its claim"
        )
    if yes and not keys:
        raise click.UsageError("--yes confirms --key: give the keys to forget")
    if not keys:
        with client(url, lambda u: Inbox(u, table=table)) as inbox:
            count = inbox.purge()  # also where records expire by themselves: it checks the server
            where, kind = inbox.table, inbox.backend.kind
            native = inbox.capabilities.native_expiry
        if as_json:
            click.echo(json.dumps({"purged": count}))
        else:
            plural = "" if count == 1 else "s"
            note = f" ({kind} expires the records by itself; the server answered)" if native else ""
            click.echo(f"purged {count} expired record{plural} from {where}{note}")
        return
    missing = 0
    with client(url, lambda u: Inbox(u, table=table)) as inbox:
        for key in keys:
            info = inbox.claim_info(key)
            forgotten = inbox.forget(key)
            if not forgotten:
                missing += 1
                if as_json:
                    click.echo(json.dumps({"key": key, "forgotten": False, "was": None}))
                else:
                    click.echo(f"{key!r} had no record: nothing forgotten")
                continue
            described = _describe(info) if info is not None else "(read as it was deleted)"
            log.warning(
                "inbox key %r in %s at %s forgotten by %s@%s (pid %d): it was %s",
                key,
                inbox.table,
                inbox.url,
                user(),
                socket.gethostname(),
                os.getpid(),
                described,
            )
            if as_json:
                was = None if info is None else _as_dict(info)
                click.echo(json.dumps({"key": key, "forgotten": True, "was": was}))
            else:
                console().print(Text(f"forgot {key}: it was {described}"))
    if missing:
        raise SystemExit(1)
