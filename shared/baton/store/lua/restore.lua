--[==[ restore.lua: bring an archived session back into Redis, exactly once.

KEYS: 1 key of the session (meta), the rest derived from it (see _lib.lua).
ARGV: 1 worker name, 2 worker JSON, 3 the tombstone's 'at' the caller read (the archival
      it restores), 4 the session's keys as the archive object holds them, JSON:
      {"meta": [field, value, ...], "entries": [entry JSON, ...], "tasks": [...],
       "done": [...], "docs": [...], "subs": [...], "reqs": [...], "runs": [...],
       "runs_done": [...], "intents": [...], "poison": [...], "inbox": [...],
       "receipts": [[id, [field, value, ...]], ...], "receipts_hands": [...],
       "receipts_client": [...]} (each role's receipts stream; an object archived before
       per-role streams has all its receipts in "receipts")
      5 receipt JSON of the 'restored' receipt, 6 settled channel of the session
Not wrapped by _applied.lua and not refused by archived_refusal: the tombstone is what it
expects. A Brain calls it when a session's lease was refused ARCHIVED and a request waits in
its inbox (a client's submission to an archived session asked for it, ask_restore.lua).
Checks, before any write: the tombstone is there with the archival time the caller read
(another Brain restored it first, or it was archived again since: 0 is returned and nothing
written), and the session has no keys of its own but the inbox (the requests that asked for
the restore, kept and merged with the archived inbox).
Writes the keys back as they were (but the Hands' runs hash: in a settled session it holds
only records of applied runs the Hands had yet to drop, and a Brain may not write it; the
archive object keeps them for reading), with the fence one past the archived one (a worker that
held the session before it was archived stays fenced out), the lease free and the dirty
mark set (the next lease loads everything and takes the waiting requests up), the session
back in the shard's index, the tombstone and its entry in the archived index removed, a
each role's receipts back in its own stream with their ids, a 'restored' receipt after
them all (the trace goes on where it stopped), and
"restored:<session id>" SPUBLISHed on its settled channel (a client waiting to submit
again hears it).
Returns {1, fence} when restored now, {0, 0} when nothing was to be restored.
]==]
local worker, at = ARGV[1], ARGV[3]
local tomb = redis.call('HMGET', K_ARCHIVED, 'at', 'fence', 'agent')
if not tomb[1] or tomb[1] ~= at then return {0, 0} end
for _, k in ipairs({K_META, K_ENTRIES, K_TASKS, K_DONE, K_DOCS, K_SUBS, K_REQS,
                    K_RUNS_DONE, K_RECEIPTS, K_RECEIPTS_HANDS, K_RECEIPTS_CLIENT,
                    K_INTENTS}) do
  if redis.call('EXISTS', k) == 1 then return fail('CORRUPT', 'archived session has key ' .. k) end
end
local ok, keys = pcall(cjson.decode, ARGV[4])
if not ok or type(keys) ~= 'table' or type(keys.meta) ~= 'table' or #keys.meta == 0 then
  return fail('INVALID', 'restore: the archived keys do not parse')
end
local STREAMS = {{K_RECEIPTS, keys.receipts}, {K_RECEIPTS_HANDS, keys.receipts_hands},
                 {K_RECEIPTS_CLIENT, keys.receipts_client}}
for _, stream in ipairs(STREAMS) do
  for _, r in ipairs(stream[2] or {}) do
    if type(r) ~= 'table' or type(r[1]) ~= 'string' or type(r[2]) ~= 'table' then
      return fail('INVALID', 'restore: a receipt does not parse')
    end
  end
end
-- Checked: from here on the step cannot fail midway.
local CHUNK = 500  -- arguments per command: unpack has a limit
local function put_hash(key, pairs_)
  for i = 1, #pairs_, CHUNK * 2 do
    redis.call('HSET', key, unpack(pairs_, i, math.min(i + CHUNK * 2 - 1, #pairs_)))
  end
end
local function put_list(key, items)
  for i = 1, #items, CHUNK do
    redis.call('RPUSH', key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
  end
end
put_hash(K_META, keys.meta)
put_list(K_ENTRIES, keys.entries or {})
put_hash(K_TASKS, keys.tasks or {})
put_hash(K_DONE, keys.done or {})
put_hash(K_DOCS, keys.docs or {})
put_hash(K_SUBS, keys.subs or {})
put_hash(K_REQS, keys.reqs or {})
put_hash(K_RUNS_DONE, keys.runs_done or {})
put_hash(K_INTENTS, keys.intents or {})
put_hash(K_POISON, keys.poison or {})
put_hash(K_INBOX, keys.inbox or {})
for _, stream in ipairs(STREAMS) do
  for _, r in ipairs(stream[2] or {}) do
    redis.call('XADD', stream[1], r[1], unpack(r[2]))
  end
end
local fence = tonumber(tomb[2] or '0') + 1
local now = now_ms()
local seq = redis.call('HGET', K_META, 'seq') or '0'
redis.call('HSET', K_META, 'fence', fence, 'holder', '', 'lease_until', 0, 'listen', '',
           'dirty', 1)
redis.call('HDEL', K_META, 'retain_at')
clear_partial()  -- a streamed answer's text, saved whole or in chunks
local sid = string.match(K_BASE, ':s:(.*)$')
redis.call('ZADD', K_SESSIONS, tonumber(redis.call('HGET', K_META, 'created') or now) or now, sid)
redis.call('HDEL', K_INBOX, 'restore')  -- taken up: the session is back
redis.call('DEL', K_ARCHIVED)
redis.call('ZREM', K_ARCHIVED_IX, sid)
receipt(K_RECEIPTS, 'restored', ARGV[2], fence, seq, now, ARGV[5])
redis.call('SPUBLISH', ARGV[6], 'restored:' .. sid)
return {1, fence}
