--[==[ admitted.lua: a starting session was received by a Brain; start the next ones in line.

Fair admission of new sessions (baton.store.admission), one shard's part. submit.lua counts
a request that opens a session as its tenant's waiting work and either writes its first
wake at once (fewer than the window's sessions of the shard are starting and none waits) or
queues it (adm_q, by priority, then start tag: admission_score in _lib.lua). A Brain that
receives a first wake marked "admitted" calls this script: the session is no longer
starting nor waiting, and the sessions first in line take the freed places, their wake rows
written to the shard's outbox (the relay publishes them as it publishes any row).

KEYS: 1 adm HASH (window: the admission window of the shard, as the last submission that
        joined gave it; pending: sessions starting; V: the virtual time; vt:<tenant>: the
        end of the tenant's last share; n and n:<tenant>: sessions waiting or starting)
      2 adm_info HASH (session id -> {t tenant, p priority, id, subj, data, hdr}: its wake row)
      3 adm_fly ZSET (starting sessions: id -> ms their first wake was written)
      4 adm_q ZSET (queued sessions: id -> priority * 2^44 + start tag)
      5 outbox STREAM of the shard
ARGV: 1 session id received ('' to only let the line move), 2 admission window of the shard
        (used when the adm hash holds none: the clients', who submit, is the one that counts),
      3 ms after which a starting session counts as received (its wake lost or its Brain
        gone: the window must not stay closed; a late Brain finds its session anyway)
Returns the number of sessions let through. Every key's type is checked before the first
write; an info record that cannot be decoded is dropped with its count, not sent.
]==]
local invalid = bad_args({{'admission window', ARGV[2], 1, MAX_INT},
                          {'start ms', ARGV[3], 1, MAX_MS}})
if invalid then return invalid end
if #KEYS ~= 5 then return redis.error_reply('ERR admitted.lua takes 5 keys, not ' .. #KEYS) end
local adm, info, fly, queue, outbox = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
for i, want in ipairs({'hash', 'hash', 'zset', 'zset', 'stream'}) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('CORRUPT admission key ' .. KEYS[i] .. ' is a ' .. t)
  end
end
local ttl = tonumber(ARGV[3])
local window = tonumber(redis.call('HGET', adm, 'window') or '') or tonumber(ARGV[2])
local LEVEL = 17592186044416  -- 2^44, as _lib.lua's ADMISSION_LEVEL
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The tenant of an info record (nil when it cannot be decoded).
local function tenant_of(raw)
  if not raw then return nil end
  local ok, r = pcall(cjson.decode, raw)
  if ok and type(r) == 'table' and type(r.t) == 'string' then return r.t, r end
  return nil
end

-- Session s no longer waits: its counts and record go.
local function uncount(s)
  local tenant = tenant_of(redis.call('HGET', info, s))
  redis.call('HDEL', info, s)
  if redis.call('HINCRBY', adm, 'n', -1) < 0 then redis.call('HSET', adm, 'n', 0) end
  if tenant and redis.call('HINCRBY', adm, 'n:' .. tenant, -1) <= 0 then
    redis.call('HDEL', adm, 'n:' .. tenant)
  end
end

-- Starting session s was received (or counts as received): its place is free.
local function received(s)
  if redis.call('ZREM', fly, s) == 1 then
    if redis.call('HINCRBY', adm, 'pending', -1) < 0 then redis.call('HSET', adm, 'pending', 0) end
    uncount(s)
  end
end

if ARGV[1] ~= '' then received(ARGV[1]) end
for _, s in ipairs(redis.call('ZRANGEBYSCORE', fly, '-inf', now - ttl, 'LIMIT', 0, 100)) do
  received(s)
end
local pending = tonumber(redis.call('HGET', adm, 'pending') or '0') or 0
local released = 0
while pending < window do
  local head = redis.call('ZPOPMIN', queue)
  if #head == 0 then break end
  local s = head[1]
  redis.call('HSET', adm, 'V', tonumber(head[2]) % LEVEL)
  local _, r = tenant_of(redis.call('HGET', info, s))
  if r and type(r.subj) == 'string' and type(r.data) == 'string' and type(r.id) == 'string' then
    pending = redis.call('HINCRBY', adm, 'pending', 1)
    redis.call('ZADD', fly, now, s)
    redis.call('XADD', outbox, '*', 'id', r.id, 'subj', r.subj, 'data', r.data,
               'hdr', type(r.hdr) == 'string' and r.hdr or '', 'sid', s, 'ts', now)
    released = released + 1
  else
    uncount(s)
  end
end
return released
