--[==[ submit.lua: accept user input into a session, idempotently by client request id.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV:
  1 session id           2 agent            3 compat level     4 wake subject
  5 request id           6 submission id    7 submission JSON  8 user entry JSON
  9 task id             10 task JSON       11 wake JSON       12 deadline ms
 13 worker name         14 receipt JSON      15 wake row headers JSON (trace context)
 16 SHA-1 hex of the text (optional: without it a repeated request id is not compared)
Creates the session meta on first use. In one step: request id -> submission, submission,
user entry, generation task, outbox wake row, dirty mark, progress deadline, receipt.
Returns {1, submission JSON} when created, {0, original submission JSON} for a repeated
request id with the same text. Fails CONFLICT when the session belongs to another agent,
or when the request id was used before with another text (a reused id must not silently
answer with a different input's submission).
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HINCRBY', K_META, 'seq', '1'}, {'HSET', K_META, 'f', 'v'}, {'HSET', K_REQS, 'f', 'v'},
  {'HSET', K_SUBS, 'f', 'v'}, {'RPUSH', K_ENTRIES, 'x'}, {'HSET', K_TASKS, 'f', 'v'}}))
if denied then return denied end
local sid, agent, compat, wake = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local existing = redis.call('HGET', K_REQS, ARGV[5])
if existing then
  local original = redis.call('HGET', K_SUBS, existing)
  local digest = ARGV[16] or ''
  if digest ~= '' and original and redis.sha1hex(cjson.decode(original).text) ~= digest then
    return fail('CONFLICT', 'request id ' .. ARGV[5] .. ' in session ' .. sid
                .. ' was used before for submission ' .. existing .. ' with a different text')
  end
  return {0, original}
end
local conflict = agent_conflict(sid, agent)
if conflict then return conflict end
local now = now_ms()
wake = open_session(sid, agent, compat, wake, now)
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
redis.call('HSET', K_REQS, ARGV[5], ARGV[6])
redis.call('HSET', K_SUBS, ARGV[6], ARGV[7])
redis.call('RPUSH', K_ENTRIES, ARGV[8])
redis.call('HSET', K_TASKS, ARGV[9], ARGV[10])
outbox(sid, seq, 0, wake, ARGV[11], ARGV[15] or '', now)
redis.call('HSET', K_META, 'dirty', 1)
set_deadline(sid, wake, tonumber(ARGV[12]), now)
receipt('submit', ARGV[13], 0, seq, now, ARGV[14])
return {1, ARGV[7]}
