--[==[ relay_ack.lua: acknowledge and delete published outbox rows, under the shard's lease.

KEYS: 1 lease HASH of the shard (see relay_lease.lua), 2 outbox STREAM of the shard
ARGV: 1 relay name   2 lease fence   3.. stream ids of the published rows
The rows are acknowledged (consumer group "relay") and deleted only while the lease is
this relay's, with this fence. A relay that lost the shard (its lease expired and another
relay took it) gets {0, holder, fence} and deletes nothing: the new holder re-publishes the
rows under the same Nats-Msg-Id (deduplicated by JetStream) and acknowledges them itself.
Returns {1, rows acknowledged}.
]==]
local cur = redis.call('HMGET', KEYS[1], 'holder', 'fence')
local invalid = bad_args({{'fence', ARGV[2], 0, MAX_INT}})
if invalid then return invalid end
if cur[1] ~= ARGV[1] or tonumber(cur[2] or '0') ~= tonumber(ARGV[2]) then
  return {0, cur[1] or '', tonumber(cur[2] or '0')}
end
local ids = {}
for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
if #ids == 0 then return {1, 0} end
local n = redis.call('XACK', KEYS[2], 'relay', unpack(ids))
redis.call('XDEL', KEYS[2], unpack(ids))
return {1, n}
