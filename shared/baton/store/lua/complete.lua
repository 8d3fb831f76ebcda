--[==[ complete.lua: Hands attempts commit their tool results (mark 'completed').

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 worker JSON, 2 session id, then 8 per run to complete (a worker whose results of
      the session came back together completes them in one call):
      run id, attempt, result JSON, group ("" for none), force wake (1/0), wake JSON,
      receipt JSON, headers JSON
Each run is completed on its own, as if alone and in order: its checks come before its own
writes, and a refusal ({'error', 'CODE detail'} in its place) leaves the others' completions
as they are. Only the current attempt of a run without a result may complete it; anything
else is refused with STALE_ATTEMPT <presented> <current> <status> after a 'refused' receipt.
In one step per run: result, 'completed' mark, attempt summary and, when this completion is
the last of its group (the Hands' count in runs 'grp:<group>' reaches the Brain's in intents
'grp:<group>'), or forced, a wake row in the shard's wakes stream
(id "<session>/<seq>/w.<run>.<attempt>": unique per attempt, and like every row id it
names the commit sequence it follows; on the session's own wake subject) plus the nudge (the
dirty mark the holder's release reads). When the lease holder kept its lease after
dispatching and listens (listening_holder), that completion SPUBLISHes "<session id>
<headers JSON>" (the trace context the wake row would carry) on the holder's hold channel
instead of writing the wake row: the holder, still under its
fence, releases (reading the nudge) and rechecks, with no relay hop. If the holder dies
meanwhile, the wake it still holds unacknowledged in JetStream is redelivered to another
Brain, which takes over once the lease expires and finds the nudge; if the signal is lost,
the holder's release at the end of its hold finds it. Of the runs of one group completed in one call,
the last therefore writes the wake, once. It writes only the run records, its receipts, the
nudge and the wakes stream: never meta nor the outbox, so the Hands' ACL user needs no
write access to either. The receipt's seq is the session's current commit sequence. It
also drops the records of runs the Brain applied since (intents 'gc', see gc_names).
Returns a list with one reply per run, in order: {1 if it wrote a wake, 2 if it told the
listening holder instead, 0 otherwise}, or
{'error', 'CODE detail'}.
The run records are read before a run's first write, and the applied ones (runs_done) only
by a refusal, before its receipt: one of the wrong type fails the first run's read
(WRONGTYPE) with nothing written, so the guard need not check them; nor the intents, read
(the group's count, the 'gc' list) only before a run's first write. SET replaces a nudge of
any type.
The receipt (a refusal's too) is a run's first write (receipt_first): a receipts key of
another type is refused as CORRUPT with nothing written for it, without a check of its type
every time. The wakes stream is written only by a completion that wakes the Brain (most
results of a group do not): whether this one does is known before its first write (the
group's count read above, plus one), and only then is the stream's type checked, before the
receipt.
UNGUARDED: runs runs_done intents nudge
SELF-GUARDED: receipts_hands wakes
UNGUARDED: receipts receipts_client
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_RUNS, 'f', 'v'},
  {'HINCRBY', K_RUNS, 'f', '1'}, {'HDEL', K_RUNS, 'f'}, {'XADD', K_RECEIPTS_HANDS, '*', 'f', 'v'},
  {'XADD', K_WAKES, '*', 'f', 'v'}, {'SET', K_NUDGE, '1'}})
if denied then return denied end
do  -- every run's attempt is checked before the first run's writes (see _args.lua)
  local checks = {}
  for i = 3, #ARGV, 8 do checks[#checks + 1] = {'attempt', ARGV[i + 1], 0, MAX_INT} end
  local invalid = bad_args(checks)
  if invalid then return invalid end
end
local worker_json, sid = ARGV[1], ARGV[2]
local wake, seq = META[2], tonumber(META[5] or '0')  -- as the guard read them
local now = now_ms()  -- one clock for every run of this call (a script is one instant)

-- A refusal of one run, in its place in the reply: the other runs complete regardless.
local function refused(code, detail)
  return {'error', code .. ' ' .. detail}
end

-- Complete one run (its ARGV as in the header); all its checks come before its writes.
local function complete_one(rid, attempt, result, group, force, wake_json, receipt, headers)
  attempt = tonumber(attempt)
  -- with the group's count of results so far (the Hands'), in the same read
  local r = redis.call('HMGET', K_RUNS, rid .. '.attempt', rid .. '.status', rid .. '.attempts',
                       'grp:' .. group)
  local cur = integer(r[1]) and tonumber(r[1] or '0') or 0  -- an unreadable attempt is no current one
  if not attempt or not r[2] or cur ~= attempt or r[2] ~= 'running' then
    local status = r[2]
    if not status then  -- already applied by the Brain: report its real last attempt
      local d = redis.call('HGET', K_RUNS_DONE, rid .. '.attempt')
      if d then cur, status = tonumber(d), 'applied' end
    end
    status = status or 'gone'
    local corrupt = receipt_first(K_RECEIPTS_HANDS, 'refused', worker_json, attempt or 0, 0, now, cjson.encode({
      run_id = rid, current = cur, status = status, op = 'complete'}))
    if corrupt then return {'error', corrupt.err} end
    return refused('STALE_ATTEMPT', (attempt or 0) .. ' ' .. cur .. ' ' .. status)
  end
  -- the Brain's fields in one read: the 'gc' list and how many results the group awaits
  local own = redis.call('HMGET', K_INTENTS, 'gc', 'grp:' .. group)
  local total = nil  -- how many results the group awaits (the Brain's count)
  if group ~= '' then
    if not integer(r[4]) then
      return refused('CORRUPT', 'runs grp:' .. group .. ' is not an integer')
    end
    total = own[2]
    if not integer(total) then
      return refused('CORRUPT', 'intents grp:' .. group .. ' is not an integer')
    end
  end
  local summary = '{"attempt":' .. attempt .. ',"ended":' .. now .. '}'
  local attempts = r[3]
  if attempts then attempts = string.sub(attempts, 1, -2) .. ',' .. summary .. ']'
  else attempts = '[' .. summary .. ']' end
  local gc = gc_names(own[1])  -- read before the first write (see UNGUARDED above)
  -- whether this completion wakes the Brain: the last result its group awaits (the count
  -- HINCRBY returns below is the one read above plus one: nothing else writes it here),
  -- a run without a group, or forced
  local woke, held = 0, nil
  if group == '' or force == '1' or tonumber(r[4] or '0') + 1 >= tonumber(total or '0') then
    woke = 1
    held = listening_holder(now)
    if held and ACL_CHECKS and redis.acl_check_cmd
        and not redis.acl_check_cmd('SPUBLISH', held, sid) then
      held = nil  -- a Hands whose ACL predates hold channels wakes through the relay
    end
    if not held then
      local wrong = wrong_type(K_WAKES, 'wakes', 'stream')  -- before the first write
      if wrong then return {'error', wrong.err} end
    end
  end
  local corrupt = receipt_first(K_RECEIPTS_HANDS, 'complete', worker_json, attempt, seq, now, receipt)
  if corrupt then return {'error', corrupt.err} end
  redis.call('HSET', K_RUNS, rid .. '.result', result, rid .. '.status', 'completed',
             rid .. '.completed', now, rid .. '.attempts', attempts)
  if group ~= '' then
    redis.call('HINCRBY', K_RUNS, 'grp:' .. group, 1)
  end
  if held then  -- the holder listens: the nudge it reads on release, and a signal to it now
    redis.call('SET', K_NUDGE, 1)
    redis.call('SPUBLISH', held, sid .. ' ' .. (headers or ''))
    woke = 2
  elseif woke == 1 then
    redis.call('XADD', K_WAKES, '*', 'id', sid .. '/' .. seq .. '/w.' .. rid .. '.' .. attempt,
               'subj', wake, 'data', wake_json, 'hdr', headers or '', 'sid', sid, 'ts', now)
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
end

local replies = {}
for i = 3, #ARGV, 8 do
  replies[#replies + 1] = complete_one(ARGV[i], ARGV[i + 1], ARGV[i + 2] or '',
                                       ARGV[i + 3] or '', ARGV[i + 4] or '0',
                                       ARGV[i + 5] or '', ARGV[i + 6] or '', ARGV[i + 7] or '')
end
return replies
