"""``jobfence relay OUTBOX_URL --to URL`` runs a relay of the transactional outbox until
SIGTERM/SIGINT; ``jobfence outbox list|show|stats|dead|retry|purge|install OUTBOX_URL`` looks
at the outbox's rows and acts on them; and :func:`relay_beside` runs a relay beside
``jobfence worker --relay``.

The outbox URL may come from ``JOBFENCE_URL`` and the table from ``JOBFENCE_OUTBOX_TABLE``.
Output is a Rich table on a terminal (not cut to 80 columns elsewhere), or JSON with
``--json``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from types import FrameType
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from .._core.clock import get_clock
from .._core.url import mask_url
from .._core.validate import MAX_LISTING, check_queue_name
from ..errors import ConfigurationError, JobfenceError, SchemaMissing
from ._common import URL_ENV, client, console, duration_text, load_object, user

if TYPE_CHECKING:
    from ..backends.base import OutboxEntry, OutboxStats

__all__ = [
    "DEFAULT_TABLE",
    "STATES",
    "entry_dict",
    "find_entry",
    "make_relay",
    "outbox_group",
    "relay_beside",
    "relay_command",
    "stats_dict",
]

log = logging.getLogger("jobfence.cli")
relay_log = logging.getLogger("jobfence.relay")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: where the commands find the outbox's table when no --table is given
TABLE_ENV = "JOBFENCE_OUTBOX_TABLE"
DEFAULT_TABLE = "jobfence_outbox"
#: the states of a row, as ``Outbox.entries(state=...)`` takes them
STATES = ("pending", "claimed", "published", "dead")
#: rows read per page when ``show`` looks for one id
PAGE = 1000

#: the Relay's keyword arguments and the options that give them (for error messages)
RELAY_OPTIONS = {
    "queues": "--queue",
    "batch": "--batch",
    "lease": "--lease",
    "max_attempts": "--max-attempts",
    "retention": "--retention",
    "poll": "--poll",
    "name": "--name",
    "to": "--to",
    "table": "--table",
    "url": "OUTBOX_URL",
    "outbox": "OUTBOX_URL",
}


# -- rendering -------------------------------------------------------------------------------


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def _body(raw: bytes) -> Any:
    """The row's body decoded from JSON (its text when it is not JSON)."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def entry_dict(entry: OutboxEntry, *, body: bool = True) -> dict[str, Any]:
    """One outbox row, JSON-ready (times as ISO 8601 UTC, body decoded)."""
    made: dict[str, Any] = {
        "seq": entry.seq,
        "id": entry.id,
        "queue": entry.queue,
        "key": entry.key,
        "state": entry.state,
        "attempts": entry.attempts,
        "created_at": _iso(entry.created_at),
        "age": round(get_clock().time() - entry.created_at, 3),
        "available_at": _iso(entry.available_at),
        "claimed_by": entry.claimed_by,
        "claimed_until": _iso(entry.claimed_until),
        "published_at": _iso(entry.published_at),
        "last_error": entry.last_error,
        "headers": dict(entry.headers),
    }
    if body:
        made["body"] = _body(entry.body)
    return made


def stats_dict(stats: OutboxStats) -> dict[str, Any]:
    return {
        "pending": stats.pending,
        "claimed": stats.claimed,
        "published": stats.published,
        "dead": stats.dead,
        "oldest_pending": None if stats.oldest_pending is None else round(stats.oldest_pending, 3),
    }


def find_entry(outbox: Any, msg_id: str) -> OutboxEntry | None:
    """The row whose message id is ``msg_id``, read page by page in ``seq`` order (the
    admin views list rows, they do not look one up)."""
    after: int | None = None
    while True:
        page: list[OutboxEntry] = outbox.entries(limit=PAGE, after=after)
        for entry in page:
            if entry.id == msg_id:
                return entry
        if len(page) < PAGE:
            return None
        after = page[-1].seq


