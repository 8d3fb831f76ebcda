--[==[ renew.lua: extend the lease of the current holder.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 lease ttl ms, 3 worker JSON (optional, for a 'refused' receipt)
Refused with STALE_FENCE <presented> <current> when a newer fence exists, after a 'refused'
receipt: the stale holder learning of the takeover is a fact worth tracing.
Returns {the new expiry (ms), the targets of the cancel requests waiting in the inbox}:
a holder working long (a model call) learns of a cancel at its renewal and stops the work
the cancel concerns instead of finishing it first (brain.session, brain.generation).
Only a refusal writes a receipt, as its one write (receipt_first): a receipts key of another
type is refused as CORRUPT with nothing written, without a check of its type every renewal.
SELF-GUARDED: receipts
UNGUARDED: receipts_hands receipts_client
]==]
local invalid = bad_args({{'fence', ARGV[1], 0, MAX_INT}, {'lease ttl ms', ARGV[2], 1, MAX_MS}})
if invalid then return invalid end
local fence = tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', K_META, 'fence') or '0')
if cur ~= fence then
  if ARGV[3] then
    local corrupt = receipt_first(K_RECEIPTS, 'refused', ARGV[3], fence, 0, now_ms(),
                                  cjson.encode({current = cur, op = 'renew'}))
    if corrupt then return corrupt end
  end
  return fail('STALE_FENCE', fence .. ' ' .. cur)
end
local expiry = now_ms() + tonumber(ARGV[2])
redis.call('HSET', K_META, 'lease_until', expiry)
local cancels = {}
local ok, fields = pcall(redis.call, 'HKEYS', K_INBOX)  -- an inbox of another type: none
if ok then
  for _, f in ipairs(fields) do
    if string.sub(f, 1, 7) == 'cancel:' then cancels[#cancels + 1] = string.sub(f, 8) end
  end
end
return {expiry, cancels}
