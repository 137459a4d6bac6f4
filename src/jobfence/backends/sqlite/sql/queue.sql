-- jobfence queues, SQLite (schema version 1): one table holds every queue of the file.
--
-- Loaded by jobfence/backends/sqlite/queue_async.py (and its generated twin queue.py) through
-- jobfence/_core/sqlfiles.py, whose conventions hold for every shipped .sql file:
--   * "-- name: <section>" starts a section: one statement, or a script of statements separated
--     by ";" (schema, drop). Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 63 characters; default
--     jobfence_queue), and {table}_due one name made from it; jobfence double-quotes them.
--     Inside quotes ('{table}') the bare name is written.
--   * Parameters are named, :name, as sqlite3 takes them. :queue is the queue name.
--
-- Time: every deadline is measured by ONE clock, the SQLite host clock, as unix seconds with
-- millisecond resolution:
--     (julianday('now') - 2440587.5) * 86400.0
-- SQLite evaluates 'now' once per statement, so it is the same value everywhere in a statement.
-- All processes using the file run on the same host and so share this clock. Python's clocks
-- are never written into this table.
--
-- Transactions: the connection runs with isolation_level=None. Every verb is ONE statement in
-- autocommit mode (a writing statement takes the write lock before it reads, so it is atomic
-- across threads and processes), except publish (many inserts in one BEGIN IMMEDIATE
-- transaction) and drop. A busy timeout makes concurrent processes queue for the write lock.
--
-- A message is one row. Its life:
--   ready, visible_at <= now          deliverable (published, nacked, requeued, or a delivery
--                                      whose visibility passed without an ack or renewal)
--   ready, visible_at > now, receipt  in flight: delivered, hidden until visible_at
--   ready, visible_at > now, no receipt  delayed: published or nacked with a delay
--   dead                              a dead letter; visible_at is when it died
-- An ack deletes the row. A delivery is identified by (seq, receipt): the receipt is a fresh
-- random token for each delivery, so an old delivery's ack, nack, renewal or dead_letter never
-- matches a newer delivery of the same message.


-- name: schema
-- Idempotent: safe to run from any number of processes at once (inside BEGIN IMMEDIATE).
CREATE TABLE IF NOT EXISTS {table} (
    -- publish order; the rowid, so a new row always gets a larger seq than every row left
    -- (no AUTOINCREMENT: a reused seq of a deleted row is harmless, receipts are random)
    seq          INTEGER PRIMARY KEY,
    queue        TEXT NOT NULL,            -- the queue name
    id           TEXT NOT NULL,            -- the message id (not unique)
    body         BLOB NOT NULL,
    headers      TEXT NOT NULL,            -- a JSON object of strings
    state        TEXT NOT NULL,            -- 'ready' | 'dead'
    delivery     INTEGER NOT NULL,         -- deliveries so far (0: never delivered)
    visible_at   REAL NOT NULL,            -- unix seconds: deliverable from then on
    consumer     TEXT,                     -- the owner id of the current delivery
    receipt      TEXT,                     -- the random token of the current delivery
    published_at REAL NOT NULL,            -- unix seconds
    last_error   TEXT,                     -- the error of the last nack / dead_letter
    dead_at      REAL                      -- unix seconds, for dead letters
);
-- Every receive, due check and dead-letter listing is a range scan of this index, in
-- (visible_at, seq) order: SQLite appends the rowid (seq) to every index entry.
CREATE INDEX IF NOT EXISTS {table}_due ON {table} (queue, state, visible_at);
CREATE TABLE IF NOT EXISTS jobfence_queue_schema (
    table_name TEXT PRIMARY KEY,
    version    INTEGER NOT NULL
);
INSERT INTO jobfence_queue_schema (table_name, version) VALUES ('{table}', 1)
    ON CONFLICT (table_name) DO NOTHING;


-- name: schema_version
-- -> (version) of the queue table, one row.
SELECT version FROM jobfence_queue_schema WHERE table_name = '{table}';


