-- append.lua: append events to one thread's stream, atomically (RedisStore.append).
--
-- Checks each event id (a retried call returns the original offsets and appends
-- nothing), appends, creates the thread's epoch if it is new (within its
-- tenant's quota of threads), trims by length, age and bytes, refreshes the
-- idle TTL (when a sixteenth of it has passed since the last refresh, or a key
-- was made anew) and notifies live readers. A conditional append first checks that
-- the epoch is the expected one and that no entry follows the expected offset.
-- A stream or ids hash lost under its epoch (eviction, a restore from an older
-- snapshot) gives the thread a new epoch (or rebuilds its ids): nothing rewinds
-- silently. Key layout and entry format: agui_hub/store/redis/keys.py.
--
-- KEYS[1] stream      <prefix>:{<tag>}:events (<tag>: thread_tag below)
-- KEYS[2] meta        <prefix>:{<tag>}:meta
-- KEYS[3] ids         <prefix>:{<tag>}:ids
-- KEYS[4] checkpoint  <prefix>:{<tag>}:checkpoint
-- KEYS[5] tenant      <prefix>:tenant:{<tenant>}, the set of the tenant's threads
--                     (on Redis Cluster the meta key stands in: touched only
--                     when max_tenant_threads is set, which a cluster refuses)
-- KEYS[6] runs        <prefix>:{<tag>}:runs, the index of runs (below)
-- ARGV[1]  epoch candidate (random hex: the epoch if this call makes one)
-- ARGV[2]  max_len (entries; 0: off)
-- ARGV[3]  max_age_ms (0: off)
-- ARGV[4]  ttl_ms (idle time before the thread's keys expire; 0: never)
-- ARGV[5]  notify channel, <prefix>:{<tag>}:notify
-- ARGV[6]  n, the number of events
-- ARGV[7]  expected after: the offset the caller read last ("": unconditional)
-- ARGV[8]  expected epoch ("": none, a new thread)
-- ARGV[9]  ids rebuild limit (longer streams get a new epoch instead)
-- ARGV[10] max_bytes (sum of the entries' event payloads; 0: off)
-- ARGV[11] max_tenant_threads (0: off)
-- ARGV[12] thread id
-- ARGV[13] key prefix
-- ARGV[14] notify_bytes (largest payload total a notification carries; 0: none)
-- ARGV[15] max_runs (runs the index keeps; past it the oldest eighth goes)
-- ARGV[16..] n times: event id, run id ("": the current run), event type,
--          payload (msgpack of the event)
--
-- The index of runs (agui_hub/agui/runs.py has the same rules): a RUN_STARTED
-- with a run id adds its run, once: [parent, "running", its offset, "",
-- preview], the parent being its parentRunId or else the run before it, the
-- preview the start of the last user message of its input; a RUN_FINISHED or
-- RUN_ERROR sets its run's status ("finished", "error", "cancelled" for the
-- code AGUI_HUB_RUN_CANCELLED) and last offset. Trimming leaves the index; a
-- new epoch deletes it.
--
-- Returns {epoch, {offset per event}, status}; {"conflict", status} when the
-- expectation fails; {"too_many_threads", status} when the append would create
-- a thread past its tenant's quota. status: "" or why the thread got a new
-- epoch / was repaired ("stream_lost", "ids_lost", "rewound", "ids_rebuilt").
--
-- Debugging (one event, no retention, thread t):
--   redis-cli --eval append.lua 'agui:{t}:events' 'agui:{t}:meta' 'agui:{t}:ids' \
--     'agui:{t}:checkpoint' 'agui:tenant:{t}' 'agui:{t}:runs' , 5eed 0 0 0 \
--     'agui:{t}:notify' 1 '' '' 100000 0 0 t agui 0 4096 e1 r1 RUN_STARTED payload

-- Offsets are compared as decimal strings (no leading zeros; the store
-- normalises what it passes), so that 20-digit parts compare exactly (tonumber
-- would not). The same functions are in check_position.lua.
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

-- A thread's hash tag, as agui_hub/store/redis/keys.py thread_tag makes it:
-- the id itself unless it has a '}', else a space and the id with '%' written
-- '%25' and '}' written '%7D' (the tenant set holds ids, its prune needs keys).
local function thread_tag(thread)
  if not string.find(thread, '}', 1, true) then return thread end
  local escaped = string.gsub(thread, '%%', '%%25')
  escaped = string.gsub(escaped, '}', '%%7D')
  return ' ' .. escaped
end

local stream, meta, ids, checkpoint = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local max_len, max_age_ms, ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local channel, n = ARGV[5], tonumber(ARGV[6])
local expect_after, expect_epoch = ARGV[7], ARGV[8]
local rebuild_limit = tonumber(ARGV[9])
local max_bytes, max_threads = tonumber(ARGV[10]), tonumber(ARGV[11])
local thread, prefix = ARGV[12], ARGV[13]
local notify_bytes = tonumber(ARGV[14])
local max_runs = tonumber(ARGV[15])
local PRUNE_SAMPLE = 64
local tenant, runs = KEYS[5], KEYS[6]
local FIRST = 16
-- Bytes of a run's preview (agui_hub/agui/runs.py PREVIEW_BYTES; the reader
-- drops a character cut in two).
local PREVIEW_BYTES = 160