def _rows_table(title: str, entries: list[OutboxEntry], *, errors: bool) -> Table:
    grid = Table(title=title, title_justify="left")
    columns = ["seq", "id", "queue", "key", "state", "attempts", "age"]
    columns.append("last error" if errors else "published")
    for column in columns:
        grid.add_column(column, justify="right" if column in ("seq", "attempts", "age") else "left")
    now = get_clock().time()
    for entry in entries:
        last = (entry.last_error or "") if errors else (_iso(entry.published_at) or "")
        grid.add_row(
            str(entry.seq),
            Text(entry.id),
            Text(entry.queue),
            Text(entry.key or ""),
            entry.state,
            str(entry.attempts),
            duration_text(now - entry.created_at),
            Text(last),
        )
    return grid


# -- the outbox client -----------------------------------------------------------------------


def _open(url: str, table: str) -> Any:
    from .. import Outbox

    return Outbox(url, table=table)


_URL = click.argument("url", metavar="OUTBOX_URL", envvar=URL_ENV, required=False)
_TABLE = click.option(
    "--table",
    envvar=TABLE_ENV,
    default=DEFAULT_TABLE,
    show_default=True,
    help=f"The outbox's table (or {TABLE_ENV}).",
)
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _url_then(url: str | None, rest: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """``OUTBOX_URL ID...``, or ``ID...`` alone with the URL from ``JOBFENCE_URL``: Click
    fills the positional arguments in order, so a first id arrives as ``url`` (an id never
    holds ``://``)."""
    if url is not None and "://" not in url:
        return os.environ.get(URL_ENV) or None, (url, *rest)
    return url, rest


@click.group("outbox")
def outbox_group() -> None:
    """See the transactional outbox's rows: how many wait, which are dead and why; put dead
    rows back, delete old published rows.

    OUTBOX_URL is the database the rows live in (postgresql://, mysql://, sqlite:///...);
    when it is left out, JOBFENCE_URL is used.
    """


@outbox_group.command("list")
@_URL
@click.option("--state", type=click.Choice(STATES), default=None, help="Only rows in this state.")
@click.option("--queue", default=None, metavar="NAME", help="Only rows for this queue.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LISTING),
    default=100,
    show_default=True,
    help="At most this many rows.",
)
@click.option(
    "--after", type=click.IntRange(0), default=None, metavar="SEQ", help="Only rows after SEQ."
)
@_TABLE
@_JSON
def list_rows(
    url: str | None,
    state: str | None,
    queue: str | None,
    limit: int,
    after: int | None,
    table: str,
    as_json: bool,
) -> None:
    """The outbox's rows in insertion order: id, queue, key, state, attempts, age."""
    if queue is not None:
        _queue_names((queue,), "--queue")
    with client(url, lambda u: _open(u, table)) as outbox:
        entries = _checked(
            lambda: outbox.entries(state=state, queue=queue, limit=limit, after=after), "--queue"
        )
        title = f"outbox {outbox.table} ({len(entries)}{f' {state}' if state else ''})"
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry_dict(entry)))
        return
    console().print(_rows_table(title, entries, errors=state != "published"))


def _checked(call: Callable[[], Any], option: str) -> Any:
    """``call()``, a ConfigurationError naming ``option`` (a bad --queue name)."""
    try:
        return call()
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from exc


def _queue_names(names: tuple[str, ...], option: str) -> list[str]:
    """The queue names given with ``option``, checked (a usage error naming it)."""
    checked: list[str] = []
    for name in names:
        try:
            checked.append(check_queue_name(name, argument=option))
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from exc
    return checked


def check_queue_url(url: str, option: str) -> str:
    """``url`` if a queue backend serves its scheme; a usage error naming ``option``."""
    from ..backends.registry import backend_for, parse_backend_url

    def check() -> str:
        backend_for(parse_backend_url(url, argument=option).scheme, "queue", argument=option)
        return url

    return str(_checked(check, option))


@outbox_group.command("show")
@_URL
@click.argument("msg_id", metavar="ID", required=False)
@_TABLE
@_JSON
def show(url: str | None, msg_id: str | None, table: str, as_json: bool) -> None:
    """The row of message ID, with its body and headers; exits with 1 when there is none."""
    url, ids = _url_then(url, () if msg_id is None else (msg_id,))
    if len(ids) != 1:
        raise click.UsageError("give the message ID")
    (msg_id,) = ids
    with client(url, lambda u: _open(u, table)) as outbox:
        entry = find_entry(outbox, msg_id)
        where = outbox.table
    if as_json:
        click.echo(json.dumps(None if entry is None else entry_dict(entry)))
    elif entry is None:
        click.echo(f"{msg_id!r} has no row in the outbox {where}")
    else:
        out = console()
        for field, value in entry_dict(entry).items():
            shown = json.dumps(value) if field in ("body", "headers") else value
            out.print(Text(f"{field}: {'' if shown is None else shown}"))
    if entry is None:
        raise SystemExit(1)


