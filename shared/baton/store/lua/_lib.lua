--[==[ _lib.lua: helpers prepended to every Baton session script (Redis has no includes).

A session script declares ONE key, KEYS[1]: a key of the session that its caller may write
(the run records for the Hands' scripts, the session hash for the others; see
baton.store.keys.SessionKeys.declared). EVAL requires read and write access to every
declared key, so declaring only that key lets each role's ACL grant exactly the keys it
writes; every other key is derived below from KEYS[1] (same hash tag, so the same Cluster
slot) and checked by Redis against the caller's ACL at each call. Callers that pass the 14
keys of SessionKeys.all() (meta first) get the same names. The session's keys:
  meta      HASH   agent compat wake fence holder lease_until seq dirty created listen
                   handed cancel:<task id|*> (cancel intents) blocked:<task id> (reasons)
                   (listen: the name of a holder that kept its lease after dispatching
                   and listens on its hold channel, see listening_holder; '' otherwise;
                   handed: the fence of the last holder that handed the session over
                   mid-pass, see release.lua)
  entries   LIST   entry JSON
  tasks     HASH   live task id -> JSON
  done      HASH   terminal task id -> JSON
  docs      HASH   "<name>" head, "<name>@b" baseline, "<name>@<v>" deltas
  subs      HASH   submission id -> JSON
  reqs      HASH   request id -> submission id
  intents   HASH   run id -> the committed intent of a live run; "<run>.<f>" for the run's
                   BRAIN_RUN_FIELDS below: status dispatched|awaiting_approval|completed (a
                   run the Brain or a person ended without the Hands, with its result and
                   completed ms), cancel (ms the Brain asked it to stop), digest (what an
                   approval must present), approved (ms); "grp:<g>": how many results group
                   g awaits (set by the commit, counted down by runs ended without the
                   Hands); "gc" (see gc_names). Only Brains and decisions write it: the Hands
                   write the runs hash, so they cannot change what the Brain decided
  runs      HASH   the Hands' records: "<run>.<field>" (status running|completed, attempt,
                   accepted, heartbeat, worker, result, completed, attempts), "grp:<g>":
                   results of group g so far; Brains only read it (records of applied
                   runs are dropped by the Hands, see gc_names)
  runs_done HASH   same, for runs whose result was applied
  receipts  STREAM the Brains' receipts (commit log): about the newest RECEIPTS_KEPT (see
                   receipt()). Each role appends to its own stream, where only its ACL may
                   write: receipts_hands (claims, results, the Hands' refusals) and
                   receipts_client (requests); readers merge the three by id (see receipt_id)
                   and attribute each receipt to its stream's role. A session written before
                   has every role's receipts in this one
  applied   HASH   commit id -> recorded reply (see _applied.lua); the Hands' scripts
                   keep theirs in runs_applied, the clients' in inbox_applied (APPLIED_KEY, set by
                   scripts.py)
  inbox     HASH   a client's requests not consumed yet: "cancel:<task id|*>" -> ms,
                   "decide:<run>" -> {decision, ms, result}, "submit:<request id>" and
                   "start:<request id>" -> {agent, compat, wake, ...} (the key a client's
                   scripts declare; the Brain's commit deletes what it took up; a new
                   session has only its inbox and receipts until a Brain opens it)
  nudge     STRING "1": a tool result, a timer or a client's request arrived (the dirty mark written by those who
                   may not write meta; acquire and release read and clear it with meta's)
