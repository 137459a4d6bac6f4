"""A lease's local deadlines, driven by a fake clock with no backend.

The times are chosen so that every deadline is an exact float: a lease acquired at 100 with
ttl 30 expires at 130 and is due for renewal at 110.
"""

from __future__ import annotations

import math
import uuid

import pytest

import jobfence
from jobfence._core.clock import set_clock
from jobfence._core.lease_state import RETRY_MAX, RETRY_MIN, LeaseState, Look
from jobfence.testing import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


def _state(clock: ManualClock, ttl: float = 30.0, *, renews: bool = True) -> LeaseState:
    return LeaseState(ttl, clock.monotonic(), renews=renews, clock=clock)


def test_the_renewers_look_at_a_lease(clock: ManualClock) -> None:
    """Acquired at 100 with ttl 30: due for renewal at 110 (within a window of 0.15 * 30 =
    4.5 s from 105.5 on), expired at 130; one that is not renewed is due only to expire."""
    state = _state(clock)
    assert state.look(100.0, 0.15) == Look(False, False, False, 110.0)
    assert state.look(106.0, 0.15) == Look(False, True, False, 110.0)  # batched with others
    assert state.look(110.0, 0.15) == Look(False, True, True, 110.0)
    assert state.look(130.0, 0.15).expired
    kept = _state(clock, renews=False)
    assert kept.look(129.0, 0.15) == Look(False, False, False, 130.0)
    assert kept.look(130.0, 0.15) == Look(True, False, False, 130.0)


def test_first_deadline_and_renewal_time(clock: ManualClock) -> None:
    state = _state(clock)
    assert state.ttl == 30.0 and state.renews
    assert state.expires_at == 130.0  # counted from before the acquire was sent
    assert state.next_renew == 110.0  # a third of the ttl
    assert state.next_check == 110.0
    assert not state.renewal_in_flight and not state.extending


def test_expiry(clock: ManualClock) -> None:
    state = _state(clock)
    assert not state.expired(129.999) and state.expired(130.0) and state.expired(131.0)
    clock.set(120.0)
    assert not state.expired() and state.remaining() == 10.0
    clock.set(130.0)
    assert state.expired() and state.remaining() == 0.0
    clock.set(135.0)
    assert state.remaining() == 0.0  # never negative


def test_the_default_clock_is_looked_up_at_each_call(clock: ManualClock) -> None:
    state = LeaseState(30.0, 100.0)
    old = set_clock(clock)
    try:
        clock.set(129.0)
        assert state.now() == 129.0 and not state.expired() and state.remaining() == 1.0
        clock.set(130.0)
        assert state.expired()
    finally:
        set_clock(old)


def test_a_successful_renewal_moves_both_deadlines(clock: ManualClock) -> None:
    state = _state(clock)
    assert state.renewal_sent(110.0) == 30.0  # carries the lease's ttl
    assert state.renewal_in_flight
    # nothing moves before the answer: the renewal may never reach the server
    assert (state.expires_at, state.next_renew) == (130.0, 110.0)
    clock.set(110.5)
    state.renewal_done(True)
    assert not state.renewal_in_flight
    # counted from when it was sent, not from when the answer came
    assert state.expires_at == 140.0 and state.next_renew == 120.0
    assert state.next_check == 120.0


def test_a_renewal_that_found_the_lease_gone_moves_nothing(clock: ManualClock) -> None:
    state = _state(clock)
    state.renewal_sent(110.0)
    state.renewal_done(False)
    assert not state.renewal_in_flight
    assert (state.expires_at, state.next_renew) == (130.0, 110.0)


@pytest.mark.parametrize(
    ("ttl", "retry_after"),
    [
        (5.0, 0.5),  # a tenth of the ttl
        (30.0, RETRY_MAX),  # a tenth would be 3 s: bounded
        (0.05, RETRY_MIN),  # a tenth would be 5 ms: bounded
    ],
)
def test_a_failed_renewal_is_retried_after_a_bounded_fraction_of_the_ttl(
    clock: ManualClock, ttl: float, retry_after: float
) -> None:
    state = _state(clock, ttl)
    sent = 100.0 + ttl / 3
    state.renewal_sent(sent)
    now = sent + ttl / 10  # the call gave up (or failed) a little later
    assert state.renewal_failed(now) is True
    assert not state.renewal_in_flight
    assert state.next_renew == pytest.approx(now + retry_after, abs=1e-12)
    assert state.expires_at == 100.0 + ttl  # an unanswered renewal extends nothing


