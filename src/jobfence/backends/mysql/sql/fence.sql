-- jobfence fencing table and statements, MySQL 8 / MariaDB 10.6+ (InnoDB).
--
-- Used by jobfence.fence()/fence_async() on the caller's own connection, inside the caller's
-- transaction. This file is jobfence/backends/mysql/sql/fence.sql.
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section; each section below is one statement. Comments
--     are removed before a statement is sent.
--   * {table} is the table name: jobfence_fences unless install(conn, table=...) and
--     fence(..., table=...) name another (validated as an SQL identifier, optionally
--     schema.table); jobfence quotes it (each part) with backticks.
--     Migration tools: fill it in the same way.
--   * Parameters are named, :name; jobfence converts them for the driver (PyMySQL and
--     aiomysql %(name)s, SQLAlchemy :name).
--
-- Resource names can be up to 1024 bytes, longer than an InnoDB key may comfortably be, so the
-- key is the SHA-256 of the UTF-8 name (computed by jobfence) and the name is kept beside it.

-- name: install
-- Idempotent; run it once (or copy it into your migrations) before the first fence().
-- (DDL commits implicitly on MySQL/MariaDB.)
CREATE TABLE IF NOT EXISTS {table} (
    resource_hash BINARY(32)      NOT NULL PRIMARY KEY,  -- SHA-256 of the UTF-8 resource name
    resource      VARBINARY(1024) NOT NULL,              -- the resource name, UTF-8
    token         BIGINT          NOT NULL,              -- the newest token that wrote it
    fenced_at     TIMESTAMP(6)    NOT NULL DEFAULT CURRENT_TIMESTAMP(6)  -- informational
) ENGINE=InnoDB

-- name: fence
-- Parameters: :hash (the resource_hash) and :resource, both as hex strings (bytes travel as hex
-- so that no driver's bytes escaping or connection charset is involved), :token.
-- One atomic upsert that keeps the larger token. Whichever way it goes, it leaves the resulting
-- token in LAST_INSERT_ID(expr), which the server reports back in the OK packet (the driver's
-- cursor.lastrowid): equal to the offered token when it was recorded (insert, newer or equal
-- token), larger when a newer token already wrote the resource: the caller's write is stale.
-- No affected-rows arithmetic (that depends on CLIENT_FOUND_ROWS) and no second round trip.
-- The upsert is a locking read of the latest committed row, and the row stays locked until the
-- caller's transaction ends. Side effect: sets the session's LAST_INSERT_ID().
-- fenced_at is assigned first, while `token` still holds the old value.
INSERT INTO {table} (resource_hash, resource, token) VALUES (UNHEX(:hash), UNHEX(:resource), LAST_INSERT_ID(:token))
ON DUPLICATE KEY UPDATE
    fenced_at = IF(:token >= token, CURRENT_TIMESTAMP(6), fenced_at),
    token = LAST_INSERT_ID(IF(:token >= token, :token, token))

-- name: newest
-- Parameters: :hash, the resource_hash as hex. A locking read (latest committed row, not the
-- transaction's snapshot); only used when a driver does not report lastrowid.
SELECT token FROM {table} WHERE resource_hash = UNHEX(:hash) FOR UPDATE
