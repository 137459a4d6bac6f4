#!/usr/bin/env python3
"""Redis locks: jobfence against a hand-written lock and redis-py's ``Lock``, in one run.

Uncontended acquire+release, interleaved rounds, median of the rounds (µs per pair):

  (a) hand-written ``SET key token NX PX`` + ``EVALSHA`` compare-and-delete (the baseline)
  (b) redis-py ``Lock``: ``acquire(blocking=False)`` + ``release()``
  (c) jobfence ``Locks.try_acquire()`` + ``release()`` (renew=True, the default)
  (d) the same with ``renew=False``
  (e) jobfence ``AsyncLocks`` (renew=True), and (f) the hand-written lock on ``redis.asyncio``
  (g) the same with ``socket_timeout=5``, jobfence's default: redis.asyncio then bounds every
      command with ``asyncio.wait_for``, which the sync client gets for free from the socket
  (h) ``redis.asyncio`` ``Lock``, (i) python-redis-lock, (j) pottery ``Redlock`` with one
      master (these three need the ``bench`` extra: ``pip install -e '.[bench]'``)

Contended hand-off: 4 processes loop on one name for a fixed time, each holding the lock for
a 1 ms critical section (``time.sleep(0.001)``). Reports ops/s against the ideal (1000/s, and
the ideal given what ``sleep(0.001)`` really takes here) and each worker's share (1.0 = a fair
quarter). jobfence (``acquire``, fair FIFO hand-off) against a hand-written minimal FIFO
hand-off (the yardstick: same round trips, none of the safety) and redis-py
``Lock(blocking=True)``,
and, as a reference for what the machine allows, one process running the same loop alone
(no contention: every cycle is sleep + release + acquire, one after the other).

Usage: ``python benchmarks/bench_redis_locks.py [--url redis://127.0.0.1:6379/0]
[--rounds 31] [--ops 400] [--seconds 3] [--workers 4]``
"""

from __future__ import annotations

import os
import sys

import redis
import redis.asyncio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness, also in workers

import _harness as h

import jobfence

DELETE_IF_OWNER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


# -- uncontended ----------------------------------------------------------------------------
def hand_written(url: str, ns: str) -> h.Runner:
    r = redis.Redis.from_url(url)
    delete = r.register_script(DELETE_IF_OWNER)
    key = f"{ns}:hand"

    return h.owner_pairs(
        lambda token: r.set(key, token, nx=True, px=h.TTL * 1000),
        lambda token: delete(keys=[key], args=[token]),
        "hand-written lock",
    )


def redis_py_lock(url: str, ns: str) -> h.Runner:
    r = redis.Redis.from_url(url)
    key = f"{ns}:redis-py"

    def run(n: int) -> None:
        for _ in h.laps(n):
            lock = r.lock(key, timeout=h.TTL)
            if not lock.acquire(blocking=False):
                raise RuntimeError("redis-py lock not acquired")
            lock.release()

    return run


def jobfence_sync(url: str, ns: str, renew: bool) -> h.Runner:
    return h.jobfence_sync(jobfence.Locks(url, namespace=ns), f"jobfence-{renew}", renew)


def hand_written_async(
    url: str, ns: str, scope: h.AsyncScope, socket_timeout: float | None = None
) -> h.Runner:
    r = redis.asyncio.Redis.from_url(url, socket_timeout=socket_timeout)
    delete = r.register_script(DELETE_IF_OWNER)
    key = f"{ns}:hand-async"

    return h.owner_pairs_async(
        lambda token: r.set(key, token, nx=True, px=h.TTL * 1000),
        lambda token: delete(keys=[key], args=[token]),
        "hand-written async lock",
        scope,
    )


def redis_asyncio_lock(url: str, ns: str, scope: h.AsyncScope) -> h.Runner:
    r = redis.asyncio.Redis.from_url(url)
    scope.on_close(r.aclose)
    key = f"{ns}:redis-asyncio"

    async def body(n: int) -> None:
        for _ in h.laps(n):
            lock = r.lock(key, timeout=h.TTL)
            if not await lock.acquire(blocking=False):
                raise RuntimeError("redis.asyncio lock not acquired")
            await lock.release()

    return scope.runner(body)


def python_redis_lock(url: str, ns: str) -> h.Runner:
    """python-redis-lock's ``Lock`` (``SET NX EX`` + a release script that also signals
    blocked waiters through a list)."""
    import redis_lock

    r = redis.Redis.from_url(url)
    name = f"{ns}:python-redis-lock"

    def run(n: int) -> None:
        for _ in h.laps(n):
            lock = redis_lock.Lock(r, name, expire=h.TTL)
            if not lock.acquire(blocking=False):
                raise RuntimeError("python-redis-lock not acquired")
            lock.release()

    return run


def pottery_redlock(url: str, ns: str) -> h.Runner:
    """pottery's ``Redlock`` with one master (the Redlock algorithm's quorum of one)."""
    from pottery import Redlock

    r = redis.Redis.from_url(url)
    key = f"{ns}:pottery"

    def run(n: int) -> None:
        for _ in h.laps(n):
            lock = Redlock(key=key, masters={r}, auto_release_time=h.TTL)
            if not lock.acquire(blocking=False):
                raise RuntimeError("pottery Redlock not acquired")
            lock.release()

    return run


