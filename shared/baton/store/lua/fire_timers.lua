--[==[ fire_timers.lua: turn a shard's due timers into outbox wake rows.

KEYS: 1 timers ZSET of the shard, 2 outbox STREAM of the shard, 3 relay lease HASH of the
      shard (relay_lease.lua), then for each session whose timers may fire its meta HASH,
      inbox HASH and nudge STRING (all under one hash tag).
ARGV: 1 max timers to fire, 2 re-arm interval ms for deadlines, 3 session key prefix
      ("<ns>:{<ns>-<shard>}:s:"), 4 relay name, 5 its lease fence
Only the shard's lease holder fires its timers: a relay that lost the shard gets -1.
Timer members are "<kind>|<session>|<id>|<wake subject>" scored by due time (ms).
The caller declares the keys of the sessions whose timers it read as due
(Outbox.fire_timers), so on a Redis Cluster a slot in migration redirects the call before
anything ran; a due timer of a session not declared (due since the caller's read) is left for
the next call.
Each due timer becomes one wake row with id "t/<member>/<due>" (a repeated firing of the
same due timer is deduplicated by NATS) and sets the session's nudge (its dirty mark for
the holder's release; the relay reads a session's meta, never writes it); the meta and
nudge keys are derived from the prefix and share the hash tag. Deadlines are re-armed (a
session keeps being woken until a commit clears its deadline), each time twice as far off
as the last, up to DEADLINE_BACKOFF_MAX times the interval (2 minutes at the default 15 s):
a session no Brain serves (its agent or level has none) would otherwise add a wake row to
the shard's wake stream every interval, forever. The number of firings since the deadline
was armed rides in the score's fraction (k/64: due times in ms are integers far below 2^53,
so the fraction is exact); a Brain's commit arms the deadline at a whole millisecond, k = 0,
so progress resets the backoff. Other timers are removed, and so is a timer whose session
no longer exists (neither meta nor requests in its inbox).
A deadline whose last wake no Brain has taken yet adds no other: a firing leaves the time it
fired in the session's nudge, which a Brain's lease deletes, so while the nudge holds a
firing time (not a Hands' or client's "1") younger than UNTAKEN_REFIRE_MS, the wake it sent
still waits in the stream (its level has no Brain running, or they are all busy) and a
second would only double the backlog. The deadline is re-armed as usual; once the wait
passes UNTAKEN_REFIRE_MS a wake is sent again, in case the first was lost (acked by a Brain
that then gave up on it). A session no Brain serves so adds one wake row an hour, 168
within the stream's default age of 7 days, not one every 2 minutes (5,040).
Returns the number of wakes sent.
]==]
-- A deadline that keeps firing without progress waits at most this many intervals.
local DEADLINE_BACKOFF_MAX = 8
-- A deadline's wake not taken by a Brain is sent again after this long (ms).
local UNTAKEN_REFIRE_MS = 3600000
local lease = redis.call('HMGET', KEYS[3], 'holder', 'fence')
local invalid = bad_args({{'max timers', ARGV[1], 1, 100000}, {'re-arm interval ms', ARGV[2], 1, MAX_MS},
  {'fence', ARGV[5], 0, MAX_INT}})
if invalid then return invalid end
if lease[1] ~= ARGV[4] or tonumber(lease[2] or '0') ~= tonumber(ARGV[5]) then return -1 end
local now = (function()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end)()
local declared = {}
for i = 4, #KEYS do declared[KEYS[i]] = true end
local due = redis.call('ZRANGE', KEYS[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, tonumber(ARGV[1]),
                       'WITHSCORES')
local fired = 0
for i = 1, #due, 2 do
  local member, at = due[i], due[i + 1]
  local kind, sid, id, subject = string.match(member, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  local meta = kind and (ARGV[3] .. sid .. ':meta')
  -- a session the caller did not declare: its timer is left for the caller's next call
  local left = meta and not (declared[meta] and declared[ARGV[3] .. sid .. ':inbox']
                             and declared[ARGV[3] .. sid .. ':nudge'])
  if left then
    kind = 'left'
  -- a session not opened yet has only its inbox (a client's requests waiting for a Brain)
  elseif meta and (redis.call('EXISTS', meta) == 1
               or redis.call('EXISTS', ARGV[3] .. sid .. ':inbox') == 1) then
    local nudge = ARGV[3] .. sid .. ':nudge'
    -- a firing time (ms since the epoch) left by an earlier firing, or nil
    local last = kind == 'deadline' and tonumber(redis.call('GET', nudge) or '')
    if not (last and last > 1 and now - last < UNTAKEN_REFIRE_MS) then
      local data = cjson.encode({v = 1, session_id = sid, reason = 'timer:' .. kind})
      redis.call('XADD', KEYS[2], '*', 'id', 't/' .. member .. '/' .. at, 'subj', subject,
                 'data', data, 'hdr', '', 'sid', sid, 'ts', now)
      redis.call('SET', nudge, now)
      fired = fired + 1
    end
  else
    kind = 'orphan'  -- malformed, or its session is gone: drop it instead of waking nobody
  end
  if kind == 'deadline' then
    local score = tonumber(at)
    local k = math.floor((score - math.floor(score)) * 64 + 0.5)
    local wait = tonumber(ARGV[2]) * math.min(2 ^ k, DEADLINE_BACKOFF_MAX)
    redis.call('ZADD', KEYS[1], now + wait + math.min(k + 1, 63) / 64, member)
  elseif kind ~= 'left' then
    redis.call('ZREM', KEYS[1], member)
  end
end
return fired
