"""jobfence: make background jobs safe to scale out and to retry.

Locks with fencing tokens and lost-lease detection, fenced writes, a transactional inbox for
exactly-once effects, whole-unit retries, at-least-once queues with a guarded worker, and test
seams (:mod:`jobfence.testing`: one I/O hook
with stable point names, one replaceable clock). The documentation is in the source
repository's ``README.md`` and ``docs/``.
"""

from __future__ import annotations

from ._core.renewable import Renewable
from ._core.schedule_info import Fire, ScheduleInfo, Slot
from .backends.base import ClaimInfo, ClaimState, LockHolder, OutboxEntry, OutboxRow, OutboxStats
from .conflicts import is_commit_outcome_unknown, is_conflict, is_transient
from .errors import (
    BackendError,
    ClaimInProgress,
    ClaimLost,
    CommitOutcomeUnknown,
    ConfigurationError,
    ConflictError,
    FingerprintMismatch,
    InboxError,
    JobfenceError,
    LimitReached,
    LockError,
    LockLost,
    LockTimeout,
    MessageLost,
    NotNow,
    NotReplicated,
    QueueError,
    SchemaMissing,
    StaleToken,
    StaleVersion,
)
from .fencing import fence
from .fencing_async import fence_async
from .guard import current_claim, current_lease, current_message, guarded
from .inbox import Claim, Inbox
from .inbox_async import AsyncClaim, AsyncInbox
from .locks import Lease, Locks
from .locks_async import AsyncLease, AsyncLocks
from .outbox import Outbox
from .outbox_async import AsyncOutbox
from .queue import Message, Queue
from .queue_async import AsyncMessage, AsyncQueue
from .relay import Relay
from .relay_async import AsyncRelay, RelayStats
from .retry import RetryPolicy, UnprotectedRetryWarning, retry_unit, retrying
from .scheduler import Scheduler
from .scheduler_async import AsyncScheduler
from .versioned import versioned_update
from .versioned_async import versioned_update_async
from .worker import AsyncWorker, Worker, WorkerStats

__version__ = "0.1.0.dev0"

__all__ = [
    "AsyncClaim",
    "AsyncInbox",
    "AsyncLease",
    "AsyncLocks",
    "AsyncMessage",
    "AsyncOutbox",
    "AsyncQueue",
    "AsyncRelay",
    "AsyncScheduler",
    "AsyncWorker",
    "BackendError",
    "Claim",
    "ClaimInProgress",
    "ClaimInfo",
    "ClaimLost",
    "ClaimState",
    "CommitOutcomeUnknown",
    "ConfigurationError",
    "ConflictError",
    "FingerprintMismatch",
    "Fire",
    "Inbox",
    "InboxError",
    "JobfenceError",
    "Lease",
    "LimitReached",
    "LockError",
    "LockHolder",
    "LockLost",
    "LockTimeout",
    "Locks",
    "Message",
    "MessageLost",
    "NotNow",
    "NotReplicated",
    "Outbox",
    "OutboxEntry",
    "OutboxRow",
    "OutboxStats",
    "Queue",
    "QueueError",
    "Relay",
    "RelayStats",
    "Renewable",
    "RetryPolicy",
    "ScheduleInfo",
    "Scheduler",
    "SchemaMissing",
    "Slot",
    "StaleToken",
    "StaleVersion",
    "UnprotectedRetryWarning",
    "Worker",
    "WorkerStats",
    "__version__",
    "current_claim",
    "current_lease",
    "current_message",
    "fence",
    "fence_async",
    "guarded",
    "is_commit_outcome_unknown",
    "is_conflict",
    "is_transient",
    "retry_unit",
    "retrying",
    "versioned_update",
    "versioned_update_async",
]
