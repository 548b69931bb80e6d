-- checkpoint.lua: store a thread's checkpoint (RedisStore.put_checkpoint).
--
-- Writes only for the thread's current epoch and only forward: a slower
-- gateway never replaces a later checkpoint with an older one.
--
-- KEYS[1] checkpoint  <prefix>:{<tag>}:checkpoint (<tag>: keys.py thread_tag)
-- KEYS[2] meta        <prefix>:{<tag>}:meta
-- ARGV[1] offset the checkpoint is at
-- ARGV[2] epoch of that offset
-- ARGV[3] events: msgpack of the folded thread state (Checkpoint.events)
-- ARGV[4] complete: 1 if that state folds the whole history, else 0
-- ARGV[5] ttl_ms (0: no expiry)
--
-- Returns 1 when written, 0 when refused (another epoch, not later).
--
-- Debugging:
--   redis-cli --eval checkpoint.lua 'agui:{t}:checkpoint' 'agui:{t}:meta' , \
--     1700000000000-0 <epoch> snapshot 1 0

local epoch = redis.call('HGET', KEYS[2], 'epoch')
if epoch ~= ARGV[2] then return 0 end
local known = redis.call('HGET', KEYS[1], 'offset')
if known then
  local k_ms, k_seq = string.match(known, '^(%d+)-(%d+)$')
  local n_ms, n_seq = string.match(ARGV[1], '^(%d+)-(%d+)$')
  k_ms, k_seq, n_ms, n_seq = tonumber(k_ms), tonumber(k_seq), tonumber(n_ms), tonumber(n_seq)
  if n_ms < k_ms or (n_ms == k_ms and n_seq <= k_seq) then return 0 end
end
redis.call('HSET', KEYS[1], 'offset', ARGV[1], 'epoch', ARGV[2], 'events', ARGV[3],
  'complete', ARGV[4])
if tonumber(ARGV[5]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
return 1
