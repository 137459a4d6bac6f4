-- PostgreSQL lock backend (postgresql://...): schema and statements.
--
-- Loaded by jobfence/backends/postgres/locks_async.py (and its generated twin locks.py) through
-- jobfence/_core/sqlfiles.py, whose conventions hold for every shipped .sql file:
--   * "-- name: <section>" starts a section: one statement, or a script of statements separated
--     by ";" (schema). Comments are removed before a statement is sent.
--   * {namespace}_locks is ONE table name: the client's namespace (validated as an SQL
--     identifier of at most 51 characters, see docs/how-to/backends/postgres.md) followed by the
--     suffix, double-quoted (so the namespace's case is kept). Inside quotes
--     ('{namespace}_locks') the bare name is written. {schema_key} is an integer.
--   * Parameters are named, :name; jobfence converts them for the driver (psycopg: %(name)s).
--     "::" is a cast, never a parameter.
--
-- Time: every expiry is measured by ONE clock, the PostgreSQL server's clock_timestamp()
-- (the real time at each call, not the start of the transaction). Client clocks are never
-- written into these tables.
--
-- Transactions: every statement except "schema" runs as ONE autocommit statement, so the
-- default (lease) mode works behind PgBouncer in transaction pooling mode. Session mode
-- ("session_*" sections) keeps each held lock on its own dedicated connection.
--
-- Fencing tokens: a per-name counter row in {namespace}_lock_tokens that outlives every lease.
-- Each grant sets it to greatest(previous + 1, server time in microseconds since the epoch):
-- always strictly increasing, and -- because grants of one name are serialised and take far
-- longer than a microsecond -- never ahead of the server clock by more than a few units. So a
-- counter row that goes missing (first use of a name, a dropped table) or loses its last
-- updates (a crash with synchronous_commit=off, a failover to a lagging replica) resumes above
-- every token handed out before, as long as the server clock did not step back by more than
-- the outage lasted.


-- name: schema
-- Idempotent; run as ONE simple-protocol script, i.e. one implicit transaction. The
-- transaction-scoped advisory lock ({schema_key} is replaced by a 64-bit key derived from the
-- namespace) makes concurrent first uses wait for each other instead of racing on the
-- catalogue (CREATE TABLE IF NOT EXISTS is not safe against a concurrent CREATE).
SELECT pg_advisory_xact_lock({schema_key});
-- A lease: at most one row per name. A row whose expires_at <= clock_timestamp() is free.
CREATE TABLE IF NOT EXISTS {namespace}_locks (
    name        text PRIMARY KEY,        -- the lock name, any text (bound, never spliced)
    owner       text NOT NULL,           -- the holder's owner id (host:pid:uuid)
    token       bigint NOT NULL,         -- the fencing token handed out with this lease
    expires_at  timestamptz NOT NULL     -- server clock
);
-- The fencing-token counter of each name (one row per name ever locked; never deleted).
CREATE TABLE IF NOT EXISTS {namespace}_lock_tokens (
    name   text PRIMARY KEY,
    token  bigint NOT NULL               -- the last token handed out for name
);
-- Lease mode's FIFO wait queue: one row per waiting owner. A waiter refreshes its deadline on
-- every attempt; past it the row is dead (the waiter crashed or gave up) and is skipped.
CREATE TABLE IF NOT EXISTS {namespace}_lock_queue (
    name      text NOT NULL,
    owner     text NOT NULL,
    seq       bigint NOT NULL,          -- arrival: server time in microseconds (kept while
                                        -- the waiter refreshes; ties go by owner)
    deadline  timestamptz NOT NULL,     -- server clock
    ttl       float8 NOT NULL,          -- seconds: the lease it asked for
    PRIMARY KEY (name, owner)
);
CREATE INDEX IF NOT EXISTS {namespace}_lock_queue_order
    ON {namespace}_lock_queue (name, seq, owner);
-- One row per jobfence component that keeps tables under this prefix.
CREATE TABLE IF NOT EXISTS {namespace}_schema (
    component  text PRIMARY KEY,
    version    integer NOT NULL
);
INSERT INTO {namespace}_schema (component, version) VALUES ('locks', 1)
    ON CONFLICT (component) DO NOTHING;


-- name: schema_version
-- -> (version) of the locks tables, one row.
SELECT version FROM {namespace}_schema WHERE component = 'locks';


-- name: acquire
-- Lease mode. Params: :name, :owner, :ttl (seconds, float), :wait (NULL for a
-- plain try, which never queues; else seconds the caller may wait), :slack (seconds).
-- ONE statement: look at the current row and the head of the live queue; only if no live
-- lease exists and nobody else heads the queue (fairness: a free lease goes to the head, not
-- to a newcomer), bump the name's counter and insert/take over the row (ON CONFLICT re-checks
-- expiry against the newest row version, so of two clients racing for an expired lease
-- exactly one wins; the loser only leaves a gap in the token sequence). A waiting caller that
-- is not granted joins the tail of the queue, or refreshes its entry's deadline (keeping its
-- place); a granted one leaves the queue. The counter row is locked before the lease row by
-- every statement that touches both, so two statements cannot deadlock. Only a grant is a
-- durable commit (see "relaxed").
-- -> rows (token, seconds_left, queued): at most one of
--      (token, NULL, ...)  the lease was granted to :owner (or it already held it: handed
--                          off);
--      (NULL, left, ...)   another owner holds it for `left` more seconds;
--    and no such row when the lease is free but another waiter heads the queue, or someone
--    else won a race for a free/expired lease just now; plus one (NULL, NULL, true) row when
--    this call added a NEW queue entry. A waiter whose entry was new on a later attempt had
--    it removed by a release that handed it the lease while this statement ran: it removes
--    the fresh entry when it takes the lease (see cancel_wait), else a later release would
--    hand the lease to an owner nobody waits for.
WITH cur AS MATERIALIZED (
    SELECT owner, token, expires_at, expires_at > clock_timestamp() AS live
      FROM {namespace}_locks
     WHERE name = :name
), head AS MATERIALIZED (
    SELECT owner
      FROM {namespace}_lock_queue
     WHERE name = :name AND deadline > clock_timestamp()
     ORDER BY seq, owner
     LIMIT 1
), free AS MATERIALIZED (
    SELECT 1 AS yes
     WHERE NOT EXISTS (SELECT 1 FROM cur WHERE live)
       AND NOT EXISTS (SELECT 1 FROM head WHERE owner <> :owner)
), bumped AS (
    INSERT INTO {namespace}_lock_tokens AS t (name, token)
    SELECT :name, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
      FROM free
    ON CONFLICT (name) DO UPDATE SET token = greatest(t.token + 1, excluded.token)
    RETURNING t.token
), granted AS (
    INSERT INTO {namespace}_locks AS l (name, owner, token, expires_at)
    SELECT :name, :owner, bumped.token,
           clock_timestamp() + :ttl * interval '1 second'
      FROM bumped
    ON CONFLICT (name) DO UPDATE
       SET owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at
     WHERE l.expires_at <= clock_timestamp() OR l.owner = excluded.owner
    RETURNING l.token
), dequeued AS (
    DELETE FROM {namespace}_lock_queue
     WHERE name = :name AND owner = :owner
       AND (EXISTS (SELECT 1 FROM granted)
            OR EXISTS (SELECT 1 FROM cur WHERE live AND owner = :owner))
    RETURNING 1
), queued AS (
    INSERT INTO {namespace}_lock_queue AS q (name, owner, seq, deadline, ttl)
    SELECT :name, :owner, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
           clock_timestamp() + (:wait::float8 + :slack::float8) * interval '1 second',
           :ttl
     WHERE :wait::float8 IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM granted)
       AND NOT EXISTS (SELECT 1 FROM cur WHERE live AND owner = :owner)
    ON CONFLICT (name, owner) DO UPDATE
       SET deadline = excluded.deadline, ttl = excluded.ttl
    RETURNING (q.xmax = 0) AS inserted  -- a new entry (not a refreshed one)
), relaxed AS MATERIALIZED (
    -- not granted: nothing worth a disk flush was written (a queue entry, at most a counter
    -- bump that lost a race, which the counter's time floor covers), so do not wait for one
    SELECT set_config('synchronous_commit', 'off', true) AS setting
     WHERE NOT EXISTS (SELECT 1 FROM granted)
)
SELECT token, NULL::float8, NULL::boolean FROM granted
UNION ALL
SELECT CASE WHEN owner = :owner THEN token END,
       extract(epoch FROM expires_at - clock_timestamp())::float8, NULL
  FROM cur
 WHERE live
UNION ALL
SELECT NULL, NULL, true FROM queued WHERE inserted
UNION ALL
SELECT NULL, NULL, NULL FROM relaxed WHERE setting IS NULL;  -- no row; evaluates "relaxed"


-- name: release
-- Lease mode. Params: :name, :owner. Owner-checked. With a live waiter queued, the
-- lease goes straight to the head of the queue (a new token, the ttl it asked for) and only
-- that waiter is notified, with its token, so it owns the lease when it wakes (FIFO
-- hand-off). The hand-off happens only if this statement itself deletes the head's queue
-- row: a waiter that has just left the queue (cancel_wait: timeout, cancellation) is never
-- handed a lease nobody would use; then the lease is freed and the other waiters are told
-- to look again. Otherwise the row is deleted, even if it has expired (nobody took it over,
-- so it is ours to clean up). Queue rows whose deadline passed (crashed waiters) are swept.
-- Lock order: the counter row, then the queue row, then the lease row (acquire also takes
-- the counter row first, so the two cannot deadlock). Only a LIVE lease counts as released.
-- Notifications are delivered when this statement's transaction commits. A release without
-- hand-off does not wait for the WAL flush (synchronous_commit=off for this transaction
-- only): a release lost in a server crash leaves the lease to expire, which is safe; a
-- hand-off is a grant, and waits for it.
-- Payloads: "h\n<owner>\n<token>\n<name>" for a hand-off (owner ids hold no newline),
-- "w\n<name>" for "every waiter of <name>: look again".
-- -> (released bool, handed-to owner or NULL, count of side effects), one row.
WITH mine AS MATERIALIZED (
    SELECT expires_at > clock_timestamp() AS live
      FROM {namespace}_locks
     WHERE name = :name AND owner = :owner
), head AS MATERIALIZED (
    SELECT q.owner, q.ttl
      FROM {namespace}_lock_queue AS q
     WHERE q.name = :name AND q.deadline > clock_timestamp()
       AND EXISTS (SELECT 1 FROM mine)
     ORDER BY q.seq, q.owner
     LIMIT 1
), bumped AS (
    INSERT INTO {namespace}_lock_tokens AS t (name, token)
    SELECT :name, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
      FROM head
    ON CONFLICT (name) DO UPDATE SET token = greatest(t.token + 1, excluded.token)
    RETURNING t.token
), dequeued AS (
    DELETE FROM {namespace}_lock_queue AS q
     USING head, bumped
     WHERE q.name = :name AND q.owner = head.owner
    RETURNING q.owner, q.ttl, bumped.token
), handed AS (
    UPDATE {namespace}_locks AS l
       SET owner = dequeued.owner, token = dequeued.token,
           expires_at = clock_timestamp() + dequeued.ttl * interval '1 second'
      FROM dequeued
     WHERE l.name = :name AND l.owner = :owner
    RETURNING l.owner, l.token
), gone AS (
    DELETE FROM {namespace}_locks
     WHERE name = :name AND owner = :owner
       AND NOT EXISTS (SELECT 1 FROM dequeued)
    RETURNING name
), swept AS (
    DELETE FROM {namespace}_lock_queue
     WHERE name = :name AND deadline <= clock_timestamp()
       AND EXISTS (SELECT 1 FROM mine)
       AND owner NOT IN (SELECT owner FROM head)
    RETURNING 1
), woken AS (
    SELECT pg_notify('{namespace}_locks',
                     'h' || E'\n' || handed.owner || E'\n' || handed.token || E'\n' || :name)
      FROM handed
), others AS (
    -- the head left the queue as we released: the next waiters must not wait for a poll
    SELECT pg_notify('{namespace}_locks', 'w' || E'\n' || :name)
      FROM gone
     WHERE EXISTS (SELECT 1 FROM head)
), relaxed AS (
    SELECT set_config('synchronous_commit', 'off', true) FROM gone LIMIT 1
)
SELECT coalesce((SELECT bool_or(live) FROM mine), false)
         AND (EXISTS (SELECT 1 FROM handed) OR EXISTS (SELECT 1 FROM gone)),
       (SELECT owner FROM handed),
       (SELECT count(*) FROM relaxed) + (SELECT count(*) FROM woken)
         + (SELECT count(*) FROM others) + (SELECT count(*) FROM swept);


-- name: cancel_wait
-- Lease mode. Params: :name, :owner. Leave the queue. Run "handed" right after it, in
-- a statement of its own (a fresh snapshot): a release that was handing us the lease while
-- this ran has committed by then, and the caller keeps that lease.
DELETE FROM {namespace}_lock_queue WHERE name = :name AND owner = :owner;


-- name: handed
-- Lease mode. Params: :name, :owner. -> (token) of :owner's live lease, or no row.
SELECT token FROM {namespace}_locks
 WHERE name = :name AND owner = :owner AND expires_at > clock_timestamp();


-- name: extend
-- Lease mode. Params: :name, :owner, :ttl (seconds). Owner-checked; an expired
-- lease cannot be extended (someone else may have seen it free). Changes one row on success.
UPDATE {namespace}_locks
   SET expires_at = clock_timestamp() + :ttl * interval '1 second'
 WHERE name = :name
   AND owner = :owner
   AND expires_at > clock_timestamp();


-- name: renew
-- Lease mode. Params: :names text[], :owners text[], :ttls float8[] (seconds), three
-- arrays of the same length. ONE statement extends every live lease an item names.
-- -> one row per item, in item order: (item number, renewed bool).
WITH item AS (
    SELECT *
      FROM unnest(:names::text[], :owners::text[], :ttls::float8[])
           WITH ORDINALITY AS i(name, owner, ttl, n)
), renewed AS (
    UPDATE {namespace}_locks AS l
       SET expires_at = clock_timestamp() + item.ttl * interval '1 second'
      FROM item
     WHERE l.name = item.name
       AND l.owner = item.owner
       AND l.expires_at > clock_timestamp()
    RETURNING item.n
)
SELECT item.n, renewed.n IS NOT NULL
  FROM item LEFT JOIN renewed ON renewed.n = item.n
 ORDER BY item.n;


-- name: holder
-- Lease mode. Params: :name. Read-only.
-- -> (owner, token, seconds_left) of the live lease, or no row.
SELECT owner, token, extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM {namespace}_locks
 WHERE name = :name AND expires_at > clock_timestamp();


-- name: holders
-- Lease mode. Params: :prefix, :escaped (the stored prefix of escaped names, see
-- common.pg_text), :mark (the escape mark), :limit. Read-only. -> (name, owner, token,
-- seconds_left) of the live leases whose names start with the prefix, at most :limit rows,
-- ordered by the names' UTF-8 bytes (code point order; an escaped name by its decoded bytes).
SELECT name, owner, token, extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM {namespace}_locks
 WHERE (starts_with(name, :prefix) OR starts_with(name, :escaped))
   AND expires_at > clock_timestamp()
 ORDER BY CASE WHEN starts_with(name, :mark) THEN decode(substr(name, 2), 'hex')
               ELSE convert_to(name, 'UTF8') END
 LIMIT :limit;


-- name: force_release
-- Lease mode. Params: :name. Deletes the lease whoever holds it (tests, operator tools);
-- keeps the counter. -> (released bool, notified count), one row.
WITH gone AS (
    DELETE FROM {namespace}_locks WHERE name = :name
    RETURNING name, expires_at > clock_timestamp() AS live
), woken AS (
    SELECT pg_notify('{namespace}_locks', 'w' || E'\n' || name) FROM gone
)
SELECT coalesce(bool_or(live), false), (SELECT count(*) FROM woken) FROM gone;


-- name: listen
-- Lease mode, on the dedicated listener connection. release notifies this channel with
-- "h\n<owner>\n<token>\n<name>" when it hands the lease to a waiter, "w\n<name>" when every
-- waiter of that name should look again (force_release too).
LISTEN {namespace}_locks;


-- name: session_try
-- Session mode. Params: :key (bigint advisory-lock key), :name.
-- pg_try_advisory_lock never waits. When it gets the lock, the same statement bumps the name's
-- counter (the lock holder is the only one bumping it, so the counter row is never contended).
-- The bump commits without waiting for the WAL flush (synchronous_commit=off, this transaction
-- only): the lock itself lives in server memory and dies with a crash anyway, and a bump lost
-- in a crash is covered by the counter's time floor (see the top of this file).
-- -> (token) when the lock was taken, no row otherwise.
WITH relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO {namespace}_lock_tokens AS t (name, token)
SELECT :name, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
  FROM relaxed
 WHERE pg_try_advisory_lock(:key)
ON CONFLICT (name) DO UPDATE SET token = greatest(t.token + 1, excluded.token)
RETURNING t.token;


-- name: session_lock
-- Session mode. Params: :key, :name, :lock_timeout (text such as '1500ms', never
-- '0': 0 would mean "no limit").
-- Waits IN THE SERVER, in PostgreSQL's lock queue (first come, first served), for at most
-- lock_timeout, which is set for this statement's transaction only (set_config(..., true)),
-- like synchronous_commit=off for the token bump (see session_try).
-- On timeout the statement fails with SQLSTATE 55P03 (lock_not_available); the caller then
-- runs session_held, because the lock can be granted in the instant the timeout fires.
-- -> (token), one row, once the lock is granted.
WITH limited AS MATERIALIZED (
    SELECT set_config('lock_timeout', :lock_timeout, true),
           set_config('synchronous_commit', 'off', true)
), locked AS MATERIALIZED (
    SELECT pg_advisory_lock(:key) FROM limited
)
INSERT INTO {namespace}_lock_tokens AS t (name, token)
SELECT :name, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
  FROM locked
ON CONFLICT (name) DO UPDATE SET token = greatest(t.token + 1, excluded.token)
RETURNING t.token;


-- name: session_bump
-- Session mode. Params: :name. Bumps the counter for a lock this session already holds
-- (after the lock_timeout race). -> (token), one row.
WITH relaxed AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
)
INSERT INTO {namespace}_lock_tokens AS t (name, token)
SELECT :name, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
  FROM relaxed
