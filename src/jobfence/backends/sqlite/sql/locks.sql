-- SQLite lock backend (sqlite:///path): schema and statements.
--
-- Loaded by jobfence/backends/sqlite/locks_async.py (and its generated twin locks.py) through
-- jobfence/_core/sqlfiles.py, whose conventions hold for every shipped .sql file:
--   * "-- name: <section>" starts a section: one statement, or a script of statements separated
--     by ";" (schema). Comments are removed before a statement is sent.
--   * {namespace}_locks is ONE table name: the client's namespace (validated as an SQL
--     identifier of at most 63 characters, see docs/how-to/backends/sqlite.md) followed by the
--     suffix, double-quoted.
--   * Parameters are named, :name, as sqlite3 takes them.
--
-- Time: every expiry is measured by ONE clock, the SQLite host clock, as unix seconds with
-- millisecond resolution:
--     (julianday('now') - 2440587.5) * 86400.0
-- SQLite evaluates 'now' once per statement, so it is the same value everywhere in a statement.
-- All processes using the file run on the same host and so share this clock. Python's clocks
-- are never written into these tables.
--
-- Transactions: the connection runs with isolation_level=None (explicit transactions). Every
-- operation that reads before it writes runs in one short "BEGIN IMMEDIATE" transaction (it
-- takes the write lock first, so two processes never deadlock upgrading a read lock); the
-- single-statement operations run as their own autocommit transaction. A busy timeout makes
-- concurrent processes queue for the write lock instead of failing.


-- name: schema
-- Idempotent: safe to run from any number of processes at once (inside BEGIN IMMEDIATE).
-- A lease: at most one row per name. A row whose expires_at <= now is free for the taking.
CREATE TABLE IF NOT EXISTS {namespace}_locks (
    name        TEXT PRIMARY KEY,    -- the lock name, any UTF-8 text (bound, never spliced)
    owner       TEXT NOT NULL,       -- the holder's owner id (host:pid:uuid)
    token       INTEGER NOT NULL,    -- the fencing token handed out with this lease
    expires_at  REAL NOT NULL        -- unix seconds, SQLite host clock
) WITHOUT ROWID;
-- The fencing-token counter of each name. It outlives the lease rows (a released or expired
-- lease deletes its row, never its counter), so tokens strictly increase per name; every
-- grant also floors the token at the host clock in microseconds (see next_token).
CREATE TABLE IF NOT EXISTS {namespace}_lock_tokens (
    name   TEXT PRIMARY KEY,
    token  INTEGER NOT NULL          -- the last token handed out for name
) WITHOUT ROWID;
-- The FIFO wait queue: one row per waiting owner. A free lease goes to the head of the live
-- queue, never to a newcomer or to the process that just released; a release hands the lease
-- straight to the head (its own ttl), so the head's next poll finds the lease its own. A
-- waiter renews its entry as it keeps polling; an entry past `until` is dead (the waiter
-- crashed or gave up) and is skipped, then swept.
CREATE TABLE IF NOT EXISTS {namespace}_lock_queue (
    name   TEXT NOT NULL,
    owner  TEXT NOT NULL,
    seq    REAL NOT NULL,            -- arrival, unix seconds (kept while the waiter renews)
    until  REAL NOT NULL,            -- unix seconds, SQLite host clock
    ttl    REAL NOT NULL,            -- seconds: the lease the waiter asked for
    PRIMARY KEY (name, owner)
) WITHOUT ROWID;
-- Every lease row inserted (a grant, a hand-off, the one-statement take) moves its name's
-- counter up to the row's token, so a grant that computes its token inline (take) keeps the
-- counter as next_token would. next_token + grant leave the counter where it was.
CREATE TRIGGER IF NOT EXISTS {namespace}_locks_counter AFTER INSERT ON {namespace}_locks
BEGIN
    INSERT INTO {namespace}_lock_tokens (name, token) VALUES (NEW.name, NEW.token)
    ON CONFLICT (name) DO UPDATE SET token = max(token, excluded.token);
