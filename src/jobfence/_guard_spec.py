"""Validated configuration of one :func:`jobfence.guarded` function (shared by sync and async)."""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import decimal
import enum
import hashlib
import inspect
import json
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._core.clock import get_clock
from ._core.inbox_support import local_retry_after
from ._core.validate import check_name, check_timeout, check_ttl
from .errors import ClaimInProgress, ConfigurationError
from .limits import check_limit, check_lock_name

NameSpec = str | Callable[..., str] | None
#: ``limit=(name template, n)`` of :func:`jobfence.guarded`
LimitSpec = tuple[str | Callable[..., str], int] | None


def _canonical(value: Any) -> Any:
    """A stable JSON form for the non-JSON values ``fingerprint=True`` accepts: the same value
    gives the same form in every process (never ``repr``, which may hold an address or a
    hash-seed-dependent order)."""
    if isinstance(value, (set, frozenset)):
        items = [json.dumps(v, sort_keys=True, default=_canonical) for v in value]
        return {"set": sorted(items)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return {type(value).__name__: value.isoformat()}
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return {type(value).__name__: str(value)}
    if isinstance(value, enum.Enum):
        return {type(value).__name__: value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {type(value).__name__: dataclasses.asdict(value)}
    raise TypeError(f"an argument of type {type(value).__name__} has no stable representation")


#: the lease of the guarded call running in this context (thread or task)
current_lease_var: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "jobfence_current_lease", default=None
)
#: the idempotency claim of the guarded call running in this context (thread or task)
current_claim_var: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "jobfence_current_claim", default=None
)
#: the queue message a jobfence Worker's handler is processing in this context
current_message_var: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "jobfence_current_message", default=None
)
#: the default idempotency key a framework integration (Celery, RQ, ...) sets while its task
#: runs: ``"<framework>:<the framework's message or job id>"``
current_job_key_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jobfence_current_job_key", default=None
)


def default_key(argument: str = "key") -> str:
    """The idempotency key to use when none is given: the id of the message the current
    worker handler processes, or the job key a framework integration set for the task it
    runs (both the same on every redelivery)."""
    message = current_message_var.get()
    if message is not None:
        return str(message.id)
    job_key = current_job_key_var.get()
    if job_key is not None:
        return job_key
    raise ConfigurationError(
        f"no {argument} given, and this is not inside a jobfence Worker's handler or a task of "
        f"a jobfence framework integration (where the {argument} defaults to the message or "
        f"job id): pass {argument}='...'",
        argument=argument,
    )


def note_duplicate() -> None:
    """Tell the worker whose message is being handled here that the inbox found it a
    duplicate (it counts suppressed duplicates)."""
    message = current_message_var.get()
    if message is not None:
        message.duplicate = True


def is_duplicate(claim: Any, key: str) -> bool:
    """What a guarded call's claim of ``key`` says: True for a duplicate (the key was
    completed: the call returns ``claim.result``; the worker is told, see
    :func:`note_duplicate`), False for a new claim (the function runs); a claim in progress
    elsewhere raises :class:`ClaimInProgress` (a "not now" refusal: a worker defers the
    message until the holder's claim would expire, or, when a call of this same process holds
    it, for about as long as that call has run so far: see
    :func:`~jobfence._core.inbox_support.local_retry_after`)."""
    state = claim.state.value
    if state == "completed":
        note_duplicate()
        return True
    if state == "in_progress":
        owner = getattr(claim, "owner", None)
        until = getattr(claim, "expires_at", None)
        refusal = ClaimInProgress(
            f"{key!r} is being processed by another worker ({owner}, until {until})",
            key=key,
            owner=owner,
            expires_at=until,
        )
        # held by a call of this very process: ask again after about as long as it has run
        # (its expiry is a bound, not an estimate: it is renewed while the call runs)
        local = local_retry_after(owner, get_clock().monotonic())
        if local is not None and (refusal.retry_after is None or local < refusal.retry_after):
            refusal.retry_after = local
        raise refusal
    return False


