"""Django settings of the order API of ``_http_apps`` in a server subprocess
(``python -m django runserver --noreload`` with ``DJANGO_SETTINGS_MODULE`` naming this
module): the inbox is ``JF_HTTP_INBOX``, the claims' ttl ``JF_HTTP_TTL``, the ledger's schema
``JF_HTTP_SCHEMA``."""

import os

from tests.frameworks._http_apps import DJANGO_SETTINGS

globals().update(DJANGO_SETTINGS)
JOBFENCE_IDEMPOTENCY = {
    "inbox": os.environ["JF_HTTP_INBOX"],
    "ttl": float(os.environ.get("JF_HTTP_TTL", "60")),
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
