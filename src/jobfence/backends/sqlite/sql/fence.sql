-- jobfence fencing table and statements, SQLite (3.35+ for RETURNING).
--
-- Used by jobfence.fence()/fence_async() on the caller's own connection, inside the caller's
-- transaction. This file is jobfence/backends/sqlite/sql/fence.sql.
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section; each section below is one statement. Comments
--     are removed before a statement is sent.
--   * {table} is the table name: jobfence_fences unless install(conn, table=...) and
--     fence(..., table=...) name another (validated as an SQL identifier, optionally
--     schema.table); jobfence double-quotes it (each part).
--     Migration tools: fill it in the same way.
--   * Parameters are named, :name; jobfence converts them for the driver (sqlite3 and
--     SQLAlchemy take :name as it is).

-- name: install
-- Idempotent; run it once (or copy it into your migrations) before the first fence().
CREATE TABLE IF NOT EXISTS {table} (
    resource  TEXT    NOT NULL PRIMARY KEY,            -- the fenced resource name
    token     INTEGER NOT NULL,                        -- the newest token that wrote it
    fenced_at TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP -- UTC, informational
)

-- name: fence
-- Parameters: :resource, :token.
-- Records the token unless a newer one is already recorded. Returns one row (the token) when the
-- token was recorded (new row, newer or equal token), and NO row when the resource holds a newer
-- token: the caller's write is stale. SQLite has one writer at a time, so the write lock this
-- statement takes serialises concurrent fences until the caller's transaction ends.
INSERT INTO {table} AS f (resource, token) VALUES (:resource, :token)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, fenced_at = CURRENT_TIMESTAMP
WHERE f.token <= excluded.token
RETURNING token

-- name: newest
-- Parameters: :resource. Only run after fence returned no row, to name the newest token.
SELECT token FROM {table} WHERE resource = :resource
