-- jobfence Redis queue backend: helpers shared by every queue_*.lua script (this file is
-- prepended to each when the backend loads it; queue_lib_delivery.lua, after it, to those
-- that read or finish deliveries).
--
-- Keys of queue Q in namespace S; Q sits between literal braces, so every key of one queue
-- shares a Redis Cluster hash tag. Every script receives them in this order: all eight, or
-- the first five for the publish script (the only keys it touches):
--
--   KEYS[1] S:q:{Q}:s     STREAM  ready and in-flight messages (consumer group "jobfence")
--   KEYS[2] S:q:{Q}:d     ZSET    delayed messages: member "<ms:013>-<seq:010>" (the padded
--                                 id of the entry in :ds) -> due time (server time, ms)
--   KEYS[3] S:q:{Q}:ds    STREAM  the delayed messages' fields
--   KEYS[4] S:q:{Q}:m     HASH    call id -> the result of a call that changed something
--   KEYS[5] S:q:{Q}:mx    ZSET    call id -> when its result may be forgotten (server ms)
--   KEYS[6] S:q:{Q}:f     ZSET    entry id of each delivery in flight -> its visibility
--                                 deadline (server time, ms)
--   KEYS[7] S:q:{Q}:o     HASH    entry id -> "<delivery>:<consumer>" of that delivery
--   KEYS[8] S:q:{Q}:dead  STREAM  dead letters, oldest first
--
-- Message fields (the same in :s, :ds and :dead): i the message id, b the body, h the headers
-- (JSON, written and read by the client), n deliveries before this entry (0 when published,
-- the delivery count when nacked, the final count in :dead), t published_at (server ms),
-- e last error (absent: none), x dead_at (server ms, :dead only).
--
-- The group has one consumer, "jobfence": who holds a delivery is recorded in :o, per
-- delivery, so the group's consumer list never grows with the clients that come and go.
--
-- Re-sent calls: redis-py re-sends a script once when the connection breaks before the reply
-- came, and the first send may have run. Every script that changes something takes a call id
-- (ARGV[1], random per call) and records its result in :m for MEMO_MS; a re-send finds it
-- there and answers the same without doing anything again (no message published twice, no
-- ack answered False because the first send did ack). A publish records its call id in :mx
-- alone: its answer (the number of messages) follows from its arguments, which a re-send
-- repeats, so the record's presence is all a re-send needs. Expired records are forgotten
-- MEMO_TRIM at a time by every call that remembers one in :m, and by one publish in 16.
--
-- Numbers are written with string.format('%d'): Lua's own number-to-string conversion would
-- print large integers in exponent notation.

local S, D, DS, M, MX, F, O, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
  KEYS[7], KEYS[8]
local GROUP, GROUP_CONSUMER = 'jobfence', 'jobfence'
local MEMO_MS = 60000
local MEMO_TRIM = 64

-- The server's clock in milliseconds.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(n)
  return string.format('%d', n)
end

-- The stream with its consumer group: both are created together (a stream key of this
-- queue never exists without the group), from the first entry on.
local function ensure_stream()
  if redis.call('EXISTS', S) == 0 then
    redis.call('XGROUP', 'CREATE', S, GROUP, '0', 'MKSTREAM')
  end
end

-- The recorded result of call id, or nil.
local function recall(call)
  local v = redis.call('HGET', M, call)
  if v then
    return v
  end
  return nil
end

-- Forget up to MEMO_TRIM records whose time is over (a publish's record has no :m field: its
-- HDEL finds nothing).
local function forget_expired(now)
  local old = redis.call('ZRANGEBYSCORE', MX, '-inf', int(now), 'LIMIT', 0, MEMO_TRIM)
  if #old > 0 then
    redis.call('HDEL', M, unpack(old))
    redis.call('ZREM', MX, unpack(old))
  end
end

-- Record value (a string) as the result of call id, and forget a few expired records.
local function remember(call, value, now)
  forget_expired(now)
  redis.call('HSET', M, call, value)
  redis.call('ZADD', MX, int(now + MEMO_MS), call)
end

-- Append a message to the ready stream (now) or the delayed ones (delay_ms > 0). The
-- message is given as id, body, headers, prior deliveries, published_at, error (or false).
local function append(delay_ms, now, mid, body, headers, prior, published, err)
  local fields = {'i', mid, 'b', body, 'h', headers, 'n', prior, 't', published}
  if err then
    fields[#fields + 1] = 'e'
    fields[#fields + 1] = err
  end
  if delay_ms <= 0 then
    ensure_stream()
    redis.call('XADD', S, '*', unpack(fields))
    return
  end
  local entry = redis.call('XADD', DS, '*', unpack(fields))
  local ms, seq = string.match(entry, '^(%d+)-(%d+)$')
  -- padded, so that messages due in the same millisecond sort in the order they came
  local member = string.format('%013d-%010d', tonumber(ms), tonumber(seq))
  redis.call('ZADD', D, int(now + delay_ms), member)
end
