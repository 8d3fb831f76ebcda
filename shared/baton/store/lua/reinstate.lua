--[==[ reinstate.lua: write an archived session's tombstone back, from its archive object.

KEYS: 1 key of the session (meta), the rest derived from it (see _lib.lua).
ARGV: 1 the object's archival ms, 2 the fence it was archived under, 3 its meta seq,
      4 agent, 5 compat level, 6 wake subject, 7 created ms, 8 the newest submission's
      status, 9 the number of submissions (the tombstone's fields, as archive.lua wrote
      them), 10 tombstone ttl ms
Not wrapped by _applied.lua and not refused by archived_refusal, as restore.lua.
A tombstone lives BATON_TOMBSTONE_TTL_S; a session asked back after that has neither keys
nor tombstone in Redis, only its archive object. The client that finds it so leaves a
restore request (ask_restore.lua, with the object's wake subject); the Brain whose lease is
then refused NOT_FOUND with that request waiting reads the object and calls this. When the
session still has no meta and no tombstone and the request still waits, the tombstone is
written as archive.lua wrote it (the fence the session was archived under, so a restore
starts past it and a worker that held it before stays fenced out), expiring after ARGV[10],
and the session rejoins the shard's archived index; restore.lua then restores it as any
archived session, exactly once. Returns 1 when written, 0 when nothing was to be done (the
session is live, or its tombstone is back, or no request waits: another Brain was first).
]==]
local invalid = bad_args({{'archival ms', ARGV[1], 0, MAX_MS * 100}, {'fence', ARGV[2], 0, MAX_INT},
  {'meta seq', ARGV[3], 0, MAX_INT}, {'tombstone ttl ms', ARGV[10], 1, MAX_MS}})
if invalid then return invalid end
if redis.call('EXISTS', K_META) == 1 or redis.call('EXISTS', K_ARCHIVED) == 1 then return 0 end
if redis.call('HEXISTS', K_INBOX, 'restore') == 0 then return 0 end
local at = tonumber(ARGV[1])
local wrong = wrong_type(K_ARCHIVED_IX, 'archived index', 'zset')
if wrong then return wrong end
redis.call('HSET', K_ARCHIVED, 'at', at, 'fence', ARGV[2], 'seq', ARGV[3], 'agent', ARGV[4],
           'compat', ARGV[5], 'wake', ARGV[6], 'created', ARGV[7],
           'status', string.sub(ARGV[8], 1, 32), 'subs', ARGV[9])
redis.call('PEXPIRE', K_ARCHIVED, tonumber(ARGV[10]))
local sid = string.match(K_BASE, ':s:(.*)$')
redis.call('ZADD', K_ARCHIVED_IX, at, sid)
return 1
