-- A guarded call's completion and its lease's release in ONE atomic script, when its lock and
-- its inbox are on the same database of one Redis server (lock_lib.lua and inbox_lib.lua are
-- prepended): the result is stored only while the lease is still this holder's (as
-- inbox_complete_held.lua stores it), then the lease is released exactly as lock_release.lua
-- releases it (hand-off to the first live waiter, the release marker).
--
-- KEYS[1]   the record's hash of the claim: "<table>:<key>"
-- KEYS[2]   L, the lease's key
-- ARGV[1]   retention, milliseconds: the record then expires natively
-- ARGV[2]   owner id of the claim
-- ARGV[3]   its serialised result (bytes)
-- ARGV[4]   owner id of the lease
--
-- Returns 1 if the result was stored (and the lease released), 0 if the claim is not its
-- owner's (taken over, released, expired away: nothing stored, the lease released all the
-- same), -1 if the lease is gone or held by another owner: then nothing is written at all.
-- A re-send after a lost reply finds the record completed by this very claim owner (only
-- this script completes a claim of the guarded call): it answers 1 again, and its release
-- answers as a re-sent release does (the marker), changing nothing.
local rec = redis.call('HMGET', KEYS[1], 's', 'o')
if rec[1] == 'completed' and rec[2] == ARGV[2] then
  release(KEYS[2], ARGV[4], false)
  return 1
end
if not held_by(KEYS[2], ARGV[4]) then
  return -1
end
local stored = complete(KEYS[1], ARGV[2], ARGV[3], clock_ms(), tonumber(ARGV[1]))
release(KEYS[2], ARGV[4], false)
return stored
