-- jobfence inbox, PostgreSQL (schema version 2).
--
-- Conventions (jobfence/_core/sqlfiles.py reads every shipped .sql file the same way):
--   * "-- name: <section>" starts a section: one statement, or several separated by ";".
--     Comments are removed before a statement is sent.
--   * {table} is the table name (an SQL identifier of at most 63 characters; default
--     jobfence_inbox), and {table}_expires one name made from it. jobfence double-quotes
--     them in lower case, the name PostgreSQL has always given the unquoted name. Inside
--     quotes ('{table}') the bare name is written. Migration tools: fill {table} the same way.
--   * Parameters are named, :name; jobfence converts them for the driver (psycopg
--     %(name)s with a literal percent sign doubled, asyncpg $1, $2..., SQLAlchemy :name).
--   * This file is jobfence/backends/postgres/sql/inbox.sql; the locks and the fencing table
--     have their own files beside it (locks.sql, fence.sql).
--
-- One row per idempotency key:
--   state        'in_progress' | 'completed'
--   owner        the live claim's owner (host:pid:uuid); NULL after release
--   attempt      1 for the first claim, +1 for each takeover of an expired/released claim
--   fingerprint  the payload digest the key was first claimed with (NULL: not given)
--   applied      claim_in() committed the key's effect in the caller's transaction
--   result       the serialised result stored by complete()
--   expires_at   in progress: the claim's deadline; completed: the end of its retention
--   claimed_at   when the current attempt was claimed (NULL: written by claim_in, or by a
--                jobfence that did not record it)
--
-- Schema versions: 1 had no claimed_at; 2 adds it (install() on a version-1 table adds the
-- column, NULL in the rows already there).

