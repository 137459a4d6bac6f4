"""``jobfence`` command line: ``demo`` shows the bugs and the fix; ``doctor`` checks that
backends work with a probe lease; ``worker`` runs a handler on a queue; ``queue`` publishes and
inspects messages; ``locks`` lists, shows and breaks the locks held."""

from __future__ import annotations

import time
import uuid

import click
from rich.console import Console
from rich.table import Table

from .. import __version__
from .._core.url import mask_url
from ..errors import JobfenceError
from ..locks import Locks
from .dashboard_cmd import dashboard
from .demo_cmd import demo
from .locks_cmd import locks_group
from .queue_cmd import queue_group
from .worker_cmd import worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jobfence")
def cli() -> None:
    """Make background jobs safe to scale out and to retry."""


@cli.command()
@click.argument("urls", nargs=-1, required=True)
@click.option("--namespace", default="jobfence", show_default=True, help="Key/table prefix.")
def doctor(urls: tuple[str, ...], namespace: str) -> None:
    """Check that each backend URL works: take, renew and release a probe lease."""
    console = Console()
    table = Table(title="jobfence doctor")
    for column in ("backend", "result", "acquire+release", "token", "detail"):
        table.add_column(column)
    failed = False
    for url in urls:
        name = f"jobfence-doctor:{uuid.uuid4().hex}"
        try:
            with Locks(url, namespace=namespace) as locks:
                started = time.perf_counter()
                lease = locks.try_acquire(name, ttl=5, renew=False)
                if lease is None:
                    raise JobfenceError(f"probe lock {name!r} unexpectedly held")
                lease.extend()
                released = lease.release()
                elapsed = (time.perf_counter() - started) * 1000
                caps = locks.capabilities
            detail = ", ".join(k for k, v in vars(caps).items() if v is True)
            table.add_row(
                mask_url(url),
                "[green]ok" if released else "[red]release failed",
                f"{elapsed:.2f} ms",
                str(lease.token),
                detail,
            )
            failed |= not released
        except JobfenceError as exc:
            failed = True
            table.add_row(mask_url(url), "[red]error", "", "", str(exc))
    console.print(table)
    raise SystemExit(1 if failed else 0)


cli.add_command(worker)
cli.add_command(demo)
cli.add_command(queue_group)
cli.add_command(locks_group)
cli.add_command(dashboard)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
