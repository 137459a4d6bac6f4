-- jobfence queue, PostgreSQL (schema version 1). Needs PostgreSQL 13+ (gen_random_uuid).
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section: one statement, or several separated by ";".
--     Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 58 characters; default
--     jobfence_queue), and {table}_next one name made from it. jobfence lower-cases the name
--     and double-quotes it. Inside quotes ('{table}') the bare name is written. Migration
--     tools: fill {table} the same way.
--   * {channel} (only in "listen") is the queue's LISTEN/NOTIFY channel, double-quoted:
--     "<table>.<queue name>", or, when that is longer than 63 characters,
--     "<table>.#<hex of the BLAKE2b digest of the queue name>" cut to 63 characters; the
--     statements that notify take it as the parameter :channel. One channel per queue: a
--     client is sent the notifications of its own queue only, however many queues share
--     the table. The payload is the queue name (a client ignores any other).
--   * Parameters are named, :name; jobfence converts them for the driver (psycopg
--     %(name)s with a literal percent sign doubled).
--   * This file is jobfence/backends/postgres/sql/queue.sql; the locks, the inbox and the
--     fencing table have their own files beside it (locks.sql, inbox.sql, fence.sql).
--
-- One table holds the messages of every queue (column "queue"), one row per message:
--   seq          publish order (a bigserial), and the row's handle in a receipt
--   queue, id    the queue's name; the message id given at publish time (not unique)
--   body         the message body
--   headers      the headers as a JSON object in text (NULL: none); text, not jsonb,
--                because jsonb cannot hold the character U+0000
--   state        'ready' (waiting, delayed or delivered) | 'dead' (a dead letter)
--   delivery     how many times it was delivered (0 before the first delivery)
--   visible_at   ready: when it may be delivered (again): the publish time plus the delay,
--                the end of a delivery's visibility, or the end of a nack's delay;
--                dead: when it died (the same instant as dead_at), so that one index
--                serves both states in order
--   consumer     the owner of the current (or last) delivery; NULL when none
--   receipt      a new random value per delivery; NULL after a nack, before the first
--                delivery and for a dead letter. A receipt handed out is "<seq>.<receipt>".
--   published_at, last_error, dead_at
--
-- A delivered message stays 'ready' with visible_at in the future: once that passes, the row
-- is deliverable again (redelivery after the visibility, delivery + 1), whether its consumer
-- is slow, paused or dead. "Delayed" is a ready row with visible_at in the future and no
-- receipt; "in flight" one with a receipt.
--
-- Every statement that makes a message deliverable sooner than waiting consumers may expect
-- (publish, nack, requeue_dead) notifies the queue's channel with the queue name as payload,
-- in the same statement; the notification is sent when it commits.

