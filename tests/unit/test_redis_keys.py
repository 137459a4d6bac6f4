"""The Redis key layout (``jobfence.backends.redis.keys``): distinct (part, namespace, name)
triples never share a key, every key reads back as its triple, one lock's or queue's keys share
a Redis Cluster hash slot, and keys without braces are those of earlier versions."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from jobfence.backends.redis import keys as layout
from jobfence.backends.redis.locks import RedisLockBackend

#: lock suffixes the scripts derive from a lease key (``lua/lock_lib.lua``)
LOCK_SUFFIXES = ("", ":tok", ":q", ":qd", ":qf", ":rel", ":w:owner", ":w:o}w{n:er")
#: the queue keys' suffixes (``queue_async.py``)
QUEUE_SUFFIXES = ("s", "f", "o", "d", "ds", "dead", "m", "mx")

#: pieces that make keys look alike: separators, braces, the tags, the encoding's escapes
_PIECES = [":", "{", "}", "%", "%7B", "%7D", "%25", "lock", "lock%", "q", "q%", "inbox", "inbox%"]
_tricky = st.lists(
    st.one_of(st.sampled_from(_PIECES), st.text(alphabet="ab:{}%ü名\x00", max_size=3)),
    max_size=8,
).map("".join)
#: any text: tricky pieces, arbitrary unicode (long ones too)
_text = st.one_of(_tricky, st.text(max_size=40), st.text(min_size=150, max_size=300))
#: built non-empty (and, for namespaces, at most 64 long) rather than filtered, so that
#: Hypothesis does not discard a third of its draws (its filter_too_much health check failed
#: under load)
_nonempty_tricky = st.tuples(st.sampled_from(_PIECES), _tricky).map("".join)
namespaces = st.one_of(_nonempty_tricky, st.text(min_size=1, max_size=40)).filter(
    lambda s: len(s) <= 64
)
names = st.one_of(
    _nonempty_tricky, st.text(min_size=1, max_size=40), st.text(min_size=150, max_size=300)
)
#: inbox tables are SQL identifiers
tables = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)
#: queue names: A-Z a-z 0-9 _ . : - (``check_queue_name``)
queue_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,30}", fullmatch=True)
owners = _text

lock_triples = st.tuples(st.just("lock"), namespaces, names, st.sampled_from(LOCK_SUFFIXES))
lock_waiters = st.tuples(st.just("lock"), namespaces, names, owners.map(lambda o: ":w:" + o))
queue_triples = st.tuples(
    st.just("q"), namespaces, queue_names, st.sampled_from(QUEUE_SUFFIXES).map(":".__add__)
)
inbox_triples = st.tuples(st.just("inbox"), tables, names, st.just(""))
#: an inbox table and a lock namespace may be the same string, as may a queue's
shared = st.tuples(
    st.sampled_from(["lock", "q", "inbox"]),
    st.sampled_from(["jobs", "jobs_inbox"]),
    st.one_of(_tricky.filter(bool), st.sampled_from(["lock:{k}", "q:{x}:s", "inbox%:{k}"])),
    st.just(""),
)
triples = st.one_of(lock_triples, lock_waiters, queue_triples, inbox_triples, shared)


def key_of(part: str, namespace: str, name: str, suffix: str) -> str:
    """The Redis key of a (part, namespace, name) and the suffix of a derived key (a valid
    triple: see :func:`_valid`)."""
    if part == "lock":
        return layout.lock_key(namespace, name) + suffix
    if part == "q":
        return layout.queue_prefix(namespace, name) + suffix[1:]
    return layout.inbox_key(namespace, name)


def _is_queue_name(name: str) -> bool:
    allowed = set(string.ascii_letters + string.digits + "_.:-")
    return bool(name) and set(name) <= allowed and name[0] not in ".:-"


def _valid(triple: tuple[str, str, str, str]) -> tuple[str, str, str, str]:
    part, namespace, name, suffix = triple
    if part == "q":
        if not _is_queue_name(name):
            name = "q"
        if suffix[1:] not in QUEUE_SUFFIXES:
            suffix = ":s"
    if part == "inbox":
        suffix = ""
    return part, namespace, name, suffix


@st.composite
def confusable(draw: st.DrawFn) -> list[tuple[str, str, str, str]]:
    """Triples whose keys would coincide if namespace, tag and name were only joined (as in
    the previous layout): a namespace spelling a tag and the start of a name, an inbox key
    spelling a lock's or a queue's key, a lock name spelling a derived key of another."""
    table, a, b = draw(tables), draw(namespaces), draw(_tricky)
    c, queue, owner = draw(names), draw(queue_names), draw(owners)
    return [
        ("lock", a, f"{b}:lock:{{{c}", ""),
        ("lock", f"{a}:lock:{{{b}", c, ""),
        ("lock", table, c, ""),
        ("inbox", table, f"lock:{{{c}}}", ""),
        ("lock", table, c, ":tok"),
        ("inbox", table, f"lock:{{{c}}}:tok", ""),
        ("q", table, queue, ":s"),
        ("inbox", table, f"q:{{{queue}}}:s", ""),
        ("lock", a, c, f":w:{owner}}}"),
        ("lock", a, f"{c}}}:w:{owner}", ""),
        ("q", f"{a}:lock:{{{c}}}:w", queue, ":s"),
        ("lock", a, c, f":w:q:{{{queue}}}:s"),
    ]


@settings(max_examples=300, deadline=None)
@given(confusable(), st.lists(triples, max_size=10))
def test_distinct_triples_never_share_a_key(
    tricky: list[tuple[str, str, str, str]], found: list[tuple[str, str, str, str]]
) -> None:
    distinct = {_valid(t) for t in [*tricky, *found]}
    keys = {key_of(*t) for t in distinct}
    assert len(keys) == len(distinct)


@settings(max_examples=300, deadline=None)
@given(triples)
def test_every_key_reads_back_as_its_triple(triple: tuple[str, str, str, str]) -> None:
    part, namespace, name, suffix = _valid(triple)
    key = key_of(part, namespace, name, suffix)
    if part == "inbox":
        assert layout.inbox_name(namespace, key) == name
        parsed = layout.parse(key)
        assert parsed is None or (parsed.part, parsed.namespace, parsed.name) == (
            "inbox",
            namespace,
            name,
        )
        return
    assert layout.parse(key) == layout.KeyParts(part, namespace, name, suffix)
    # a lock's or queue's key is never a record of any inbox
    table = key.split(":", 1)[0]
    assert layout.inbox_name(table, key) is None


@settings(max_examples=200, deadline=None)
@given(namespaces, names, owners)
def test_every_key_of_a_lock_shares_one_non_empty_hash_tag(
    namespace: str, name: str, owner: str
) -> None:
    lease = layout.lock_key(namespace, name)
    start = lease.index("{")
    end = lease.index("}", start)
    assert end > start + 1  # a non-empty tag: Redis Cluster hashes by it
    assert lease[start + 1 : end] == (
        layout.encode(name) if layout.needs_encoding(namespace + name) else name
    )
    slots = {key_slot((lease + s).encode()) for s in (*LOCK_SUFFIXES, ":w:" + owner)}
    assert len(slots) == 1


@settings(max_examples=300, deadline=None)
@given(namespaces, queue_names)
def test_every_key_of_a_queue_shares_one_hash_slot(namespace: str, queue: str) -> None:
    prefix = layout.queue_prefix(namespace, queue)
    assert len({key_slot((prefix + s).encode()) for s in QUEUE_SUFFIXES}) == 1
    assert key_slot(prefix.encode()) == key_slot(queue.encode())


brace_free = _text.filter(lambda s: s and not layout.needs_encoding(s))


@settings(max_examples=200, deadline=None)
@given(brace_free.filter(lambda s: len(s) <= 64), brace_free, tables, queue_names)
def test_keys_without_braces_are_those_of_the_previous_layout(
    namespace: str, name: str, table: str, queue: str
) -> None:
    assert layout.lock_key(namespace, name) == layout.legacy_lock_key(namespace, name)
    assert layout.inbox_key(table, name) == layout.legacy_inbox_key(table, name)
    assert layout.queue_prefix(namespace, queue) == layout.legacy_queue_prefix(namespace, queue)


@settings(max_examples=200, deadline=None)
@given(_text)
def test_decode_inverts_encode_and_refuses_anything_else(text: str) -> None:
    assert layout.decode(layout.encode(text)) == text
    decoded = layout.decode(text)
    if decoded is not None:
        assert layout.encode(decoded) == text


@settings(max_examples=200, deadline=None)
@given(namespaces, names, st.text(max_size=5))
def test_scan_patterns_match_the_keys_they_list(namespace: str, name: str, cut: str) -> None:
    """Every lease key of a name starting with ``prefix`` matches one of the patterns
    (``fnmatchcase`` follows Redis's glob for these patterns)."""
    from fnmatch import fnmatchcase

    for prefix in ("", name[: len(name) // 2], name):
        lease = layout.lock_key(namespace, name)
        patterns = layout.tagged_patterns("lock", namespace, prefix)
        assert any(fnmatchcase(lease, _fn(p)) for p in patterns), (lease, patterns)
    record = layout.inbox_key("t", name)
    for prefix in ("", name[:1], name):
        assert any(fnmatchcase(record, _fn(p)) for p in layout.inbox_patterns("t", prefix))


def _fn(pattern: str) -> str:
    """A Redis MATCH pattern (backslash escapes) as an ``fnmatch`` pattern (``[c]`` escapes)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "\\":
            out.append("[" + pattern[i + 1] + "]" if pattern[i + 1] != "^" else "^")
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


# -- the collisions of the previous layout ----------------------------------------------------
def test_a_namespace_cannot_spell_another_namespace_s_lock() -> None:
    assert layout.legacy_lock_key("N", "zz:lock:{k") == layout.legacy_lock_key("N:lock:{zz", "k")
    assert layout.lock_key("N", "zz:lock:{k") != layout.lock_key("N:lock:{zz", "k")


def test_an_inbox_key_cannot_spell_a_lock_or_a_queue_key() -> None:
    assert layout.legacy_inbox_key("T", "lock:{k}") == layout.legacy_lock_key("T", "k")
    assert layout.inbox_key("T", "lock:{k}") != layout.lock_key("T", "k")
    assert layout.inbox_key("T", "q:{x}:s") != layout.queue_prefix("T", "x") + "s"
    assert layout.inbox_name("T", layout.lock_key("T", "k")) is None
    assert layout.inbox_name("T", layout.queue_prefix("T", "x") + "s") is None


def test_a_lock_name_cannot_spell_another_lock_s_wake_list() -> None:
    # previously: name "a}:w:x" had the lease key of name "a"'s wake list for owner "x}"
    assert layout.legacy_lock_key("S", "a}:w:x") == layout.legacy_lock_key("S", "a") + ":w:x}"
    assert layout.lock_key("S", "a}:w:x") != layout.lock_key("S", "a") + ":w:x}"


def test_the_backend_builds_its_keys_with_the_layout() -> None:
    from jobfence._core.url import parse_url

    backend = RedisLockBackend(parse_url("redis://127.0.0.1:6379/0"), namespace="N:lock:{zz")
    try:
        assert backend.lock_key("k") == "N:lock:%7Bzz:lock%:{k}"
    finally:
        backend.close()
