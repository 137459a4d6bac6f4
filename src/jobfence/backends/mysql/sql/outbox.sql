-- jobfence outbox, MySQL 8 / MariaDB 10.6+ (schema version 1).
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section: one statement, or several separated by ";".
--     Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 64 characters; default
--     jobfence_outbox); jobfence quotes it with backticks. Inside quotes ('{table}') the bare
--     name is written. Migration tools: fill {table} the same way.
--   * {seqs} (a slot, not a parameter) is filled by the backend with the comma-separated
--     seq numbers a statement works on (integers it read from this table).
--   * Parameters are named, :name; jobfence converts them for the driver (PyMySQL and aiomysql
--     %(name)s with a literal percent sign doubled, SQLAlchemy :name, Django %s).
--   * This file is jobfence/backends/mysql/sql/outbox.sql.
--
-- Columns as in postgres/sql/outbox.sql: seq, id (unique), queue, ordering_key, body,
-- headers, created_at, available_at, attempts, claimed_by, claimed_until, published_at,
-- dead, last_error. Times are DATETIME(6) in UTC (UTC_TIMESTAMP(6), the server's clock,
-- constant within a statement) and leave the server as microseconds since the epoch. The id
-- and the key are VARBINARY: compared byte for byte, up to 1024 bytes.
--
-- MySQL has no UPDATE ... RETURNING: a claim runs, on one connection of the relay,
-- claim_lock (GET_LOCK on a name made from the database and table: claims of one table run
-- one at a time), claim_pick (a plain read: under READ COMMITTED it sees every claim
-- committed before), claim_hold (holds the rows picked, each only if still claimable),
-- claim_read (only when claim_hold held fewer rows than picked), claim_unlock.

-- name: schema
CREATE TABLE IF NOT EXISTS {table} (
    seq           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    id            VARBINARY(1024) NOT NULL,
    queue         VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    ordering_key  VARBINARY(1024) NULL,
    body          LONGBLOB NOT NULL,
    headers       LONGTEXT NULL,
    created_at    DATETIME(6) NOT NULL,
    available_at  DATETIME(6) NOT NULL,
    attempts      INT NOT NULL DEFAULT 0,
    claimed_by    VARCHAR(255) NULL,
    claimed_until DATETIME(6) NULL,
    published_at  DATETIME(6) NULL,
    dead          TINYINT(1) NOT NULL DEFAULT 0,
    last_error    LONGTEXT NULL,
    UNIQUE KEY id_idx (id),
    -- the claim reads the rows still to publish in seq order
    KEY pending_idx (published_at, dead, seq),
    -- the key-order test: "an earlier row of this key still to publish" (a range of this
    -- index: the key, published_at NULL, dead 0, seq below the row's)
    KEY key_idx (ordering_key, published_at, dead, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE IF NOT EXISTS jobfence_outbox_schema (
    table_name VARCHAR(64) NOT NULL PRIMARY KEY,
    version    INT NOT NULL
) ENGINE=InnoDB;
INSERT INTO jobfence_outbox_schema (table_name, version) VALUES ('{table}', 1)
    ON DUPLICATE KEY UPDATE version = VALUES(version);

-- name: schema_version
SELECT version FROM jobfence_outbox_schema WHERE table_name = '{table}';

-- name: add
-- Runs inside the CALLER's transaction; ONE statement. Params: :rows, a JSON array of objects
-- {"id", "queue", "key" (absent: none), "body" (the body's JSON text), "headers" (JSON text;
-- absent: none), "delay_us" (microseconds)}, in the order the rows get their seq. An id already
-- in the table is skipped: the no-op update of ON DUPLICATE KEY changes nothing (and, unlike
-- INSERT IGNORE, hides no other error and raises no warning).
INSERT INTO {table} (id, queue, ordering_key, body, headers, created_at, available_at)
SELECT r.id, r.queue, r.ordering_key, CAST(r.body AS BINARY), r.headers,
       UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL r.delay_us MICROSECOND
  FROM JSON_TABLE(:rows, '$[*]' COLUMNS (
           n            FOR ORDINALITY,
           id           VARCHAR(1024) PATH '$.id',
           queue        VARCHAR(128) PATH '$.queue',
           ordering_key VARCHAR(1024) PATH '$.key',
           body         LONGTEXT PATH '$.body',
           headers      LONGTEXT PATH '$.headers',
           delay_us     BIGINT PATH '$.delay_us')) AS r
 ORDER BY r.n
ON DUPLICATE KEY UPDATE id = {table}.id;

-- name: add_one
-- ``add`` for ONE row, in the caller's transaction; the same row and the same skip of an id
-- already in the table, without JSON_TABLE: the add statement's ORDER BY over it costs a sort
-- on the server (about 300 µs) even for one row. Params: :id, :queue, :key (NULL: none),
-- :body (the body's JSON text), :headers (JSON text; NULL: none), :delay_us (microseconds).
INSERT INTO {table} (id, queue, ordering_key, body, headers, created_at, available_at)
VALUES (:id, :queue, :key, CAST(:body AS BINARY), :headers,
        UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL :delay_us MICROSECOND)
ON DUPLICATE KEY UPDATE id = {table}.id;

-- name: claim_session
-- Before claim_lock. Params: :idle (whole seconds, the request timeout). GET_LOCK belongs to
-- the session: a relay frozen inside its claim (a stopped process, a paused VM) would hold it,
-- and stop every relay of the table, for as long as its connection lives. While it claims,
-- the session is closed by the server after :idle seconds without a command instead, which
-- frees the lock; claim_unlock puts the server's default back.
SET SESSION wait_timeout = :idle;

-- name: claim_lock
-- Params: :wait (seconds). The lock's name: 'jobfence_outbox:' and the SHA-1 of
-- "<database>.<table>" (56 characters; GET_LOCK names are server-wide). -> 1: held; 0: timed
-- out (another claim held it all that time).
SELECT GET_LOCK(CONCAT('jobfence_outbox:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.{table}'))),
                :wait);

-- name: claim_unlock
-- After a claim (held or not): release the lock, and give the session back the server's
-- wait_timeout (see claim_session).
SET SESSION wait_timeout = DEFAULT, @jobfence_outbox_unlocked =
    RELEASE_LOCK(CONCAT('jobfence_outbox:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.{table}'))));

