-- The shared circuit breaker of one (ispb, channel).
-- CLOSED/DEGRADED count calls in a sliding window of `buckets` slices; OPEN on
-- failure rate >= open% over >= min_calls, or `consecutive` failures in a row;
-- OPEN turns HALF_OPEN lazily (at the first admit after the break); HALF_OPEN
-- admits `probes` probes at once, each admission expiring after the probe
-- timeout; a probe's success (or slow success) closes, its failure re-opens.
-- The generation changes on every open and close: a call's outcome from
-- another generation is ignored.
--
-- KEYS[1] the breaker hash    KEYS[2] the probe admissions (zset: id -> expiry ms)
-- ARGV[1] op: admit | record | peek | reset
-- ARGV[2] now in ms, 0 = Redis TIME (one clock for every pod)
-- ARGV[3] window ms    ARGV[4] buckets    ARGV[5] min_calls   ARGV[6] open failure %
-- ARGV[7] consecutive failures            ARGV[8] degraded min calls
-- ARGV[9] degraded failure %              ARGV[10] degraded slow %
-- ARGV[11] break ms    ARGV[12] probes    ARGV[13] probe timeout ms
-- ARGV[14] generation of the call (record)
-- ARGV[15] probe id (admit: the id a probe would get; record: '' unless a probe)
-- ARGV[16] outcome (record): success | failure | slow | ignored
-- Reply: {state (0 closed, 1 degraded, 2 open, 3 half_open), generation,
--         flag (admit: admitted; record/reset: state changed), retry_ms, probe,
--         calls, failures, slow, consecutive, probes in flight}
local H, P = KEYS[1], KEYS[2]
local op = ARGV[1]
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local window, nb = tonumber(ARGV[3]), tonumber(ARGV[4])
local epoch = math.floor(now / math.floor(window / nb))
local min_calls, open_pct, consec_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local deg_min, deg_fail, deg_slow = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local brk, max_probes, probe_ttl = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local CODES = {closed = 0, degraded = 1, open = 2, half_open = 3}
local KEEP_MS = 86400000

local h = {}
local raw = redis.call('HGETALL', H)
for i = 1, #raw, 2 do
  h[raw[i]] = raw[i + 1]
end
local state = h.state or 'closed'
local gen = tonumber(h.gen) or 0
local opened = tonumber(h.opened) or 0
local consec = tonumber(h.consec) or 0
local changed = 0

local function totals()
  local calls, fails, slow = 0, 0, 0
  for i = 0, nb - 1 do
    local e = tonumber(h['e' .. i])
    if e and e > epoch - nb then
      calls = calls + tonumber(h['c' .. i])
      fails = fails + tonumber(h['f' .. i])
      slow = slow + tonumber(h['s' .. i])
    end
  end
  return calls, fails, slow
end

local function elevated(calls, fails, slow)
  return calls >= deg_min and (fails * 100 >= deg_fail * calls or slow * 100 >= deg_slow * calls)
end

local function reply(flag, retry, probe)
  local calls, fails, slow = totals()
  local probes = redis.call('ZCOUNT', P, '(' .. now, '+inf')
  return {CODES[state], gen, flag, retry, probe, calls, fails, slow, consec, probes}
end

local function clear_window()
  local fields = {}
  for i = 0, nb - 1 do
    for _, p in ipairs({'e', 'c', 'f', 's'}) do
      table.insert(fields, p .. i)
      h[p .. i] = nil
    end
  end
  redis.call('HDEL', H, unpack(fields))
end

local function move(to)
  state, gen, consec, changed = to, gen + 1, 0, 1
  if to == 'open' then
    opened = now
  end
  clear_window()
  redis.call('DEL', P)
end

local function save()
  redis.call('HSET', H, 'state', state, 'gen', gen, 'opened', opened, 'consec', consec)
  redis.call('PEXPIRE', H, KEEP_MS)
end

local function count(outcome)
  local i = epoch % nb
  if tonumber(h['e' .. i]) ~= epoch then
    h['e' .. i], h['c' .. i], h['f' .. i], h['s' .. i] = epoch, 0, 0, 0
  end
  h['c' .. i] = tonumber(h['c' .. i]) + 1
  if outcome == 'failure' then
    h['f' .. i] = tonumber(h['f' .. i]) + 1
    consec = consec + 1
  else
    consec = 0
  end
  if outcome == 'slow' then
    h['s' .. i] = tonumber(h['s' .. i]) + 1
  end
  redis.call('HSET', H, 'e' .. i, h['e' .. i], 'c' .. i, h['c' .. i], 'f' .. i, h['f' .. i], 's' .. i, h['s' .. i])
  local calls, fails, slow = totals()
  if consec >= consec_max or (calls >= min_calls and fails * 100 >= open_pct * calls) then
    move('open')
  else
    local next = 'closed'
    if elevated(calls, fails, slow) then
      next = 'degraded'
    end
    if next ~= state then
      state, changed = next, 1
    end
  end
  save()
end

if op == 'admit' then
  if state == 'open' then
    if now < opened + brk then
      return reply(0, opened + brk - now, 0)
    end
    state, changed = 'half_open', 1
    save()
  end
  if state == 'half_open' then
    redis.call('ZREMRANGEBYSCORE', P, '-inf', now)
    if redis.call('ZCARD', P) >= max_probes then
      local first = redis.call('ZRANGE', P, 0, 0, 'WITHSCORES')
      return reply(0, math.max(1, tonumber(first[2]) - now), 0)
    end
    redis.call('ZADD', P, now + probe_ttl, ARGV[15])
    redis.call('PEXPIRE', P, probe_ttl + 1000)
    return reply(1, 0, 1)
  end
  return reply(1, 0, 0)
elseif op == 'record' then
  local probe, outcome = ARGV[15], ARGV[16]
  if probe ~= '' then
    redis.call('ZREM', P, probe)
  end
  if tonumber(ARGV[14]) ~= gen or outcome == 'ignored' or state == 'open' then
    return reply(0, 0, 0)
  end
  if state == 'half_open' then
    if probe ~= '' then
      if outcome == 'failure' then
        move('open')
      else
        move('closed')
      end
      save()
    end
    return reply(changed, 0, 0)
  end
  count(outcome)
  return reply(changed, 0, 0)
elseif op == 'peek' then
  local retry = 0
  if state == 'open' then
    if now >= opened + brk then
      state = 'half_open'
    else
      retry = opened + brk - now
    end
  elseif state == 'closed' or state == 'degraded' then
    state = elevated(totals()) and 'degraded' or 'closed'
  end
  return reply(0, retry, 0)
elseif op == 'reset' then
  move('closed')
  save()
  return reply(changed, 0, 0)
end
return redis.error_reply('breaker: unknown op ' .. tostring(op))
