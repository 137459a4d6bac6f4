"""Claims a test takes to stand for another worker's."""

from __future__ import annotations

from typing import Any, TypeVar

from jobfence._core import inbox_support

C = TypeVar("C")


def held_elsewhere(claim: C) -> C:
    """``claim`` (taken by the test, in this process) stands for one another process holds:
    this process forgets that a call of its own holds it, so a call refused by it waits for
    the claim's expiry, as for another worker's claim (instead of asking again after about as
    long as it has run, as for a claim of this process)."""
    owner: Any = claim._mine  # type: ignore[attr-defined]
    inbox_support._HELD.pop(owner, None)
    return claim
