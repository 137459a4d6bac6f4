"""Redis checks of ``jobfence doctor``: eviction, persistence, replication (and whether the URL's
``wait_replicas`` can be met), clock, keys under the namespace.

Key kinds (see ``backends/redis/keys.py``, ``backends/redis/lua/lock_lib.lua`` and
``backends/redis/queue_async.py``): ``S:lock:{N}`` a lease, ``S:lock:{N}:tok`` a fencing-token
counter, ``:q``/``:qd``/``:qf``/``:w:O`` a lock's waiters, ``:rel`` a recent release;
``S:q:{Q}:<part>`` the keys of queue ``Q``; ``jobfence_inbox:<key>`` the inbox records (the
inbox's own prefix, not the namespace). Keys are read back with ``keys.parse`` (a namespace or
name holding a brace is percent-encoded under a marked tag, ``S:lock%:{N}``), so a key of
another namespace or part is never counted as one of these.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from ..._core.inbox_support import DEFAULT_TABLE as INBOX_PREFIX
from ..._core.url import BackendURL
from ...doctor import Report, Timer
from . import keys as key_layout
from .client import connect_redis, replica_wait

#: keys SCAN looks at, at most, per prefix (the count stops there: ``keys_capped``)
SCAN_CAP = 100_000
#: the kind of a key of the earlier layout (a namespace, name or inbox key with a brace)
OLD_LAYOUT = "old layout"
OLD_LAYOUT_ADVICE = (
    "stop the workers of the earlier version, then run `jobfence redis migrate-keys URL "
    "--namespace NAMESPACE --table TABLE` (see the upgrade section of the Redis backend "
    "guide): until then these leases do not exclude, and these inbox records are not found "
    "as duplicates"
)
#: options of jobfence's Redis backends, never handed to redis-py
_OWN = ("namespace", "max_dead_letters", "waiter_slack", "table")

EVICTION_ADVICE = (
    "set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in "
    "redis.conf), or give jobfence a Redis of its own with noeviction: an evicted lease key "
    "lets a second worker take a lock that is still held"
)

NO_PERSISTENCE = (
    "neither AOF (appendonly no) nor RDB snapshots (save is empty): a restart of this Redis "
    "loses every lease, fencing-token counter, inbox record and queue message. Held locks "
    "are free at once: another worker can take a lock while its previous holder still works "
    "(the holder finds its lease lost only at its next renewal). The lost token counters "
    "restart from the clock floor (each grant's token is at least the server time in "
    "microseconds), so new tokens stay above the old ones and fenced writes still refuse the "
    "previous holder -- unless the restarted server's clock is behind the old one (another "
    "host, a clock stepped back). Completed inbox keys are forgotten (their jobs can run "
    "again) and queued messages are gone."
)
NO_PERSISTENCE_ADVICE = (
    "enable AOF (appendonly yes, appendfsync everysec) or RDB snapshots if a restart must "
    "not lose queue messages and inbox records; for locks alone, fence the writes that a "
    "second holder must not repeat (jobfence.Fence / fenced writes), and keep the server "
    "clocks in sync"
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _kind(key: str, namespace: str) -> str | None:
    """The kind of a key under ``namespace:``; ``None`` for a key of another namespace or
    part (a longer namespace that starts like this one, an inbox record)."""
    parts = key_layout.parse(key)
    if parts is None:
        # every current key holding a brace reads back; this one is of the earlier layout
        return OLD_LAYOUT if key_layout.needs_encoding(key) else "other"
    if parts.namespace != namespace or parts.part == key_layout.INBOX:
        return None
    tail = parts.suffix
    if parts.part == key_layout.LOCK:
        if not tail:
            return "lease"
        if tail == ":tok":
            return "token counter"
        if tail in (":q", ":qd", ":qf") or tail.startswith(":w:"):
            return "lock waiters"
        if tail == ":rel":
            return "recent release"
        return "lock other"
    return "queue stream" if tail == ":s" else "queue other"


def _count(client: Any, pattern: str, cap: int) -> tuple[list[str], bool]:
    """Keys matching ``pattern`` by SCAN (never KEYS), at most ``cap``; whether it stopped."""
    found: list[str] = []
    for key in client.scan_iter(match=pattern, count=1000):
        found.append(_text(key))
        if len(found) >= cap:
            return found, True
    return found, False


def _config(client: Any, name: str) -> str | None:
    values = client.config_get(name)
    value = values.get(name, values.get(name.encode()) if values else None)
    return None if value is None else _text(value)


REPLICATION_DOC = "see docs/reference/durability.md"


def inspect(report: Report, url: BackendURL, timer: Timer) -> None:
    wanted = replica_wait(url, {})
    client = connect_redis(url, {}, what="doctor", own=_OWN)
    try:
        _inspect(report, client, timer)
        _replication(report, client, 0 if wanted is None else wanted.replicas)
    finally:
        client.close()


def _replication(report: Report, client: Any, wanted: int) -> None:
    """Which choice the deployment is on: how many replicas are connected, how far behind,
    and whether the URL's ``wait_replicas`` makes writes wait for them."""
    info = client.info("replication")
    if info.get("role") != "master":
        report.add(
            "error",
            "redis-replication",
            "this URL points at a replica (role "
            f"{_text(info.get('role'))}): jobfence's writes fail on it",
            "point jobfence at the primary, or at the Sentinels with a "
            "redis+sentinel://host:26379/service URL, which follows a failover",
        )
        return
    replicas = []
    for key, value in info.items():
        if key.startswith("slave") and key[5:].isdigit() and isinstance(value, dict):
            replicas.append(value)
    online = [r for r in replicas if r.get("state") == "online"]
    lags = ", ".join(
        f"{r.get('ip')}:{r.get('port')} {r.get('state')} lag {r.get('lag', '?')} s"
        for r in replicas
    )
    found = f"{len(online)} connected replica{'s' if len(online) != 1 else ''}" + (
        f" ({lags})" if lags else ""
    )
    if wanted == 0 and not replicas:
        report.add(
            "ok",
            "redis-replication",
            "no replicas: nothing can fail over to a copy that lags (a restart is what "
            "redis-persistence is about)",
        )
    elif wanted == 0:
        report.add(
            "warning",
            "redis-replication",
            f"Redis has {found}, replication is asynchronous and wait_replicas is 0: a "
            "failover can lose completed inbox records (their jobs run again) and hand a "
            "lease to a second holder while the first still works (fenced writes still "
            "refuse the older token)",
            "set wait_replicas=1 (URL ?wait_replicas=1&wait_timeout=1, or the keyword) so "
            "that grants, renewals, inbox claims and completions wait for a replica; or "
            "accept it and fence every write that matters; " + REPLICATION_DOC,
        )
    elif len(online) >= wanted:
        report.add(
            "ok",
            "redis-replication",
            f"Redis has {found} and wait_replicas is {wanted}: grants, renewals, inbox "
            "claims and completions wait for that many replicas, so one that returned "
            "survives a failover to one of them",
        )
    else:
        report.add(
            "error",
            "redis-replication",
            f"wait_replicas is {wanted} but Redis has {found}: every grant, renewal, inbox "
            "claim and completion waits wait_timeout and then fails with NotReplicated",
            f"connect at least {wanted} replica(s) to this primary, or lower wait_replicas; "
            + REPLICATION_DOC,
        )


