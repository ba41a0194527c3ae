-- A pod's heartbeat. KEYS[1] the pod's key, KEYS[2] the set of pod ids.
-- ARGV[1] the beat (JSON), ARGV[2] TTL ms (3 x heartbeat), ARGV[3] pod id, ARGV[4] pod key prefix.
-- Also forgets up to 8 random pod ids whose key expired, so the set stays bounded.
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
local sample = redis.call('SRANDMEMBER', KEYS[2], 8)
for _, id in ipairs(sample) do
  if redis.call('EXISTS', ARGV[4] .. id) == 0 then
    redis.call('SREM', KEYS[2], id)
  end
end
return 1
