-- jobfence outbox, PostgreSQL (schema version 1).
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section: one statement, or several separated by ";".
--     Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 53 characters; default
--     jobfence_outbox), and {table}_pending, {table}_key, {table}_published names made from
--     it. jobfence double-quotes them in lower case. Inside quotes ('{table}') the bare name
--     is written: it is also the LISTEN/NOTIFY channel. Migration tools: fill {table} the
--     same way.
--   * Parameters are named, :name; jobfence converts them for the driver (psycopg
--     %(name)s with a literal percent sign doubled, asyncpg $1, $2..., SQLAlchemy :name,
--     Django %s).
--   * This file is jobfence/backends/postgres/sql/outbox.sql.
--
-- One row per message to publish:
--   seq            insertion order (bigserial): rows are claimed, and a key's rows published,
--                  in this order
--   id             the message id the consumer sees (unique: an id added twice is one row)
--   queue          the destination (a queue name, or a task name for a framework target)
--   ordering_key   NULL, or the key whose rows are published one at a time, in seq order
--   body           the encoded body (compact UTF-8 JSON), as the queue's serializer writes it
--   headers        a JSON object of str -> str in text (NULL: none)
--   created_at     when the row was added (the server's clock)
--   available_at   not claimed before this instant (a delay, or a retry after a failure)
--   attempts       failed publish attempts so far
--   claimed_by     the relay holding the row (host:pid:uuid) until claimed_until; a published
--                  row keeps the relay that published it
--   claimed_until  the end of the hold (NULL: not held)
--   published_at   when it was published (NULL: not yet); kept for the retention
--   dead           gave up after attempts failures (last_error says why)
--
-- States: published (published_at set), dead, claimed (claimed_until in the future),
-- pending (the rest). Every time is clock_timestamp(), the server's clock; the relays'
-- clocks never decide anything.

-- name: schema
-- ONE statement (a DO block), so that it is one transaction even on an autocommit connection.
-- The transaction-scoped advisory lock (key 0x6A6F6266656E6365, "jobfence", shared with the
-- other tables' installs) makes concurrent installs wait for each other. Inside the caller's
-- transaction (outbox.install(conn)) the lock is held until the caller commits.
DO $jobfence$
BEGIN
    PERFORM pg_advisory_xact_lock(7669456882363163493);
    CREATE TABLE IF NOT EXISTS {table} (
        seq           bigserial PRIMARY KEY,
        id            text NOT NULL UNIQUE,
        queue         text NOT NULL,
        ordering_key  text,
        body          bytea NOT NULL,
        headers       text,
        created_at    timestamptz NOT NULL,
        available_at  timestamptz NOT NULL,
        attempts      integer NOT NULL DEFAULT 0,
        claimed_by    text,
        claimed_until timestamptz,
        published_at  timestamptz,
        dead          boolean NOT NULL DEFAULT false,
        last_error    text
    );
    -- the claim reads the rows still to publish in seq order (a partial index: published
    -- and dead rows are not in it)
    CREATE INDEX IF NOT EXISTS {table}_pending ON {table} (seq)
        WHERE published_at IS NULL AND NOT dead;
    -- the key-order test: "an earlier row of this key still to publish"
    CREATE INDEX IF NOT EXISTS {table}_key ON {table} (ordering_key, seq)
        WHERE ordering_key IS NOT NULL AND published_at IS NULL AND NOT dead;
    -- purge: the published rows past their retention
    CREATE INDEX IF NOT EXISTS {table}_published ON {table} (published_at)
        WHERE published_at IS NOT NULL;
    CREATE TABLE IF NOT EXISTS jobfence_outbox_schema (
        table_name text PRIMARY KEY,
        version    integer NOT NULL
    );
    INSERT INTO jobfence_outbox_schema (table_name, version) VALUES ('{table}', 1)
        ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version;
END
$jobfence$;

-- name: schema_version
SELECT version FROM jobfence_outbox_schema WHERE table_name = '{table}';

-- name: add
-- Runs inside the CALLER's transaction; ONE statement. Params: :rows, a JSON array of objects
-- {"id", "queue", "key" (absent: none), "body" (the body's JSON text), "headers" (JSON text;
-- absent: none), "delay" (seconds)}, in the order the rows get their seq. An id already in the
-- table is skipped (ON CONFLICT DO NOTHING). The same statement notifies the relays LISTENing
-- on the channel '{table}'; PostgreSQL delivers the notification when (and only if) the
-- caller's transaction commits. -> one row: (rows inserted).
WITH clock AS (
    SELECT clock_timestamp() AS now
), ins AS (
    INSERT INTO {table} (id, queue, ordering_key, body, headers, created_at, available_at)
    SELECT r.value ->> 'id', r.value ->> 'queue', r.value ->> 'key',
           convert_to(r.value ->> 'body', 'UTF8'), r.value ->> 'headers', clock.now,
           clock.now + CAST(r.value ->> 'delay' AS double precision) * interval '1 second'
      FROM json_array_elements(CAST(:rows AS json)) WITH ORDINALITY AS r(value, n)
     CROSS JOIN clock
     ORDER BY r.n
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT count(*), pg_notify('{table}', '') FROM ins;

-- name: add_one
-- ``add`` for ONE row, in the caller's transaction; the same row, the same skip of an id
-- already in the table and the same notification, without the JSON array: its parameters go
-- straight into the row (nothing to encode twice on the client, nothing to parse on the
-- server). Params: :id, :queue, :key (NULL: none), :body (the body's JSON text), :headers
-- (JSON text; NULL: none), :delay (seconds). -> one row: (rows inserted).
WITH ins AS (
    INSERT INTO {table} (id, queue, ordering_key, body, headers, created_at, available_at)
    VALUES (:id, :queue, :key, convert_to(:body, 'UTF8'), :headers, statement_timestamp(),
            statement_timestamp() + CAST(:delay AS double precision) * interval '1 second')
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT count(*), pg_notify('{table}', '') FROM ins;

-- name: listen
LISTEN {table};

-- name: claim_lock
-- The first statement of a claim's transaction. Params: :lock, a 64-bit hash of the table's
-- name; :idle_ms, the longest the transaction may wait for its client, in milliseconds (the
-- request timeout). Claims of one table run one at a time: the claim that follows, a fresh
-- statement, sees every claim committed before it. For the rest of this transaction only
-- (set_config with is_local):
--   * the planner is asked not to sort and not to use bitmap scans: the claim then walks the
--     rows still to publish in seq order through {table}_pending and stops at :limit,
--     testing the key order of those rows only. Without it, a table whose statistics are
--     not gathered yet (a burst of adds) gets a plan that tests every row to publish and
--     sorts them: measured 153 ms instead of 10 ms for a claim of 100 out of 5,000 rows;
--   * idle_in_transaction_session_timeout is :idle_ms: a relay frozen inside its claim (a
--     stopped process, a paused VM) would hold the lock, and stop every relay of the table,
--     for as long as its connection lives; the server ends such a session after :idle_ms
--     instead, which rolls the claim back and frees the lock.
SELECT pg_advisory_xact_lock(CAST(:lock AS bigint)),
       set_config('enable_sort', 'off', true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('idle_in_transaction_session_timeout', CAST(:idle_ms AS text), true);

-- name: claim
-- The second statement of a claim's transaction (after claim_lock). Params: :relay, :limit,
-- :lease (seconds), :every (true: any queue), :queues text[] (the queues to claim when not
-- :every). Holds for :relay, until now + :lease, the first :limit rows in seq order that are
-- to publish, available and not held by a live relay (in :queues), skipping a row while an
-- earlier row of its key is to publish and is not claimable by this same statement (held
-- elsewhere, delayed, or of another queue): so a key's rows go out in order, one relay at a
-- time. A claimable row's earlier rows of its key are all claimable, hence taken before it.
-- -> one row per row held (any order): (seq, id, queue, ordering_key, body, headers,
-- attempts, created_at epoch).
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), picked AS MATERIALIZED (
    SELECT t.seq
      FROM {table} AS t, clock
     WHERE t.published_at IS NULL AND NOT t.dead
       AND t.available_at <= clock.now
       AND (t.claimed_until IS NULL OR t.claimed_until <= clock.now)
       AND (CAST(:every AS boolean) OR t.queue = ANY(CAST(:queues AS text[])))
       AND (t.ordering_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {table} AS e
             WHERE e.ordering_key = t.ordering_key AND e.seq < t.seq
               AND e.published_at IS NULL AND NOT e.dead
               AND NOT (e.available_at <= clock.now
                        AND (e.claimed_until IS NULL OR e.claimed_until <= clock.now)
                        AND (CAST(:every AS boolean)
                             OR e.queue = ANY(CAST(:queues AS text[]))))))
     ORDER BY t.seq
     LIMIT :limit
)
UPDATE {table} AS t
   SET claimed_by = :relay,
       claimed_until = clock.now + CAST(:lease AS double precision) * interval '1 second'
  FROM clock
 -- the seqs as one array, not a join: a join with picked gets, in the generic plan a
 -- prepared claim uses after a few runs, a nested loop over every row still to publish
 -- (measured 340-560 ms per claim with 10,000 rows to publish; the array: 2-12 ms)
 WHERE t.seq = ANY(ARRAY(SELECT picked.seq FROM picked))
   -- checked again on the row as it is when the UPDATE locks it (a relay whose hold ran out
   -- may have marked it published meanwhile)
   AND t.published_at IS NULL AND NOT t.dead
   AND (t.claimed_until IS NULL OR t.claimed_until <= clock.now)
RETURNING t.seq, t.id, t.queue, t.ordering_key, t.body, t.headers, t.attempts,
          CAST(extract(epoch FROM t.created_at) AS double precision);

-- name: published
-- Params: :relay, :seqs bigint[]. Marks published the rows of :seqs that :relay holds (its
-- hold may have run out, as long as no other relay claimed the row since: it was sent).
-- -> the count of rows marked.
UPDATE {table}
   SET published_at = clock_timestamp(), claimed_until = NULL
 WHERE seq = ANY(CAST(:seqs AS bigint[])) AND claimed_by = :relay
   AND claimed_until IS NOT NULL AND published_at IS NULL AND NOT dead;

-- name: published_delete
-- ``published`` with a retention of 0: the rows are deleted at once. Params: as published.
DELETE FROM {table}
 WHERE seq = ANY(CAST(:seqs AS bigint[])) AND claimed_by = :relay
   AND claimed_until IS NOT NULL AND published_at IS NULL AND NOT dead;

-- name: failed
-- Params: :relay, :seq, :error, :retry_in (seconds; NULL: dead). A failed publish of a row
-- :relay holds: attempts + 1, last_error, pending again after :retry_in or dead.
UPDATE {table}
   SET attempts = attempts + 1,
       last_error = :error,
       dead = (CAST(:retry_in AS double precision) IS NULL),
       available_at = CASE WHEN CAST(:retry_in AS double precision) IS NULL THEN available_at
                           ELSE clock_timestamp()
                                + CAST(:retry_in AS double precision) * interval '1 second'
                      END,
       claimed_by = NULL, claimed_until = NULL
 WHERE seq = :seq AND claimed_by = :relay AND claimed_until > clock_timestamp()
   AND published_at IS NULL AND NOT dead;

-- name: release
-- Params: :relay, :seqs bigint[], :retry_in (seconds). Gives back the rows of :seqs that
-- :relay holds, without counting an attempt: available again after :retry_in.
UPDATE {table}
   SET available_at = clock_timestamp() + CAST(:retry_in AS double precision) * interval '1 second',
       claimed_by = NULL, claimed_until = NULL
 WHERE seq = ANY(CAST(:seqs AS bigint[])) AND claimed_by = :relay
   AND claimed_until > clock_timestamp() AND published_at IS NULL AND NOT dead;

-- name: extend
-- Params: :relay, :seqs bigint[], :lease (seconds). Holds the rows of :seqs that :relay
-- still holds until now + :lease. A hold that ran out is never extended: another relay may
-- have claimed the row.
UPDATE {table}
   SET claimed_until = clock_timestamp() + CAST(:lease AS double precision) * interval '1 second'
 WHERE seq = ANY(CAST(:seqs AS bigint[])) AND claimed_by = :relay
   AND claimed_until > clock_timestamp() AND published_at IS NULL AND NOT dead;

-- name: entries
-- Params: :state (NULL: every state), :queue (NULL: every queue), :after (seq; 0: from the
-- start), :limit. Read-only. -> (seq, id, queue, ordering_key, state, attempts, created_at,
-- available_at, claimed_by, claimed_until, published_at, last_error, body, headers), times
-- as epoch seconds, in seq order.
SELECT seq, id, queue, ordering_key, state, attempts,
       CAST(extract(epoch FROM created_at) AS double precision),
       CAST(extract(epoch FROM available_at) AS double precision),
       claimed_by,
       CAST(extract(epoch FROM claimed_until) AS double precision),
       CAST(extract(epoch FROM published_at) AS double precision),
       last_error, body, headers
  FROM (SELECT t.*,
               CASE WHEN t.published_at IS NOT NULL THEN 'published'
                    WHEN t.dead THEN 'dead'
                    WHEN t.claimed_until > clock_timestamp() THEN 'claimed'
                    ELSE 'pending' END AS state
          FROM {table} AS t
         WHERE t.seq > :after
           AND (CAST(:queue AS text) IS NULL OR t.queue = CAST(:queue AS text))) AS s
 WHERE CAST(:state AS text) IS NULL OR s.state = CAST(:state AS text)
 ORDER BY seq
 LIMIT :limit;

-- name: stats
-- Read-only. -> one row: (pending, claimed, published, dead, age in seconds of the oldest
-- row still to publish, or NULL).
SELECT count(*) FILTER (WHERE published_at IS NULL AND NOT dead
                          AND (claimed_until IS NULL OR claimed_until <= clock_timestamp())),
       count(*) FILTER (WHERE published_at IS NULL AND NOT dead
                          AND claimed_until > clock_timestamp()),
       count(*) FILTER (WHERE published_at IS NOT NULL),
       count(*) FILTER (WHERE published_at IS NULL AND dead),
       CAST(extract(epoch FROM clock_timestamp()
                    - min(created_at) FILTER (WHERE published_at IS NULL AND NOT dead))
            AS double precision)
  FROM {table};

-- name: retry_dead
-- Params: :every (true: every dead row), :ids text[] (the ids when not :every). Makes the
-- dead rows pending again at once with their attempts reset (last_error kept), and wakes
-- the relays. -> one row: (rows made pending).
WITH revived AS (
    UPDATE {table}
       SET dead = false, attempts = 0, available_at = clock_timestamp(),
           claimed_by = NULL, claimed_until = NULL
     WHERE dead AND published_at IS NULL
       AND (CAST(:every AS boolean) OR id = ANY(CAST(:ids AS text[])))
    RETURNING 1
)
SELECT count(*), pg_notify('{table}', '') FROM revived;

-- name: purge
-- Params: :retention (seconds). Deletes the rows published more than :retention ago.
DELETE FROM {table}
 WHERE published_at IS NOT NULL
   AND published_at <= clock_timestamp()
                       - CAST(:retention AS double precision) * interval '1 second';

-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_outbox_schema WHERE table_name = '{table}';
