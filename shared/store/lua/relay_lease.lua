--[==[ relay_lease.lua: a relay's fenced lease on one shard's outbox and timers.

KEYS: 1 lease HASH "<ns>:{<ns>-<shard>}:relay" (same hash tag as the shard's outbox)
        holder  relay name ('' when free)
        fence   increases by one at every acquisition; never reset (the key is never deleted)
        until   ms (Redis clock) the lease lasts to; 0 when released
ARGV: 1 op: acquire | acquire_expired | renew | release   2 relay name   3 lease time ms
      4 fence (renew, release)
Returns:
  acquire  {1, fence} taken (a new fence, also when this relay held it and it expired)
           {0, holder, remaining ms} another relay holds it
  acquire_expired  the same, but takes only a lease whose holder let it expire (died),
           never a free (released) one: {0, '', 0} for a free lease
  renew    {1, fence} extended; {0, holder, fence} lost (expired and taken, or released)
  release  {1, fence} released; {0, holder, fence} not ours any more (nothing changed)
A relay reads, claims, acknowledges and fires timers only for shards it holds; the
acknowledgement (relay_ack.lua) and timer firing (fire_timers.lua) check the fence again,
so a relay that lost a shard cannot delete rows the new holder is responsible for.
]==]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
  return {1, fence}
end
local mine = holder == me and fence == tonumber(ARGV[4])
if op == 'renew' then
  if not mine or untl <= now then return {0, holder, fence} end
  redis.call('HSET', KEYS[1], 'until', now + ttl)
  return {1, fence}
end
if op == 'release' then
  if not mine then return {0, holder, fence} end
  redis.call('HSET', KEYS[1], 'holder', '', 'until', 0)
  return {1, fence}
end
return redis.error_reply('INVALID relay lease op ' .. tostring(op))
