-- The DICT's lookup buckets as cabine mirrors them, one call per lookup stage:
-- the participant's (ENTRIES_READ_PARTICIPANT_ANTISCAN) and the payer's user
-- bucket (ENTRIES_READ_USER_ANTISCAN[_V2]), lazily refilled (tokens per minute).
-- A lookup is admitted while both hold at least one token and pre-charged the
-- most it can cost (a 404); the difference comes back once the answer is known.
-- Tokens may go below zero meanwhile: the mirror never holds more than the
-- Central Bank, so it refuses first. `set` takes the Central Bank's state and
-- starts a new epoch: refunds of lookups admitted before it are not applied to
-- the participant bucket (the Central Bank's figure already holds their real
-- cost). The participant hash never expires once written (its capacity and
-- refill are the Central Bank's); a user hash expires once it would be full.
--
-- KEYS[1] participant bucket hash {tokens, ts, cap, rate, epoch}   KEYS[2] user bucket hash
-- ARGV[1] "admit" | "refund" | "set" | "peek" | "charge_user"
-- ARGV[2] now in ms, 0 = Redis TIME
-- ARGV[3] participant capacity   ARGV[4] participant refill per minute (defaults until `set`)
-- ARGV[5] user capacity          ARGV[6] user refill per minute
-- ARGV[7] participant amount     ARGV[8] user amount
--         admit: pre-charge; refund: given back; set: tokens (-1 = unchanged); charge_user: ARGV[8] only
-- ARGV[9]  set: participant capacity (0 = unchanged); refund: the admission's epoch
-- ARGV[10] set: participant refill per minute (0 = unchanged)
-- Reply: {admitted (1 | 0), refused by (0 none, 1 participant, 2 user), wait_ms,
--         participant tokens, user tokens, participant epoch}
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function load(key, cap, rate)
  local s = redis.call('HMGET', key, 'tokens', 'ts', 'cap', 'rate', 'epoch')
  local c, r = tonumber(s[3]) or cap, tonumber(s[4]) or rate
  local tokens, ts = tonumber(s[1]), tonumber(s[2])
  if tokens == nil or ts == nil then
    tokens, ts = c, now
  end
  if now > ts then
    tokens = math.min(c, tokens + (now - ts) * r / 60000)
  end
  return {tokens = tokens, cap = c, rate = r, epoch = tonumber(s[5]) or 0}
end

local function save(key, b, expires)
  redis.call('HSET', key, 'tokens', tostring(b.tokens), 'ts', now, 'cap', b.cap, 'rate', b.rate, 'epoch', b.epoch)
  if expires then
    -- Gone once it would be full again (an absent key is a full bucket), a minute later.
    local full_in = math.ceil(math.max(b.cap - b.tokens, 0) * 60000 / math.max(b.rate, 0.001))
    redis.call('PEXPIRE', key, math.min(full_in + 60000, 8 * 86400000))
  else
    redis.call('PERSIST', key)
  end
end

local function wait_ms(b)
  return math.ceil((1 - b.tokens) * 60000 / math.max(b.rate, 0.001))
end

local p = load(KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]))
local u = load(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]))
local pa, ua = tonumber(ARGV[7]), tonumber(ARGV[8])
local op = ARGV[1]
local function reply(admitted, by, wait)
  return {admitted, by, wait, math.floor(p.tokens), math.floor(u.tokens), p.epoch}
end

if op == 'admit' then
  if p.tokens < 1 then
    return reply(0, 1, wait_ms(p))
  end
  if u.tokens < 1 then
    return reply(0, 2, wait_ms(u))
  end
  p.tokens = p.tokens - pa
  u.tokens = u.tokens - ua
elseif op == 'charge_user' then
  if u.tokens < 1 then
    return reply(0, 2, wait_ms(u))
  end
  u.tokens = u.tokens - ua
  save(KEYS[2], u, true)
  return reply(1, 0, 0)
elseif op == 'refund' then
  if tonumber(ARGV[9]) == p.epoch then
    p.tokens = math.min(p.cap, p.tokens + pa)
  end
  u.tokens = math.min(u.cap, u.tokens + ua)
elseif op == 'set' then
  if tonumber(ARGV[9]) > 0 then p.cap = tonumber(ARGV[9]) end
  if tonumber(ARGV[10]) > 0 then p.rate = tonumber(ARGV[10]) end
  if pa >= 0 then
    p.tokens = math.min(pa, p.cap)
    p.epoch = p.epoch + 1
  end
  if ua >= 0 then u.tokens = math.min(ua, u.cap) end
end
if op ~= 'peek' then
  save(KEYS[1], p, false)
  save(KEYS[2], u, true)
end
return reply(1, 0, 0)
