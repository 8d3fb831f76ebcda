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
                        last write; over APPLIED_MAX fields, records older than the TTL go.
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
                              {'HDEL', K_APPLIED, 'f'}})
  if denied then return denied end
end
local reply = __script(ARGV)
if type(reply) == 'table' and reply.err then return reply end
local now = now_ms()
if redis.call('HLEN', K_APPLIED) >= APPLIED_MAX then
  local all = redis.call('HGETALL', K_APPLIED)
  for i = 1, #all, 2 do
    local at = tonumber(string.match(all[i + 1], '^(%d+) ')) or 0
    if at + APPLIED_TTL_MS < now then redis.call('HDEL', K_APPLIED, all[i]) end
  end
end
redis.call('HSET', K_APPLIED, COMMIT_ID, now .. ' ' .. cjson.encode(reply))
redis.call('PEXPIRE', K_APPLIED, APPLIED_TTL_MS)
return reply
