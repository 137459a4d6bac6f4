-- jobfence Redis lock backend: a waiter gives up (lock_lib.lua is prepended).
--
-- KEYS[1] S:lock:{N}   KEYS[2] S:q:{N}   KEYS[3] S:qd:{N}   KEYS[4] S:wake:{N}:<owner>
-- ARGV[1] owner
--
-- Removes owner from the queue and drops its wake list. Returns owner's token if the lease
-- was handed to owner meanwhile (the caller keeps it), else nil.

local v = redis.call('GET', KEYS[1])
dequeue(KEYS[2], KEYS[3], ARGV[1])
redis.call('DEL', KEYS[4])
if v then
  local holder, token = split_lease(v)
  if holder == ARGV[1] then
    return token
  end
end
return false
