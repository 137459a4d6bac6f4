-- jobfence Redis lock backend: extend one lease or renew many, in one call.
--
-- KEYS[i]        S:lock:{N_i}, the lease key of name i
-- ARGV[2i - 1]   owner of lease i
-- ARGV[2i]       its new ttl in ms (replaces the remaining lifetime)
--
-- Returns a list with 1 for each lease still held by its owner (now extended) and 0 for
-- each lease that is gone or held by another owner (left untouched).

local out = {}
for i = 1, #KEYS do
  local ok = 0
  local v = redis.call('GET', KEYS[i])
  if v then
    local sep = string.find(v, ':', 1, true)
    if sep and string.sub(v, sep + 1) == ARGV[2 * i - 1] then
      redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
      ok = 1
    end
  end
  out[i] = ok
end
return out
