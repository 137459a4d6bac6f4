-- MySQL 8 / MariaDB 10.6+ lock backend (mysql://, mariadb://): schema and statements.
--
-- Loaded by jobfence/backends/mysql/common.py for locks_async.py and its generated twin
-- locks.py, through jobfence/_core/sqlfiles.py, whose conventions hold for every shipped .sql
-- file:
--   * "-- name: <section>" starts a section; here each holds ONE statement. Comments are
--     removed before a statement is sent.
--   * {namespace}_locks is ONE table name: the client's namespace (validated as an SQL
--     identifier of at most 48 characters, see docs/how-to/backends/mysql.md) followed by the
--     suffix, quoted with backticks. {hashes}, {pairs} and {ttl_us} (renew, held) are filled
--     per call by jobfence.
--   * Parameters are named, :name, always bound by the driver, never spliced; jobfence
--     converts them to PyMySQL's %(name)s (doubling a literal percent sign).
-- Name hashes travel as lowercase hex text and are decoded with UNHEX() (binary parameters are
-- not escaped reliably by every aiomysql/PyMySQL pair).
--
-- Time: every expiry is measured by ONE clock, the database server's, as UTC_TIMESTAMP(6)
-- (microseconds, independent of the session time zone and of daylight saving). MySQL evaluates
-- it once per statement, so it is the same value everywhere in a statement. Client clocks are
-- never written into these tables; ttls travel as integer microseconds (:ttl_us).
--
-- Connections run in autocommit mode with READ COMMITTED isolation (no gap locks), so every
-- statement below is its own short InnoDB transaction that locks at most the rows it names.
--
-- Fencing tokens: the token lives in the lease row, which is never deleted (release and
-- force_release only mark it free), so the row is the per-name counter. A new token is
--     GREATEST(previous token + 1, microseconds since 1970 on the server clock)
-- so tokens strictly increase per name, and they keep increasing even if the table is lost
-- (dropped, restored from an older backup): the server clock has moved past every token
-- handed out before, as long as fewer than one lease per microsecond was granted per name.


-- name: create_schema_table
-- One row per jobfence component that keeps tables under this prefix.
CREATE TABLE IF NOT EXISTS {namespace}_schema (
    component  VARCHAR(64) NOT NULL PRIMARY KEY,
    version    INT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;


-- name: create_locks_table
-- One row per lock name ever used. A row whose expires_at <= UTC_TIMESTAMP(6) is free.
-- name_hash is the key because names (up to 1024 bytes of UTF-8) exceed InnoDB's key limit.
-- next_owner/next_until: the one waiter "next in line" (see acquire); NULL when nobody is.
CREATE TABLE IF NOT EXISTS {namespace}_locks (
    name_hash   BINARY(32)     NOT NULL PRIMARY KEY,  -- SHA-256 of the UTF-8 name
    name        VARCHAR(1024)  NOT NULL,              -- the name, for people and tools
    owner       VARCHAR(255)   NOT NULL,              -- holder (host:pid:uuid); '' when free
    token       BIGINT         NOT NULL,              -- fencing token of the latest grant
    expires_at  DATETIME(6)    NOT NULL,              -- UTC, server clock
    next_owner  VARCHAR(255)   NULL,                  -- the waiter next in line
    next_until  DATETIME(6)    NULL                   -- ...until then (UTC, server clock)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;


-- name: record_schema_version
-- Params: :version. Idempotent; never lowers a version written by a newer jobfence.
INSERT INTO {namespace}_schema (component, version) VALUES ('locks', :version)
    ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version));


-- name: schema_version
-- -> (version) of the locks tables, one row.
SELECT version FROM {namespace}_schema WHERE component = 'locks';


