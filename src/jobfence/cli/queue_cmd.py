"""``jobfence queue list URL`` and ``jobfence queue publish|stats|dead-letters|requeue URL
NAME``. URL may be left out when ``JOBFENCE_URL`` is set (then NAME comes first)."""

from __future__ import annotations

import json
import logging
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

import click
from rich.table import Table

from ..errors import ConfigurationError, JobfenceError
from ..queue import Queue
from ._common import URL_ENV, client, console, url_and

log = logging.getLogger("jobfence.cli")


def _queue(url: str | None, name: str | None) -> AbstractContextManager[Queue]:
    """The queue ``NAME`` at ``URL`` (or ``NAME`` alone, at ``JOBFENCE_URL``)."""
    url, name = url_and(url, name, "queue NAME")
    return client(url, lambda u: Queue(u, name))


def _when(epoch: float | None) -> str:
    if epoch is None:
        return ""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


@click.group("queue")
def queue_group() -> None:
    """Publish to a queue and look at its messages."""


@queue_group.command("publish")
@click.argument("url")
@click.argument("name")
@click.argument("bodies", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the ids as one JSON list.")
@click.option("--id", "msg_id", help="The message id (one body only; default: a random id).")
@click.option("--header", "headers", multiple=True, metavar="K=V", help="A header (repeatable).")
@click.option(
    "--delay", type=float, default=0.0, show_default=True, help="Seconds before delivery."
)
@click.option(
    "--lines",
    type=click.File("r"),
    help="Publish each line of this file (- for stdin) as a JSON body.",
)
def publish(
    url: str,
    name: str,
    bodies: tuple[str, ...],
    msg_id: str | None,
    headers: tuple[str, ...],
    delay: float,
    lines: Any,
    as_json: bool,
) -> None:
    """Publish BODIES (JSON texts) to the queue NAME at URL; prints the message ids."""
    texts = list(bodies)
    if lines is not None:
        texts.extend(line for line in (raw.strip() for raw in lines) if line)
    if not texts:
        raise click.UsageError("give at least one JSON body, or --lines FILE")
    if msg_id is not None and len(texts) != 1:
        raise click.UsageError("--id goes with exactly one body")
    parsed: list[Any] = []
    for text in texts:
        try:
            parsed.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{text!r} is not JSON: {exc}", param_hint="BODIES") from None
    head: dict[str, str] = {}
    for item in headers:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--header")
        head[key] = value
    with _queue(url, name) as queue:
        ids = queue.publish_many(
            parsed, ids=None if msg_id is None else [msg_id], headers=head, delay=delay
        )
    if as_json:
        click.echo(json.dumps({"queue": name, "ids": ids}))
        return
    for i in ids:
        click.echo(i)


@queue_group.command("stats")
@click.argument("url", required=False)
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def stats(url: str | None, name: str | None, as_json: bool) -> None:
    """Message counts of the queue NAME at URL: ready, delayed, in flight, dead."""
    with _queue(url, name) as queue:
        counts = queue.stats()
        name = queue.name
    values = {
        "ready": counts.ready,
        "delayed": counts.delayed,
        "in_flight": counts.in_flight,
        "dead": counts.dead,
    }
    if as_json:
        click.echo(json.dumps({"queue": name, **values}))
        return
    table = Table(title=f"queue {name}")
    for column in values:
        table.add_column(column, justify="right")
    table.add_row(*("?" if v is None else str(v) for v in values.values()))
    console().print(table)


@queue_group.command("dead-letters")
@click.argument("url", required=False)
@click.argument("name", required=False)
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one per message.")
def dead_letters(url: str | None, name: str | None, limit: int, as_json: bool) -> None:
    """The dead letters of the queue NAME at URL, oldest first, with their last error."""
    with _queue(url, name) as queue:
        dead = queue.dead_letters(limit)
        name = queue.name
    if as_json:
        for d in dead:
            click.echo(
                json.dumps(
                    {
                        "id": d.id,
                        "body": d.body.decode("utf-8", "replace"),
                        "headers": d.headers,
                        "deliveries": d.deliveries,
                        "error": d.error,
                        "dead_at": _when(d.dead_at) or None,
                    }
                )
            )
        return
    table = Table(title=f"dead letters of {name} ({len(dead)})")
    for column in ("id", "deliveries", "dead at", "error", "body"):
        table.add_column(column)
    for d in dead:
        body = d.body.decode("utf-8", "replace")
        table.add_row(d.id, str(d.deliveries), _when(d.dead_at), d.error or "", body[:200])
    console().print(table)


@queue_group.command("requeue")
@click.argument("url", required=False)
@click.argument("name", required=False)
@click.option("--id", "ids", multiple=True, help="Requeue only this dead letter (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def requeue(url: str | None, name: str | None, ids: tuple[str, ...], as_json: bool) -> None:
    """Publish the dead letters of the queue NAME at URL again (all, or --id ones). Logs
    what it requeued at WARNING on the jobfence.cli logger."""
    with _queue(url, name) as queue:
        count = queue.requeue_dead(list(ids) or None)
        name, where = queue.name, queue.url
    log.warning(
        "requeued %d dead letter(s) of queue %r at %s%s",
        count,
        name,
        where,
        f" (ids {', '.join(ids)})" if ids else " (all)",
    )
    if as_json:
        click.echo(json.dumps({"queue": name, "requeued": count, "ids": list(ids) or None}))
        return
    click.echo(f"requeued {count} message(s)")


@queue_group.command("list")
@click.argument("url", envvar=URL_ENV, required=False)
@click.option(
    "--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
    help="At most this many queues.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one per queue.")
def list_queues(url: str | None, limit: int, as_json: bool) -> None:
    """The queues at URL that hold messages, with their counts (ready, delayed, in flight,
    dead). RabbitMQ cannot list its queues over AMQP: give the names to ``stats``."""
    if not url:
        raise click.UsageError(f"give the queue URL, or set {URL_ENV}")
    try:
        names = Queue.names(url, limit=limit)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except JobfenceError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = []
    for name in names:
        with _queue(url, name) as queue:
            counts = queue.stats()
        rows.append(
            {
                "queue": name,
                "ready": counts.ready,
                "delayed": counts.delayed,
                "in_flight": counts.in_flight,
                "dead": counts.dead,
            }
        )
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    table = Table(title=f"queues ({len(rows)})")
    for column in ("queue", "ready", "delayed", "in_flight", "dead"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for row in rows:
        table.add_row(*("?" if v is None else str(v) for v in row.values()))
    console().print(table)
