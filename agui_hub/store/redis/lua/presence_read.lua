-- presence_read.lua: one thread's presence entries (RedisStore.presence, one
-- call per thread in one pipeline).
--
-- Expired entries are dropped first (a change of the version), with Redis's
-- TIME as "now", as presence_update.lua does. A reader that gives the version it
-- knows gets only the version when it is unchanged: polls of quiet threads are
-- cheap.
--
-- KEYS[1] exp     <prefix>:{<tag>}:presence:exp (<tag>: keys.py thread_tag)
-- KEYS[2] joined  <prefix>:{<tag>}:presence:joined
-- KEYS[3] who     <prefix>:{<tag>}:presence:who
-- KEYS[4] v       <prefix>:{<tag>}:presence:v
-- ARGV[1] the version the reader knows ("": none)
-- ARGV[2] limit - 1: the last index of the entries returned (>= 0)
--
-- Returns {version} when it is the known one, else {version, count,
-- {connection ids, first `limit` by joined then id}, {their msgpack [subject,
-- joined, client], nil for one missing}}. Version "0": no entries.
--
-- Debugging:
--   cat presence_lib.lua presence_read.lua > p.lua; redis-cli --eval p.lua 'agui:{t}:presence:exp' \
--     'agui:{t}:presence:joined' 'agui:{t}:presence:who' 'agui:{t}:presence:v' , '' 99

-- (presence_lib.lua comes first: exp, joined, who, ver, now, now_us, remove, settle)

local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', now)
remove(dead)
local version = settle(#dead > 0)
if version == ARGV[1] then return {version} end
if version == '0' then return {version, 0, {}, {}} end

-- Equal scores come in the order of their members' bytes: (joined, connection).
local ids = redis.call('ZRANGE', joined, 0, ARGV[2])
local packed = {}
for i = 1, #ids, 500 do
  local got = redis.call('HMGET', who, unpack(ids, i, math.min(i + 499, #ids)))
  for j = 1, #got do packed[i + j - 1] = got[j] end
end
return {version, redis.call('ZCARD', exp), ids, packed}
