-- jobfence inbox, SQLite (schema version 2).
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section: one statement, or several separated by ";".
--     Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 63 characters; default
--     jobfence_inbox), and {table}_expires one name made from it; jobfence double-quotes
--     them. Inside quotes ('{table}') the bare name is written. Migration tools: fill {table}
--     the same way.
--   * Parameters are named, :name, as sqlite3 and SQLAlchemy take them.
--   * This file is jobfence/backends/sqlite/sql/inbox.sql.
--
-- Times are Unix epoch seconds (REAL) from SQLite's clock, i.e. the host's:
--   (julianday('now') - 2440587.5) * 86400.0  (constant within one statement)
-- Columns as in postgres/sql/inbox.sql: k, state ('in_progress' | 'completed'), owner, attempt,
-- fingerprint, applied (claim_in committed the effect), result, expires_at, claimed_at (epoch
-- seconds; NULL in rows of a version-1 table and in claim_in's markers).
--
-- Schema versions: 1 had no claimed_at; 2 adds it. SQLite cannot add a column only if it is
-- missing in one statement: after ``schema``, install() runs ``upgrade`` when
-- ``upgrade_needed`` returns 1 (a migration tool does the same).

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    k           TEXT PRIMARY KEY,
    state       TEXT NOT NULL,
    owner       TEXT,
    attempt     INTEGER NOT NULL DEFAULT 1,
    fingerprint TEXT,
    applied     INTEGER NOT NULL DEFAULT 0,
    result      BLOB,
    expires_at  REAL NOT NULL,
    claimed_at  REAL
);
CREATE INDEX IF NOT EXISTS {table}_expires ON {table} (expires_at);
CREATE TABLE IF NOT EXISTS jobfence_inbox_schema (
    table_name TEXT PRIMARY KEY,
    version    INTEGER NOT NULL
);
INSERT INTO jobfence_inbox_schema (table_name, version) VALUES ('{table}', 2)
    ON CONFLICT (table_name) DO UPDATE SET version = excluded.version;

-- name: upgrade_needed
-- Read-only. -> one row: 1 if the table lacks the claimed_at column (a version-1 table), else 0.
SELECT count(*) = 0 FROM pragma_table_info('{table}') WHERE name = 'claimed_at';

-- name: upgrade
-- A version-1 table to version 2 (run when ``upgrade_needed`` says so, in install()'s
-- transaction).
ALTER TABLE {table} ADD COLUMN claimed_at REAL;

