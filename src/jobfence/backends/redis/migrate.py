"""Move the Redis keys that earlier versions of jobfence laid out differently to their current keys
(``jobfence redis migrate-keys``; see ``keys.py`` and the upgrade section of
``docs/how-to/backends/redis.md``).

Only keys of a namespace, lock name or inbox key holding a brace (``{`` or ``}``) moved; every
other key is where it was. This finds, by ``SCAN`` (never ``KEYS``):

* the lease keys ``S:lock:{N}`` of the namespaces given (STRING keys ending in ``}`` whose value
  is ``"<token>:<owner>"``), moved with their remaining ttl: the lease still excludes other
  acquirers until it ends. A holder still running the previous version no longer finds it and
  stops at its next renewal (``LockLost``). Waiter queues, wake lists, release records and
  token counters are left to expire: every new grant's token is floored at the server clock,
  so it is above the tokens of the old counter;
* the keys ``S:q:{Q}:<suffix>`` of the queues of a namespace holding a brace (a queue name
  never does), moved whole: messages, deliveries in flight, delays and dead letters;
* the inbox records ``T:K`` of the tables given (hashes with the record's fields), moved with
  their remaining retention, so that a completed key is still a duplicate.

A key whose new key already exists is left in place and reported as a conflict. Each move is
one ``RENAMENX`` (atomic, keeps the ttl); across hash slots of a Redis Cluster, a ``DUMP`` +
``RESTORE`` with the remaining ttl, then a ``DEL``. Run it with the workers of the previous
version stopped: a key they write after the move is in the old layout again (run it again).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisClusterException, ResponseError

from ..._core.validate import check_queue_name
from ...errors import ConfigurationError
from .keys import (
    glob_escape,
    inbox_key,
    inbox_name,
    legacy_inbox_key,
    legacy_lock_key,
    legacy_queue_prefix,
    lock_key,
    needs_encoding,
    queue_prefix,
)

__all__ = ["Migration", "migrate_keys"]

#: the suffixes of a queue's keys (``queue_async.py``)
_QUEUE_SUFFIXES = ("s", "f", "o", "d", "ds", "dead", "m", "mx")
_LEASE_VALUE = re.compile(rb"^[0-9]+:")
_RECORD_STATES = (b"in_progress", b"completed")


@dataclass
class Migration:
    """What :func:`migrate_keys` did (or, with ``dry_run``, would do): ``moved`` and
    ``conflicts`` are (old key, new key) pairs; a conflict's new key existed already, and
    its old key was left in place."""

    moved: list[tuple[str, str]] = field(default_factory=list)
    conflicts: list[tuple[str, str]] = field(default_factory=list)


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)


def _scan(client: Any, pattern: str, kind: str | None = None) -> Iterator[str]:
    seen: set[str] = set()  # SCAN may return a key twice
    for raw in client.scan_iter(match=pattern, count=1000, _type=kind):
        key = _text(raw)
        if key not in seen:
            seen.add(key)
            yield key


def _move(client: Any, old: str, new: str) -> bool | None:
    """Move ``old`` to ``new`` with its ttl: True; False if ``new`` exists (nothing moved);
    None if ``old`` is gone meanwhile."""
    try:
        return bool(client.renamenx(old, new))
    except RedisClusterException:
        pass  # redis-py's cluster client refuses keys of two slots before sending
    except ResponseError as exc:
        text = str(exc)
        if "no such key" in text:
            return None
        if "CROSSSLOT" not in text:
            raise
    payload = client.dump(old)  # a cluster: old and new lie in different slots
    if payload is None:
        return None
    ttl = int(client.pttl(old))  # -1: no expiry (RESTORE with 0); -2: gone meanwhile
    if ttl == -2:
        return None
    try:
        client.restore(new, max(ttl, 0), payload)
    except ResponseError as exc:
        if "BUSYKEY" in str(exc):
            return False
        raise
    client.delete(old)
    return True


def _lock_moves(client: Any, namespace: str) -> Iterator[tuple[str, str]]:
    head = legacy_lock_key(namespace, "")[:-1]  # "S:lock:{"
    for key in _scan(client, glob_escape(head) + "*", "string"):
        if not key.startswith(head) or not key.endswith("}") or len(key) <= len(head) + 1:
            continue
        name = key[len(head) : -1]
        new = lock_key(namespace, name)
        if new == key:
            continue
        value = client.get(key)
        if isinstance(value, str):
            value = value.encode()
        if value is not None and _LEASE_VALUE.match(value):
            yield key, new


def _queue_moves(client: Any, namespace: str) -> Iterator[tuple[str, str]]:
    if not needs_encoding(namespace):
        return  # queue names hold no brace: these keys did not move
    head = legacy_queue_prefix(namespace, "")[:-2]  # "S:q:{"
    for key in _scan(client, glob_escape(head) + "*"):
        rest = key[len(head) :]
        queue, sep, suffix = rest.partition("}:")
        if not key.startswith(head) or not sep or suffix not in _QUEUE_SUFFIXES:
            continue
        try:
            check_queue_name(queue)
        except ConfigurationError:
            continue
        yield key, queue_prefix(namespace, queue) + suffix


def _inbox_moves(client: Any, table: str) -> Iterator[tuple[str, str]]:
    head = legacy_inbox_key(table, "")
    for key in _scan(client, glob_escape(head) + "*", "hash"):
        name = key[len(head) :]
        if not key.startswith(head) or not name or not needs_encoding(name):
            continue  # a brace-free key: the same key in both layouts
        if inbox_name(table, key) is not None:
            continue  # a record in the current layout
        state, attempt, expires = client.hmget(key, "s", "a", "e")
        if isinstance(state, str):
            state = state.encode()
        if state in _RECORD_STATES and attempt is not None and expires is not None:
            yield key, inbox_key(table, name)


def migrate_keys(
    client: Any,
    *,
    namespaces: Sequence[str] = ("jobfence",),
    tables: Sequence[str] = ("jobfence_inbox",),
    dry_run: bool = False,
) -> Migration:
    """Move the leases and queues of ``namespaces`` and the records of the inbox ``tables``
    from the layout of earlier versions to the current one, on ``client`` (a ``redis.Redis`` or
    ``RedisCluster``); ``dry_run`` only lists the moves. Safe to run again: a key already in
    the current layout is never touched."""
    result = Migration()
    moves: list[tuple[str, str]] = []
    for namespace in namespaces:
        moves += _lock_moves(client, namespace)
        moves += _queue_moves(client, namespace)
    for table in tables:
        moves += _inbox_moves(client, table)
    for old, new in moves:
        if dry_run:
            (result.conflicts if client.exists(new) else result.moved).append((old, new))
            continue
        done = _move(client, old, new)
        if done:
            result.moved.append((old, new))
        elif done is False:
            result.conflicts.append((old, new))
    return result
