-- jobfence Redis lock backend: who holds a lease (read-only).
--
-- KEYS[1] L = S:lock:{N}
--
-- Returns {owner, token, ms left} of the live lease, or nil when nobody holds it (or the
-- value is not one jobfence wrote). The token is returned as the decimal string stored in
-- the lease value (a Lua number would lose digits).

local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
local sep = string.find(v, ':', 1, true)
if not sep then
  return false
end
return {string.sub(v, sep + 1), string.sub(v, 1, sep - 1), redis.call('PTTL', KEYS[1])}
