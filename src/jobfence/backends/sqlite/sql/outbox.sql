-- jobfence outbox, SQLite 3.35+ (schema version 1).
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section: one statement, or several separated by ";".
--     Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 63 characters; default
--     jobfence_outbox), and {table}_pending, {table}_key, {table}_published names made from
--     it; jobfence double-quotes them. Inside quotes ('{table}') the bare name is written.
--     Migration tools: fill {table} the same way.
--   * Parameters are named, :name (sqlite3 and aiosqlite take them as they are; SQLAlchemy
--     :name; Django %s).
--   * This file is jobfence/backends/sqlite/sql/outbox.sql.
--
-- Columns as in postgres/sql/outbox.sql: seq, id (unique), queue, ordering_key, body,
-- headers, created_at, available_at, attempts, claimed_by, claimed_until, published_at,
-- dead, last_error. Times are REAL seconds since the epoch by SQLite's clock (this host's):
-- (julianday('now') - 2440587.5) * 86400, the same instant throughout one statement.
-- SQLite runs one writer at a time: the claim (one UPDATE, in BEGIN IMMEDIATE) sees every
-- claim committed before it.

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    queue         TEXT NOT NULL,
    ordering_key  TEXT,
    body          BLOB NOT NULL,
    headers       TEXT,
    created_at    REAL NOT NULL,
    available_at  REAL NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 0,
    claimed_by    TEXT,
    claimed_until REAL,
    published_at  REAL,
    dead          INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT
);
-- the claim reads the rows still to publish in seq order
CREATE INDEX IF NOT EXISTS {table}_pending ON {table} (seq)
    WHERE published_at IS NULL AND dead = 0;
-- the key-order test: "an earlier row of this key still to publish"
CREATE INDEX IF NOT EXISTS {table}_key ON {table} (ordering_key, seq)
    WHERE ordering_key IS NOT NULL AND published_at IS NULL AND dead = 0;
-- purge: the published rows past their retention
CREATE INDEX IF NOT EXISTS {table}_published ON {table} (published_at)
    WHERE published_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS jobfence_outbox_schema (
    table_name TEXT PRIMARY KEY,
    version    INTEGER NOT NULL
);
INSERT INTO jobfence_outbox_schema (table_name, version) VALUES ('{table}', 1)
    ON CONFLICT (table_name) DO UPDATE SET version = excluded.version;

-- name: schema_version
SELECT version FROM jobfence_outbox_schema WHERE table_name = '{table}';

-- name: add
-- Runs inside the CALLER's transaction; ONE statement. Params: :rows, a JSON array of objects
-- {"id", "queue", "key" (absent: none), "body" (the body's JSON text), "headers" (JSON text;
-- absent: none), "delay" (seconds)}, in the order the rows get their seq. An id already in the
-- table is skipped (OR IGNORE; every other constraint is checked before the statement runs).
INSERT OR IGNORE INTO {table} (id, queue, ordering_key, body, headers, created_at, available_at)
SELECT json_extract(r.value, '$.id'), json_extract(r.value, '$.queue'),
       json_extract(r.value, '$.key'), CAST(json_extract(r.value, '$.body') AS BLOB),
       json_extract(r.value, '$.headers'),
       (julianday('now') - 2440587.5) * 86400.0,
       (julianday('now') - 2440587.5) * 86400.0 + json_extract(r.value, '$.delay')
  FROM json_each(:rows) AS r
 ORDER BY r.key;

-- name: add_one
-- ``add`` for ONE row, in the caller's transaction; the same row and the same skip of an id
-- already in the table, without the JSON array (nothing to encode twice, nothing to parse).
-- Params: :id, :queue, :key (NULL: none), :body (the body's JSON text), :headers (JSON text;
-- NULL: none), :delay (seconds).
INSERT OR IGNORE INTO {table} (id, queue, ordering_key, body, headers, created_at, available_at)
VALUES (:id, :queue, :key, CAST(:body AS BLOB), :headers,
        (julianday('now') - 2440587.5) * 86400.0,
        (julianday('now') - 2440587.5) * 86400.0 + :delay);

-- name: claim
-- ONE statement, in a BEGIN IMMEDIATE transaction. Params: :relay, :limit, :lease
-- (seconds), :every (1: any queue), :queues (a JSON array of the queue names to claim when
-- not :every). Holds for :relay, until now + :lease, the first :limit rows in seq order
-- that are to publish, available and not held by a live relay (in :queues), skipping a row
-- while an earlier row of its key is to publish and is not claimable by this same
-- statement (held elsewhere, delayed, or of another queue). -> one row per row held (any
-- order): (seq, id, queue, ordering_key, body, headers, attempts, created_at).
UPDATE {table}
   SET claimed_by = :relay,
       claimed_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
 WHERE seq IN (
     SELECT t.seq FROM {table} AS t
      WHERE t.published_at IS NULL AND t.dead = 0
        AND t.available_at <= (julianday('now') - 2440587.5) * 86400.0
        AND (t.claimed_until IS NULL
             OR t.claimed_until <= (julianday('now') - 2440587.5) * 86400.0)
        AND (:every OR t.queue IN (SELECT value FROM json_each(:queues)))
        AND (t.ordering_key IS NULL OR NOT EXISTS (
             SELECT 1 FROM {table} AS e
              WHERE e.ordering_key = t.ordering_key AND e.seq < t.seq
                AND e.published_at IS NULL AND e.dead = 0
                AND NOT (e.available_at <= (julianday('now') - 2440587.5) * 86400.0
                         AND (e.claimed_until IS NULL
                              OR e.claimed_until <= (julianday('now') - 2440587.5) * 86400.0)
                         AND (:every OR e.queue IN (SELECT value FROM json_each(:queues))))))
      ORDER BY t.seq
      LIMIT :limit)
