#!/usr/bin/env bash
# Install jobfence with its test and benchmark dependencies, make sure the services are up, and
# write BENCHMARKS.md: every benchmark in one run. Arguments go to benchmarks/run.py
# (--quick, --rounds N, --only SECTION,..., --output FILE).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# the anchors of the `bench` extra (pottery, python-redis-lock, aws-lambda-powertools) all
# accept the redis-py 8 of `test`, so they install with their dependencies
.venv/bin/python -m pip install --quiet -e '.[test,bench]' 2>&1 \
  | grep -v -e "^WARNING: Location" -e "dependency resolver does not currently" || true
.venv/bin/python -c "import jobfence, redis, psycopg, pymysql, aiosqlite, aio_pika, pika, pottery, redis_lock, aws_lambda_powertools.utilities.idempotency" \
  || { echo "bench.sh: installing the benchmark dependencies failed" >&2; exit 1; }

bash scripts/services.sh

exec .venv/bin/python benchmarks/run.py "$@"