-- name: claim_pick
-- Params: :limit, :every (1: any queue), :queues (a JSON array of the queue names to claim
-- when not :every). Read-only, under claim_lock. The first :limit rows in seq order that are
-- to publish, available and not held by a live relay (in :queues), skipping a row while an
-- earlier row of its key is to publish and is not claimable by this same claim (held
-- elsewhere, delayed, or of another queue). -> (seq, id, queue, ordering_key, body, headers,
-- attempts, created_at in microseconds since the epoch), in seq order.
SELECT t.seq, t.id, t.queue, t.ordering_key, t.body, t.headers, t.attempts,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', t.created_at)
  FROM {table} AS t
 WHERE t.published_at IS NULL AND t.dead = 0
   AND t.available_at <= UTC_TIMESTAMP(6)
   AND (t.claimed_until IS NULL OR t.claimed_until <= UTC_TIMESTAMP(6))
   AND (:every OR JSON_CONTAINS(:queues, JSON_QUOTE(t.queue)))
   AND (t.ordering_key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {table} AS e
         WHERE e.ordering_key = t.ordering_key AND e.seq < t.seq
           AND e.published_at IS NULL AND e.dead = 0
           AND NOT (e.available_at <= UTC_TIMESTAMP(6)
                    AND (e.claimed_until IS NULL OR e.claimed_until <= UTC_TIMESTAMP(6))
                    AND (:every OR JSON_CONTAINS(:queues, JSON_QUOTE(e.queue))))))
 ORDER BY t.seq
 LIMIT :limit;

-- name: claim_hold
-- Params: :relay, :lease_us (microseconds); {seqs}: the rows claim_pick chose. Holds each
-- one that is still claimable (a relay whose hold ran out may have published it meanwhile).
-- -> the count held (CLIENT_FOUND_ROWS: matched rows).
UPDATE {table}
   SET claimed_by = :relay,
       claimed_until = UTC_TIMESTAMP(6) + INTERVAL :lease_us MICROSECOND
 WHERE seq IN ({seqs}) AND published_at IS NULL AND dead = 0
   AND (claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6));

-- name: claim_read
-- Params: :relay; {seqs}: the rows claim_pick chose. The ones claim_hold held. -> (seq).
SELECT seq FROM {table}
 WHERE seq IN ({seqs}) AND claimed_by = :relay AND claimed_until > UTC_TIMESTAMP(6)
   AND published_at IS NULL AND dead = 0;

-- name: published
-- Params: :relay; {seqs}. Marks published the rows of {seqs} that :relay holds (its hold
-- may have run out, as long as no other relay claimed the row since: it was sent).
UPDATE {table}
   SET published_at = UTC_TIMESTAMP(6), claimed_until = NULL
 WHERE seq IN ({seqs}) AND claimed_by = :relay
   AND claimed_until IS NOT NULL AND published_at IS NULL AND dead = 0;