def _inspect(report: Report, client: Any, timer: Timer) -> None:
    info = client.info("server")
    report.server_version = str(info.get("redis_version") or info.get("valkey_version") or "?")
    report.rtt_ms = timer.ping(client.ping)

    def now() -> float:
        seconds, micros = client.time()
        return int(seconds) + int(micros) / 1e6

    report.clock_offset_ms = timer.clock(now)
    report.clock_note = "Redis TIME"
    major = int(report.server_version.split(".")[0]) if report.server_version[0].isdigit() else 0
    if major and major < 6:
        report.add(
            "error",
            "redis-version",
            f"Redis {report.server_version}: jobfence needs Redis 6.0 or newer",
            "upgrade Redis to 6.0 or newer (Streams, scripts that read TIME before writing)",
        )
    else:
        report.add("ok", "redis-version", f"Redis {report.server_version}")
    _settings(report, client)
    _keys(report, client)


def _settings(report: Report, client: Any) -> None:
    try:
        maxmemory = _config(client, "maxmemory")
        policy = _config(client, "maxmemory-policy")
        appendonly = _config(client, "appendonly")
        save = _config(client, "save")
    except ResponseError as exc:
        for code in ("redis-eviction", "redis-persistence"):
            report.add(
                "warning",
                code,
                f"unknown: CONFIG is not available ({exc}); a managed Redis often disables it",
                "check in the provider's settings that maxmemory-policy is noeviction and "
                "that persistence (AOF or snapshots) is on",
            )
        return
    if not maxmemory or maxmemory == "0":
        report.add(
            "ok",
            "redis-eviction",
            f"maxmemory 0: Redis never evicts keys (maxmemory-policy {policy})",
            "watch the memory of the host: with no limit Redis can run out of it",
        )
    elif policy and (policy.startswith("allkeys-") or policy.startswith("volatile-")):
        which = (
            "any key"
            if policy.startswith("allkeys-")
            else "keys with a TTL -- every lease and lock key has one"
        )
        report.add(
            "error",
            "redis-eviction",
            f"maxmemory {maxmemory} bytes with maxmemory-policy {policy}: when memory runs "
            f"out Redis evicts {which}, lock keys included",
            EVICTION_ADVICE,
        )
    else:
        report.add(
            "ok",
            "redis-eviction",
            f"maxmemory {maxmemory} bytes with maxmemory-policy {policy}: no key is evicted "
            "(writes fail when memory is full)",
        )
    if appendonly == "no" and not (save or "").strip():
        report.add("warning", "redis-persistence", NO_PERSISTENCE, NO_PERSISTENCE_ADVICE)
    else:
        how = []
        if appendonly == "yes":
            how.append("AOF")
        if (save or "").strip():
            how.append(f"RDB snapshots (save {save})")
        report.add("ok", "redis-persistence", "persistence: " + " and ".join(how))


