"""Addresses of the real services the test suite talks to (override with environment variables)."""

from __future__ import annotations

import os

REDIS_URL = os.environ.get("JOBFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get(
    "JOBFENCE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("JOBFENCE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
