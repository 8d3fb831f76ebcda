--[==[ heartbeat.lua: the current attempt of a tool run is alive.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 run id, 2 attempt, 3 worker JSON (optional, for a 'refused' receipt)
Returns 1 while the attempt is current and the run has no result, or 'cancelled' when the
Brain has asked the run to stop (intents '<run>.cancel', set by a commit): the worker
stops the tool and completes the run with outcome 'cancelled'. Refused with
STALE_ATTEMPT <presented> <current> <status> once another attempt took over (or it ended).
The run records and the intents are read before the write: one of the wrong type fails
the call (WRONGTYPE) with nothing written, so the guard need not check them.
Only a refusal writes a receipt, as its one write (receipt_first): a receipts key of another
type is refused as CORRUPT with nothing written, without a check of its type every beat.
UNGUARDED: runs intents
SELF-GUARDED: receipts_hands
UNGUARDED: receipts receipts_client
]==]
local invalid = bad_args({{'attempt', ARGV[2], 0, MAX_INT}})
if invalid then return invalid end
local rid, attempt = ARGV[1], tonumber(ARGV[2])
local r = redis.call('HMGET', K_RUNS, rid .. '.attempt', rid .. '.status')
r[3] = redis.call('HGET', K_INTENTS, rid .. '.cancel')  -- Brain-owned: Hands cannot clear it
local cur = integer(r[1]) and tonumber(r[1] or '0') or 0  -- an unreadable attempt is no current one
if cur ~= attempt or r[2] ~= 'running' then
  if ARGV[3] then
    local corrupt = receipt_first(K_RECEIPTS_HANDS, 'refused', ARGV[3], attempt, 0, now_ms(), cjson.encode({
      run_id = rid, current = cur, status = r[2] or 'gone', op = 'heartbeat'}))
    if corrupt then return corrupt end
  end
  return fail('STALE_ATTEMPT', attempt .. ' ' .. cur .. ' ' .. (r[2] or 'gone'))
end
redis.call('HSET', K_RUNS, rid .. '.heartbeat', now_ms())
if r[3] then return 'cancelled' end
return 1