def _keys(report: Report, client: Any) -> None:
    namespace = report.namespace
    counts: dict[str, int] = {}
    capped = False
    heads = dict.fromkeys((namespace, key_layout.encode(namespace)))  # as given, and encoded
    for head in heads:
        keys, stopped = _count(client, f"{key_layout.glob_escape(head)}:*", SCAN_CAP)
        capped = capped or stopped
        for key in keys:
            kind = _kind(key, namespace)
            if kind is not None:
                counts[kind] = counts.get(kind, 0) + 1
    inbox, inbox_capped = _count(client, key_layout.inbox_patterns(INBOX_PREFIX)[0], SCAN_CAP)
    records = sum(key_layout.inbox_name(INBOX_PREFIX, key) is not None for key in inbox)
    if records:
        counts["inbox record"] = records
    old = sum(key_layout.parse(key) is None and key_layout.needs_encoding(key) for key in inbox)
    if old:
        counts[OLD_LAYOUT] = counts.get(OLD_LAYOUT, 0) + old
    report.keys = dict(sorted(counts.items()))
    report.keys_capped = capped or inbox_capped
    if not counts:
        report.add(
            "ok",
            "keys",
            f"no jobfence keys under {namespace!r}: nothing in use (keys are created on use)",
        )
    else:
        total = sum(counts.values())
        more = f" (counted up to {SCAN_CAP})" if report.keys_capped else ""
        kinds = ", ".join(f"{kind} {n}" for kind, n in report.keys.items())
        report.add("ok", "keys", f"{total} jobfence keys under {namespace!r}{more}: {kinds}")
    old_keys = counts.get(OLD_LAYOUT, 0)
    if old_keys:
        report.add(
            "warning",
            "redis-old-keys",
            f"{old_keys} key{'' if old_keys == 1 else 's'} under {namespace!r} or the inbox prefix "
            f"{INBOX_PREFIX!r} are in the key layout of earlier versions (a namespace, lock name "
            "or inbox key holding a brace)",
            OLD_LAYOUT_ADVICE,
        )
