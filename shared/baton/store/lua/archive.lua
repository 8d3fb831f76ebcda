--[==[ archive.lua: remove a settled session from Redis once its archive object is written.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 worker name, 3 session id, 4 meta seq of the snapshot written to the
      archive, 5 ids of the snapshot's last receipt in the Brains', the Hands' and the
      clients' receipts streams, space-separated ('' for none), 6 archive object key,
      7 tombstone ttl ms, 8 the newest submission's status, 9 the number of submissions
      (both kept in the tombstone for listings), 10 how long the shard's archived index
      keeps a session (ms)
The Brain that calls this holds the session's lease (fence) and has written the archive
object, read in one MULTI, and the store confirmed it (baton.store.retention). This script
is the second half of that one fenced step: it checks, before any write, that the session
is still what was archived and still settled:
  - the fence is current, held by this worker, and the lease is live;
  - meta's seq and the newest receipt of each role's stream are the snapshot's (no commit,
    no request, no tool result, no refusal since: each appends a receipt or bumps the seq);
  - no live task, no request in the inbox, no nudge, no live tool run (an intent, or a run
    record still running), and meta 'retain_at' (armed by the commit that left it idle) has passed;
  - it is not quarantined (an operator decides about those).
A session that no longer qualifies is refused (CHANGED, NOT_DUE, LIVE <what>) with nothing
written: the object in the archive is harmless (a later archival writes it again).
Then every key of the session is deleted, its timers (progress deadline, retention) and its
entry in the shard's session index go, and the tombstone is written: a small hash (at,
fence, seq, agent, compat, wake, created, status, subs: short fields, so Redis keeps it as
a compact listpack of about 400 bytes; the object's key follows from the session id)
expiring after the tombstone ttl,
which every session script refuses with ARCHIVED (archived_refusal in _lib.lua) until a
Brain restores the session (restore.lua). The session joins the shard's archived index
("<ns>:{<ns>-<shard>}:archived", ZSET, score: archival ms), whose entries older than
ARGV[10] are dropped here: it lists the sessions whose tombstones may still be there.
Returns {1, archival ms}.
The session's keys are only read before the first write (a WRONGTYPE there fails the call
with nothing written) or deleted (DEL works on any type); the tombstone does not exist (the
guard refused the call otherwise). The shard's timers and session index are guarded; the
archived index is checked here before the first write.
UNGUARDED: tasks done docs subs reqs runs runs_done intents inbox nudge receipts entries archived
UNGUARDED: poison runs_applied inbox_applied receipts_hands receipts_client
SELF-GUARDED: archived_ix
]==]
local OWN = {K_META, K_ENTRIES, K_TASKS, K_DONE, K_DOCS, K_SUBS, K_REQS, K_RUNS_DONE,
             K_RECEIPTS, K_INTENTS, K_INBOX, K_NUDGE, K_POISON, K_APPLIED}
