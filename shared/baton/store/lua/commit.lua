--[==[ commit.lua: apply one Brain write-set atomically, guarded by the session fence.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua).
ARGV: 1 fence, 2 worker JSON, 3 session id, 4 index JSON, 5 receipt JSON, then the records,
      each an argument of its own (no JSON nested in JSON: nothing to unescape), in order:
      entries      ne x  entry JSON                      appended to entries
      tasks        nt x  task id, task JSON, "1"|"0"     upserted; terminal ("1") tasks move
                                                          from tasks to done
      documents    nd x  name, mode, version, JSON        a new version of a document: mode
                                                          "b" stores a baseline (full value),
                                                          "d" a merge-patch delta
      submissions  ns x  submission id, JSON, "1"|"0"    upserted; an open ("0") one is
                                                          also kept in meta as 'sub:<id>',
                                                          a settled ("1") one leaves meta
      runs         nr x  run id, intent JSON              new tool runs (intents: the intent and
                                                          '<run>.status' dispatched)
      outbox       no x  subject, data JSON, headers JSON rows "<session>/<seq>/<n>"
The index holds the counts (ne nt nd ns nr no) and the small parts:
  g  [[group, count]]        completions to await before a group wakes the Brain (intents
                             'grp:<group>'; the Hands count results in runs 'grp:<group>')
  a  [run id]                'applied' mark: completed runs move to runs_done (their
                             records in the runs hash are named in intents 'gc' for the
                             Hands to drop: the Brain never writes the runs hash)
  ta [[timer member, due ms]]  tr [timer member]    timers to add / remove
  dl deadline ms (> 0 arm now + dl, < 0 clear, 0 leave)
  rt retention ms, or absent  the commit leaves nothing live (dl < 0): the session may be
                             archived rt ms from now on Redis' clock (meta 'retain_at', and
                             a 'retain' timer that wakes a Brain then, see archive.lua); a
                             commit that arms a deadline (live work) clears 'retain_at'
  w  new wake subject, or "" (a migration to another compat level)
  n  [[channel, message]]    notifications SPUBLISHed after the writes (waiters; sharded channels under the session's hash tag, so one slot)
  c  new compat level, or 0  (with w: the session moved to another compat level)
  aw [[run id, digest]]      new runs that wait for an approval bound to this arguments
                             digest: status 'awaiting_approval', no outbox row of their own;
                             the digest goes to the intents hash ('<run>.digest')
  cr [run id]  crr result JSON   runs to cancel: one still 'dispatched' (never claimed) or
                             'awaiting_approval' is completed at once with the result crr
                             (and the dirty mark set, so the holder rechecks); every one
                             gets the cancel mark '<run>.cancel' in the intents hash, which
                             a running attempt's next heartbeat reports
  ms [[field, value]]  md [field]   meta fields to set / delete: only 'cancel:*' and
                             'blocked:*' (cancel intents consumed, blocked tasks' reasons),
                             and 'decide:*', 'submit:*', 'start:*' (deletes only); deleted
                             fields go from the inbox too (clients' requests taken up)
  rq [[request, value]]      request ids taken up: request id -> submission id, or
                             'task:<request id>' -> task id (the reqs hash)
  ap [[run id, ms]]          approved runs awaiting approval: status 'dispatched', approved
                             ms (their dispatch rows are among the outbox records)
  rj [[run id, result JSON]] rejected runs awaiting approval: completed with that result,
                             one result fewer for their group to await, the dirty mark
  rl lease ttl ms, or absent  the holder's last commit of its pass: after the writes, the
                             lease is released as release.lua does (kept and extended by
                             rl when the dirty mark or the nudge is set: work arrived), and
                             an earlier commit's hold ends (meta 'listen' cleared)
  hd Brain name, or absent   with rl, hold instead of releasing when no work arrived: the
                             lease is kept and extended by rl and meta 'listen' names the
                             holder, whose tool results then come to it on its hold channel
                             (listening_holder, complete.lua) instead of through the relay;
                             its release (release.lua) ends the hold
Documents live in the docs hash as "<name>" -> "<version> <baseline version>" (the head),
"<name>@b" -> baseline JSON and "<name>@<version>" -> delta JSON (see shared/documents.py).
A document's new version must be its head version + 1 (CONFLICT otherwise), once per commit;
a baseline deletes the deltas between the previous baseline and itself.
Meta's 'sub:<id>' fields are the session's open submissions (accepted or running), copies of
their records in the subs hash, which keeps every submission: a lease reads meta, not the
subs hash, so its cost does not grow with the submissions the session settled (see
baton.store.loading).
Every commit clears the session's streamed partial text (meta 'partial', 'partial_of' and
its chunks, see partial.lua and clear_partial): a real commit supersedes whatever was
streamed before it.
A presented fence that is not the current one is refused with STALE_FENCE <presented>
<current>, after appending a 'refused' receipt (the refusal is a fact worth tracing).
Returns {seq, entry count after the commit}, with rl a third element: 1 when the lease was
kept (the holder must load and recheck), 0 when it was released, 2 when it is held (hd).
The nudge is only tested (EXISTS) and deleted (DEL), which no type fails. The entries are
read (their count) before the first write.
UNGUARDED: nudge entries
The keys a commit touches only for some parts of its write-set are not checked by the guard
before every commit: the script checks their types itself, right after reading the index and
before the validation reads any of them (a WRONGTYPE there would read as INVALID), when the
index has those parts (see touched_refusal below).
The receipt (a refusal's too) is the first write (receipt_first): a receipts key of another
type is refused as CORRUPT with nothing written, without a check of its type every time.
SELF-GUARDED: tasks done docs subs reqs runs runs_done intents inbox outbox timers receipts
UNGUARDED: receipts_hands receipts_client
]==]
local denied = ACL_CHECKS and acl_refusal(log_checks({{'HINCRBY', K_META, 'seq', '1'}, {'HSET', K_META, 'f', 'v'}, {'RPUSH', K_ENTRIES, 'x'},
  {'HSET', K_TASKS, 'f', 'v'}, {'HDEL', K_TASKS, 'f'}, {'HSET', K_DONE, 'f', 'v'},
  {'HSET', K_DOCS, 'f', 'v'}, {'HDEL', K_DOCS, 'f'}, {'HSET', K_SUBS, 'f', 'v'}, {'HSET', K_REQS, 'f', 'v'},
  {'HSET', K_RUNS_DONE, 'f', 'v'}, {'HDEL', K_META, 'f'},
  {'HINCRBY', K_META, 'f', '1'}, {'HSET', K_INTENTS, 'f', 'v'}, {'HDEL', K_INTENTS, 'f'},
  {'HINCRBY', K_INTENTS, 'f', '1'}, {'HDEL', K_INBOX, 'f'}, {'DEL', K_NUDGE}}))
if denied then return denied end

local invalid = bad_args({{'fence', ARGV[1], 0, MAX_INT}})
if invalid then return invalid end
local fence = tonumber(ARGV[1])
local cur = tonumber(META[4] or '-1')  -- as the guard read it
if cur < 0 then
  return fail('NOT_FOUND', 'session')
end
local now = now_ms()
if cur ~= fence then
  local corrupt = receipt_first(K_RECEIPTS, 'refused', ARGV[2], fence, 0, now,
                                cjson.encode({current = cur, op = 'commit'}))
  if corrupt then return corrupt end
  return fail('STALE_FENCE', fence .. ' ' .. cur)
end
local session = ARGV[3]
local ok, ix = pcall(cjson.decode, ARGV[4])
-- cjson reads "[]" and "{}" alike: only an object's text starts with "{".
if not ok or type(ix) ~= 'table' or not string.match(ARGV[4], '^%s*{') then
  return fail('INVALID', 'write-set index is not a JSON object')
end

-- The types of the keys this commit touches beyond meta, entries and receipts (SELF-GUARDED
-- above), as the guard checks them: a part of the index that is present and not empty or
-- zero may touch them (a malformed one is refused by the validation, after these checks).
local function has(name)
  local v = ix[name]
  if type(v) == 'table' then return next(v) ~= nil end
  return v ~= nil and v ~= 0 and v ~= '' and v ~= false
end
local function touched_refusal()
  local runs = has('a') or has('g') or has('cr')
  return (has('nt') and (wrong_type(K_TASKS, 'tasks', 'hash') or wrong_type(K_DONE, 'done', 'hash')))
    or (has('nd') and wrong_type(K_DOCS, 'docs', 'hash'))
    or (has('ns') and wrong_type(K_SUBS, 'subs', 'hash'))
    or (has('rq') and wrong_type(K_REQS, 'reqs', 'hash'))
    or (runs and wrong_type(K_RUNS, 'runs', 'hash'))
    or ((has('nr') or has('a')) and wrong_type(K_RUNS_DONE, 'runs_done', 'hash'))
    or ((runs or has('nr') or has('aw') or has('ap') or has('rj'))
        and wrong_type(K_INTENTS, 'intents', 'hash'))
    or (has('md') and wrong_type(K_INBOX, 'inbox', 'hash'))
    or (has('no') and wrong_type(K_OUTBOX, 'outbox', 'stream'))
    or ((has('ta') or has('tr') or has('dl') or has('w')) and wrong_type(K_TIMERS, 'timers', 'zset'))
end
local wrong = touched_refusal()
if wrong then return wrong end

-- 1. validate everything (no writes yet)
-- JSON numbers may be fractions, NaN or infinite: counts and scores must be whole and finite,
-- or the write loops below would index past the records or a ZADD would fail midway.
local function whole(v)
  return type(v) == 'number' and v == v and v > -2^53 and v < 2^53 and v == math.floor(v)
end
local function count(name)
  local n = ix[name] or 0
  if not whole(n) or n < 0 then error('INVALID count ' .. name) end
  return n
end
local function list(name)
  local v = ix[name]
  if v == nil then return {} end
  if type(v) ~= 'table' then error('INVALID write-set field ' .. name .. ' is not a list') end
  return v
end
local function str(v, what)
  if type(v) ~= 'string' then error('INVALID ' .. what .. ' must be a string') end
  return v
end
local ne, nt, nd, ns, nr, no
local doc_base = {}  -- document name -> its baseline version before this commit
local vok, verr = pcall(function()
  ne, nt, nd, ns, nr, no = count('ne'), count('nt'), count('nd'), count('ns'), count('nr'), count('no')
  if #ARGV ~= 5 + ne + 3 * nt + 4 * nd + 3 * ns + 2 * nr + 3 * no then
    error('INVALID argument count does not match the index')
  end
  if nd > 0 then
    local first, names = 5 + ne + 3 * nt, {}
    for i = 1, nd do
      local name = ARGV[first + 4 * i - 3]
      if doc_base[name] then error('INVALID document ' .. name .. ' written twice') end
      if string.find(name, '@', 1, true) then error('INVALID document name ' .. name) end
      doc_base[name], names[i] = 0, name
    end
    local heads = redis.call('HMGET', K_DOCS, unpack(names))
    for i = 1, nd do
      local p = first + 4 * i - 3
      local mode, version = ARGV[p + 1], tonumber(ARGV[p + 2])
      if mode ~= 'b' and mode ~= 'd' then error('INVALID document mode ' .. tostring(mode)) end
      if not whole(version) then error('INVALID document version') end
      local cur, bv = 0, 0
      if heads[i] then
        local c, b = string.match(heads[i], '^(%d+) (%d+)$')
        if not c then error('INVALID document head of ' .. names[i]) end
        cur, bv = tonumber(c), tonumber(b)
      end
      if version ~= cur + 1 then
        error('CONFLICT document ' .. names[i] .. ' is at version ' .. cur .. ', not ' .. (version - 1))
      end
      if mode == 'd' and cur == 0 then error('INVALID document ' .. names[i] .. ' needs a baseline') end
      doc_base[names[i]] = bv
    end
  end
  local base = 5 + ne + 3 * nt + 4 * nd + 3 * ns
  if nr > 0 then
    local live, ids = {}, {}
    for i = 1, nr do
      ids[i] = ARGV[base + 2 * i - 1]
      live[i] = ids[i] .. '.intent'
    end
    local a = redis.call('HMGET', K_INTENTS, unpack(ids))
    local b = redis.call('HMGET', K_RUNS_DONE, unpack(live))
    for i = 1, nr do
      if a[i] or b[i] then error('CONFLICT run ' .. ARGV[base + 2 * i - 1] .. ' exists') end
    end
  end
  for _, g in ipairs(list('g')) do
    str(g[1], 'group')
    if not whole(g[2]) then error('INVALID group count') end
  end
  local applied = list('a')
  if #applied > 0 then
    local names = {}
    for i, r in ipairs(applied) do names[i] = str(r, 'applied run id') .. '.status' end
    local st = redis.call('HMGET', K_RUNS, unpack(names))
    local own = redis.call('HMGET', K_INTENTS, unpack(names))
    for i, r in ipairs(applied) do
      if run_status(own[i], st[i]) ~= 'completed' then
        error('INVALID run ' .. r .. ' is not completed (cannot apply)')
      end
    end
  end
  for _, t in ipairs(list('ta')) do
    str(t[1], 'timer')
    if not whole(t[2]) then error('INVALID timer due') end
  end
  for _, t in ipairs(list('tr')) do str(t, 'timer') end
  if ix.dl ~= nil and not whole(ix.dl) then error('INVALID deadline') end
  if ix.rt ~= nil and (not whole(ix.rt) or ix.rt < 0) then error('INVALID retention') end
  if ix.w ~= nil then str(ix.w, 'wake subject') end
  if ix.rl ~= nil and (not whole(ix.rl) or ix.rl <= 0) then error('INVALID lease ttl') end
  if ix.hd ~= nil and (type(ix.hd) ~= 'string' or not string.match(ix.hd, '^[%w_.:-]+$')) then
    error('INVALID holder name')
  end
  if ix.c ~= nil and (not whole(ix.c) or ix.c < 0) then error('INVALID compat level') end
  for _, a in ipairs(list('aw')) do str(a[1], 'awaiting run id'); str(a[2], 'digest') end
  if #list('cr') > 0 then
    for _, r in ipairs(list('cr')) do
      str(r, 'cancelled run id')
      -- the write loop decrements the run's group counter: it must be an integer
      local iok, intent = pcall(cjson.decode, redis.call('HGET', K_INTENTS, r) or 'null')
      if iok and type(intent) == 'table' and type(intent.group) == 'string'
          and not integer(redis.call('HGET', K_INTENTS, 'grp:' .. intent.group)) then
        error('CORRUPT intents grp:' .. intent.group .. ' is not an integer')
      end
    end
    str(ix.crr, 'cancel result')
  end
  local function meta_field(f)
    str(f, 'meta field')
    if string.sub(f, 1, 7) ~= 'cancel:' and string.sub(f, 1, 8) ~= 'blocked:' then
      error('INVALID meta field ' .. f .. ' may not be written by a commit')
    end
  end
  for _, m in ipairs(list('ms')) do meta_field(m[1]); str(m[2], 'meta value') end
  for _, r in ipairs(list('rq')) do str(r[1], 'request id'); str(r[2], 'request value') end
  for _, f in ipairs(list('md')) do
    local f7 = string.sub(tostring(f), 1, 7)
    if f7 ~= 'decide:' and f7 ~= 'submit:' and string.sub(tostring(f), 1, 6) ~= 'start:' then
      meta_field(f)
    end
  end
  for _, name in ipairs({'ap', 'rj'}) do
    for _, d in ipairs(list(name)) do
      str(d[1], 'decided run id')
      if redis.call('HGET', K_INTENTS, d[1] .. '.status') ~= 'awaiting_approval' then
        error('CONFLICT run ' .. d[1] .. ' awaits no approval')
      end
    end
  end
  for _, d in ipairs(list('ap')) do
    if not whole(d[2]) then error('INVALID approval ms') end
  end
  for _, d in ipairs(list('rj')) do
    str(d[2], 'rejection result')
    local iok, intent = pcall(cjson.decode, redis.call('HGET', K_INTENTS, d[1]) or 'null')
    if iok and type(intent) == 'table' and type(intent.group) == 'string'
        and not integer(redis.call('HGET', K_INTENTS, 'grp:' .. intent.group)) then
      error('CORRUPT intents grp:' .. intent.group .. ' is not an integer')
    end
  end
  for _, n in ipairs(list('n')) do
    str(n[1], 'channel'); str(n[2], 'notification')
    if redis.acl_check_cmd and not redis.acl_check_cmd('SPUBLISH', n[1], n[2]) then
      error('NOPERM SPUBLISH ' .. n[1])
    end
  end
end)
if not vok then
  local msg = tostring(verr)
  local at = string.find(msg, 'INVALID ') or string.find(msg, 'CONFLICT ')
    or string.find(msg, 'NOPERM ') or string.find(msg, 'CORRUPT ')
  if at then return redis.error_reply(string.sub(msg, at)) end
  return fail('INVALID', msg)
end

-- 2. write
local count = redis.call('LLEN', K_ENTRIES) + ne  -- the count after the writes below
-- the receipt first, with the sequence below (meta's seq is an integer)
local corrupt = receipt_first(K_RECEIPTS, 'commit', ARGV[2], fence, tonumber(META[5] or '0') + 1, now,
                              ARGV[5])
if corrupt then return corrupt end
-- the next sequence (meta's seq is an integer), written with the lease's fields when the
-- commit ends the pass (one write of meta fewer), else right here
local seq = tonumber(META[5] or '0') + 1
if not ix.rl then redis.call('HSET', K_META, 'seq', seq) end
local p = 6
for i = p, p + ne - 1, 1000 do
  redis.call('RPUSH', K_ENTRIES, unpack(ARGV, i, math.min(i + 999, p + ne - 1)))
end
p = p + ne
for _ = 1, nt do
  if ARGV[p + 2] == '1' then
    redis.call('HDEL', K_TASKS, ARGV[p])
    redis.call('HSET', K_DONE, ARGV[p], ARGV[p + 1])
  else
    redis.call('HSET', K_TASKS, ARGV[p], ARGV[p + 1])
  end
  p = p + 3
end
for _ = 1, nd do
  local name, mode, version = ARGV[p], ARGV[p + 1], tonumber(ARGV[p + 2])
  if mode == 'b' then  -- a baseline replaces the deltas since the previous one
    local stale = {}
    for v = doc_base[name] + 1, version - 1 do stale[#stale + 1] = name .. '@' .. v end
    for i = 1, #stale, 1000 do
      redis.call('HDEL', K_DOCS, unpack(stale, i, math.min(i + 999, #stale)))
    end
    redis.call('HSET', K_DOCS, name .. '@b', ARGV[p + 3], name, version .. ' ' .. version)
  else
    redis.call('HSET', K_DOCS, name .. '@' .. version, ARGV[p + 3],
               name, version .. ' ' .. doc_base[name])
  end
  p = p + 4
end
for _ = 1, ns do
  redis.call('HSET', K_SUBS, ARGV[p], ARGV[p + 1])
  if ARGV[p + 2] == '1' then  -- settled: no longer read by every lease
    redis.call('HDEL', K_META, 'sub:' .. ARGV[p])
  else
    redis.call('HSET', K_META, 'sub:' .. ARGV[p], ARGV[p + 1])
  end
  p = p + 3
end
local awaiting = {}
for _, a in ipairs(list('aw')) do awaiting[a[1]] = a[2] end
for _ = 1, nr do
  local rid = ARGV[p]
  -- beside the intent, where the Hands cannot change what an approval must present
  if awaiting[rid] then
    redis.call('HSET', K_INTENTS, rid, ARGV[p + 1], rid .. '.status', 'awaiting_approval',
               rid .. '.digest', awaiting[rid])
  else
    redis.call('HSET', K_INTENTS, rid, ARGV[p + 1], rid .. '.status', 'dispatched')
  end
  p = p + 2
end
for i = 1, no do
  outbox(session, seq, i - 1, ARGV[p], ARGV[p + 1], ARGV[p + 2], now)
  p = p + 3
end
-- The Hands' records of applied runs and finished group counters are left for the Hands
-- to drop (gc_names): a commit that applies runs or (re)starts a group rewrites the list,
-- keeping the names still present, but never a group counter it counts on again.
local applied, groups = list('a'), list('g')
local gc = nil
if #applied > 0 or #groups > 0 then
  local counting = {}
  for _, g in ipairs(groups) do counting['grp:' .. g[1]] = true end
  gc = {}
  for _, n in ipairs(gc_names()) do
    local field = n
    if string.sub(n, 1, 4) ~= 'grp:' then field = n .. '.status' end
    if not counting[n] and redis.call('HEXISTS', K_RUNS, field) == 1 then gc[#gc + 1] = n end
  end
end
for _, g in ipairs(groups) do
  -- awaited = the new runs plus what the Hands counted before (a group name used again)
  local got = tonumber(redis.call('HGET', K_RUNS, 'grp:' .. g[1]) or '0') or 0
  redis.call('HSET', K_INTENTS, 'grp:' .. g[1], g[2] + got)
end
if #applied > 0 then
  local brain_fields = {}
  for i, f in ipairs(BRAIN_RUN_FIELDS) do brain_fields[f] = i end
  local nf, nb, status_at = #RUN_FIELDS, #BRAIN_RUN_FIELDS + 1, brain_fields['status'] + 1
  local finished, order = {}, {}  -- the groups of the applied runs, each once
  -- the records of up to 50 runs per command (a command's arguments are a Lua stack's)
  for first = 1, #applied, 50 do
    local last = math.min(first + 49, #applied)
    local names, own_names = {}, {}
    for j = first, last do
      local a, v0, o0 = applied[j], (j - first) * nf, (j - first) * nb
      for i, f in ipairs(RUN_FIELDS) do names[v0 + i] = a .. '.' .. f end
      own_names[o0 + 1] = a
      for i, f in ipairs(BRAIN_RUN_FIELDS) do own_names[o0 + i + 1] = a .. '.' .. f end
    end
    local vals = redis.call('HMGET', K_RUNS, unpack(names))
    local own = redis.call('HMGET', K_INTENTS, unpack(own_names))
    local moved = {}
    for j = first, last do
      local a, v0, o0 = applied[j], (j - first) * nf, (j - first) * nb
      -- an ending decided without the Hands (own status 'completed') keeps its own result
      local ended = own[o0 + status_at] == 'completed'
      moved[#moved + 1] = a .. '.applied'
      moved[#moved + 1] = now
      for i, f in ipairs(RUN_FIELDS) do
        local v = vals[v0 + i]
        local b = brain_fields[f]
        if f == 'intent' then
          v = own[o0 + 1]
        elseif b and (ended or (f ~= 'status' and f ~= 'result' and f ~= 'completed')) then
          v = own[o0 + b + 1]
        elseif b and not v then
          v = own[o0 + b + 1]
        end
        if v then
          moved[#moved + 1] = names[v0 + i]
          moved[#moved + 1] = v
        end
      end
      if vals[v0 + 2] then gc[#gc + 1] = a end
      local iok, intent = pcall(cjson.decode, own[o0 + 1] or 'null')
      local g = iok and type(intent) == 'table' and type(intent.group) == 'string' and intent.group
      if g and not finished[g] then
        finished[g] = true
        order[#order + 1] = g
      end
    end
    redis.call('HSET', K_RUNS_DONE, unpack(moved))
    redis.call('HDEL', K_INTENTS, unpack(own_names))
  end
  for _, g in ipairs(order) do  -- a group with every result in: its counters go
    local total = tonumber(redis.call('HGET', K_INTENTS, 'grp:' .. g) or '0') or 0
    local got = tonumber(redis.call('HGET', K_RUNS, 'grp:' .. g) or '0') or 0
    if got >= total then
      redis.call('HDEL', K_INTENTS, 'grp:' .. g)
      if got > 0 then gc[#gc + 1] = 'grp:' .. g end
    end
  end
end
if gc and #gc > 0 then
  redis.call('HSET', K_INTENTS, 'gc', table.concat(gc, ' '))
elseif gc then
  redis.call('HDEL', K_INTENTS, 'gc')
end
local dirtied = false  -- the dirty mark set by this commit (META has it as it was)
for _, rid in ipairs(list('cr')) do
  local hands = redis.call('HGET', K_RUNS, rid .. '.status')
  local own = redis.call('HMGET', K_INTENTS, rid, rid .. '.status')
  local status = run_status(own[2], hands)
  if status == 'dispatched' or status == 'awaiting_approval' then
    -- never claimed: it ends now, out of the Hands' reach
    redis.call('HSET', K_INTENTS, rid .. '.result', ix.crr, rid .. '.status', 'completed',
               rid .. '.completed', now, rid .. '.cancel', now)
    local iok, intent = pcall(cjson.decode, own[1] or 'null')
    if iok and type(intent) == 'table' and type(intent.group) == 'string' then
      redis.call('HINCRBY', K_INTENTS, 'grp:' .. intent.group, -1)
    end
    redis.call('HSET', K_META, 'dirty', 1)
    dirtied = true
  elseif status == 'running' then
    redis.call('HSET', K_INTENTS, rid .. '.cancel', now)  -- Brain-owned: the Hands cannot clear it
  end
end
for _, d in ipairs(list('ap')) do
  redis.call('HSET', K_INTENTS, d[1] .. '.status', 'dispatched', d[1] .. '.approved', d[2])
end
for _, d in ipairs(list('rj')) do
  redis.call('HSET', K_INTENTS, d[1] .. '.status', 'completed', d[1] .. '.result', d[2],
             d[1] .. '.completed', now)
  local iok, intent = pcall(cjson.decode, redis.call('HGET', K_INTENTS, d[1]) or 'null')
  if iok and type(intent) == 'table' and type(intent.group) == 'string' then
    redis.call('HINCRBY', K_INTENTS, 'grp:' .. intent.group, -1)
  end
  redis.call('HSET', K_META, 'dirty', 1)
  dirtied = true
end
for _, m in ipairs(list('ms')) do redis.call('HSET', K_META, m[1], m[2]) end
for _, r in ipairs(list('rq')) do redis.call('HSET', K_REQS, r[1], r[2]) end
local md = list('md')
for i = 1, #md, 1000 do  -- cancel intents consumed: in meta or, by clients, in the inbox
  local last = math.min(i + 999, #md)  -- a command's arguments are a Lua stack's: chunks
  redis.call('HDEL', K_META, unpack(md, i, last))
  redis.call('HDEL', K_INBOX, unpack(md, i, last))
end
if ix.c and ix.c > 0 then redis.call('HSET', K_META, 'compat', ix.c) end
for _, t in ipairs(list('ta')) do redis.call('ZADD', K_TIMERS, t[2], t[1]) end
for _, t in ipairs(list('tr')) do redis.call('ZREM', K_TIMERS, t) end
local wake = META[2]  -- no write above changes it
if ix.w and ix.w ~= '' and ix.w ~= wake then
  set_deadline(session, wake, -1, now)
  wake = ix.w
  redis.call('HSET', K_META, 'wake', wake)
end
set_deadline(session, wake, ix.dl or 0, now)
if ix.rt and ix.rt > 0 then
  redis.call('HSET', K_META, 'retain_at', now + ix.rt)
  redis.call('ZADD', K_TIMERS, now + ix.rt, 'retain|' .. session .. '|-|' .. wake)
elseif (ix.dl or 0) > 0 then
  redis.call('HDEL', K_META, 'retain_at')
end
clear_partial()
for _, n in ipairs(list('n')) do redis.call('SPUBLISH', n[1], n[2]) end
if ix.rl then  -- as release.lua: kept when work arrived meanwhile, else released
  if dirtied or META[8] == '1' or redis.call('EXISTS', K_NUDGE) == 1 then
    redis.call('HSET', K_META, 'seq', seq, 'dirty', 0, 'lease_until', now + ix.rl, 'listen', '')
    redis.call('DEL', K_NUDGE)
    return {seq, count, 1}
  end
  if ix.hd then  -- hold: the results of the runs just dispatched come to the holder
    redis.call('HSET', K_META, 'seq', seq, 'listen', ix.hd, 'lease_until', now + ix.rl)
    return {seq, count, 2}
  end
  redis.call('HSET', K_META, 'seq', seq, 'holder', '', 'lease_until', 0, 'listen', '')
  return {seq, count, 0}
end
return {seq, count}
