-- presence_lib.lua: what presence_update.lua and presence_read.lua share; the
-- store puts it in front of each of them when it loads them (scripts.py), so
-- that the two scripts agree on time, removal and versions. To run one with
-- redis-cli --eval, concatenate this file and the script first.

local exp, joined, who, ver = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])

-- In slices: unpack() of a long list overflows Lua's stack.
local function remove(ids)
  for i = 1, #ids, 500 do
    local j = math.min(i + 499, #ids)
    redis.call('ZREM', exp, unpack(ids, i, j))
    redis.call('ZREM', joined, unpack(ids, i, j))
    redis.call('HDEL', who, unpack(ids, i, j))
  end
end
-- The version after a change. A list emptied loses every key (version 0); a
-- version key made anew starts at Redis's time in microseconds, past any value
-- an earlier one of the thread reached (each call adds at most 1 and takes more
-- than a microsecond), so that a reader's known version never matches another
-- list.
local function settle(changed)
  if redis.call('ZCARD', exp) == 0 then
    redis.call('DEL', exp, joined, who, ver)
    return '0'
  end
  if redis.call('EXISTS', ver) == 0 then
    -- With the other keys' expiry: a version must not outlive its list.
    local pttl = redis.call('PTTL', exp)
    redis.call('SET', ver, string.format('%d', now_us))
    if pttl > 0 then redis.call('PEXPIRE', ver, pttl) end
  elseif changed then
    -- Past the clock too: after a failover that lost a write, a replica's
    -- version + 1 could be one a reader already holds for another list.
    local next = math.max(tonumber(redis.call('GET', ver)) + 1, now_us)
    redis.call('SET', ver, string.format('%d', next), 'KEEPTTL')
  end
  return redis.call('GET', ver)
end

