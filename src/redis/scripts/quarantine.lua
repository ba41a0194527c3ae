-- Partial amnesia reported by a pod (DESIGN §3): a renew found its slot key
-- missing or re-granted while its lease was still locally valid, so Redis lost
-- keys (eviction, a rollback, a lagging replica). No pool grants anything for
-- lease + lock_delay from now (a longer quarantine already running is kept).
-- KEYS[1] quarantine. ARGV[1] quarantine ms, ARGV[2] the evidence (the quarantine's reason).
-- Returns the quarantine ms left.
local left = redis.call('PTTL', KEYS[1])
local ms = tonumber(ARGV[1])
if left < ms then
  redis.call('SET', KEYS[1], 'partial amnesia: ' .. ARGV[2], 'PX', ms)
  return ms
end
return left
