"""``jobfence`` command line: ``demo`` shows the bugs and the fix; ``doctor`` checks the
health of backends and takes a probe lease; ``worker`` runs a handler on a queue; ``queue``
publishes and inspects messages; ``locks`` lists, shows and breaks the locks held; ``inbox``
lists, shows and purges the inbox's records; ``dashboard`` serves a local web page of them;
``scheduler`` runs a scheduler's loop and ``schedule`` lists, shows, pauses, resumes and triggers
its schedules; ``relay`` publishes the transactional outbox's rows and ``outbox`` lists, shows,
retries and purges them."""

from __future__ import annotations

import json
import math
import os

import click

from .. import __version__
from ..errors import ConfigurationError
from .dashboard_cmd import dashboard
from .demo_cmd import demo
from .inbox_cmd import inbox_group
from .locks_cmd import locks_group
from .outbox_cmd import outbox_group, relay_command
from .queue_cmd import queue_group
from .redis_cmd import redis_group
from .schedule_cmd import schedule_group, scheduler_command
from .worker_cmd import worker


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="jobfence")
def cli() -> None:
    """Make background jobs safe to scale out and to retry."""


@cli.command()
@click.argument("urls", nargs=-1)
@click.option(
    "--namespace",
    envvar="JOBFENCE_NAMESPACE",
    default="jobfence",
    show_default=True,
    help="Key/table prefix of the locks (or JOBFENCE_NAMESPACE).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--strict", is_flag=True, help="Exit with 1 on warnings too.")
@click.option(
    "--max-skew",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Fail (an error) when this host's clock and the server's differ by more than "
    "SECONDS. Default: an offset over 1 s is a warning.",
)
def doctor(
    urls: tuple[str, ...], namespace: str, as_json: bool, strict: bool, max_skew: float | None
) -> None:
    """Health check of each backend URL (or of JOBFENCE_URL, space separated).

    Reports the server version, round trip, clock offset, settings that break locks, fencing
    or queues (with what to do), jobfence's tables or keys, and a probe lease (take, extend,
    release). Exits with 1 if any check found an error (with --strict: or a warning); with
    --max-skew, a clock offset over that many seconds is an error.
    """
    from ..doctor import diagnose, unusable
    from .doctor_view import render

    if not urls:
        urls = tuple(os.environ.get("JOBFENCE_URL", "").split())
    if not urls:
        raise click.UsageError("give at least one backend URL, or set JOBFENCE_URL")
    if max_skew is not None and not (math.isfinite(max_skew) and max_skew >= 0):
        raise click.BadParameter(
            f"must be a number of seconds >= 0, got {max_skew!r}", param_hint="--max-skew"
        )
    reports = []
    for url in urls:
        try:
            reports.append(diagnose(url, namespace=namespace, max_skew=max_skew))
        except ConfigurationError as exc:
            # a URL that cannot be used is this URL's error; the other URLs are still checked
            reports.append(unusable(url, namespace, exc))
    if as_json:
        click.echo(json.dumps({"reports": [r.to_dict() for r in reports]}, indent=2))
    else:
        render(reports)
    failing = ("error", "warning") if strict else ("error",)
    raise SystemExit(1 if any(r.level in failing for r in reports) else 0)


cli.add_command(worker)
cli.add_command(demo)
cli.add_command(queue_group)
cli.add_command(locks_group)
cli.add_command(inbox_group)
cli.add_command(dashboard)
cli.add_command(redis_group)
cli.add_command(scheduler_command)
cli.add_command(schedule_group)
cli.add_command(relay_command)
cli.add_command(outbox_group)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
