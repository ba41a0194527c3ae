-- Every live pod's beat. KEYS[1] the set of pod ids; ARGV[1] pod key prefix.
-- Pod ids whose key expired are removed from the set. Returns the beats (JSON strings).
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local beat = redis.call('GET', ARGV[1] .. id)
  if beat then
    out[#out + 1] = beat
  else
    redis.call('SREM', KEYS[1], id)
  end
end
return out