ON CONFLICT (name) DO UPDATE SET token = greatest(t.token + 1, excluded.token)
RETURNING t.token;


-- name: session_held
-- Session mode, on the connection that should hold the lock. Params: :hi, :lo: the
-- high and low 32 bits (as unsigned numbers) of the bigint key; pg_locks shows a bigint
-- advisory key as classid = high half, objid = low half, objsubid = 1.
-- -> (held bool): this session holds the lock. Also proves the connection is alive.
SELECT EXISTS (
    SELECT 1
      FROM pg_locks
     WHERE locktype = 'advisory'
       AND pid = pg_backend_pid()
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = :hi::bigint::oid
       AND objid = :lo::bigint::oid
       AND objsubid = 1
       AND granted
);


-- name: session_holder
-- Session mode, from any connection. Params: :hi, :lo (see session_held), :name. Read-only.
-- -> (token) -- the name's last token, the holder's -- when some session holds the lock, no
-- row otherwise.
SELECT (SELECT token FROM {namespace}_lock_tokens WHERE name = :name)
 WHERE EXISTS (
    SELECT 1
      FROM pg_locks
     WHERE locktype = 'advisory'
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = :hi::bigint::oid
       AND objid = :lo::bigint::oid
       AND objsubid = 1
       AND granted
);


-- name: session_unlock
-- Session mode, on the holding connection. Params: :key.
-- -> (unlocked bool): false means this session did not hold the lock (always checked).
SELECT pg_advisory_unlock(:key);


-- name: session_holders
-- Session mode, from any connection. Params: :hi, :lo (see session_held).
-- -> (held bool): some backend still holds the advisory lock. A terminated backend keeps
-- its locks until it has exited, which pg_terminate_backend does not wait for.
SELECT EXISTS (
    SELECT 1
      FROM pg_locks
     WHERE locktype = 'advisory'
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = :hi::bigint::oid
       AND objid = :lo::bigint::oid
       AND objsubid = 1
       AND granted
);


-- name: session_force_release
-- Session mode, from any connection. Params: :hi, :lo (see session_held).
-- Terminates every backend holding the advisory lock, which frees it; the holder's liveness
-- check then fails and its lease is marked lost. Needs pg_signal_backend or superuser (or
-- the same role). -> (terminated bool) per holder; no row when nobody held it.
SELECT pg_terminate_backend(pid)
  FROM pg_locks
 WHERE locktype = 'advisory'
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND classid = :hi::bigint::oid
   AND objid = :lo::bigint::oid
   AND objsubid = 1
   AND granted;
