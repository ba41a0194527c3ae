-- Release: compare-and-delete. KEYS[1] slot, ARGV[1] grant.
-- Returns 1 when the slot was ours and is free now, 0 when it was not ours (nothing changed).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
