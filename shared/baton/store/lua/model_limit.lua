--[==[ model_limit.lua: one model's budget at its provider, held for the whole fleet.

Every Brain calls a budgeted model (baton.budgets.ModelBudget: concurrent requests, requests
and tokens per minute) through here, so the budget is the fleet's, not each Brain's. The
algorithms are tool_limit.lua's: a lease-based semaphore with a line in arrival order, and
the generic cell rate algorithm, here with a cost (a call costs one request and its tokens).
All keys of one model share a hash tag, "{<ns>-model-<provider/model>}" (one slot on a Redis
Cluster); none is ever read by another script.

KEYS: 1 holders ZSET   member -> the ms (Redis clock) its slot lasts to; a Brain renews it
                       while its call runs; one that died stops renewing and its slot is
                       free once that time passed (the next call sweeps it)
      2 waiting ZSET   member -> start tag: the calls waiting, in arrival order within a
                       tenant, tenants taking turns by weight (tool_limit.lua's fair queuing)
      3 alive HASH     member -> the ms a waiting member lasts to: a waiter that stopped
                       asking (its Brain died) is dropped when it reaches the head; and
                       'vt:<tenant>' -> the end of the tenant's last share
      4 tickets STRING the virtual time: the start tag of the call let through last
      5 rtat STRING    the requests' theoretical arrival time (GCRA), ms
      6 ttat STRING    the tokens' theoretical arrival time (GCRA, cost: the call's tokens), ms
      7 paused STRING  the ms until which the provider asked the fleet to wait (a 429 with
                       Retry-After): the later of those asked, never their sum
ARGV: 1 op  2 member (a call's id)  3 cap (concurrent calls; 0: no cap)  4 slot time ms
      5 requests per minute (0: no rate)  6 tokens per minute (0: no rate)
      7 burst ms: how far ahead of its rate each one may run (a call costing more than that
        goes when its rate has caught up, and puts the rate that far behind)
      8 tokens: acquire: the call's estimate (its prompt and its most output); release: the
        correction once the provider reported its usage (used - estimated: negative gives
        back, positive charges more), 0: none
      9 pause ms: release: the provider's Retry-After (0: none); acquire: 0
     10 the call's session's tenant (optional; '' one for all)  11 its weight (1..100)
ops:
  acquire  {1, 0, 0, ''}          a slot and both rates' admissions taken
           {0, position, ms, why} not yet: 1-based place in the line (0: first, waiting for
                                  a rate only), when to ask again at the latest, and what
                                  it waits for: 'paused' (the provider's Retry-After),
                                  'slot', 'requests' or 'tokens' (the rates); a release
                                  is announced by the caller, so a waiter asks again then
  renew    {1, ms} / {0, 0}       the member's slot extended / not held (it expired)
  release  {had, next, paused}    the member's slot (or place) given up, the usage's
                                  correction and the pause applied; next: whether anyone
                                  waits who may go now (the caller announces it; not during
                                  a pause, whose end every waiter was told); paused: ms the
                                  budget stays paused
(Reading the state takes no script: baton.store.budgets.Budgets.look.)
A call takes its slot and its admissions at both rates together, in the line's order, and
none while the budget is paused: a call waiting for a rate holds no slot.
]==]
local op, me = ARGV[1], ARGV[2]
if op ~= 'acquire' and op ~= 'renew' and op ~= 'release' then
  return redis.error_reply('INVALID op ' .. tostring(op))
end
local least = 0  -- tokens: an estimate at acquire, a signed correction at release
if op == 'release' then least = -MAX_INT end
local invalid = bad_args({{'cap', ARGV[3], 0, MAX_INT}, {'slot time ms', ARGV[4], 1, MAX_MS},
                          {'requests per minute', ARGV[5], 0, MAX_INT},
                          {'tokens per minute', ARGV[6], 0, MAX_INT},
                          {'burst ms', ARGV[7], 0, MAX_MS},
                          {'tokens', ARGV[8], least, MAX_INT},
                          {'pause ms', ARGV[9], 0, MAX_MS},
                          {'weight', ARGV[11] or '1', 1, 100}})
if invalid then return invalid end
local tenant, weight = ARGV[10] or '', tonumber(ARGV[11] or '1')
if #tenant > 64 or string.find(tenant, '[^A-Za-z0-9_.-]') then
  return redis.error_reply('INVALID tenant must be up to 64 of A-Z a-z 0-9 _ . -')
end
if #KEYS ~= 7 then return redis.error_reply('ERR model_limit.lua takes 7 keys, not ' .. #KEYS) end
if me == nil or me == '' or #me > 512 then
  return redis.error_reply('INVALID member must be 1 to 512 bytes')
end
-- Each key of its type (or absent), before the first write: a WRONGTYPE midway would leave
-- half a transition behind.
local TYPES = {'zset', 'zset', 'hash', 'string', 'string', 'string', 'string'}
for i, k in ipairs(KEYS) do
  local kind = redis.call('TYPE', k)['ok']
  if kind ~= 'none' and kind ~= TYPES[i] then
    return redis.error_reply('CORRUPT ' .. k .. ' is a ' .. kind .. ', not a ' .. TYPES[i])
  end
end
local holders, waiting, alive, tickets = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rtat_key, ttat_key, paused_key = KEYS[5], KEYS[6], KEYS[7]
local cap, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local rpm, tpm, burst = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local tokens, pause = tonumber(ARGV[8]), tonumber(ARGV[9])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- A rate's next admission of `cost` (ms from now, 0: now) and the tat it would leave (GCRA:
-- an admission moves tat cost intervals on; up to `burst` ms of them may be ahead of now).
local function rate_wait(key, per_minute, cost)
  if per_minute == 0 or cost == 0 then return 0, 0 end
  local step = cost * 60000 / per_minute
  local tat = math.max(tonumber(redis.call('GET', key) or '0') or 0, now)
  local new_tat = tat + step
  return math.max(math.ceil(new_tat - math.max(burst, step) - now), 0), new_tat
end

-- Store a rate's tat (whole ms, rounded up), kept until it is in the past.
local function set_tat(key, tat)
  if tat <= now then
    redis.call('DEL', key)
    return
  end
  local ms = math.ceil(tat)
  redis.call('SET', key, string.format('%.0f', ms), 'PX', ms - now + 1000)
end

-- The ms the budget stays paused (0: not paused).
local function paused_for()
  return math.max((tonumber(redis.call('GET', paused_key) or '0') or 0) - now, 0)
end

if op == 'renew' then
  local untl = tonumber(redis.call('ZSCORE', holders, me) or '0')
  if untl <= now then return {0, 0} end
  redis.call('ZADD', holders, now + ttl, me)
  redis.call('PEXPIRE', holders, ttl * 2)
  return {1, ttl}
end

if op == 'release' then
  if tokens ~= 0 and tpm > 0 then  -- the usage the provider reported, against the estimate
    local stored = tonumber(redis.call('GET', ttat_key) or '0') or 0
    local step = tokens * 60000 / tpm
    if tokens > 0 then
      set_tat(ttat_key, math.max(stored, now) + step)
    elseif stored > now then  -- given back: never beyond a full bucket
      set_tat(ttat_key, stored + step)
    end
  end
  if pause > 0 then  -- the later of the pauses asked, not their sum
    local untl = now + pause
    if untl > (tonumber(redis.call('GET', paused_key) or '0') or 0) then
      redis.call('SET', paused_key, string.format('%.0f', untl), 'PX', pause)
    end
  end
  local had = redis.call('ZREM', holders, me) + redis.call('ZREM', waiting, me)
  redis.call('HDEL', alive, me)
  local left = paused_for()
  local next = 0
  if left == 0 and redis.call('ZCARD', waiting) > 0 then next = 1 end
  return {math.min(had, 1), next, left}
end

redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)  -- slots of Brains that died
if redis.call('ZSCORE', holders, me) then  -- held already: renewed
  redis.call('ZADD', holders, now + ttl, me)
  return {1, 0, 0, ''}
