--[==[ start.lua: ask for a root task to be started in a session, idempotently by request id.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua); callers declare the
      inbox, the one session key a client's start writes.
ARGV:
  1 session id     2 agent        3 compat level   4 wake subject   5 request id
  6 task id        7 task JSON    8 wake JSON      9 deadline ms   10 worker JSON
 11 receipt JSON  12 wake row headers JSON (trace context)
The request is recorded, not carried out: inbox 'start:<request id>' = {agent, compat, wake,
task}, the nudge, the shard's session index (a new session), a row on the shard's wakes
stream, the progress deadline (a lost wake is retried) and a 'start' receipt. The Brain that loads the session next creates the session meta
if it is new (acquire.lua) and writes "task:<request id>" -> task id in the reqs hash and
the pending task in its fenced commit, deleting the request (brain.requests).
Returns {1, task id} when recorded now, {0, task id} for a repeated request id (pending or
taken up). Fails CONFLICT when the session belongs to another agent or the task exists.
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_INBOX, 'f', 'v'}, {'SET', K_NUDGE, '1'},
  {'XADD', K_WAKES, '*', 'f', 'v'}, {'XADD', K_RECEIPTS, '*', 'f', 'v'},
  {'ZADD', K_SESSIONS, 'NX', '0', 'm'}, {'ZADD', K_TIMERS, '0', 'm'}, {'ZREM', K_TIMERS, 'm'}})
if denied then return denied end
local sid, agent, wake, req = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
local existing = redis.call('HGET', K_REQS, 'task:' .. req)
if existing then
  return {0, existing}
end
local pending = redis.call('HGET', K_INBOX, 'start:' .. req)
if pending then
  return {0, cjson.decode(cjson.decode(pending).task).id}
end
local conflict = inbox_agent_conflict(sid, agent)
if conflict then return conflict end
if redis.call('HEXISTS', K_TASKS, ARGV[6]) == 1 or redis.call('HEXISTS', K_DONE, ARGV[6]) == 1 then
  return fail('CONFLICT', 'task ' .. ARGV[6] .. ' exists')
end
local now = now_ms()
local m = redis.call('HMGET', K_META, 'wake', 'seq')
wake = m[1] or wake
local seq = m[2] or '0'
redis.call('HSET', K_INBOX, 'start:' .. req, cjson.encode({  -- first: a wrong key type fails
  agent = agent, compat = tonumber(ARGV[3]), wake = ARGV[4], task = ARGV[7]}))
redis.call('SET', K_NUDGE, 1)
if not m[1] then redis.call('ZADD', K_SESSIONS, 'NX', now, sid) end  -- listed from the start
redis.call('XADD', K_WAKES, '*', 'id', sid .. '/' .. seq .. '/t.' .. req, 'subj', wake,
           'data', ARGV[8], 'hdr', ARGV[12] or '', 'sid', sid, 'ts', now)
set_deadline(sid, wake, tonumber(ARGV[9]), now)  -- a lost wake is retried
receipt('start', ARGV[10], 0, seq, now, ARGV[11])
return {1, ARGV[6]}
