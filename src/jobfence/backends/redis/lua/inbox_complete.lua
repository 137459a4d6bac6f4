-- Complete claims: store each result, owner-checked; one claim (complete) or a batch
-- (complete_many), ONE atomic script (inbox_lib.lua is prepended).
--
-- KEYS[i]        the record's hash of claim i: "<table>:<key>"
-- ARGV[1]        retention, milliseconds: the record then expires natively (no purge needed)
-- ARGV[2i]       owner id of claim i
-- ARGV[2i + 1]   its serialised result (bytes)
--
-- Returns a list with 1 for each result stored, 0 for each claim that is not its owner's
-- (taken over, released, expired away).
local now = clock_ms()
local retention = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  out[i] = complete(KEYS[i], ARGV[2 * i], ARGV[2 * i + 1], now, retention)
end
return out
