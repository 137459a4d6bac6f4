-- jobfence Redis lock backend: release, with hand-off (lock_lib.lua is prepended).
--
-- KEYS[1] L = S:lock:{N}   (L..":tok", L..":q", L..":qd", L..":qf", L..":w:"..owner derived)
-- ARGV[1] owner
-- ARGV[2] absent; or "force" to drop the lease whoever holds it (administrative)
--
-- Returns 1 if the lease was released, 0 if owner did not hold it (nothing is changed).
-- Idempotent for its owner: the releasing owner is remembered in L..":rel" for a minute,
-- so a release that redis-py re-sends after a lost reply (the first one did release)
-- still answers 1 instead of reporting the lease as lost. Owners are unique per lease.
-- With live waiters queued, the first one gets the lease at once (new token, its own ttl)
-- and the token is pushed onto its wake list: one waiter woken, already owning the lease.
-- Waiters whose deadline passed (they stopped polling: crashed or gave up) are skipped.
-- Uncontended (no waiters flag): MGET of the lease and the flag, DEL, SET of the marker.

local L = KEYS[1]
local force = ARGV[2] == 'force'
local state = redis.call('MGET', L, L .. ':qf')
local v = state[1]
if not v or (not force and split_lease(v) ~= ARGV[1]) then
  if not force and redis.call('GET', L .. ':rel') == ARGV[1] then
    return 1
  end
  return 0
end
if not state[2] or not hand_off(L, redis.call('TIME')) then
  redis.call('DEL', L)
end
if not force then
  redis.call('SET', L .. ':rel', ARGV[1], 'PX', 60000)
end
return 1
