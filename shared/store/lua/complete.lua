--[==[ complete.lua: a Hands attempt commits its tool result (mark 'completed').

KEYS: the 14 session keys (see _lib.lua).
ARGV: 1 run id, 2 attempt, 3 result JSON, 4 worker JSON, 5 group ("" for none),
      6 force wake (1/0), 7 wake JSON, 8 session id, 9 receipt JSON, 10 headers JSON
Only the current attempt of a run without a result may complete it; anything else is
refused with STALE_ATTEMPT <presented> <current> <status> after a 'refused' receipt.
In one step: result, 'completed' mark, attempt summary and, when this completion is the
last of its group (or forced), an outbox wake row plus the session's dirty mark.
Returns {1 if a wake was written, 0 otherwise}.
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HINCRBY', K_META, 'seq', '1'}, {'HSET', K_META, 'f', 'v'}, {'HDEL', K_META, 'f'},
  {'HSET', K_RUNS, 'f', 'v'}}))
if denied then return denied end
local rid, attempt = ARGV[1], tonumber(ARGV[2])
local r = redis.call('HMGET', K_RUNS, rid .. '.attempt', rid .. '.status', rid .. '.attempts')
local cur = tonumber(r[1] or '0')
local now = now_ms()
if not r[2] or cur ~= attempt or r[2] ~= 'running' then
  local status = r[2]
  if not status then  -- already applied by the Brain: report its real last attempt
    local d = redis.call('HGET', K_RUNS_DONE, rid .. '.attempt')
    if d then cur, status = tonumber(d), 'applied' end
  end
  status = status or 'gone'
  receipt('refused', ARGV[4], attempt, 0, now, cjson.encode({
    run_id = rid, current = cur, status = status, op = 'complete'}))
  return fail('STALE_ATTEMPT', attempt .. ' ' .. cur .. ' ' .. status)
end
local group = ARGV[5]
if group ~= '' and not integer(redis.call('HGET', K_META, 'grp:' .. group)) then
  return fail('CORRUPT', 'meta grp:' .. group .. ' is not an integer')
end
local wake = redis.call('HGET', K_META, 'wake')
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
local summary = '{"attempt":' .. attempt .. ',"ended":' .. now .. '}'
local attempts = r[3]
if attempts then attempts = string.sub(attempts, 1, -2) .. ',' .. summary .. ']'
else attempts = '[' .. summary .. ']' end
redis.call('HSET', K_RUNS, rid .. '.result', ARGV[3], rid .. '.status', 'completed',
           rid .. '.completed', now, rid .. '.attempts', attempts)
local woke = 0
if group ~= '' then
  local left = redis.call('HINCRBY', K_META, 'grp:' .. group, -1)
  if left <= 0 then
    redis.call('HDEL', K_META, 'grp:' .. group)
    woke = 1
  end
else
  woke = 1
end
if ARGV[6] == '1' then woke = 1 end
if woke == 1 then
  outbox(ARGV[8], seq, 0, wake, ARGV[7], ARGV[10], now)
  redis.call('HSET', K_META, 'dirty', 1)
end
receipt('complete', ARGV[4], attempt, seq, now, ARGV[9])
return {woke}
