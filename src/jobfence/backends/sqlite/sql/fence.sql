-- jobfence fencing table and statements, SQLite (3.35+ for RETURNING).
--
-- Used by jobfence.fence()/fence_async() on the caller's own connection, inside the caller's
-- transaction. The table name jobfence_fences is the default: install(conn, table=...) and
-- fence(..., table=...) substitute the configured (validated, quoted) name for it. Placeholders
-- are ? ; each section below is one statement.

-- name: install
-- Idempotent; run it once (or copy it into your migrations) before the first fence().
CREATE TABLE IF NOT EXISTS jobfence_fences (
    resource  TEXT    NOT NULL PRIMARY KEY,            -- the fenced resource name
    token     INTEGER NOT NULL,                        -- the newest token that wrote it
    fenced_at TEXT    NOT NULL DEFAULT CURRENT_TIMESTAMP -- UTC, informational
)

-- name: fence
-- Parameters: ?1 resource, ?2 token.
-- Records the token unless a newer one is already recorded. Returns one row (the token) when the
-- token was recorded (new row, newer or equal token), and NO row when the resource holds a newer
-- token: the caller's write is stale. SQLite has one writer at a time, so the write lock this
-- statement takes serialises concurrent fences until the caller's transaction ends.
INSERT INTO jobfence_fences AS f (resource, token) VALUES (?, ?)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token, fenced_at = CURRENT_TIMESTAMP
WHERE f.token <= excluded.token
RETURNING token

-- name: newest
-- Parameters: ?1 resource. Only run after fence returned no row, to name the newest token.
SELECT token FROM jobfence_fences WHERE resource = ?
