-- Complete one claim only while a lease on the same server is still its holder's: the
-- guarded call's lease check and its completion in ONE atomic script (one round trip).
-- lock_lib.lua and inbox_lib.lua are prepended.
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
if not held_by(KEYS[2], ARGV[4]) then
  return -1
end
return complete(KEYS[1], ARGV[2], ARGV[3], clock_ms(), tonumber(ARGV[1]))
