--[==[ partial.lua: save the text a model is streaming, for watchers (a losable partial commit).

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 worker JSON, 3 task id, 4 request id, 5 offset: the bytes of the text the
      caller saved before (where this chunk starts), 6 the new text (the chunk), 7 receipt
      JSON
Appends the chunk to the text saved so far, in meta: 'partial_of' ("<task id> <request id>"),
'partial' (the first chunk), 'partial.<k>' (chunk k + 1, k >= 1), 'partial_n' (the number of
chunks) and 'partial_len' (the text's bytes), and appends a 'partial' receipt (its detail
carries the chunk as 'delta'). Each save writes (and replicates) its chunk only, so a text
streamed in n saves costs bytes linear in its length, not the n rewrites of the whole text so
far that saving it in one field took. The next commit clears it all (clear_partial). A
partial is never a response: after a crash the Brain that takes over turns it into an
'interrupted' entry (brain.generation). A session saved before chunks has its whole text
in 'partial' and no 'partial_n': one chunk, which reads the same.
The offset is the chunk's fence: a chunk is appended only where the saved text ends (offset
= 'partial_len' for the same task and request, 0 for another one, whose text it replaces),
so a chunk retried after its save landed, or one that lost a race with another, is refused
with nothing written, and the reply says where the saved text ends: the caller sends the
text from there.
Losable: a presented fence that is not the current one writes nothing (no error, no receipt):
a stale Brain's text is simply dropped.
Returns the saved text's length in bytes after the call (offset + the chunk's bytes when it
was saved), or -1 for a stale fence.
The receipt is the first write (receipt_first): a receipts key of another type is refused
as CORRUPT with nothing written, without a check of its type every time.
SELF-GUARDED: receipts
UNGUARDED: receipts_hands receipts_client
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HSET', K_META, 'f', 'v'}, {'HDEL', K_META, 'f'}}))
if denied then return denied end

local invalid = bad_args({{'fence', ARGV[1], 0, MAX_INT}, {'offset', ARGV[5], 0, MAX_INT}})
if invalid then return invalid end
for i = 2, 7 do  -- every argument is written: a missing one would fail after the receipt
  if type(ARGV[i]) ~= 'string' then return fail('INVALID', 'partial: argument ' .. i .. ' missing') end
end
local fence = tonumber(ARGV[1])
if tonumber(META[4] or '-1') ~= fence then  -- as the guard read it
  return -1
end
local of, offset, chunk = ARGV[3] .. ' ' .. ARGV[4], tonumber(ARGV[5]), ARGV[6]
local m = redis.call('HMGET', K_META, 'partial_of', 'partial_n', 'partial_len')
local chunks, saved = 0, 0  -- of this task and request's text
if m[1] == of then
  chunks = partial_chunks(m[2], m[1])
  if m[3] and string.match(m[3], '^%d+$') then
    saved = tonumber(m[3])
  else  -- a text saved whole, before chunks
    saved = #(redis.call('HGET', K_META, 'partial') or '')
  end
end
if offset ~= saved then return saved end  -- not where the saved text ends: nothing written
local corrupt = receipt_first(K_RECEIPTS, 'partial', ARGV[2], fence, 0, now_ms(), ARGV[7])
if corrupt then return corrupt end
if chunks == 0 then  -- the first chunk: another task's or request's text goes
  if m[1] then clear_partial() end
  redis.call('HSET', K_META, 'partial', chunk, 'partial_of', of, 'partial_n', 1,
             'partial_len', #chunk)
else
  redis.call('HSET', K_META, 'partial.' .. chunks, chunk, 'partial_n', chunks + 1,
             'partial_len', saved + #chunk)
end
return saved + #chunk