RETURNING seq, id, queue, ordering_key, body, headers, attempts, created_at;

-- name: published
-- Params: :relay, :seqs (a JSON array of seq numbers). Marks published the rows of :seqs
-- that :relay holds (its hold may have run out, as long as no other relay claimed the row
-- since: it was sent).
UPDATE {table}
   SET published_at = (julianday('now') - 2440587.5) * 86400.0, claimed_until = NULL
 WHERE seq IN (SELECT value FROM json_each(:seqs)) AND claimed_by = :relay
   AND claimed_until IS NOT NULL AND published_at IS NULL AND dead = 0;

-- name: published_delete
-- ``published`` with a retention of 0: the rows are deleted at once.
DELETE FROM {table}
 WHERE seq IN (SELECT value FROM json_each(:seqs)) AND claimed_by = :relay
   AND claimed_until IS NOT NULL AND published_at IS NULL AND dead = 0;

-- name: failed
-- Params: :relay, :seq, :error, :retry_in (seconds; NULL: dead). attempts + 1, last_error,
-- pending again after :retry_in or dead.
UPDATE {table}
   SET attempts = attempts + 1,
       last_error = :error,
       dead = (:retry_in IS NULL),
       available_at = CASE WHEN :retry_in IS NULL THEN available_at
                           ELSE (julianday('now') - 2440587.5) * 86400.0 + :retry_in END,
       claimed_by = NULL, claimed_until = NULL
 WHERE seq = :seq AND claimed_by = :relay
   AND claimed_until > (julianday('now') - 2440587.5) * 86400.0
   AND published_at IS NULL AND dead = 0;

-- name: release
-- Params: :relay, :seqs (JSON array), :retry_in (seconds). Gives back the rows of :seqs
-- that :relay holds, without counting an attempt: available again after :retry_in.
UPDATE {table}
   SET available_at = (julianday('now') - 2440587.5) * 86400.0 + :retry_in,
       claimed_by = NULL, claimed_until = NULL
 WHERE seq IN (SELECT value FROM json_each(:seqs)) AND claimed_by = :relay
   AND claimed_until > (julianday('now') - 2440587.5) * 86400.0
   AND published_at IS NULL AND dead = 0;

-- name: extend
-- Params: :relay, :seqs (JSON array), :lease (seconds). Holds the rows of :seqs that
-- :relay still holds until now + :lease; a hold that ran out is never extended.
UPDATE {table}
   SET claimed_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
 WHERE seq IN (SELECT value FROM json_each(:seqs)) AND claimed_by = :relay
   AND claimed_until > (julianday('now') - 2440587.5) * 86400.0
   AND published_at IS NULL AND dead = 0;

-- name: entries
-- Params: :state (NULL: every state), :queue (NULL: every queue), :after (seq), :limit.
-- Read-only. -> (seq, id, queue, ordering_key, state, attempts, created_at, available_at,
-- claimed_by, claimed_until, published_at, last_error, body, headers), in seq order.
SELECT seq, id, queue, ordering_key, state, attempts, created_at, available_at,
       claimed_by, claimed_until, published_at, last_error, body, headers
  FROM (SELECT t.*,
               CASE WHEN t.published_at IS NOT NULL THEN 'published'
                    WHEN t.dead THEN 'dead'
                    WHEN t.claimed_until > (julianday('now') - 2440587.5) * 86400.0
                         THEN 'claimed'
                    ELSE 'pending' END AS state
          FROM {table} AS t
         WHERE t.seq > :after AND (:queue IS NULL OR t.queue = :queue))
 WHERE :state IS NULL OR state = :state
 ORDER BY seq
 LIMIT :limit;

-- name: stats
-- Read-only. -> one row: (pending, claimed, published, dead, age in seconds of the oldest
-- row still to publish, or NULL).
SELECT coalesce(sum(published_at IS NULL AND dead = 0
                    AND (claimed_until IS NULL
                         OR claimed_until <= (julianday('now') - 2440587.5) * 86400.0)), 0),
       coalesce(sum(published_at IS NULL AND dead = 0
                    AND claimed_until > (julianday('now') - 2440587.5) * 86400.0), 0),
       coalesce(sum(published_at IS NOT NULL), 0),
       coalesce(sum(published_at IS NULL AND dead = 1), 0),
       (julianday('now') - 2440587.5) * 86400.0
           - min(CASE WHEN published_at IS NULL AND dead = 0 THEN created_at END)
  FROM {table};

-- name: retry_dead
-- Params: :every (1: every dead row), :ids (a JSON array of ids when not :every). Makes the
-- dead rows pending again at once with their attempts reset (last_error kept).
UPDATE {table}
   SET dead = 0, attempts = 0, available_at = (julianday('now') - 2440587.5) * 86400.0,
       claimed_by = NULL, claimed_until = NULL
 WHERE dead = 1 AND published_at IS NULL
   AND (:every OR id IN (SELECT value FROM json_each(:ids)));

-- name: purge
-- Params: :retention (seconds). Deletes the rows published more than :retention ago.
DELETE FROM {table}
 WHERE published_at IS NOT NULL
   AND published_at <= (julianday('now') - 2440587.5) * 86400.0 - :retention;

-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_outbox_schema WHERE table_name = '{table}';
