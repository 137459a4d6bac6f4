-- Complete a claim: store its result, owner-checked, in one atomic script.
--
-- KEYS[1]  the record's hash: "<table>:<key>"
-- ARGV[1]  owner id of the claim
-- ARGV[2]  serialised result (bytes)
-- ARGV[3]  retention, milliseconds: the record then expires natively (no purge needed)
--
-- Returns 1 if stored, 0 if the claim is not ours (taken over, released, expired away).
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[1] then
    return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 'completed', 'r', ARGV[2], 'e', now + retention)
redis.call('PEXPIRE', KEYS[1], retention)
return 1
