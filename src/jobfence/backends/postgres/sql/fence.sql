-- jobfence fencing table and statements, PostgreSQL.
--
-- Used by jobfence.fence()/fence_async() on the caller's own connection, inside the caller's
-- transaction. This file is jobfence/backends/postgres/sql/fence.sql.
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section; each section below is one statement. Comments
--     are removed before a statement is sent.
--   * {table} is the table name: jobfence_fences unless install(conn, table=...) and
--     fence(..., table=...) name another (validated as an SQL identifier, optionally
--     schema.table); jobfence double-quotes it (each part), so its case is kept.
--     Migration tools: fill it in the same way.
--   * Parameters are named, :name; jobfence converts them for the driver (psycopg
--     %(name)s, asyncpg $1, $2..., SQLAlchemy :name).

-- name: install
-- Idempotent; run it once (or copy it into your migrations) before the first fence().
-- ONE statement (a DO block) that first takes a transaction-scoped advisory lock (key
-- 0x6A6F6266656E6365, "jobfence"), so concurrent installs wait for each other instead of
-- failing: CREATE TABLE IF NOT EXISTS alone is not safe against a concurrent CREATE.
DO $jobfence$
BEGIN
    PERFORM pg_advisory_xact_lock(7669456882363163493);
    CREATE TABLE IF NOT EXISTS {table} (
        resource  TEXT        NOT NULL PRIMARY KEY,  -- the fenced resource name (<= 1024 bytes)
        token     BIGINT      NOT NULL,              -- the newest fencing token that wrote it
        fenced_at TIMESTAMPTZ NOT NULL DEFAULT now() -- when it last fenced (informational)
    );
END
$jobfence$

-- name: fence
-- Parameters: :resource, :token.
-- Records the token unless a newer one is already recorded. Returns one row (the token) when the
-- token was recorded (new row, newer or equal token), and NO row when the resource holds a newer
-- token: the caller's write is stale. The conflicting row stays locked until the caller's
-- transaction ends, so a concurrent fence on the same resource waits and then re-checks.
INSERT INTO {table} AS f (resource, token) VALUES (:resource, :token)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, fenced_at = now()
WHERE f.token <= EXCLUDED.token
RETURNING f.token

-- name: newest
-- Parameters: :resource. Only run after fence returned no row, to name the newest token.
SELECT token FROM {table} WHERE resource = :resource