def _check_template(template: NameSpec, argument: str, signature: inspect.Signature) -> None:
    if template is None or callable(template):
        return
    if not isinstance(template, str) or not template:
        raise ConfigurationError(
            f"{argument} must be a non-empty str template such as 'inventory:{{product_id}}' "
            f"or a callable taking the function's arguments, got {template!r}",
            argument=argument,
        )
    params = set(signature.parameters)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ConfigurationError(
            f"{argument} template {template!r}: {exc}", argument=argument
        ) from None
    for field in fields:
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root not in params:
            raise ConfigurationError(
                f"{argument} template {template!r} names {{{field}}}, but the function's "
                f"parameters are: {', '.join(sorted(params)) or '(none)'}",
                argument=argument,
            )


def _same_redis(locks: Any, inbox: Any) -> bool:
    """Are ``locks`` and ``inbox`` a Redis lock backend and a Redis inbox on the same
    database of the same server, where a lease key may be read by the inbox's scripts?"""
    lock_backend = getattr(locks, "backend", None)
    shares = getattr(getattr(inbox, "backend", None), "shares_server", None)
    if shares is None or getattr(lock_backend, "kind", None) != "redis":
        return False
    if getattr(lock_backend, "replica_wait", None) is not None:
        return False
    client = getattr(lock_backend, "_client", None)
    if client is None or not callable(getattr(lock_backend, "lock_key", None)):
        return False
    if not callable(getattr(inbox.backend, "claim_leased", None)):
        return False
    return bool(shares(client))


