"""``claim.applied_before``: a ``claim_in`` without a key, run under a claim, tells that claim
when an earlier attempt of its key already committed the effect (then crashed before
completing) -- what the Idempotency-Key middleware answers with its "applied" problem."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import jobfence


def test_claim_in_tells_the_current_claim_that_its_key_was_applied(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    inbox = jobfence.Inbox(f"sqlite:///{path}", ttl=30)
    key = f"order:{uuid.uuid4().hex}"
    try:
        inbox.install()
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("CREATE TABLE orders (k TEXT)")
        seen: list[tuple[bool, bool]] = []

        @jobfence.guarded(inbox=inbox, key="{k}")
        def apply(k: str) -> str:
            db.execute("BEGIN IMMEDIATE")
            first = inbox.claim_in(db)  # the guarded call's key
            if first:
                db.execute("INSERT INTO orders VALUES (?)", (k,))
            db.execute("COMMIT")
            seen.append((first, jobfence.current_claim().applied_before))
            return "done"

        # an attempt that committed its effect, then died before completing its claim
        dead = inbox.claim(key, ttl=30)
        db.execute("BEGIN IMMEDIATE")
        assert inbox.claim_in(db, key) is True
        db.execute("INSERT INTO orders VALUES (?)", (key,))
        db.execute("COMMIT")
        assert dead.applied_before is False  # a claim_in with a key names no claim
        assert dead.release()  # its server died: the key is free (as after its ttl)

        assert apply(key) == "done"  # the retry: runs, but claim_in finds the key applied
        assert seen == [(False, True)]
        other = f"order:{uuid.uuid4().hex}"
        assert apply(other) == "done"  # a first attempt: applied here
        assert seen[-1] == (True, False)
        rows = db.execute("SELECT k, count(*) FROM orders GROUP BY k").fetchall()
        assert dict(rows) == {key: 1, other: 1}
        db.close()
    finally:
        inbox.close()
