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
--
-- Uncontended: HMGET of the record, MGET of the lease and its waiters flag, TIME, HSET and
-- PEXPIRE of the record, DEL of the lease, SET of the release marker (each key read once:
-- the owner checks of the completion and of the release use these two reads).
local rec = redis.call('HMGET', KEYS[1], 's', 'o')
local L = KEYS[2]
if rec[1] == 'completed' and rec[2] == ARGV[2] then
  release(L, ARGV[4], false)
  return 1
end
local state = redis.call('MGET', L, L .. ':qf')
if not state[1] or split_lease(state[1]) ~= ARGV[4] then
  return -1
end
local t = redis.call('TIME')
local stored = 0
if rec[2] == ARGV[2] then
  stored = store(KEYS[1], ARGV[3], ms_of(t), tonumber(ARGV[1]))
end
release_held(L, ARGV[4], false, state[2], t)
return stored
