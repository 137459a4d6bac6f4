"""``jobfence redis migrate-keys URL``: move the keys earlier versions laid out differently (a
namespace, lock name or inbox key holding a brace) to their current keys
(``jobfence.backends.redis.migrate``)."""

from __future__ import annotations

import json
import logging

import click

from ..backends import backend_for, parse_backend_url
from ..errors import JobfenceError
from ._common import NAMESPACE_ENV, URL_ENV, user

log = logging.getLogger("jobfence.cli")


@click.group("redis")
def redis_group() -> None:
    """Redis maintenance: move keys of an earlier layout."""


@redis_group.command("migrate-keys")
@click.argument("url", envvar=URL_ENV, required=False)
@click.option(
    "--namespace",
    "namespaces",
    multiple=True,
    envvar=NAMESPACE_ENV,
    help="Namespace of locks and queues to migrate (repeatable; default: jobfence).",
)
@click.option(
    "--table",
    "tables",
    multiple=True,
    help="Inbox table to migrate (repeatable; default: jobfence_inbox).",
)
@click.option("--dry-run", is_flag=True, help="Only list the keys that would move.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def migrate_keys(
    url: str | None,
    namespaces: tuple[str, ...],
    tables: tuple[str, ...],
    dry_run: bool,
    as_json: bool,
) -> None:
    """Move the leases, queues and inbox records that earlier versions kept under another key
    to their current keys.

    Only names, namespaces and inbox keys holding a brace ({ or }) changed key; everything
    else is left alone. Stop the workers of the previous version first (a key they write
    afterwards is in the old layout again). A key whose new key exists already is left in
    place and reported. Logs each move at WARNING on the jobfence.cli logger.
    """
    from ..backends.redis.client import connect_redis
    from ..backends.redis.migrate import migrate_keys as migrate

    if not url:
        raise click.UsageError(f"give the Redis URL, or set {URL_ENV}")
    try:
        parsed = parse_backend_url(url)
        if backend_for(parsed.scheme).name != "redis":
            raise click.UsageError(f"migrate-keys needs a Redis URL (redis://...), got {url!r}")
        redis_client = connect_redis(parsed, {}, what="migrate-keys", own=("namespace", "table"))
    except JobfenceError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        done = migrate(
            redis_client,
            namespaces=namespaces or ("jobfence",),
            tables=tables or ("jobfence_inbox",),
            dry_run=dry_run,
        )
    finally:
        redis_client.close()
    if not dry_run:
        for old, new in done.moved:
            log.warning("redis key %r moved to %r by %s", old, new, user())
    if as_json:
        payload = {
            "dry_run": dry_run,
            "moved": [{"from": old, "to": new} for old, new in done.moved],
            "conflicts": [{"from": old, "to": new} for old, new in done.conflicts],
        }
        click.echo(json.dumps(payload))
        return
    verb = "would move" if dry_run else "moved"
    for old, new in done.moved:
        click.echo(f"{verb} {old!r} -> {new!r}")
    for old, new in done.conflicts:
        click.echo(f"left {old!r} in place: {new!r} exists already")
    click.echo(
        f"{verb} {len(done.moved)} key{'' if len(done.moved) == 1 else 's'}, "
        f"{len(done.conflicts)} conflict{'' if len(done.conflicts) == 1 else 's'}"
    )
