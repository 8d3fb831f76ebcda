--[==[ start.lua: start a root task in a session (no submission), idempotently by request id.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV:
  1 session id     2 agent        3 compat level   4 wake subject   5 request id
  6 task id        7 task JSON    8 wake JSON      9 deadline ms   10 worker JSON
 11 receipt JSON  12 wake row headers JSON (trace context)
Creates the session meta on first use. In one step: "task:<request id>" -> task id in the
reqs hash, the pending task, an outbox wake row, the dirty mark, the progress deadline and a
'start' receipt. Returns {1, task id} when created, {0, original task id} for a repeated
request id. Fails CONFLICT when the session belongs to another agent.
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HINCRBY', K_META, 'seq', '1'}, {'HSET', K_META, 'f', 'v'},
  {'HSET', K_REQS, 'f', 'v'}, {'HSET', K_TASKS, 'f', 'v'}}))
if denied then return denied end
local sid, agent, compat, wake = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local req = 'task:' .. ARGV[5]
local existing = redis.call('HGET', K_REQS, req)
if existing then
  return {0, existing}
end
local conflict = agent_conflict(sid, agent)
if conflict then return conflict end
if redis.call('HEXISTS', K_TASKS, ARGV[6]) == 1 or redis.call('HEXISTS', K_DONE, ARGV[6]) == 1 then
  return fail('CONFLICT', 'task ' .. ARGV[6] .. ' exists')
end
local now = now_ms()
wake = open_session(sid, agent, compat, wake, now)
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
redis.call('HSET', K_REQS, req, ARGV[6])
redis.call('HSET', K_TASKS, ARGV[6], ARGV[7])
outbox(sid, seq, 0, wake, ARGV[8], ARGV[12] or '', now)
redis.call('HSET', K_META, 'dirty', 1)
set_deadline(sid, wake, tonumber(ARGV[9]), now)
receipt('start', ARGV[10], 0, seq, now, ARGV[11])
return {1, ARGV[6]}
