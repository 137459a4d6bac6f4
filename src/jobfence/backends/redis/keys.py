"""The Redis key of every lock, inbox record and queue: one encoding, used by every part and by
everything that reads keys back (listings, ``forget``, ``drop``, ``doctor``, the migration).

A key names its part, its namespace and its name, and no two different triples
(part, namespace, name) share a key, whatever text they hold:

=========================================  ==============================================
``S:lock:{N}``                             lease key of lock ``N`` in namespace ``S``; the
                                           lock scripts derive ``:tok``, ``:q``, ``:qd``,
                                           ``:qf``, ``:w:<owner>``, ``:rel`` by suffix
``S:q:{Q}:<suffix>``                       the keys of queue ``Q`` in namespace ``S``
``T:K``                                    inbox record of key ``K`` in table ``T``
=========================================  ==============================================

That is the layout when neither the namespace nor the name holds a brace (``{`` or ``}``).
When one of them does, both are percent-encoded (``%`` -> ``%25``, ``{`` -> ``%7B``, ``}`` ->
``%7D``) and the part tag gets a ``%`` mark: ``S':lock%:{N'}``, ``S':q%:{Q}:<suffix>`` and, for an
inbox key with a brace, ``T:inbox%:{K'}``. Why it is injective:

* the first ``{`` of a tagged key (lock, queue, inbox key with a brace) opens its name: the
  namespace is brace-free (as given or encoded), the tag never holds one. The tag is the
  ``:``-separated segment just before that ``{`` (tags hold no ``:``), the namespace is what
  precedes it, and the name runs up to the first ``}`` (the name is brace-free too), so a key
  splits back into exactly one (part, namespace, name, suffix); the mark says whether to
  decode, and an encoded triple always has a brace somewhere, a plain one never does;
* an inbox key of a brace-free ``K`` holds no ``{`` at all, so it is no tagged key, and the
  table (an SQL identifier: no ``:``) ends at the first ``:``.

Redis Cluster: the first ``{`` of a tagged key opens its name and the first ``}`` after it
closes it, so the hash tag is the (encoded) name itself -- never empty, since names are not --
and every key of one lock or queue lies in one slot, whatever the namespace holds. An inbox
key of a brace-free ``K`` carries no tag (its slot comes from the whole key).

Keys of names, namespaces and inbox keys without braces are exactly those of earlier
versions (``legacy_*`` below build that layout); the others moved, see :mod:`.migrate` and
the upgrade section of ``docs/how-to/backends/redis.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "INBOX",
    "LOCK",
    "QUEUE",
    "KeyParts",
    "decode",
    "encode",
    "glob_escape",
    "inbox_key",
    "inbox_name",
    "inbox_patterns",
    "legacy_inbox_key",
    "legacy_lock_key",
    "legacy_queue_prefix",
    "lock_key",
    "needs_encoding",
    "parse",
    "queue_prefix",
    "tagged_key",
    "tagged_patterns",
]

#: the part tags of tagged keys
LOCK = "lock"
QUEUE = "q"
INBOX = "inbox"
_PARTS = (LOCK, QUEUE, INBOX)
#: appended to the tag of a key whose namespace and name are percent-encoded
MARK = "%"

#: ``COUNT`` of every listing ``SCAN`` (queue names, lock holders, inbox claims). A listing
#: visits the whole keyspace whatever it matches, one round trip per page: on a Redis that
#: also holds an application's 100,000s of keys, pages of 1,000 cost a round trip per
#: 1,000 keys (200 for 200,000 keys, seconds on a busy server), pages of 10,000 a tenth of
#: that, each page a few milliseconds of server time.
SCAN_COUNT = 10_000

_ENCODE = str.maketrans({"%": "%25", "{": "%7B", "}": "%7D"})
_DECODE = {"%25": "%", "%7B": "{", "%7D": "}"}


def needs_encoding(text: str) -> bool:
    """Whether ``text`` holds a brace, so that a key made of it is percent-encoded."""
    return "{" in text or "}" in text


def encode(text: str) -> str:
    """``text`` with ``%``, ``{`` and ``}`` percent-encoded (no brace left)."""
    return text.translate(_ENCODE)


def decode(text: str) -> str | None:
    """The inverse of :func:`encode`; ``None`` for text :func:`encode` never returns."""
    if "{" in text or "}" in text:
        return None
    out: list[str] = []
    i = 0
    while True:
        j = text.find("%", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        char = _DECODE.get(text[j : j + 3])
        if char is None:
            return None
        out.append(text[i:j])
        out.append(char)
        i = j + 3


def tagged_key(part: str, namespace: str, name: str) -> str:
    """``namespace:part:{name}`` as they are when neither holds a brace, else both encoded
    under the marked tag ``part%``."""
    if needs_encoding(namespace) or needs_encoding(name):
        return f"{encode(namespace)}:{part}{MARK}:{{{encode(name)}}}"
    return f"{namespace}:{part}:{{{name}}}"


def lock_key(namespace: str, name: str) -> str:
    """The lease key of lock ``name`` in ``namespace``; every other key of the lock is this
    key and a suffix."""
    return tagged_key(LOCK, namespace, name)


def queue_prefix(namespace: str, queue: str) -> str:
    """What every key of ``queue`` in ``namespace`` starts with (then its suffix, ``s``, ``f``,
    ...; see ``queue_async.py``)."""
    return tagged_key(QUEUE, namespace, queue) + ":"


def inbox_key(table: str, key: str) -> str:
    """The record of idempotency key ``key`` in the inbox ``table`` (an SQL identifier)."""
    if needs_encoding(key):
        return tagged_key(INBOX, table, key)
    return f"{table}:{key}"


@dataclass(frozen=True)
class KeyParts:
    """A tagged key taken apart: ``part`` (``lock``, ``q`` or ``inbox``), ``namespace`` (the
    inbox's table for ``inbox``), ``name``, and ``suffix`` (``""`` for a lease key or an inbox
    record; ``":tok"``, ``":w:<owner>"``, ``":s"``, ... for the derived keys)."""

    part: str
    namespace: str
    name: str
    suffix: str


def parse(key: str) -> KeyParts | None:
    """The part, namespace, name and suffix of a tagged key that :func:`tagged_key` makes
    (followed by any suffix); ``None`` for any other key (an untagged inbox key included: see
    :func:`inbox_name`)."""
    start = key.find("{")
    if start < 3 or key[start - 1] != ":":
        return None
    head = key[: start - 1]
    colon = head.rfind(":")
    if colon <= 0:
        return None
    namespace, tag = head[:colon], head[colon + 1 :]
    end = key.find("}", start + 1)
    if end < 0:
        return None
    name, suffix = key[start + 1 : end], key[end + 1 :]
    if tag.endswith(MARK):
        part = tag[: -len(MARK)]
        plain_ns, plain_name = decode(namespace), decode(name)
        if plain_ns is None or plain_name is None:
            return None
        namespace, name = plain_ns, plain_name
    else:
        part = tag
    if part not in _PARTS or not name or (part == INBOX and not tag.endswith(MARK)):
        return None
    if tagged_key(part, namespace, name) != key[: end + 1]:
        return None  # not the one key of this triple (e.g. encoded although brace-free)
    return KeyParts(part, namespace, name, suffix)


def inbox_name(table: str, key: str) -> str | None:
    """The idempotency key whose record in inbox ``table`` is ``key``; ``None`` when ``key``
    is no record of that inbox (another table's, a lock's or a queue's key)."""
    head = table + ":"
    if not key.startswith(head):
        return None
    rest = key[len(head) :]
    if not needs_encoding(rest):
        return rest or None
    parts = parse(key)
    if parts is None or parts.part != INBOX or parts.namespace != table or parts.suffix:
        return None
    return parts.name


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis ``MATCH`` pattern (its special characters escaped)."""
    return "".join("\\" + c if c in "*?[]\\^-" else c for c in text)


def tagged_patterns(part: str, namespace: str, prefix: str = "") -> list[str]:
    """``SCAN MATCH`` patterns that together match every key of ``part`` in ``namespace``
    whose name starts with ``prefix`` (and some others: keep what :func:`parse` accepts)."""
    plain = not needs_encoding(namespace) and not needs_encoding(prefix)
    if plain and encode(namespace) == namespace and encode(prefix) == prefix:
        # one pattern for both forms: "S:part:{" and "S:part%:{"
        return [f"{glob_escape(namespace)}:{part}*:{{{glob_escape(prefix)}*"]
    patterns = [f"{glob_escape(encode(namespace))}:{part}{MARK}:{{{glob_escape(encode(prefix))}*"]
    if plain:
        patterns.insert(0, f"{glob_escape(namespace)}:{part}:{{{glob_escape(prefix)}*")
    return patterns


def inbox_patterns(table: str, prefix: str = "") -> list[str]:
    """``SCAN MATCH`` patterns that together match every record of inbox ``table`` whose key
    starts with ``prefix`` (and some others: keep what :func:`inbox_name` accepts)."""
    head = glob_escape(table) + ":"
    if not prefix:
        return [head + "*"]
    if encode(prefix) == prefix:
        # one pass over the keyspace for both forms, "T:K" and "T:inbox%:{K" (keys of the
        # table that hold the prefix further on match too: inbox_name's caller drops them)
        return [f"{head}*{glob_escape(prefix)}*"]
    escaped = f"{head}{INBOX}{MARK}:{{{glob_escape(encode(prefix))}*"
    if needs_encoding(prefix):
        return [escaped]
    return [head + glob_escape(prefix) + "*", escaped]


# -- the layout of earlier versions (read by the migration) -----------------------------------
def legacy_lock_key(namespace: str, name: str) -> str:
    """The lease key earlier versions used: ``S:lock:{N}``, nothing encoded."""
    return f"{namespace}:lock:{{{name}}}"


def legacy_queue_prefix(namespace: str, queue: str) -> str:
    """What the keys of a queue started with in earlier versions: ``S:q:{Q}:``."""
    return f"{namespace}:q:{{{queue}}}:"


def legacy_inbox_key(table: str, key: str) -> str:
    """The inbox record key earlier versions used: ``T:K``, nothing encoded."""
    return f"{table}:{key}"
