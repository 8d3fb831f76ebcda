--[==[ tool_limit.lua: one tool's concurrency cap and rate, held for the whole fleet.

Every Hands replica runs a capped tool's runs through here, so the cap and the rate are the
fleet's, not each replica's. All keys of one tool share a hash tag, "{<ns>-limit-<tool>}"
(one slot on a Redis Cluster); none is ever read by another script.

KEYS: 1 holders ZSET   member -> the ms (Redis clock) its slot lasts to; a holder renews it
                       while its run executes; a holder that died stops renewing and its
                       slot is free once that time passed (the next call sweeps it)
      2 waiting ZSET   member -> ticket: the runs waiting for a slot, first come first
      3 alive HASH     member -> the ms a waiting member lasts to: a waiter that stopped
                       asking (its Hands died) is dropped when it reaches the head; and
                       'vt:<tenant>' -> the end of the tenant's last share (see below)
      4 tickets STRING the virtual time: the start tag of the waiter let through last
      5 tat STRING     the rate's theoretical arrival time (GCRA), ms
ARGV: 1 op  2 member (a run's id)  3 cap (slots; 0: no cap)  4 slot time ms
      5 ms between admissions at the rate (0: no rate)  6 burst (admissions at once)
      7 the run's tenant (optional; '' one for all)  8 the tenant's weight (1..100, optional)
ops:
  acquire  {1, 0, 0}            a slot (and the rate's admission) taken, or renewed when
                                the member holds one already (a redelivery of its run)
           {0, position, ms}    not yet: 1-based place in the queue (0: first, waiting
                                only for the rate), and when to ask again at the latest
                                (a slot's expiry, the rate's next admission); a release
                                is announced by the caller, so a waiter asks again then
  renew    {1, ms left} / {0, 0} the member's slot extended / not held (expired, so maybe
                                taken: the run goes on, its slot is no longer counted)
  release  {1 or 0, next, m...} the member's slot (or its place in the queue) given up; next:
                                whether a waiter may take a slot now, and m...: those
                                waiters, the first (cap - slots in use) of the line (the
                                caller tells them: only they ask again, not the whole line;
                                a rate alone frees nothing, its waiters ask when told)
(Reading the state takes no script: baton.store.limits.Limits.look.)
A member takes a slot only when it is among the first (cap - slots in use) of the queue, so
a run that keeps asking keeps its place. The queue is in order of start tag (start-time fair
queuing between tenants): a run's tag is the later of the virtual time and the end of its
tenant's last share, and a share is 1000 / weight; so one tenant's runs keep their arrival
order, and a tenant arriving behind another's burst waits behind one share of it, not all. Admission at the rate
is taken with the slot, in the same order: a run waiting for the rate holds no slot.
]==]
local op, me = ARGV[1], ARGV[2]
local invalid = bad_args({{'cap', ARGV[3], 0, MAX_INT}, {'slot time ms', ARGV[4], 1, MAX_MS},
                          {'rate interval ms', ARGV[5], 0, MAX_MS},
                          {'burst', ARGV[6], 1, MAX_INT}, {'weight', ARGV[8] or '1', 1, 100}})
if invalid then return invalid end
local tenant = ARGV[7] or ''
if #tenant > 64 or string.find(tenant, '[^A-Za-z0-9_.-]') then
  return redis.error_reply('INVALID tenant must be up to 64 of A-Z a-z 0-9 _ . -')
end
if #KEYS ~= 5 then return redis.error_reply('ERR tool_limit.lua takes 5 keys, not ' .. #KEYS) end
if me == nil or me == '' or #me > 512 then
  return redis.error_reply('INVALID member must be 1 to 512 bytes')
end
local holders, waiting, alive, tickets, tat_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local cap, ttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local interval, burst = tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The rate's next admission (ms from now, 0: now) and the tat it would leave (GCRA: an
-- admission moves tat one interval on; up to burst of them may be ahead of now).
local function rate_wait()
  if interval == 0 then return 0, 0 end
  local tat = math.max(tonumber(redis.call('GET', tat_key) or '0') or 0, now)
  local new_tat = tat + interval
  return math.max(new_tat - burst * interval - now, 0), new_tat
end

if op == 'renew' then
  local untl = tonumber(redis.call('ZSCORE', holders, me) or '0')
  if untl <= now then return {0, 0} end
  redis.call('ZADD', holders, now + ttl, me)
  redis.call('PEXPIRE', holders, ttl * 2)
  return {1, ttl}
