"""The tasks ``test_schedule_targets.py`` runs real Celery, RQ, Dramatiq and arq workers of.

Configured by the environment variable ``JOBFENCE_TG_NAMESPACE`` (set by the test): the queue
names, the Dramatiq broker's namespace, the jobfence inbox table of the tasks' claims and the
prefix of the two Redis lists every framework's task writes to:

* ``<namespace>:received`` -- every message or job the worker started (its framework id),
  duplicates included, recorded outside the guard;
* ``<namespace>:runs`` -- every run of the guarded body: [framework id, region, slot].

Each framework's task is guarded by its jobfence integration without a ``key=``, so its
idempotency key is ``"<framework>:<its task / job / message id>"``. Each framework lives in a
module of its own below this one (``_targets_celery``, ...), so that a worker imports only its
framework; this module holds what they share.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis

from tests.servers import REDIS_URL

NAMESPACE = os.environ["JOBFENCE_TG_NAMESPACE"]
TABLE = f"{NAMESPACE}_tasks"

_redis = redis.Redis.from_url(REDIS_URL)


def received(ident: Any) -> None:
    _redis.rpush(f"{NAMESPACE}:received", json.dumps(str(ident)))


def ran(ident: Any, region: str, slot: str) -> dict[str, Any]:
    _redis.rpush(f"{NAMESPACE}:runs", json.dumps([str(ident), region, slot]))
    return {"id": str(ident), "region": region, "slot": slot}
