"""Run both scenarios, naive then guarded, and gather the numbers from the databases."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from .._core.url import mask_url
from ..errors import ConfigurationError
from . import dualwrite, duplicates, inventory
from ._db import dialect_of

#: ``progress(step, done, total)``: ``step`` names the run ("inventory naive", ...)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class DemoConfig:
    """What ``jobfence demo`` runs. ``db``/``queue``/``locks``: backend URLs, ``None`` for a
    SQLite file in ``keep`` (or a temporary directory); ``locks=""`` runs the guarded
    inventory jobs without a lease (the versioned update alone keeps them exact);
    ``orders``: the orders each app of the dual-write scenario commits."""

    jobs: int = 600
    messages: int = 400
    orders: int = 100
    workers: int = 3
    db: str | None = None
    queue: str | None = None
    locks: str | None = None
    keep: str | None = None
    seed: int = 1

    def __post_init__(self) -> None:
        for argument in ("jobs", "messages", "orders", "workers"):
            value = getattr(self, argument)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"{argument} must be an int >= 1, got {value!r}", argument=argument
                )
        if self.workers < 2:
            raise ConfigurationError(
                "workers must be at least 2: one of them is killed mid-run", argument="workers"
            )
        if self.db is not None:
            dialect_of(self.db)


DemoResult = dict[str, Any]


def _inventory_run(
    config: DemoConfig,
    db: str,
    locks: str | None,
    ns: str,
    mode: str,
    log: IO[bytes],
    progress: Progress,
) -> dict[str, int]:
    step = f"inventory {mode}"
    procs = []
    for index in range(config.workers):
        worker_config = {
            "db": db,
            "ns": ns,
            "mode": mode,
            "seed": config.seed,
            "index": index,
            "jobs": config.jobs,
            "workers": config.workers,
            "locks": locks if mode == "guarded" else None,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "jobfence.demo.inventory", json.dumps(worker_config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        )
    deadline = time.monotonic() + 300
    while any(proc.poll() is None for proc in procs):
        if time.monotonic() > deadline:
            for proc in procs:
                proc.kill()
            raise RuntimeError(f"the {step} workers did not finish in 300 s")
        progress(step, inventory.counts(db, ns, mode)["jobs_applied"], config.jobs)
        time.sleep(0.1)
    for proc in procs:
        if proc.returncode != 0:
            raise RuntimeError(f"an {step} worker exited with status {proc.returncode}")
    result = inventory.counts(db, ns, mode)
    progress(step, result["jobs_applied"], config.jobs)
    return result


def run_demo(config: DemoConfig, progress: Progress = lambda step, done, total: None) -> DemoResult:
    """Run the inventory and the duplicates scenario, each naive then guarded, and the
    dual-write scenario (two naive apps and the outbox, side by side), in worker processes;
    return the numbers counted from the databases, and the anomalies of each mode
    (``anomalies["guarded"] == 0`` when jobfence kept every effect exact)."""
    started = time.perf_counter()
    directory = config.keep or tempfile.mkdtemp(prefix="jobfence-demo-")
    os.makedirs(directory, exist_ok=True)
    db = config.db or f"sqlite:///{os.path.join(os.path.abspath(directory), 'demo.db')}"
    queue_url = config.queue or f"sqlite:///{os.path.join(os.path.abspath(directory), 'queue.db')}"
    locks = (
        config.locks
        if config.locks is not None
        else f"sqlite:///{os.path.join(os.path.abspath(directory), 'locks.db')}"
    ) or None
    ns = f"jfdemo_{uuid.uuid4().hex[:8]}"
    on_server = not dialect_of(db).in_process
    logging.getLogger("jobfence").setLevel(logging.ERROR)
    result: DemoResult = {
        "namespace": ns,
        "directory": directory if config.keep else None,
        "db": mask_url(db),
        "queue": mask_url(queue_url),
        "locks": mask_url(locks) if locks else None,
        "workers": config.workers,
    }
    try:
        with open(os.path.join(directory, "workers.log"), "wb") as log:
            # the dual-write scenario's processes start now, warm by the time it runs
            prepared: dualwrite.Prepared | None = dualwrite.prepare(
                db=db, queue_url=queue_url, ns=ns, orders=config.orders, seed=config.seed, log=log
            )
            try:
                inventory.setup(db, ns)
                inv: dict[str, Any] = {
                    "jobs": config.jobs,
                    "expected_stock": inventory.expected_stock(config.jobs),
                }
                for mode in inventory.MODES:
                    counts = _inventory_run(config, db, locks, ns, mode, log, progress)
                    counts["stock_off_by"] = counts["stock"] - inv["expected_stock"]
                    counts["jobs_not_applied"] = config.jobs - counts["jobs_applied"]
                    inv[mode] = counts
                result["inventory"] = inv

                duplicates.setup(db, ns)
                dup: dict[str, Any] = {
                    "messages": config.messages,
                    "expected_effects": config.messages,
                }
                for mode in ("naive", "guarded"):
                    step = f"duplicates {mode}"
                    counts = duplicates.run(
                        db=db,
                        queue_url=queue_url,
                        ns=ns,
                        mode=mode,
                        messages=config.messages,
                        workers=config.workers,
                        log=log,
                        progress=_step_progress(progress, step, config.messages),
                    )
                    counts["duplicate_effects"] = counts["effects"] - counts["distinct"]
                    counts["missing_effects"] = config.messages - counts["distinct"]
                    dup[mode] = counts
                dup["published"] = dup["guarded"].pop("published")
                dup["naive"].pop("published")
                result["duplicates"] = dup

                dual_started = time.perf_counter()
                dualwrite.setup(db, ns)
                modes = dualwrite.run(
                    db=db,
                    queue_url=queue_url,
                    ns=ns,
                    orders=config.orders,
                    seed=config.seed,
                    log=log,
                    progress=_step_progress(
                        progress, "dual write", len(dualwrite.MODES) * config.orders
                    ),
                    prepared=prepared,
                )
                prepared = None  # run() stopped its processes
                result["dual_write"] = {
                    "orders": config.orders,
                    **modes,
                    "seconds": round(time.perf_counter() - dual_started, 1),
                }
            finally:
                if prepared is not None:
                    dualwrite.discard(prepared)
    finally:
        if on_server and not config.keep:
            inventory.drop(db, ns)
            duplicates.drop(db, ns)
            dualwrite.drop(db, ns)
        if not config.keep:
            shutil.rmtree(directory, ignore_errors=True)
    result["anomalies"] = {mode: anomalies(result, mode) for mode in ("naive", "guarded")}
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def _step_progress(progress: Progress, step: str, total: int) -> Callable[[int], None]:
    def report(done: int) -> None:
        progress(step, done, total)

    return report


def anomalies(result: DemoResult, mode: str) -> int:
    """Lost updates + jobs not applied exactly once + a wrong stock (counted once) + duplicate
    and missing effects + lost and phantom jobs (the dual write: both naive apps for
    ``"naive"``, the outbox for ``"guarded"``), of ``mode``'s runs."""
    inv, dup = result["inventory"][mode], result["duplicates"][mode]
    dual = result["dual_write"]
    dual_modes = dualwrite.NAIVE_MODES if mode == "naive" else ("outbox",)
    return int(
        inv["lost_updates"]
        + abs(inv["writes"] - result["inventory"]["jobs"])
        + inv["jobs_not_applied"]
        + (inv["stock_off_by"] != 0)
        + dup["duplicate_effects"]
        + dup["missing_effects"]
        + sum(dual[m]["lost"] + dual[m]["phantom"] for m in dual_modes)
        + sum(abs(dual[m]["job_rows"] - dual[m]["jobs"]) for m in dual_modes if m == "outbox")
    )