-- name: publish
-- Params: :queue, :id, :body, :headers (JSON), :delay (seconds). Run once per message, all
-- of a batch in one BEGIN IMMEDIATE transaction.
INSERT INTO {table} (queue, id, body, headers, state, delivery, visible_at, published_at)
VALUES (:queue, :id, :body, :headers, 'ready', 0,
        (julianday('now') - 2440587.5) * 86400.0 + :delay,
        (julianday('now') - 2440587.5) * 86400.0);


-- name: due
-- Params: :queue. Read-only (no write lock), run before take so that an idle poll never
-- takes the write lock. -> (seconds until the next message becomes deliverable: <= 0 if one
-- is deliverable now, NULL if the queue holds no ready, delayed or in-flight message).
-- One index probe: the first entry of (queue, 'ready') in the index.
SELECT min(visible_at) - (julianday('now') - 2440587.5) * 86400.0
  FROM {table}
 WHERE queue = :queue AND state = 'ready';


-- name: take
-- Params: :queue, :consumer, :visibility (seconds), :limit. ONE statement: picks the
-- :limit deliverable messages that have been deliverable longest (publish order among those
-- that became deliverable together), and delivers them: delivery + 1, hidden until now +
-- :visibility, a new random receipt, owned by :consumer. -> the delivered rows, in no
-- particular order (the caller sorts them by seq, i.e. publish order).
UPDATE {table}
   SET delivery = delivery + 1,
       visible_at = (julianday('now') - 2440587.5) * 86400.0 + :visibility,
       consumer = :consumer,
       receipt = lower(hex(randomblob(12)))
 WHERE seq IN (SELECT seq FROM {table}
                WHERE queue = :queue AND state = 'ready'
                  AND visible_at <= (julianday('now') - 2440587.5) * 86400.0
                ORDER BY visible_at, seq
                LIMIT :limit)
RETURNING seq, id, body, headers, delivery, receipt, published_at, last_error;


-- name: ack
-- Params: :queue, :seq, :receipt, :consumer. Owner-checked: deletes the message if this is
-- still its current delivery (nobody received it since, even if its visibility passed).
DELETE FROM {table}
 WHERE seq = :seq AND queue = :queue AND state = 'ready'
   AND receipt = :receipt AND consumer = :consumer;


-- name: ack_many
-- Params: :queue, :items: a JSON array of [seq, receipt, consumer] arrays. ONE statement
-- acks every delivery that is still its consumer's current one, as ``ack`` does for one.
-- -> (seq, receipt, consumer) of every message deleted.
DELETE FROM {table}
 WHERE queue = :queue AND state = 'ready'
   AND seq IN (SELECT json_extract(value, '$[0]') FROM json_each(:items))
   AND EXISTS (SELECT 1 FROM json_each(:items) AS r
                WHERE json_extract(r.value, '$[0]') = {table}.seq
                  AND json_extract(r.value, '$[1]') = {table}.receipt
                  AND json_extract(r.value, '$[2]') = {table}.consumer)
RETURNING seq, receipt, consumer;


-- name: nack
-- Params: :queue, :seq, :receipt, :consumer, :delay (seconds), :error. Owner-checked: the
-- message becomes deliverable again after :delay (its next delivery counts + 1).
UPDATE {table}
   SET visible_at = (julianday('now') - 2440587.5) * 86400.0 + :delay,
       consumer = NULL,
       receipt = NULL,
       last_error = :error
 WHERE seq = :seq AND queue = :queue AND state = 'ready'
   AND receipt = :receipt AND consumer = :consumer;


-- name: defer
-- Params: :queue, :seq, :receipt, :consumer, :delay (seconds). Owner-checked as nack: the
-- message becomes deliverable again after :delay WITHOUT counting this delivery (its next
-- delivery has the same number) and keeps its last_error: a "not now" refusal, the handler
-- did not run.
UPDATE {table}
   SET visible_at = (julianday('now') - 2440587.5) * 86400.0 + :delay,
       consumer = NULL,
       receipt = NULL,
       delivery = max(delivery - 1, 0)
 WHERE seq = :seq AND queue = :queue AND state = 'ready'
   AND receipt = :receipt AND consumer = :consumer;


