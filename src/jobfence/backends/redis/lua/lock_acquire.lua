-- jobfence Redis lock backend: one acquire attempt (lock_lib.lua is prepended).
--
-- KEYS[1] L = S:lock:{N}   (L..":tok", L..":q", L..":qd", L..":qf", L..":w:"..owner derived)
-- ARGV[1] owner
-- ARGV[2] ttl in ms (integer > 0)
-- ARGV[3] absent for a plain try, which never enqueues; else the wait in ms
-- ARGV[4] (with ARGV[3]) waiter slack in ms: an entry's deadline is now + wait + slack
--
-- Returns the fencing token (> 0) when owner holds the lease after the call, else
-- -1 - (ms until the current lease expires), so the caller knows how long a wait may last.
--
-- Fast path (lease free, nobody queued): MGET of the lease, the counter and the waiters
-- flag, TIME, SET PX of the lease and of the counter. Fairness: a free lease with a live
-- queue goes to the queue's head, not to the caller (unless the caller is the head); a
-- waiting caller joins the tail of the queue or refreshes its entry's deadline.

local L = KEYS[1]
local owner = ARGV[1]
local ttl_ms = ARGV[2]

local state = redis.call('MGET', L, L .. ':tok', L .. ':qf')
local v = state[1]
if not v and not state[3] then
  return grant(L, owner, ttl_ms, state[2])
end

-- Join the queue (or refresh our entry); keep the queue keys while anyone may wait.
local function enqueue(now)
  local q, qd = L .. ':q', L .. ':qd'
  if not redis.call('ZSCORE', q, owner) then
    local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
    local seq = 1
    if #last == 2 then
      seq = tonumber(last[2]) + 1
    end
    redis.call('ZADD', q, string.format('%d', seq), owner)
  end
  local keep = tonumber(ARGV[3]) + tonumber(ARGV[4])
  redis.call('HSET', qd, owner, string.format('%d', now + keep) .. ':' .. ARGV[2])
  local keep_ms = string.format('%d', keep + 1000)
  if redis.call('PTTL', q) < keep then
    redis.call('PEXPIRE', q, keep_ms)
  end
  if redis.call('PTTL', qd) < keep then
    redis.call('PEXPIRE', qd, keep_ms)
  end
  -- the flag lives as long as the queue may
  redis.call('SET', L .. ':qf', '1', 'PX', redis.call('PTTL', q))
end

if v then
  local holder, token = split_lease(v)
  if holder == owner then
    -- handed to us while we were between two waits: take it, drop the pending wake-up
    redis.call('DEL', L .. ':w:' .. owner)
    return token
  end
  if ARGV[3] then
    enqueue(now_ms())
  end
  local left = redis.call('PTTL', L)
  if left == -1 then
    -- a key without expiry (not written by jobfence, e.g. redis-py's Lock without a
    -- timeout): no expiry to wait for; the caller looks again every poll interval
    left = 2147483647
  end
  return -1 - math.max(left, 0)
end

-- The lease is free but owners are queued (or were: live_head drops a stale flag).
local t = redis.call('TIME')
local now = ms_of(t)
local head = live_head(L, now)
if not head or head == owner then
  if head then
    dequeue(L, owner)
    redis.call('DEL', L .. ':w:' .. owner)
  end
  return grant(L, owner, ttl_ms, state[2], t)
end
-- Someone else is first in line (the previous lease expired without a release).
local head_ttl = hand_off(L, t)
if ARGV[3] then
  enqueue(now)
end
return -1 - tonumber(head_ttl)
