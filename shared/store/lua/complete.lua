--[==[ complete.lua: a Hands attempt commits its tool result (mark 'completed').

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 run id, 2 attempt, 3 result JSON, 4 worker JSON, 5 group ("" for none),
      6 force wake (1/0), 7 wake JSON, 8 session id, 9 receipt JSON, 10 headers JSON
Only the current attempt of a run without a result may complete it; anything else is
refused with STALE_ATTEMPT <presented> <current> <status> after a 'refused' receipt.
In one step: result, 'completed' mark, attempt summary and, when this completion is the
last of its group (the Hands' count in runs 'grp:<group>' reaches the Brain's in intents
'grp:<group>'), or forced, a wake row in the shard's wakes stream
(id "<session>/<seq>/w.<run>.<attempt>": unique per attempt, and like every row id it
names the commit sequence it follows; on the session's own wake subject) plus the nudge (the
dirty mark the holder's release reads). It writes only the run records, the receipts, the
nudge and the wakes stream: never meta nor the outbox, so the Hands' ACL user needs no
write access to either. The receipt's seq is the session's current commit sequence. It
also drops the records of runs the Brain applied since (intents 'gc', see gc_names).
Returns {1 if a wake was written, 0 otherwise}.
The run records are read before the first write, and the applied ones (runs_done) only by a
refusal, before its receipt: one of the wrong type fails the call (WRONGTYPE) with nothing
written, so the guard need not check them; nor the intents, read (the group's count, the
'gc' list) only before the first write. SET replaces a nudge of any type.
The receipt (a refusal's too) is the first write (receipt_first): a receipts key of another
type is refused as CORRUPT with nothing written, without a check of its type every time.
The wakes stream is written only by a completion that wakes the Brain (most results of a
group do not): whether this one does is known before the first write (the group's count
read above, plus one), and only then is the stream's type checked, before the receipt.
UNGUARDED: runs runs_done intents nudge
SELF-GUARDED: receipts wakes
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_RUNS, 'f', 'v'},
  {'HINCRBY', K_RUNS, 'f', '1'}, {'HDEL', K_RUNS, 'f'}, {'XADD', K_RECEIPTS, '*', 'f', 'v'},
  {'XADD', K_WAKES, '*', 'f', 'v'}, {'SET', K_NUDGE, '1'}})
if denied then return denied end
local rid, attempt = ARGV[1], tonumber(ARGV[2])
local group = ARGV[5]
-- with the group's count of results so far (the Hands'), in the same read
local r = redis.call('HMGET', K_RUNS, rid .. '.attempt', rid .. '.status', rid .. '.attempts',
                     'grp:' .. group)
local cur = integer(r[1]) and tonumber(r[1] or '0') or 0  -- an unreadable attempt is no current one
local now = now_ms()
if not r[2] or cur ~= attempt or r[2] ~= 'running' then
  local status = r[2]
  if not status then  -- already applied by the Brain: report its real last attempt
    local d = redis.call('HGET', K_RUNS_DONE, rid .. '.attempt')
    if d then cur, status = tonumber(d), 'applied' end
  end
  status = status or 'gone'
  local corrupt = receipt_first('refused', ARGV[4], attempt, 0, now, cjson.encode({
    run_id = rid, current = cur, status = status, op = 'complete'}))
  if corrupt then return corrupt end
  return fail('STALE_ATTEMPT', attempt .. ' ' .. cur .. ' ' .. status)
end
-- the Brain's fields in one read: the 'gc' list and how many results the group awaits
local own = redis.call('HMGET', K_INTENTS, 'gc', 'grp:' .. group)
local total = nil  -- how many results the group awaits (the Brain's count)
if group ~= '' then
  if not integer(r[4]) then
    return fail('CORRUPT', 'runs grp:' .. group .. ' is not an integer')
  end
  total = own[2]
  if not integer(total) then
    return fail('CORRUPT', 'intents grp:' .. group .. ' is not an integer')
  end
end
local wake, seq = META[2], tonumber(META[5] or '0')  -- as the guard read them
local summary = '{"attempt":' .. attempt .. ',"ended":' .. now .. '}'
local attempts = r[3]
if attempts then attempts = string.sub(attempts, 1, -2) .. ',' .. summary .. ']'
else attempts = '[' .. summary .. ']' end
local gc = gc_names(own[1])  -- read before the first write (see UNGUARDED above)
-- whether this completion wakes the Brain: the last result its group awaits (the count
-- HINCRBY returns below is the one read above plus one: nothing else writes it here),
-- a run without a group, or forced
local woke = 0
if group == '' or ARGV[6] == '1' or tonumber(r[4] or '0') + 1 >= tonumber(total or '0') then
  woke = 1
  local wrong = wrong_type(K_WAKES, 'wakes', 'stream')  -- before the first write
  if wrong then return wrong end
end
local corrupt = receipt_first('complete', ARGV[4], attempt, seq, now, ARGV[9])
if corrupt then return corrupt end
redis.call('HSET', K_RUNS, rid .. '.result', ARGV[3], rid .. '.status', 'completed',
           rid .. '.completed', now, rid .. '.attempts', attempts)
if group ~= '' then
  redis.call('HINCRBY', K_RUNS, 'grp:' .. group, 1)
end
if woke == 1 then
  redis.call('XADD', K_WAKES, '*', 'id', ARGV[8] .. '/' .. seq .. '/w.' .. rid .. '.' .. attempt,
             'subj', wake, 'data', ARGV[7], 'hdr', ARGV[10] or '', 'sid', ARGV[8], 'ts', now)
  redis.call('SET', K_NUDGE, 1)
end
-- drop the records of runs the Brain applied since (it may not write this hash)
for _, n in ipairs(gc) do
  if string.sub(n, 1, 4) == 'grp:' then
    redis.call('HDEL', K_RUNS, n)
  elseif redis.call('HEXISTS', K_RUNS, n .. '.status') == 1 then
    local names = {}
    for i, f in ipairs(RUN_FIELDS) do names[i] = n .. '.' .. f end
    redis.call('HDEL', K_RUNS, unpack(names))
  end
end
return {woke}
