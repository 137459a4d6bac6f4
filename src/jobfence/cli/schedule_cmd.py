"""``jobfence scheduler MODULE:OBJ`` runs a scheduler's loop; ``jobfence schedule
list|show|pause|resume|trigger MODULE:OBJ [NAME]`` looks at and acts on its schedules; and
:func:`run_beside` runs a scheduler beside ``jobfence worker --scheduler``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import click
from rich.table import Table

from ..errors import ConfigurationError, JobfenceError
from ..scheduler import Scheduler
from ..scheduler_async import AsyncScheduler
from ._common import console, load_object

__all__ = ["load_scheduler", "run_beside", "schedule_group", "scheduler_command"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
log = logging.getLogger("jobfence.scheduler")


def load_scheduler(spec: str, param_hint: str = "SCHEDULER") -> Scheduler | AsyncScheduler:
    """``module:name`` (``name`` may be dotted) -> the ``Scheduler`` / ``AsyncScheduler``
    object, imported with the current directory on ``sys.path``."""
    obj = load_object(spec, param_hint)
    if not isinstance(obj, (Scheduler, AsyncScheduler)):
        raise click.BadParameter(
            f"{spec!r} is a {type(obj).__name__}, not a jobfence Scheduler or AsyncScheduler",
            param_hint=param_hint,
        )
    return obj


def _calls_then_close(
    scheduler: Scheduler | AsyncScheduler, *calls: tuple[str, tuple[Any, ...]]
) -> list[Any]:
    """Each ``scheduler.method(*args)`` of ``calls`` in turn, then ``scheduler.close()``; an
    ``AsyncScheduler`` does all of it on one event loop (its clients belong to the loop that
    opened them). Bad input is a usage error (exit 2), a backend failure an error (exit 1)."""
    try:
        if isinstance(scheduler, AsyncScheduler):
            return asyncio.run(_async_calls(scheduler, calls))
        try:
            return [getattr(scheduler, method)(*args) for method, args in calls]
        finally:
            _closed_quietly(scheduler.close)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except JobfenceError as exc:
        raise click.ClickException(str(exc)) from exc


async def _async_calls(
    scheduler: AsyncScheduler, calls: tuple[tuple[str, tuple[Any, ...]], ...]
) -> list[Any]:
    try:
        return [await getattr(scheduler, method)(*args) for method, args in calls]
    finally:
        try:
            await scheduler.close()
        except JobfenceError as exc:
            log.warning("closing the scheduler failed: %s", exc)


def _closed_quietly(close: Callable[[], Any]) -> None:
    try:
        close()
    except JobfenceError as exc:
        log.warning("closing the scheduler failed: %s", exc)


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a record (datetimes as ISO strings)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)


LOG_LEVEL = click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)


@click.command("scheduler")
@click.argument("scheduler_spec", metavar="MODULE:OBJ")
@LOG_LEVEL
def scheduler_command(scheduler_spec: str, log_level: str) -> None:
    """Run the schedules of the Scheduler / AsyncScheduler object OBJ of MODULE until
    SIGTERM/SIGINT. Run it in every process you like: each slot fires once, in one of them.
    Every fire (and every missed or skipped slot) is logged."""
    scheduler = load_scheduler(scheduler_spec)
    _logging(log_level)
    log.info("running schedules %s as pod %s", scheduler.names(), scheduler.pod)
    _calls_then_close(scheduler, ("run", ()))
    log.info("scheduler stopped")


def run_beside(scheduler: Scheduler | AsyncScheduler) -> Callable[[], None]:
    """Start ``scheduler``'s loop in a thread of its own (its signals are the caller's);
    return the function that stops it, waits for it and closes it."""
    failed: list[BaseException] = []

    def body() -> None:
        try:
            _calls_then_close(scheduler, ("run", ()))
        except BaseException as exc:  # reported by finish(); the worker keeps running
            failed.append(exc)
            log.exception("the scheduler's loop failed")

    thread = threading.Thread(target=body, name="jobfence-scheduler", daemon=True)
    thread.start()

    def finish() -> None:
        scheduler.stop()
        thread.join()
        if failed:
            raise click.ClickException(f"the scheduler's loop failed: {failed[0]!r}")

    return finish


# -- jobfence schedule ... ------------------------------------------------------------------


@click.group("schedule")
def schedule_group() -> None:
    """Look at and act on the schedules of a Scheduler object (MODULE:OBJ)."""


JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@schedule_group.command("list")
@click.argument("scheduler_spec", metavar="MODULE:OBJ")
@JSON
def list_schedules(scheduler_spec: str, as_json: bool) -> None:
    """Every schedule: its spec, whether it is paused, its next slot and its last record."""
    scheduler = load_scheduler(scheduler_spec)
    (infos,) = _calls_then_close(scheduler, ("schedules", ()))
    if as_json:
        for info in infos:
            click.echo(json.dumps(_plain(info)))
        return
    table = Table(title_justify="left")
    for column in ("name", "spec", "paused", "next", "last", "misses", "target"):
        table.add_column(column)
    for info in infos:
        last = "-" if info.last is None else f"{info.last.outcome} {_when(info.last.slot_at)}"
        table.add_row(
            info.name,
            info.spec,
            "paused" if info.paused else "",
            _when(info.next_at),
            last,
            str(info.misses),
            info.target,
        )
    console().print(table)


@schedule_group.command("show")
@click.argument("scheduler_spec", metavar="MODULE:OBJ")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 100_000), default=20, show_default=True)
@JSON
def show_schedule(scheduler_spec: str, name: str, limit: int, as_json: bool) -> None:
    """One schedule and its newest records (--limit)."""
    scheduler = load_scheduler(scheduler_spec)
    info, history = _calls_then_close(scheduler, ("info", (name,)), ("history", (name, limit)))
    if as_json:
        click.echo(json.dumps({"info": _plain(info), "history": _plain(history)}))
        return
    out = console()
    for field in dataclasses.fields(info):
        if field.name != "last":
            out.print(f"{field.name}: {_plain(getattr(info, field.name))}")
    table = Table(title="records, newest first", title_justify="left")
    for column in ("slot", "outcome", "pod", "fired at", "lag", "error"):
        table.add_column(column)
    for fire in history:
        table.add_row(
            fire.key.split("@", 1)[1],
            fire.outcome,
            fire.pod or "-",
            _when(fire.fired_at),
            "-" if fire.lag is None else f"{fire.lag:.3f} s",
            fire.error or "",
        )
    out.print(table)


@schedule_group.command("pause")
@click.argument("scheduler_spec", metavar="MODULE:OBJ")
@click.argument("name")
@JSON
def pause_schedule(scheduler_spec: str, name: str, as_json: bool) -> None:
    """Pause NAME on every process: its slots are recorded skipped until resume."""
    scheduler = load_scheduler(scheduler_spec)
    _calls_then_close(scheduler, ("pause", (name,)))
    _said({"schedule": name, "paused": True}, as_json, f"paused {name}")


@schedule_group.command("resume")
@click.argument("scheduler_spec", metavar="MODULE:OBJ")
@click.argument("name")
@JSON
def resume_schedule(scheduler_spec: str, name: str, as_json: bool) -> None:
    """Resume NAME on every process."""
    scheduler = load_scheduler(scheduler_spec)
    (was,) = _calls_then_close(scheduler, ("resume", (name,)))
    text = f"resumed {name}" if was else f"{name} was not paused"
    _said({"schedule": name, "paused": False, "was_paused": was}, as_json, text)


@schedule_group.command("trigger")
@click.argument("scheduler_spec", metavar="MODULE:OBJ")
@click.argument("name")
@JSON
def trigger_schedule(scheduler_spec: str, name: str, as_json: bool) -> None:
    """Fire NAME once now, in this process, under a manual slot key. Exits with 1 if the
    target failed."""
    scheduler = load_scheduler(scheduler_spec)
    (fire,) = _calls_then_close(scheduler, ("trigger", (name,)))
    _said(
        _plain(fire),
        as_json,
        f"{fire.outcome} {fire.key}" + (f": {fire.error}" if fire.error else ""),
    )
    if fire.outcome == "failed":
        raise SystemExit(1)


def _said(document: dict[str, Any], as_json: bool, text: str) -> None:
    click.echo(json.dumps(document) if as_json else text)