-- name: published_delete
-- ``published`` with a retention of 0: the rows are deleted at once.
DELETE FROM {table}
 WHERE seq IN ({seqs}) AND claimed_by = :relay
   AND claimed_until IS NOT NULL AND published_at IS NULL AND dead = 0;

-- name: failed
-- Params: :relay, :seq, :error, :dead (1: give up), :retry_us (microseconds; ignored when
-- :dead). attempts + 1, last_error, pending again after :retry_us or dead. The assignments
-- read the columns before any of them changes (available_at first, dead last).
UPDATE {table}
   SET available_at = IF(:dead, available_at,
                         UTC_TIMESTAMP(6) + INTERVAL :retry_us MICROSECOND),
       attempts = attempts + 1,
       last_error = :error,
       claimed_by = NULL, claimed_until = NULL,
       dead = :dead
 WHERE seq = :seq AND claimed_by = :relay AND claimed_until > UTC_TIMESTAMP(6)
   AND published_at IS NULL AND dead = 0;

-- name: release
-- Params: :relay, :retry_us (microseconds); {seqs}. Gives back the rows of {seqs} that
-- :relay holds, without counting an attempt: available again after :retry_us.
UPDATE {table}
   SET available_at = UTC_TIMESTAMP(6) + INTERVAL :retry_us MICROSECOND,
       claimed_by = NULL, claimed_until = NULL
 WHERE seq IN ({seqs}) AND claimed_by = :relay AND claimed_until > UTC_TIMESTAMP(6)
   AND published_at IS NULL AND dead = 0;

-- name: extend
-- Params: :relay, :lease_us (microseconds); {seqs}. Holds the rows of {seqs} that :relay
-- still holds until now + :lease_us; a hold that ran out is never extended.
UPDATE {table}
   SET claimed_until = UTC_TIMESTAMP(6) + INTERVAL :lease_us MICROSECOND
 WHERE seq IN ({seqs}) AND claimed_by = :relay AND claimed_until > UTC_TIMESTAMP(6)
   AND published_at IS NULL AND dead = 0;

-- name: entries
-- Params: :state (NULL: every state), :queue (NULL: every queue), :after (seq), :limit.
-- Read-only. -> (seq, id, queue, ordering_key, state, attempts, then created_at,
-- available_at, claimed_until, published_at in microseconds since the epoch, claimed_by,
-- last_error, body, headers), in seq order.
SELECT seq, id, queue, ordering_key, state, attempts,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', available_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', claimed_until),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01', published_at),
       claimed_by, last_error, body, headers
  FROM (SELECT t.*,
               CASE WHEN t.published_at IS NOT NULL THEN 'published'
                    WHEN t.dead THEN 'dead'
                    WHEN t.claimed_until > UTC_TIMESTAMP(6) THEN 'claimed'
                    ELSE 'pending' END AS state
          FROM {table} AS t
         WHERE t.seq > :after AND (:queue IS NULL OR t.queue = :queue)) AS s
 WHERE :state IS NULL OR s.state = :state
 ORDER BY seq
 LIMIT :limit;

-- name: stats
-- Read-only. -> one row: (pending, claimed, published, dead, age in microseconds of the
-- oldest row still to publish, or NULL).
SELECT COALESCE(SUM(published_at IS NULL AND dead = 0
                    AND (claimed_until IS NULL OR claimed_until <= UTC_TIMESTAMP(6))), 0),
       COALESCE(SUM(published_at IS NULL AND dead = 0 AND claimed_until > UTC_TIMESTAMP(6)), 0),
       COALESCE(SUM(published_at IS NOT NULL), 0),
       COALESCE(SUM(published_at IS NULL AND dead = 1), 0),
       TIMESTAMPDIFF(MICROSECOND,
                     MIN(CASE WHEN published_at IS NULL AND dead = 0 THEN created_at END),
                     UTC_TIMESTAMP(6))
  FROM {table};

-- name: retry_dead
-- Params: :every (1: every dead row), :ids (a JSON array of ids when not :every). Makes the
-- dead rows pending again at once with their attempts reset (last_error kept).
UPDATE {table}
   SET dead = 0, attempts = 0, available_at = UTC_TIMESTAMP(6),
       claimed_by = NULL, claimed_until = NULL
 WHERE dead = 1 AND published_at IS NULL
   AND (:every OR JSON_CONTAINS(:ids, JSON_QUOTE(CONVERT(id USING utf8mb4))));

-- name: purge
-- Params: :retention_us (microseconds). Deletes the rows published more than that ago.
DELETE FROM {table}
 WHERE published_at IS NOT NULL
   AND published_at <= UTC_TIMESTAMP(6) - INTERVAL :retention_us MICROSECOND;

-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_outbox_schema WHERE table_name = '{table}';
