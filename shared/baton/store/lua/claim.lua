--[==[ claim.lua: a Hands worker claims attempts of tool runs of one session (mark 'accepted').

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 worker name, 2 attempt ttl ms, 3 worker JSON, then 5 per run to claim (a worker
      that fetched several tool messages of the session at once claims them in one call):
      run id, delivery count,
      carrier JSON (optional: the relay, publish time, row id and stream sequence of the
        tool message, see baton.receipts.Carrier; saved in the receipt as 'carrier'),
      tool (optional): the tool the message names and the caller serves; a live run whose
        committed intent is for another tool is refused with 'WRONG_TOOL presented committed'
        before any write, so a message re-addressed to another tool's subject (or a race
        with one) can never claim, attempt or complete a run of a tool it does not run,
      gone holder (optional): a worker the caller knows has lost its connection (NATS
        answered "no responders" for it, see baton.hands.liveness); a running attempt held
        by exactly this worker is taken over without waiting for its heartbeat to expire
Each run is claimed on its own, as if alone: its checks come before its own writes, and a
refusal of one ({'error', 'CODE detail'} in its place) writes nothing for it and leaves the
others' claims as they are. Returns a list with one reply per run, in order, each one of:
  {'claimed', attempt, previous attempt, previous status, intent JSON, previous worker,
   cancel}
      The new attempt fence is the previous attempt + 1. previous attempt > 0 means an
      earlier attempt ended without a result: the caller follows the run's replay policy
      (safe / confirm / unsafe). cancel = 1 when the Brain has asked the run to stop: the
      caller completes it as cancelled without executing.
  {'busy', holder, remaining ms}   another attempt is alive (its heartbeat is fresh):
      a duplicate message must not take over a live attempt.
  {'done', status}                 the run already has a result (or it was applied; a run
                                   cancelled before any claim has one), or it still awaits
                                   an approval (status awaiting_approval: nothing to run)
  {'gone'}                         no such run (unknown run id or session)
  {'error', 'CORRUPT ...'}         the committed intent does not parse (or a key of the
                                   run has the wrong type): refused before any write for it
The run records (runs, runs_done) and the intents are read before a run's first write: one
of the wrong type fails the first run's read (WRONGTYPE) before anything is written, so the
guard need not check them (the same keys, read by every run).
The receipt is each run's first write (receipt_first): a receipts key of another type is
refused as CORRUPT with nothing written, without a check of its type before every claim.
UNGUARDED: runs runs_done intents
SELF-GUARDED: receipts_hands
UNGUARDED: receipts receipts_client
]==]
local denied = ACL_CHECKS and acl_refusal({{'HSET', K_RUNS, 'f', 'v'},
                                           {'XADD', K_RECEIPTS_HANDS, '*', 'f', 'v'}})
if denied then return denied end
-- Every run's numbers are checked before the first run's writes: a bad one refuses the whole
-- call with nothing written (a run's own refusals below leave the others' claims as they are).
do
  local checks = {{'attempt ttl ms', ARGV[2], 1, MAX_MS}}
  for i = 4, #ARGV, 5 do checks[#checks + 1] = {'delivery count', ARGV[i + 1] or '1', 0, MAX_INT} end
  local invalid = bad_args(checks)
  if invalid then return invalid end
end
local worker, ttl, worker_json = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local now = now_ms()  -- one clock for every run of this call (a script is one instant)

-- A refusal of one run, in its place in the reply: the other runs are claimed regardless.
local function refused(code, detail)
  return {'error', code .. ' ' .. detail}
end

-- Claim one run (its ARGV as in the header); all its checks come before its writes.
local function claim_one(rid, delivery, carrier_text, tool, gone_holder)
  local carrier = nil
  if carrier_text ~= '' then  -- before any write, and never an error of the whole call
    local ok, decoded = pcall(cjson.decode, carrier_text)
    if not ok then return refused('INVALID', 'the carrier of run ' .. rid .. ' is not JSON') end
    carrier = decoded
  end
  -- the intent, the cancel mark and the Brain's status are its own (intents hash): a run the
  -- Brain or a person ended without the Hands, or one awaiting an approval, is not claimed
  local own = redis.call('HMGET', K_INTENTS, rid, rid .. '.cancel', rid .. '.status')
  if not own[1] then
    -- a live run's intent stays in the intents hash until the commit that applies the run
    -- moves it to runs_done, in the same step: only a run without one can be an applied one
    if redis.call('HEXISTS', K_RUNS_DONE, rid .. '.intent') == 1 then
      return {'done', 'applied'}
    end
    return {'gone'}
  end
  local r = redis.call('HMGET', K_RUNS, rid .. '.intent', rid .. '.status', rid .. '.attempt',
                       rid .. '.heartbeat', rid .. '.worker', rid .. '.accepted', rid .. '.cancel')
  r[1], r[7] = own[1], own[2]
  -- the caller decodes the intent after the claim: one that cannot be is refused before any
  -- write (a claim written for an intent nobody can run would hold the run until it expires)
  local ok, intent = pcall(cjson.decode, r[1])
  if not ok or type(intent) ~= 'table' or type(intent.tool) ~= 'string' then
    return refused('CORRUPT', 'the committed intent of run ' .. rid .. ' does not parse')
  end
  if tool ~= '' and intent.tool ~= tool then
    return refused('WRONG_TOOL', tool .. ' ' .. intent.tool)
  end
  -- the attempt fence and heartbeat must be integers: a claim computes the next fence from
  -- them ("nan" would pass tonumber and fail only at the receipt, after the writes)
  if not integer(r[3]) or not integer(r[4]) then
    return refused('CORRUPT', 'the attempt or heartbeat of run ' .. rid .. ' is not an integer')
  end
  local status, attempt, hb = run_status(own[3], r[2]) or 'dispatched', tonumber(r[3] or '0'),
                             tonumber(r[4] or '0')
  if status == 'completed' or status == 'awaiting_approval' then
    return {'done', status}
  end
  local gone = gone_holder ~= '' and r[5] == gone_holder
  if status == 'running' and hb + ttl > now and r[5] ~= worker and not gone then
    return {'busy', r[5] or '', hb + ttl - now}
  end
  local new = attempt + 1
  local first = 0
  if not r[6] then first = 1 end
  local kind = 'claim'
  if attempt > 0 then kind = 'reclaim' end
  local data = cjson.encode({
    run_id = rid, attempt = new, previous_attempt = attempt, previous_status = status,
    previous_worker = r[5] or '', accepted_mark = first, delivery = tonumber(delivery) or 1})
  if carrier ~= nil then  -- as the caller sent it (decoded above only to refuse a malformed one):
    data = string.sub(data, 1, -2) .. ',"carrier":' .. carrier_text .. '}'  -- no numbers re-encoded
  end
  local corrupt = receipt_first(K_RECEIPTS_HANDS, kind, worker_json, new, 0, now, data)
  if corrupt then return {'error', corrupt.err} end
  redis.call('HSET', K_RUNS, rid .. '.attempt', new, rid .. '.status', 'running',
             rid .. '.worker', worker, rid .. '.heartbeat', now)
  if first == 1 then redis.call('HSET', K_RUNS, rid .. '.accepted', now) end
  local cancel = 0
  if r[7] then cancel = 1 end
  return {'claimed', new, attempt, status, r[1], r[5] or '', cancel}
end

local replies = {}
for i = 4, #ARGV, 5 do
  replies[#replies + 1] = claim_one(ARGV[i], ARGV[i + 1] or '1', ARGV[i + 2] or '',
                                    ARGV[i + 3] or '', ARGV[i + 4] or '')
end
return replies