-- name: dead_letter
-- Params: :queue, :seq, :receipt, :consumer, :error. Owner-checked: the message becomes a
-- dead letter, keeping its delivery count.
UPDATE {table}
   SET state = 'dead',
       visible_at = (julianday('now') - 2440587.5) * 86400.0,
       dead_at = (julianday('now') - 2440587.5) * 86400.0,
       consumer = NULL,
       receipt = NULL,
       last_error = :error
 WHERE seq = :seq AND queue = :queue AND state = 'ready'
   AND receipt = :receipt AND consumer = :consumer;


-- name: renew
-- Params: :queue, :items: a JSON array of [seq, receipt, consumer, visibility] arrays. ONE
-- statement for all of them: each delivery that is still the consumer's and whose visibility
-- has not passed stays hidden for visibility more seconds. A delivery whose visibility passed
-- is never renewed, even if nobody received it since: from then on another consumer may
-- receive it at any moment. -> (seq, receipt, consumer) of every delivery renewed.
UPDATE {table}
   SET visible_at = (julianday('now') - 2440587.5) * 86400.0 + r.visibility
  FROM (SELECT json_extract(value, '$[0]') AS seq,
               json_extract(value, '$[1]') AS receipt,
               json_extract(value, '$[2]') AS consumer,
               json_extract(value, '$[3]') AS visibility
          FROM json_each(:items)) AS r
 WHERE {table}.seq = r.seq AND {table}.queue = :queue AND {table}.state = 'ready'
   AND {table}.receipt = r.receipt AND {table}.consumer = r.consumer
   AND {table}.visible_at > (julianday('now') - 2440587.5) * 86400.0
RETURNING {table}.seq, {table}.receipt, {table}.consumer;


-- name: names
-- Params: :limit. -> the names of the queues with a row in the table, sorted.
SELECT DISTINCT queue FROM {table} ORDER BY queue LIMIT :limit;


-- name: stats
-- Params: :queue. -> (ready, delayed, in_flight, dead), one row. A delivery whose
-- visibility passed counts as ready: it is deliverable again.
SELECT coalesce(sum(state = 'ready'
                    AND visible_at <= (julianday('now') - 2440587.5) * 86400.0), 0),
       coalesce(sum(state = 'ready' AND receipt IS NULL
                    AND visible_at > (julianday('now') - 2440587.5) * 86400.0), 0),
       coalesce(sum(state = 'ready' AND receipt IS NOT NULL
                    AND visible_at > (julianday('now') - 2440587.5) * 86400.0), 0),
       coalesce(sum(state = 'dead'), 0)
  FROM {table}
 WHERE queue = :queue;


-- name: dead_letters
-- Params: :queue, :limit. -> (id, body, headers, delivery, last_error, dead_at), oldest
-- first (an index range scan: a dead row's visible_at is when it died).
SELECT id, body, headers, delivery, last_error, dead_at
  FROM {table}
 WHERE queue = :queue AND state = 'dead'
 ORDER BY visible_at, seq
 LIMIT :limit;


-- name: requeue_dead
-- Params: :queue. Every dead letter of the queue becomes deliverable now, as if just
-- published: delivery count and error cleared (published_at and seq are kept).
UPDATE {table}
   SET state = 'ready',
       delivery = 0,
       visible_at = (julianday('now') - 2440587.5) * 86400.0,
       dead_at = NULL,
       last_error = NULL
 WHERE queue = :queue AND state = 'dead';


-- name: requeue_dead_ids
-- Params: :queue, :ids (a JSON array of message ids). As requeue_dead, for the dead letters
-- with one of those ids.
UPDATE {table}
   SET state = 'ready',
       delivery = 0,
       visible_at = (julianday('now') - 2440587.5) * 86400.0,
       dead_at = NULL,
       last_error = NULL
 WHERE queue = :queue AND state = 'dead'
   AND id IN (SELECT value FROM json_each(:ids));


-- name: purge
-- Params: :queue. Every message of the queue: ready, delayed, in flight and dead.
DELETE FROM {table} WHERE queue = :queue;


-- name: any_left
-- -> (1) if the table still holds a message of any queue, else no row. drop runs it (after
-- purge, in one BEGIN IMMEDIATE transaction) to drop the table once no queue uses it.
SELECT 1 FROM {table} LIMIT 1;


-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_queue_schema WHERE table_name = '{table}';