END;
-- One row per jobfence component that keeps tables in this database.
CREATE TABLE IF NOT EXISTS {namespace}_schema (
    component  TEXT PRIMARY KEY,
    version    INTEGER NOT NULL
);
INSERT INTO {namespace}_schema (component, version) VALUES ('locks', 1)
    ON CONFLICT (component) DO NOTHING;


-- name: schema_version
-- -> (version) of the locks tables, one row.
SELECT version FROM {namespace}_schema WHERE component = 'locks';


-- name: peek
-- Params: :name, :owner.
-- -> (owner_holds, token, remaining) of the live lease on :name, or no row when it is free:
--    owner_holds is 1 when :owner holds it, remaining its lifetime left in seconds.
SELECT owner = :owner,
       token,
       expires_at - (julianday('now') - 2440587.5) * 86400.0
  FROM {namespace}_locks
 WHERE name = :name
   AND expires_at > (julianday('now') - 2440587.5) * 86400.0;


-- name: holder
-- Params: :name. Read-only. -> (owner, token, remaining) of the live lease on :name, or no
-- row when it is free (remaining: its lifetime left in seconds).
SELECT owner,
       token,
       expires_at - (julianday('now') - 2440587.5) * 86400.0
  FROM {namespace}_locks
 WHERE name = :name
   AND expires_at > (julianday('now') - 2440587.5) * 86400.0;


-- name: holders
-- Params: :prefix, :limit. Read-only. -> (name, owner, token, remaining) of the live leases
-- whose names start with :prefix, by name, at most :limit rows. The prefix is compared as
-- UTF-8 bytes (a BLOB), so a name holding NUL characters matches as well.
SELECT name,
       owner,
       token,
       expires_at - (julianday('now') - 2440587.5) * 86400.0
  FROM {namespace}_locks
 WHERE substr(CAST(name AS BLOB), 1, length(CAST(:prefix AS BLOB))) = CAST(:prefix AS BLOB)
   AND expires_at > (julianday('now') - 2440587.5) * 86400.0
 ORDER BY name
 LIMIT :limit;

-- name: queue_head
-- Params: :name. -> (owner, ttl) of the first live waiter on :name, or no row.
SELECT owner, ttl FROM {namespace}_lock_queue
 WHERE name = :name
   AND until > (julianday('now') - 2440587.5) * 86400.0
 ORDER BY seq, owner
 LIMIT 1;


-- name: queue_entry
-- Params: :name, :owner. -> (seconds left) of :owner's entry (negative: dead), or no row.
SELECT until - (julianday('now') - 2440587.5) * 86400.0
  FROM {namespace}_lock_queue
 WHERE name = :name AND owner = :owner;


-- name: enqueue
-- Params: :name, :owner, :window, :ttl (seconds). Join the tail of the queue, or renew the
-- entry (keeping its place) when it is still live.
INSERT INTO {namespace}_lock_queue (name, owner, seq, until, ttl)
     VALUES (:name, :owner, (julianday('now') - 2440587.5) * 86400.0,
             (julianday('now') - 2440587.5) * 86400.0 + :window, :ttl)
ON CONFLICT (name, owner) DO UPDATE
   SET until = excluded.until, ttl = excluded.ttl,
       seq = CASE WHEN until > excluded.seq THEN seq ELSE excluded.seq END;


-- name: dequeue
-- Params: :name, :owner. The owner was granted the lease, or gave up waiting.
DELETE FROM {namespace}_lock_queue WHERE name = :name AND owner = :owner;


-- name: sweep
-- Params: :name. Drop the entries of waiters that stopped renewing them.
DELETE FROM {namespace}_lock_queue
 WHERE name = :name AND until <= (julianday('now') - 2440587.5) * 86400.0;


