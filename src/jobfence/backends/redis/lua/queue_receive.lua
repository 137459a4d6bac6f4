-- jobfence Redis queue backend: deliver up to N messages to a consumer (queue_lib.lua is
-- prepended). Never blocks: the client waits between calls (XREAD BLOCK on the stream).
--
-- ARGV[1] call id (random per call; a re-send returns the same deliveries)
-- ARGV[2] consumer
-- ARGV[3] N, the most messages to deliver (> 0)
-- ARGV[4] visibility in ms: each delivery is hidden from others this long
-- ARGV[5] the most due delayed messages to move into the stream in this call
--
-- In order: (1) due delayed messages move into the stream, oldest due first; (2) deliveries
-- whose visibility deadline passed are delivered again to this consumer, delivery + 1
-- (XCLAIM, so that the group's pending list counts it too); (3) new entries are read with
-- XREADGROUP ... > and recorded in flight. Each delivery is recorded in :f (deadline) and
-- :o (delivery and consumer); its receipt is "<entry id>:<delivery>".
--
-- Returns {deliveries, wake_ms, last_id}: deliveries is a list of
-- {receipt, delivery, fields}; when it is empty, wake_ms is the time until the next delayed
-- message is due or the next visibility deadline passes (-1: none), and last_id the id of
-- the stream's last entry ("0-0" if none), from which the client's XREAD BLOCK waits for
-- a new entry.

local call, consumer = ARGV[1], ARGV[2]
local want, visibility, move_limit = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local out = {}

local function deliver(id, delivery, fields)
  redis.call('HSET', O, id, delivery .. ':' .. consumer)
  redis.call('ZADD', F, int(now + visibility), id)
  out[#out + 1] = {id .. ':' .. delivery, tonumber(delivery), fields}
end

-- a re-sent call: the deliveries the first send made, those still this consumer's
local before = recall(call)
if before then
  for receipt in string.gmatch(before, '%S+') do
    local id = owned(receipt, consumer)
    if id then
      local found = redis.call('XRANGE', S, id, id)
      if #found > 0 then
        local _, delivery = parse_receipt(receipt)
        out[#out + 1] = {receipt, tonumber(delivery), found[1][2]}
      end
    end
  end
  return {out, -1, '0-0'}
end

-- (1) due delayed messages into the stream
local due = redis.call('ZRANGEBYSCORE', D, '-inf', int(now), 'LIMIT', 0, move_limit)
if #due > 0 then
  ensure_stream()
  for _, member in ipairs(due) do
    local ms, seq = string.match(member, '^0*(%d+)-0*(%d+)$')
    local entry = ms .. '-' .. seq
    local found = redis.call('XRANGE', DS, entry, entry)
    if #found > 0 then
      redis.call('XADD', S, '*', unpack(found[1][2]))
      redis.call('XDEL', DS, entry)
    end
    redis.call('ZREM', D, member)
  end
end

-- (2) deliveries whose visibility passed
local expired = redis.call('ZRANGEBYSCORE', F, '-inf', int(now), 'LIMIT', 0, want)
for _, id in ipairs(expired) do
  local holder = redis.call('HGET', O, id)
  local claimed = redis.call('XCLAIM', S, GROUP, GROUP_CONSUMER, 0, id)
  local entry = claimed[1]
  if holder and entry and entry[2] then
    local delivery = tonumber(string.match(holder, '^(%d+):')) + 1
    deliver(id, int(delivery), entry[2])
  else  -- the entry is gone (deleted by hand): forget the delivery
    finish(id)
  end
end

-- (3) new entries
if #out < want and redis.call('EXISTS', S) == 1 then
  local read = redis.call('XREADGROUP', 'GROUP', GROUP, GROUP_CONSUMER, 'COUNT', want - #out,
    'STREAMS', S, '>')
  if read then
    for _, entry in ipairs(read[1][2]) do
      local fields = entry[2]
      local prior = field_map(fields)['n'] or '0'
      deliver(entry[1], int(tonumber(prior) + 1), fields)
    end
  end
end

if #out > 0 then
  local receipts = {}
  for j, delivery in ipairs(out) do
    receipts[j] = delivery[1]
  end
  remember(call, table.concat(receipts, ' '), now)
  return {out, -1, '0-0'}
end

-- nothing to deliver: when to look again, and where a new entry would come
local wake = -1
local next_due = redis.call('ZRANGE', D, 0, 0, 'WITHSCORES')
if #next_due > 0 then
  wake = math.max(0, tonumber(next_due[2]) - now)
end
local next_deadline = redis.call('ZRANGE', F, 0, 0, 'WITHSCORES')
if #next_deadline > 0 then
  local left = math.max(0, tonumber(next_deadline[2]) - now)
  if wake < 0 or left < wake then
    wake = left
  end
end
local last = redis.call('XREVRANGE', S, '+', '-', 'COUNT', 1)
local last_id = '0-0'
if #last > 0 then
  last_id = last[1][1]
end
return {out, wake, last_id}
