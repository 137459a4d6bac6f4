-- jobfence inbox, MySQL 8 / MariaDB 10.6+ (schema version 1).
--
-- {table} is replaced by the validated table name (default jobfence_inbox); ``?`` is the
-- placeholder. Times are DATETIME(6) in UTC (UTC_TIMESTAMP(6), constant within a statement).
-- The key and fingerprint are VARBINARY: compared byte for byte, up to 1024 bytes.
-- Columns as in postgres_inbox.sql: k, state ('in_progress' | 'completed'), owner, attempt,
-- fingerprint, applied (claim_in committed the effect), result, expires_at.

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    k           VARBINARY(1024) NOT NULL PRIMARY KEY,
    state       VARCHAR(16) NOT NULL,
    owner       VARCHAR(255) NULL,
    attempt     INT NOT NULL DEFAULT 1,
    fingerprint VARBINARY(1024) NULL,
    applied     TINYINT(1) NOT NULL DEFAULT 0,
    result      LONGBLOB NULL,
    expires_at  DATETIME(6) NOT NULL,
    KEY expires_idx (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS jobfence_inbox_schema (
    table_name VARCHAR(64) NOT NULL PRIMARY KEY,
    version    INT NOT NULL
) ENGINE=InnoDB;
INSERT INTO jobfence_inbox_schema (table_name, version) VALUES ('{table}', 1)
    ON DUPLICATE KEY UPDATE version = VALUES(version);

-- name: claim_new
-- The common path of claim: ONE short atomic statement that inserts the key iff it is unknown.
-- Params: 1 key, 2 owner, 3 ttl microseconds, 4 fingerprint, 5 ttl microseconds. MySQL has no
-- RETURNING: the outcome comes back in the OK packet as LAST_INSERT_ID(expr) (the driver's
-- lastrowid). The VALUES set it to the claim's deadline in microseconds since the epoch
-- (TIMESTAMPDIFF on the same UTC_TIMESTAMP(6) as the stored expires_at: no session time zone
-- involved); when the key exists, the no-op update sets it to 0 and changes nothing. So
-- lastrowid > 0: the claim is NEW (attempt 1) with that deadline; 0: the key exists (held,
-- completed or abandoned) and the caller runs ``claim`` below. Not INSERT IGNORE: its
-- duplicate-key warning costs aiomysql a SHOW WARNINGS round trip and the caller a Python
-- warning. Measured against the upsert + read of ``claim``: about 40% less time per NEW claim
-- (the long upsert costs the server a parse every time).
INSERT INTO {table} (k, state, owner, attempt, fingerprint, applied, result, expires_at)
VALUES (?, 'in_progress', ?,
        IF(LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6)) + ?) > 0, 1, 1),
        ?, 0, NULL, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE attempt = IF(LAST_INSERT_ID(0), attempt, attempt);

-- name: claim
-- The key exists: ONE atomic statement that takes it over if its claim expired, sent in one
-- round trip together with the read of its outcome.
-- Params: 1 key, 2 owner, 3 fingerprint, 4 ttl microseconds.
-- {take} is the takeover rule (see postgres_inbox.sql):
--   expires_at <= UTC_TIMESTAMP(6) AND (state = 'completed' OR fingerprint IS NULL
--     OR VALUES(fingerprint) IS NULL OR fingerprint = VALUES(fingerprint))
-- MySQL applies ON DUPLICATE KEY assignments left to right, each seeing the ones before, so
-- every assignment re-evaluates {take}, and the columns {take} reads are assigned last, in an
-- order that leaves its value unchanged (fingerprint, then state, then expires_at).
INSERT INTO {table} (k, state, owner, attempt, fingerprint, applied, result, expires_at)
VALUES (?, 'in_progress', ?, 1, ?, 0, NULL, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
ON DUPLICATE KEY UPDATE
    attempt = IF({take}, IF(state = 'completed', 1, attempt + 1), attempt),
    applied = IF({take}, applied AND state = 'in_progress', applied),
    result = IF({take}, NULL, result),
    owner = IF({take}, VALUES(owner), owner),
    fingerprint = IF({take}, IF(state = 'completed', VALUES(fingerprint),
                                COALESCE(VALUES(fingerprint), fingerprint)), fingerprint),
    state = IF({take}, 'in_progress', state),
    expires_at = IF({take}, VALUES(expires_at), expires_at);

-- name: peek
-- Sent in the same round trip as ``claim`` (multi-statement). Params: 1 owner, 2 key.
-- ``mine`` is true iff the row now carries our owner id (unique per claim).
SELECT owner <=> ?, state, owner, attempt, fingerprint, result, expires_at
FROM {table} WHERE k = ?;

-- name: complete
-- Params: 1 result as hex text (UNHEX: aiomysql cannot send bytes with PyMySQL >= 1.1),
-- 2 retention microseconds, 3 key, 4 owner. Owner-checked.
UPDATE {table}
SET state = 'completed', result = UNHEX(?), expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE k = ? AND owner = ? AND NOT (state = 'completed' AND expires_at <= UTC_TIMESTAMP(6));

-- name: release
-- Params: 1 key, 2 owner.
UPDATE {table} SET owner = NULL, expires_at = LEAST(expires_at, UTC_TIMESTAMP(6))
WHERE k = ? AND owner = ? AND state = 'in_progress';

-- name: purge
-- Params: 1 retention microseconds for abandoned in-progress claims.
DELETE FROM {table}
WHERE (state = 'completed' AND expires_at <= UTC_TIMESTAMP(6))
   OR (state = 'in_progress' AND expires_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND);

-- name: claim_in
-- Runs inside the CALLER's transaction; ONE statement on the common path. Params: 1 key,
-- 2 fingerprint, 3 retention microseconds. Inserts one row iff the key is unknown; a
-- concurrent duplicate waits on the unique key, then inserts nothing. (INSERT IGNORE rather
-- than ON DUPLICATE KEY UPDATE: its count means the same with or without CLIENT_FOUND_ROWS.)
INSERT IGNORE INTO {table} (k, state, owner, attempt, fingerprint, applied, expires_at)
VALUES (?, 'completed', NULL, 1, ?, 1, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND);

-- name: claim_in_held
-- Only when ``claim_in`` inserted nothing: mark a key that claim() holds (not yet applied) as
-- applied. Params: 1 key, 2 fingerprint, 3 fingerprint. Matches one row iff it did.
UPDATE {table} SET applied = 1
WHERE k = ? AND applied = 0 AND state = 'in_progress'
  AND (fingerprint IS NULL OR ? IS NULL OR fingerprint = ?);

-- name: fingerprint
-- A locking read: under REPEATABLE READ a plain read would show the transaction's snapshot,
-- which may predate the row that stopped claim_in (and miss a fingerprint mismatch).
SELECT fingerprint FROM {table} WHERE k = ? LOCK IN SHARE MODE;

-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_inbox_schema WHERE table_name = '{table}';
