--[==[ partial.lua: save the text a model is streaming, for watchers (a losable partial commit).

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 worker JSON, 3 task id, 4 request id, 5 the text so far, 6 receipt JSON
Sets meta 'partial' (the text so far) and 'partial_of' ("<task id> <request id>") and appends
a 'partial' receipt (its detail carries the new text as 'delta'). The next commit clears both
fields (commit.lua). A partial is never a response: after a crash the Brain that takes over
turns it into an 'interrupted' entry (brain.generation).
Losable: a presented fence that is not the current one writes nothing and returns 0 (no
error, no receipt): a stale Brain's text is simply dropped. Returns 1 when saved.
The receipt is the first write (receipt_first): a receipts key of another type is refused
as CORRUPT with nothing written, without a check of its type every time.
SELF-GUARDED: receipts
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HSET', K_META, 'f', 'v'}}))
if denied then return denied end

local invalid = bad_args({{'fence', ARGV[1], 0, MAX_INT}})
if invalid then return invalid end
for i = 2, 6 do  -- every argument is written: a missing one would fail after the receipt
  if type(ARGV[i]) ~= 'string' then return fail('INVALID', 'partial: argument ' .. i .. ' missing') end
end
local fence = tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', K_META, 'fence') or '-1')
if cur ~= fence then
  return 0
end
local corrupt = receipt_first('partial', ARGV[2], fence, 0, now_ms(), ARGV[6])
if corrupt then return corrupt end
redis.call('HSET', K_META, 'partial', ARGV[5], 'partial_of', ARGV[3] .. ' ' .. ARGV[4])
return 1