-- name: acquire
-- ONE statement, ONE round trip. Params: :hash, :name, :owner, :ttl_us,
-- :window_us (NULL for a plain try; else how long, in microseconds, this caller may stay
-- "next in line" without trying again).
-- Result, read from the OK packet (no result set): insert_id (cursor.lastrowid), set with
-- LAST_INSERT_ID(expr) (per connection, so concurrent clients never see each other's):
--   insert_id > 1  -> acquired; insert_id IS the fencing token (tokens are > 10^15)
--   insert_id = 1  -> not acquired; the caller is (still) next in line
--   insert_id = 0  -> not acquired
-- The row's primary key makes InnoDB lock it for the whole statement, so concurrent acquires
-- of one name are serialised and each sees the previous one's result.
--
-- The caller takes the row when it is
--   (a) live and already its own (a retried acquire whose reply was lost: same token), or
--   (b) free (expired or released) and no OTHER live waiter is next in line.
-- Rule (b) keeps a releasing worker from re-taking the lock ahead of a worker that has been
-- waiting: the waiter next in line gets it (it polls every few milliseconds). It is not a
-- queue: only one waiter is next in line, and only until next_until, which it pushes forward
-- while it keeps polling (only when half of its window has passed, so that most polls write
-- nothing and cost no commit).
--
-- The ON DUPLICATE KEY UPDATE assignments run left to right and each one sees the columns the
-- earlier ones set (MySQL and MariaDB's default; MariaDB's SIMULTANEOUS_ASSIGNMENT sql_mode
-- is reset for these connections). So the decision is made ONCE, by the first assignment, and
-- recorded in `owner`: after it, owner = VALUES(owner) holds exactly when the caller takes the
-- row (an expired row of the caller's own that it may not take is reset to '').
-- "Becomes/stays next in line" (NIL below) is judged on next_owner/next_until before their
-- own assignments:  :window_us IS NOT NULL AND (next_owner IS NULL
--                   OR next_owner = VALUES(owner) OR next_until <= UTC_TIMESTAMP(6))
INSERT INTO {namespace}_locks (name_hash, name, owner, token, expires_at, next_owner, next_until)
VALUES (
    UNHEX(:hash), :name, :owner,
    LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))),
    UTC_TIMESTAMP(6) + INTERVAL :ttl_us MICROSECOND,
    NULL, NULL
)
ON DUPLICATE KEY UPDATE
    owner = IF(
        (expires_at > UTC_TIMESTAMP(6) AND owner = VALUES(owner))
        OR (expires_at <= UTC_TIMESTAMP(6)
            AND (next_owner IS NULL OR next_owner = VALUES(owner)
                 OR next_until <= UTC_TIMESTAMP(6))),
        VALUES(owner),
        IF(owner = VALUES(owner), '', owner)),
    -- taken: a new token (or the same one for case (a)) becomes the insert_id; not taken:
    -- token is unchanged and insert_id = 1 when NIL, else 0
    token = IF(owner = VALUES(owner),
        LAST_INSERT_ID(IF(expires_at > UTC_TIMESTAMP(6), token,
                          GREATEST(token + 1, VALUES(token)))),
        token + LAST_INSERT_ID(
            :window_us IS NOT NULL
            AND (next_owner IS NULL OR next_owner = VALUES(owner)
                 OR next_until <= UTC_TIMESTAMP(6)))
        - (:window_us IS NOT NULL
           AND (next_owner IS NULL OR next_owner = VALUES(owner)
                OR next_until <= UTC_TIMESTAMP(6)))),
    expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at),
    -- the taker stops being next in line; a waiter becomes it when NIL
    next_owner = IF(owner = VALUES(owner),
        IF(next_owner = VALUES(owner), NULL, next_owner),
        IF(:window_us IS NOT NULL
           AND (next_owner IS NULL OR next_owner = VALUES(owner)
                OR next_until <= UTC_TIMESTAMP(6)),
           VALUES(owner), next_owner)),
    next_until = IF(owner = VALUES(owner),
        IF(next_owner IS NULL, NULL, next_until),
        IF(next_owner = VALUES(owner)
           AND (next_until IS NULL
                OR next_until <= UTC_TIMESTAMP(6) + INTERVAL (:window_us DIV 2) MICROSECOND),
           UTC_TIMESTAMP(6) + INTERVAL :window_us MICROSECOND, next_until));


