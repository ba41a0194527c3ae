-- A pod leaves (graceful stop). KEYS[1] the pod's key, KEYS[2] the set of pod ids; ARGV[1] pod id.
redis.call('DEL', KEYS[1])
return redis.call('SREM', KEYS[2], ARGV[1])
