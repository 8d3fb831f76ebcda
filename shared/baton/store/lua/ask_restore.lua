--[==[ ask_restore.lua: a client asks the Brains to bring an archived session back.

KEYS: 1 key of the session, the rest derived from it (see _lib.lua); callers declare the
      inbox, the one session key a client's requests write.
ARGV: 1 session id, 2 (optional) the wake subject of the session's archive object, given when
      the client found no session and no tombstone but the archive holds the session
Not wrapped by _applied.lua and not refused by archived_refusal: the tombstone is what it
expects. A submission (or a task start) to an archived session is refused ARCHIVED with
nothing written; the client then calls this, waits for the session's "restored:<id>"
notification (restore.lua) and submits again, now to the live session, where the request id
is checked against the restored ones.
When the tombstone is there: inbox 'restore' = {wake, at} (the wake subject lets the relay
publish the wake row of a session without meta, as for a new session's first request), the
nudge, and a wake row on the shard's wakes stream on the archived session's
wake subject; a Brain whose lease is refused ARCHIVED finds the request and restores the
session. Returns 1. Without a tombstone (restored already, or never archived) nothing is
written and 0 is returned: the caller submits again.
Repeated calls add a wake row each (the relay deduplicates them by id within its window).
Without a tombstone but with ARGV[2], when the session has no meta: its tombstone expired
(BATON_TOMBSTONE_TTL_S) and the client found the session in the archive. The same request is
written, on the object's wake subject; the Brain that finds it without a tombstone writes the
tombstone back from the object (reinstate.lua) and restores the session as above. Returns 1.
]==]
local tomb = redis.call('HMGET', K_ARCHIVED, 'at', 'wake')
if not tomb[1] then
  if not ARGV[2] or ARGV[2] == '' or redis.call('EXISTS', K_META) == 1 then return 0 end
  tomb = {'expired', ARGV[2]}
end
local now = now_ms()
redis.call('HSET', K_INBOX, 'restore', cjson.encode({wake = tomb[2], at = now}))
redis.call('SET', K_NUDGE, 1)
local sid = ARGV[1]
redis.call('XADD', K_WAKES, '*', 'id', sid .. '/restore/' .. tomb[1], 'subj', tomb[2],
           'data', cjson.encode({v = 1, session_id = sid, reason = 'restore'}), 'hdr', '',
           'sid', sid, 'ts', now)
return 1
