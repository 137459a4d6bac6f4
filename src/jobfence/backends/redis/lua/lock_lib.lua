-- jobfence Redis lock backend: helpers shared by lock_acquire.lua, lock_release.lua,
-- lock_cancel_wait.lua, and by the inbox's scripts that read or take a lease of the same
-- server (inbox_complete_held.lua, guard_claim.lua, guard_complete.lua): this file is
-- prepended to each when its backend loads it.
--
-- Key layout for a lock name N in namespace S. N sits between literal braces, so all keys
-- of one name share a Redis Cluster hash tag; N is only ever data (KEYS/ARGV), never code.
-- A script receives the lease key L = "S:lock:{N}" as KEYS[1] and derives the others by
-- suffix (a lease key always ends with "}", a derived key never does, so they can't clash):
--
--   L              STRING  "<token>:<owner>", PX = the lease ttl (server clock)
--   L..":tok"      STRING  fencing-token counter: max(counter + 1, TIME in microseconds),
--                          expiring max(10 * ttl, 1 day) after its last use
--   L..":q"        ZSET    waiting owners scored by arrival sequence (the FIFO queue)
--   L..":qd"       HASH    owner -> "<deadline_ms>:<ttl_ms>" of each waiter
--   L..":qf"       STRING  "1" while anyone may wait (PX = the queue's own expiry), so an
--                          uncontended acquire or release reads the lease, the counter and
--                          this flag with one MGET instead of probing the queue
--   L..":w:"..O    LIST    owner O's wake list: the token, pushed when the lease is
--                          handed to O; PEXPIRE = the handed lease's ttl
--   L..":rel"      STRING  the owner that last released L, for 60 s, so a re-sent
--                          release of that owner still answers 1 (idempotent release)
--
-- Uncontended, an acquire runs MGET, TIME, SET, SET and a release MGET, DEL, SET.
--
-- Each script gets only the functions of this file that it calls (directly or through another
-- one): the backends load it with load_lua(..., needed_only=True), which drops the rest, so a
-- call does not define functions it never runs. A function is a block from a line
-- "local function NAME(" to the next line "end" at the start of a line.
-- Waiters queued by an earlier version (which sets no :qf) are not seen by these two
-- paths: a newcomer may go first, and a release does not hand off to them; they take the
-- lease by their own polling once it is free. A held lease is never taken over.
--
-- Numbers are formatted with string.format('%d'): Lua's own number-to-string conversion
-- prints 16-digit tokens in exponent notation.

-- A TIME reply in milliseconds, and the server's clock in milliseconds.
local function ms_of(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function now_ms()
  return ms_of(redis.call('TIME'))
end

-- The next fencing token of lease key L: max(counter + 1, server time in microseconds).
-- The clock floor applies on EVERY grant, not only when the counter is missing: a restart
-- that lost the counter, or restored an older one (an RDB snapshot, an AOF missing its last
-- writes, a failover to a lagging replica), must never hand out a token again. No earlier
-- token can have outrun the clock (that would take more than a million grants per second
-- on one name), so the floor is above every token issued before. (A server clock stepped
-- backwards by more than the outage would defeat it, as on every backend.) The counter
-- expires max(10 * ttl, 1 day) after its last use, so counters of names no longer used do
-- not pile up: a reseeded counter starts at the clock, above every earlier token.
-- prev: the counter's value when the caller read it already (false: no counter), nil to read;
-- t: the script's TIME reply when it has one, nil to ask. Returns the token, and as a decimal
-- string.
local function next_token(L, ttl_ms, prev, t)
  local tok = L .. ':tok'
  if prev == nil then
    prev = redis.call('GET', tok)
  end
  prev = tonumber(prev)
  t = t or redis.call('TIME')
  local n = tonumber(t[1] .. string.format('%06d', tonumber(t[2])))
  if prev and prev >= n then
    n = prev + 1
  end
  local s = string.format('%d', n)
  redis.call('SET', tok, s, 'PX', string.format('%d', math.max(tonumber(ttl_ms) * 10, 86400000)))
  return n, s
end

-- Owner and token of a lease value "<token>:<owner>" (the owner may contain ':');
-- nil for a value jobfence did not write (then nobody's owner check passes).
local function split_lease(v)
  local sep = string.find(v, ':', 1, true)
  if not sep then
    return nil, nil
  end
  return string.sub(v, sep + 1), tonumber(string.sub(v, 1, sep - 1))
end

-- Give the lease L to owner for ttl_ms (a decimal string); return its token. prev, t: as for
-- next_token.
local function grant(L, owner, ttl_ms, prev, t)
  local n, s = next_token(L, ttl_ms, prev, t)
  redis.call('SET', L, s .. ':' .. owner, 'PX', ttl_ms)
  return n
end

-- Drop the waiters flag of L once its queue is gone (its last entry left). A flag left behind
-- meanwhile only sends the next acquire or release to live_head, which drops it.
local function tidy(L)
  if redis.call('EXISTS', L .. ':q') == 0 then
    redis.call('DEL', L .. ':qf', L .. ':qd')
  end
end

-- The first waiter whose deadline has not passed, and its ttl in ms (a decimal string);
-- dead entries are purged.
local function live_head(L, now)
  local q, qd = L .. ':q', L .. ':qd'
  while true do
    local first = redis.call('ZRANGE', q, 0, 0)
    if #first == 0 then
      redis.call('DEL', L .. ':qf', qd)
      return nil, nil
    end
    local o = first[1]
    local d = redis.call('HGET', qd, o)
    if d then
      local sep = string.find(d, ':', 1, true)
      if tonumber(string.sub(d, 1, sep - 1)) > now then
        return o, string.sub(d, sep + 1)
      end
    end
    redis.call('ZREM', q, o)
    redis.call('HDEL', qd, o)
  end
end

-- Remove owner from the queue of L.
local function dequeue(L, owner)
  redis.call('ZREM', L .. ':q', owner)
  redis.call('HDEL', L .. ':qd', owner)
end

-- Hand L to the queue's live head: it leaves the queue, owns the lease (new token, its own
-- ttl), and the token is pushed onto its wake list -- one waiter woken, already the owner.
-- Returns the head's ttl in ms (a string), or nil if nobody live waits. t: a TIME reply.
local function hand_off(L, t)
  local head, ttl_ms = live_head(L, ms_of(t))
  if not head then
    return nil
  end
  dequeue(L, head)
  local n, s = next_token(L, ttl_ms, nil, t)
  redis.call('SET', L, s .. ':' .. head, 'PX', ttl_ms)
  local wake = L .. ':w:' .. head
  redis.call('DEL', wake)
  redis.call('LPUSH', wake, s)
  redis.call('PEXPIRE', wake, ttl_ms)
  return ttl_ms
end

-- Whether owner holds the lease L right now.
local function held_by(L, owner)
  local v = redis.call('GET', L)
  if not v then
    return false
  end
  return split_lease(v) == owner
end

-- One acquire attempt of owner on L for ttl_ms (a decimal string): all of lock_acquire.lua,
-- shared with guard_claim.lua. wait_ms and slack_ms are nil for a plain try, which never
-- enqueues; else the wait and the waiter slack in ms (an entry's deadline is now + wait +
-- slack).
--
-- Returns the fencing token (> 0) when owner holds the lease after the call, else
-- -1 - (ms until the current lease expires), so the caller knows how long a wait may last.
--
-- t: the script's TIME reply when the caller has one (guard_claim.lua reads the clock once
-- for the lease and the claim), nil to ask when needed.
--
-- Fast path (lease free, nobody queued): MGET of the lease, the counter and the waiters
-- flag, TIME, SET PX of the lease and of the counter. Fairness: a free lease with a live
-- queue goes to the queue's head, not to the caller (unless the caller is the head); a
-- waiting caller joins the tail of the queue or refreshes its entry's deadline.
local function acquire(L, owner, ttl_ms, wait_ms, slack_ms, t)
  local state = redis.call('MGET', L, L .. ':tok', L .. ':qf')
  local v = state[1]
  if not v and not state[3] then
    return grant(L, owner, ttl_ms, state[2], t)
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
    local keep = tonumber(wait_ms) + tonumber(slack_ms)
    redis.call('HSET', qd, owner, string.format('%d', now + keep) .. ':' .. ttl_ms)
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
    if wait_ms then
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
  t = t or redis.call('TIME')
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
  if wait_ms then
    enqueue(now)
  end
  return -1 - tonumber(head_ttl)
end

-- The second half of release(): owner holds L (checked by the caller, which read the lease
-- and the waiters flag qf with one MGET of L and L..":qf"); it gives the lease up: to the
-- first live waiter if qf is set, else by deleting it, and remembers owner as the releaser.
-- t: the script's TIME reply when it has one, nil to ask (only a hand-off needs it).
local function release_held(L, owner, force, qf, t)
  if not qf or not hand_off(L, t or redis.call('TIME')) then
    redis.call('DEL', L)
  end
  if not force then
    redis.call('SET', L .. ':rel', owner, 'PX', 60000)
  end
  return 1
end

-- Release L for owner (force: whoever holds it, administrative): all of lock_release.lua,
-- shared with guard_complete.lua.
--
-- Returns 1 if the lease was released, 0 if owner did not hold it (nothing is changed).
-- Idempotent for its owner: the releasing owner is remembered in L..":rel" for a minute,
-- so a release that redis-py re-sends after a lost reply (the first one did release)
-- still answers 1 instead of reporting the lease as lost. Owners are unique per lease.
-- With live waiters queued, the first one gets the lease at once (new token, its own ttl)
-- and the token is pushed onto its wake list: one waiter woken, already owning the lease.
-- Waiters whose deadline passed (they stopped polling: crashed or gave up) are skipped.
-- Uncontended (no waiters flag): MGET of the lease and the flag, DEL, SET of the marker.
local function release(L, owner, force)
  local state = redis.call('MGET', L, L .. ':qf')
  local v = state[1]
  if not v or (not force and split_lease(v) ~= owner) then
    if not force and redis.call('GET', L .. ':rel') == owner then
      return 1
    end
    return 0
  end
  return release_held(L, owner, force, state[2])
end
