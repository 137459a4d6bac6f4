-- Release an in-progress claim so that the next claim takes it over (attempt + 1).
--
-- KEYS[1]  the record's hash: "<table>:<key>"
-- ARGV[1]  owner id of the claim
--
-- Returns 1 if released, 0 if the claim is not ours or not in progress. A re-send after a
-- lost reply answers 1 again: the releasing owner is kept in field x.
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'e', 'x')
if rec[1] ~= 'in_progress' or rec[2] ~= ARGV[1] then
    if rec[4] == ARGV[1] then
        return 1
    end
    return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HDEL', KEYS[1], 'o')
redis.call('HSET', KEYS[1], 'x', ARGV[1])
if tonumber(rec[3]) > now then
    redis.call('HSET', KEYS[1], 'e', now)
end
return 1
