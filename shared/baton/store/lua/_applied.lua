--[==[ _applied.lua: the commit-id wrapper around every session script (see scripts.py).

The script's body (the file named by the caller) is placed inside __script(ARGV) above this
text. ARGV[1] of every session script is a commit id; the body receives ARGV[2..] as its
own ARGV, so the body's header numbers its arguments without it.
  commit id ""   the body runs, nothing is recorded (single-node mode, no WAIT).
  commit id c    a commit id already applied returns the reply recorded for it and writes
                 nothing but a PEXPIRE of the applied hash (a write, so the WAIT that follows
                 on the caller's connection also covers the original write); otherwise the
                 body runs and a reply that is not an error is recorded under c.
applied  HASH (K_APPLIED)  commit id -> "<ms> <reply JSON>", expiring APPLIED_TTL_MS after the
                        last write; over APPLIED_MAX fields, each call samples APPLIED_SAMPLE
                        records (HRANDFIELD) and deletes those older than the TTL. The
                        records younger than the TTL must stay (a retry may come for any of
                        them); sampling keeps the old ones to about 1/APPLIED_SAMPLE of the
                        hash, at a cost per call that does not grow with the hash (reading
                        every record, as this did, cost a session with thousands of commits
                        in ten minutes thousands of fields per commit).
A retry in doubt (its replica acknowledgement timed out) carries the same commit id, so a
retried submit, commit, claim or complete applies at most once.
]==]
-- Without a commit id the applied hash is never touched: its type cannot fail this call.
local corrupt = corrupt_refusal(ARGV[1] ~= '')  -- before anything, replies recorded or not
if corrupt then return corrupt end
local COMMIT_ID = table.remove(ARGV, 1)  -- what remains is the body's own ARGV
if COMMIT_ID == '' then return __script(ARGV) end
local prior = redis.call('HGET', K_APPLIED, COMMIT_ID)
if prior then
  redis.call('PEXPIRE', K_APPLIED, APPLIED_TTL_MS)
  return cjson.decode(string.sub(prior, string.find(prior, ' ', 1, true) + 1))
end
if ACL_CHECKS then
  local denied = acl_refusal({{'HSET', K_APPLIED, 'f', 'v'}, {'PEXPIRE', K_APPLIED, '1'},
                              {'HDEL', K_APPLIED, 'f'}, {'HRANDFIELD', K_APPLIED, '1'}})
  if denied then return denied end
end
local reply = __script(ARGV)
if type(reply) == 'table' and reply.err then return reply end
local now = now_ms()
if redis.call('HLEN', K_APPLIED) >= APPLIED_MAX then
  local some = redis.call('HRANDFIELD', K_APPLIED, APPLIED_SAMPLE, 'WITHVALUES')
  for i = 1, #some, 2 do
    local at = tonumber(string.match(some[i + 1], '^(%d+) ')) or 0
    if at + APPLIED_TTL_MS < now then redis.call('HDEL', K_APPLIED, some[i]) end
  end
end
redis.call('HSET', K_APPLIED, COMMIT_ID, now .. ' ' .. cjson.encode(reply))
redis.call('PEXPIRE', K_APPLIED, APPLIED_TTL_MS)
return reply