-- name: schema
-- ONE statement (a DO block), so that it is one transaction even on an autocommit connection.
-- The transaction-scoped advisory lock (key 0x6A6F6266656E6365, "jobfence") makes concurrent
-- installs wait for each other: CREATE TABLE IF NOT EXISTS alone is not safe against a
-- concurrent CREATE (it fails on pg_type's unique index). Inside the caller's transaction
-- (inbox.install(conn)) the lock is held until the caller commits.
DO $jobfence$
BEGIN
    PERFORM pg_advisory_xact_lock(7669456882363163493);
    CREATE TABLE IF NOT EXISTS {table} (
        k           text PRIMARY KEY,
        state       text NOT NULL,
        owner       text,
        attempt     integer NOT NULL DEFAULT 1,
        fingerprint text,
        applied     boolean NOT NULL DEFAULT false,
        result      bytea,
        expires_at  timestamptz NOT NULL,
        claimed_at  timestamptz
    );
    -- a version-1 table: add the column (checked first, so that an install on a table that
    -- has it takes no lock that would stop the claims)
    IF NOT EXISTS (SELECT 1 FROM pg_attribute
                    WHERE attrelid = to_regclass('{table}') AND attname = 'claimed_at'
                      AND NOT attisdropped) THEN
        ALTER TABLE {table} ADD COLUMN claimed_at timestamptz;
    END IF;
    CREATE INDEX IF NOT EXISTS {table}_expires ON {table} (expires_at);
    CREATE TABLE IF NOT EXISTS jobfence_inbox_schema (
        table_name text PRIMARY KEY,
        version    integer NOT NULL
    );
    INSERT INTO jobfence_inbox_schema (table_name, version) VALUES ('{table}', 2)
        ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version;
END
$jobfence$;

-- name: claim
-- ONE statement. Params: :key, :owner, :fingerprint (or NULL), :ttl (seconds).
-- The upsert takes the key if it is new, or in progress past its deadline (a dead or
-- released worker: attempt + 1), or completed past its retention (a fresh record, attempt 1);
-- a takeover is refused when both fingerprints are set and differ. Returns (mine, state,
-- owner, attempt, fingerprint, result, expires_at) when it took the key, no row otherwise
-- (the caller then reads the blocking record with ``peek``). A plain upsert: folding the
-- ``peek`` into a CTE made every claim about 50% slower (measured), to save a round trip
-- only on the duplicate path.
INSERT INTO {table} AS t (k, state, owner, attempt, fingerprint, applied, expires_at, claimed_at)
VALUES (:key, 'in_progress', :owner, 1, :fingerprint, false,
        clock_timestamp() + CAST(:ttl AS double precision) * interval '1 second',
        clock_timestamp())
ON CONFLICT (k) DO UPDATE SET
    state = 'in_progress',
    owner = EXCLUDED.owner,
    attempt = CASE WHEN t.state = 'completed' THEN 1 ELSE t.attempt + 1 END,
    -- a takeover without a fingerprint keeps the key's (a completed key past retention is new)
    fingerprint = CASE WHEN t.state = 'completed' THEN EXCLUDED.fingerprint
                       ELSE coalesce(EXCLUDED.fingerprint, t.fingerprint) END,
    applied = (t.applied AND t.state = 'in_progress'),
    result = NULL,
    expires_at = EXCLUDED.expires_at,
    claimed_at = EXCLUDED.claimed_at
WHERE t.expires_at <= clock_timestamp()
  AND (t.state = 'completed' OR t.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
       OR t.fingerprint = EXCLUDED.fingerprint)
RETURNING true AS mine, state, owner, attempt, fingerprint, result, expires_at;

-- name: claim_many
-- ONE statement: ``claim`` for a batch. Params: :keys text[] (distinct), :owners text[],
-- :fingerprints text[] (NULL items: none), :ttls float8[] (seconds), of the same length.
-- The same upsert as ``claim``, row by row in key order (so that two batches that share keys
-- take their row locks in one order and never deadlock each other). Returns
-- (k, mine, state, owner, attempt, fingerprint, result, expires_at) for every key it took;
-- the others are read with ``peek_many``. Its ON CONFLICT clause is ``claim``'s, word for
-- word (a test holds them equal): the single-row form stays for a lone claim, where it costs
-- about 40 µs less client CPU than arrays of one.
INSERT INTO {table} AS t (k, state, owner, attempt, fingerprint, applied, expires_at, claimed_at)
SELECT i.k, 'in_progress', i.owner, 1, i.fingerprint, false,
       clock_timestamp() + i.ttl * interval '1 second', clock_timestamp()
  FROM unnest(CAST(:keys AS text[]), CAST(:owners AS text[]), CAST(:fingerprints AS text[]),
              CAST(:ttls AS double precision[])) AS i(k, owner, fingerprint, ttl)
 ORDER BY i.k
ON CONFLICT (k) DO UPDATE SET
    state = 'in_progress',
    owner = EXCLUDED.owner,
    attempt = CASE WHEN t.state = 'completed' THEN 1 ELSE t.attempt + 1 END,
    fingerprint = CASE WHEN t.state = 'completed' THEN EXCLUDED.fingerprint
                       ELSE coalesce(EXCLUDED.fingerprint, t.fingerprint) END,
    applied = (t.applied AND t.state = 'in_progress'),
    result = NULL,
    expires_at = EXCLUDED.expires_at,
    claimed_at = EXCLUDED.claimed_at
WHERE t.expires_at <= clock_timestamp()
  AND (t.state = 'completed' OR t.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
       OR t.fingerprint = EXCLUDED.fingerprint)
RETURNING k, true AS mine, state, owner, attempt, fingerprint, result, expires_at;

-- name: peek_many
-- Params: :keys text[]. The records that stopped the claims of a batch (duplicates).
SELECT k, false, state, owner, attempt, fingerprint, result, expires_at
  FROM {table} WHERE k = ANY(CAST(:keys AS text[]));

-- name: complete_many
-- ONE statement: ``complete`` for a batch. Params: :keys text[] (distinct), :owners text[],
-- :results bytea[], :retention (seconds). Owner-checked per key; returns the keys it stored.
UPDATE {table} AS t
SET state = 'completed', result = i.result,
    expires_at = clock_timestamp() + CAST(:retention AS double precision) * interval '1 second'
FROM unnest(CAST(:keys AS text[]), CAST(:owners AS text[]), CAST(:results AS bytea[]))
     AS i(k, owner, result)
WHERE t.k = i.k AND t.owner = i.owner
  AND NOT (t.state = 'completed' AND t.expires_at <= clock_timestamp())
RETURNING t.k;

-- name: peek
-- Params: :key. The record that stopped a claim (duplicate path only).
SELECT false, state, owner, attempt, fingerprint, result, expires_at FROM {table} WHERE k = :key;

-- name: complete
-- Params: :result, :retention (seconds), :key, :owner. Owner-checked; one row or none.
UPDATE {table}
SET state = 'completed', result = :result,
    expires_at = clock_timestamp() + CAST(:retention AS double precision) * interval '1 second'
WHERE k = :key AND owner = :owner
  AND NOT (state = 'completed' AND expires_at <= clock_timestamp());

-- name: release
-- Params: :key, :owner. The next claim takes the key over (attempt + 1).
UPDATE {table}
SET owner = NULL, expires_at = LEAST(expires_at, clock_timestamp())
WHERE k = :key AND owner = :owner AND state = 'in_progress';

-- name: extend
-- Params: :key, :owner, :ttl (seconds). Owner-checked: moves the deadline of a live
-- in-progress claim to now + ttl; one row or none. An expired claim is never extended: once
-- its deadline passed, another worker may take it over.
UPDATE {table}
SET expires_at = clock_timestamp() + CAST(:ttl AS double precision) * interval '1 second'
WHERE k = :key AND owner = :owner AND state = 'in_progress' AND expires_at > clock_timestamp();

-- name: renew
-- Params: :keys text[], :owners text[], :ttls float8[] (seconds), three arrays of the same
-- length. ONE statement extends every claim an item names, as ``extend`` does for one.
-- -> one row per item, in item order: (item number, renewed bool).
WITH item AS (
    SELECT *
      FROM unnest(CAST(:keys AS text[]), CAST(:owners AS text[]),
                  CAST(:ttls AS double precision[]))
           WITH ORDINALITY AS i(k, owner, ttl, n)
), renewed AS (
    UPDATE {table} AS t
       SET expires_at = clock_timestamp() + item.ttl * interval '1 second'
      FROM item
     WHERE t.k = item.k AND t.owner = item.owner AND t.state = 'in_progress'
       AND t.expires_at > clock_timestamp()
    RETURNING item.n
)
SELECT item.n, renewed.n IS NOT NULL
  FROM item LEFT JOIN renewed ON renewed.n = item.n
 ORDER BY item.n;

-- name: purge
-- Params: :retention, seconds (how long an abandoned in-progress claim is kept past its
-- deadline). Completed records go when their retention ends.
DELETE FROM {table}
WHERE (state = 'completed' AND expires_at <= clock_timestamp())
   OR (state = 'in_progress'
       AND expires_at <= clock_timestamp() - CAST(:retention AS double precision) * interval '1 second');

-- name: claims
-- Params: :state (or NULL: both), :prefix, :escaped (the stored prefix of escaped keys, see
-- common.pg_text), :mark (the escape mark), :limit. Read-only. -> (k, state, owner, attempt,
-- fingerprint, claimed_at, seconds_left) of the records whose keys start with the prefix
-- (starts_with: no wildcards), at most :limit rows, ordered by the keys' UTF-8 bytes (code
-- point order; an escaped key by its decoded bytes). seconds_left is by the server's clock,
-- negative once expires_at has passed.
SELECT k, state, owner, attempt, fingerprint, claimed_at,
       extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM {table}
 WHERE (starts_with(k, :prefix) OR starts_with(k, :escaped))
   AND (CAST(:state AS text) IS NULL OR state = CAST(:state AS text))
 ORDER BY CASE WHEN starts_with(k, :mark) THEN decode(substr(k, 2), 'hex')
               ELSE convert_to(k, 'UTF8') END
 LIMIT :limit;

