-- jobfence Redis queue backend: publish a batch of messages (queue_lib.lua is prepended).
--
-- ARGV[1] call id (random per call; a re-send publishes nothing again)
-- ARGV[2] delay in ms (0: ready at once)
-- ARGV[3i], ARGV[3i + 1], ARGV[3i + 2]  (i = 1, 2, ...) id, body and headers (JSON) of
--         message i, in publish order
--
-- Ready messages are appended to the stream (XADD wakes the consumers waiting on it); delayed
-- ones to the delayed stream, indexed by their due time in :d. Returns how many. The call id
-- is recorded in :mx only (see queue_lib.lua), before the messages are appended; a call that
-- fails is not recorded.

local call, delay = ARGV[1], tonumber(ARGV[2])
local count = (#ARGV - 2) / 3
local now = now_ms()
-- The call's record, added only if absent (one command): a re-send finds it and answers the
-- same count without publishing again.
if redis.call('ZADD', MX, 'NX', int(now + MEMO_MS), call) == 0 then
  return count
end
local ok, err = pcall(function()
  for j = 3, #ARGV, 3 do
    append(delay, now, ARGV[j], ARGV[j + 1], ARGV[j + 2], '0', int(now), false)
  end
end)
if not ok then
  -- a failed call leaves no record: a re-send runs it again
  redis.call('ZREM', MX, call)
  if type(err) == 'table' then
    return err
  end
  return redis.error_reply(tostring(err))
end
-- Call ids are random hex: one publish in 16 (its id ends in '0') forgets up to MEMO_TRIM
-- expired records, four per publish on average against the one each adds.
if string.byte(call, -1) == 48 then
  forget_expired(now)
end
return count
