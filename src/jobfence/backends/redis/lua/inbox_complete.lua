-- Complete claims: store each result, owner-checked; one claim (complete) or a batch
-- (complete_many), ONE atomic script.
--
-- KEYS[i]        the record's hash of claim i: "<table>:<key>"
-- ARGV[1]        retention, milliseconds: the record then expires natively (no purge needed)
-- ARGV[2i]       owner id of claim i
-- ARGV[2i + 1]   its serialised result (bytes)
--
-- Returns a list with 1 for each result stored, 0 for each claim that is not its owner's
-- (taken over, released, expired away).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
    local ok = 0
    if redis.call('HGET', KEYS[i], 'o') == ARGV[2 * i] then
        redis.call('HSET', KEYS[i], 's', 'completed', 'r', ARGV[2 * i + 1], 'e', now + retention)
        redis.call('PEXPIRE', KEYS[i], retention)
        ok = 1
    end
    out[i] = ok
end
return out
