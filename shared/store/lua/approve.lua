--[==[ approve.lua: a person's decision on a run that awaits approval, consumed once.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 session id, 2 run id, 3 decision ('approve' | 'reject'), 4 arguments digest
      presented, 5 worker JSON, 6 receipt JSON,
      approve: 7 dispatch subject, 8 dispatch JSON, 9 headers JSON
      reject:  7 result JSON, 8 wake JSON
An approval is bound to the run's exact arguments: the presented digest must equal the one
the Brain saved beside the intent (intents '<run>.digest', which the Hands cannot write), or
the approval is refused with CONFLICT (after a 'refused' receipt) and nothing is dispatched. In one step an approval
sets the status 'dispatched', '<run>.approved' (intents hash) and the run's outbox
dispatch row; a rejection completes the run with the given result (outcome error, code
'rejected') in the intents hash, lowers its group's awaited count, wakes the Brain when no
result of the group is awaited any more and sets the dirty mark. Either happens once: a run
that no longer awaits approval is refused with CONFLICT naming its status.
Returns {'approved', seq} or {'rejected', seq}.
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HINCRBY', K_META, 'seq', '1'}, {'HSET', K_META, 'f', 'v'},
  {'HINCRBY', K_INTENTS, 'f', '1'}, {'HSET', K_INTENTS, 'f', 'v'}}))
if denied then return denied end
local sid, rid, decision, digest = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if redis.call('EXISTS', K_META) == 0 then
  return fail('NOT_FOUND', 'session ' .. sid)
end
-- What is decided comes from the intents hash (the Brain's), never from the run records the
-- Hands write: the run's status there, the digest it must present, its intent.
local own = redis.call('HMGET', K_INTENTS, rid .. '.status', rid .. '.digest', rid .. '.approved',
                       rid)
local now = now_ms()
if not own[4] then
  local d = redis.call('HMGET', K_RUNS_DONE, rid .. '.intent', rid .. '.approved')
  if not d[1] then return fail('NOT_FOUND', 'run ' .. rid .. ' in session ' .. sid) end
  if d[2] then
    return fail('CONFLICT', 'run ' .. rid .. ' was approved already (at ' .. d[2] ..
                ' ms) and has ended; nothing dispatched again')
  end
  return fail('CONFLICT', 'run ' .. rid .. ' has ended; it awaits no approval')
end
if own[1] ~= 'awaiting_approval' then
  local status = run_status(own[1], redis.call('HGET', K_RUNS, rid .. '.status')) or 'dispatched'
  if own[3] then
    return fail('CONFLICT', 'run ' .. rid .. ' was approved already (at ' .. own[3] ..
                ' ms; status ' .. status .. '); nothing dispatched again')
  end
  return fail('CONFLICT', 'run ' .. rid .. ' awaits no approval (status ' .. status .. ')')
end
local expected = own[2] or ''
if decision == 'approve' and digest ~= expected then
  receipt('refused', ARGV[5], 0, 0, now, cjson.encode({
    run_id = rid, op = 'approve', presented = digest, expected = expected}))
  return fail('CONFLICT', 'approval refused: digest ' .. digest .. ' does not match the ' ..
              'arguments of run ' .. rid .. ' (their digest is ' .. expected .. ')')
end
local iok, intent = pcall(cjson.decode, own[4])
local group = iok and type(intent) == 'table' and type(intent.group) == 'string' and intent.group
if decision ~= 'approve' and group and not (integer(redis.call('HGET', K_INTENTS, 'grp:' .. group))
    and integer(redis.call('HGET', K_RUNS, 'grp:' .. group))) then
  return fail('CORRUPT', 'grp:' .. group .. ' is not an integer')  -- before any write
end
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
if decision == 'approve' then
  redis.call('HSET', K_INTENTS, rid .. '.status', 'dispatched', rid .. '.approved', now)
  outbox(sid, seq, 0, ARGV[7], ARGV[8], ARGV[9], now)
  receipt('approve', ARGV[5], 0, seq, now, ARGV[6])
  return {'approved', seq}
end
redis.call('HSET', K_INTENTS, rid .. '.status', 'completed', rid .. '.completed', now,
           rid .. '.result', ARGV[7])
local wake_now = 1
if group then  -- one result fewer for the group to await
  local left = redis.call('HINCRBY', K_INTENTS, 'grp:' .. group, -1)
  local got = tonumber(redis.call('HGET', K_RUNS, 'grp:' .. group) or '0')
  if got < left then wake_now = 0 end
end
if wake_now == 1 then
  outbox(sid, seq, 0, redis.call('HGET', K_META, 'wake'), ARGV[8], '', now)
end
redis.call('HSET', K_META, 'dirty', 1)
receipt('reject', ARGV[5], 0, seq, now, ARGV[6])
return {'rejected', seq}