and of the session's shard: outbox STREAM, timers ZSET, sessions ZSET (the shard's session
index, id -> created ms, for inspect), wakes STREAM (the Hands' wake rows, same fields as
the outbox's).
ARGV[1] is the commit id, consumed by the wrapper in _applied.lua: each script's own ARGV,
as its header lists them, starts after it.
Sharded pub/sub channels written with SPUBLISH (commit's notifications, a completion's signal
to a listening holder) carry the same hash tag, so on a Redis Cluster they too belong to
the script's slot.

Rule of every script: all checks come before the first write. Redis does not roll back a
script that fails midway, so validation first is what makes a transition all-or-nothing.
Errors are returned as "CODE detail..." replies (see shared/baton/errors.py from_redis_error).
Before any script body runs, corrupt_refusal() (called by _applied.lua) checks what the
script relies on: each key it touches has its type (or does not exist) and, when it touches
meta, a session whose meta is gone has no (Brains') receipts either (unless requests wait
in its inbox),
and the meta's agent/wake are set and its counters are integers. shared/scripts.py writes
corrupt_refusal for each script (below this file): meta_refusal() when meta is among the
keys the script touches, then one wrong_type() per other key it touches (found in the
script's text and in the helpers below it calls, see scripts.guarded_keys; KEY_TYPES there
gives each key's type): a key a script never touches cannot fail it midway, so it is not
checked there. Nor are the keys its header lists as UNGUARDED (read before its first write,
where a WRONGTYPE fails it with nothing written, or touched only by commands that work on
any type: EXISTS, DEL, SET) or SELF-GUARDED (checked by the script itself with wrong_type()
before its first write, when a call touches them).
A session failing it is refused with "CORRUPT <what>" and nothing is written: the Brain
quarantines such a session (baton.store.quarantine).
scripts.py also sends each script only the definitions below that it uses (its own text,
_applied.lua's and the definitions it keeps name them): every one is made anew at each call,
so one per line and each `local` at the start of a line, documented by the comment above it.
]==]
-- "<ns>:{<ns>-<shard>}:s:<session>" and "<ns>:{<ns>-<shard>}:" (session ids hold no '}').
local K_BASE, K_SHARD = string.match(KEYS[1], '^((.-}:)s:.*):[a-z_]+$')
if not K_BASE then return redis.error_reply('CORRUPT not a session key: ' .. KEYS[1]) end
local K_META = K_BASE .. ':meta'
local K_ENTRIES = K_BASE .. ':entries'
local K_TASKS = K_BASE .. ':tasks'
local K_DONE = K_BASE .. ':done'
local K_DOCS = K_BASE .. ':docs'
local K_SUBS = K_BASE .. ':subs'
local K_REQS = K_BASE .. ':reqs'
local K_RUNS = K_BASE .. ':runs'
local K_RUNS_DONE = K_BASE .. ':runs_done'
-- The session's receipts, one stream per role that writes them (only that role's ACL may
-- append to it): the Brains', the Hands' and the clients'.
local K_RECEIPTS = K_BASE .. ':receipts'
local K_RECEIPTS_HANDS = K_BASE .. ':receipts_hands'
local K_RECEIPTS_CLIENT = K_BASE .. ':receipts_client'
local K_APPLIED = K_BASE .. ':' .. APPLIED_KEY
local K_OUTBOX = K_SHARD .. 'outbox'
local K_TIMERS = K_SHARD .. 'timers'
local K_SESSIONS = K_SHARD .. 'sessions'
local K_NUDGE = K_BASE .. ':nudge'
local K_WAKES = K_SHARD .. 'wakes'
local K_INTENTS = K_BASE .. ':intents'
local K_INBOX = K_BASE .. ':inbox'
-- The tombstone of an archived session (archive.lua): its keys are gone but this one.
local K_ARCHIVED = K_BASE .. ':archived'
-- The session's quarantine record (poison.lua), and the other roles' commit-id records
-- (archive.lua deletes them with the session).
local K_POISON = K_BASE .. ':poison'
local K_RUNS_APPLIED = K_BASE .. ':runs_applied'
local K_INBOX_APPLIED = K_BASE .. ':inbox_applied'
-- The shard's index of archived sessions, and a relay's mark that JetStream is full.
local K_ARCHIVED_IX = K_SHARD .. 'archived'
local K_FULL = K_SHARD .. 'full'
-- Fair admission of new sessions (baton.store.admission): the shard's state HASH (window,
-- pending, V, vt:<tenant>, n, n:<tenant>), each queued or starting session's row and tenant
-- (adm_info HASH), the starting ones (adm_fly ZSET, id -> ms its first wake was written)
-- and the queue (adm_q ZSET, id -> admission_score).
local K_ADM = K_SHARD .. 'adm'
local K_ADM_INFO = K_SHARD .. 'adm_info'
local K_ADM_FLY = K_SHARD .. 'adm_fly'
local K_ADM_Q = K_SHARD .. 'adm_q'

local RUN_FIELDS = {'intent', 'status', 'attempt', 'accepted', 'completed', 'applied',
                    'heartbeat', 'worker', 'result', 'attempts', 'cancel', 'digest', 'approved'}
