"""Runs jobfence on Django's connection inside ``transaction.atomic()`` and prints what
happened as one JSON object (the test asserts on it).

``jf_check scenario``: claim_in (duplicate, rollback then retry), fence, versioned_update,
retry_unit re-running a unit that hit a conflict raised through Django, and a guarded
function whose claim_in takes the guarded key. ``jf_check conflicts``: real errors provoked
through Django, as is_conflict / is_transient classify them.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from contextlib import ExitStack
from typing import Any

from django.core.management.base import BaseCommand
from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.db.models import F

import jobfence
from jobfence.integrations.django import close_broken_connections, fence_table, get_inbox
from shop.models import Product


class Boom(Exception):
    pass


def _classified(exc: BaseException) -> dict[str, Any]:
    return {
        "type": f"{type(exc).__module__}.{type(exc).__name__}",
        "cause": type(exc.__cause__).__name__ if exc.__cause__ is not None else None,
        "conflict": jobfence.is_conflict(exc),
        "transient": jobfence.is_transient(exc),
    }


def _lock_timeout() -> None:
    """A blocked write fails soon: PostgreSQL after 200 ms, MySQL after 1 s (its least);
    SQLite after the busy timeout of the settings."""
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            cur.execute("SET LOCAL lock_timeout = '200ms'")
        elif connection.vendor == "mysql":
            cur.execute("SET SESSION innodb_lock_wait_timeout = 1")


def scenario() -> dict[str, Any]:
    out: dict[str, Any] = {"vendor": connection.vendor}
    inbox = get_inbox()
    product = Product.objects.create(stock=100)

    def apply(key: str, qty: int) -> bool:
        with transaction.atomic():
            if not inbox.claim_in(connection, key):
                return False
            Product.objects.filter(pk=product.pk).update(stock=F("stock") - qty)
            return True

    key = f"order:{uuid.uuid4().hex}"
    out["first"] = apply(key, 1)
    out["duplicate"] = apply(key, 1)

    rolled = f"order:{uuid.uuid4().hex}"
    try:
        with transaction.atomic():
            out["claimed_before_error"] = inbox.claim_in(connection, rolled)
            Product.objects.filter(pk=product.pk).update(stock=F("stock") - 10)
            raise Boom
    except Boom:
        pass
    out["claimed_after_rollback"] = apply(rolled, 2)
    out["stock_after_claims"] = Product.objects.get(pk=product.pk).stock

    # fence: a token older than the one recorded is refused, and its write rolled back
    resource = f"product:{uuid.uuid4().hex}"
    with transaction.atomic():
        jobfence.fence(connection, resource, 7, table=fence_table())
        Product.objects.filter(pk=product.pk).update(stock=50)
    try:
        with transaction.atomic():
            jobfence.fence(connection, resource, 6, table=fence_table())
            Product.objects.filter(pk=product.pk).update(stock=0)
        out["stale_token"] = None
    except jobfence.StaleToken as exc:
        out["stale_token"] = {"token": exc.token, "newest": exc.newest}
    out["stock_after_fence"] = Product.objects.get(pk=product.pk).stock

    # versioned_update: the second writer read version 1 too and must lose
    table = Product._meta.db_table
    with transaction.atomic():
        out["new_version"] = jobfence.versioned_update(
            connection, table, {"id": product.pk}, 1, {"stock": 40}
        )
    try:
        with transaction.atomic():
            jobfence.versioned_update(connection, table, {"id": product.pk}, 1, {"stock": 30})
        out["stale_version"] = None
    except jobfence.StaleVersion as exc:
        out["stale_version"] = {"expected": exc.expected, "conflict": jobfence.is_conflict(exc)}
    row = Product.objects.get(pk=product.pk)
    out["after_versioned"] = [row.stock, row.version]

    # retry_unit: attempt 1 meets the row write-locked by another connection (PostgreSQL:
    # lock_timeout, SQLite: database is locked), raised through Django; the blocker commits
    # before attempt 2
    blocker = ExitStack()
    blocker.enter_context(transaction.atomic(using="other"))
    Product.objects.using("other").filter(pk=product.pk).update(stock=F("stock") + 0)
    attempts: list[int] = []
    errors: list[dict[str, Any]] = []

    def release_blocker(attempt: int, exc: BaseException, delay: float) -> None:
        errors.append(_classified(exc))
        blocker.close()

    unit_key = f"order:{uuid.uuid4().hex}"

    @jobfence.retry_unit(attempts=3, backoff=0.01, on_retry=release_blocker)
    def unit() -> bool:
        attempts.append(1)
        with transaction.atomic():
            _lock_timeout()
            if not inbox.claim_in(connection, unit_key):
                return False
            Product.objects.filter(pk=product.pk).update(stock=F("stock") - 5)
            return True

    try:
        out["unit_result"] = unit()
    finally:
        blocker.close()
    out["unit_attempts"] = len(attempts)
    out["unit_errors"] = errors
    out["unit_again"] = apply(unit_key, 5)
    out["stock_after_unit"] = Product.objects.get(pk=product.pk).stock

    # guarded: claim_in without a key takes the guarded call's key
    calls: list[int] = []

    @jobfence.guarded(inbox=inbox, key="order:{order_id}")
    def charge(order_id: str, qty: int) -> dict[str, Any]:
        calls.append(qty)
        with transaction.atomic():
            applied = inbox.claim_in(connection)
            if applied:
                Product.objects.filter(pk=product.pk).update(stock=F("stock") - qty)
        return {"applied": applied}

    order_id = uuid.uuid4().hex
    out["guarded_first"] = charge(order_id, 3)
    out["guarded_second"] = charge(order_id, 3)
    out["guarded_calls"] = len(calls)
    out["stock_after_guarded"] = Product.objects.get(pk=product.pk).stock
    with connection.cursor() as cur:
        cur.execute(f"SELECT state, applied FROM {inbox.table} WHERE k = %s", [f"order:{order_id}"])
        state, applied = cur.fetchone()
    out["guarded_record"] = [state, bool(applied)]
    inbox.close()

    # Django has no asyncio connections: the async functions refuse them, naming the way out
    try:
        asyncio.run(jobfence.fence_async(connection, "product:1", 1))
        out["async_refused"] = None
    except jobfence.ConfigurationError as exc:
        out["async_refused"] = str(exc)
    return out


def conflicts() -> dict[str, Any]:
    out: dict[str, Any] = {}
    other = connections["other"]
    product = Product.objects.create(stock=10)

    # a write blocked by another connection's uncommitted write
    try:
        with transaction.atomic(using="other"):
            Product.objects.using("other").filter(pk=product.pk).update(stock=9)
            with transaction.atomic():
                _lock_timeout()
                Product.objects.filter(pk=product.pk).update(stock=8)
    except Exception as exc:
        out["blocked_write"] = _classified(exc)

    # a unique violation is neither
    try:
        with transaction.atomic():
            Product.objects.create(pk=product.pk, stock=1)
    except IntegrityError as exc:
        out["integrity"] = _classified(exc)

    # a query in an atomic block whose write failed with a conflict (caught and ignored):
    # Django refuses it, and that is never retried although the cause is a conflict
    try:
        with transaction.atomic(using="other"):
            Product.objects.using("other").filter(pk=product.pk).update(stock=9)
            with transaction.atomic():
                _lock_timeout()
                try:
                    Product.objects.filter(pk=product.pk).update(stock=8)
                except DatabaseError:
                    pass
                Product.objects.count()
    except Exception as exc:
        out["broken_atomic"] = _classified(exc)
        out["broken_atomic"]["cause_conflict"] = jobfence.is_conflict(exc.__cause__)  # type: ignore[arg-type]

    if connection.vendor != "postgresql":
        return out

    # SELECT ... FOR UPDATE NOWAIT on a row another transaction locked
    try:
        with transaction.atomic(using="other"):
            Product.objects.using("other").select_for_update().get(pk=product.pk)
            with transaction.atomic():
                Product.objects.select_for_update(nowait=True).get(pk=product.pk)
    except Exception as exc:
        out["nowait"] = _classified(exc)

    # REPEATABLE READ: the row changed (and committed) after this transaction's snapshot
    try:
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            Product.objects.get(pk=product.pk)  # takes the snapshot
            with transaction.atomic(using="other"):
                Product.objects.using("other").filter(pk=product.pk).update(stock=7)
            Product.objects.filter(pk=product.pk).update(stock=6)
    except Exception as exc:
        out["serialization"] = _classified(exc)

    # the server ends this connection; retry_unit with close_broken_connections reconnects
    attempts: list[int] = []
    errors: list[dict[str, Any]] = []

    def record(attempt: int, exc: BaseException, delay: float) -> None:
        errors.append(_classified(exc))
        close_broken_connections(attempt, exc, delay)

    @jobfence.retry_unit(attempts=3, backoff=0.01, on_retry=record)
    def unit() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                (pid,) = cur.fetchone()
            with other.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", [pid])
        with transaction.atomic():
            return Product.objects.filter(pk=product.pk).update(stock=F("stock") - 1)

    out["terminated_result"] = unit()
    out["terminated_attempts"] = len(attempts)
    out["terminated_errors"] = errors
    return out


class Command(BaseCommand):
    help = "jobfence on Django's connection: prints the outcome as JSON"

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("what", choices=["scenario", "conflicts"])

    def handle(self, *args: Any, **options: Any) -> None:
        result = scenario() if options["what"] == "scenario" else conflicts()
        self.stdout.write(json.dumps(result))
