-- jobfence Redis lock backend: a waiter gives up (lock_lib.lua is prepended).
--
-- KEYS[1] L = S:lock:{N}   (L..":q", L..":qd", L..":qf", L..":w:"..owner derived)
-- ARGV[1] owner
--
-- Removes owner from the queue and drops its wake list. Returns owner's token if the lease
-- was handed to owner meanwhile (the caller keeps it), else nil.

local L, owner = KEYS[1], ARGV[1]
dequeue(L, owner)
tidy(L)
redis.call('DEL', L .. ':w:' .. owner)
local v = redis.call('GET', L)
if v then
  local holder, token = split_lease(v)
  if holder == owner then
    return token
  end
end
return false
