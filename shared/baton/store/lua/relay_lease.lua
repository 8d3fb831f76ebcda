--[==[ relay_lease.lua: a relay's fenced lease on one shard's outbox and timers.

KEYS: 1 lease HASH "<ns>:{<ns>-<shard>}:relay" (same hash tag as the shard's outbox)
        holder  relay name ('' when free)
        fence   increases by one at every acquisition; never reset (the key is never deleted)
        until   ms (Redis clock) the lease lasts to; 0 when released
      2.. renew only: more lease HASHes (one server, where keys of many hash tags may
        meet in one script): every held shard's lease renewed by one call
      (look: any number of lease HASHes, on one server)
ARGV: 1 op: acquire | acquire_expired | renew | release | look   2 relay name
      3 lease time ms   4 fence (renew, release); 4+i-1 the fence of KEYS[i] (renew)
Returns (with several KEYS, renew returns a list of these answers, one per key):
  look     {{holder, ms left}, ...} per key, writing nothing: which leases a relay may
           take ('' or 0 left), so it calls acquire only for those
  acquire  {1, fence, lapsed} taken (a new fence, also when this relay held it and it
           expired); lapsed: the other relay whose lease had expired, '' when it was free
           {0, holder, remaining ms} another relay holds it
  acquire_expired  the same, but takes only a lease whose holder let it expire (died),
           never a free (released) one: {0, '', 0} for a free lease
  renew    {1, fence} extended; {0, holder, fence} lost (expired and taken, or released)
  release  {1, fence} released; {0, holder, fence} not ours any more (nothing changed)
A relay reads, claims, acknowledges and fires timers only for shards it holds; the
acknowledgement (relay_ack.lua) and timer firing (fire_timers.lua) check the fence again,
so a relay that lost a shard cannot delete rows the new holder is responsible for.
]==]
if ARGV[1] ~= 'look' then  -- checked before any write (see _args.lua)
  local checks = {{'lease time ms', ARGV[3], 1, MAX_MS}}
  if ARGV[1] == 'renew' then
    for i = 1, #KEYS do checks[#checks + 1] = {'fence', ARGV[3 + i], 0, MAX_INT} end
  elseif ARGV[1] == 'release' then
    checks[2] = {'fence', ARGV[4], 0, MAX_INT}
  end
  local invalid = bad_args(checks)
  if invalid then return invalid end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'renew' then
  local answers = {}
  for i, key in ipairs(KEYS) do
    local cur = redis.call('HMGET', key, 'holder', 'fence', 'until')
    local holder, fence = cur[1] or '', tonumber(cur[2] or '0')
    if holder == ARGV[2] and fence == tonumber(ARGV[3 + i]) and tonumber(cur[3] or '0') > now then
      redis.call('HSET', key, 'until', now + tonumber(ARGV[3]))
      answers[i] = {1, fence}
    else  -- lost: expired (and maybe taken), or released
      answers[i] = {0, holder, fence}
    end
  end
  if #KEYS == 1 then return answers[1] end
  return answers
end
if ARGV[1] == 'look' then
  local answers = {}
  for i, key in ipairs(KEYS) do
    local cur = redis.call('HMGET', key, 'holder', 'until')
    answers[i] = {cur[1] or '', math.max(tonumber(cur[2] or '0') - now, 0)}
  end
  return answers
end
if #KEYS > 1 then return redis.error_reply('INVALID several keys for ' .. tostring(ARGV[1])) end
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence', 'until')
local holder, fence, untl = cur[1] or '', tonumber(cur[2] or '0'), tonumber(cur[3] or '0')
local op, me, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
if op == 'acquire' or op == 'acquire_expired' then
  if holder ~= '' and holder ~= me and untl > now then
    return {0, holder, untl - now}
  end
  if op == 'acquire_expired' and holder == '' then return {0, '', 0} end
  fence = fence + 1
  redis.call('HSET', KEYS[1], 'holder', me, 'fence', fence, 'until', now + ttl)
  local lapsed = ''
  if holder ~= me then lapsed = holder end
  return {1, fence, lapsed}
end
local mine = holder == me and fence == tonumber(ARGV[4])
if op == 'release' then
  if not mine then return {0, holder, fence} end
  redis.call('HSET', KEYS[1], 'holder', '', 'until', 0)
  return {1, fence}
end
return redis.error_reply('INVALID relay lease op ' .. tostring(op))
