--[==[ slot_wait.lua: a Hands records that a tool run waits for a slot of its capped tool,
and when the wait ends.

A run of a tool capped for the whole fleet (baton.store.limits, tool_limit.lua) that is
refused a slot waits in line before it is claimed. So that the session's readers (`baton
watch`, the API's event feed and the console, `baton trace`) show the wait, the Hands appends
one receipt when the wait begins (state 'waiting', with the run's place in line) and one
when it ends (state 'granted', or 'left' when the Hands stopped while the run waited and
handed its message back), with how long it waited. A run of an uncapped tool, or one granted
a slot at once, writes none; nor does a run that keeps asking for its slot (one receipt per
wait, not per ask).

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 run id, 2 tool, 3 worker JSON,
      4 state: waiting | granted | left,
      5 place in line (1-based; 0: first in line, waiting for the tool's rate only),
      6 ms waited (0 when the wait begins)
Returns 1 once the receipt is written; 0, with nothing written, when the run is no live run
of the session (gone, applied, completed, or awaiting an approval): a duplicate message of a
run that ended meanwhile says nothing about it. The tool is the one the Hands serves (its
message's subject names it, and the claim that follows checks it against the run's intent);
it is not looked for in the intent here, which would decode the tool's arguments at each wait.
The intents and run records are read before the one write: one of the wrong type fails the
call (WRONGTYPE) with nothing written, so the guard need not check them. The receipt is the
only write (receipt_first): a receipts key of another type is refused as CORRUPT with nothing
written.
UNGUARDED: runs intents
SELF-GUARDED: receipts_hands
UNGUARDED: receipts receipts_client
]==]
local invalid = bad_args({{'place in line', ARGV[5], 0, MAX_INT},
                          {'ms waited', ARGV[6], 0, MAX_MS}})
if invalid then return invalid end
local rid, tool, worker_json, state = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if state ~= 'waiting' and state ~= 'granted' and state ~= 'left' then
  return fail('INVALID', 'state must be waiting, granted or left, not ' .. string.sub(tostring(state), 1, 40))
end
if rid == nil or rid == '' or #rid > 256 or tool == nil or tool == '' or #tool > 256 then
  return fail('INVALID', 'run id and tool must be 1 to 256 bytes')
end
if worker_json == nil or #worker_json > 2048 then
  return fail('INVALID', 'worker JSON must be at most 2048 bytes')
end
-- A live run: its intent is in the intents hash (until the commit that applies it), and
-- neither the Brain nor the Hands ended it, nor does it await an approval.
local own = redis.call('HMGET', K_INTENTS, rid, rid .. '.status')
if not own[1] then return 0 end
local status = run_status(own[2], redis.call('HGET', K_RUNS, rid .. '.status'))
if status == 'completed' or status == 'awaiting_approval' then return 0 end
local now = now_ms()
local corrupt = receipt_first(K_RECEIPTS_HANDS, 'slot_wait', worker_json, 0, 0, now, cjson.encode({
  run_id = rid, tool = tool, state = state, position = tonumber(ARGV[5]),
  waited_ms = tonumber(ARGV[6])}))
if corrupt then return corrupt end
return 1
