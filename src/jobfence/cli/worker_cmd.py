"""``jobfence worker module:handler --queue URL --name NAME --concurrency N``."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import sys
import threading
from typing import Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..errors import JobfenceError
from ..queue import Queue
from ..queue_async import AsyncQueue
from ..worker import AsyncWorker, Worker, WorkerStats
from ._common import load_object
from .outbox_cmd import DEFAULT_TABLE as OUTBOX_TABLE
from .outbox_cmd import TABLE_ENV as OUTBOX_TABLE_ENV
from .outbox_cmd import relay_beside
from .schedule_cmd import load_scheduler, run_beside

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def load_handler(spec: str) -> Any:
    """``module:function`` (``function`` may be dotted: ``module:Class.method``) -> the
    callable, imported with the current directory on ``sys.path``."""
    obj = load_object(spec, "HANDLER", "function")
    if not callable(obj):
        raise click.BadParameter(f"{spec!r} is not callable", param_hint="HANDLER")
    return obj


def _status(name: str, url: str, stats: WorkerStats, concurrency: int) -> Table:
    table = Table(title=f"jobfence worker: {name} on {url}", title_justify="left")
    for column in (
        "in flight",
        "processed",
        "duplicates",
        "retried",
        "deferred",
        "dead-lettered",
        "lost",
        "received",
    ):
        table.add_column(column, justify="right")
    table.add_row(
        f"{stats.in_flight}/{concurrency}",
        str(stats.processed),
        str(stats.duplicates),
        str(stats.retried),
        str(stats.deferred),
        str(stats.dead_lettered),
        str(stats.lost),
        str(stats.received),
    )
    return table


@click.command("worker")
@click.argument("handler")
@click.option("--queue", "url", envvar="JOBFENCE_URL", required=True, help="The queue's URL.")
@click.option("--name", required=True, help="The queue's name.")
@click.option("--concurrency", type=click.IntRange(1, 10_000), default=8, show_default=True)
@click.option("--max-deliveries", type=click.IntRange(1), default=5, show_default=True)
@click.option(
    "--visibility", type=click.FloatRange(min=0, min_open=True), default=30.0, show_default=True
)
@click.option("--shutdown-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
@click.option("--live/--no-live", default=None, help="Rich live status (default: on a terminal).")
@click.option(
    "--scheduler",
    "scheduler_spec",
    metavar="MODULE:OBJ",
    default=None,
    help="Also run the schedules of this Scheduler / AsyncScheduler object, in this process.",
)
@click.option(
    "--relay",
    "relay_url",
    metavar="OUTBOX_URL",
    default=None,
    help="Also run a relay of the transactional outbox at OUTBOX_URL, in this process, "
    "publishing its rows to this worker's queue URL.",
)
@click.option(
    "--relay-queue",
    "relay_queues",
    multiple=True,
    metavar="NAME",
    help="With --relay: relay the rows of this queue (repeatable; default: the worker's "
    "--name only).",
)
@click.option(
    "--outbox-table",
    envvar=OUTBOX_TABLE_ENV,
    default=OUTBOX_TABLE,
    show_default=True,
    help=f"With --relay: the outbox's table (or {OUTBOX_TABLE_ENV}).",
)
def worker(
    handler: str,
    url: str,
    name: str,
    concurrency: int,
    max_deliveries: int,
    visibility: float,
    shutdown_timeout: float,
    log_level: str,
    live: bool | None,
    scheduler_spec: str | None,
    relay_url: str | None,
    relay_queues: tuple[str, ...],
    outbox_table: str,
) -> None:
    """Run HANDLER (module:function) on the queue NAME at --queue URL until SIGTERM/SIGINT.

    An ``async def`` handler runs as asyncio tasks, a plain function in threads. It gets the
    message (.id, .body, .delivery, .headers); returning acks it, raising redelivers it
    with a backoff, and after --max-deliveries it goes to the dead letters. A "not now"
    refusal (jobfence.NotNow: ClaimInProgress, LockTimeout, LockLost, ClaimLost) is
    redelivered after the holder's expiry without using up a delivery.

    With --scheduler MODULE:OBJ the scheduler's loop runs beside the worker (in a thread of
    its own) and stops when the worker does. With --relay OUTBOX_URL a relay of the
    transactional outbox runs beside it the same way, publishing the outbox's rows of the
    queue NAME (or of each --relay-queue) to --queue URL; it finishes its batch in hand and
    stops after the worker.
    """
    _stop_before_start()
    fn = load_handler(handler)
    scheduler = None if scheduler_spec is None else load_scheduler(scheduler_spec, "--scheduler")
    if relay_queues and relay_url is None:
        raise click.UsageError("--relay-queue goes with --relay OUTBOX_URL")
    console = Console(stderr=True)
    if live is None:
        live = console.is_terminal
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT, stream=sys.stderr)
    options: dict[str, Any] = {
        "concurrency": concurrency,
        "max_deliveries": max_deliveries,
        "visibility": visibility,
        "shutdown_timeout": shutdown_timeout,
    }
    is_async = inspect.iscoroutinefunction(fn)
    try:
        if is_async:
            aqueue = AsyncQueue(url, name, visibility=visibility)
            runner: Any = AsyncWorker(aqueue, fn, **options)
        else:
            queue = Queue(url, name, visibility=visibility)
            runner = Worker(queue, fn, **options)
    except JobfenceError as exc:
        raise click.UsageError(str(exc)) from exc

    def run() -> WorkerStats:
        if is_async:

            async def main() -> WorkerStats:
                try:
                    result: WorkerStats = await runner.run()
                    return result
                finally:
                    await aqueue.close()

            return asyncio.run(main())
        try:
            return runner.run()  # type: ignore[no-any-return]
        finally:
            queue.close()

    shown = url if "@" not in url else url.split("@", 1)[1]
    finishers: list[Any] = []
    try:
        if relay_url is not None:
            finishers.append(
                relay_beside(relay_url, url, list(relay_queues) or [name], table=outbox_table)
            )
        if scheduler is not None:
            finishers.append(run_beside(scheduler))
    except BaseException:
        _close_runner(is_async, aqueue if is_async else queue)
        for finish in reversed(finishers):
            finish()
        raise
    try:
        stats = _run_shown(run, live, console, name, shown, runner, concurrency)
    finally:
        _finish_all(finishers)
    logging.getLogger("jobfence.worker").info("final stats: %s", stats)


def _exit_before_start(signum: int, frame: Any) -> None:
    """SIGTERM while the worker is not running yet (its handler's module loading, its queue
    connecting): nothing was received, so the process stops as a graceful stop ends, with
    status 0 (what is opened is closed on the way out)."""
    raise SystemExit(0)


def _stop_before_start() -> None:
    """Until the worker's run puts its graceful SIGTERM handler in place, SIGTERM exits 0
    instead of killing the process (an orchestrator scaling down a pod that is still
    starting: a user's module can take seconds to import)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_before_start)


def _close_runner(is_async: bool, client: Any) -> None:
    """Close the queue client of a worker that will not run."""
    try:
        if is_async:
            asyncio.run(client.close())
        else:
            client.close()
    except JobfenceError:
        pass


def _finish_all(finishers: list[Any]) -> None:
    """Stop what runs beside the worker, the last started first; every one is stopped even
    when one of them failed (the first failure is raised after)."""
    failure: BaseException | None = None
    for finish in reversed(finishers):
        try:
            finish()
        except BaseException as exc:
            failure = failure or exc
    if failure is not None:
        raise failure


def _run_shown(
    run: Any, live: bool, console: Console, name: str, shown: str, runner: Any, concurrency: int
) -> WorkerStats:
    """``run()``, with a Rich live status of the worker when ``live``."""
    if not live:
        stats: WorkerStats = run()
    else:
        stop_refresh = threading.Event()
        with Live(
            _status(name, shown, runner.stats, concurrency),
            console=console,
            refresh_per_second=4,
            transient=False,
        ) as display:

            def refresh() -> None:
                while not stop_refresh.wait(0.25):
                    display.update(_status(name, shown, runner.stats, concurrency))

            refresher = threading.Thread(target=refresh, daemon=True)
            refresher.start()
            try:
                stats = run()
            finally:
                stop_refresh.set()
                refresher.join()
                display.update(_status(name, shown, runner.stats, concurrency))
    return stats
