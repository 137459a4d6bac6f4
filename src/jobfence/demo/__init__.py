"""``jobfence demo``: the bugs jobfence exists for, and their fix, run for real.

Three scenarios, each run naive and guarded by real worker processes on real databases
(embedded SQLite files by default, no server needed):

* :mod:`jobfence.demo.inventory` -- concurrent jobs deduct stock with injected transient
  failures, some of them "commit applied but reported failed"; the naive job reads, computes
  and writes the new stock with a blind retry and loses updates; the guarded one
  (``claim_in`` + ``versioned_update`` + ``retry_unit``) ends at the exact stock.
* :mod:`jobfence.demo.duplicates` -- messages on an at-least-once queue, some published twice,
  several ``jobfence worker`` processes, one killed with SIGKILL mid-run and replaced; the naive
  handler repeats effects, the guarded one (``guarded`` + ``claim_in``) leaves one per message.
* :mod:`jobfence.demo.dualwrite` -- apps commit orders and enqueue a job for each, SIGKILLed at
  random moments; commit-then-publish loses jobs, publish-then-commit runs jobs for orders
  that never committed, ``Outbox.add`` in the order's transaction with a ``Relay`` does
  neither.

Every number shown is counted from the databases after the run.
"""

from __future__ import annotations

from .runner import DemoConfig, DemoResult, run_demo

__all__ = ["DemoConfig", "DemoResult", "run_demo"]
