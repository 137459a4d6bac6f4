"""One renewer for leases, claims and queue deliveries, typed against ``jobfence.Renewable``:
what each hands the renewer satisfies the protocol, and the renewer knows none of them (its
modules import no lock, inbox or queue module, so there is no import cycle through it)."""

from __future__ import annotations

import ast
import gc
import uuid
import weakref
from pathlib import Path

import pytest

import jobfence
from jobfence._core.lease_state import LeaseState
from jobfence._core.renewable import RenewableHandle

SRC = Path(jobfence.__file__).resolve().parent


def _url() -> str:
    return f"memory://{uuid.uuid4().hex}"


def test_a_lease_is_renewable() -> None:
    with jobfence.Locks(_url()) as locks, locks.acquire("job", ttl=5) as lease:
        assert isinstance(lease, jobfence.Renewable)
        assert lease.label == f"the lease on 'job' (token {lease.token})"


async def test_an_async_lease_is_renewable() -> None:
    async with jobfence.AsyncLocks(_url()) as locks, locks.acquire("job", ttl=5) as lease:
        assert isinstance(lease, jobfence.Renewable)


def test_a_new_claim_and_a_delivery_hand_the_renewer_a_renewable() -> None:
    with jobfence.Inbox(_url()) as inbox:
        claim = inbox.claim("key", renew=True)
        renewal = claim.renewal
        assert isinstance(renewal, jobfence.Renewable)
        assert (renewal.name, renewal.renews, renewal.released) == ("key", True, False)
        assert renewal.label == "the claim on 'key' (attempt 1)"
        claim.complete("done")
        assert renewal.released  # completed: the renewer leaves it alone
    with jobfence.Queue(_url(), "q") as queue:
        queue.publish({"n": 1})
        (message,) = queue.receive(renew=True)
        renewal = message.renewal
        assert isinstance(renewal, jobfence.Renewable)
        assert (renewal.name, renewal.owner) == (message.receipt, queue.consumer)
        assert not renewal.released
        message.ack()
        assert renewal.released


def test_a_handle_asks_its_holder_and_tells_it_of_a_loss() -> None:
    lost: list[str] = []
    done = [False]
    handle = RenewableHandle(
        "n",
        "o",
        LeaseState(3.0, 0.0),
        label="the thing",
        released=lambda: done[0],
        lost=lost.append,
    )
    assert (handle.token, handle.renews, handle.released) == (0, True, False)
    done[0] = True
    assert handle.released
    handle.mark_lost("gone", background=True)
    assert lost == ["gone"]


def test_a_finished_claim_and_delivery_are_freed_without_the_cyclic_collector() -> None:
    # a holder refers to its handle; the handle must not refer back to it (a cycle would
    # leave every claim of a worker to the cyclic collector, whose collections it triggers)
    gc.collect()
    gc.disable()
    try:
        with jobfence.Inbox(_url()) as inbox:
            claim = inbox.claim("key", renew=True)
            claim.complete("done")
            claim_ref = weakref.ref(claim)
            del claim
            assert claim_ref() is None
        with jobfence.Queue(_url(), "q") as queue:
            queue.publish({"n": 1})
            (message,) = queue.receive(renew=True)
            message.ack()
            message_ref = weakref.ref(message)
            del message
            assert message_ref() is None
    finally:
        gc.enable()


def test_a_handle_whose_holder_is_gone_is_released_and_tells_nobody() -> None:
    class Holder:
        def __init__(self) -> None:
            self.lost: list[str] = []

        def done(self) -> bool:
            return False

        def tell(self, reason: str) -> None:
            self.lost.append(reason)

    holder = Holder()
    handle = RenewableHandle(
        "n", "o", LeaseState(3.0, 0.0), label="the thing", released=holder.done, lost=holder.tell
    )
    assert not handle.released
    handle.mark_lost("gone")
    assert holder.lost == ["gone"]
    del holder
    assert handle.released
    handle.mark_lost("gone again")  # nobody to tell


@pytest.mark.parametrize("module", ["_core/renewer_async.py", "_core/renewable.py"])
def test_the_renewer_imports_no_lock_inbox_or_queue_module(module: str) -> None:
    tree = ast.parse((SRC / module).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[-1])
            imported |= {alias.name for alias in node.names}
    forbidden = {"locks_async", "locks", "lease_async", "lease", "inbox_async", "inbox"}
    forbidden |= {"queue_async", "queue", "renewal_async", "renewal"}
    assert not imported & forbidden, f"{module} imports {imported & forbidden}"
