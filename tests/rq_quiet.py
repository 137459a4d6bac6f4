"""An in-process RQ ``SimpleWorker`` that does not listen on its pubsub channel.

RQ's worker subscribes to a channel for remote commands (stop a job, kill the worker) and
stops that subscription's thread at teardown. With redis-py 8, the thread can be waiting
inside ``get_message`` for up to RQ's 60 s ``sleep_time`` when its subscription ends, and
``stop()`` joins it without a timeout: a burst worker's ``work()`` then returns a minute late
(and a claim the test holds may expire meanwhile). The tests that run a burst worker in
their own process send it no command, so they go without the channel.
"""

from __future__ import annotations

import rq


class QuietWorker(rq.SimpleWorker):  # type: ignore[misc]
    """``rq.SimpleWorker`` without the remote-command channel."""

    def subscribe(self) -> None:
        self.pubsub_thread = None

    def unsubscribe(self) -> None:
        return None
