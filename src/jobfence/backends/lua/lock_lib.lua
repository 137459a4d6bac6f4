-- jobfence Redis lock backend: helpers shared by the lock_*.lua scripts.
--
-- This file is prepended to lock_acquire.lua, lock_release.lua and lock_cancel_wait.lua when
-- the backend loads them (one EVALSHA per operation; the helpers are local functions).
--
-- Key layout for a lock name N in namespace S (N goes between literal braces, so every key
-- of one name shares a Redis Cluster hash tag; N is only ever passed as KEYS/ARGV data):
--
--   S:lock:{N}           STRING  "<token>:<owner>"  with PX = the lease ttl (server clock)
--   S:tok:{N}            STRING  fencing-token counter (INCR); seeded from TIME in
--                                microseconds when missing; PEXPIRE max(10 * ttl, 1 day)
--   S:q:{N}              ZSET    waiting owners, scored by arrival sequence (FIFO)
--   S:qd:{N}             HASH    owner -> "<deadline_ms>:<ttl_ms>" of each waiter
--   S:wake:{N}:<owner>   LIST    one token pushed when the lease is handed to <owner>;
--                                the waiter BLPOPs it; PEXPIRE = the handed lease's ttl
--
-- Numbers are formatted with string.format('%d'): Lua's own number-to-string conversion
-- prints 16-digit tokens in exponent notation.

-- The server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Next fencing token of KEYS tok. A missing counter (first use, expired after a long idle
-- time, or a server restart that lost its data) is seeded with the server time in
-- microseconds: tokens issued before can not have outrun that clock, so the new ones are
-- larger than every earlier one.
local function next_token(tok, ttl_ms)
  if redis.call('EXISTS', tok) == 0 then
    local t = redis.call('TIME')
    redis.call('SET', tok, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local n = redis.call('INCR', tok)
  redis.call('PEXPIRE', tok, string.format('%d', math.max(ttl_ms * 10, 86400000)))
  return n
end

-- Owner and token of a lease value "<token>:<owner>" (the owner may contain ':').
local function split_lease(v)
  local sep = string.find(v, ':', 1, true)
  return string.sub(v, sep + 1), tonumber(string.sub(v, 1, sep - 1))
end

-- Give the lease to owner for ttl_ms; return its token.
local function grant(lock, tok, owner, ttl_ms)
  local n = next_token(tok, ttl_ms)
  redis.call('SET', lock, string.format('%d', n) .. ':' .. owner, 'PX', string.format('%d', ttl_ms))
  return n
end

-- The first waiter whose deadline has not passed, and its ttl; dead entries are purged.
local function live_head(q, qd, now)
  while true do
    local first = redis.call('ZRANGE', q, 0, 0)
    if #first == 0 then
      return nil, nil
    end
    local o = first[1]
    local d = redis.call('HGET', qd, o)
    if d then
      local sep = string.find(d, ':', 1, true)
      if tonumber(string.sub(d, 1, sep - 1)) > now then
        return o, tonumber(string.sub(d, sep + 1))
      end
    end
    redis.call('ZREM', q, o)
    redis.call('HDEL', qd, o)
  end
end

-- Remove owner from the queue of its name.
local function dequeue(q, qd, owner)
  redis.call('ZREM', q, owner)
  redis.call('HDEL', qd, owner)
end

-- Hand the lease to the queue's live head (it leaves the queue, owns the lease, and one
-- token is pushed onto its wake list). Returns the head's ttl_ms, or nil if nobody waits.
local function hand_off(lock, tok, q, qd, wake_prefix, now)
  local head, ttl_ms = live_head(q, qd, now)
  if not head then
    return nil
  end
  dequeue(q, qd, head)
  local n = grant(lock, tok, head, ttl_ms)
  local wake = wake_prefix .. head
  redis.call('DEL', wake)
  redis.call('LPUSH', wake, string.format('%d', n))
  redis.call('PEXPIRE', wake, string.format('%d', ttl_ms))
  return ttl_ms
end