end

if op == 'release' then
  -- A holder has no place in line (taking the slot gave it up), so only a member that held
  -- no slot is looked for there; and with nobody in line there is nobody to name.
  local had = redis.call('ZREM', holders, me)
  if had == 0 then
    had = redis.call('ZREM', waiting, me)
    redis.call('HDEL', alive, me)
  end
  local out = {had, 0}
  if cap > 0 and redis.call('EXISTS', waiting) == 1 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)  -- slots of holders that died
    local free = cap - redis.call('ZCARD', holders)
    if free > 0 then
      for _, m in ipairs(redis.call('ZRANGE', waiting, 0, free - 1)) do out[#out + 1] = m end
    end
    if #out > 2 then out[2] = 1 end
  end
  return out
end

if op ~= 'acquire' then return redis.error_reply('INVALID op ' .. tostring(op)) end
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)  -- slots of holders that died
if redis.call('ZSCORE', holders, me) then  -- held already (a redelivery): renewed
  redis.call('ZADD', holders, now + ttl, me)
  return {1, 0, 0}
end
local used = redis.call('ZCARD', holders)
-- The run's start tag (see above): the later of the virtual time and the end of its
-- tenant's last share, which it moves on by one share.
local function start_tag()
  local share = 'vt:' .. tenant
  local start = math.max(tonumber(redis.call('GET', tickets) or '0') or 0,
                         tonumber(redis.call('HGET', alive, share) or '0') or 0)
  redis.call('HSET', alive, share, start + math.floor(1000 / tonumber(ARGV[8] or '1')))
  return start
end
-- The slot (and the admission) taken: the virtual time moves to the run's start tag.
local function grant(start, new_tat)
  if interval > 0 then
    redis.call('SET', tat_key, new_tat, 'PX', new_tat - now + 1000)
  end
  redis.call('SET', tickets, start, 'PX', ttl * 2)
  if cap > 0 then
    redis.call('ZADD', holders, now + ttl, me)
    redis.call('PEXPIRE', holders, ttl * 2)
  end
  return {1, 0, 0}
end
-- Nobody in line, a slot free and the rate admitting (a cap that does not bind): granted
-- at once, as the line below would, with the same tags, without entering and leaving it.
if redis.call('EXISTS', waiting) == 0 and (cap == 0 or used < cap) then
  local wait, new_tat = rate_wait()
  if wait == 0 then return grant(start_tag(), new_tat) end
end
-- Waiters that stopped asking, among those who would be served before this one: dropped.
local ahead = redis.call('ZRANGE', waiting, 0, math.max(cap - used, 0) + 16)
for _, m in ipairs(ahead) do
  if m ~= me and tonumber(redis.call('HGET', alive, m) or '0') < now then
    redis.call('ZREM', waiting, m)
    redis.call('HDEL', alive, m)
  end
end
if not redis.call('ZSCORE', waiting, me) then
  redis.call('ZADD', waiting, start_tag(), me)
end
-- Not yet: ask again in retry ms at the latest. The member's place lasts that long and one
-- slot time more (a waiter that stops asking is dropped after it), and so do the line's
-- keys: a waiter far back in a rate's line asks once, when its turn is due, not every
-- slot time.
local function not_yet(position, retry)
  redis.call('HSET', alive, me, now + retry + ttl)
  for _, k in ipairs({waiting, alive, tickets}) do
    redis.call('PEXPIRE', k, (retry + ttl) * 2, 'NX')  -- (a key without a time yet)
    redis.call('PEXPIRE', k, (retry + ttl) * 2, 'GT')
  end
  return {0, position, retry}
end
local rank = redis.call('ZRANK', waiting, me)
if cap == 0 then  -- a rate alone: admitted one at a time, in arrival order
  if rank > 0 then return not_yet(rank, math.max(rate_wait() + rank * interval, 1)) end
elseif rank >= cap - used then  -- behind the free slots: wait for a release or an expiry
  local free = cap - used
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  local retry = ttl
  if first[2] then retry = math.max(tonumber(first[2]) - now, 1) end
  return not_yet(rank - math.max(free, 0) + 1, math.min(retry, ttl))
end
local wait, new_tat = rate_wait()
if wait > 0 then return not_yet(0, wait) end  -- first in line, waiting for the rate only
local start = redis.call('ZSCORE', waiting, me)
redis.call('ZREM', waiting, me)
redis.call('HDEL', alive, me)
return grant(start, new_tat)
