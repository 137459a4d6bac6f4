"""The scheduler that ``test_scheduler_processes.py`` runs in several ``jobfence scheduler``
processes: one schedule, every second, whose target appends ``<slot key> <pid>`` to
``$JF_OUT`` (one short ``O_APPEND`` write per fire, so lines of processes never mix)."""

from __future__ import annotations

import os

import jobfence

sched = jobfence.Scheduler(os.environ["JF_URL"], namespace=os.environ["JF_TABLE"], lease=1.0)


@sched.every(seconds=1, name="tick")
def tick(slot: jobfence.Slot) -> None:
    line = f"{slot.key} {os.getpid()}\n".encode()
    fd = os.open(os.environ["JF_OUT"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
