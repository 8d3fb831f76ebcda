--[==[ cancel.lua: record a cancel intent for a session's tasks, idempotently (client side).

KEYS: 1 key of the session, the rest derived from it (see _lib.lua); callers declare the
      inbox, the one session key a client's cancel writes.
ARGV: 1 session id, 2 target (a task id, or '*' for every root task of the session),
      3 wake JSON, 4 worker JSON, 5 receipt JSON, 6 the reason (optional)
The intent is recorded first, before any Brain acts on it, and nothing the Brain owns is
written: inbox 'cancel:<target>' = now, or {"at": now, "reason": ...} with a reason (the
cancelled tasks end with it), the nudge (the holder rechecks before it
releases), a wake row in the shard's wakes stream (the relay publishes it on the session's
own wake subject) and a 'cancel' receipt. The Brain that loads the session next turns the
intent into cancel_requested on the target tasks and deletes it in its commit, which arms
or clears the progress deadline (brain.cancel). A request whose wake is lost is found by the
relay's inbox sweep.
Returns one of:
  {'requested', target}              the intent was recorded now
  {'pending', target}                recorded before and not yet consumed, or every target
                                     task already has cancel_requested: nothing written
  {'finished', target, outcome}      the task (or every task of the session) has ended:
                                     nothing to cancel, nothing written
A task whose submit or start request waits in the inbox counts as unfinished.
Fails NOT_FOUND for an unknown session or task.
UNGUARDED: receipts receipts_hands
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_INBOX, 'f', 'v'}, {'SET', K_NUDGE, '1'},
  {'XADD', K_WAKES, '*', 'f', 'v'}, {'XADD', K_RECEIPTS_CLIENT, '*', 'f', 'v'}, {'HVALS', K_INBOX}})
if denied then return denied end
-- Tasks whose submit or start request waits in the inbox (the Brain takes the requests up
-- before the cancels): a session that has only those is not opened yet, but exists.
local requested = {}
for _, raw in ipairs(redis.call('HVALS', K_INBOX)) do
  local ok, r = pcall(cjson.decode, raw)
  if ok and type(r) == 'table' and type(r.task) == 'string' then
    local tok, t = pcall(cjson.decode, r.task)
    if tok and type(t) == 'table' and type(t.id) == 'string' then requested[t.id] = true end
  end
end
if redis.call('EXISTS', K_META) == 0 and next(requested) == nil then
  return fail('NOT_FOUND', 'session ' .. ARGV[1])
end
local sid, target = ARGV[1], ARGV[2]
local field = 'cancel:' .. target
if redis.call('HEXISTS', K_INBOX, field) == 1 or redis.call('HEXISTS', K_META, field) == 1 then
  return {'pending', target}
end
if requested[target] or (target == '*' and next(requested) ~= nil) then
  -- recorded below: the task is started, then cancelled, by the same Brain pass
elseif target == '*' then
  local live, requested = 0, 0
  local all = redis.call('HVALS', K_TASKS)
  for _, raw in ipairs(all) do
    local ok, t = pcall(cjson.decode, raw)
    if ok and type(t) == 'table' and (t.parent == nil or t.parent == cjson.null)
        and type(t.state) == 'table' and t.state.name ~= 'terminal' then
      live = live + 1
      if t.cancel_requested == true then requested = requested + 1 end
    end
  end
  if live == 0 then return {'finished', target, 'no unfinished task'} end
  if requested == live then return {'pending', target} end
else
  local raw = redis.call('HGET', K_TASKS, target)
  if not raw then
    local done = redis.call('HGET', K_DONE, target)
    if not done then return fail('NOT_FOUND', 'task ' .. target .. ' in session ' .. sid) end
    local ok, t = pcall(cjson.decode, done)
    local outcome = (ok and type(t) == 'table' and type(t.state) == 'table'
                     and t.state.outcome) or 'ended'
    return {'finished', target, tostring(outcome)}
  end
  local ok, t = pcall(cjson.decode, raw)
  if ok and type(t) == 'table' then
    if type(t.state) == 'table' and t.state.name == 'terminal' then
      return {'finished', target, tostring(t.state.outcome)}
    end
    if t.cancel_requested == true then return {'pending', target} end
  end
end
local now = now_ms()
local m = {META[2], META[5]}  -- wake, seq as the guard read them (no write since)
local wake, seq = m[1] or select(3, requested_agent()), m[2] or '0'
if type(wake) ~= 'string' or wake == '' then  -- before the first write
  return fail('CORRUPT', 'session ' .. sid .. ' has no wake subject to wake it on')
end
local intent = now
if ARGV[6] and ARGV[6] ~= '' then intent = cjson.encode({at = now, reason = ARGV[6]}) end
redis.call('HSET', K_INBOX, field, intent)  -- first: a wrong key type fails before any write
redis.call('SET', K_NUDGE, 1)
-- the wake's id names the target (a second cancel of it is 'pending' until a Brain consumes
-- the first), so cancels of two targets in the same millisecond are two wakes
redis.call('XADD', K_WAKES, '*', 'id', sid .. '/' .. seq .. '/c.' .. target .. '.' .. now,
           'subj', wake, 'data', ARGV[3], 'hdr', '', 'sid', sid, 'ts', now)
tell_holder(sid, now, '')
receipt(K_RECEIPTS_CLIENT, 'cancel', ARGV[4], 0, seq, now, ARGV[5])
return {'requested', target}
