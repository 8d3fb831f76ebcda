--[==[ release.lua: give up a session's lease unless work arrived meanwhile.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 lease ttl ms, 3 worker JSON and 4 receipt JSON (both optional: a holder
      ending a hold, see commit.lua 'hd'; '' for none), 5 handover (optional, 0 or 1)
If the dirty mark is set (meta 'dirty' by a submit or a commit, the nudge by a tool
completion or a timer, while the holder worked), the lease is kept and extended, the mark cleared, and 1 is returned: the holder
must load and schedule again. Otherwise the lease is released and 0 is returned. This is
what makes a wake that races the release impossible to lose.
Either way a hold ends: meta 'listen' is cleared (see commit.lua 'hd'), so later tool
results wake the session through the relay again. A holder that ends its hold presents its
worker and a receipt: when the lease is kept, a 'held' receipt records the handoff (the
results came to the holder without a wake), as a lease receipt records one that came with
a wake; a hold that found nothing leaves no receipt.
A handover (ARGV 5 = 1) is the release of a holder stopping mid-pass (its Brain's drain ran
out, brain.session): the lease is released whatever arrived meanwhile (the dirty mark and the
nudge stay for the next lease, which clears them and loads everything), and meta 'handed'
records the fence that handed the session over, so the Brain that takes it over re-enters
the interrupted phase without counting a crash (brain.generation, brain.custom). It returns
0 and writes no receipt.
Refused with STALE_FENCE <presented> <current> when a newer fence exists.
The nudge is only tested (EXISTS) and deleted (DEL), which no type fails.
The receipt is the first write (receipt_first): a receipts key of another type is refused
as CORRUPT with nothing written.
UNGUARDED: nudge
SELF-GUARDED: receipts
UNGUARDED: receipts_hands receipts_client
]==]
local invalid = bad_args({{'fence', ARGV[1], 0, MAX_INT}, {'lease ttl ms', ARGV[2], 1, MAX_MS},
  {'handover', ARGV[5] or '0', 0, 1}})
if invalid then return invalid end
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_META, 'f', 'v'}, {'DEL', K_NUDGE},
  {'XADD', K_RECEIPTS, '*', 'f', 'v'}})
if denied then return denied end
local fence = tonumber(ARGV[1])
local m = redis.call('HMGET', K_META, 'fence', 'dirty')
local cur = tonumber(m[1] or '0')
if cur ~= fence then
  return fail('STALE_FENCE', fence .. ' ' .. cur)
end
if tonumber(ARGV[5] or '0') == 1 then
  redis.call('HSET', K_META, 'holder', '', 'lease_until', 0, 'listen', '', 'handed', fence)
  return 0
end
if m[2] == '1' or redis.call('EXISTS', K_NUDGE) == 1 then
  local now = now_ms()
  if ARGV[3] and ARGV[3] ~= '' then
    local corrupt = receipt_first(K_RECEIPTS, 'held', ARGV[3], fence, 0, now, ARGV[4] or '{}')
    if corrupt then return corrupt end
  end
  redis.call('HSET', K_META, 'dirty', 0, 'lease_until', now + tonumber(ARGV[2]),
             'listen', '')
  redis.call('DEL', K_NUDGE)
  return 1
end
redis.call('HSET', K_META, 'holder', '', 'lease_until', 0, 'listen', '')
return 0
