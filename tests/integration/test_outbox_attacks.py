"""Attacks on the outbox and its relay: the relay's own database link stalled or reset, a
relay frozen inside its claim, hostile input to ``add``, per-key order under failures, and
the life cycle of the objects (fork, close twice, stop before run).

Real servers only (PostgreSQL, MariaDB, SQLite); network faults come from the loopback
``FaultProxy`` between the relay and its outbox database.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import jobfence
from jobfence.backends.base import OutboxRow
from jobfence.testing import hooked
from tests.integration._outbox_env import OutboxSide
from tests.netproxy import FaultProxy
from tests.servers import POSTGRES_URL

pytestmark = pytest.mark.timeout(120)

FLAVOURS = ("sync", "async")
PG_PORT = urlsplit(POSTGRES_URL).port or 5432


@contextlib.contextmanager
def outbox_of(kind: str, tmp_path: Path) -> Iterator[OutboxSide]:
    side = OutboxSide(kind, tmp_path)
    try:
        yield side
    finally:
        side.drop()


class Sink:
    """A send(rows) target that records the ids it was given; waits for ids to arrive."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, rows: list[OutboxRow]) -> None:
        with self.cond:
            self.ids.extend(r.id for r in rows)
            self.cond.notify_all()

    def wait_for(self, ids: list[str], timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: set(ids) <= set(self.ids), timeout)


class RelayThread:
    """``run()`` of a relay (blocking, or asyncio on a loop of its own) on an outbox at
    ``url`` in a thread; :meth:`stop` stops and joins it."""

    def __init__(self, flavour: str, url: str, table: str, to: Any, **options: Any) -> None:
        self.flavour = flavour
        self.error: BaseException | None = None
        self.relay: Any = None
        self.ready = threading.Event()
        self.thread = threading.Thread(
            target=self._main, args=(url, table, to, options), daemon=True
        )
        self.thread.start()
        assert self.ready.wait(30), "the relay did not start"

    def _main(self, url: str, table: str, to: Any, options: dict[str, Any]) -> None:
        opts = {"timeout": 1.0, "connect_timeout": 1.0}
        try:
            if self.flavour == "sync":
                with jobfence.Outbox(url, table=table, **opts) as outbox:
                    self.relay = jobfence.Relay(outbox, to, **options)
                    self.ready.set()
                    self.relay.run()
            else:

                async def main() -> None:
                    async with jobfence.AsyncOutbox(url, table=table, **opts) as outbox:
                        self.relay = jobfence.AsyncRelay(outbox, to, **options)
                        self.ready.set()
                        await self.relay.run()

                asyncio.run(main())
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def stop(self) -> None:
        if self.relay is not None:
            self.relay.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the relay did not stop"
        if self.error is not None:
            raise self.error


# -- the relay's own database link ---------------------------------------------------------
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_a_claim_on_a_stalled_link_times_out_and_the_relay_recovers(
    flavour: str, tmp_path: Path
) -> None:
    """The link between the relay and PostgreSQL hangs (no reset: bytes are held) just as a
    claim starts. Every statement of the claim -- its BEGIN and COMMIT too -- is bounded by
    the ``timeout`` option: the claim fails within it and the relay claims again (backing
    off) instead of hanging for as long as the link does; once the link is back, the rows
    are published, none failed or dead."""
    sink = Sink()
    claims: list[int] = []
    claimed_again = threading.Event()
    with outbox_of("postgres", tmp_path) as side, FaultProxy(PG_PORT) as proxy:
        armed = threading.Event()

        def hook(point: str, **info: Any) -> None:
            if point != "outbox.claim" or not armed.is_set():
                return
            claims.append(1)
            if len(claims) == 1:
                proxy.stall()  # the link hangs from this claim on
            elif len(claims) >= 3:
                claimed_again.set()

        with hooked(hook):
            runner = RelayThread(
                flavour, proxy.url_for(side.url, PG_PORT), side.table, sink, poll=0.2
            )
            try:
                with side.open() as outbox:
                    first = side.add(outbox, [{"queue": "q", "body": 1}])
                    assert sink.wait_for(first, 20), "the relay does not publish"
                    armed.set()
                    ids = side.add(outbox, [{"queue": "q", "body": i} for i in range(3)])
                    stalled = claimed_again.wait(30)
                    proxy.resume()
                    assert stalled, "a claim on a stalled link hung past its timeout"
                    assert sink.wait_for(ids, 30), "the rows were not published after the stall"
                    stats = outbox.stats()
                    assert stats.dead == 0
            finally:
                proxy.resume()
                runner.stop()
