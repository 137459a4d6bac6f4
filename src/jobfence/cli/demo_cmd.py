"""``jobfence demo``: the lost-update, the duplicate-effect and the dual-write bugs, naive and
guarded, run by real worker processes on embedded SQLite files (or the backends given), in
tables."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..errors import JobfenceError


def _table(result: dict[str, Any]) -> Table:
    inv, dup = result["inventory"], result["duplicates"]
    table = Table(title="jobfence demo: naive vs guarded, counted from the database")
    for column, justify in (
        ("scenario", "left"),
        ("measure", "left"),
        ("expected", "right"),
        ("naive", "right"),
        ("guarded", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]

    def mark(value: Any, expected: Any) -> str:
        return f"[green]{value}" if value == expected else f"[red]{value}"

    jobs = inv["jobs"]
    inventory_title = f"inventory\n{jobs} jobs, {result['workers']} processes"
    table.add_row(
        inventory_title,
        "stock left",
        str(inv["expected_stock"]),
        mark(inv["naive"]["stock"], inv["expected_stock"]),
        mark(inv["guarded"]["stock"], inv["expected_stock"]),
    )
    table.add_row(
        "",
        "lost updates",
        "0",
        mark(inv["naive"]["lost_updates"], 0),
        mark(inv["guarded"]["lost_updates"], 0),
    )
    table.add_row(
        "",
        "stock writes",
        str(jobs),
        mark(inv["naive"]["writes"], jobs),
        mark(inv["guarded"]["writes"], jobs),
        end_section=True,
    )
    messages = dup["messages"]
    table.add_row(
        f"duplicates\n{messages} messages ({dup['published']} published), 1 worker SIGKILLed",
        "effects",
        str(messages),
        mark(dup["naive"]["effects"], messages),
        mark(dup["guarded"]["effects"], messages),
    )
    table.add_row(
        "",
        "duplicate effects",
        "0",
        mark(dup["naive"]["duplicate_effects"], 0),
        mark(dup["guarded"]["duplicate_effects"], 0),
    )
    table.add_row(
        "",
        "missing effects",
        "0",
        mark(dup["naive"]["missing_effects"], 0),
        mark(dup["guarded"]["missing_effects"], 0),
    )
    return table


def _dual_table(result: dict[str, Any]) -> Table:
    dual = result["dual_write"]
    orders = dual["orders"]
    kills = sum(dual[mode]["kills"] for mode in ("commit_then_publish", "publish_then_commit"))
    kills += dual["outbox"]["kills"]
    table = Table(
        title=f"dual write: {orders} orders per app, a job for each, apps SIGKILLed {kills}x"
    )
    for column, justify in (
        ("measure", "left"),
        ("expected", "right"),
        ("naive\ncommit, then publish", "right"),
        ("naive\npublish, then commit", "right"),
        ("outbox", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    modes = ("commit_then_publish", "publish_then_commit", "outbox")

    def row(measure: str, field: str, expected: int) -> None:
        cells = [
            f"[green]{dual[m][field]}" if dual[m][field] == expected else f"[red]{dual[m][field]}"
            for m in modes
        ]
        table.add_row(measure, str(expected), *cells)

    table.add_row("orders committed", str(orders), *(str(dual[m]["orders"]) for m in modes))
    row("jobs run", "jobs", orders)
    row("lost jobs", "lost", 0)  # a committed order without its job
    row("phantom jobs", "phantom", 0)  # a job whose order never committed
    return table


def _verdict(result: dict[str, Any]) -> list[str]:
    naive, guarded = result["anomalies"]["naive"], result["anomalies"]["guarded"]
    lines = []
    if naive:
        lines.append(
            f"naive: {naive} anomalies (lost updates, repeated writes and effects, "
            "lost and phantom jobs)."
        )
    else:
        lines.append(
            "naive: no anomaly this time -- the races are real but timing-dependent; "
            "run it again, or with more --jobs/--messages."
        )
    if guarded:
        lines.append(f"[red]guarded: {guarded} anomalies -- this is a bug in jobfence.")
    else:
        lines.append(
            "[green]guarded: exact -- every job applied once, every effect once, "
            "one job per committed order."
        )
    lines.append(f"({result['seconds']} s)")
    return lines


@click.command("demo")
@click.option(
    "--jobs",
    type=click.IntRange(1, 100_000),
    default=600,
    show_default=True,
    help="Inventory jobs (each deducts stock once).",
)
@click.option(
    "--messages",
    type=click.IntRange(1, 100_000),
    default=400,
    show_default=True,
    help="Distinct queue messages (a quarter of them published twice).",
)
@click.option(
    "--orders",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Orders each dual-write app commits (a job enqueued for each).",
)
@click.option(
    "--workers",
    type=click.IntRange(2, 32),
    default=3,
    show_default=True,
    help="Worker processes per run.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
@click.option(
    "--db",
    default=None,
    help="Database for stock, effects and inbox: sqlite:///, postgresql://, mysql://.",
)
@click.option(
    "--queue",
    "queue_url",
    default=None,
    help="Queue URL: sqlite:///, postgresql://, redis://, amqp://.",
)
@click.option(
    "--locks",
    default=None,
    help="Locks URL for the guarded inventory jobs' leases (any lock backend).",
)
@click.option(
    "--keep",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the SQLite files and the worker log in this directory.",
)
@click.option(
    "--seed", type=int, default=1, show_default=True, help="Seed of the injected failures."
)
def demo(
    jobs: int,
    messages: int,
    orders: int,
    workers: int,
    as_json: bool,
    db: str | None,
    queue_url: str | None,
    locks: str | None,
    keep: str | None,
    seed: int,
) -> None:
    """See the bugs and their fix: the same jobs run naive, then guarded.

    inventory: concurrent jobs deduct stock with injected failures (some commits are
    applied but reported failed); the naive job retries its write blindly, the guarded one
    re-runs its whole unit with claim_in + versioned_update. duplicates: messages on an
    at-least-once queue, some published twice, jobfence worker processes, one killed with
    SIGKILL mid-run; the naive handler just writes, the guarded one uses guarded +
    claim_in. dual write: three apps commit orders and enqueue a job for each, SIGKILLed
    at random: commit then publish (jobs lost), publish then commit (jobs for orders that
    never committed), and Outbox.add in the order's transaction with a relay (exact). With
    no URL everything runs on SQLite files in a temporary directory.

    Exit status 1 if the guarded runs show any anomaly, else 0.
    """
    from ..demo import DemoConfig, run_demo

    err = Console(stderr=True)
    try:
        config = DemoConfig(
            jobs=jobs,
            messages=messages,
            orders=orders,
            workers=workers,
            db=db,
            queue=queue_url,
            locks=locks,
            keep=keep,
            seed=seed,
        )
    except JobfenceError as exc:
        raise click.UsageError(str(exc)) from exc
    if err.is_terminal:
        with Progress(
            TextColumn("{task.description:<20}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        ) as bar:
            tasks: dict[str, Any] = {}

            def progress(step: str, done: int, total: int) -> None:
                if step not in tasks:
                    tasks[step] = bar.add_task(step, total=total)
                bar.update(tasks[step], completed=min(done, total))

            result = run_demo(config, progress)
    else:
        shown: set[str] = set()

        def progress(step: str, done: int, total: int) -> None:
            if step not in shown:
                shown.add(step)
                print(f"running {step} ...", file=sys.stderr, flush=True)

        result = run_demo(config, progress)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        out = Console()
        out.print(_table(result))
        out.print(_dual_table(result))
        for line in _verdict(result):
            out.print(line)
    raise SystemExit(1 if result["anomalies"]["guarded"] else 0)
