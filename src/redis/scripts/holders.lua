-- Holders of a pool, for status. KEYS = the pool's slot keys in slot order.
-- Returns a flat list {slot index, grant, PTTL ms, ...} of the held slots.
local out = {}
for i = 1, #KEYS do
  local grant = redis.call('GET', KEYS[i])
  if grant then
    out[#out + 1] = i
    out[#out + 1] = grant
    out[#out + 1] = redis.call('PTTL', KEYS[i])
  end
end
return out