-- Fields of a live run the Brain (or a person's decision) keeps beside the intent, as
-- '<run>.<field>' in the intents hash, where the Hands cannot write.
local BRAIN_RUN_FIELDS = {'status', 'cancel', 'digest', 'approved', 'result', 'completed'}

-- Meta's fields as meta_refusal read them before the script's body ran (false: not set):
-- 1 agent, 2 wake, 3 compat, 4 fence, 5 seq, 6 lease_until, 7 holder, 8 dirty, 9 listen. A script
-- reads them here, not again, until its own writes change them.
local META = {}

-- A live run's status from the Brain's ('dispatched', 'awaiting_approval', or 'completed'
-- when it or a person ended the run without the Hands) and the Hands' ('running',
-- 'completed'): an approval still awaited or an ending decided without the Hands wins.
local function run_status(brain, hands)
  if brain == 'completed' or brain == 'awaiting_approval' or not hands then return brain end
  return hands
end

-- Space-separated names in the intents field 'gc': records of applied runs ('<run>') and
-- finished group counters ('grp:<group>') the Hands may drop from the runs hash (the Brain
-- may not write it). Returns the names as a list; raw: the field as the caller read it
-- (false: not set), else it is read here.
local function gc_names(raw)
  if raw == nil then raw = redis.call('HGET', K_INTENTS, 'gc') end
  local names = {}
  for n in string.gmatch(raw or '', '%S+') do
    names[#names + 1] = n
  end
  return names
end

-- The hold channel of the Brain that kept the session's lease after its pass dispatched
-- tool runs and listens for their results (meta 'listen', set by its last commit with 'hd'
-- and cleared by its release or the next acquire), while its lease is live at now; else nil.
-- A completion that would wake the session SPUBLISHes its id there instead of writing a
-- wake row for the relay (complete.lua). "<ns>:{<ns>-<shard>}:held:<brain>": one channel
-- per Brain and shard, under the shard's hash tag (Keys.hold_channel).
local function listening_holder(now)
  local name = META[9]
  if not name or name == '' or tonumber(META[6] or '0') <= now then return nil end
  return K_SHARD .. 'held:' .. name
end

-- A client's request (submit, start, cancel, approval) to a session whose lease a Brain
-- holds for tool results: besides its wake row, which a Brain other than the holder could
-- act on only once the lease is free, tell the holder (listening_holder), whose hold then
-- ends at once and whose release finds the nudge. Skipped where the caller's ACL lacks the
-- channel (the wake row still comes). headers: the request's trace headers JSON, or ''.
local function tell_holder(sid, now, headers)
  local held = listening_holder(now)
  if held and (not ACL_CHECKS or not redis.acl_check_cmd
               or redis.acl_check_cmd('SPUBLISH', held, sid)) then
    redis.call('SPUBLISH', held, sid .. ' ' .. (headers or ''))
  end
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fail(code, detail)
  return redis.error_reply(code .. ' ' .. tostring(detail))
end

-- Receipt ids up to this ms are written by receipt_id (higher ones, only a forged receipt's,
-- are past what Lua's numbers hold exactly).
local RECEIPT_ID_MAX_MS = 99999999999999

-- The id of the receipt this call wrote last ({ms, seq}; empty before its first), which
-- receipt_id follows.
local LAST_RECEIPT = {}

-- The id of the session's next receipt: past the newest receipt of each role's stream and
-- at least now's ms, so that the ids of the three streams are unique and in the order the
-- receipts were written (a reader merges them by id, and resumes after one id in all
-- three). Each stream alone would number its entries from the clock, and two streams
-- written in the same ms would share ids. A stream that cannot be read as one (another
-- type, refused by the caller's ACL) is skipped: read with pcall, it fails nothing. '*'
-- when an id there is past RECEIPT_ID_MAX_MS: Redis numbers the receipt itself then.
-- A call's later receipts follow its first (LAST_RECEIPT) without reading the streams again:
-- nothing else writes while a script runs, and reading them costs about 20 us a receipt.
local function receipt_id(now)
  if LAST_RECEIPT.ms then
    if LAST_RECEIPT.ms >= now then
      return string.format('%d-%d', LAST_RECEIPT.ms, LAST_RECEIPT.seq + 1)
    end
    return string.format('%d-%d', now, 0)
  end
  local ms, seq = now, 0
  for _, k in ipairs({K_RECEIPTS, K_RECEIPTS_HANDS, K_RECEIPTS_CLIENT}) do
    local newest = redis.pcall('XREVRANGE', k, '+', '-', 'COUNT', 1)
    local id = type(newest) == 'table' and not newest.err and newest[1] and newest[1][1]
    local m, s = string.match(id or '', '^(%d+)-(%d+)$')
    m, s = tonumber(m), tonumber(s)
    if m and (m > RECEIPT_ID_MAX_MS or s >= RECEIPT_ID_MAX_MS) then return '*' end
    if m and (m > ms or (m == ms and s >= seq)) then ms, seq = m, s + 1 end
  end
  return string.format('%d-%d', ms, seq)
end

-- XADD a receipt to stream k (the caller's role's: K_RECEIPTS, K_RECEIPTS_HANDS or
-- K_RECEIPTS_CLIENT) under receipt_id's id, as pcall does: the reply, or an error table.
-- The stream keeps about the newest RECEIPTS_KEPT (set by shared/scripts.py from
-- Settings.receipts_kept): 'MAXLEN ~' trims whole stream nodes, so a receipt costs the same
-- at any age of the session, and what an archive object keeps of a session's receipts is
-- what Redis still had of them then. An id the stream refuses (its own newest entry was
-- deleted: its last id is past what it holds) is retried as '*'.
local function add_receipt(k, kind, worker, fence, seq, now, data)
  local id = receipt_id(now)
  local function add(at)
    return redis.pcall('XADD', k, 'MAXLEN', '~', RECEIPTS_KEPT, at, 'seq', seq, 'kind', kind,
                       'worker', worker, 'fence', fence, 'ts', now, 'data', data)
  end
  local r = add(id)
  if type(r) == 'table' and r.err and id ~= '*' and not string.find(r.err, 'WRONGTYPE', 1, true) then
    r = add('*')
  end
  local m, s = string.match(type(r) == 'string' and r or '', '^(%d+)-(%d+)$')
  LAST_RECEIPT.ms, LAST_RECEIPT.seq = tonumber(m), tonumber(s)
  return r
end

-- Append a receipt to the role's stream k (see add_receipt); 'seq' is the commit sequence
-- it belongs to (0 for refusals).
local function receipt(k, kind, worker, fence, seq, now, data)
  local r = add_receipt(k, kind, worker, fence, seq, now, data)
  if type(r) == 'table' and r.err then error(r) end
end

-- Add one outbox row; its id ("<session>/<seq>/<n>") becomes the Nats-Msg-Id.
local function outbox(sid, seq, n, subject, data, headers, now)
  local id = sid .. '/' .. seq .. '/' .. n
  redis.call('XADD', K_OUTBOX, '*', 'id', id, 'subj', subject, 'data', data,
             'hdr', headers or '', 'sid', sid, 'ts', now)
  return id
end

local function deadline_member(sid, wake)
  return 'deadline|' .. sid .. '|-|' .. wake
end

-- Arm (ms > 0) or clear (ms < 0) the session's progress deadline.
local function set_deadline(sid, wake, ms, now)
  if ms > 0 then
    redis.call('ZADD', K_TIMERS, now + ms, deadline_member(sid, wake))
  elseif ms < 0 then
    redis.call('ZREM', K_TIMERS, deadline_member(sid, wake))
  end
end

-- The number of chunks of the session's streamed partial text (partial.lua) as meta's fields
-- n ('partial_n') and of ('partial_of') say, at most meta's field count: 0 without one, 1 for
-- one saved in a single field ('partial', as sessions written before chunks keep it).
local function partial_chunks(n, of)
  if not of then return 0 end
  if not n or not string.match(n, '^%d+$') then return 1 end
  return math.min(tonumber(n), redis.call('HLEN', K_META))
end

-- Delete the session's streamed partial text: meta 'partial' (its first chunk), the later
-- chunks 'partial.<k>', and 'partial_of', 'partial_n', 'partial_len' (see partial.lua).
local function clear_partial()
  local m = redis.call('HMGET', K_META, 'partial_n', 'partial_of')
  local names = {'partial', 'partial_of', 'partial_n', 'partial_len'}
  for k = 1, partial_chunks(m[1], m[2]) - 1 do
    names[#names + 1] = 'partial.' .. k
    if #names >= 1000 then  -- a command's arguments are a Lua stack's
      redis.call('HDEL', K_META, unpack(names))
      names = {}
    end
  end
  if #names > 0 then redis.call('HDEL', K_META, unpack(names)) end
end

-- ACL_CHECKS (defined above this file by shared/scripts.py) is true for clients that log in
-- as a named ACL user; for the unrestricted default user the checks are skipped (they cost
-- tens of microseconds of server time per script).
-- Redis checks a script's ACL at each call: a caller lacking a command the script runs later
-- would stop it midway, with the earlier writes applied. So scripts that write more than once
-- check first, before any write, that the caller may run each command on its key, and refuse
-- with "NOPERM <command> <key>" otherwise. Each check is {command, key, args...}.
local function acl_refusal(checks)
  if not redis.acl_check_cmd then return nil end  -- Redis < 7: no per-call ACL checks
  for _, c in ipairs(checks) do
    if not redis.acl_check_cmd(unpack(c)) then
      return fail('NOPERM', c[1] .. ' ' .. c[2])
    end
  end
  return nil
end

-- The commands that writing a (Brain's) receipt, an outbox row and a deadline need.
local function log_checks(checks)
  checks[#checks + 1] = {'XADD', K_RECEIPTS, '*', 'f', 'v'}
  checks[#checks + 1] = {'XADD', K_OUTBOX, '*', 'f', 'v'}
  checks[#checks + 1] = {'ZADD', K_TIMERS, '0', 'm'}
  checks[#checks + 1] = {'ZREM', K_TIMERS, 'm'}
  checks[#checks + 1] = {'ZADD', K_SESSIONS, 'NX', '0', 'm'}
  return checks
end

-- The session's agent, when it already belongs to another one: a CONFLICT reply, else nil.
local function agent_conflict(sid, agent)
  local cur = redis.call('HGET', K_META, 'agent')
  if cur and cur ~= agent then
    return fail('CONFLICT', 'session ' .. sid .. ' belongs to agent ' .. cur)
  end
  return nil
end

-- Create the session meta on first use; returns the session's wake subject (a session
-- that exists keeps its own, which a migration may have moved to another level).
local function open_session(sid, agent, compat, wake, now, tenant)
  if redis.call('HEXISTS', K_META, 'agent') == 0 then
    redis.call('HSET', K_META, 'agent', agent, 'compat', compat, 'wake', wake, 'fence', 0,
               'seq', 0, 'holder', '', 'lease_until', 0, 'created', now)
    if type(tenant) == 'string' and string.match(tenant, '^[A-Za-z0-9_.-]+$') then
      redis.call('HSET', K_META, 'tenant', tenant)  -- whose work it is (submit.lua)
    end
    -- the shard's session index, in the same step: never a session inspect cannot list
    redis.call('ZADD', K_SESSIONS, 'NX', now, sid)
    return wake
  end
  return redis.call('HGET', K_META, 'wake')
end

-- The agent a session's requests are for: its meta's, or for a session without meta yet the
-- first pending submit/start request's (fields in order) with its compat and wake subject.
-- Called before the script's first write: meta's agent is the one the guard read (META).
local function requested_agent()
  local cur = META[1]
  if cur then return cur end
  local fields = redis.call('HKEYS', K_INBOX)
  table.sort(fields)
  for _, f in ipairs(fields) do
    if string.sub(f, 1, 7) == 'submit:' or string.sub(f, 1, 6) == 'start:' then
      local ok, r = pcall(cjson.decode, redis.call('HGET', K_INBOX, f))
      if ok and type(r) == 'table' and type(r.agent) == 'string' then
        return r.agent, r.compat, r.wake, r.tenant
      end
    end
  end
  return nil
end

-- A CONFLICT reply when the session belongs (or its pending requests are for) another
-- agent, or, for a session not yet opened, when its pending requests are at another compat
-- level: the request that opens it sets its level, so all of them must agree (whichever
-- opened it, a request at another level would be carried out at the wrong one), else nil.
local function inbox_agent_conflict(sid, agent, compat)
  local cur, level = requested_agent()
  if cur and cur ~= agent then
    return fail('CONFLICT', 'session ' .. sid .. ' belongs to agent ' .. cur)
  end
  if cur and not META[1] and tonumber(level) ~= tonumber(compat) then
    return fail('CONFLICT', 'session ' .. sid .. ' is requested at compat level ' ..
                tostring(level) .. ' by a request not yet taken up, not at ' .. compat)
  end
  return nil
end

local function integer(v)
  return v == nil or v == false or string.match(v, '^-?%d+$') ~= nil
end

-- A CORRUPT reply when key k (the session's key called name) exists with another type than
-- want, else nil (no writes).
local function wrong_type(k, name, want)
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'none' and t ~= want then
    return fail('CORRUPT', name .. ' key is a ' .. t .. ', not a ' .. want)
  end
  return nil
end

-- An ARCHIVED reply when the session was archived (archive.lua wrote its tombstone and
-- removed its keys), else nil (no writes). Every session script checks it first: a late
-- wake, tool result, heartbeat, request or stale worker is refused with nothing written,
-- never recreating half a session, until a Brain restores it (restore.lua). The reply
-- carries the tombstone's archival time (ms) and fence.
local function archived_refusal()
  if redis.call('EXISTS', K_ARCHIVED) == 0 then return nil end
  local t = redis.call('HMGET', K_ARCHIVED, 'at', 'fence')
  return fail('ARCHIVED', (t[1] or '0') .. ' ' .. (t[2] or '0'))
end

-- A CORRUPT reply when meta cannot be relied on, else nil (no writes): not a hash (checked
-- by the read of its fields: no TYPE call when it is one), gone from a session that has
-- receipts (and no waiting requests), or without agent or wake subject, or with a counter
-- that is not an integer. Keeps the fields it read in META.
local function meta_refusal()
  local m = redis.pcall('HMGET', K_META, 'agent', 'wake', 'compat', 'fence', 'seq', 'lease_until',
                        'holder', 'dirty', 'listen')
  if m.err then return wrong_type(K_META, 'meta', 'hash') or m end
  META = m
  if not m[1] and redis.call('EXISTS', K_META) == 0 then
    -- the Brains' receipts: a Brain opens the session (meta) before its first receipt,
    -- while what the Hands or a client append to their own streams cannot make a session
    -- look corrupt (a new one, before its first request)
    if redis.call('EXISTS', K_RECEIPTS) == 1 and redis.call('EXISTS', K_INBOX) == 0 then
      return fail('CORRUPT', 'meta is missing from a session that has receipts')
    end
    return nil
  end
  if not m[1] or m[1] == '' then return fail('CORRUPT', 'meta has no agent') end
  if not m[2] or m[2] == '' then return fail('CORRUPT', 'meta has no wake subject') end
  for i, name in ipairs({'compat', 'fence', 'seq', 'lease_until'}) do
    if not integer(m[i + 2]) then
      return fail('CORRUPT', 'meta ' .. name .. ' is not an integer: ' .. string.sub(m[i + 2], 1, 40))
    end
  end
  return nil
end

-- Append a receipt to the role's stream k as the script's FIRST write, for a script that
-- lists that stream as SELF-GUARDED: a stream key of another type fails this XADD with
-- nothing written, and the call is refused as CORRUPT, as the guard's check of its type would
-- have refused it. The other roles' streams are only read (receipt_id, with pcall): such a
-- script lists them UNGUARDED. Returns that reply, or nil once the receipt is written (and
-- the stream trimmed, as by receipt()).
local function receipt_first(k, kind, worker, fence, seq, now, data)
  local r = add_receipt(k, kind, worker, fence, seq, now, data)
  if type(r) == 'table' and r.err then
    return wrong_type(k, string.match(k, ':([a-z_]+)$'), 'stream') or r
  end
  return nil
end

-- Fair admission (start-time fair queuing): a tenant's next session starts at the later of
-- the shard's virtual time V (the tag of the session last let through) and the end of the
-- tenant's previous one, and takes ADMISSION_UNIT / weight of virtual time; the queue is in
-- order of priority (1 first), then of start tag. A burst of one tenant thus queues behind
-- itself: a tenant arriving later starts at V, ahead of the burst's rest.
local ADMISSION_UNIT, ADMISSION_LEVEL = 1000, 17592186044416  -- 2^44: tags stay exact

-- The queue score of a new session of tenant t at priority prio and weight w, and the
-- tenant's advanced tag (the caller writes it as 'vt:<t>' in K_ADM).
local function admission_score(t, prio, w)
  local v = tonumber(redis.call('HGET', K_ADM, 'V') or '0') or 0
  local start = math.max(v, tonumber(redis.call('HGET', K_ADM, 'vt:' .. t) or '0') or 0)
  return (prio - 1) * ADMISSION_LEVEL + start, start + math.floor(ADMISSION_UNIT / w)
end

-- The INVALID reply of a client's admission arguments ARGV[i..i+3] (window, tenant,
-- priority, weight; submit.lua, start.lua), else nil; and those four, read.
local function admission_args(i)
  local invalid = bad_args({{'admission window', ARGV[i] or '0', 0, MAX_INT},
    {'priority', ARGV[i + 2] or '3', 1, 5}, {'weight', ARGV[i + 3] or '1', 1, 100}})
  if invalid then return invalid end
  local window, t = tonumber(ARGV[i] or '0'), ARGV[i + 1] or ''
  if (window > 0 or t ~= '') and (not string.match(t, '^[A-Za-z0-9_.-]+$') or #t > 64) then
    return redis.error_reply('INVALID tenant must be 1 to 64 of A-Z a-z 0-9 _ . -')
  end
  return nil, window, t, tonumber(ARGV[i + 2] or '3'), tonumber(ARGV[i + 3] or '1')
end

-- The CORRUPT reply when an admission key of the shard has another type, else nil (checked
-- before the first write of a call that will touch them).
local function admission_refusal()
  return wrong_type(K_ADM, 'adm', 'hash') or wrong_type(K_ADM_INFO, 'adm_info', 'hash')
    or wrong_type(K_ADM_FLY, 'adm_fly', 'zset') or wrong_type(K_ADM_Q, 'adm_q', 'zset')
end

-- How a client's request to session sid meets fair admission, read once before the first
-- write: admit (it opens a new session, no meta and no request before it, while a window
-- is set: admit_new writes its wake or queues it), queued (it adds to a new session still
-- waiting in the queue: it writes no wake, the turn's wake takes it up); and the CORRUPT
-- reply of an admission key of the wrong type when it will be touched (SELF-GUARDED).
local function admission_of(sid, window)
  if META[1] then return false, false end
  if requested_agent() then
    return false, redis.call('ZSCORE', K_ADM_Q, sid) ~= false
  end
  if window == 0 then return false, false end
  return true, false, admission_refusal()
end

-- A new session's first wake row {id, subj, data, hdr}, fairly admitted (see admitted.lua):
-- counted as tenant t's waiting work, and written now while fewer than window of the
-- shard's new sessions are starting and none waits (returns 0), else queued by priority
-- and fair share (returns its 1-based place in the shard's queue).
local function admit_new(sid, row, window, t, prio, weight, now)
  redis.call('HSET', K_ADM, 'window', window)  -- what admitted.lua lets start (clients set it)
  redis.call('HINCRBY', K_ADM, 'n', 1)
  redis.call('HINCRBY', K_ADM, 'n:' .. t, 1)
  redis.call('HSET', K_ADM_INFO, sid, cjson.encode({t = t, p = prio, id = row.id,
    subj = row.subj, data = row.data, hdr = row.hdr}))
  local score, tag = admission_score(t, prio, weight)
  redis.call('HSET', K_ADM, 'vt:' .. t, tag)
  if redis.call('ZCARD', K_ADM_Q) == 0
     and tonumber(redis.call('HGET', K_ADM, 'pending') or '0') < window then
    redis.call('HINCRBY', K_ADM, 'pending', 1)
    redis.call('ZADD', K_ADM_FLY, now, sid)
    redis.call('XADD', K_WAKES, '*', 'id', row.id, 'subj', row.subj, 'data', row.data,
               'hdr', row.hdr, 'sid', sid, 'ts', now)
    return 0
  end
  redis.call('ZADD', K_ADM_Q, score, sid)
  return redis.call('ZRANK', K_ADM_Q, sid) + 1
end
