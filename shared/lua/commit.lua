--[==[ commit.lua: apply one Brain write-set atomically, guarded by the session fence.

KEYS: the 12 session keys (see _lib.lua).
ARGV: 1 fence, 2 worker JSON, 3 write-set JSON, 4 session id. The write-set:
  e  [entry JSON]                    appended to entries
  t  [[task id, task JSON, terminal]] upserted; terminal tasks move from tasks to done
  d  [[name, document JSON]]          upserted
  s  [[submission id, JSON]]          upserted
  r  [[run id, intent JSON]]          new tool runs (status dispatched, attempt 0)
  g  [[group, count]]                 completions to await before a group wakes the Brain
  a  [run id]                         'applied' mark: completed runs move to runs_done
  o  [[subject, data JSON, headers JSON]]  outbox rows, ids "<session>/<seq>/<n>"
  ta [[timer member, due ms]]  tr [timer member]   timers to add / remove
  dl deadline ms (> 0 arm now + dl, < 0 clear, 0 leave)
  w  new wake subject, or ""          (a migration to another compat level)
  n  [[channel, message]]             notifications PUBLISHed after the writes (waiters)
  rc receipt JSON
A presented fence that is not the current one is refused with STALE_FENCE <presented>
<current>, after appending a 'refused' receipt (the refusal is a fact worth tracing).
Returns {seq, entry count after the commit}.
]==]

local fence = tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', K_META, 'fence') or '-1')
if cur < 0 then
  return fail('NOT_FOUND', 'session')
end
local now = now_ms()
if cur ~= fence then
  receipt('refused', ARGV[2], fence, 0, now, cjson.encode({current = cur, op = 'commit'}))
  return fail('STALE_FENCE', fence .. ' ' .. cur)
end
local ok, ws = pcall(cjson.decode, ARGV[3])
if not ok or type(ws) ~= 'table' then
  return fail('INVALID', 'write-set is not a JSON object')
end
local function list(name)
  local v = ws[name]
  if v == nil then return {} end
  if type(v) ~= 'table' then error('INVALID write-set field ' .. name .. ' is not a list') end
  return v
end
local function str(v, what)
  if type(v) ~= 'string' then error('INVALID ' .. what .. ' must be a string') end
  return v
end

-- 1. validate everything (no writes yet)
local vok, verr = pcall(function()
  for _, e in ipairs(list('e')) do str(e, 'entry') end
  for _, t in ipairs(list('t')) do str(t[1], 'task id'); str(t[2], 'task') end
  for _, d in ipairs(list('d')) do str(d[1], 'document name'); str(d[2], 'document') end
  for _, s in ipairs(list('s')) do str(s[1], 'submission id'); str(s[2], 'submission') end
  for _, r in ipairs(list('r')) do
    str(r[1], 'run id'); str(r[2], 'intent')
    if redis.call('HEXISTS', K_RUNS, r[1] .. '.intent') == 1
       or redis.call('HEXISTS', K_RUNS_DONE, r[1] .. '.intent') == 1 then
      error('CONFLICT run ' .. r[1] .. ' exists')
    end
  end
  for _, g in ipairs(list('g')) do str(g[1], 'group'); if type(g[2]) ~= 'number' then error('INVALID group count') end end
  for _, a in ipairs(list('a')) do
    str(a, 'applied run id')
    if redis.call('HGET', K_RUNS, a .. '.status') ~= 'completed' then
      error('INVALID run ' .. a .. ' is not completed (cannot apply)')
    end
  end
  for _, o in ipairs(list('o')) do str(o[1], 'outbox subject'); str(o[2], 'outbox data'); str(o[3], 'outbox headers') end
  for _, t in ipairs(list('ta')) do str(t[1], 'timer'); if type(t[2]) ~= 'number' then error('INVALID timer due') end end
  for _, t in ipairs(list('tr')) do str(t, 'timer') end
  if ws.dl ~= nil and type(ws.dl) ~= 'number' then error('INVALID deadline') end
  if ws.w ~= nil then str(ws.w, 'wake subject') end
  for _, n in ipairs(list('n')) do str(n[1], 'channel'); str(n[2], 'notification') end
  str(ws.rc or '{}', 'receipt')
end)
if not vok then
  local msg = tostring(verr)
  local at = string.find(msg, 'INVALID ') or string.find(msg, 'CONFLICT ')
  if at then return redis.error_reply(string.sub(msg, at)) end
  return fail('INVALID', msg)
end

-- 2. write
local session = ARGV[4]
local seq = redis.call('HINCRBY', K_META, 'seq', 1)
local entries = list('e')
for i = 1, #entries, 1000 do
  redis.call('RPUSH', K_ENTRIES, unpack(entries, i, math.min(i + 999, #entries)))
end
for _, t in ipairs(list('t')) do
  if t[3] then
    redis.call('HDEL', K_TASKS, t[1])
    redis.call('HSET', K_DONE, t[1], t[2])
  else
    redis.call('HSET', K_TASKS, t[1], t[2])
  end
end
for _, d in ipairs(list('d')) do redis.call('HSET', K_DOCS, d[1], d[2]) end
for _, s in ipairs(list('s')) do redis.call('HSET', K_SUBS, s[1], s[2]) end
for _, r in ipairs(list('r')) do
  redis.call('HSET', K_RUNS, r[1] .. '.intent', r[2], r[1] .. '.status', 'dispatched',
             r[1] .. '.attempt', 0)
end
for _, g in ipairs(list('g')) do redis.call('HSET', K_META, 'grp:' .. g[1], g[2]) end
for _, a in ipairs(list('a')) do
  local names = {}
  for i, f in ipairs(RUN_FIELDS) do names[i] = a .. '.' .. f end
  local vals = redis.call('HMGET', K_RUNS, unpack(names))
  for i, f in ipairs(RUN_FIELDS) do
    if vals[i] then redis.call('HSET', K_RUNS_DONE, names[i], vals[i]) end
  end
  redis.call('HSET', K_RUNS_DONE, a .. '.applied', now)
  redis.call('HDEL', K_RUNS, unpack(names))
end
for i, o in ipairs(list('o')) do outbox(session, seq, i - 1, o[1], o[2], o[3], now) end
for _, t in ipairs(list('ta')) do redis.call('ZADD', K_TIMERS, t[2], t[1]) end
for _, t in ipairs(list('tr')) do redis.call('ZREM', K_TIMERS, t) end
local wake = redis.call('HGET', K_META, 'wake')
if ws.w and ws.w ~= '' and ws.w ~= wake then
  set_deadline(session, wake, -1, now)
  wake = ws.w
  redis.call('HSET', K_META, 'wake', wake)
end
set_deadline(session, wake, ws.dl or 0, now)
receipt('commit', ARGV[2], fence, seq, now, ws.rc or '{}')
for _, n in ipairs(list('n')) do redis.call('PUBLISH', n[1], n[2]) end
return {seq, redis.call('LLEN', K_ENTRIES)}
