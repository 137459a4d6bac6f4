"""The scheduler's metrics (``jobfence.schedule.*``), provoked on ``memory://`` under a
``ManualClock`` and read back through the SDK's in-memory reader (the providers of
``test_telemetry.py``)."""

from __future__ import annotations

import uuid

import jobfence
from jobfence.testing import ManualClock
from tests.unit.test_telemetry import Otel, otel

__all__ = ["otel"]

#: 2026-12-04T15:00:00Z
START = 1_796_396_400.0


def test_fires_lag_misses_and_skips_by_schedule(otel: Otel) -> None:
    with ManualClock(epoch=START) as clock:
        sched = jobfence.Scheduler(f"memory://{uuid.uuid4().hex}", namespace="t_sched")
        try:
            sched.add("beat", every=10, grace=5, target=lambda: None)
            sched.add("held", every=10, target=lambda: None)
            sched.tick()  # both fire their first slot, on time
            sched.pause("held")
            clock.advance(37)  # beat: +10, +20 missed, +30 fired 7 s late; held: 3 skipped
            sched.tick()
        finally:
            sched.close()
    assert otel.value("jobfence.schedule.fires", schedule="beat") == 2
    assert otel.value("jobfence.schedule.fires", schedule="held") == 1
    assert otel.value("jobfence.schedule.misses", schedule="beat") == 2
    assert otel.value("jobfence.schedule.skips", schedule="held") == 3
    lag = otel.points("jobfence.schedule.lag")[frozenset({("schedule", "beat")})]
    assert lag.count == 2 and lag.sum == 7.0
