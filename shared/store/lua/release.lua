--[==[ release.lua: give up a session's lease unless work arrived meanwhile.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 lease ttl ms
If the dirty mark is set (meta 'dirty' by a submit or a commit, the nudge by a tool
completion or a timer, while the holder worked), the lease is kept and extended, the mark cleared, and 1 is returned: the holder
must load and schedule again. Otherwise the lease is released and 0 is returned. This is
what makes a wake that races the release impossible to lose.
Refused with STALE_FENCE <presented> <current> when a newer fence exists.
The nudge is only tested (EXISTS) and deleted (DEL), which no type fails.
UNGUARDED: nudge
]==]
local fence = tonumber(ARGV[1])
local m = redis.call('HMGET', K_META, 'fence', 'dirty')
local cur = tonumber(m[1] or '0')
if cur ~= fence then
  return fail('STALE_FENCE', fence .. ' ' .. cur)
end
if m[2] == '1' or redis.call('EXISTS', K_NUDGE) == 1 then
  redis.call('HSET', K_META, 'dirty', 0, 'lease_until', now_ms() + tonumber(ARGV[2]))
  redis.call('DEL', K_NUDGE)
  return 1
end
redis.call('HSET', K_META, 'holder', '', 'lease_until', 0)
return 0
