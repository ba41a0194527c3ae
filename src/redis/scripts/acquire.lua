-- Acquire: the first free slot among the candidates (or the one requested).
-- KEYS[1] epoch, KEYS[2] quarantine, KEYS[3] server, KEYS[4..] candidate slot keys, in slot order.
-- ARGV[1] known epoch ('' if none), ARGV[2] fresh epoch, ARGV[3] quarantine ms,
-- ARGV[4] slot TTL ms (lease + lock_delay), ARGV[5] pod id, ARGV[6] nonce.
-- Returns {state, epoch, n, grant}:
--   'granted'      n = index of the candidate taken (1-based), grant = pod#epoch#nonce;
--   'full'         every candidate is held;
--   'quarantined' / 'amnesia' / 'restarted' / 'changed'   n = quarantine ms left, nothing granted.
local state, epoch, left = check_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], tonumber(ARGV[3]))
if state ~= 'same' then
  return {state, epoch, left, ''}
end
if left > 0 then
  return {'quarantined', epoch, left, ''}
end
local grant = ARGV[5] .. '#' .. epoch .. '#' .. ARGV[6]
for i = 4, #KEYS do
  if redis.call('SET', KEYS[i], grant, 'NX', 'PX', ARGV[4]) then
    return {'granted', epoch, i - 3, grant}
  end
end
return {'full', epoch, 0, ''}
