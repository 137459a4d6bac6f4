-- jobfence Redis lock backend: one acquire attempt (lock_lib.lua is prepended).
--
-- KEYS[1] S:lock:{N}   KEYS[2] S:tok:{N}   KEYS[3] S:q:{N}   KEYS[4] S:qd:{N}
-- ARGV[1] owner
-- ARGV[2] ttl in ms (integer > 0)
-- ARGV[3] wait in ms; a negative value is a plain try, which never enqueues
-- ARGV[4] wake-list key prefix "S:wake:{N}:" (the owner is appended)
-- ARGV[5] waiter slack in ms, added to an entry's deadline (now + wait + slack)
--
-- Returns the fencing token (> 0) when owner holds the lease after the call, else
-- -1 - (ms until the current lease expires), so the caller knows how long a wait may last.
--
-- Fast path (lease free, nobody queued): GET, EXISTS, then the token INCR and SET PX.
-- Fairness: a free lease with a live queue goes to the queue's head, not to the caller
-- (unless the caller is the head); a waiting caller joins the tail, or refreshes its entry.

local lock, tok, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local wait_ms = tonumber(ARGV[3])

local v = redis.call('GET', lock)
if not v and redis.call('EXISTS', q) == 0 then
  return grant(lock, tok, owner, ttl_ms)
end

-- Join the queue (or refresh our entry); keep the queue keys alive while anyone may wait.
local function enqueue(now)
  if not redis.call('ZSCORE', q, owner) then
    local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
    local seq = 1
    if #last == 2 then
      seq = tonumber(last[2]) + 1
    end
    redis.call('ZADD', q, string.format('%d', seq), owner)
  end
  local keep = wait_ms + tonumber(ARGV[5])
  redis.call('HSET', qd, owner, string.format('%d', now + keep) .. ':' .. ARGV[2])
  local keep_s = string.format('%d', keep + 1000)
  if redis.call('PTTL', q) < keep then
    redis.call('PEXPIRE', q, keep_s)
  end
  if redis.call('PTTL', qd) < keep then
    redis.call('PEXPIRE', qd, keep_s)
  end
end

if v then
  local holder, token = split_lease(v)
  if holder == owner then
    -- handed to us while we were between two waits: take it, drop the pending wake-up
    redis.call('DEL', ARGV[4] .. owner)
    return token
  end
  if wait_ms >= 0 then
    enqueue(now_ms())
  end
  return -1 - math.max(redis.call('PTTL', lock), 0)
end

-- The lease is free but owners are queued.
local now = now_ms()
local head = live_head(q, qd, now)
if not head or head == owner then
  if head then
    dequeue(q, qd, owner)
    redis.call('DEL', ARGV[4] .. owner)
  end
  return grant(lock, tok, owner, ttl_ms)
end
-- Someone else is first in line (the previous lease expired without a release).
local head_ttl = hand_off(lock, tok, q, qd, ARGV[4], now)
if wait_ms >= 0 then
  enqueue(now)
end
return -1 - head_ttl
