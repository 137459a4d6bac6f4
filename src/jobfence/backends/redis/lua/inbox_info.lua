-- Read inbox records for operators (Inbox.claims / claim_info): ONE read-only script for one
-- or many records, so that every record's time left is measured on Redis's clock.
--
-- KEYS[i]  the record's hash: "<table>:<key>"
--
-- Returns one entry per key, in order: false when there is no record (or the key is not an
-- inbox record), else {state, owner, attempt, fingerprint, claimed_ms, expires_in_ms}:
-- claimed_ms is when the current attempt was claimed (ms since the epoch; false for a record
-- written before the field existed), expires_in_ms the ms left until the claim's deadline
-- (in progress) or the end of retention (completed), negative once past. Fields as in
-- inbox_claim.lua.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
    local rec = redis.call('HMGET', KEYS[i], 's', 'o', 'a', 'f', 'c', 'e')
    if rec[1] and rec[6] then
        out[i] = {rec[1], rec[2], tonumber(rec[3]), rec[4], rec[5], tonumber(rec[6]) - now}
    else
        out[i] = false
    end
end
return out
