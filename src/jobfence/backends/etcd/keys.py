"""The etcd keys of both parts, built and read back.

Every component is percent-encoded (``urllib.parse.quote`` with nothing safe but letters,
digits and ``_.-~``), so no namespace, name, owner or idempotency key can hold the ``/`` that
separates components, and no two (namespace, name) pairs make the same key::

    <namespace>/locks/<name>/<owner>     one key per holder or waiter of lock <name>, attached
                                         to the etcd lease of that acquire
    <table>/inbox/<key>                  the inbox record of idempotency key <key> (JSON);
                                         attached to the etcd lease of its claim (in
                                         progress) or of its retention (completed)
    <table>/inbox-attempts/<key>         the last claim of <key>: its attempt number, owner
                                         and fingerprint (JSON; no lease), kept while the
                                         key is claimed, after its claim ended unreleased
                                         or released, until the key completes or is purged

Encoding is character by character, so the encoding of a prefix of a text is a prefix of
the encoding of the text: a range over ``encode(prefix)`` finds exactly the names that start
with ``prefix``.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

__all__ = [
    "attempts_key",
    "attempts_prefix",
    "decode",
    "encode",
    "inbox_key",
    "inbox_prefix",
    "lock_key",
    "lock_prefix",
    "range_end",
]


def encode(text: str) -> str:
    return quote(text, safe="")


def decode(text: str) -> str:
    return unquote(text, errors="surrogateescape")


def lock_prefix(namespace: str, name: str = "", *, whole: bool = True) -> str:
    """The prefix of every key of lock ``name`` (``whole``: with the trailing ``/``, so a
    longer name is not included), or of every lock name starting with ``name``."""
    base = f"{encode(namespace)}/locks/{encode(name)}"
    return base + "/" if whole else base


def lock_key(namespace: str, name: str, owner: str) -> str:
    return lock_prefix(namespace, name) + encode(owner)


def split_lock_key(namespace: str, key: str) -> tuple[str, str] | None:
    """``(name, owner)`` of a lock key of ``namespace``, ``None`` for any other key."""
    head = f"{encode(namespace)}/locks/"
    if not key.startswith(head):
        return None
    parts = key[len(head) :].split("/")
    if len(parts) != 2:
        return None
    return decode(parts[0]), decode(parts[1])


def inbox_prefix(table: str, key: str = "") -> str:
    return f"{encode(table)}/inbox/{encode(key)}"


def inbox_key(table: str, key: str) -> str:
    return inbox_prefix(table, key)


def attempts_prefix(table: str, key: str = "") -> str:
    return f"{encode(table)}/inbox-attempts/{encode(key)}"


def attempts_key(table: str, key: str) -> str:
    return attempts_prefix(table, key)


def inbox_name(table: str, stored: str, *, attempts: bool = False) -> str | None:
    """The idempotency key of a record key of ``table`` (``attempts``: of an attempts key),
    ``None`` for any other key."""
    head = attempts_prefix(table) if attempts else inbox_prefix(table)
    rest = stored[len(head) :] if stored.startswith(head) else None
    if rest is None or "/" in rest:
        return None
    return decode(rest)


def range_end(prefix: bytes) -> bytes:
    """The end of etcd's range of every key starting with ``prefix`` (its last byte below 0xff
    incremented, as etcd's ``clientv3.GetPrefixRangeEnd``)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"
