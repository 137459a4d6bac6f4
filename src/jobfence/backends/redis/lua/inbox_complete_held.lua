-- Complete one claim only while a lease on the same server is still its holder's: the
-- guarded call's lease check and its completion in ONE atomic script (one round trip).
--
-- KEYS[1]   the record's hash of the claim: "<table>:<key>"
-- KEYS[2]   the lease's key (the lock backend's "<namespace>:lock:{<name>}"), whose value is
--           "<token>:<owner>" while the lease is held
-- ARGV[1]   retention, milliseconds: the record then expires natively
-- ARGV[2]   owner id of the claim
-- ARGV[3]   its serialised result (bytes)
-- ARGV[4]   owner id of the lease
--
-- Returns 1 if the result was stored, 0 if the claim is not its owner's (taken over,
-- released, expired away), -1 if the lease is gone or held by another owner: then nothing
-- is written, and the claim stays as it was.
local v = redis.call('GET', KEYS[2])
local held = false
if v then
    local sep = string.find(v, ':', 1, true)
    held = sep ~= nil and string.sub(v, sep + 1) == ARGV[4]
end
if not held then
    return -1
end
if redis.call('HGET', KEYS[1], 'o') ~= ARGV[2] then
    return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[1])
redis.call('HSET', KEYS[1], 's', 'completed', 'r', ARGV[3], 'e', now + retention)
redis.call('PEXPIRE', KEYS[1], retention)
return 1
