-- jobfence Redis queue backend: helpers of the scripts that read or finish deliveries,
-- prepended after queue_lib.lua. Each script gets only the functions of this file it calls
-- (load_lua(..., needed_only=True)): each helper defined is work done on every run of the
-- script, and publish, purge and stats need none of them.

-- The entry id and delivery number of a receipt "<entry id>:<delivery>", or nil.
local function parse_receipt(receipt)
  return string.match(receipt, '^(%d+%-%d+):(%d+)$')
end

-- The entry id of a receipt if that delivery is still consumer's, else nil.
local function owned(receipt, consumer)
  local id, delivery = parse_receipt(receipt)
  if not id or redis.call('HGET', O, id) ~= delivery .. ':' .. consumer then
    return nil, nil
  end
  return id, delivery
end

-- A field list {k1, v1, k2, v2, ...} as a table.
local function field_map(fields)
  local out = {}
  for j = 1, #fields, 2 do
    out[fields[j]] = fields[j + 1]
  end
  return out
end

-- The fields of stream entry id, as a table, or nil if it is gone.
local function entry_fields(id)
  local found = redis.call('XRANGE', S, id, id)
  if #found == 0 then
    return nil
  end
  return field_map(found[1][2])
end

-- The delivery of entry id ends: it leaves the group's pending list, the stream (so the
-- stream holds only live messages) and the in-flight records.
local function finish(id)
  redis.call('XACK', S, GROUP, id)
  redis.call('XDEL', S, id)
  redis.call('ZREM', F, id)
  redis.call('HDEL', O, id)
end