@dataclass
class GuardSpec:
    signature: inspect.Signature
    locks: Any
    inbox: Any
    lock: NameSpec
    key: NameSpec
    ttl: float
    timeout: float | None
    claim_ttl: float
    fingerprint: bool | Callable[..., str] | None
    if_locked: str
    skipped_result: Any = None
    limit: LimitSpec = None
    #: whether the lease can be checked inside the completion's own script (see
    #: :meth:`held_check`); found on first use
    _same_redis: bool | None = dataclasses.field(default=None, init=False, repr=False)
    #: the parameter names of a function whose parameters are all plain positional-or-keyword
    #: ones (no ``*args``, ``**kwargs``, keyword-only or positional-only): a call passing
    #: every one of them positionally binds without ``Signature.bind`` (see :meth:`arguments`)
    _positional: tuple[str, ...] | None = dataclasses.field(default=None, init=False, repr=False)

    def one_redis(self) -> bool:
        """Whether the lock and the inbox are on the same database of one Redis (see
        :meth:`held_check`): then a call's lease and claim are taken by one script
        (``RedisInboxBackend.claim_leased``), and its result stored and its lease released
        by another (``complete_held(..., release=True)``): two round trips, not four."""
        if self._same_redis is None:
            self._same_redis = _same_redis(self.locks, self.inbox)
        return self._same_redis

    def held_check(self, lease: Any) -> tuple[str, str] | None:
        """``(lease key, lease owner)`` when the inbox can check ``lease`` in the script that
        completes the claim (both on the same database of the same Redis, no cluster, no
        replica ``WAIT``: ``RedisInboxBackend.shares_server``), so the guarded call's lease
        check and its completion are one round trip; ``None``: the lease is confirmed by an
        owner-checked ``extend`` of its own first."""
        if not self.one_redis():
            return None
        return self.locks.backend.lock_key(lease.backend_name), lease.owner

    def __post_init__(self) -> None:
        params = self.signature.parameters.values()
        if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
            self._positional = tuple(p.name for p in params)
        if self.locks is None and self.inbox is None:
            raise ConfigurationError("guarded needs locks=..., inbox=... or both", argument="locks")
        self._check_limit()
        if self.locks is not None and self.lock is None and self.limit is None:
            raise ConfigurationError(
                "guarded(locks=...) needs lock='name template' (e.g. 'inventory:{product_id}') "
                "or limit=('name template', n)",
                argument="lock",
            )
        if self.lock is not None and self.locks is None:
            raise ConfigurationError("guarded(lock=...) needs locks=...", argument="locks")
        if self.key is not None and self.inbox is None:
            raise ConfigurationError("guarded(key=...) needs inbox=...", argument="inbox")
        _check_template(self.lock, "lock", self.signature)
        _check_template(self.key, "key", self.signature)
        self.ttl = check_ttl(self.ttl)
        self.claim_ttl = check_ttl(self.claim_ttl, argument="claim_ttl")
        self.timeout = check_timeout(self.timeout)
        if self.if_locked not in ("raise", "skip"):
            raise ConfigurationError(
                f"if_locked must be 'raise' or 'skip', got {self.if_locked!r}",
                argument="if_locked",
            )
        if not (
            self.fingerprint is None
            or isinstance(self.fingerprint, bool)
            or callable(self.fingerprint)
        ):
            raise ConfigurationError(
                "fingerprint must be None, True (hash the arguments) or a callable",
                argument="fingerprint",
            )

    def _check_limit(self) -> None:
        if self.limit is None:
            return
        if not isinstance(self.limit, tuple) or len(self.limit) != 2:
            raise ConfigurationError(
                "limit must be a (name template, n) pair such as ('tenant:{tenant_id}', 3), "
                f"got {self.limit!r}",
                argument="limit",
            )
        if self.locks is None:
            raise ConfigurationError("guarded(limit=...) needs locks=...", argument="locks")
        template, n = self.limit
        _check_template(template, "limit", self.signature)
        self.limit = (template, check_limit(n))

    def limit_name(self, arguments: dict[str, Any]) -> tuple[str, int]:
        """The name of a call's concurrency limit (its template filled in) and its size."""
        assert self.limit is not None
        template, n = self.limit
        name = self._name(template, arguments, "limit")
        return check_lock_name(name, argument="limit", limit=n), n

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        names = self._positional
        if names is not None and not kwargs and len(args) == len(names):
            return dict(zip(names, args, strict=True))  # what bind() would give, cheaper
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"guarded function called with bad arguments: {exc}") from None
        bound.apply_defaults()
        return dict(bound.arguments)

    def _name(self, spec: NameSpec, arguments: dict[str, Any], argument: str) -> str:
        value = spec(**arguments) if callable(spec) else str(spec).format_map(arguments)
        return check_name(value, argument=argument)

    def lock_name(self, arguments: dict[str, Any]) -> str:
        return self._name(self.lock, arguments, "lock")

    def key_name(self, arguments: dict[str, Any]) -> str:
        """The idempotency key of a call: the ``key`` template filled in, or without one the
        id of the message the current worker handler processes."""
        key = default_key() if self.key is None else self._name(self.key, arguments, "key")
        outer = current_claim_var.get()
        if outer is not None and outer.key == key and getattr(outer, "_inbox", None) is self.inbox:
            # the enclosing guarded call holds this very claim: every try would find it in
            # progress (ClaimInProgress, which a framework integration retries without end)
            raise ConfigurationError(
                f"key {key!r} is the key of the guarded call this one runs inside, whose claim "
                "is held until it returns: give the inner guarded call its own key='...'",
                argument="key",
            )
        return key

    def fingerprint_of(self, arguments: dict[str, Any]) -> str | None:
        if self.fingerprint is None or self.fingerprint is False:
            return None
        if not isinstance(self.fingerprint, bool):
            return str(self.fingerprint(**arguments))
        try:
            canonical = json.dumps(
                arguments, sort_keys=True, default=_canonical, separators=(",", ":")
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"fingerprint=True hashes the call's arguments, but {exc}; pass "
                "fingerprint=callable(**arguments) -> str that digests only the payload",
                argument="fingerprint",
            ) from None
        return hashlib.sha256(canonical.encode()).hexdigest()