-- name: schema
-- ONE statement (a DO block), so that it is one transaction even on an autocommit connection.
-- The transaction-scoped advisory lock (key 0x6A6F6266656E6365, "jobfence", the inbox's)
-- makes concurrent installs wait for each other: CREATE TABLE IF NOT EXISTS alone is not
-- safe against a concurrent CREATE (it fails on pg_type's unique index).
DO $jobfence$
BEGIN
    PERFORM pg_advisory_xact_lock(7669456882363163493);
    CREATE TABLE IF NOT EXISTS {table} (
        seq          bigserial PRIMARY KEY,
        queue        text NOT NULL,
        id           text NOT NULL,
        body         bytea NOT NULL,
        headers      text,
        state        text NOT NULL DEFAULT 'ready',
        delivery     integer NOT NULL DEFAULT 0,
        visible_at   timestamptz NOT NULL,
        consumer     text,
        receipt      uuid,
        published_at timestamptz NOT NULL,
        last_error   text,
        dead_at      timestamptz
    );
    -- One index for every statement of a queue: "the next ready messages in order" is an
    -- equality on (queue, state) and a range on visible_at, read in (visible_at, seq) order
    -- and stopped by the LIMIT; dead letters are read oldest first by the same index; stats,
    -- purge and requeue_dead find the queue's rows by its prefix.
    CREATE INDEX IF NOT EXISTS {table}_next ON {table} (queue, state, visible_at, seq);
    CREATE TABLE IF NOT EXISTS jobfence_queue_schema (
        table_name text PRIMARY KEY,
        version    integer NOT NULL
    );
    INSERT INTO jobfence_queue_schema (table_name, version) VALUES ('{table}', 1)
        ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version;
END
$jobfence$;

-- name: schema_version
SELECT version FROM jobfence_queue_schema WHERE table_name = '{table}';

-- name: publish
-- ONE statement for the whole batch. Params: :queue, :channel; :ids text[], :bodies
-- bytea[], :headers text[] (NULL elements: no headers), three arrays of the same length, in
-- publish order; :delay (seconds). Every message of the batch gets the same visible_at,
-- and seq follows the arrays' order, so (visible_at, seq) keeps the batch in order. The
-- waiting consumers of the queue are notified (also for a delay: one may be sleeping until
-- a later instant). -> one row: (messages inserted, notifications).
WITH inserted AS (
    INSERT INTO {table} (queue, id, body, headers, visible_at, published_at)
    SELECT :queue, m.id, m.body, m.headers,
           clock.now + CAST(:delay AS double precision) * interval '1 second', clock.now
      FROM unnest(CAST(:ids AS text[]), CAST(:bodies AS bytea[]), CAST(:headers AS text[]))
           WITH ORDINALITY AS m(id, body, headers, n)
     CROSS JOIN (SELECT clock_timestamp() AS now) AS clock
     ORDER BY m.n
    RETURNING 1
), woken AS (
    SELECT pg_notify(:channel, :queue)
)
SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM woken);

-- name: receive
-- ONE statement. Params: :queue, :n (at most this many), :visibility (seconds), :consumer.
-- Takes the first :n deliverable messages in (visible_at, seq) order, skipping rows that
-- another receive has locked at this instant (FOR UPDATE SKIP LOCKED: concurrent consumers
-- never wait for each other and never get the same row), and hands each a new delivery:
-- delivery + 1, a new receipt, hidden until now + :visibility.
-- -> one row per message taken, in order: (seq, id, body, headers, delivery, receipt,
-- published_at epoch, last_error, NULL, due). When none was taken: ONE row of NULLs whose
-- ninth column is the number of seconds until the queue's next ready row becomes deliverable
-- (NULL: the queue holds none), so that a waiting consumer knows when to look again without
-- polling.
WITH picked AS MATERIALIZED (
    SELECT seq, visible_at AS due
      FROM {table}
     WHERE queue = :queue AND state = 'ready' AND visible_at <= (SELECT clock_timestamp())
     ORDER BY visible_at, seq
     LIMIT :n
       FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE {table} AS t
       SET delivery = t.delivery + 1,
           visible_at = clock_timestamp()
                        + CAST(:visibility AS double precision) * interval '1 second',
           consumer = :consumer,
           receipt = gen_random_uuid()
      FROM picked
     WHERE t.seq = picked.seq
    RETURNING picked.due, t.seq, t.id, t.body, t.headers, t.delivery, t.receipt,
              t.published_at, t.last_error
)
SELECT seq, id, body, headers, delivery, receipt,
       CAST(extract(epoch FROM published_at) AS double precision), last_error,
       CAST(NULL AS double precision), due
  FROM taken
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       CAST(extract(epoch FROM (SELECT min(visible_at) FROM {table}
                                 WHERE queue = :queue AND state = 'ready')
                               - clock_timestamp()) AS double precision),
       NULL
 WHERE NOT EXISTS (SELECT 1 FROM taken)
 ORDER BY 10, 1;

-- name: ack
-- Params: :queue, :seq, :receipt (uuid), :consumer. Owner-checked by the delivery's
-- receipt: a delivery whose visibility passed may still be acked while nobody received the
-- message again (the receipt is still this delivery's); once it was delivered again, or
-- nacked, the receipt is another one and nothing is deleted. A receipt is only good on its
-- own queue. -> rowcount 1 or 0.
DELETE FROM {table}
 WHERE seq = :seq AND receipt = CAST(:receipt AS uuid) AND consumer = :consumer
   AND queue = :queue AND state = 'ready';

-- name: ack_many
-- Params: :queue; :seqs bigint[], :receipts uuid[], :consumers text[], three arrays of the
-- same length. ONE statement acks every delivery an item names, owner-checked as ``ack``.
-- -> one row per item, in item order: (item number, acked bool).
WITH item AS (
    SELECT *
      FROM unnest(CAST(:seqs AS bigint[]), CAST(:receipts AS uuid[]),
                  CAST(:consumers AS text[]))
           WITH ORDINALITY AS i(seq, receipt, consumer, n)
), acked AS (
    -- Each row is found by its primary key (seq = ANY): the queue and state are compared
    -- with IS NOT DISTINCT FROM, which no index serves, so that a planner with stale
    -- statistics (a queue table fills and empties fast) cannot walk the whole queue instead.
    DELETE FROM {table} AS t
     USING item
     WHERE t.seq = ANY (CAST(:seqs AS bigint[]))
       AND t.seq = item.seq AND t.receipt = item.receipt AND t.consumer = item.consumer
       AND t.queue IS NOT DISTINCT FROM CAST(:queue AS text)
       AND t.state IS NOT DISTINCT FROM 'ready'
    RETURNING item.n
)
SELECT item.n, acked.n IS NOT NULL
  FROM item LEFT JOIN acked ON acked.n = item.n
 ORDER BY item.n;

-- name: nack
-- Params: :queue, :channel, :seq, :receipt, :consumer, :delay (seconds), :error (or NULL).
-- Owner-checked as ack. Gives the message back, deliverable again after :delay (its next
-- delivery counts + 1), and notifies the queue's waiting consumers. -> one row if it was
-- nacked, else none.
UPDATE {table}
   SET visible_at = clock_timestamp() + CAST(:delay AS double precision) * interval '1 second',
       receipt = NULL, consumer = NULL, last_error = :error
 WHERE seq = :seq AND receipt = CAST(:receipt AS uuid) AND consumer = :consumer
   AND queue = :queue AND state = 'ready'
RETURNING pg_notify(:channel, queue);

-- name: defer
-- Params: :queue, :channel, :seq, :receipt, :consumer, :delay (seconds). Owner-checked as
-- ack. Gives the message back, deliverable again after :delay, WITHOUT counting this
-- delivery (its next delivery has the same number) and keeping last_error: a "not now"
-- refusal, the handler did not run. Notifies the queue's waiting consumers. -> one row if it
-- was deferred, else none.
UPDATE {table}
   SET visible_at = clock_timestamp() + CAST(:delay AS double precision) * interval '1 second',
       receipt = NULL, consumer = NULL, delivery = greatest(delivery - 1, 0)
 WHERE seq = :seq AND receipt = CAST(:receipt AS uuid) AND consumer = :consumer
   AND queue = :queue AND state = 'ready'
RETURNING pg_notify(:channel, queue);

-- name: renew
-- Params: :queue; :seqs bigint[], :receipts uuid[], :consumers text[], :visibilities
-- float8[] (seconds), four arrays of the same length. ONE statement keeps every delivery
-- an item names hidden for its visibility more, if it is still the consumer's AND its
-- visibility has not passed (a delivery past its visibility may already be on its way to
-- someone else).
-- -> one row per item, in item order: (item number, renewed bool).
WITH item AS (
    SELECT *
      FROM unnest(CAST(:seqs AS bigint[]), CAST(:receipts AS uuid[]),
                  CAST(:consumers AS text[]), CAST(:visibilities AS double precision[]))
           WITH ORDINALITY AS i(seq, receipt, consumer, visibility, n)
), renewed AS (
    UPDATE {table} AS t
       SET visible_at = clock_timestamp() + item.visibility * interval '1 second'
      FROM item
     WHERE t.seq = ANY (CAST(:seqs AS bigint[]))
       AND t.seq = item.seq AND t.receipt = item.receipt AND t.consumer = item.consumer
       -- by primary key only (see ack_many)
       AND t.queue IS NOT DISTINCT FROM CAST(:queue AS text)
       AND t.state IS NOT DISTINCT FROM 'ready' AND t.visible_at > clock_timestamp()
    RETURNING item.n
)
SELECT item.n, renewed.n IS NOT NULL
  FROM item LEFT JOIN renewed ON renewed.n = item.n
 ORDER BY item.n;

-- name: dead_letter
-- Params: :queue, :seq, :receipt, :consumer, :error (or NULL). Owner-checked as ack. The
-- dead letter keeps its delivery count; visible_at becomes its time of death (see the top).
UPDATE {table}
   SET state = 'dead', last_error = :error, dead_at = clock.now, visible_at = clock.now,
       receipt = NULL, consumer = NULL
  FROM (SELECT clock_timestamp() AS now) AS clock
 WHERE seq = :seq AND receipt = CAST(:receipt AS uuid) AND consumer = :consumer
   AND queue = :queue AND state = 'ready';

-- name: dead_letters
-- Params: :queue, :limit. Oldest first. -> (id, body, headers, delivery, last_error,
-- dead_at epoch).
SELECT id, body, headers, delivery, last_error,
       CAST(extract(epoch FROM dead_at) AS double precision)
  FROM {table}
 WHERE queue = :queue AND state = 'dead'
 ORDER BY visible_at, seq
 LIMIT :limit;

-- name: requeue_dead
-- Params: :queue, :channel, :every (boolean: all dead letters), :ids text[] (when not
-- :every). They become ready at once with delivery 0 (the next delivery is 1), in their
-- publish order, and keep their last_error. -> one row: (how many, notified count).
WITH requeued AS (
    UPDATE {table}
       SET state = 'ready', delivery = 0, visible_at = clock.now, dead_at = NULL,
           receipt = NULL, consumer = NULL
      FROM (SELECT clock_timestamp() AS now) AS clock
     WHERE queue = :queue AND state = 'dead'
       AND (CAST(:every AS boolean) OR id = ANY(CAST(:ids AS text[])))
    RETURNING 1
), woken AS (
    SELECT pg_notify(:channel, :queue) FROM (SELECT 1 FROM requeued LIMIT 1) AS one
)
SELECT (SELECT count(*) FROM requeued), (SELECT count(*) FROM woken);

-- name: names
-- Params: :limit. -> the names of the queues with a row in the table, sorted.
SELECT DISTINCT queue FROM {table} ORDER BY queue LIMIT :limit;


-- name: stats
-- Params: :queue. One pass over the queue's rows, at one instant. -> one row: (ready,
-- delayed, in_flight, dead).
SELECT count(*) FILTER (WHERE q.state = 'ready' AND q.visible_at <= clock.now),
       count(*) FILTER (WHERE q.state = 'ready' AND q.visible_at > clock.now
                          AND q.receipt IS NULL),
       count(*) FILTER (WHERE q.state = 'ready' AND q.visible_at > clock.now
                          AND q.receipt IS NOT NULL),
       count(*) FILTER (WHERE q.state = 'dead')
  FROM {table} AS q CROSS JOIN (SELECT clock_timestamp() AS now) AS clock
 WHERE q.queue = :queue;

-- name: purge
-- Params: :queue. Every message of the queue, in every state. -> rowcount.
DELETE FROM {table} WHERE queue = :queue;

-- name: drop_table
-- No parameters (a DO block cannot take any); run after purge. Drops the table and its
-- schema row if no queue has messages in it any more: under the install lock and an ACCESS
-- EXCLUSIVE lock on the table, so that no message published meanwhile is dropped with it.
-- The table lock is waited for at most 1 s (every statement on the table queues behind a
-- waiting ACCESS EXCLUSIVE request); if it is busy for longer, the empty table is left.
DO $jobfence$
BEGIN
    PERFORM pg_advisory_xact_lock(7669456882363163493);
    IF to_regclass('"{table}"') IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', '1s', true);
    BEGIN
        LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE;
    EXCEPTION WHEN lock_not_available THEN
        RETURN;
    END;
    IF NOT EXISTS (SELECT 1 FROM {table}) THEN
        DROP TABLE {table};
        IF to_regclass('jobfence_queue_schema') IS NOT NULL THEN
            DELETE FROM jobfence_queue_schema WHERE table_name = '{table}';
        END IF;
    END IF;
END
$jobfence$;

-- name: listen
-- On the dedicated listener connection of a client that waits in receive.
LISTEN {channel};
