"""``jobfence dashboard URL...``: a local web page of the locks, inbox claims and queues, of
the schedules of the schedulers named with ``--scheduler`` and of the transactional outboxes
named with ``--outbox``."""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

import click

from .._core.inbox_support import DEFAULT_TABLE
from ..dashboard import Dashboard, DashboardConfig, make_server
from ..errors import ConfigurationError, JobfenceError
from ._common import NAMESPACE_ENV, URL_ENV
from .outbox_cmd import DEFAULT_TABLE as OUTBOX_TABLE
from .outbox_cmd import TABLE_ENV as OUTBOX_TABLE_ENV
from .schedule_cmd import load_scheduler

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


@click.command("dashboard")
@click.argument("urls", nargs=-1)
@click.option(
    "--namespace",
    envvar=NAMESPACE_ENV,
    default="jobfence",
    show_default=True,
    help=f"Key/table prefix of the locks (or {NAMESPACE_ENV}).",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="NAME",
    help="A queue to show (repeatable), besides those the backend lists.",
)
@click.option(
    "--discover-queues/--no-discover-queues",
    default=True,
    show_default=True,
    help="Also show the queues that hold messages, where the backend can list them "
    "(SQL tables, Redis; not RabbitMQ: name its queues with --queue).",
)
@click.option("--inbox-table", default=DEFAULT_TABLE, show_default=True, help="The inbox's table.")
@click.option("--lock-prefix", default="", help="Only locks whose name starts with this.")
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="At most this many rows per listing.",
)
@click.option(
    "--scheduler",
    "schedulers",
    multiple=True,
    metavar="MODULE:OBJ",
    help="A Scheduler / AsyncScheduler object whose schedules to show (repeatable), loaded "
    "like `jobfence schedule list MODULE:OBJ` does.",
)
@click.option(
    "--outbox",
    "outboxes",
    multiple=True,
    metavar="URL",
    help="A database whose transactional outbox to show (repeatable): counts by state, the "
    "oldest unpublished row's age, unpublished rows by queue, dead rows.",
)
@click.option(
    "--outbox-table",
    envvar=OUTBOX_TABLE_ENV,
    default=OUTBOX_TABLE,
    show_default=True,
    help=f"The outboxes' table (or {OUTBOX_TABLE_ENV}).",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Show and accept the actions: break a lock, forget or purge inbox records, requeue "
    "dead letters, pause, resume and trigger schedules, retry dead outbox rows. Without it "
    "the dashboard is read-only.",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to bind. The page has no login: anything but a loopback address lets "
    "other machines see it (and, with --allow-actions, act).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8474,
    show_default=True,
    help="The port to bind (0: a free one).",
)
def dashboard(
    urls: tuple[str, ...],
    namespace: str,
    queues: tuple[str, ...],
    discover_queues: bool,
    inbox_table: str,
    lock_prefix: str,
    limit: int,
    schedulers: tuple[str, ...],
    outboxes: tuple[str, ...],
    outbox_table: str,
    allow_actions: bool,
    host: str,
    port: int,
) -> None:
    """Serve a web page of the locks, inbox claims and queues at each backend URL, of the
    schedules of each --scheduler and of the transactional outbox at each --outbox URL.

    URL is a backend (redis://, postgresql://, mysql://, sqlite:///..., amqp://); several may
    be given, or JOBFENCE_URL is used (none is needed with --outbox). The page refreshes
    every 2 seconds; a backend that is down shows its error while the others go on. It binds
    127.0.0.1 unless --host says
    otherwise and is read-only unless --allow-actions is given; every action is logged at
    WARNING on the jobfence.cli logger. The page has no login: bound to an address other
    machines can reach, it warns on stderr (loudly with --allow-actions). Stops on Ctrl-C or
    SIGTERM.
    """
    if not urls:
        env = os.environ.get(URL_ENV)
        if env:
            urls = (env,)
        elif not outboxes:
            raise click.UsageError(f"give at least one backend URL, or set {URL_ENV}")
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    loaded = {spec: load_scheduler(spec, "--scheduler") for spec in dict.fromkeys(schedulers)}
    try:
        board = Dashboard(
            DashboardConfig(
                urls=urls,
                namespace=namespace,
                queues=tuple(dict.fromkeys(queues)),
                discover_queues=discover_queues,
                inbox_table=inbox_table,
                lock_prefix=lock_prefix,
                limit=limit,
                outboxes=tuple(dict.fromkeys(outboxes)),
                outbox_table=outbox_table,
            ),
            loaded,
        )
        board.check()
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc
    except JobfenceError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        server = make_server(board, host, port, allow_actions=allow_actions)
    except OSError as exc:
        board.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    if allow_actions and not server.loopback:
        # make_server logged the warning (on stderr here); this one cannot be missed
        rule = "!" * 78
        click.secho(
            f"{rule}\n"
            f"WARNING: anyone who can reach port {server.port} can break locks, forget inbox\n"
            "records, requeue dead letters, pause or trigger schedules and retry dead outbox\n"
            "rows: the dashboard has no login.\n"
            f"{rule}",
            err=True,
            fg="red",
            bold=True,
        )
    signal.signal(signal.SIGTERM, _stop)
    click.echo(f"jobfence dashboard: {server.url}")
    if not allow_actions:
        click.echo("read-only: start with --allow-actions to break locks, requeue, ...")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        board.close()
