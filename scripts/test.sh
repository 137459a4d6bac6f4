#!/usr/bin/env bash
# Install jobfence with its test dependencies, make sure the services are up, run every check
# and the whole test suite. Extra arguments go to pytest (e.g. -k redis, -x).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# arq 0.28 declares redis-py < 6 but runs on the redis-py 8 the rest of the suite needs (its
# tests here pass on both), so it comes without its dependencies: click and redis-py are in .[test]
.venv/bin/python -m pip install --quiet --no-deps 'arq>=0.28,<0.29' 2>&1 | grep -v "^WARNING: Location" || true
# (pip then reports arq's declared redis-py bound as a conflict: expected, not shown)
.venv/bin/python -m pip install --quiet -e '.[test]' 2>&1 \
  | grep -v -e "^WARNING: Location" -e "dependency resolver does not currently" \
      -e "^arq .* requires redis" || true
.venv/bin/python -c "import jobfence, redis, psycopg, psycopg_pool, pymysql, aiosqlite, aio_pika, pika, pytest, xdist, celery, rq, dramatiq, arq, django, mkdocs, mkdocstrings, mkdocs_click, material, opentelemetry.sdk, playwright, pottery, redis_lock, aws_lambda_powertools.utilities.idempotency" \
  || { echo "test.sh: installing the test dependencies failed" >&2; exit 1; }

bash scripts/services.sh

# PgBouncer: tests/integration/test_doctor.py starts a disposable one in transaction pooling mode
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  echo "== installing pgbouncer"
  { apt-get install -y -q pgbouncer >/dev/null \
      || { apt-get update >/dev/null && apt-get install -y -q pgbouncer >/dev/null; }; } \
    || { echo "test.sh: installing pgbouncer failed (apt-get install pgbouncer)" >&2; exit 1; }
fi

# etcd: the etcd conformance specs and tests/reliability/test_etcd_failover.py start disposable
# members of their own (tests/etcd_cluster.py)
if ! command -v etcd >/dev/null 2>&1 && [ ! -x /usr/bin/etcd ]; then
  echo "== installing etcd-server"
  { apt-get install -y -q etcd-server >/dev/null \
      || { apt-get update >/dev/null && apt-get install -y -q etcd-server >/dev/null; }; } \
    || { echo "test.sh: installing etcd failed (apt-get install etcd-server)" >&2; exit 1; }
fi

# the dashboard's browser tests drive the system Chromium (they fail without it, never skip)
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing Chromium for the browser tests"
    apt-get install -y chromium >/dev/null || { apt-get update >/dev/null && apt-get install -y chromium >/dev/null; }
  fi
  [ -x /usr/bin/chromium ] || {
    echo "test.sh: the browser tests need Chromium at /usr/bin/chromium: run 'apt-get install -y chromium' as root" >&2
    exit 1
  }
fi

# redis-py's own lock tests run against jobfence's Lock (tests/integration/test_redis_py_lock_suite.py):
# fetch their sdist here, outside the per-test timeout, so a slow registry cannot fail that test
REDIS_PY=$(.venv/bin/python -c "import redis; print(redis.__version__)")
if ! ls ".cache/redis-py/redis-$REDIS_PY.tar.gz" >/dev/null 2>&1; then
  echo "== fetching the sdist of redis $REDIS_PY (its lock tests)"
  .venv/bin/python -m pip download "redis==$REDIS_PY" --no-deps --no-binary :all: \
    --dest .cache/redis-py --quiet 2>&1 | grep -v "^WARNING: Location" || true
fi

echo "== generated sync twins are current"
.venv/bin/python tools/async_to_sync.py --check
echo "== ruff"
.venv/bin/ruff check src tests tools benchmarks examples
.venv/bin/ruff format --check src tools
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
# Most tests wait on servers, timers and other processes: four pytest-xdist workers
# (PYTEST_WORKERS; 0 runs in this process) run the 5,145 tests in about 12-13 minutes on 2 cores
# (16.5 minutes on a machine whose loopback round trips cost about 3x more).
# A fifth is slower: the CPU-bound tests then crowd out.
# --dist worksteal: a worker that runs out of tests takes some of another's queue, so the 20-50 s
# tests do not all wait at the end of one worker's list while the others are idle.
exec .venv/bin/pytest -n "${PYTEST_WORKERS:-4}" --dist worksteal --durations=20 "$@"
