-- jobfence Redis lock backend: release, with hand-off (lock_lib.lua is prepended).
--
-- KEYS[1] S:lock:{N}   KEYS[2] S:tok:{N}   KEYS[3] S:q:{N}   KEYS[4] S:qd:{N}
-- ARGV[1] owner ("" with ARGV[3] = "1")
-- ARGV[2] wake-list key prefix "S:wake:{N}:"
-- ARGV[3] "1" to drop the lease whoever holds it (administrative force release), else "0"
--
-- Returns 1 if the lease was released, 0 if owner did not hold it (nothing is changed).
-- With live waiters queued, the first one gets the lease at once (new token, its own ttl)
-- and one token is pushed onto its wake list: one waiter woken, already owning the lease.
-- Waiters whose deadline passed (they stopped polling: crashed or gave up) are skipped.

local lock, tok, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

local v = redis.call('GET', lock)
if not v then
  return 0
end
if ARGV[3] ~= '1' and split_lease(v) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', q) == 0 or not hand_off(lock, tok, q, qd, ARGV[2], now_ms()) then
  redis.call('DEL', lock)
end
return 1