@outbox_group.command("stats")
@_URL
@_TABLE
@_JSON
def stats(url: str | None, table: str, as_json: bool) -> None:
    """How many rows are pending, claimed by a relay, published (kept for the retention)
    and dead, and the age of the oldest row not yet published."""
    with client(url, lambda u: _open(u, table)) as outbox:
        counts = stats_dict(outbox.stats())
        where = outbox.table
    if as_json:
        click.echo(json.dumps({"table": where, **counts}))
        return
    grid = Table(title=f"outbox {where}", title_justify="left")
    for column in ("pending", "claimed", "published", "dead", "oldest pending"):
        grid.add_column(column, justify="right")
    grid.add_row(
        *(str(counts[k]) for k in ("pending", "claimed", "published", "dead")),
        duration_text(counts["oldest_pending"]) or "-",
    )
    console().print(grid)


@outbox_group.command("dead")
@_URL
@click.option("--queue", default=None, metavar="NAME", help="Only rows for this queue.")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LISTING),
    default=100,
    show_default=True,
    help="At most this many rows.",
)
@_TABLE
@_JSON
def dead(url: str | None, queue: str | None, limit: int, table: str, as_json: bool) -> None:
    """The dead rows (a relay gave up on them after --max-attempts failures) with their
    attempts and last error. Put them back with ``jobfence outbox retry``."""
    if queue is not None:
        _queue_names((queue,), "--queue")
    with client(url, lambda u: _open(u, table)) as outbox:
        entries = _checked(
            lambda: outbox.entries(state="dead", queue=queue, limit=limit), "--queue"
        )
        title = f"outbox {outbox.table}: {len(entries)} dead"
    if as_json:
        for entry in entries:
            click.echo(json.dumps(entry_dict(entry)))
        return
    console().print(_rows_table(title, entries, errors=True))


@outbox_group.command("retry")
@_URL
@click.argument("ids", metavar="[ID]...", nargs=-1)
@click.option("--all", "every", is_flag=True, help="Put back every dead row.")
@_TABLE
@_JSON
def retry(url: str | None, ids: tuple[str, ...], every: bool, table: str, as_json: bool) -> None:
    """Make the dead rows IDs (or every dead row, with --all) pending again, their attempts
    reset: the relays publish them at their next claim. Logged at WARNING on the
    jobfence.cli logger. Exits with 1 when an ID was not a dead row."""
    url, ids = _url_then(url, ids)
    if every and ids:
        raise click.UsageError("give the dead rows' IDs or --all, not both")
    if not every and not ids:
        raise click.UsageError("give the IDs of the dead rows to retry, or --all")
    wanted = None if every else list(dict.fromkeys(ids))
    with client(url, lambda u: _open(u, table)) as outbox:
        count = outbox.retry_dead(wanted)
        where, shown = outbox.table, mask_url(outbox.url)
    log.warning(
        "outbox %s at %s: %s retried by %s@%s (pid %d): %d made pending",
        where,
        shown,
        "every dead row" if wanted is None else "dead row(s) " + ", ".join(map(repr, wanted)),
        user(),
        socket.gethostname(),
        os.getpid(),
        count,
    )
    if as_json:
        click.echo(json.dumps({"retried": count}))
    else:
        click.echo(f"retried {count} dead row{'' if count == 1 else 's'} of {where}")
    if wanted is not None and count < len(wanted):
        if not as_json:
            click.echo(f"{len(wanted) - count} of the IDs given were not dead rows", err=True)
        raise SystemExit(1)