def test_a_failed_renewal_after_the_expiry_schedules_no_retry(clock: ManualClock) -> None:
    state = _state(clock)
    state.renewal_sent(110.0)
    assert state.renewal_failed(130.0) is False  # expired: the lease is lost
    assert not state.renewal_in_flight
    assert state.next_renew == 110.0 and state.expires_at == 130.0


def test_an_extend_alone(clock: ManualClock) -> None:
    state = _state(clock)
    state.extend_started()
    assert state.extending
    assert (state.expires_at, state.next_renew) == (130.0, 110.0)  # nothing moves yet
    clock.set(106.0)
    state.extend_done(105.0, 60.0)
    assert not state.extending
    assert state.ttl == 60.0
    assert state.expires_at == 165.0 and state.next_renew == 125.0  # from when it was sent
    assert state.renewal_sent(125.0) == 60.0  # later renewals carry the new ttl


def test_an_extend_without_a_ttl_keeps_the_ttl(clock: ManualClock) -> None:
    state = _state(clock)
    state.extend_started()
    state.extend_done(105.0)
    assert state.ttl == 30.0
    assert state.expires_at == 135.0 and state.next_renew == 115.0


def test_an_extend_that_brings_the_next_check_forward_tells_the_renewer(
    clock: ManualClock,
) -> None:
    """The renewer sleeps until the next check it saw; an extend to a shorter ttl moves it
    earlier, so ``on_sooner`` is called with the new time. One that moves it later, or a
    failed one, calls nothing (the renewer wakes early enough already)."""
    state = _state(clock)
    told: list[float] = []
    state.on_sooner = told.append
    state.extend_started()
    state.extend_done(100.0, 60.0)  # next renewal at 120 instead of 110: later
    state.extend_started()
    state.extend_done(None, 3.0)  # failed: nothing moves
    assert told == []
    state.extend_started()
    state.extend_done(103.0, 3.0)  # renewal due at 104, expiry at 106
    assert told == [104.0] and state.next_check == 104.0


def test_a_failed_extend_moves_nothing(clock: ManualClock) -> None:
    state = _state(clock)
    state.extend_started()
    state.extend_done(None, 60.0)
    assert not state.extending
    assert state.ttl == 30.0  # later renewals still carry the old ttl
    assert (state.expires_at, state.next_renew) == (130.0, 110.0)
    # and the next renewal is handled like any other
    state.renewal_sent(110.0)
    state.renewal_done(True)
    assert (state.expires_at, state.next_renew) == (140.0, 120.0)


# An extend(60) and a renewal carrying the old ttl 30 in flight together: the server may
# apply them in either order and end the lease at the renewal's 140 (extend first, renewal
# last). The local expiry must not go past that, and a renewal with the new ttl is due at
# once after both answered (but not while the extend is still in flight).


def test_renewal_then_extend_sent_renewal_answers_first(clock: ManualClock) -> None:
    state = _state(clock)
    assert state.renewal_sent(110.0) == 30.0
    clock.set(111.0)
    state.extend_started()
    clock.set(111.5)
    state.renewal_done(True)
    assert state.expires_at == 140.0 and state.next_renew == 120.0
    clock.set(112.0)
    state.extend_done(111.0, 60.0)
    assert state.expires_at == 140.0  # not 171: the renewal may have landed last
    assert state.next_renew == 112.0  # renew with ttl 60 at once
    assert state.renewal_sent(112.0) == 60.0
    clock.set(112.5)
    state.renewal_done(True)
    assert state.expires_at == 172.0 and state.next_renew == 132.0  # settled


def test_renewal_then_extend_sent_extend_answers_first(clock: ManualClock) -> None:
    state = _state(clock)
    state.renewal_sent(110.0)
    clock.set(111.0)
    state.extend_started()
    clock.set(111.5)
    state.extend_done(111.0, 60.0)
    assert state.expires_at == 140.0  # bounded by the renewal still in flight
    assert state.next_renew == 111.5
    clock.set(112.0)
    state.renewal_done(True)  # the old-ttl renewal answers last
    assert state.expires_at == 140.0  # the shorter of 140 (extend's bound) and 110 + 30
    assert state.next_renew == 112.0  # a renewal with ttl 60 is due at once
    assert state.renewal_sent(112.0) == 60.0