-- name: claim
-- ONE statement (SQLite runs writers one at a time). Params: :key, :owner, :fingerprint,
-- :ttl (seconds). Same rule as PostgreSQL: take a new key, an in-progress key past its
-- deadline (attempt + 1, refused if both fingerprints are set and differ) or a completed key
-- past retention (attempt 1). Returns the taken row, or no row when the key is held: then
-- the ``peek`` statement reads the record that stopped us.
INSERT INTO {table} (k, state, owner, attempt, fingerprint, applied, expires_at, claimed_at)
VALUES (:key, 'in_progress', :owner, 1, :fingerprint, 0, (julianday('now') - 2440587.5) * 86400.0 + :ttl,
        (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (k) DO UPDATE SET
    state = 'in_progress',
    owner = excluded.owner,
    attempt = CASE WHEN {table}.state = 'completed' THEN 1 ELSE {table}.attempt + 1 END,
    -- a takeover without a fingerprint keeps the key's (a completed key past retention is new)
    fingerprint = CASE WHEN {table}.state = 'completed' THEN excluded.fingerprint
                       ELSE coalesce(excluded.fingerprint, {table}.fingerprint) END,
    applied = ({table}.applied AND {table}.state = 'in_progress'),
    result = NULL,
    expires_at = excluded.expires_at,
    claimed_at = excluded.claimed_at
WHERE {table}.expires_at <= (julianday('now') - 2440587.5) * 86400.0
  AND ({table}.state = 'completed' OR {table}.fingerprint IS NULL
       OR excluded.fingerprint IS NULL OR {table}.fingerprint = excluded.fingerprint)
RETURNING 1, state, owner, attempt, fingerprint, result, expires_at;

-- name: peek
-- Params: :key.
SELECT 0, state, owner, attempt, fingerprint, result, expires_at FROM {table} WHERE k = :key;

-- name: complete
-- Params: :result, :retention (seconds), :key, :owner. Owner-checked.
UPDATE {table} SET state = 'completed', result = :result, expires_at = (julianday('now') - 2440587.5) * 86400.0 + :retention
WHERE k = :key AND owner = :owner AND NOT (state = 'completed' AND expires_at <= (julianday('now') - 2440587.5) * 86400.0);

-- name: release
-- Params: :key, :owner.
UPDATE {table} SET owner = NULL, expires_at = MIN(expires_at, (julianday('now') - 2440587.5) * 86400.0)
WHERE k = :key AND owner = :owner AND state = 'in_progress';

-- name: extend
-- Params: :key, :owner, :ttl (seconds). Owner-checked: moves the deadline of a live
-- in-progress claim to now + ttl; an expired claim is never extended (it may be taken over).
-- The renewal of many claims runs this once per claim inside one BEGIN IMMEDIATE transaction.
UPDATE {table} SET expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
WHERE k = :key AND owner = :owner AND state = 'in_progress'
  AND expires_at > (julianday('now') - 2440587.5) * 86400.0;

-- name: purge
-- Params: :retention, seconds, for abandoned in-progress claims.
DELETE FROM {table}
WHERE (state = 'completed' AND expires_at <= (julianday('now') - 2440587.5) * 86400.0)
   OR (state = 'in_progress' AND expires_at <= (julianday('now') - 2440587.5) * 86400.0 - :retention);

-- name: claims
-- Params: :state (or NULL: both), :prefix, :limit. Read-only. -> (k, state, owner, attempt,
-- fingerprint, claimed_at, seconds_left) of the records whose keys start with :prefix,
-- compared as UTF-8 bytes (a BLOB: no wildcards, case-sensitive), ordered by key (BINARY:
-- code point order), at most :limit rows. seconds_left is negative once expires_at passed.
SELECT k, state, owner, attempt, fingerprint, claimed_at,
       expires_at - (julianday('now') - 2440587.5) * 86400.0
  FROM {table}
 WHERE substr(CAST(k AS BLOB), 1, length(CAST(:prefix AS BLOB))) = CAST(:prefix AS BLOB)
   AND (:state IS NULL OR state = :state)
 ORDER BY k
 LIMIT :limit;

-- name: claim_info
-- Params: :key. Read-only. -> the columns of ``claims`` for one key, or no row.
SELECT k, state, owner, attempt, fingerprint, claimed_at,
       expires_at - (julianday('now') - 2440587.5) * 86400.0
  FROM {table}
 WHERE k = :key;

-- name: forget
-- Params: :key. Deletes the key's record whatever its state (operator action).
DELETE FROM {table} WHERE k = :key;

-- name: claim_in
-- Runs inside the CALLER's transaction; ONE statement. Params: :key, :fingerprint,
-- :retention (seconds). Changes one row iff this transaction is the first to apply the key.
INSERT INTO {table} (k, state, owner, attempt, fingerprint, applied, expires_at)
VALUES (:key, 'completed', NULL, 1, :fingerprint, 1, (julianday('now') - 2440587.5) * 86400.0 + :retention)
ON CONFLICT (k) DO UPDATE SET applied = 1
WHERE NOT {table}.applied AND {table}.state = 'in_progress'
  AND ({table}.fingerprint IS NULL OR excluded.fingerprint IS NULL
       OR {table}.fingerprint = excluded.fingerprint);

-- name: fingerprint
SELECT fingerprint FROM {table} WHERE k = :key;

-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_inbox_schema WHERE table_name = '{table}';