@outbox_group.command("purge")
@_URL
@click.option(
    "--retention",
    type=click.FloatRange(min=0),
    default=None,
    metavar="SECONDS",
    help="Delete the rows published more than SECONDS ago (default: 600).",
)
@_TABLE
@_JSON
def purge(url: str | None, retention: float | None, table: str, as_json: bool) -> None:
    """Delete the published rows kept past their retention (the relays do it too, as they
    run) and print how many. Pending and dead rows are never deleted."""
    with client(url, lambda u: _open(u, table)) as outbox:
        count = outbox.purge(retention)
        where = outbox.table
    if as_json:
        click.echo(json.dumps({"purged": count}))
    else:
        click.echo(f"purged {count} published row{'' if count == 1 else 's'} from {where}")


@outbox_group.command("install")
@_URL
@_TABLE
def install(url: str | None, table: str) -> None:
    """Create the outbox's table (idempotent), as ``Outbox.install()`` does."""
    with client(url, lambda u: _open(u, table)) as outbox:
        outbox.install()
        where = outbox.table
    click.echo(f"outbox table {where} is installed")


# -- the relay -------------------------------------------------------------------------------


def make_relay(
    outbox: Any, to: Any, *, param_hints: dict[str, str] | None = None, **options: Any
) -> Any:
    """``Relay(outbox, to, **options)``; a ConfigurationError is a usage error naming the
    option (``param_hints`` maps the Relay's argument names to the command's options)."""
    from .. import Relay

    hints = {**RELAY_OPTIONS, **(param_hints or {})}
    try:
        return Relay(outbox, to, **options)
    except ConfigurationError as exc:
        hint = hints.get(exc.argument or "")
        if hint is None:
            raise click.UsageError(str(exc)) from exc
        raise click.BadParameter(str(exc), param_hint=hint) from exc


def _stats_line(stats: Any) -> str:
    """``published 12, failed 1, dead 0, released 0, batches 3`` (and the last error)."""
    parts = [
        f"{field} {getattr(stats, field)}"
        for field in ("published", "failed", "dead", "released", "batches")
    ]
    last = getattr(stats, "last_error", None)
    return ", ".join(parts) + (f"; last error: {last}" if last else "")


def _check_table(outbox: Any) -> None:
    """Read the outbox once before the relay starts (which creates its table when missing):
    a table the relay cannot use (of another schema version, say) stops the command with its
    message; a database that is down is only a warning: the relay retries it."""
    try:
        outbox.stats()
    except (SchemaMissing, ConfigurationError) as exc:
        raise click.ClickException(str(exc)) from exc
    except JobfenceError as exc:
        relay_log.warning("the outbox does not answer yet (the relay retries it): %s", exc)