def test_extend_then_renewal_sent_renewal_answers_first(clock: ManualClock) -> None:
    state = _state(clock)
    state.extend_started()  # extend(60) sent at 105
    clock.set(110.0)
    assert state.renewal_sent(110.0) == 30.0  # the old ttl: the extend has not answered
    clock.set(110.5)
    state.renewal_done(True)
    assert state.expires_at == 130.0  # the shorter: not moved to 140
    # the extend is still in flight: no busy re-renewal with the old ttl ...
    assert state.next_renew == 120.0
    clock.set(111.0)
    state.extend_done(105.0, 60.0)
    assert state.expires_at == 130.0  # not 165: the renewal may have landed after it
    assert state.next_renew == 111.0  # ... its completion schedules the renewal at once
    assert state.renewal_sent(111.0) == 60.0


def test_extend_then_renewal_sent_extend_answers_first(clock: ManualClock) -> None:
    state = _state(clock)
    state.extend_started()  # extend(60) sent at 105
    clock.set(110.0)
    state.renewal_sent(110.0)
    clock.set(110.5)
    state.extend_done(105.0, 60.0)
    assert state.expires_at == 140.0  # the renewal's outcome, not the extend's 165
    assert state.next_renew == 110.5
    clock.set(111.0)
    state.renewal_done(True)
    assert state.expires_at == 140.0
    assert state.next_renew == 111.0  # re-renew with ttl 60 at once
    assert state.renewal_sent(111.0) == 60.0


def test_an_overlapping_renewal_that_failed_still_bounds_the_extend(clock: ManualClock) -> None:
    """An unanswered renewal may still have been applied after the extend."""
    state = _state(clock)
    state.renewal_sent(110.0)
    state.extend_started()
    assert state.renewal_failed(111.0) is True
    clock.set(112.0)
    state.extend_done(111.0, 60.0)
    assert state.expires_at == 130.0  # what the state knew: the renewal proved nothing
    assert state.next_renew == 112.0


def test_a_renewal_sent_between_two_concurrent_extends_bounds_the_second(
    clock: ManualClock,
) -> None:
    state = _state(clock)
    state.extend_started()  # extend(60) sent at 105
    state.extend_started()  # extend(90) sent at 106, from another thread
    state.extend_done(105.0, 60.0)
    assert state.expires_at == 165.0 and state.next_renew == 125.0
    assert state.renewal_sent(125.0) == 60.0  # while extend(90) is still in flight
    clock.set(126.0)
    state.extend_done(106.0, 90.0)
    assert state.expires_at == 185.0  # the renewal's 125 + 60, not the extend's 196
    assert state.next_renew == 126.0  # renew with ttl 90 at once
    clock.set(127.0)
    state.renewal_done(True)
    assert state.expires_at == 185.0 and state.next_renew == 127.0
    assert state.renewal_sent(127.0) == 90.0


def test_an_extend_after_an_overlap_ended_is_plain_again(clock: ManualClock) -> None:
    state = _state(clock)
    state.renewal_sent(110.0)
    state.extend_started()
    state.renewal_done(True)
    state.extend_done(111.0, 60.0)
    state.renewal_sent(112.0)
    state.renewal_done(True)
    state.extend_started()
    clock.set(121.0)
    state.extend_done(120.0, 90.0)
    assert state.expires_at == 210.0 and state.next_renew == 150.0


def test_a_lease_that_is_not_renewed_only_expires(clock: ManualClock) -> None:
    state = _state(clock, renews=False)
    assert not state.renews
    assert math.isinf(state.next_renew)
    assert state.next_check == 130.0  # only the expiry is due
    state.extend_started()
    clock.set(106.0)
    state.extend_done(105.0, 60.0)
    assert state.expires_at == 165.0
    assert math.isinf(state.next_renew) and state.next_check == 165.0
    assert state.expired(165.0)


# -- the lease and its client on top of the state -------------------------------------------


def test_a_lease_exposes_its_state_to_the_renewer(clock: ManualClock) -> None:
    old = set_clock(clock)
    try:
        locks = jobfence.Locks(f"memory://{uuid.uuid4().hex}")
        lease = locks.acquire("x", ttl=30, renew=False)  # nothing renews it behind our back
        assert lease.state.expires_at == 130.0 and math.isinf(lease.state.next_renew)
        assert not lease.renews and lease.ttl == 30.0 and lease.expires_in == 30.0
        clock.set(110.0)
        lease.extend(60)
        assert lease.ttl == 60.0 and lease.state.expires_at == 170.0
        clock.set(170.0)
        assert lease.lost  # the state's expiry, read through the lease
        renewed = locks.try_acquire("y", ttl=30)
        assert renewed is not None and renewed.renews
        assert renewed.state.next_renew == 180.0
        assert not locks.closed
        locks.close()
        assert locks.closed
        with pytest.raises(jobfence.LockLost, match="closed"):
            renewed.check()
    finally:
        set_clock(old)
