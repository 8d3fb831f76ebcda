--[==[ approve.lua: a person's decision on a run that awaits approval, consumed once.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua); callers declare the
      inbox, the one session key a client's decision writes.
ARGV: 1 session id, 2 run id, 3 decision ('approve' | 'reject'), 4 arguments digest
      presented, 5 worker JSON, 6 receipt JSON, 7 result JSON (reject; '' to approve),
      8 wake JSON
An approval is bound to the run's exact arguments: the presented digest must equal the one
the Brain saved beside the intent (intents '<run>.digest', which the Hands cannot write), or
the approval is refused with CONFLICT (after a 'refused' receipt) and nothing is recorded.
A decision is recorded, not carried out: inbox 'decide:<run>' = {decision, ms, result}, the
nudge, a row on the shard's wakes stream (published on the session's own wake subject), and
an 'approve' or 'reject' receipt. The Brain that loads the session next dispatches an
approved run (its outbox row, status 'dispatched', '<run>.approved') or ends a rejected one
with the given result (outcome error, code 'rejected') in its own commit (brain.decisions).
Either happens once: a run with a decision pending, or that no longer awaits approval, is
refused with CONFLICT naming its status.
Returns {'approved', seq} or {'rejected', seq} (seq: the session's commit sequence now).
UNGUARDED: receipts receipts_hands
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_INBOX, 'f', 'v'}, {'SET', K_NUDGE, '1'},
  {'XADD', K_WAKES, '*', 'f', 'v'}, {'XADD', K_RECEIPTS_CLIENT, '*', 'f', 'v'}})
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
local pending = redis.call('HGET', K_INBOX, 'decide:' .. rid)
if pending then
  local ok, p = pcall(cjson.decode, pending)
  local what = (ok and type(p) == 'table' and p.decision == 'reject') and 'rejected'
    or 'approved already'
  return fail('CONFLICT', 'run ' .. rid .. ' was ' .. what .. ' (decision pending); nothing ' ..
              'dispatched again')
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
  receipt(K_RECEIPTS_CLIENT, 'refused', ARGV[5], 0, 0, now, cjson.encode({
    run_id = rid, op = 'approve', presented = digest, expected = expected}))
  return fail('CONFLICT', 'approval refused: digest ' .. digest .. ' does not match the ' ..
              'arguments of run ' .. rid .. ' (their digest is ' .. expected .. ')')
end
local m = redis.call('HMGET', K_META, 'wake', 'seq')
local wake, seq = m[1], m[2] or '0'
local kind = 'approve'
if decision ~= 'approve' then kind = 'reject' end
-- first: a wrong key type fails before any write
redis.call('HSET', K_INBOX, 'decide:' .. rid, cjson.encode({
  decision = kind, ms = now, result = ARGV[7] or ''}))
redis.call('SET', K_NUDGE, 1)
-- the wake's id names the run (decided once: a second decision is refused above), so two
-- decisions in the same millisecond are two wakes, not one deduplicated by JetStream
redis.call('XADD', K_WAKES, '*', 'id', sid .. '/' .. seq .. '/d.' .. rid, 'subj', wake,
           'data', ARGV[8], 'hdr', '', 'sid', sid, 'ts', now)
tell_holder(sid, now, '')
receipt(K_RECEIPTS_CLIENT, kind, ARGV[5], 0, seq, now, ARGV[6])
if kind == 'approve' then return {'approved', seq} end
return {'rejected', seq}
