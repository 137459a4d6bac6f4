-- Claim idempotency keys: one key (claim) or a batch (claim_many), ONE atomic script (the
-- inbox's SET NX, with takeover); inbox_lib.lua is prepended (its claim() says what a claim
-- takes and returns).
--
-- KEYS[i]        the record's hash of claim i: "<table>:<key>" (distinct)
-- ARGV[1]        retention, milliseconds (an abandoned claim's record is kept this long past
--                its deadline, so that a late takeover still counts attempts; then Redis
--                expires it)
-- ARGV[3i - 1]   owner id of claim i (host:pid:uuid, unique per claim)
-- ARGV[3i]       its payload fingerprint, or "" for none
-- ARGV[3i + 1]   its ttl, milliseconds
--
-- Returns one reply per key, in order (claim()'s).
local now = clock_ms()
local retention = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  out[i] = claim(KEYS[i], ARGV[3 * i - 1], ARGV[3 * i], tonumber(ARGV[3 * i + 1]), now, retention)
end
return out
