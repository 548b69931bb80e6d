-- presence_update.lua: refresh, add and remove presence entries of one thread
-- (RedisStore.presence_update, one call per thread in one pipeline).
--
-- "Now" is Redis's TIME, so that the gateways' clocks do not matter for expiry.
-- The version changes when an entry is added, removed (expiry included) or put
-- with other values, not when one is only refreshed: readers poll cheaply with
-- the version they know.
--
-- KEYS[1] exp     <prefix>:{<tag>}:presence:exp (<tag>: keys.py thread_tag)
-- KEYS[2] joined  <prefix>:{<tag>}:presence:joined
-- KEYS[3] who     <prefix>:{<tag>}:presence:who
-- KEYS[4] v       <prefix>:{<tag>}:presence:v
-- ARGV[1] ttl_ms: entries put live this long from now
-- ARGV[2] n, the number of entries put
-- ARGV[3..2+3n] n times: connection id, joined ms, msgpack [subject, joined, client]
-- ARGV[3+3n..] connection ids gone
--
-- Returns the version after the call ("0": no entry left).
--
-- Debugging (connection c1 joins thread t for 15 s, c0 leaves):
--   cat presence_lib.lua presence_update.lua > p.lua; redis-cli --eval p.lua 'agui:{t}:presence:exp' \
--     'agui:{t}:presence:joined' 'agui:{t}:presence:who' 'agui:{t}:presence:v' , \
--     15000 1 c1 1764700000123 packed c0

-- (presence_lib.lua comes first: exp, joined, who, ver, now, now_us, remove, settle)

local dead = redis.call('ZRANGEBYSCORE', exp, '-inf', now)
remove(dead)
local changed = #dead > 0

local n = tonumber(ARGV[2])
for i = 3 + 3 * n, #ARGV do
  if redis.call('ZREM', exp, ARGV[i]) == 1 then
    redis.call('ZREM', joined, ARGV[i])
    redis.call('HDEL', who, ARGV[i])
    changed = true
  end
end
local expires = now + tonumber(ARGV[1])
for i = 3, 2 + 3 * n, 3 do
  local id, packed = ARGV[i], ARGV[i + 2]
  -- A refresh moves the expiry only; a new entry, or one with other values (its
  -- subject or client changed: readers must see it), is written whole.
  if redis.call('ZADD', exp, expires, id) == 1 or redis.call('HGET', who, id) ~= packed then
    changed = true
    redis.call('ZADD', joined, ARGV[i + 1], id)
    redis.call('HSET', who, id, packed)
  end
end

local version = settle(changed)
if version ~= '0' then
  -- The keys live as long as the longest-lived entry (gateways may use different
  -- ttls): a dead gateway's thread leaves nothing behind.
  local last = redis.call('ZRANGE', exp, -1, -1, 'WITHSCORES')
  local ms = string.format('%d', math.max(1, tonumber(last[2]) - now))
  for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ms) end
end
return version