end
local left = paused_for()
if left == 0 and cap == 0 and rpm == 0 and tpm == 0 then  -- only the provider's pauses
  return {1, 0, 0, ''}
end
local used = redis.call('ZCARD', holders)
-- Waiters that stopped asking, among those who would be served before this one: dropped.
local ahead = redis.call('ZRANGE', waiting, 0, math.max(cap - used, 0) + 16)
for _, m in ipairs(ahead) do
  if m ~= me and tonumber(redis.call('HGET', alive, m) or '0') < now then
    redis.call('ZREM', waiting, m)
    redis.call('HDEL', alive, m)
  end
end
if not redis.call('ZSCORE', waiting, me) then  -- its start tag, as in tool_limit.lua
  local share = 'vt:' .. tenant
  local start = math.max(tonumber(redis.call('GET', tickets) or '0') or 0,
                         tonumber(redis.call('HGET', alive, share) or '0') or 0)
  redis.call('HSET', alive, share, start + math.floor(1000 / weight))
  redis.call('ZADD', waiting, start, me)
end
redis.call('HSET', alive, me, now + ttl)
for _, k in ipairs({waiting, alive, tickets}) do redis.call('PEXPIRE', k, ttl * 2) end
local rank = redis.call('ZRANK', waiting, me)
if left > 0 then return {0, rank + 1, left, 'paused'} end
local rwait, new_rtat = rate_wait(rtat_key, rpm, 1)
local twait, new_ttat = rate_wait(ttat_key, tpm, tokens)
if cap == 0 then  -- rates alone: admitted one at a time, in arrival order
  if rank > 0 then
    local why, rgap, tgap = 'requests', 0, 0
    if twait > rwait then why = 'tokens' end
    if rpm > 0 then rgap = 60000 / rpm end
    if tpm > 0 then tgap = tokens * 60000 / tpm end
    -- a guess: each call ahead costs as much as this one
    local guess = math.max(rwait, twait) + rank * math.max(rgap, tgap)
    return {0, rank, math.max(math.ceil(guess), 1), why}
  end
elseif rank >= cap - used then  -- behind the free slots: wait for a release or an expiry
  local free = cap - used
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  local retry = ttl
  if first[2] then retry = math.max(tonumber(first[2]) - now, 1) end
  return {0, rank - math.max(free, 0) + 1, math.min(retry, ttl), 'slot'}
end
if rwait > 0 or twait > 0 then  -- first in line, waiting for a rate only
  if twait > rwait then return {0, 0, twait, 'tokens'} end
  return {0, 0, rwait, 'requests'}
end
if rpm > 0 then set_tat(rtat_key, new_rtat) end
if tpm > 0 and tokens > 0 then set_tat(ttat_key, new_ttat) end
local tag = redis.call('ZSCORE', waiting, me)
if tag then redis.call('SET', tickets, tag, 'PX', ttl * 2) end  -- the virtual time
redis.call('ZREM', waiting, me)
redis.call('HDEL', alive, me)
if cap > 0 then
  redis.call('ZADD', holders, now + ttl, me)
  redis.call('PEXPIRE', holders, ttl * 2)
end
return {1, 0, 0, ''}