-- name: next_token
-- Params: :name. Run inside the acquire transaction (and a release's hand-off), only when a
-- lease is being granted.
-- -> (token): the name's next fencing token, max(counter + 1, the host clock in microseconds).
--    The clock floor applies on EVERY grant, not only when the counter row is missing: a file
--    restored from an older copy, or one that lost its last unsynced pages
--    (synchronous=normal/off and a power loss), holds an older counter, and must never hand
--    out a token again. No earlier token can have outrun the clock (that would take more than
--    a million grants per second on one name), so the floor is above every token issued
--    before -- unless the host clock stepped back by more than the time since then, as on
--    every backend. (SQLite's clock has millisecond resolution: within one millisecond the
--    counter's + 1 keeps tokens apart.)
INSERT INTO {namespace}_lock_tokens (name, token)
     VALUES (:name, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER))
ON CONFLICT (name) DO UPDATE SET token = max(token + 1, excluded.token)
  RETURNING token;


-- name: take
-- Params: :name, :owner, :ttl (seconds). The uncontended acquire in ONE autocommit statement:
-- grants :name to :owner when it is free (no live lease) and nobody waits for it (no live
-- queue entry at all: the caller is not queued), with the token next_token would give (the
-- counter follows through the trigger). -> (token) when granted, no row otherwise (held, or
-- waited for: the caller then runs the full acquire transaction).
INSERT OR REPLACE INTO {namespace}_locks (name, owner, token, expires_at)
SELECT :name,
       :owner,
       max(coalesce((SELECT token FROM {namespace}_lock_tokens WHERE name = :name), 0) + 1,
           CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)),
       (julianday('now') - 2440587.5) * 86400.0 + :ttl
 WHERE NOT EXISTS (SELECT 1 FROM {namespace}_locks
                    WHERE name = :name
                      AND expires_at > (julianday('now') - 2440587.5) * 86400.0)
   AND NOT EXISTS (SELECT 1 FROM {namespace}_lock_queue
                    WHERE name = :name
                      AND until > (julianday('now') - 2440587.5) * 86400.0)
RETURNING token;


-- name: grant
-- Params: :name, :owner, :token, :ttl (seconds). Run in the acquire transaction after peek
-- found the name free: replaces an expired row, if any.
INSERT OR REPLACE INTO {namespace}_locks (name, owner, token, expires_at)
     VALUES (:name, :owner, :token, (julianday('now') - 2440587.5) * 86400.0 + :ttl);


-- name: release
-- Params: :name, :owner. Owner-checked; an expired lease is not released (it is free already).
-- Changes one row when :owner held the live lease. Runs in a BEGIN IMMEDIATE transaction with
-- queue_head (and, for a hand-off, next_token, grant and dequeue) and sweep.
DELETE FROM {namespace}_locks
 WHERE name = :name
   AND owner = :owner
   AND expires_at > (julianday('now') - 2440587.5) * 86400.0;


-- name: release_alone
-- Params: :name, :owner. The uncontended release in ONE autocommit statement: as release, but
-- only when the name has no queue entry at all (nobody to hand the lease to, nothing to
-- sweep). Changes no row otherwise: the caller then runs the full release transaction.
DELETE FROM {namespace}_locks
 WHERE name = :name
   AND owner = :owner
   AND expires_at > (julianday('now') - 2440587.5) * 86400.0
   AND NOT EXISTS (SELECT 1 FROM {namespace}_lock_queue WHERE name = :name);


-- name: extend
-- Params: :name, :owner, :ttl (seconds). Owner-checked; an expired lease cannot be extended
-- (someone else may have seen it free). Changes one row when :owner held the live lease.
UPDATE {namespace}_locks
   SET expires_at = (julianday('now') - 2440587.5) * 86400.0 + :ttl
 WHERE name = :name
   AND owner = :owner
   AND expires_at > (julianday('now') - 2440587.5) * 86400.0;


-- name: force_release
-- Params: :name. Deletes the lease whoever holds it (tests, operator tools). Keeps the counter.
DELETE FROM {namespace}_locks WHERE name = :name;
