--[==[ start.lua: ask for a root task to be started in a session, idempotently by request id.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua); callers declare the
      inbox, the one session key a client's start writes.
ARGV:
  1 session id     2 agent        3 compat level   4 wake subject   5 request id
  6 task id        7 task JSON    8 wake JSON      9 worker JSON   10 receipt JSON
 11 wake row headers JSON (trace context)
 12 "1" to probe (optional): {2, ""} with nothing written for a session with neither meta
    nor a request waiting, as in submit.lua
 13 admission window of the shard, 14 tenant, 15 priority, 16 weight (optional): a request
    opening a new session is admitted fairly, and the session gets its tenant, as in
    submit.lua
The request is recorded, not carried out: inbox 'start:<request id>' = {agent, compat, wake,
task}, the nudge, a row on the shard's wakes stream and a 'start' receipt. The Brain that
loads the session next creates the session meta if it is new and lists it in the shard's
session index (acquire.lua), and writes "task:<request id>" -> task id in the reqs hash, the
pending task and the progress deadline in its fenced commit, deleting the request
(brain.requests). A request whose wake is lost is found by the relay's inbox sweep.
Returns {1, task id, place} when recorded now (place as submit.lua's), {0, task id} for a repeated request id (pending or
taken up). Fails FULL <why> while a relay finds JetStream full (the shard's 'full' key). Fails
CONFLICT when the session belongs to another agent or the task exists.
UNGUARDED: full
UNGUARDED: receipts receipts_hands
SELF-GUARDED: adm adm_info adm_fly adm_q
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_INBOX, 'f', 'v'}, {'SET', K_NUDGE, '1'},
  {'XADD', K_WAKES, '*', 'f', 'v'}, {'XADD', K_RECEIPTS_CLIENT, '*', 'f', 'v'},
  {'HSET', K_ADM, 'f', 'v'}, {'HSET', K_ADM_INFO, 'f', 'v'}, {'ZADD', K_ADM_Q, '0', 'm'},
  {'ZADD', K_ADM_FLY, '0', 'm'}})
if denied then return denied end
-- JetStream refuses the relay's messages for want of room (baton.store.capacity): new input
-- would only wait in the outbox, so it is refused, retryably, with nothing written.
local bus_full = redis.call('GET', K_FULL)
if bus_full then return fail('FULL', bus_full) end
local invalid = bad_args({{'compat level', ARGV[3], 0, MAX_INT}})
if invalid then return invalid end
local bad, window, tenant, prio, weight = admission_args(13)
if bad then return bad end
local sid, agent, wake, req = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
if ARGV[12] == '1' and not requested_agent() then return {2, ''} end  -- no such session
local existing = redis.call('HGET', K_REQS, 'task:' .. req)
if existing then
  return {0, existing}
end
local pending = redis.call('HGET', K_INBOX, 'start:' .. req)
if pending then
  return {0, cjson.decode(cjson.decode(pending).task).id}
end
local conflict = inbox_agent_conflict(sid, agent, ARGV[3])
if conflict then return conflict end
if redis.call('HEXISTS', K_TASKS, ARGV[6]) == 1 or redis.call('HEXISTS', K_DONE, ARGV[6]) == 1 then
  return fail('CONFLICT', 'task ' .. ARGV[6] .. ' exists')
end
-- A request opening a new session is admitted fairly; more input for a new session still
-- waiting in the admission queue writes no wake of its own (that would start the session
-- ahead of its turn): its turn's wake takes it all up.
local admit, queued, wrong = admission_of(sid, window)
if wrong then return wrong end
local own_tenant = nil  -- the new session's tenant (see submit.lua)
if tenant ~= '' and tenant ~= 'default' then own_tenant = tenant end
local now = now_ms()
local m = {META[2], META[5]}  -- wake, seq as the guard read them (no write since)
wake = m[1] or wake
local seq = m[2] or '0'
redis.call('HSET', K_INBOX, 'start:' .. req, cjson.encode({  -- first: a wrong key type fails
  agent = agent, compat = tonumber(ARGV[3]), wake = ARGV[4], task = ARGV[7],
  tenant = own_tenant}))
redis.call('SET', K_NUDGE, 1)
local row_id = sid .. '/' .. seq .. '/t.' .. req
local place = -1
if admit then
  place = admit_new(sid, {id = row_id, subj = wake, data = ARGV[8], hdr = ARGV[11] or ''},
                    window, tenant, prio, weight, now)
elseif queued then
  place = redis.call('ZRANK', K_ADM_Q, sid) + 1
else
  redis.call('XADD', K_WAKES, '*', 'id', row_id, 'subj', wake,
             'data', ARGV[8], 'hdr', ARGV[11] or '', 'sid', sid, 'ts', now)
  tell_holder(sid, now, ARGV[11])
end
receipt(K_RECEIPTS_CLIENT, 'start', ARGV[9], 0, seq, now, ARGV[10])
return {1, ARGV[6], place}
