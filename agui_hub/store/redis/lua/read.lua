-- read.lua: a page of one thread on Redis Cluster, atomically in its slot.
--
-- What the single-node store reads in one MULTI (HMGET + XRANGE). On a cluster
-- one MULTI cannot span slots: a batch of threads is read with one call of this
-- script per thread, in one pipeline.
--
-- KEYS[1] stream  <prefix>:{<tag>}:events (<tag>: keys.py thread_tag)
-- KEYS[2] meta    <prefix>:{<tag>}:meta
-- ARGV[1] after: entries after this offset ("": none, only the meta)
-- ARGV[2] count (0: all)
--
-- Returns {epoch or nil, trimmed or nil, entries after `after`}.
--
-- Debugging:
--   redis-cli --eval read.lua 'agui:{t}:events' 'agui:{t}:meta' , 0-0 10

local state = redis.call('HMGET', KEYS[2], 'epoch', 'trimmed')
local entries = {}
if ARGV[1] ~= '' then
  if tonumber(ARGV[2]) > 0 then
    entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
  else
    entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+')
  end
end
return {state[1], state[2], entries}