local state = redis.call('HMGET', meta, 'epoch', 'run', 'last', 'trimmed', 'ids', 'bytes',
  'expires')
local epoch, run, last, trimmed, has_ids = state[1], state[2] or '', state[3], state[4], state[5]
-- When the keys' TTL was last refreshed to end (ms since the epoch; false: unknown).
local expires = state[7]
-- Whether the ids hash held ids before this append (if not, a new one gets a TTL).
local had_ids = has_ids
-- Bytes of the stored entries' payloads. Kept in a local and written once at
-- the end: the common append costs one HSET more, whatever it trims.
local has_bytes = state[6]
local total = tonumber(state[6]) or 0
local stored_total = total
local status = ''

-- The size of an entry's event payload (what max_bytes counts).
local function payload_size(fields)
  if fields[1] == 'event' then return #fields[2] end  -- the layout this script writes
  for j = 1, #fields, 2 do
    if fields[j] == 'event' then return #fields[j + 1] end
  end
  return 0
end

-- A rewind (what readers saw is no longer stored, under the same epoch) becomes
-- a new epoch, so that every reader resyncs instead of silently diverging.
local function new_epoch(reason)
  epoch = ARGV[1]
  status = reason
  redis.call('HSET', meta, 'epoch', epoch)
  redis.call('DEL', checkpoint, runs)
  redis.call('PUBLISH', channel, 'rewound')
end

-- The stream's newest entry before this append (false: none). One read that
-- answers, in the common case, whether the entry appended last is still
-- stored, whether anything follows an expected offset, and what the new
-- entries follow (for the notification): each would otherwise be a read.
local newest_stored = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
local tip = newest_stored and newest_stored[1] or false

-- Whether the entry at `offset` is still stored or was removed by retention.
local function kept(offset)
  if trimmed and cmp(offset, trimmed) <= 0 then return true end
  if offset == tip then return true end
  return #redis.call('XRANGE', stream, offset, offset) > 0
end

