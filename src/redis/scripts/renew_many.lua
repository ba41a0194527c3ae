-- Renew every lease a pod holds in one call.
-- KEYS[1] epoch, KEYS[2] quarantine, KEYS[3] server, KEYS[4..] slot keys.
-- ARGV[1] known epoch, ARGV[2] fresh epoch, ARGV[3] quarantine ms, ARGV[4] slot TTL ms,
-- then per slot key, in order: its grant, the epoch it was granted in.
-- Returns {state, epoch, quarantine ms left, outcome per slot...} with the outcomes of renew.lua.
local state, epoch, left = check_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], tonumber(ARGV[3]))
local out = {state, epoch, left}
for i = 4, #KEYS do
  local grant = ARGV[5 + (i - 4) * 2]
  local granted_in = ARGV[6 + (i - 4) * 2]
  if state == 'amnesia' or granted_in ~= epoch then
    out[#out + 1] = -2
  else
    out[#out + 1] = renew_slot(KEYS[i], grant, ARGV[4])
  end
end
return out