@contextmanager
def _stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``stop()`` while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        relay_log.info("%s: stopping", signal.Signals(signum).name)
        stop()

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in old:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@click.command("relay")
@click.argument("url", metavar="OUTBOX_URL", envvar=URL_ENV, required=False)
@click.option(
    "--to",
    "to",
    default=None,
    metavar="URL",
    help="The queue backend the rows are published to (redis://, amqp://, postgresql://, "
    "sqlite:///...): each row goes to the queue it names, its id as the message id.",
)
@click.option(
    "--target",
    "target_spec",
    default=None,
    metavar="MODULE:OBJ",
    help="Instead of --to: a target object (jobfence.integrations.outbox_targets.celery(app), "
    ".rq(...), .dramatiq(...), .arq(...)) or a callable send(rows), imported from MODULE.",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="NAME",
    help="Only relay the rows of this queue (repeatable; default: every queue).",
)
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds a claimed batch is held before another relay may take it.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="Failed publishes of a row before it is dead (an outage never counts).",
)
@click.option(
    "--retention",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds published rows are kept (0: deleted at once).",
)
@click.option(
    "--poll",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Longest wait between two looks at an idle outbox, in seconds.",
)
@click.option(
    "--name",
    default=None,
    help="The first part of the relay's owner id (name:pid:uuid), shown as claimed_by "
    "(default: the host name).",
)
@_TABLE
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
def relay_command(
    url: str | None,
    to: str | None,
    target_spec: str | None,
    queues: tuple[str, ...],
    batch: int,
    lease: float,
    max_attempts: int,
    retention: float,
    poll: float,
    name: str | None,
    table: str,
    log_level: str,
) -> None:
    """Publish the rows committed to the outbox at OUTBOX_URL (or JOBFENCE_URL) until
    SIGTERM/SIGINT: to the queues at --to URL, or to the --target MODULE:OBJ.

    Run as many as you like: claims are serialised, so a row is published by one relay and
    the rows of one key in order. On SIGTERM it finishes the batch in hand, gives back what it
    had not sent, prints its stats and exits with 0.
    """
    if not url:
        raise click.UsageError(f"give the OUTBOX_URL, or set {URL_ENV}")
    if (to is None) == (target_spec is None):
        raise click.UsageError("give where the rows go: --to URL or --target MODULE:OBJ (one)")
    destination: Any = to if to is None else check_queue_url(to, "--to")
    relayed = _queue_names(queues, "--queue")
    shown_to = "" if to is None else mask_url(to)
    if target_spec is not None:
        destination = load_object(target_spec, "--target")
        shown_to = target_spec
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    try:
        outbox = _open(url, table)
    except ConfigurationError as exc:
        raise click.BadParameter(
            str(exc), param_hint="--table" if exc.argument == "table" else "OUTBOX_URL"
        ) from exc
    except JobfenceError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        relay = make_relay(
            outbox,
            destination,
            queues=relayed or None,
            batch=batch,
            lease=lease,
            max_attempts=max_attempts,
            retention=retention,
            poll=poll,
            name=name,
            param_hints={"to": "--to" if to is not None else "--target"},
        )
        _check_table(outbox)
        click.echo(
            f"jobfence relay: {mask_url(outbox.url)} table {outbox.table} -> {shown_to} "
            f"(queues: {', '.join(queues) if queues else 'all'}; batch {batch}, lease "
            f"{lease:g} s, max attempts {max_attempts}, retention {retention:g} s)"
        )
        sys.stdout.flush()
        try:
            with _stopped_by_signals(relay.stop):
                relay.run()
        except KeyboardInterrupt:
            relay.stop()
        except ConfigurationError as exc:
            raise click.UsageError(str(exc)) from exc
        except JobfenceError as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            click.echo(f"jobfence relay stopped: {_stats_line(relay.stats)}")
    finally:
        try:
            outbox.close()
        except JobfenceError:
            pass


def relay_beside(
    outbox_url: str, to: str, queues: list[str], *, table: str = DEFAULT_TABLE
) -> Callable[[], Any]:
    """Start a relay of ``outbox_url`` (its rows of ``queues``) publishing to the queues at
    ``to``, in a thread of its own (its signals are the caller's); return the function that
    stops it, waits for it, closes it and returns its stats."""
    queues = _queue_names(tuple(queues), "--relay-queue")
    try:
        outbox = _open(outbox_url, table)
    except ConfigurationError as exc:
        option = "--outbox-table" if exc.argument == "table" else "--relay"
        raise click.BadParameter(str(exc), param_hint=option) from exc
    except JobfenceError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        relay = make_relay(
            outbox,
            to,
            queues=queues,
            handle_signals=False,  # the worker's: its finish() stops the relay
            param_hints={
                "url": "--relay",
                "outbox": "--relay",
                "queues": "--relay-queue",
                "to": "--queue",
            },
        )
        _check_table(outbox)
    except BaseException:
        outbox.close()
        raise
    failed: list[BaseException] = []

    def body() -> None:
        try:
            relay.run()
        except BaseException as exc:  # reported by finish(); the worker keeps running
            failed.append(exc)
            relay_log.exception("the relay failed")

    thread = threading.Thread(target=body, name="jobfence-relay", daemon=True)
    thread.start()
    relay_log.info(
        "relaying the outbox %s table %s (queues: %s) to %s",
        mask_url(outbox.url),
        outbox.table,
        ", ".join(queues),
        mask_url(to),
    )

    def finish() -> Any:
        relay.stop()
        thread.join()
        try:
            outbox.close()
        except JobfenceError:
            pass
        relay_log.info("relay stopped: %s", _stats_line(relay.stats))
        if failed:
            raise click.ClickException(f"the relay failed: {failed[0]!r}")
        return relay.stats

    return finish
