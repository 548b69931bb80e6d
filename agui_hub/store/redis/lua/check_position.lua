-- check_position.lua: after a reconnect, is the entry a live reader read last
-- still stored? (the live reader, once per live thread)
--
-- If the entry at the cursor is neither stored nor trimmed, the stream was
-- rolled back under the same epoch (Redis restarted from an older RDB
-- snapshot, a replica promoted): the thread gets a new epoch, announced on its
-- channel, so that its readers resync.
--
-- KEYS[1] stream      <prefix>:{<tag>}:events (<tag>: keys.py thread_tag)
-- KEYS[2] meta        <prefix>:{<tag>}:meta
-- KEYS[3] checkpoint  <prefix>:{<tag>}:checkpoint
-- KEYS[4] runs        <prefix>:{<tag>}:runs (the index of runs goes with the epoch)
-- ARGV[1] cursor: the offset the reader read last
-- ARGV[2] the epoch the reader saw
-- ARGV[3] epoch candidate (random hex: the new epoch if this call makes one)
-- ARGV[4] notify channel, <prefix>:{<tag>}:notify
--
-- Returns {current epoch or "", 1 if it made a new one else 0}.
--
-- Debugging:
--   redis-cli --eval check_position.lua 'agui:{t}:events' 'agui:{t}:meta' \
--     'agui:{t}:checkpoint' 'agui:{t}:runs' , 1700000000000-0 <epoch> 5eed 'agui:{t}:notify'

-- Offsets compared as decimal strings, as in append.lua.
local function cmp_part(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local function cmp(a, b)
  local a_ms, a_seq = string.match(a, '^(%d+)-(%d+)$')
  local b_ms, b_seq = string.match(b, '^(%d+)-(%d+)$')
  local c = cmp_part(a_ms, b_ms)
  if c ~= 0 then return c end
  return cmp_part(a_seq, b_seq)
end

local state = redis.call('HMGET', KEYS[2], 'epoch', 'trimmed')
local epoch, trimmed = state[1], state[2]
if not epoch or epoch ~= ARGV[2] then return {epoch or '', 0} end
if trimmed and cmp(ARGV[1], trimmed) <= 0 then return {epoch, 0} end
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) > 0 then return {epoch, 0} end
redis.call('HSET', KEYS[2], 'epoch', ARGV[3])
redis.call('DEL', KEYS[3], KEYS[4])
redis.call('PUBLISH', ARGV[4], 'rewound')
return {ARGV[3], 1}