def anchors(url: str, ns: str, scope: h.AsyncScope) -> list[h.Variant]:
    """The other libraries' locks (the ``bench`` extra): redis.asyncio's ``Lock``,
    python-redis-lock and pottery's ``Redlock``."""
    return [
        ("(h) redis.asyncio Lock", redis_asyncio_lock(url, ns, scope)),
        ("(i) python-redis-lock Lock", python_redis_lock(url, ns)),
        ("(j) pottery Redlock, one master", pottery_redlock(url, ns)),
    ]


def variants(url: str, ns: str, scope: h.AsyncScope) -> list[h.Variant]:
    return [
        ("(a) hand-written SET NX PX + EVALSHA delete", hand_written(url, ns)),
        ("(b) redis-py Lock", redis_py_lock(url, ns)),
        ("(c) jobfence Locks, renew=True (default)", jobfence_sync(url, ns, True)),
        ("(d) jobfence Locks, renew=False", jobfence_sync(url, ns, False)),
        ("(e) jobfence AsyncLocks, renew=True", h.jobfence_async(url, ns, scope)),
        ("(f) hand-written on redis.asyncio", hand_written_async(url, ns, scope)),
        (
            "(g) (f) with socket_timeout=5 (jobfence's default)",
            hand_written_async(url, ns, scope, socket_timeout=5.0),
        ),
        *anchors(url, ns, scope),
    ]


# -- contended hand-off -----------------------------------------------------------------------
FIFO_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 0
"""
FIFO_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local nxt = redis.call('LPOP', KEYS[2])
if nxt then
  redis.call('SET', KEYS[1], nxt, 'PX', ARGV[2])
  redis.call('LPUSH', KEYS[3] .. nxt, 1)
else
  redis.call('DEL', KEYS[1])
end
return 1
"""


class HandWrittenFifo:
    """The bare minimum of a FIFO hand-off, as a yardstick for what this machine allows: one
    script to take the lock or join the queue, a BLPOP on the waiter's own list, and a release
    script that gives the lock to the queue's head and wakes only it (no tokens, no deadlines,
    no crash handling: a dead waiter would stall the queue)."""

    def __init__(self, url: str, ns: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.keys = [f"{ns}:fifo", f"{ns}:fifo:q", f"{ns}:fifo:w:"]
        self.me = os.urandom(8).hex()
        self._acquire = self.r.register_script(FIFO_ACQUIRE)
        self._release = self.r.register_script(FIFO_RELEASE)

    def __enter__(self) -> None:
        if not self._acquire(keys=self.keys[:2], args=[self.me, 10_000]):
            self.r.blpop([self.keys[2] + self.me], timeout=30)

    def __exit__(self, *exc: object) -> None:
        self._release(keys=self.keys, args=[self.me, 10_000])


def _worker(kind: str, url: str, ns: str, seconds: float, gate: h.Gate) -> None:
    if kind == "hand-fifo":
        fifo = HandWrittenFifo(url, ns)
        count = gate.hand_off(lambda: fifo, seconds)
        fifo.r.close()
    elif kind == "jobfence":
        locks = jobfence.Locks(url, namespace=ns)
        count = gate.hand_off(lambda: locks.acquire("contended", ttl=10, timeout=30), seconds)
        locks.close()
    else:
        sleep = 0.1 if kind == "redis-py" else 0.001
        r = redis.Redis.from_url(url)
        count = gate.hand_off(
            lambda: r.lock(f"{ns}:contended", timeout=10, sleep=sleep, blocking_timeout=30),
            seconds,
        )
        r.close()
    gate.report(count)


def _cleanup(url: str, ns: str) -> None:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{ns}:*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


# -- report -----------------------------------------------------------------------------------
def main() -> None:
    args = h.parse_args(__doc__, "REDIS_URL", "redis://127.0.0.1:6379/0", rounds=31, ops=400)
    info = redis.Redis.from_url(args.url).info("server")
    print(
        f"Redis {info['redis_version']} at {args.url}; redis-py {redis.__version__}; "
        f"{os.cpu_count()} CPUs; {args.rounds} interleaved rounds x {args.ops} ops, median"
    )
    h.run_lock_benchmarks(
        args,
        variants,
        _cleanup,
        _worker,
        [
            ("jobfence", "jobfence Locks.acquire (FIFO hand-off)"),
            ("hand-fifo", "hand-written FIFO hand-off (Lua + BLPOP, no tokens/ttl)"),
            ("redis-py", "redis-py Lock(blocking=True), sleep=0.1 (default)"),
            ("redis-py-fast", "redis-py Lock(blocking=True), sleep=0.001"),
        ],
        warmup=max(50, args.ops // 20),
        async_pair=("(e)", "(f)"),
        precision=1,
        reference=(
            "jobfence",
            "(reference) jobfence, 1 process alone: the same loop without contention",
        ),
        width=160,
    )


if __name__ == "__main__":
    main()
