"""RQ's job function for the worker comparison."""

from __future__ import annotations

import peer_common


def tick() -> None:
    peer_common.tick()