-- name: release
-- Params: :hash, :owner. Affected rows 1 -> released; 0 -> not held by owner (free,
-- expired, or someone else's). The row stays (it carries the token counter); next_owner too.
UPDATE {namespace}_locks
   SET owner = '', expires_at = '1970-01-01 00:00:00'
 WHERE name_hash = UNHEX(:hash) AND owner = :owner AND expires_at > UTC_TIMESTAMP(6);


-- name: extend
-- Params: :hash, :owner, :ttl_us. Affected rows 1 -> extended. An expired lease is
-- never extended (someone may be about to take it). Affected rows 0 -> not held, except in
-- the (harmless) case that the new expiry equals the old one to the microsecond; the caller
-- then asks "held" to tell the two apart.
UPDATE {namespace}_locks
   SET expires_at = UTC_TIMESTAMP(6) + INTERVAL :ttl_us MICROSECOND
 WHERE name_hash = UNHEX(:hash) AND owner = :owner AND expires_at > UTC_TIMESTAMP(6);


-- name: renew
-- Many leases in ONE statement. Built by the caller, with numbered parameters per item i:
--   {hashes}  "UNHEX(:h0), UNHEX(:h1), ..."       one name_hash per item (lets the PK index
--                                                  be used)
--   {pairs}   "(UNHEX(:h0), :o0), ..."            (name_hash, owner) per item
--   {ttl_us}  ":ttl_us" when every item has the same ttl, else
--             "CASE WHEN name_hash = UNHEX(:h0) AND owner = :o0 THEN :t0 ... END"
-- Affected rows = number of items -> all renewed (the usual case, one round trip). Fewer ->
-- the caller asks "held" which items are still held (a second round trip, failures only).
UPDATE {namespace}_locks
   SET expires_at = UTC_TIMESTAMP(6) + INTERVAL {ttl_us} MICROSECOND
 WHERE name_hash IN ({hashes}) AND (name_hash, owner) IN ({pairs})
   AND expires_at > UTC_TIMESTAMP(6);


-- name: held
-- Built by the caller: {hashes} as for renew. -> (hex name_hash, owner) of every live lease
-- among those names.
SELECT LOWER(HEX(name_hash)), owner FROM {namespace}_locks
 WHERE name_hash IN ({hashes}) AND expires_at > UTC_TIMESTAMP(6);


-- name: holder
-- Params: :hash. Read-only. -> (owner, token, microseconds left) of the live lease, or no row.
SELECT owner, token, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
  FROM {namespace}_locks
 WHERE name_hash = UNHEX(:hash) AND expires_at > UTC_TIMESTAMP(6);


-- name: holders
-- Params: :prefix, :limit. Read-only. -> (name, owner, token, microseconds left) of the live
-- leases whose names start with :prefix, by name (utf8mb4_bin: code point order), at most
-- :limit rows.
SELECT name, owner, token, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
  FROM {namespace}_locks
 WHERE LEFT(name, CHAR_LENGTH(:prefix)) = :prefix AND expires_at > UTC_TIMESTAMP(6)
 ORDER BY name
 LIMIT :limit;

-- name: cancel_wait
-- Params: :hash, :owner. A waiter that gives up stops being next in line.
UPDATE {namespace}_locks SET next_owner = NULL, next_until = NULL
 WHERE name_hash = UNHEX(:hash) AND next_owner = :owner;


-- name: force_release
-- Params: :hash (hex). Administrative: free the lease whoever holds it (its holder finds it lost
-- at its next renewal). Affected rows 1 -> a live lease was dropped.
UPDATE {namespace}_locks
   SET owner = '', expires_at = '1970-01-01 00:00:00'
 WHERE name_hash = UNHEX(:hash) AND expires_at > UTC_TIMESTAMP(6);
