-- jobfence Redis inbox: helpers shared by inbox_claim.lua, inbox_complete.lua,
-- inbox_complete_held.lua and the guard's scripts (guard_claim.lua, guard_complete.lua): this
-- file is prepended to each when the inbox loads it.
--
-- A record is a hash "<table>:<key>". Fields: s state ('in_progress' | 'completed'), o owner
-- (absent after release), x the owner that released it last, a attempt, f fingerprint
-- (absent: none given), r result (serialised), e expiry in ms (in progress: the claim's
-- deadline; completed: end of retention), c when the current attempt was claimed, in ms
-- (absent in records written before jobfence recorded it). Time is Redis's clock.
--
-- As with lock_lib.lua, a script gets only the functions of this file it calls.

-- The server's clock in milliseconds.
local function clock_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Claim the record key for owner (fingerprint fp, "" for none) for ttl ms at server time
-- now; retention: how long (ms) an abandoned claim's record is kept past its deadline, so
-- that a late takeover still counts attempts (then Redis expires it).
--
-- The key is taken when it is new, or in progress past its deadline (attempt + 1; refused
-- when both fingerprints are set and differ), or completed past retention (attempt 1).
-- Returns {mine 1|0, state, owner, attempt, fingerprint, result, expires_ms}, absent values
-- coming back as nil; or, for a key that was new (taken, attempt 1, the caller's own
-- fingerprint), only its expires_ms, a number: the caller knows the rest, and a bare number
-- costs the client far less to read than a seven-element array.
local function claim(key, owner, fp, ttl, now, retention)
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

-- The second half of complete(): store result as the record key's (its owner checked by the
-- caller) at server time now; the record then expires after retention ms. Returns 1.
local function store(key, result, now, retention)
  redis.call('HSET', key, 's', 'completed', 'r', result, 'e', now + retention)
  redis.call('PEXPIRE', key, retention)
  return 1
end

-- Store result as the record key's, owner-checked, at server time now; the record then
-- expires after retention ms. Returns 1 if stored, 0 if the claim is not owner's (taken
-- over, released, expired away).
local function complete(key, owner, result, now, retention)
  if redis.call('HGET', key, 'o') ~= owner then
    return 0
  end
  return store(key, result, now, retention)
end
