-- Claim an idempotency key: ONE atomic script (the inbox's SET NX, with takeover).
--
-- KEYS[1]  the record's hash: "<table>:<key>"
-- ARGV[1]  owner id of this claim (host:pid:uuid, unique per claim)
-- ARGV[2]  payload fingerprint, or "" for none
-- ARGV[3]  claim ttl, milliseconds
-- ARGV[4]  retention, milliseconds (an abandoned claim's record is kept this long past its
--          deadline, so that a late takeover still counts attempts; then Redis expires it)
--
-- Hash fields: s state ('in_progress' | 'completed'), o owner (absent after release),
-- x the owner that released it last,
-- a attempt, f fingerprint (absent: none given), r result (serialised), e expiry in ms
-- (in progress: the claim's deadline; completed: end of retention), c when the current
-- attempt was claimed, in ms (absent in records written before jobfence recorded it). Time
-- is Redis's clock.
--
-- Takes the key when it is new, or in progress past its deadline (attempt + 1; refused when
-- both fingerprints are set and differ), or completed past retention (attempt 1).
-- Returns {mine 1|0, state, owner, attempt, fingerprint, result, expires_ms}; absent values
-- come back as nil.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec = redis.call('HMGET', KEYS[1], 's', 'o', 'a', 'f', 'r', 'e')
local attempt = 1
if rec[1] then
    local exp = tonumber(rec[6])
    if rec[1] == 'completed' then
        if exp > now then
            return {0, 'completed', false, tonumber(rec[3]), rec[4], rec[5], exp}
        end
    elseif rec[2] == ARGV[1] then
        -- already ours: this is a re-send after a lost reply (owners are unique per claim)
        return {1, 'in_progress', ARGV[1], tonumber(rec[3]), rec[4], false, exp}
    else
        local fp_ok = (not rec[4]) or ARGV[2] == '' or rec[4] == ARGV[2]
        if exp > now or not fp_ok then
            return {0, 'in_progress', rec[2], tonumber(rec[3]), rec[4], false, exp}
        end
        attempt = tonumber(rec[3]) + 1
    end
end
local exp = now + tonumber(ARGV[3])
local fp = ARGV[2]
if rec[1] then
    if fp == '' and rec[1] == 'in_progress' and rec[4] then
        fp = rec[4]  -- a takeover without a fingerprint keeps the key's
    end
    redis.call('DEL', KEYS[1])  -- a takeover starts a fresh record
end
if fp ~= '' then
    redis.call('HSET', KEYS[1], 's', 'in_progress', 'o', ARGV[1], 'a', attempt, 'e', exp,
        'c', now, 'f', fp)
else
    redis.call('HSET', KEYS[1], 's', 'in_progress', 'o', ARGV[1], 'a', attempt, 'e', exp,
        'c', now)
end
redis.call('PEXPIREAT', KEYS[1], exp + tonumber(ARGV[4]))
return {1, 'in_progress', ARGV[1], attempt, fp, false, exp}
