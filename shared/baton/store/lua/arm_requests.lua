--[==[ arm_requests.lua: wake the sessions whose inbox holds requests no Brain took up yet.

KEYS: 1 timers ZSET of the shard, 2 relay lease HASH of the shard (relay_lease.lua),
      3 the shard's session index ZSET, 4 the shard's requested ZSET, then for each session
      of ARGV its inbox HASH, poison HASH and meta HASH (all under one hash tag: declared,
      so on a Redis Cluster a slot in migration redirects the call before anything ran),
      last the shard's admission queue ZSET (adm_q, see admitted.lua)
ARGV: 1 relay name, 2 its lease fence, 3 session key prefix ("<ns>:{<ns>-<shard>}:s:"),
      4 progress deadline ms, 5.. session ids (found by the relay's inbox sweep)
A client's request (submit, start, cancel, approve, reject) writes only the session's inbox,
its nudge and a row on the shard's wakes stream: no shard-wide timer. If that wake is lost
(the row deleted before a relay read it, the message lost after), the request would wait
unseen, so the relay sweeps the inboxes of its shards now and then (the sessions of the
requested set: those whose request wakes it published since the last sweep; every session
of the keyspace when it takes a shard) and, for each session
whose inbox still holds requests, arms the session's progress deadline (ZADD NX: a deadline
already armed is left as it is), due one deadline from now: a request whose wake is merely
in flight is taken up before, and the Brain's commit re-arms or clears it. fire_timers.lua then wakes the session on its
wake subject (its meta's, or for a session not opened yet the one its first submit or start
request names), and the Brain's commit that takes the requests up arms or clears the
deadline as for any commit. The inbox is checked here, atomically with the ZADD, so a
request taken up meanwhile arms nothing; a quarantined session (its poison hash) is left
alone, as poison.lua left it without timers, and so is a new session waiting in the admission
queue: its wake is written when its turn comes (admitted.lua), not lost. A session not opened yet is listed in the
shard's index (ZADD NX), as the relay lists it when it publishes its first request's wake.
Each session looked at leaves the requested set (ZREM): its deadline is armed now, or its
inbox holds nothing to wait for; a later request's wake puts it back. Only the shard's lease
holder arms: a relay that lost the shard gets -1.
Returns the number of deadlines armed.
]==]
local lease = redis.call('HMGET', KEYS[2], 'holder', 'fence')
local invalid = bad_args({{'fence', ARGV[2], 0, MAX_INT}, {'progress deadline ms', ARGV[4], 1, MAX_MS}})
if invalid then return invalid end
if #KEYS ~= 4 + 3 * (#ARGV - 4) + 1 then
  return redis.error_reply('ERR arm_requests.lua takes ' .. (4 + 3 * (#ARGV - 4) + 1)
                           .. ' keys, not ' .. #KEYS)
end
local queue = KEYS[#KEYS]
for i = 5, #ARGV do
  local base, at = ARGV[3] .. ARGV[i], 4 + 3 * (i - 5)
  if KEYS[at + 1] ~= base .. ':inbox' or KEYS[at + 2] ~= base .. ':poison'
     or KEYS[at + 3] ~= base .. ':meta' then
    return redis.error_reply('ERR session ' .. ARGV[i] .. ': keys ' .. (at + 1) .. '-' .. (at + 3)
                             .. ' are not its inbox, poison and meta')
  end
end
if lease[1] ~= ARGV[1] or tonumber(lease[2] or '0') ~= tonumber(ARGV[2]) then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local armed = 0
for i = 5, #ARGV do
  local sid, base = ARGV[i], ARGV[3] .. ARGV[i]
  local fields = redis.call('HKEYS', base .. ':inbox')
  local wake = nil
  if #fields > 0 and redis.call('HEXISTS', base .. ':poison', 'quarantined') == 0
     and not redis.call('ZSCORE', queue, sid) then
    wake = redis.call('HGET', base .. ':meta', 'wake')
    if not wake then
      redis.call('ZADD', KEYS[3], 'NX', now, sid)
      table.sort(fields)
      for _, f in ipairs(fields) do
        if string.sub(f, 1, 7) == 'submit:' or string.sub(f, 1, 6) == 'start:' then
          local ok, r = pcall(cjson.decode, redis.call('HGET', base .. ':inbox', f))
          if ok and type(r) == 'table' and type(r.wake) == 'string' then
            wake = r.wake
            break
          end
        end
      end
    end
  end
  if wake then
    armed = armed + redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[4]),
                               'deadline|' .. sid .. '|-|' .. wake)
  end
end
for i = 5, #ARGV, 1000 do
  redis.call('ZREM', KEYS[4], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
return armed
