--[==[ renew.lua: extend the lease of the current holder.

KEYS: the 12 session keys (see _lib.lua).
ARGV: 1 fence, 2 lease ttl ms
Refused with STALE_FENCE <presented> <current> when a newer fence exists.
Returns the new expiry (ms).
]==]
local fence = tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', K_META, 'fence') or '0')
if cur ~= fence then
  return fail('STALE_FENCE', fence .. ' ' .. cur)
end
local expiry = now_ms() + tonumber(ARGV[2])
redis.call('HSET', K_META, 'lease_until', expiry)
return expiry
