-- Extend in-progress claims, owner-checked: one claim (extend) or many (renew), ONE atomic
-- script.
--
-- KEYS[i]        the record's hash of claim i: "<table>:<key>"
-- ARGV[1]        retention, milliseconds (the record is kept this long past its new deadline,
--                as inbox_claim.lua does)
-- ARGV[2i]       owner id of claim i
-- ARGV[2i + 1]   its new ttl, milliseconds (replaces the remaining lifetime)
--
-- Returns a list with 1 for each claim still in progress, owned by its owner and not past its
-- deadline (now extended), and 0 for every other (left untouched: an expired claim is never
-- extended, another worker may take it over). Time is Redis's clock.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
    local ok = 0
    local rec = redis.call('HMGET', KEYS[i], 's', 'o', 'e')
    if rec[1] == 'in_progress' and rec[2] == ARGV[2 * i] and tonumber(rec[3]) > now then
        local exp = now + tonumber(ARGV[2 * i + 1])
        redis.call('HSET', KEYS[i], 'e', exp)
        redis.call('PEXPIREAT', KEYS[i], exp + retention)
        ok = 1
    end
    out[i] = ok
end
return out
