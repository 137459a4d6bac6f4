-- jobfence fencing table and statements, PostgreSQL.
--
-- Used by jobfence.fence()/fence_async() on the caller's own connection, inside the caller's
-- transaction. The table name jobfence_fences is the default: install(conn, table=...) and
-- fence(..., table=...) substitute the configured (validated, quoted) name for it. Placeholders
-- are ? (converted per driver); each section below is one statement.

-- name: install
-- Idempotent; run it once (or copy it into your migrations) before the first fence().
CREATE TABLE IF NOT EXISTS jobfence_fences (
    resource  TEXT        NOT NULL PRIMARY KEY,  -- the fenced resource name (<= 1024 bytes UTF-8)
    token     BIGINT      NOT NULL,              -- the newest fencing token that wrote it
    fenced_at TIMESTAMPTZ NOT NULL DEFAULT now() -- when that token last fenced (informational)
)

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