-- name: claim_info
-- Params: :key. Read-only. -> the columns of ``claims`` for one key, or no row.
SELECT k, state, owner, attempt, fingerprint, claimed_at,
       extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM {table}
 WHERE k = :key;

-- name: forget
-- Params: :key. Deletes the key's record whatever its state (operator action); one row or
-- none.
DELETE FROM {table} WHERE k = :key;

-- name: claim_in
-- Runs inside the CALLER's transaction; ONE statement. Params: :key, :fingerprint (or NULL),
-- :retention (seconds). Inserts the processed-marker, or marks a key that claim() holds as
-- applied; affects one row iff this transaction is the first to apply the key's effect. A
-- concurrent duplicate waits on the unique key, then affects nothing.
INSERT INTO {table} AS t (k, state, owner, attempt, fingerprint, applied, expires_at)
VALUES (:key, 'completed', NULL, 1, :fingerprint, true,
        now() + CAST(:retention AS double precision) * interval '1 second')
ON CONFLICT (k) DO UPDATE SET applied = true
WHERE NOT t.applied AND t.state = 'in_progress'
  AND (t.fingerprint IS NULL OR EXCLUDED.fingerprint IS NULL
       OR t.fingerprint = EXCLUDED.fingerprint);

-- name: fingerprint
-- Params: :key. Read only when claim_in was refused and a fingerprint was given.
SELECT fingerprint FROM {table} WHERE k = :key;

-- name: drop
DROP TABLE IF EXISTS {table};
DELETE FROM jobfence_inbox_schema WHERE table_name = '{table}';
