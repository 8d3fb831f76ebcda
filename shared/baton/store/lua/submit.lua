--[==[ submit.lua: ask for user input to be taken into a session, idempotently by request id.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua); callers declare the
      inbox, the one session key a client's submission writes.
ARGV:
  1 session id           2 agent            3 compat level     4 wake subject
  5 request id           6 submission id    7 submission JSON  8 user entry JSON
  9 task id             10 task JSON       11 wake JSON       12 worker JSON
 13 receipt JSON        14 wake row headers JSON (trace context)
 15 SHA-1 hex of the text (optional: without it a repeated request id is not compared)
 16 "1" to probe (optional): a session with neither meta nor a request waiting is not
    written to; {2, ""} is returned, nothing written (see below)
 17 admission window of the shard (optional; 0 or absent: no admission), 18 tenant (also
    the new session's, kept in its meta: Hands share capped tools' slots between tenants),
 19 priority (1 first .. 5), 20 the tenant's weight (1..100)
With an admission window, a request that opens a new session is admitted fairly
(baton.store.admission): counted as the tenant's waiting work in the shard's adm hash, and
its wake row written at once only while fewer than the window's sessions of the shard are
starting (adm_fly: their first wake written, no Brain has received it yet) and none waits
in the queue; else the row waits in adm_info, queued in adm_q by priority and fair share
(admission_score), and admitted.lua writes it when a starting session is received.
The request is recorded, not carried out: inbox 'submit:<request id>' = {agent, compat,
wake, sub, entry, task, digest}, the nudge, a row on the shard's wakes stream (published on
the session's wake subject, or for a session without meta yet on the one the request names)
and a 'submit' receipt. No shard-wide index or timer: the Brain that loads the session next
creates the session meta if it is new and lists it in the shard's session index
(acquire.lua), and writes the request id -> submission, the submission, the user entry, the
generation task and the progress deadline in its fenced commit, deleting the request
(brain.requests). A request whose wake is lost is found by the relay's inbox sweep.
Returns {1, submission JSON, place} when recorded now (place: 0 when its wake row is written,
the 1-based place in the shard's admission queue when it waits there, -1 without admission;
more input for a session waiting there writes no wake row: its turn's wake takes it up), {0, submission JSON} for a repeated request
id with the same text, pending or taken up, {2, ""} for a probe that found no session: a client
that named the session asks the archive first whether it is an archived session whose
tombstone expired (baton.client, ask_restore.lua), and submits again without the probe when
it is not. Fails FULL <why> while a relay finds JetStream full (the shard's 'full' key). Fails
CONFLICT when the session belongs to
another agent (its meta's, or a pending request's for a new session), when a pending
request for a new session is at another compat level (the request that opens a session sets
its level), or when the request id was used before with another text.
The request ids, the submissions and the inbox are read before the first write (a
submission only by a repeated request, which writes nothing), and SET replaces a nudge of
any type: one of the wrong type fails the call (WRONGTYPE) with nothing written or cannot
fail it, so the guard need not check them.
The receipt is the first write (receipt_first): a receipts key of another type is refused
as CORRUPT with nothing written, without a check of its type every time.
UNGUARDED: reqs subs inbox nudge full
SELF-GUARDED: receipts_client adm adm_info adm_fly adm_q
UNGUARDED: receipts receipts_hands
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
local bad, window, tenant, prio, weight = admission_args(17)
if bad then return bad end
-- The tenant a new session gets (its meta's, written by the lease that opens it): none for
-- the default one.
local own_tenant = nil
if tenant ~= '' and tenant ~= 'default' then own_tenant = tenant end
local sid, agent, wake, req = ARGV[1], ARGV[2], ARGV[4], ARGV[5]
if ARGV[16] == '1' and not requested_agent() then return {2, ''} end  -- no such session
local digest = ARGV[15] or ''
local function different(text)
  return digest ~= '' and redis.sha1hex(text) ~= digest
end
local existing = redis.call('HGET', K_REQS, req)
if existing then
  local original = redis.call('HGET', K_SUBS, existing)
  if original and different(cjson.decode(original).text) then
    return fail('CONFLICT', 'request id ' .. req .. ' in session ' .. sid
                .. ' was used before for submission ' .. existing .. ' with a different text')
  end
  return {0, original}
end
local pending = redis.call('HGET', K_INBOX, 'submit:' .. req)
if pending then
  local p = cjson.decode(pending)
  if digest ~= '' and p.digest ~= '' and p.digest ~= digest then
    return fail('CONFLICT', 'request id ' .. req .. ' in session ' .. sid
                .. ' was used before for submission ' .. cjson.decode(p.sub).id
                .. ' with a different text')
  end
  return {0, p.sub}
end
local conflict = inbox_agent_conflict(sid, agent, ARGV[3])
if conflict then return conflict end
-- A request opening a new session is admitted fairly; more input for a new session still
-- waiting in the admission queue writes no wake of its own (that would start the session
-- ahead of its turn): its turn's wake takes it all up.
local admit, queued, wrong = admission_of(sid, window)
if wrong then return wrong end
local now = now_ms()
local m = {META[2], META[5]}  -- wake, seq as the guard read them (no write since)
wake = m[1] or wake
local seq = m[2] or '0'
local corrupt = receipt_first(K_RECEIPTS_CLIENT, 'submit', ARGV[12], 0, seq, now, ARGV[13])
if corrupt then return corrupt end
redis.call('HSET', K_INBOX, 'submit:' .. req, cjson.encode({
  agent = agent, compat = tonumber(ARGV[3]), wake = ARGV[4], sub = ARGV[7], entry = ARGV[8],
  task = ARGV[10], digest = digest, tenant = own_tenant}))
redis.call('SET', K_NUDGE, 1)
local row_id = sid .. '/' .. seq .. '/s.' .. req
if queued then return {1, ARGV[7], redis.call('ZRANK', K_ADM_Q, sid) + 1} end
if not admit then
  redis.call('XADD', K_WAKES, '*', 'id', row_id, 'subj', wake, 'data', ARGV[11],
             'hdr', ARGV[14] or '', 'sid', sid, 'ts', now)
  tell_holder(sid, now, ARGV[14])
  return {1, ARGV[7], -1}
end
return {1, ARGV[7], admit_new(sid, {id = row_id, subj = wake, data = ARGV[11],
  hdr = ARGV[14] or ''}, window, tenant, prio, weight, now)}