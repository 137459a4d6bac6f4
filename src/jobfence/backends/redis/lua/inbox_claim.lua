-- Claim idempotency keys: one key (claim) or a batch (claim_many), ONE atomic script (the
-- inbox's SET NX, with takeover).
--
-- KEYS[i]        the record's hash of claim i: "<table>:<key>" (distinct)
-- ARGV[1]        retention, milliseconds (an abandoned claim's record is kept this long past
--                its deadline, so that a late takeover still counts attempts; then Redis
--                expires it)
-- ARGV[3i - 1]   owner id of claim i (host:pid:uuid, unique per claim)
-- ARGV[3i]       its payload fingerprint, or "" for none
-- ARGV[3i + 1]   its ttl, milliseconds
--
-- Hash fields: s state ('in_progress' | 'completed'), o owner (absent after release),
-- x the owner that released it last,
-- a attempt, f fingerprint (absent: none given), r result (serialised), e expiry in ms
-- (in progress: the claim's deadline; completed: end of retention), c when the current
-- attempt was claimed, in ms (absent in records written before jobfence recorded it). Time
-- is Redis's clock.
--
-- Each key is taken when it is new, or in progress past its deadline (attempt + 1; refused
-- when both fingerprints are set and differ), or completed past retention (attempt 1).
-- Returns one reply per key, in order: {mine 1|0, state, owner, attempt, fingerprint, result,
-- expires_ms}, absent values coming back as nil; or, for a key that was new (taken, attempt 1,
-- the caller's own fingerprint), only its expires_ms, a number: the caller knows the rest, and
-- a bare number costs the client far less to read than a seven-element array.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local retention = tonumber(ARGV[1])

local function claim(key, owner, fp, ttl)
    local rec = redis.call('HMGET', key, 's', 'o', 'a', 'f', 'r', 'e')
    local attempt = 1
    if rec[1] then
        local exp = tonumber(rec[6])
        if rec[1] == 'completed' then
            if exp > now then
                return {0, 'completed', false, tonumber(rec[3]), rec[4], rec[5], exp}
            end
        elseif rec[2] == owner then
            -- already ours: this is a re-send after a lost reply (owners are unique per claim)
            return {1, 'in_progress', owner, tonumber(rec[3]), rec[4], false, exp}
        else
            local fp_ok = (not rec[4]) or fp == '' or rec[4] == fp
            if exp > now or not fp_ok then
                return {0, 'in_progress', rec[2], tonumber(rec[3]), rec[4], false, exp}
            end
            attempt = tonumber(rec[3]) + 1
        end
    end
    local exp = now + ttl
    if rec[1] then
        if fp == '' and rec[1] == 'in_progress' and rec[4] then
            fp = rec[4]  -- a takeover without a fingerprint keeps the key's
        end
        redis.call('DEL', key)  -- a takeover starts a fresh record
    end
    if fp ~= '' then
        redis.call('HSET', key, 's', 'in_progress', 'o', owner, 'a', attempt, 'e', exp,
            'c', now, 'f', fp)
    else
        redis.call('HSET', key, 's', 'in_progress', 'o', owner, 'a', attempt, 'e', exp,
            'c', now)
    end
    redis.call('PEXPIREAT', key, exp + retention)
    if not rec[1] then
        return exp
    end
    return {1, 'in_progress', owner, attempt, fp, false, exp}
end

local out = {}
for i = 1, #KEYS do
    out[i] = claim(KEYS[i], ARGV[3 * i - 1], ARGV[3 * i], tonumber(ARGV[3 * i + 1]))
end
return out
