-- The Central Bank's operation token bucket of one (ispb, channel), lazy refill.
-- Tokens are milli-tokens; a refill of R tokens/s is R milli-tokens per millisecond.
-- An absent key is a full bucket; the key expires once it would be full again.
--
-- KEYS[1]  the bucket hash {tokens, ts}
-- ARGV[1]  cost (milli-tokens)      ARGV[2]  mode: "take" | "peek"
-- ARGV[3]  now in ms, 0 = Redis TIME (one clock for every pod)
-- ARGV[4]  day capacity (milli)     ARGV[5]  day refill (tokens/s)
-- ARGV[6]  night capacity (milli)   ARGV[7]  night refill (tokens/s)
-- ARGV[8]  night from (local minute of day, included)   ARGV[9] night until (excluded)
-- ARGV[10] UTC offset of the local time, in minutes
-- ARGV[11] reserve in ms: a draw must leave refill × reserve tokens in hand. A POST
--          reaches the SPI some ms after its draw; while the SPI's bucket sits full
--          it loses that refill, so drawing to the last token here could draw a 429 there.
-- Reply: {granted (1 | 0 | -1 too costly), tokens, wait_ms, capacity, refill, night (1 | 0)}
local cost = tonumber(ARGV[1])
local now = tonumber(ARGV[3])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local minute = (math.floor(now / 60000) + tonumber(ARGV[10])) % 1440
local from, untl = tonumber(ARGV[8]), tonumber(ARGV[9])
local night
if from <= untl then
  night = minute >= from and minute < untl
else
  night = minute >= from or minute < untl
end
local cap, rate, flag = tonumber(ARGV[4]), tonumber(ARGV[5]), 0
if night then
  cap, rate, flag = tonumber(ARGV[6]), tonumber(ARGV[7]), 1
end

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil or ts == nil then
  tokens, ts = cap, now
end
if now > ts then
  tokens = tokens + (now - ts) * rate
  ts = now
end
if tokens > cap then
  tokens = cap
end

if ARGV[2] == 'peek' then
  return {1, tokens, 0, cap, rate, flag}
end
local reserve = math.min(rate * tonumber(ARGV[11]), cap)
if cost > cap - reserve then
  return {-1, tokens, 0, cap, rate, flag}
end
if tokens - reserve < cost then
  return {0, tokens, math.ceil((cost + reserve - tokens) / rate), cap, rate, flag}
end
tokens = tokens - cost
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', ts)
redis.call('PEXPIRE', KEYS[1], math.ceil((cap - tokens) / rate) + 1000)
return {1, tokens, 0, cap, rate, flag}
