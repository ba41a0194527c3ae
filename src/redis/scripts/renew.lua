-- Renew one lease: epoch check, then compare-grant and PEXPIRE.
-- KEYS[1] epoch, KEYS[2] quarantine, KEYS[3] server, KEYS[4] slot.
-- ARGV[1] the lease's epoch, ARGV[2] fresh epoch, ARGV[3] quarantine ms,
-- ARGV[4] slot TTL ms, ARGV[5] grant.
-- Returns {state, epoch, quarantine ms left, outcome}:
-- outcome 1 renewed, 0 key missing, -1 held by another grant, -2 amnesia (lease from an older epoch).
local state, epoch, left = check_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], tonumber(ARGV[3]))
if state == 'amnesia' or state == 'changed' then
  return {state, epoch, left, -2}
end
return {state, epoch, left, renew_slot(KEYS[4], ARGV[5], ARGV[4])}
