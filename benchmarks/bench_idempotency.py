#!/usr/bin/env python3
"""Idempotency-Key: the cost per request of a FastAPI ``POST`` through each middleware.

In-process ASGI calls (a scope, a ``receive`` that gives the JSON body, a ``send`` that keeps
the response; no socket, no HTTP client), so that what is measured is the application and its
middleware, not the network. A fresh key per request (the first request of a key: the view
runs), in interleaved rounds, median and p99 µs per request:

  (a) no middleware: the anchor
  (b) a hand-written Redis idempotency middleware, the kind found in blog posts and answers
      (``@app.middleware("http")``: ``GET`` the stored response, ``SET key NX EX`` a lock,
      run the view, ``SET`` the response): no fingerprint, no caller scope, no release of a
      failed request's lock, an error response stored like any other
  (c) jobfence's ``IdempotencyKeyMiddleware`` on Redis (``AsyncInbox``)
  (d) jobfence's ``IdempotencyKeyMiddleware`` on PostgreSQL (``AsyncInbox``, psycopg)

and the replay of a stored response (the same key again) for (b) and (c).

Usage: ``python benchmarks/bench_idempotency.py [--ops 300] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness

from _harness import Stats
from fastapi import FastAPI
from pydantic import BaseModel
from tests.servers import POSTGRES_URL, REDIS_URL

import jobfence

NONE = "(a) FastAPI POST, no middleware"
NAIVE = "(b) hand-written Redis SET NX middleware"
JF_REDIS = "(c) jobfence IdempotencyKeyMiddleware, Redis"
JF_POSTGRES = "(d) jobfence IdempotencyKeyMiddleware, PostgreSQL"
NAIVE_REPLAY = "(b) hand-written, replay of a stored response"
JF_REDIS_REPLAY = "(c) jobfence Redis, replay of a stored response"
CASES = (NONE, NAIVE, JF_REDIS, JF_POSTGRES, NAIVE_REPLAY, JF_REDIS_REPLAY)
#: the anchor of each case
ANCHORS = {
    NAIVE: NONE,
    JF_REDIS: NONE,
    JF_POSTGRES: NONE,
    NAIVE_REPLAY: NONE,
    JF_REDIS_REPLAY: NONE,
}
BODY = json.dumps({"item": "tea", "qty": 2}).encode()

Call = Callable[[str], Awaitable[int]]


class Order(BaseModel):
    """The request body of ``POST /orders``."""

    item: str
    qty: int


def _app() -> Any:
    app = FastAPI()

    @app.post("/orders", status_code=201)
    async def create(order: Order) -> dict[str, Any]:
        return {"id": uuid.uuid4().hex, "item": order.item, "qty": order.qty}

    return app


def _naive(app: Any, redis: Any) -> Any:
    """The hand-written middleware of (b)."""
    from starlette.requests import Request
    from starlette.responses import Response

    @app.middleware("http")
    async def idempotency(request: Request, call_next: Any) -> Any:
        key = request.headers.get("idempotency-key")
        if request.method != "POST" or not key:
            return await call_next(request)
        cached = await redis.get(f"idem:{key}")
        if cached is not None:
            stored = json.loads(cached)
            return Response(
                stored["body"].encode(),
                status_code=stored["status"],
                media_type="application/json",
                headers={"Idempotent-Replayed": "true"},
            )
        if not await redis.set(f"idem:{key}:lock", "1", nx=True, ex=60):
            return Response(b'{"detail": "in progress"}', status_code=409)
        response = await call_next(request)
        body = b"".join([chunk async for chunk in response.body_iterator])
        await redis.set(
            f"idem:{key}",
            json.dumps({"status": response.status_code, "body": body.decode()}),
            ex=86400,
        )
        return Response(
            body,
            status_code=response.status_code,
            headers=dict(response.headers),
        )

    return app


def _caller(app: Any) -> Call:
    """A coroutine function: one ASGI POST /orders with the key (None: no header); returns
    the status."""

    async def call(key: str | None) -> int:
        headers = [(b"content-type", b"application/json"), (b"host", b"bench")]
        if key is not None:
            headers.append((b"idempotency-key", key.encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/orders",
            "raw_path": b"/orders",
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 80),
        }
        sent = False
        status = 0
        done = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": BODY, "more_body": False}
            await done.wait()  # the client leaves once it has the whole response
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await app(scope, receive, send)
        return status

    return call


@dataclass
class Measured:
    timings: dict[str, Stats]
    statuses: dict[str, set[int]]


async def _measure(ops: int, rounds: int) -> Measured:
    import redis.asyncio as aredis

    from jobfence.integrations.asgi import IdempotencyKeyMiddleware

    prefix = f"bench{uuid.uuid4().hex[:8]}"
    redis = aredis.Redis.from_url(REDIS_URL)
    redis_inbox = jobfence.AsyncInbox(REDIS_URL, table=prefix, retention=3600)
    pg_inbox = jobfence.AsyncInbox(POSTGRES_URL, table=prefix, retention=3600)
    plain = _app()
    naive = _naive(_app(), redis)
    jf_redis = _app()
    jf_redis.add_middleware(IdempotencyKeyMiddleware, inbox=redis_inbox)
    jf_pg = _app()
    jf_pg.add_middleware(IdempotencyKeyMiddleware, inbox=pg_inbox)
    calls = {
        NONE: _caller(plain),
        NAIVE: _caller(naive),
        JF_REDIS: _caller(jf_redis),
        JF_POSTGRES: _caller(jf_pg),
    }
    held = {NAIVE_REPLAY: "held-naive", JF_REDIS_REPLAY: "held-jobfence"}
    calls[NAIVE_REPLAY] = calls[NAIVE]
    calls[JF_REDIS_REPLAY] = calls[JF_REDIS]
    statuses: dict[str, set[int]] = {case: set() for case in CASES}
    samples: dict[str, list[list[float]]] = {case: [] for case in CASES}

    async def run(case: str, n: int, record: bool) -> None:
        call = calls[case]
        times = []
        clock = time.perf_counter
        for _ in range(n):
            key = None if case == NONE else held.get(case) or uuid.uuid4().hex
            started = clock()
            status = await call(key)
            times.append(clock() - started)
            statuses[case].add(status)
        if record:
            samples[case].append(times)

    try:
        for case in CASES:  # warm-up: connections, scripts, tables, the held keys
            await run(case, max(10, ops // 10), record=False)
        for i in range(rounds):
            order = list(CASES[i % len(CASES) :] + CASES[: i % len(CASES)])
            for case in order:
                await run(case, ops, record=True)
    finally:
        await redis_inbox.drop()
        await pg_inbox.drop()
        await redis_inbox.close()
        await pg_inbox.close()
        keys = [k async for k in redis.scan_iter(match="idem:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
    timings = {case: Stats.of([x for r in per for x in r], per) for case, per in samples.items()}
    return Measured(timings, statuses)


def measure(ops: int, rounds: int) -> Measured:
    """Median and p99 µs per request of every case (:data:`CASES`), and the statuses each
    case answered (201 for a new key, 201 replayed for a held one)."""
    return asyncio.run(_measure(ops, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    m = measure(args.ops, args.rounds)
    base = m.timings[NONE].median
    for case, st in m.timings.items():
        print(f"  {case:<52} {st.median:8.1f} µs  p99 {st.p99:8.1f} µs  {st.median / base:.2f}x")


if __name__ == "__main__":
    main()
