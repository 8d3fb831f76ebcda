--[==[ acquire.lua: take a session's lease; the new fence is the previous fence + 1.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 worker name, 2 lease ttl ms, 3 worker JSON (for the receipt),
      4 carrier JSON (optional: how the wake that started this pass arrived, see
        baton.receipts.Carrier; saved in the receipt as 'carrier'),
      5 entries page (optional; > 0: the reply carries the session's state as well, the
        load of the new fence holder in the same round trip; -1: the caller reads that
        state itself right after this call (baton.store.loading.lease_reads): the keys it
        reads are checked here, before any write, so one of the wrong type refuses the
        lease with nothing written, as the reads here would),
      6 entries held (optional: the caller holds the entries before this index from an
        earlier read, see baton.store.entry_cache), 7 the meta 'created' ms of the session
        it read them from: the entries read start at the held index when that is within
        the page's entries, not past the list's end, and of the same session's life
A session without meta whose inbox holds a submit or start request is opened here for
that request's agent, compat level and wake subject (meta, the shard's session index);
without one it is NOT_FOUND, also when a client's restore request waits (ask_restore.lua) but
no tombstone (archived_refusal would have refused the lease): the tombstone expired, and the
Brain writes it back from the archive object, or drops the request when the archive has none
(reinstate.lua, baton.store.retention.reinstate). A restore request found by a request that
opens the session is such an orphan too, and is dropped.
Refused with BUSY <holder> <remaining ms> while another worker's lease is live.
A lease past its expiry, or left by a pass of the same worker name that never released it
(a worker restarted under its name), is taken over: that is recorded as a 'takeover' receipt.
Clears the dirty mark (and the nudge): the new holder loads everything committed so far.
Returns {fence, previous holder, 1 if takeover}, and with an entries page, a fourth element:
{meta, tasks, docs, runs, entry count, the newest page of entries (or those from
the held index on), nudge (nil),
intents, inbox} (hashes as field/value lists), the same reads as Store.load. The session's
open submissions are meta's 'sub:<id>' fields (see commit.lua): no lease reads the subs
hash, which keeps every submission the session had (only its type is checked here, for
the read of a live task's submission a session committed before meta held them needs,
see baton.store.loading.missing_submissions). The keys only
read here are read before the first write: one of the wrong type fails the call (WRONGTYPE)
before anything is written, so the guard need not check them. The nudge is only deleted
(DEL), which no type fails. The shard's session index is written only when this call opens
the session: its type is checked then, before any write.
UNGUARDED: tasks docs subs runs entries intents inbox nudge
The receipt is the first write (receipt_first): a receipts key of another type is refused
as CORRUPT with nothing written, without a check of its type before every lease.
SELF-GUARDED: sessions receipts
UNGUARDED: receipts_hands receipts_client
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HINCRBY', K_META, 'fence', '1'}, {'HSET', K_META, 'f', 'v'}, {'DEL', K_NUDGE}, {'HKEYS', K_INBOX}}))
if denied then return denied end
local invalid = bad_args({{'lease ttl ms', ARGV[2], 1, MAX_MS},
  {'entries page', ARGV[5] or '0', -1, MAX_INT}, {'entries held', ARGV[6] or '0', 0, MAX_INT}})
if invalid then return invalid end
local opening = nil
if not META[1] then  -- the guard refuses a meta without agent: this one does not exist
  local agent, compat, wake, tenant = requested_agent()
  if not agent or type(wake) ~= 'string' or wake == '' then
    return fail('NOT_FOUND', 'session')
  end
  opening = {agent, tonumber(compat) or 1, wake, tenant}
  local wrong = wrong_type(K_SESSIONS, 'sessions', 'zset')
  if wrong then return wrong end
end
local worker, ttl = ARGV[1], tonumber(ARGV[2])
local carrier = nil
if ARGV[4] and ARGV[4] ~= '' then carrier = cjson.decode(ARGV[4]) end  -- before any write
local holder, lease_until = META[7] or '', tonumber(META[6] or '0')  -- as the guard read them
local now = now_ms()
if holder ~= '' and holder ~= worker and lease_until > now then
  return fail('BUSY', holder .. ' ' .. (lease_until - now))
end
-- A release clears the holder, so any holder left is a pass that ended without one (its
-- process died, was paused past its lease, or lost Redis): a takeover, also when the new
-- holder has the same name (a worker restarted under its name takes its old lease at once).
local takeover = 0
if holder ~= '' then takeover = 1 end
local page = tonumber(ARGV[5] or '0') or 0
local reads = nil
if page < 0 then  -- the caller's reads would fail (WRONGTYPE) on these: fail now, unwritten
  for _, k in ipairs({K_TASKS, K_DOCS, K_SUBS, K_RUNS, K_INTENTS, K_INBOX}) do
    redis.call('HLEN', k)
  end
  redis.call('LLEN', K_ENTRIES)
elseif page > 0 then  -- before any write (see UNGUARDED above)
  local count = redis.call('LLEN', K_ENTRIES)
  local from, held = math.max(count - page, 0), tonumber(ARGV[6] or '0') or 0
  if held > from and held <= count and redis.call('HGET', K_META, 'created') == ARGV[7] then
    from = held
  end
  redis.call('HLEN', K_SUBS)  -- its type only (see above)
  reads = {redis.call('HGETALL', K_TASKS), redis.call('HGETALL', K_DOCS),
           redis.call('HGETALL', K_RUNS),
           count, redis.call('LRANGE', K_ENTRIES, from, -1),
           redis.call('HGETALL', K_INTENTS), redis.call('HGETALL', K_INBOX)}
end
local kind = 'lease'
if takeover == 1 then kind = 'takeover' end
-- the fence the HINCRBY below makes (meta's fence is an integer; 1 for a session opened here)
local corrupt = receipt_first(K_RECEIPTS, kind, ARGV[3], tonumber(META[4] or '0') + 1, 0, now,
        cjson.encode({previous_holder = holder, previous_fence = tonumber(META[4] or '0'),
                      carrier = carrier}))
if corrupt then return corrupt end
if opening then
  open_session(string.match(K_BASE, ':s:(.*)$'), opening[1], opening[2], opening[3], now,
               opening[4])
  redis.call('HDEL', K_INBOX, 'restore')  -- an orphaned restore request (see above)
end
local fence = redis.call('HINCRBY', K_META, 'fence', 1)
redis.call('HSET', K_META, 'holder', worker, 'lease_until', now + ttl, 'dirty', 0, 'listen', '')
redis.call('DEL', K_NUDGE)
if reads then
  return {fence, holder, takeover,
          {redis.call('HGETALL', K_META), reads[1], reads[2], reads[3], reads[4], reads[5],
           false, reads[6], reads[7]}}
end
return {fence, holder, takeover}
