"""Background renewal of leases: ``AsyncRenewer`` (``renewal_async.py``) and ``Renewer``
(``renewal.py``, generated from it).

One renewer per client: a task on the event loop for ``AsyncLocks``, one daemon thread for
``Locks`` -- never one per lease. It wakes when the earliest lease is due (about ``ttl / 3``
after its last successful renewal), renews *every* lease that is due or nearly due in one
batched backend call (one round trip per tick), and marks a lease lost when the backend says
it is gone or when its local deadline passes before a renewal got through.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from ._core import acompat
from ._core.clock import get_clock
from ._core.hooks import ahook

if TYPE_CHECKING:
    from .locks_async import AsyncLease

__all__ = ["AsyncRenewer"]

#: how long an idle renewer sleeps before looking again
IDLE_WAIT = 1.0
#: leases due within this fraction of their ttl are renewed in the same batch
BATCH_WINDOW = 0.15


class AsyncRenewer:
    def __init__(
        self,
        renew: Callable[[Sequence[tuple[str, str, float]]], Any],
        *,
        name: str = "jobfence-renewer",
    ) -> None:
        self._renew = renew
        self._name = name
        self._leases: dict[int, AsyncLease] = {}
        self._mutex = threading.Lock()
        self._wake = acompat.Event()
        self._wake_at = float("inf")
        self._worker: Any = None
        self._closed = False

    def add(self, lease: AsyncLease) -> None:
        with self._mutex:
            self._leases[id(lease)] = lease
            start = not acompat.worker_alive(self._worker)
            if start:
                self._worker = acompat.spawn(self._run, self._name)
            elif lease.state.next_check < self._wake_at:
                self._wake.set()

    def discard(self, lease: AsyncLease) -> None:
        with self._mutex:
            self._leases.pop(id(lease), None)

    def __len__(self) -> int:
        return len(self._leases)

    async def close(self, timeout: float = 5.0) -> list[AsyncLease]:
        """Stop renewing and wait (at most ``timeout`` s) for the worker to finish. Leases
        still held are no longer renewed: they are marked lost (their holders are told) and
        returned, for the client to give back."""
        self._closed = True
        self._wake.set()
        await acompat.join(self._worker, timeout)
        with self._mutex:
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            lease.mark_lost("its Locks client was closed, so it is no longer renewed")
        return leases

    async def _run(self) -> None:
        clock = get_clock()
        while not self._closed:
            self._wake.clear()  # before looking: an add() from now on wakes the next wait
            with self._mutex:
                leases = list(self._leases.values())
            now = clock.monotonic()
            for lease in leases:
                if lease.state.expired(now):
                    self.discard(lease)
                    lease.mark_lost("its ttl ran out before a renewal got through")
            with self._mutex:
                leases = list(self._leases.values())
            due = [
                lease
                for lease in leases
                if lease.renews and lease.state.next_renew <= now + BATCH_WINDOW * lease.state.ttl
            ]
            if not due or min(lease.state.next_renew for lease in due) > now:
                due = []
            if due:
                await self._renew_batch(due)
                continue
            # a lease that is not renewed is due only for its expiry (its next_renew is inf)
            next_at = min([lease.state.next_check for lease in leases] + [now + IDLE_WAIT])
            self._wake_at = next_at
            await clock.wait_async(self._wake, max(0.0, next_at - clock.monotonic()))
            self._wake_at = float("inf")

    async def _hooked_renew(self, items: list[tuple[str, str, float]]) -> Any:
        await ahook("lock.renew", names=[item[0] for item in items])
        return await self._renew(items)

    async def _renew_batch(self, due: list[AsyncLease]) -> None:
        clock = get_clock()
        sent = clock.monotonic()
        items = [(lease.name, lease.owner, lease.state.renewal_sent(sent)) for lease in due]
        # A renewal that hangs must not hide a loss: give up when the first lease expires.
        limit = max(0.01, min(lease.state.expires_at for lease in due) - sent)
        try:
            results = await acompat.call_bounded(partial(self._hooked_renew, items), limit)
        except Exception as exc:
            now = clock.monotonic()
            for lease in due:
                if not lease.state.renewal_failed(now):  # expired: no retry was scheduled
                    self.discard(lease)
                    lease.mark_lost(f"renewal could not reach the backend: {exc!r}")
            return
        for lease, ok in zip(due, results, strict=True):
            lease.state.renewal_done(bool(ok))
            if lease.released:
                continue
            if not ok:
                self.discard(lease)
                lease.mark_lost("renewal found the lease gone or held by another owner")
