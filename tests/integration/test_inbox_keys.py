"""Idempotency keys may contain anything, NUL included, on every backend."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

import jobfence
from tests.servers import MYSQL_URL, POSTGRES_URL, REDIS_URL

KEYS = ["order:\0:1", "\ufffe" + b"order:\0:1".hex(), "quote'\"\\;--", "ключ:🙂"]


@pytest.fixture(params=["postgres", "mysql", "sqlite", "redis", "memory"])
def inbox(request: pytest.FixtureRequest, tmp_path: Path) -> jobfence.Inbox:
    table = "keys_" + uuid.uuid4().hex[:10]
    url = {
        "postgres": POSTGRES_URL,
        "mysql": MYSQL_URL,
        "sqlite": f"sqlite:///{tmp_path / 'k.db'}",
        "redis": REDIS_URL,
        "memory": f"memory://{uuid.uuid4().hex}",
    }[request.param]
    box = jobfence.Inbox(url, table=table)
    yield box
    drop = getattr(box.backend, "drop", None)
    if drop is not None:
        drop()
    box.close()


def test_keys_with_nul_and_look_alikes_stay_distinct(inbox: jobfence.Inbox) -> None:
    for i, key in enumerate(KEYS):
        claim = inbox.claim(key, ttl=60)
        assert claim.state is jobfence.ClaimState.NEW, key
        claim.complete({"n": i})
    for i, key in enumerate(KEYS):
        again = inbox.claim(key, ttl=60)
        assert again.state is jobfence.ClaimState.COMPLETED and again.result == {"n": i}


def test_claim_in_with_a_nul_key_on_postgresql() -> None:
    table = "keys_" + uuid.uuid4().hex[:10]
    inbox = jobfence.Inbox(POSTGRES_URL, table=table)
    inbox.install()
    try:
        with psycopg.connect(POSTGRES_URL) as conn:
            with conn.transaction():
                assert inbox.claim_in(conn, "msg:\0:7") is True
            with conn.transaction():
                assert inbox.claim_in(conn, "msg:\0:7") is False
        assert inbox.claim("msg:\0:7", ttl=60).state is not jobfence.ClaimState.NEW
    finally:
        inbox.backend.drop()
        inbox.close()