if epoch then
  if last then
    local present
    if last == tip then
      present = true
    elseif trimmed and cmp(last, trimmed) <= 0 then
      present = redis.call('EXISTS', stream) == 1
    else
      present = #redis.call('XRANGE', stream, last, last) > 0
    end
    if not present then
      -- The newest entry appended here is gone: the stream was evicted (and
      -- maybe re-created by a plain XADD). Its ids and trim mark go with it.
      redis.call('HDEL', meta, 'trimmed', 'last', 'ids', 'bytes')
      redis.call('DEL', ids)
      trimmed, last, has_ids = false, false, false
      total, stored_total, has_bytes = 0, 0, false
      new_epoch('stream_lost')
    end
  end
  if has_ids and redis.call('EXISTS', ids) == 0 then
    -- The ids hash alone was evicted: rebuild it from the stream, so that a
    -- retried event is still recognised; too long a stream: a new epoch.
    if redis.call('XLEN', stream) <= rebuild_limit then
      local from = '-'
      while true do
        local page = redis.call('XRANGE', stream, from, '+', 'COUNT', 1000)
        for _, entry in ipairs(page) do
          local fields = entry[2]
          for j = 1, #fields, 2 do
            if fields[j] == 'id' then
              redis.call('HSET', ids, fields[j + 1], entry[1])
              break
            end
          end
        end
        if #page < 1000 then break end
        from = '(' .. page[#page][1]
      end
      if redis.call('EXISTS', ids) == 0 then redis.call('HDEL', meta, 'ids') end
      status = 'ids_rebuilt'
    else
      redis.call('HDEL', meta, 'ids')
      new_epoch('ids_lost')
    end
  end
end

if expect_after ~= '' then
  if (epoch or '') ~= expect_epoch then return {'conflict', status} end
  if epoch and expect_after ~= '0-0' and not kept(expect_after) then
    -- The caller read an entry that is no longer stored (Redis restarted from
    -- an older snapshot): the thread was rewound under it.
    new_epoch('rewound')
    return {'conflict', status}
  end
  -- Any entry after the expected offset was appended by someone else (by
  -- this script or a plain XADD), or by an earlier try of this very call
  -- whose reply was lost: either way the caller must read it first.
  if tip and cmp(tip, expect_after) > 0 then
    return {'conflict', status}
  end
end
-- The tenant's quota of threads, checked only when this append creates the
-- thread (no epoch) or re-creates its stream (no entry appended in this
-- epoch): an append to a thread with entries is never refused.
if max_threads > 0 and (not epoch or not last)
    and redis.call('SISMEMBER', tenant, thread) == 0 then
  if redis.call('SCARD', tenant) >= max_threads then
    -- At the limit: first forget threads that are gone (expired by their ttl).
    -- At most PRUNE_SAMPLE of them per call, picked at random, whatever the
    -- quota: a client that keeps trying at its limit costs Redis little, and
    -- repeated tries find every expired thread (small quotas: at once).
    for _, member in ipairs(redis.call('SRANDMEMBER', tenant, PRUNE_SAMPLE)) do
      if redis.call('EXISTS', prefix .. ':{' .. thread_tag(member) .. '}:events') == 0 then
        redis.call('SREM', tenant, member)
      end
    end
    if redis.call('SCARD', tenant) >= max_threads then
      return {'too_many_threads', status}
    end
  end
  redis.call('SADD', tenant, thread)
end

if epoch and not has_bytes then
  -- A thread stored before the byte total was kept, created by a plain XADD,
  -- or whose stream was lost: count what its stream holds, once (up to the
  -- same bound as the ids rebuild; a longer stream counts from 0).
  total, stored_total = 0, -1
  if redis.call('XLEN', stream) <= rebuild_limit then
    local from = '-'
    while true do
      local page = redis.call('XRANGE', stream, from, '+', 'COUNT', 1000)
      for _, entry in ipairs(page) do total = total + payload_size(entry[2]) end
      if #page < 1000 then break end
      from = '(' .. page[#page][1]
    end
  end
end

if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', meta, 'epoch', epoch)
end

-- The notification carries the new entries when they are small enough (the
-- live readers then need no read), with the offset they follow: a reader
-- whose cursor is exactly there has everything before them. Not after a new
-- epoch or a repair: readers resync by reading.
local carry = notify_bytes > 0 and status == ''
local prev, carried = '0-0', {}
if carry then
  local incoming = 0
  for i = 0, n - 1 do incoming = incoming + #ARGV[FIRST + i * 4 + 3] end
  if incoming > notify_bytes then
    carry = false
  elseif tip then
    prev = tip
  end
end

-- The index of runs (see the top): what a run's RUN_STARTED says of it.
local function preview_of(event)
  local input = event['input']
  if type(input) ~= 'table' or type(input['messages']) ~= 'table' then return '' end
  local messages = input['messages']
  for j = #messages, 1, -1 do
    local message = messages[j]
    if type(message) == 'table' and message['role'] == 'user' then
      local content = message['content']
      if type(content) == 'string' then return string.sub(content, 1, PREVIEW_BYTES) end
      if type(content) == 'table' then
        for _, part in ipairs(content) do
          if type(part) == 'table' and part['type'] == 'text' and type(part['text']) == 'string' then
            return string.sub(part['text'], 1, PREVIEW_BYTES)
          end
        end
      end
      return ''
    end
  end
  return ''
end

local function prune_runs()
  local all, order = redis.call('HGETALL', runs), {}
  for j = 1, #all, 2 do
    local ok, record = pcall(cmsgpack.unpack, all[j + 1])
    local first = ok and type(record) == 'table' and record[3] or '0-0'
    order[#order + 1] = {all[j], first}
  end
  table.sort(order, function(a, b) return cmp(a[2], b[2]) < 0 end)
  for j = 1, #order - max_runs + math.floor(max_runs / 8) do
    redis.call('HDEL', runs, order[j][1])
  end
end

local function index_start(run_id, before, payload, offset)
  if redis.call('HEXISTS', runs, run_id) == 1 then return end
  local parent, preview = '', ''
  local ok, event = pcall(cmsgpack.unpack, payload)
  if ok and type(event) == 'table' then
    if type(event['parentRunId']) == 'string' then parent = event['parentRunId'] end
    preview = preview_of(event)
  end
  if parent == '' then parent = before end
  redis.call('HSET', runs, run_id, cmsgpack.pack({parent, 'running', offset, '', preview}))
  if ttl_ms > 0 then redis.call('PEXPIRE', runs, ttl_ms) end
  if redis.call('HLEN', runs) > max_runs then prune_runs() end
end

local function index_end(run_id, event_type, payload, offset)
  local known = redis.call('HGET', runs, run_id)
  if not known then return end
  local ok, record = pcall(cmsgpack.unpack, known)
  if not ok or type(record) ~= 'table' then return end
  local status = 'finished'
  if event_type == 'RUN_ERROR' then
    status = 'error'
    local decoded, event = pcall(cmsgpack.unpack, payload)
    if decoded and type(event) == 'table' and event['code'] == 'AGUI_HUB_RUN_CANCELLED' then
      status = 'cancelled'
    end
  end
  record[2], record[4] = status, offset
  redis.call('HSET', runs, run_id, cmsgpack.pack(record))
end

local offsets, added, newest, first_new = {}, 0, nil, nil
for i = 0, n - 1 do
  local base = FIRST + i * 4
  local event_id, run_id = ARGV[base], ARGV[base + 1]
  local event_type, payload = ARGV[base + 2], ARGV[base + 3]
  local known = redis.call('HGET', ids, event_id)
  if known then
    offsets[#offsets + 1] = known
  else
    local before = false
    if event_type == 'RUN_STARTED' and run_id ~= '' then
      before = run
      run = run_id
      redis.call('HSET', meta, 'run', run)
    end
    if run_id == '' then run_id = run end
    local offset = redis.call('XADD', stream, '*',
      'event', payload, 'id', event_id, 'run', run_id, 'type', event_type)
    redis.call('HSET', ids, event_id, offset)
    if before then
      index_start(run_id, before, payload, offset)
    elseif (event_type == 'RUN_FINISHED' or event_type == 'RUN_ERROR') and run_id ~= '' then
      index_end(run_id, event_type, payload, offset)
    end
    offsets[#offsets + 1] = offset
    newest = offset
    first_new = first_new or offset
    added = added + 1
    total = total + #payload
    if carry then
      local k = #carried
      carried[k + 1], carried[k + 2], carried[k + 3] = offset, event_id, run_id
      carried[k + 4], carried[k + 5] = event_type, payload
    end
  end
end

-- Retention: forget the ids of trimmed entries, remember the last trimmed offset,
-- take their payloads off the total.
local trimmed_now, ids_gone = trimmed, false
local function forget(entries)
  trimmed_now = entries[#entries][1]
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    total = total - payload_size(fields)
    for j = 1, #fields, 2 do
      if fields[j] == 'id' then
        redis.call('HDEL', ids, fields[j + 1])
        break
      end
    end
  end
  redis.call('HSET', meta, 'trimmed', entries[#entries][1])
  if redis.call('EXISTS', ids) == 0 then
    redis.call('HDEL', meta, 'ids')
    ids_gone = true
  end
end

if max_len > 0 then
  local excess = redis.call('XLEN', stream) - max_len
  if excess > 0 then
    local old = redis.call('XRANGE', stream, '-', '+', 'COUNT', excess)
    forget(old)
    redis.call('XTRIM', stream, 'MAXLEN', max_len)
  end
end
-- Redis's clock in ms, read once per call (age retention and the TTL both need it).
local clock_ms
local function now_ms()
  if not clock_ms then
    local now = redis.call('TIME')
    clock_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  end
  return clock_ms
end

if max_age_ms > 0 then
  local cutoff = now_ms() - max_age_ms
  local bound = '(' .. string.format('%d', cutoff) .. '-0'
  local old = redis.call('XRANGE', stream, '-', bound, 'COUNT', 1000)
  if #old > 0 then
    forget(old)
    local last_ms, last_seq = string.match(old[#old][1], '^(%d+)-(%d+)$')
    local next_id = last_ms .. '-' .. string.format('%d', tonumber(last_seq) + 1)
    redis.call('XTRIM', stream, 'MINID', next_id)
  end
end
if max_bytes > 0 and total > max_bytes then
  -- Oldest first until the total fits, never an entry of this append (one
  -- larger than max_bytes on its own is kept). Pages grow from 1 entry (the
  -- common case: one old entry makes room) to BYTES_PAGE, so that little is
  -- read beyond what is trimmed; at most 1024 entries are read per call
  -- (Redis is not blocked long), later appends go on where this one stopped.
  local BYTES_PAGE, budget, size = 256, 1024, 1
  while total > max_bytes and budget > 0 do
    local count = math.min(size, budget)
    local page = redis.call('XRANGE', stream, '-', '+', 'COUNT', count)
    budget = budget - #page
    local cut, left, done = {}, total, #page < count
    for _, entry in ipairs(page) do
      if left <= max_bytes or (first_new and cmp(entry[1], first_new) >= 0) then
        done = true
        break
      end
      cut[#cut + 1] = entry
      left = left - payload_size(entry[2])
    end
    if #cut > 0 then
      forget(cut)  -- takes their payloads off `total`
      -- Exactly the entries read: the oldest #cut of the stream.
      redis.call('XTRIM', stream, 'MAXLEN', redis.call('XLEN', stream) - #cut)
    end
    if done then break end
    size = math.min(size * 2, BYTES_PAGE)
  end
end
-- Entries written with a plain XADD since the thread was counted are taken off
-- when trimmed, never added: the total never goes below 0.
if total < 0 then total = 0 end
if newest then
  -- 'last': what the rewind checks above compare with; 'ids': the ids hash
  -- holds ids (unless this very append trimmed them all away).
  local bytes = string.format('%d', total)
  if ids_gone then
    redis.call('HSET', meta, 'last', newest, 'bytes', bytes)
  else
    redis.call('HSET', meta, 'last', newest, 'ids', '1', 'bytes', bytes)
  end
elseif total ~= stored_total then
  redis.call('HSET', meta, 'bytes', string.format('%d', total))
end

if ttl_ms > 0 then
  -- A PEXPIRE of each key on every append was most of what a small append cost
  -- beyond its XADD: the TTL is refreshed once a sixteenth of it has passed
  -- (so a thread expires between 15/16 ttl and ttl after its last append),
  -- and at once when a key may have been made without one (a new thread, a
  -- new stream or ids hash, a repair).
  local fresh = not expires or not had_ids or not tip or status ~= ''
  if fresh or tonumber(expires) - now_ms() < ttl_ms - math.floor(ttl_ms / 16) then
    redis.call('PEXPIRE', stream, ttl_ms)
    redis.call('PEXPIRE', meta, ttl_ms)
    redis.call('PEXPIRE', ids, ttl_ms)
    redis.call('PEXPIRE', runs, ttl_ms)
    redis.call('HSET', meta, 'expires', string.format('%d', now_ms() + ttl_ms))
  end
end
if added > 0 then
  if carry and not (trimmed_now and cmp(trimmed_now, first_new) >= 0) then
    redis.call('PUBLISH', channel, cmsgpack.pack({1, epoch, prev, carried}))
  else
    redis.call('PUBLISH', channel, offsets[#offsets])
  end
end
return {epoch, offsets, status}
