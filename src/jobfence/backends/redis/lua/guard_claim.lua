-- A guarded call's lease and idempotency claim, taken in ONE atomic script when its lock and
-- its inbox are on the same database of one Redis server (lock_lib.lua and inbox_lib.lua are
-- prepended): the lease exactly as lock_acquire.lua's plain try takes it, then -- only if the
-- lease was taken -- the key exactly as inbox_claim.lua claims it.
--
-- KEYS[1]   L, the lease's key (the lock backend's "<namespace>:lock:{<name>}")
-- KEYS[2]   the record's hash of the claim: "<table>:<key>"
-- ARGV[1]   owner id of the lease
-- ARGV[2]   the lease's ttl in ms (integer > 0)
-- ARGV[3]   the inbox's retention, ms
-- ARGV[4]   owner id of the claim
-- ARGV[5]   its payload fingerprint, or "" for none
-- ARGV[6]   its ttl, ms
--
-- Returns {token, claim reply (inbox_lib's claim())} when the lease was taken; the lease is
-- kept whatever the claim's state (a duplicate, or a claim in progress elsewhere: the caller
-- releases it, as it releases any lease it took). {-1 - ms until the current lease expires}
-- when the lease is not free: then nothing was claimed.
--
-- The server's clock is read once (TIME), for the lease's token and the claim's times.
local t = redis.call('TIME')
local token = acquire(KEYS[1], ARGV[1], ARGV[2], nil, nil, t)
if token <= 0 then
  return {token}
end
return {token, claim(KEYS[2], ARGV[4], ARGV[5], tonumber(ARGV[6]), ms_of(t), tonumber(ARGV[3]))}
