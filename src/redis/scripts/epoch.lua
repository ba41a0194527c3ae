-- Prelude of every script that grants or renews (DESIGN §3, Redis amnesia).
-- The epoch key marks one life of Redis's memory; the quarantine key (PX =
-- lease + lock_delay) blocks every grant after amnesia was detected.
--
-- check_epoch returns (state, current epoch, quarantine ms left, 0 = none):
--   'amnesia'  the epoch key was missing (Redis forgot, or a brand-new cluster):
--              `fresh` is written as the new epoch together with a quarantine;
--   'changed'  the epoch differs from `known` (another pod saw amnesia, or a
--              failover went back in time): a quarantine is started if none runs;
--   'same'     nothing happened (`known` empty: a new pod adopts the epoch).
local function check_epoch(epoch_key, quarantine_key, known, fresh, quarantine_ms)
  local current = redis.call('GET', epoch_key)
  if not current then
    redis.call('SET', epoch_key, fresh)
    redis.call('SET', quarantine_key, fresh, 'PX', quarantine_ms)
    return 'amnesia', fresh, quarantine_ms
  end
  local left = redis.call('PTTL', quarantine_key)
  if left == -1 then
    -- a quarantine without a TTL is corrupt: restart it rather than block forever
    redis.call('PEXPIRE', quarantine_key, quarantine_ms)
    left = quarantine_ms
  end
  if known ~= '' and known ~= current then
    if left < 0 then
      redis.call('SET', quarantine_key, current, 'PX', quarantine_ms)
      left = quarantine_ms
    end
    return 'changed', current, left
  end
  if left < 0 then
    left = 0
  end
  return 'same', current, left
end

-- Extends `key` if it still holds `grant`: 1 renewed, 0 key missing, -1 held by another grant.
local function renew_slot(key, grant, ttl_ms)
  local holder = redis.call('GET', key)
  if holder == grant then
    redis.call('PEXPIRE', key, ttl_ms)
    return 1
  end
  if not holder then
    return 0
  end
  return -1
end
