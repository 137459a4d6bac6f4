-- jobfence Redis lock backend: release, with hand-off (lock_lib.lua is prepended).
--
-- KEYS[1] L = S:lock:{N}   (L..":tok", L..":q", L..":qd", L..":w:"..owner derived)
-- ARGV[1] owner
-- ARGV[2] absent; or "force" to drop the lease whoever holds it (administrative)
--
-- Returns 1 if the lease was released, 0 if owner did not hold it (nothing is changed).
-- With live waiters queued, the first one gets the lease at once (new token, its own ttl)
-- and the token is pushed onto its wake list: one waiter woken, already owning the lease.
-- Waiters whose deadline passed (they stopped polling: crashed or gave up) are skipped.

local L = KEYS[1]
local v = redis.call('GET', L)
if not v then
  return 0
end
if ARGV[2] ~= 'force' and split_lease(v) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', L .. ':q') == 0 or not hand_off(L, now_ms()) then
  redis.call('DEL', L)
end
return 1
