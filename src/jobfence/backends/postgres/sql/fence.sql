-- jobfence fencing table and statements, PostgreSQL.
--
-- Used by jobfence.fence()/fence_async() on the caller's own connection, inside the caller's
-- transaction. The table name jobfence_fences is the default: install(conn, table=...) and
-- fence(..., table=...) substitute the configured (validated, quoted) name for it. Placeholders
-- are ? (converted per driver); each section below is one statement.

-- name: install
-- Idempotent; run it once (or copy it into your migrations) before the first fence().
-- ONE statement (a DO block) that first takes a transaction-scoped advisory lock (key
-- 0x6A6F6266656E6365, "jobfence"), so concurrent installs wait for each other instead of
-- failing: CREATE TABLE IF NOT EXISTS alone is not safe against a concurrent CREATE.
DO $jobfence$
BEGIN
    PERFORM pg_advisory_xact_lock(7669456882363163493);
    CREATE TABLE IF NOT EXISTS jobfence_fences (
        resource  TEXT        NOT NULL PRIMARY KEY,  -- the fenced resource name (<= 1024 bytes)
        token     BIGINT      NOT NULL,              -- the newest fencing token that wrote it
        fenced_at TIMESTAMPTZ NOT NULL DEFAULT now() -- when it last fenced (informational)
    );
END
$jobfence$

-- name: fence
-- Parameters: ?1 resource, ?2 token.
-- Records the token unless a newer one is already recorded. Returns one row (the token) when the
-- token was recorded (new row, newer or equal token), and NO row when the resource holds a newer
-- token: the caller's write is stale. The conflicting row stays locked until the caller's
-- transaction ends, so a concurrent fence on the same resource waits and then re-checks.
INSERT INTO jobfence_fences AS f (resource, token) VALUES (?, ?)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token, fenced_at = now()
WHERE f.token <= EXCLUDED.token
RETURNING f.token

-- name: newest
-- Parameters: ?1 resource. Only run after fence returned no row, to name the newest token.
SELECT token FROM jobfence_fences WHERE resource = ?
