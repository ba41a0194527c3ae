-- Prelude of every script that grants or renews (DESIGN §3, Redis amnesia).
-- The epoch key marks one life of Redis's memory (`{random}@{created ms}`); the
-- quarantine key (PX = lease + lock_delay) blocks every grant while leases of
-- that life may still be in use; the server key holds the `run_id` of the
-- Redis process that wrote it, so a restart from an older snapshot or a
-- failover to another server is seen by the first script that runs there.
--
-- check_epoch returns (state, current epoch, quarantine ms left, 0 = none):
--   'amnesia'    the epoch key was missing (Redis forgot, or a brand-new cluster):
--                `fresh` becomes the new epoch, with a quarantine;
--   'restarted'  the epoch survived but the server changed (restart from a
--                snapshot, failover) or its mark was lost: keys may be from the
--                past, so a quarantine starts (if none runs); surviving leases go on;
--   'changed'    the epoch differs from `known` (another pod saw amnesia): the
--                caller's leases are lost; a quarantine starts only if `known` is
--                younger than the epoch Redis holds (the store went back in time),
--                or this epoch is younger than a quarantine and its key was lost
--                (a stale pod coming back long after does not stop the cluster again);
--   'same'       nothing happened (`known` empty: a new pod adopts the epoch).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Starts a quarantine of `ms` (its value says why) unless one with at least
-- that much left runs; returns ms left.
local function quarantine(quarantine_key, reason, ms)
  local left = redis.call('PTTL', quarantine_key)
  if left < ms then
    redis.call('SET', quarantine_key, reason, 'PX', ms)
    return ms
  end
  return left
end

local function check_epoch(epoch_key, quarantine_key, server_key, known, fresh, quarantine_ms)
  local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or '?'
  local current = redis.call('GET', epoch_key)
  if not current then
    current = fresh .. '@' .. now_ms()
    redis.call('SET', epoch_key, current)
    redis.call('SET', server_key, run_id)
    redis.call('SET', quarantine_key, 'amnesia: the epoch key was gone (Redis forgot everything, or a new cluster)',
      'PX', quarantine_ms)
    return 'amnesia', current, quarantine_ms
  end
  if redis.call('GET', server_key) ~= run_id then
    redis.call('SET', server_key, run_id)
    local why = 'restarted: another Redis server (restart from a snapshot, failover): keys may be from the past'
    return 'restarted', current, quarantine(quarantine_key, why, quarantine_ms)
  end
  local left = redis.call('PTTL', quarantine_key)
  if left == -1 then
    -- a quarantine without a TTL is corrupt: restart it rather than block forever
    redis.call('PEXPIRE', quarantine_key, quarantine_ms)
    left = quarantine_ms
  end
  if left < 0 then
    left = 0
  end
  if known ~= '' and known ~= current then
    local created = tonumber(string.match(current, '@(%d+)$'))
    local known_created = tonumber(string.match(known, '@(%d+)$'))
    if created and known_created and known_created > created then
      -- The caller has seen a younger epoch: the store went back to an older state.
      left = quarantine(quarantine_key, 'rollback: an epoch older than one a pod already saw', quarantine_ms)
    elseif left == 0 and created then
      local owed = created + quarantine_ms - now_ms()
      if owed > 0 then
        left = quarantine(quarantine_key, 'amnesia: the quarantine of a new epoch was lost', owed)
      end
    end
    return 'changed', current, left
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
