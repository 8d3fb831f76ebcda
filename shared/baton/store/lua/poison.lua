--[==[ poison.lua: count a failure to process a session; quarantine it at the limit.

KEYS: 1 poison HASH of the session (keys.SessionKeys.poison), 2 timers ZSET of its shard
      (same hash tag)
ARGV: 1 session id, 2 reason (the failure, one line), 3 limit (failures before quarantine)
The poison hash holds 'tries' (failures so far), 'reason' and 'last' (the latest one, ms),
and once quarantined 'quarantined' (ms) and 'quarantine_reason'. At the limit the session is
quarantined: its timers are removed (no deadline wakes it again). Not wrapped by
_applied.lua and given none of the 14 session keys: a session may be corrupt in any of
them. Both keys' types are checked before the first write. Returns {tries, state} where
state is 'counted', 'quarantined' (now) or 'already' (quarantined before: nothing written).
]==]
for i, want in ipairs({'hash', 'zset'}) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('CORRUPT key ' .. KEYS[i] .. ' is a ' .. t .. ', not a ' .. want)
  end
end
local invalid = bad_args({{'failure limit', ARGV[3], 1, MAX_INT}})
if invalid then return invalid end
local sid, reason, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local prior = redis.call('HMGET', KEYS[1], 'tries', 'quarantined')
if prior[2] then return {tonumber(prior[1]) or 0, 'already'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tries = (tonumber(prior[1]) or 0) + 1
redis.call('HSET', KEYS[1], 'tries', tries, 'reason', reason, 'last', now)
if tries < limit then return {tries, 'counted'} end
redis.call('HSET', KEYS[1], 'quarantined', now, 'quarantine_reason', reason)
local cursor = '0'
repeat
  local page = redis.call('ZSCAN', KEYS[2], cursor, 'MATCH', '*|' .. sid .. '|*', 'COUNT', 500)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local member = page[2][i]
    if string.find(member, '|' .. sid .. '|', 1, true) then redis.call('ZREM', KEYS[2], member) end
  end
until cursor == '0'
return {tries, 'quarantined'}