-- Other roles' records of the session go with it: the Hands' runs, the commit ids and
-- receipts of Hands and clients (a Brain may delete them, see baton.auth), in a DEL of
-- their own (an ACL selector allows a command only when it allows every key of the call).
local THEIRS = {K_RUNS, K_RUNS_APPLIED, K_INBOX_APPLIED, K_RECEIPTS_HANDS, K_RECEIPTS_CLIENT}
if ACL_CHECKS then
  local checks = {{'DEL', unpack(OWN)}, {'ZREM', K_SESSIONS, 'm'}, {'ZREM', K_TIMERS, 'm'},
                  {'HSET', K_ARCHIVED, 'f', 'v'}, {'PEXPIRE', K_ARCHIVED, '1'},
                  {'ZADD', K_ARCHIVED_IX, '0', 'm'},
                  {'ZREMRANGEBYSCORE', K_ARCHIVED_IX, '0', '1'}}
  checks[#checks + 1] = {'DEL', unpack(THEIRS)}
  local denied = acl_refusal(checks)
  if denied then return denied end
end
local invalid = bad_args({{'fence', ARGV[1], 0, MAX_INT}, {'meta seq', ARGV[4], 0, MAX_INT},
  {'tombstone ttl ms', ARGV[7], 1, MAX_MS}, {'submissions', ARGV[9], 0, MAX_INT},
  {'archived index ms', ARGV[10], 1, MAX_MS}})
if invalid then return invalid end
local fence, worker, sid = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local cur, holder, until_ms = tonumber(META[4] or '0'), META[7] or '', tonumber(META[6] or '0')
local now = now_ms()
if not META[1] then return fail('NOT_FOUND', 'session') end
if cur ~= fence then return fail('STALE_FENCE', fence .. ' ' .. cur) end
if holder ~= worker or until_ms <= now then
  return fail('STALE_FENCE', fence .. ' ' .. cur)  -- the lease ran out: another may take it
end
if tostring(META[5] or '0') ~= ARGV[4] then return fail('CHANGED', 'seq ' .. tostring(META[5])) end
local newest_ids = {}
for _, k in ipairs({K_RECEIPTS, K_RECEIPTS_HANDS, K_RECEIPTS_CLIENT}) do
  local newest = redis.call('XREVRANGE', k, '+', '-', 'COUNT', 1)
  newest_ids[#newest_ids + 1] = (newest[1] and newest[1][1]) or ''
end
local newest_id = table.concat(newest_ids, ' ')
if newest_id ~= ARGV[5] then return fail('CHANGED', 'receipts ' .. newest_id) end
local m = redis.call('HMGET', K_META, 'retain_at', 'compat', 'created', 'partial')
local retain_at = tonumber(m[1] or '')
if not retain_at then return fail('LIVE', 'no retention armed') end
if retain_at > now then return fail('NOT_DUE', retain_at - now) end
if redis.call('HLEN', K_TASKS) > 0 then return fail('LIVE', 'tasks') end
if redis.call('HLEN', K_INBOX) > 0 then return fail('LIVE', 'requests') end
if redis.call('EXISTS', K_NUDGE) == 1 then return fail('LIVE', 'nudge') end
for _, f in ipairs(redis.call('HKEYS', K_INTENTS)) do
  if f ~= 'gc' then return fail('LIVE', 'tool run ' .. f) end
end
local records = redis.call('HGETALL', K_RUNS)  -- a completed run's may linger (gc_names)
for i = 1, #records, 2 do
  if string.sub(records[i], -7) == '.status' and records[i + 1] == 'running' then
    return fail('LIVE', 'tool run running ' .. records[i])
  end
end
if redis.call('HEXISTS', K_POISON, 'quarantined') == 1 then return fail('LIVE', 'quarantined') end
local wrong = wrong_type(K_ARCHIVED_IX, 'archived_ix', 'zset')
if wrong then return wrong end
-- Checked: from here on the step cannot fail midway.
local wake = META[2]
redis.call('DEL', unpack(OWN))
redis.call('DEL', unpack(THEIRS))
redis.call('ZREM', K_SESSIONS, sid)
redis.call('ZREM', K_TIMERS, 'deadline|' .. sid .. '|-|' .. wake, 'retain|' .. sid .. '|-|' .. wake)
redis.call('HSET', K_ARCHIVED, 'at', now, 'fence', fence, 'seq', ARGV[4], 'agent', META[1],
           'compat', m[2] or '1', 'wake', wake, 'created', m[3] or '0',
           'status', string.sub(ARGV[8], 1, 32), 'subs', ARGV[9])
redis.call('PEXPIRE', K_ARCHIVED, tonumber(ARGV[7]))
redis.call('ZADD', K_ARCHIVED_IX, now, sid)
redis.call('ZREMRANGEBYSCORE', K_ARCHIVED_IX, '-inf', now - tonumber(ARGV[10]))
return {1, now}
