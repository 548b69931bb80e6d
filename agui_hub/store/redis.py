"""The Redis thread store (``redis://``, ``rediss://``): one stream per thread.

On Redis Cluster (``redis+cluster://``, ``rediss+cluster://``) the same store
runs each thread's scripts on its slot's master; :mod:`agui_hub.store.cluster`
holds what differs there (docs/cluster.md).

Keys of one thread share the ``{thread}`` hash tag, so they live in one Redis
Cluster slot and one Lua script may touch them all (``agui`` is the default
prefix)::

    agui:{<thread>}:events   stream: one entry per event (see the entry format below)
    agui:{<thread>}:meta     hash: epoch, run (current run id), trimmed (last trimmed
                             offset), last (last offset appended), ids ("1": ids kept),
                             bytes (sum of the stored entries' event payload sizes)
    agui:{<thread>}:ids      hash: event id -> offset, for idempotent publishing
    agui:{<thread>}:notify   pub/sub channel: "new entries": the entries themselves
                             (see _CARRIED) or the last offset
    agui:tenant:{<tenant>}   set: the tenant's threads (only with max_tenant_threads;
                             never on Redis Cluster, which refuses that option)

Entry format (fields of each stream entry, values are bytes):

    event   msgpack of the event's canonical wire dict (camelCase, no null optionals)
    id      the producer's event id (idempotency key)
    run     the run id the event belongs to ("" when unknown)
    type    the event type, e.g. TEXT_MESSAGE_CONTENT

Publishing (:meth:`RedisStore.append`) is one Lua script: it checks each event
id, appends, creates the epoch if the thread is new (within its tenant's quota of
threads), trims by length, age and bytes, refreshes the idle TTL and notifies
live readers, atomically. A retried call
with the same event ids returns the original offsets and appends nothing, so
redis-py's automatic retries cannot duplicate an event. A conditional append
(``expect``) first checks, in the same script, that the epoch is the expected
one and that no entry follows the expected offset. The script also detects a
stream or ids hash lost under its epoch (eviction) and gives the thread a new
epoch (or rebuilds the ids), so that nothing rewinds silently.

Live tail: one reader per store object (per process) serves every thread that
has local subscribers. It keeps one pub/sub connection and subscribes to a
thread's notify channel while the thread has subscribers. A notification from
the append script carries the new entries (up to ``notify_bytes`` of events)
and the offset they follow: when that is the reader's cursor, the reader
delivers them as they are, with no read. Otherwise (a larger append, a missed
notification, a plain producer's notification, which may say anything) it
reads the new entries with XRANGE after an explicit last-seen offset (never
``$``), batched in one pipeline for all notified threads. Adding
or removing a thread sends SUBSCRIBE / UNSUBSCRIBE on the same connection: no
blocking read is cancelled, no connection opened. Commands go through one
bounded connection pool, so a process holds the same number of Redis
connections for 1 or 10,000 live threads. The reader PINGs a silent pub/sub
connection (a stalled Redis just goes quiet), and after a reconnect checks
that the entry at each cursor is still stored (a restore from an older RDB
snapshot rolls streams back under their epoch).

Every operation a caller awaits is bounded by ``op_timeout``; see
docs/store.md for the whole contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import math
import secrets
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import msgpack
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    NoScriptError,
    RedisClusterException,
    RedisClusterUnreachableError,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import (
    AppendConflict,
    OffsetExpired,
    StoreError,
    StoreUnavailable,
    TooManyThreads,
)
from .contract import (
    PAGE_SIZE,
    START,
    Available,
    Checkpoint,
    Entry,
    EventInput,
    Expected,
    FeedSubscription,
    Offset,
    Retention,
    ThreadInfo,
    check_thread,
    encode_event_data,
    offset_key,
    tenant_of,
    too_many_threads,
)
from .urls import (
    _OWN_OPTIONS,
    DEFAULT_OP_TIMEOUT,
    DEFAULT_OUTAGE_GRACE,
    check_redis_options,
    redact_url,
)

if TYPE_CHECKING:
    from .cluster import ClusterLiveReader, ClusterOps

__all__ = ["CLUSTER_SCHEMES", "RedisStore"]

CLUSTER_SCHEMES = frozenset({"redis+cluster", "rediss+cluster"})
"""URL schemes of a Redis Cluster (see :mod:`agui_hub.store.cluster`)."""

log = logging.getLogger("agui_hub.redis_store")

T = TypeVar("T")

# -- key names -------------------------------------------------------------------------


def stream_key(prefix: str, thread: str) -> str:
    return f"{prefix}:{{{thread}}}:events"


def meta_key(prefix: str, thread: str) -> str:
    return f"{prefix}:{{{thread}}}:meta"


def ids_key(prefix: str, thread: str) -> str:
    return f"{prefix}:{{{thread}}}:ids"


def checkpoint_key(prefix: str, thread: str) -> str:
    return f"{prefix}:{{{thread}}}:checkpoint"


def notify_channel(prefix: str, thread: str) -> str:
    return f"{prefix}:{{{thread}}}:notify"


def tenant_key(prefix: str, tenant: str) -> str:
    """The set of *tenant*'s thread ids (see :func:`~agui_hub.store.tenant_of`)."""
    return f"{prefix}:tenant:{{{tenant}}}"


# -- scripts -----------------------------------------------------------------------------

# Offsets compared in Lua: as decimal strings (no leading zeros; Python normalises
# what it passes), so that 20-digit parts compare exactly (tonumber would not).
_LUA_CMP = """
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
"""

# KEYS: stream, meta, ids, checkpoint, tenant (the set of the tenant's threads)
# ARGV: epoch candidate, max_len, max_age_ms, ttl_ms, channel, n,
#       expected after ("" appends unconditionally), expected epoch ("" for none),
#       ids rebuild limit, max_bytes, max_tenant_threads, thread id, key prefix,
#       notify_bytes, then n times: event id, run id, type, msgpack payload
# Returns: {epoch, {offset per event}, status}, {"conflict", status} when the
# expectation fails, or {"too_many_threads", status} when the append would create
# a thread past its tenant's quota. status: "" or why the thread got a new epoch
# / was repaired ("stream_lost", "ids_lost", "rewound", "ids_rebuilt").
APPEND_SCRIPT = (
    _LUA_CMP
    + """
local stream, meta, ids, checkpoint = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local max_len, max_age_ms, ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local channel, n = ARGV[5], tonumber(ARGV[6])
local expect_after, expect_epoch = ARGV[7], ARGV[8]
local rebuild_limit = tonumber(ARGV[9])
local max_bytes, max_threads = tonumber(ARGV[10]), tonumber(ARGV[11])
local thread, prefix = ARGV[12], ARGV[13]
local notify_bytes = tonumber(ARGV[14])
local PRUNE_SAMPLE = 64
local tenant = KEYS[5]
local FIRST = 15

local state = redis.call('HMGET', meta, 'epoch', 'run', 'last', 'trimmed', 'ids', 'bytes')
local epoch, run, last, trimmed, has_ids = state[1], state[2] or '', state[3], state[4], state[5]
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
  redis.call('DEL', checkpoint)
  redis.call('PUBLISH', channel, 'rewound')
end

-- Whether the entry at `offset` is still stored or was removed by retention.
-- The stream's newest entry before this append (false: none). One read that
-- answers, in the common case, whether the entry appended last is still
-- stored, whether anything follows an expected offset, and what the new
-- entries follow (for the notification): each would otherwise be a read.
local newest_stored = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
local tip = newest_stored and newest_stored[1] or false

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
      if redis.call('EXISTS', prefix .. ':{' .. member .. '}:events') == 0 then
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

local offsets, added, newest, first_new = {}, 0, nil, nil
for i = 0, n - 1 do
  local base = FIRST + i * 4
  local event_id, run_id = ARGV[base], ARGV[base + 1]
  local event_type, payload = ARGV[base + 2], ARGV[base + 3]
  local known = redis.call('HGET', ids, event_id)
  if known then
    offsets[#offsets + 1] = known
  else
    if event_type == 'RUN_STARTED' and run_id ~= '' then
      run = run_id
      redis.call('HSET', meta, 'run', run)
    end
    if run_id == '' then run_id = run end
    local offset = redis.call('XADD', stream, '*',
      'event', payload, 'id', event_id, 'run', run_id, 'type', event_type)
    redis.call('HSET', ids, event_id, offset)
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
if max_age_ms > 0 then
  local now = redis.call('TIME')
  local cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - max_age_ms
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
  redis.call('PEXPIRE', stream, ttl_ms)
  redis.call('PEXPIRE', meta, ttl_ms)
  redis.call('PEXPIRE', ids, ttl_ms)
end
if added > 0 then
  if carry and not (trimmed_now and cmp(trimmed_now, first_new) >= 0) then
    redis.call('PUBLISH', channel, cmsgpack.pack({1, epoch, prev, carried}))
  else
    redis.call('PUBLISH', channel, offsets[#offsets])
  end
end
return {epoch, offsets, status}
"""
)

# KEYS: stream, meta, checkpoint; ARGV: cursor, epoch seen, epoch candidate, channel.
# The live reader runs it for each live thread after it reconnected: if the
# entry at the cursor (an entry it has read) is neither stored nor trimmed, the
# stream was rolled back under the same epoch (Redis restarted from an older
# RDB snapshot, a replica promoted): the thread gets a new epoch, announced on
# its channel. Returns {current epoch or "", 1 if it made a new one else 0}.
CHECK_POSITION_SCRIPT = (
    _LUA_CMP
    + """
local state = redis.call('HMGET', KEYS[2], 'epoch', 'trimmed')
local epoch, trimmed = state[1], state[2]
if not epoch or epoch ~= ARGV[2] then return {epoch or '', 0} end
if trimmed and cmp(ARGV[1], trimmed) <= 0 then return {epoch, 0} end
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) > 0 then return {epoch, 0} end
redis.call('HSET', KEYS[2], 'epoch', ARGV[3])
redis.call('DEL', KEYS[3])
redis.call('PUBLISH', ARGV[4], 'rewound')
return {ARGV[3], 1}
"""
)

IDS_REBUILD_LIMIT = 100_000
"""Streams up to this long get their evicted ids hash rebuilt by the append
script; a longer one gets a new epoch instead (a rebuild would block Redis).
The same bound applies to counting the payload bytes of a stream that has no
byte total yet (written before it was kept, or by a plain XADD)."""


# KEYS: checkpoint, meta; ARGV: offset, epoch, events, complete, ttl_ms.
# Writes only for the thread's current epoch and only forward: a slower
# gateway never replaces a later checkpoint with an older one.
CHECKPOINT_SCRIPT = """
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
"""


def _text(value: Any) -> str:
    """A reply value as text; never raises (bytes that are not UTF-8 are replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _entry(raw: Sequence[Any]) -> Entry:
    """An Entry from one raw XRANGE item: ``[id, [field, value, ...]]``.

    Never raises, whatever a producer wrote with a plain XADD: a missing
    ``event`` field gives empty data, an id or type that is not UTF-8 is
    decoded with replacement characters. One odd entry must not fail a read
    (nor the live reader's batch of many threads).
    """
    try:
        offset = _text(raw[0])
        fields = raw[1]
        if type(fields) is dict:  # a client whose XRANGE reply was parsed into a map
            fields = [x for pair in fields.items() for x in pair]
        if (
            len(fields) == 8
            and fields[0] == b"event"
            and fields[2] == b"id"
            and fields[4] == b"run"
            and fields[6] == b"type"
        ):
            # The layout the append script writes: event, id, run, type.
            # (try, not contextlib.suppress: no object made per entry on a hot path)
            try:
                run = fields[5]
                return Entry(
                    offset,
                    fields[1],
                    fields[3].decode(),
                    run.decode() if run else None,
                    fields[7].decode(),
                )
            except (UnicodeDecodeError, AttributeError):
                pass
        data: Any = b""
        event_id: Any = None
        run_id: Any = None
        event_type: Any = None
        for i in range(0, len(fields) - 1, 2):
            name = fields[i]
            if name == b"event":
                data = fields[i + 1]
            elif name == b"id":
                event_id = fields[i + 1]
            elif name == b"run":
                run_id = fields[i + 1]
            elif name == b"type":
                event_type = fields[i + 1]
        return Entry(
            offset,
            data if isinstance(data, bytes) else _text(data).encode(),
            _text(event_id) if event_id is not None else offset,
            _text(run_id) if run_id else None,
            _text(event_type) if event_type is not None else "",
        )
    except Exception:  # pragma: no cover - Redis replies always have this shape
        log.warning("redis store: unreadable stream entry %r", raw, exc_info=True)
        offset = _text(raw[0]) if isinstance(raw, (list, tuple)) and raw else START
        return Entry(offset, b"", offset, None, "")


def _raw_reply(response: Any, **options: Any) -> Any:
    return response


def _normal(offset: Offset) -> Offset:
    """*offset* validated and in Redis's spelling (no leading zeros)."""
    ms, seq = offset_key(offset)
    return f"{ms}-{seq}"


_MAX_OFFSET = (2**64 - 1, 2**64 - 1)


class _Interrupted(Exception):
    """The registration a subscription waited on was cancelled: register again."""


@dataclass(frozen=True, slots=True)
class _Page:
    """One read of a thread: its epoch, last trimmed offset and entries after a cursor."""

    epoch: str | None
    trimmed: Offset | None
    entries: list[Entry]

    def expired(self, after: Offset) -> bool:
        """Whether events after *after* were trimmed away."""
        return self.trimmed is not None and offset_key(after) < offset_key(self.trimmed)


# -- the live reader ------------------------------------------------------------------------


@dataclass
class _Feed:
    """One thread with local subscribers."""

    cursor: Offset
    subs: set[FeedSubscription] = field(default_factory=set)
    epoch: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None


OUTAGE_GRACE = DEFAULT_OUTAGE_GRACE
"""Default seconds the live reader keeps reconnecting before it fails its
subscriptions with StoreUnavailable (so that a gateway can tell its clients to
come back later)."""

SILENCE = 1.0
"""Seconds without a message on the pub/sub connection after which the live
reader sends a PING there, to tell a quiet thread from a stalled Redis."""

PONG_DEADLINE = 2.0
"""Seconds the PING may take (at most ``op_timeout``) before the live reader
takes the connection for dead and reconnects."""

_PING_TOKEN = "agui-hub-live"

_NOT_ENOUGH_DATA: Any = False
"""What redis-py's hiredis reader returns when no whole reply is buffered."""
with contextlib.suppress(ImportError):
    pass

_CARRIED = b"\x94\x01"
"""How a notification that carries its entries begins: msgpack of
``[1, epoch, offset before them, [offset, id, run, type, payload, ...]]``."""


class _Stalled(StoreUnavailable):
    """The pub/sub connection went silent and did not answer a PING."""

    def __init__(self, message: str, since: float) -> None:
        super().__init__(message)
        self.since = since


class _LiveReader:
    """Serves every live thread of one store from one pub/sub connection.

    On Redis Cluster one of these serves the threads of one master, over sharded
    pub/sub (see :mod:`agui_hub.store.cluster`): the hooks below
    (:meth:`_new_pubsub`, :meth:`_subscribe_channels`,
    :meth:`_unsubscribe_channel` and the message kinds) are what differs.
    """

    _MESSAGE = "message"
    """The kind of a notification (``smessage`` for sharded pub/sub)."""
    _MESSAGE_BYTES = b"message"
    _SUBSCRIBED = "subscribe"
    """The kind of a subscription's confirmation (``ssubscribe`` for sharded pub/sub)."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._feeds: dict[str, _Feed] = {}
        self._channels: dict[bytes, str] = {}
        self._dirty: set[str] = set()
        self._recheck: set[str] = set()
        """Threads subscribed again after a reconnect: check their cursors first."""
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # SUBSCRIBE / UNSUBSCRIBE / reconnect never overlap on the pub/sub
        # connection; reading messages goes on meanwhile.
        self._pubsub_lock = asyncio.Lock()
        self._chores: set[asyncio.Future[None]] = set()  # pending UNSUBSCRIBEs, closes
        self._heard = 0.0
        """Loop time the pub/sub connection last delivered something."""
        self._ping_sent: float | None = None
        """Loop time of the PING not answered yet (``None``: none outstanding)."""

    @property
    def threads(self) -> int:
        return len(self._feeds)

    @property
    def _pong_deadline(self) -> float:
        return min(PONG_DEADLINE, self._store.op_timeout)

    async def register(self, sub: FeedSubscription) -> None:
        """Serve *sub*'s thread live; bounded by the store's ``op_timeout``."""
        try:
            async with asyncio.timeout(self._store.op_timeout):
                await self._register(sub)
        except TimeoutError:
            raise self._store._timed_out(f"the subscription to thread {sub.thread!r}") from None

    async def _register(self, sub: FeedSubscription) -> None:
        # A registration that another one was waiting on can be cancelled (its
        # client went away): the waiters then register afresh rather than fail.
        while not await self._register_once(sub):
            # Never a busy loop, whatever state the thread's feed is in: the
            # caller's deadline must be able to fire.
            await asyncio.sleep(0)

    async def _register_once(self, sub: FeedSubscription) -> bool:
        """Register *sub*; ``False`` when the registration it waited on was cancelled."""
        thread = sub.thread
        feed = self._feeds.get(thread)
        if feed is None:
            feed = self._feeds[thread] = _Feed(cursor=START)
            feed.subs.add(sub)  # before any await: the confirmation may come first
            channel = notify_channel(self._store.prefix, thread)
            try:
                # Cursor first, then SUBSCRIBE; once the subscription is confirmed
                # the reader reads after the cursor, covering the window between.
                feed.cursor = await self._store.last_offset(thread)
                self._channels[channel.encode()] = thread
                self._ensure_running()
                async with self._pubsub_lock:
                    await self._store._call(self._subscribe_channels([channel]))
            except BaseException as exc:
                feed.subs.discard(sub)
                if self._feeds.get(thread) is feed:
                    self._drop(thread, unsubscribe=True)
                if not feed.ready.is_set():
                    # Concurrent registrations of the thread fail too with a store
                    # error; this task's cancellation is its own: they try again.
                    feed.error = exc if isinstance(exc, Exception) else _Interrupted()
                    feed.ready.set()
                raise
        else:
            feed.subs.add(sub)
        try:
            await feed.ready.wait()
        except BaseException:
            # Timed out or cancelled before the confirmation: leave nothing behind.
            feed.subs.discard(sub)
            if not feed.ready.is_set() and not feed.subs and self._feeds.get(thread) is feed:
                self._drop(thread, unsubscribe=True)
                feed.error = StoreUnavailable(f"subscribing to thread {thread!r} was interrupted")
                feed.ready.set()
            raise
        if feed.error is not None:
            feed.subs.discard(sub)
            if self._feeds.get(thread) is feed:
                # A failed feed is never reused: the next registration starts afresh.
                self._drop(thread, unsubscribe=True)
            if isinstance(feed.error, _Interrupted):
                return False
            raise feed.error
        return True

    def unregister(self, sub: FeedSubscription) -> None:
        feed = self._feeds.get(sub.thread)
        if feed is None:
            return
        feed.subs.discard(sub)
        if not feed.subs and feed.ready.is_set():
            self._drop(sub.thread, unsubscribe=True)

    def _drop(self, thread: str, *, unsubscribe: bool = False) -> None:
        self._feeds.pop(thread, None)
        channel = notify_channel(self._store.prefix, thread)
        self._channels.pop(channel.encode(), None)
        self._dirty.discard(thread)
        if unsubscribe and self._pubsub is not None and not self._closed:
            self._chore(self._unsubscribe(channel))

    def _chore(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)
        task.add_done_callback(_log_failure)

    async def _unsubscribe(self, channel: str) -> None:
        # Best effort: a pub/sub connection replaced after an outage may be gone.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._store.op_timeout), self._pubsub_lock:
                if self._closed or channel.encode() in self._channels:
                    return  # closing, or the thread became live again meanwhile
                await _bounded(self._unsubscribe_channel(channel), self._store.op_timeout)

    def _new_pubsub(self) -> Any:
        """A pub/sub object (its connection opens with its first command)."""
        return self._store._client.pubsub()

    async def _subscribe_channels(self, channels: Sequence[str]) -> None:
        """Subscribe the pub/sub connection to *channels* (confirmations come as
        messages of kind :attr:`_SUBSCRIBED`)."""
        await self._pubsub.subscribe(*channels)

    async def _unsubscribe_channel(self, channel: str) -> None:
        await self._pubsub.unsubscribe(channel)

    def _ensure_running(self) -> None:
        if self._pubsub is None:
            self._pubsub = self._new_pubsub()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="agui-hub redis live reader")

    def _fail_all(self, error: BaseException) -> None:
        for thread, feed in list(self._feeds.items()):
            if not feed.ready.is_set():
                # Still waiting for its SUBSCRIBE to be confirmed: fail the waiters.
                self._drop(thread, unsubscribe=True)
                feed.error = error
                feed.ready.set()
                continue
            for sub in list(feed.subs):
                sub._fail(error)

    async def _run(self) -> None:
        delay = 0.05
        down_since: float | None = None
        reconnect = False
        loop = asyncio.get_running_loop()
        store = self._store
        while not self._closed:
            try:
                if reconnect:
                    # Bounded: a half-open or stalled connection must not hang the
                    # reader, nor keep it from failing its subscriptions in time.
                    timeout = store.op_timeout
                    if down_since is not None:
                        left = store.outage_grace - (loop.time() - down_since)
                        timeout = max(0.1, min(timeout, left + 0.05))
                    await _bounded(self._resubscribe(), timeout)
                    reconnect = False
                await self._pump()
                delay, down_since = 0.05, None
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError, StoreUnavailable) as exc:
                now = loop.time()
                if down_since is None:
                    down_since = exc.since if isinstance(exc, _Stalled) else now
                reason = str(exc) or type(exc).__name__
                if now - down_since >= store.outage_grace:
                    self._fail_all(
                        StoreUnavailable(
                            f"Redis at {store.url} is unavailable "
                            f"(live feed interrupted for {now - down_since:.1f} s): {reason}"
                        )
                    )
                    down_since = now
                log.warning("redis live reader: %s; reconnecting in %.2fs", reason, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                reconnect = True
            except Exception as exc:
                # Never die silently and leave subscribers waiting: tell them.
                log.exception("redis live reader failed")
                self._fail_all(StoreError(f"live reader failed: {exc!r}"))
                await asyncio.sleep(delay)
                reconnect = True

    async def _resubscribe(self) -> None:
        async with self._pubsub_lock:
            old, self._pubsub = self._pubsub, self._new_pubsub()
            if old is not None:
                # In a task of its own: cancelling this reconnect (on its deadline)
                # must not keep the old connection from going back to the pool.
                self._chore(_close_quietly(old))
            channels = [notify_channel(self._store.prefix, t) for t in self._feeds]
            if channels:
                # Confirmations mark every thread dirty: what was published while
                # the connection was down is read after each thread's cursor.
                await self._subscribe_channels(channels)
            self._heard = asyncio.get_running_loop().time()
            self._ping_sent = None

    async def _check_positions(self, threads: Sequence[str]) -> None:
        """Give a new epoch to each of *threads* whose stream no longer holds the
        entry this reader read last (Redis restarted from an older snapshot).

        Runs when a thread's subscription is confirmed again after the
        connection was lost (by this reader or by redis-py's own reconnect),
        before anything is read after the cursor.
        """
        store = self._store
        feeds = [
            (thread, feed)
            for thread in threads
            if (feed := self._feeds.get(thread)) is not None
            and feed.epoch is not None
            and feed.cursor != START
        ]
        if not feeds:
            return
        calls = [
            (
                3,
                stream_key(store.prefix, thread),
                meta_key(store.prefix, thread),
                checkpoint_key(store.prefix, thread),
                feed.cursor,
                feed.epoch or "",
                secrets.token_hex(8),
                notify_channel(store.prefix, thread),
            )
            for thread, feed in feeds
        ]
        results: list[Any] = []
        for _attempt in range(2):
            pipe = store._client.pipeline(transaction=False)
            for call in calls:
                pipe.evalsha(store._check_sha, *call)
            results = await store._call(pipe.execute(raise_on_error=False))
            if not any(isinstance(r, NoScriptError) for r in results):
                break
            await store._call(store._load_script(store._check_script))
        for (thread, feed), result in zip(feeds, results, strict=True):
            if isinstance(result, Exception):
                log.warning("redis live reader: checking thread %r failed: %s", thread, result)
            elif int(result[1]) == 1:
                log.warning(
                    "redis store: thread %r was rolled back (its stream no longer holds "
                    "offset %s, which was read before; Redis restarted from an older "
                    "snapshot, or a replica that lacked it took over?): new epoch %s, "
                    "readers resync",
                    thread,
                    feed.cursor,
                    _text(result[0]),
                )
            self._dirty.add(thread)

    async def _pump(self) -> None:
        """Wait for notifications, then fetch what they announce.

        A connection silent for :data:`SILENCE` seconds gets a PING; no answer
        within the deadline raises :class:`_Stalled` (an outage).
        """
        pubsub = self._pubsub
        if not self._channels or pubsub is None or pubsub.connection is None:
            self._ping_sent = None
            await asyncio.sleep(0.05)  # nothing subscribed (yet)
            return
        loop = asyncio.get_running_loop()
        wait = SILENCE
        if self._ping_sent is not None:
            wait = min(SILENCE, max(0.0, self._ping_sent + self._pong_deadline - loop.time()))
        message = await pubsub.get_message(timeout=wait)
        now = loop.time()
        if message is None:
            if self._ping_sent is None:
                if now - self._heard >= SILENCE:
                    self._ping_sent = now
                    await _bounded(pubsub.ping(_PING_TOKEN), self._store.op_timeout)
            elif now - self._ping_sent >= self._pong_deadline:
                since, self._ping_sent = self._ping_sent, None
                raise _Stalled(
                    f"no answer to a PING on the live connection within {self._pong_deadline:g} s",
                    since,
                )
        budget = 10_000
        while message is not None and budget > 0:
            self._heard, self._ping_sent = now, None
            self._handle(message)
            budget -= 1 + await self._handle_buffered(pubsub, budget)
            message = await pubsub.get_message(timeout=0)
        if self._recheck:
            threads, self._recheck = list(self._recheck), set()
            await self._check_positions(threads)
        while self._dirty:
            await self._fetch_dirty()

    async def _handle_buffered(self, pubsub: Any, budget: int) -> int:
        """Handle the replies the connection has received and parsed already; how many.

        redis-py's ``get_message`` costs several times what handling a
        notification does, per message; one socket read brings many. So the
        notifications already in the hiredis reader's buffer are taken from
        it directly (anything else goes through redis-py's ``handle_message``,
        which keeps its own bookkeeping). Without hiredis: none, and
        ``get_message`` takes each.
        """
        parser = getattr(pubsub.connection, "_parser", None)
        gets = getattr(getattr(parser, "_reader", None), "gets", None)
        if gets is None:
            return 0
        handled = 0
        while handled < budget:
            reply = gets()
            if isinstance(reply, Exception):
                raise reply
            if not isinstance(reply, list | bytes):
                break  # no whole reply received yet (False, or redis-py's marker)
            handled += 1
            # (A list, or hiredis's PushNotification, a subclass of list.)
            if len(reply) == 3 and reply[0] == self._MESSAGE_BYTES and isinstance(reply, list):
                self._notified(reply[1], reply[2])
                continue
            message = pubsub.handle_message(reply)
            if inspect.isawaitable(message):  # a coroutine in newer redis-py
                message = await message
            if message is not None:
                self._handle(message)
        return handled

    def _notified(self, channel: bytes, data: Any) -> None:
        """A notification on *channel*: deliver what it carries, or read the thread."""
        thread = self._channels.get(channel)
        if thread is None or thread in self._dirty:
            return
        feed = self._feeds.get(thread)
        if feed is not None and not self._carried(thread, feed, data):
            self._dirty.add(thread)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        channel = message.get("channel")
        if not isinstance(channel, bytes):
            channel = str(channel).encode()
        if kind == self._MESSAGE:
            self._notified(channel, message.get("data"))
            return
        thread = self._channels.get(channel)
        feed = self._feeds.get(thread) if thread is not None else None
        if feed is None or thread is None:
            return
        if kind == self._SUBSCRIBED:
            self._dirty.add(thread)
        if kind == self._SUBSCRIBED and feed.ready.is_set():
            # Subscribed again: the connection was lost and Redis may have been
            # restarted from an older snapshot meanwhile.
            self._recheck.add(thread)
        if kind == self._SUBSCRIBED and not feed.ready.is_set():
            feed.ready.set()
            if not feed.subs:  # every subscriber left while we subscribed
                self._drop(thread, unsubscribe=True)

    def _carried(self, thread: str, feed: _Feed, data: Any) -> bool:
        """Deliver the entries a notification carries; ``False``: read them instead.

        Only when they follow the feed's cursor exactly in the feed's epoch
        (nothing in between was missed) and the feed is not waiting for a
        read already: otherwise, and for a plain producer's notification (an
        offset), the thread is read after its cursor as before.
        """
        if not feed.ready.is_set() or type(data) is not bytes or data[:2] != _CARRIED:
            return False
        try:
            _, epoch_raw, prev, flat = msgpack.unpackb(data, raw=True, use_list=True)
            epoch = epoch_raw.decode()
            if prev.decode() != feed.cursor or (feed.epoch is not None and epoch != feed.epoch):
                return False
            if not flat or len(flat) % 5 or not all(type(x) is bytes for x in flat):
                return False
            # Anyone may publish on the channel: only entries that really
            # follow the cursor, in order, are believed (else: read).
            last = offset_key(feed.cursor)
            entries = []
            for i in range(0, len(flat), 5):
                offset = flat[i].decode()
                key = offset_key(offset)
                if key <= last:
                    return False
                last = key
                run = flat[i + 2].decode()
                entries.append(
                    Entry(
                        offset, flat[i + 4], flat[i + 1].decode(), run or None, flat[i + 3].decode()
                    )
                )
        except Exception:  # not ours after all, whatever it is: read
            return False
        feed.epoch = epoch
        feed.cursor = entries[-1].offset
        for sub in list(feed.subs):
            sub._on_live(entries, epoch)
        return True

    async def _fetch_dirty(self) -> None:
        threads = [t for t in self._dirty if t in self._feeds]
        self._dirty.clear()
        if not threads:
            return
        cursors = [(t, self._feeds[t].cursor) for t in threads]
        pages = await self._store._read_pages(cursors, PAGE_SIZE)
        for thread, page in zip(threads, pages, strict=True):
            feed = self._feeds.get(thread)
            if feed is None:
                continue
            # One thread's failure fails that thread's subscriptions only.
            try:
                if isinstance(page, BaseException):
                    raise page
                await self._deliver(thread, feed, page)
            except StoreUnavailable:
                raise  # an outage: every thread is concerned
            except Exception as exc:
                log.warning(
                    "redis live reader: thread %r failed, its subscriptions end: %r", thread, exc
                )
                error = (
                    exc
                    if isinstance(exc, StoreError)
                    else StoreError(f"thread {thread!r}: the live reader failed: {exc!r}")
                )
                for sub in list(feed.subs):
                    sub._fail(error)

    async def _deliver(self, thread: str, feed: _Feed, page: _Page) -> None:
        epoch, entries = page.epoch, page.entries
        if feed.epoch is not None and epoch != feed.epoch:
            # Lost or re-created: the subscribers resync; offsets start over.
            for sub in list(feed.subs):
                sub._on_live([], epoch)
            feed.cursor = START
            feed.epoch = epoch
            if epoch is not None:
                self._dirty.add(thread)
            return
        feed.epoch = epoch
        if page.expired(feed.cursor):
            first = entries[0].offset if entries else None
            error = OffsetExpired(thread, feed.cursor, first)
            for sub in list(feed.subs):
                sub._fail(error)
            feed.cursor = await self._store.last_offset(thread)
            return
        if entries:
            feed.cursor = entries[-1].offset
            for sub in list(feed.subs):
                sub._on_live(entries, epoch)
            if len(entries) == PAGE_SIZE:
                self._dirty.add(thread)

    async def close(self) -> None:
        self._closed = True
        for chore in list(self._chores):
            chore.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await self._task
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.aclose()
        for feed in list(self._feeds.values()):
            for sub in list(feed.subs):
                await sub.close()
        self._feeds.clear()


_abandoned: set[asyncio.Future[Any]] = set()
"""Cancelled work that has not finished yet (kept referenced until it has)."""


def _abandon(task: asyncio.Future[Any]) -> None:
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_forget_abandoned)


def _forget_abandoned(task: asyncio.Future[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" noise


async def _bounded(awaitable: Awaitable[T], timeout: float) -> T:
    """*awaitable*'s result, or a builtin :class:`TimeoutError` after *timeout* seconds.

    On the deadline the work is cancelled but not waited for: redis-py may
    take a while to wind down a cancelled command (it can even take the
    cancellation for a failure to retry), and the caller must be answered on
    time. The abandoned work finishes in the background and returns its
    connection to the pool.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        _abandon(task)
        raise
    if not done:
        _abandon(task)
        raise TimeoutError
    return task.result()


async def _limited(limit: asyncio.Semaphore, awaitable: Awaitable[T]) -> T:
    async with limit:
        return await awaitable


_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)
"""Failures that mean Redis cannot answer now (worth a retry), not a wrong command."""

_CLUSTER_UNAVAILABLE = (
    # A master down, its slots without an owner for now, slots moving
    # (redirections beyond redis-py's retries, keys split mid-migration).
    ClusterError,
    TryAgainError,
    AskError,
    SlotNotCoveredError,
    RedisClusterUnreachableError,
)
"""What else means "not now" on Redis Cluster."""


def _unavailable(exc: BaseException, *, cluster: bool) -> bool:
    """Whether *exc* means Redis (on a *cluster*: the thread's master) cannot
    answer now, rather than a wrong command."""
    if isinstance(exc, _UNAVAILABLE):
        return True
    if not cluster:
        return False
    # The cluster client's own errors: no node reachable, nodes that disagree on
    # the slots... All but a programming error (several slots in one transaction).
    return isinstance(exc, _CLUSTER_UNAVAILABLE) or (
        isinstance(exc, RedisClusterException)
        and not isinstance(exc, (CrossSlotTransactionError, InvalidPipelineStack))
    )


_MAYBE_STORED = "; the events may or may not be stored: retry with the same event ids"


async def _close_quietly(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("redis live reader: %s", task.exception())


# -- the store ------------------------------------------------------------------------------


def _command(*args: bytes | str | int) -> bytes:
    """One command in RESP, the bytes Redis reads (arguments: bytes, str or int)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if type(arg) is bytes else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


async def _send_and_read(conn: Any, commands: bytes, count: int) -> list[Any]:
    await conn.send_packed_command(commands, check_health=False)
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await conn.read_response())
        except ResponseError as exc:  # an error reply: that command's answer
            replies.append(exc)
    return replies


_BARE_GET = (
    inspect.signature(aioredis.BlockingConnectionPool.get_connection)
    .parameters["command_name"]
    .default
    is not inspect.Parameter.empty
)
"""Whether the pool's ``get_connection`` takes no command name (redis-py >= 5.3
warns when given one; older versions need it)."""


@dataclass(slots=True)
class _Lane:
    """Appends waiting for a round trip, and the task that commits them."""

    queued: list[_QueuedAppend] = field(default_factory=list)
    committer: asyncio.Task[None] | None = None
    threads: dict[str, int] = field(default_factory=dict)
    """Appends per thread queued or in flight here."""


@dataclass(slots=True)
class _QueuedAppend:
    thread: str
    quads: list[Any]
    """(event id, run id, type, msgpack) per event, flat, as the script takes them."""
    count: int
    done: asyncio.Future[list[Offset]]
    expect: Expected | None


NOTIFY_BYTES = 64 * 1024
"""Default largest total of event payloads an append carries in its notification
(``notify_bytes``): live readers then deliver them without reading them back.
Larger appends notify with their last offset only, and readers read."""

READ_PAGE = 5000
"""Entries per round trip of :meth:`RedisStore.read` and ``read_available``."""

READ_TRIES = 5
"""Pages-wise attempts of ``read_available`` before it reads in one round trip."""


class RedisStore:
    """Thread streams in Redis. See the module docstring for keys and entries.

    Every operation a caller awaits is bounded by *op_timeout* seconds: when
    Redis does not answer in time it raises
    :class:`~agui_hub.errors.StoreUnavailable` (redis-py's retries happen
    within that deadline). :attr:`url` is the URL with its password
    redacted; the store never shows the password in a message or log.
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        prefix: str = "agui",
        retention: Retention | None = None,
        max_connections: int = 16,
        socket_timeout: float = 5.0,
        max_pending_bytes: int | None = None,
        outage_grace: float = OUTAGE_GRACE,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        notify_bytes: int = NOTIFY_BYTES,
    ) -> None:
        if notify_bytes < 0:
            raise ValueError(f"RedisStore notify_bytes must not be negative, got {notify_bytes!r}")
        self.notify_bytes = notify_bytes
        """Appends whose events total at most this many bytes carry them in their
        notification (0: notifications carry only the last offset)."""
        for name, value, positive in (
            ("op_timeout", op_timeout, True),
            ("outage_grace", outage_grace, False),
            ("socket_timeout", socket_timeout, True),
        ):
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                raise ValueError(
                    f"RedisStore {name} must be a finite number of seconds, got {value!r}"
                )
        self.url = redact_url(url)
        """The Redis URL without its password (safe to show)."""
        parts = urlsplit(url)
        names = list(parse_qs(parts.query, keep_blank_values=True))
        for name in names:
            if name in _OWN_OPTIONS:
                raise ValueError(
                    f"{name!r} in the URL of RedisStore({self.url!r}): pass it as an "
                    "argument, or open the store with open_store(url)"
                )
        scheme = parts.scheme.lower()
        check_redis_options(scheme.removesuffix("+cluster"), names)
        self.outage_grace = outage_grace
        self.op_timeout = op_timeout
        self.socket_timeout = socket_timeout
        self.prefix = prefix
        self.retention = retention or Retention()
        self._max_pending = max_pending_bytes
        self._limit: asyncio.Semaphore | None = None
        """Bounds the commands in flight on Redis Cluster (its client does not wait
        for a free connection); ``None`` on a single Redis, whose pool does."""
        self._cluster: ClusterOps | None = None
        """What differs on Redis Cluster (``redis+cluster://``); ``None`` on a single Redis."""
        # redis-py's Redis or RedisCluster: the calls both take are the ones used.
        self._client: Any
        if scheme in CLUSTER_SCHEMES:
            from .cluster import ClusterOps

            if self.retention.max_tenant_threads:
                raise ValueError(
                    f"max_tenant_threads is not available on Redis Cluster ({self.url}): a "
                    "tenant's set of threads and the threads live in different slots, which "
                    "one script cannot check atomically; leave it at 0 (docs/cluster.md)"
                )
            self._cluster = ClusterOps(self, url, max_connections, socket_timeout)
            self._client = self._cluster.client
            self._limit = asyncio.Semaphore(self._cluster.max_connections)
            append_script, check_script = self._cluster.scripts(
                APPEND_SCRIPT, CHECK_POSITION_SCRIPT
            )
        else:
            # A bounded, blocking pool: concurrency waits for a connection instead of
            # opening more, so the connection count does not grow with the load.
            # Values are msgpack bytes: decode_responses must stay off.
            pool = aioredis.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=socket_timeout,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_timeout,
                health_check_interval=15,
                decode_responses=False,
                retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
                retry_on_error=[RedisConnectionError, RedisTimeoutError],
            )
            self._client = aioredis.Redis(connection_pool=pool)
            append_script, check_script = APPEND_SCRIPT, CHECK_POSITION_SCRIPT
        # Entries are parsed once, straight into Entry tuples (see _entry), not
        # first into redis-py's (id, dict) pairs: catch-up reads are hot.
        self._client.set_response_callback("XRANGE", _raw_reply)
        self._append_script, self._check_script = append_script, check_script
        self._append_sha = hashlib.sha1(append_script.encode()).hexdigest()
        self._check_sha = hashlib.sha1(check_script.encode()).hexdigest()
        # Group commit: appends that arrive while a round trip is in flight
        # go together in the next one (one pipeline), so many small concurrent
        # publishes cost few round trips. Order per thread is kept. One lane
        # on a single Redis; one per master on a cluster, so that a master
        # that is down holds up the appends of its own threads only.
        self._lanes: dict[str, _Lane] = {}
        self._lane_of: dict[str, str] = {}
        """The lane of each thread with appends queued or in flight (it stays
        there until they are done, so that they keep their order)."""
        self._reader: _LiveReader | ClusterLiveReader = (
            _LiveReader(self) if self._cluster is None else self._cluster.live_reader()
        )
        self._reads: dict[tuple[str, Offset, int], asyncio.Future[_Page]] = {}
        """Page reads in flight, shared by the callers that ask for the same one."""

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    def _timed_out(self, what: str = "a command") -> StoreUnavailable:
        return StoreUnavailable(
            f"Redis at {self.url} is unavailable: no answer to {what} within {self.op_timeout:g} s"
        )

    async def _call(self, awaitable: Awaitable[T], what: str = "a command") -> T:
        """Await one store command within ``op_timeout``; Redis failures become
        :class:`StoreUnavailable` (unreachable, too slow) or :class:`StoreError`."""
        try:
            if self._limit is not None:
                awaitable = _limited(self._limit, awaitable)
            return await _bounded(awaitable, self.op_timeout)
        except TimeoutError:  # the deadline (a builtin TimeoutError, unlike redis-py's)
            raise self._timed_out(what) from None
        except (RedisError, RedisClusterException, OSError) as exc:
            raise self._failure(exc) from exc

    def _failure(self, exc: BaseException, *, retry_hint: str = "") -> StoreError:
        """The store error for a redis-py failure: :class:`StoreUnavailable` when
        Redis (or a cluster master) cannot answer now, else :class:`StoreError`."""
        if _unavailable(exc, cluster=self._cluster is not None):
            return StoreUnavailable(f"Redis at {self.url} is unavailable: {exc}{retry_hint}")
        return StoreError(f"Redis error: {exc}{self._cluster_hint(exc)}")

    def _cluster_hint(self, exc: BaseException) -> str:
        """What to do when a ``redis://`` URL names a node of a Redis Cluster."""
        if self._cluster is None and isinstance(
            exc, (AskError, ClusterError, ClusterCrossSlotError)
        ):
            return (
                f" (the Redis at {self.url} is a node of a Redis Cluster: open the store "
                "with redis+cluster://host:port,host:port/, see docs/cluster.md)"
            )
        return ""

    async def _load_script(self, script: str) -> None:
        """SCRIPT LOAD *script* (on every master of a cluster)."""
        if self._cluster is not None:
            await self._cluster.load_script(script)
        else:
            await self._client.script_load(script)

    # -- writing --------------------------------------------------------------------------

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        check_thread(thread)
        if not events:
            return []
        if expect is not None:
            expect = Expected(expect.epoch, _normal(expect.after))
        quads: list[Any] = []
        for item in events:
            quads += [
                item.event_id,
                item.run_id or "",
                str(item.event.get("type", "")),
                encode_event_data(item.event),
            ]
        done: asyncio.Future[list[Offset]] = asyncio.get_running_loop().create_future()
        name = self._lane_of.get(thread)
        if name is None:
            name = "" if self._cluster is None else self._cluster.lane(thread)
            self._lane_of[thread] = name
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane()
        lane.queued.append(_QueuedAppend(thread, quads, len(events), done, expect))
        lane.threads[thread] = lane.threads.get(thread, 0) + 1
        if lane.committer is None or lane.committer.done():
            lane.committer = asyncio.create_task(
                self._commit(name, lane), name="agui-hub redis commit"
            )
        # A cancelled (or timed-out) caller cancels only its own future; the
        # commit goes on for the others that share its round trip (and the
        # caller's events may still be appended: retry with the same ids).
        try:
            async with asyncio.timeout(self.op_timeout):
                return await done
        except TimeoutError:
            raise StoreUnavailable(
                f"Redis at {self.url} is unavailable: the append was not confirmed within "
                f"{self.op_timeout:g} s; the events may or may not be stored: "
                "retry with the same event ids"
            ) from None

    async def _commit(self, name: str, lane: _Lane) -> None:
        while lane.queued:
            taken, lane.queued = lane.queued[:1000], lane.queued[1000:]
            try:
                # Callers that gave up (deadline, cancellation) before their
                # round trip started were told to retry: their events are not sent.
                batch = [queued for queued in taken if not queued.done.done()]
                if batch:
                    await self._commit_batch(batch)
            finally:
                for queued in taken:
                    left = lane.threads.pop(queued.thread) - 1
                    if left:
                        lane.threads[queued.thread] = left
                    elif self._lane_of.get(queued.thread) == name:
                        del self._lane_of[queued.thread]
        if self._lanes.get(name) is lane:
            del self._lanes[name]

    async def _commit_batch(self, batch: list[_QueuedAppend]) -> None:
        """One round trip for *batch*; each caller's future gets its offsets or error."""
        # Appends to one thread queued together become one script call, in
        # arrival order; threads are independent of each other. A
        # conditional append has its expectation, so a call of its own.
        groups: list[tuple[str, list[_QueuedAppend]]] = []
        shared: dict[str, list[_QueuedAppend]] = {}
        for queued in batch:
            members = shared.get(queued.thread) if queued.expect is None else None
            if members is not None:
                members.append(queued)
                continue
            groups.append((queued.thread, [queued]))
            if queued.expect is None:
                shared[queued.thread] = groups[-1][1]
        error: Exception | None = None
        replies: list[Any] = []
        try:
            # Bounded like the callers' wait: a stalled Redis does not hold
            # the appends queued behind this round trip for redis-py's
            # socket timeout times its retries.
            replies = await _bounded(self._run_appends(groups), self.op_timeout)
        except asyncio.CancelledError:
            for queued in batch:
                if not queued.done.done():
                    queued.done.set_exception(StoreError("the store was closed"))
            raise
        except TimeoutError:
            error = StoreUnavailable(
                f"Redis at {self.url} is unavailable: no answer to the append within "
                f"{self.op_timeout:g} s; the events may or may not be stored: "
                "retry with the same event ids"
            )
        except (RedisError, RedisClusterException, OSError) as exc:
            error = self._failure(exc, retry_hint=_MAYBE_STORED)
        for index, (thread, members) in enumerate(groups):
            reply = error or replies[index]
            status = b""
            if not isinstance(reply, Exception):
                if reply and reply[0] == b"conflict":
                    status = reply[1] if len(reply) > 1 else b""
                    reply = AppendConflict(thread)
                elif reply and reply[0] == b"too_many_threads":
                    status = reply[1] if len(reply) > 1 else b""
                    limit = self.retention.max_tenant_threads
                    reply = too_many_threads(thread, tenant_of(thread), limit)
                elif len(reply) > 2:
                    status = reply[2]
            if status:
                log.warning(
                    "redis store: thread %r got a new epoch or a repair (%s): "
                    "its stream or ids were lost or rolled back (see docs/store.md, "
                    "'Redis settings the store needs')",
                    thread,
                    _text(status),
                )
            if isinstance(reply, Exception):
                failure = reply
                if error is None and _unavailable(reply, cluster=self._cluster is not None):
                    # A cluster master down or its slots moving: worth a retry.
                    failure = self._failure(reply, retry_hint=_MAYBE_STORED)
                elif not error and not isinstance(reply, (AppendConflict, TooManyThreads)):
                    failure = StoreError(f"append failed: {reply}{self._cluster_hint(reply)}")
                for queued in members:
                    if not queued.done.done():
                        queued.done.set_exception(failure)
                continue
            offsets = [_text(o) for o in reply[1]]
            start = 0
            for queued in members:
                if not queued.done.done():
                    queued.done.set_result(offsets[start : start + queued.count])
                start += queued.count

    async def _run_appends(self, groups: list[tuple[str, list[_QueuedAppend]]]) -> list[Any]:
        """One pipeline with one EVALSHA per thread; loads the script if Redis lost it.

        Replaying after NoScriptError is safe: event ids make appends idempotent.
        On Redis Cluster each master gets the calls of its threads (see
        :meth:`agui_hub.store.cluster.ClusterOps.run_scripts`).
        """
        calls = [self._append_call(thread, members) for thread, members in groups]
        if self._cluster is not None:
            return await self._cluster.run_scripts(self._append_script, self._append_sha, calls)
        for attempt in range(2):
            packed = b"".join(
                _command(b"EVALSHA", self._append_sha, len(keys), *keys, *args)
                for keys, args in calls
            )
            replies = await self._round_trip(packed, len(calls))
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
                await self._client.script_load(self._append_script)
                continue
            return list(replies)
        raise AssertionError("unreachable")  # pragma: no cover

    def _append_call(
        self, thread: str, members: list[_QueuedAppend]
    ) -> tuple[list[str], list[Any]]:
        """The append script's KEYS and ARGV for *members*, appends to *thread*."""
        r = self.retention
        expect = members[0].expect
        args: list[Any] = [
            secrets.token_hex(8),
            r.max_len,
            int(r.max_age * 1000),
            int(r.ttl * 1000),
            notify_channel(self.prefix, thread),
            sum(m.count for m in members),
            "" if expect is None else expect.after,
            "" if expect is None or expect.epoch is None else expect.epoch,
            IDS_REBUILD_LIMIT,
            r.max_bytes,
            r.max_tenant_threads,
            thread,
            self.prefix,
            self.notify_bytes,
        ]
        for member in members:
            args += member.quads
        # On a cluster every key of one script must be in the thread's slot: the
        # tenant's set is not (there is no quota there), so the meta key stands
        # in for it; the script touches KEYS[5] only when max_tenant_threads is set.
        tenant = (
            tenant_key(self.prefix, tenant_of(thread))
            if self._cluster is None
            else meta_key(self.prefix, thread)
        )
        keys = [
            stream_key(self.prefix, thread),
            meta_key(self.prefix, thread),
            ids_key(self.prefix, thread),
            checkpoint_key(self.prefix, thread),
            tenant,
        ]
        return keys, args

    async def _round_trip(self, commands: bytes, count: int) -> list[Any]:
        """Send *count* commands (RESP, see :func:`_command`) at once; their replies,
        an error reply as its exception.

        What a redis-py pipeline does, without its per-argument encoding and
        per-command bookkeeping (most of an append's CPU in this process).
        Connection errors are retried as redis-py retries them (appends are
        idempotent by their event ids).
        """
        pool = self._client.connection_pool
        get: Any = pool.get_connection
        conn = await (get() if _BARE_GET else get("EVALSHA"))
        try:
            return await conn.retry.call_with_retry(  # type: ignore[no-any-return]
                lambda: _send_and_read(conn, commands, count),
                lambda _error: conn.disconnect(),
            )
        except BaseException:
            # Replies may be left unread on it: never hand it back as it is.
            await conn.disconnect(nowait=True)
            raise
        finally:
            await pool.release(conn)

    # -- reading --------------------------------------------------------------------------

    async def stored_ids(self, thread: str, event_ids: Sequence[str]) -> dict[str, Offset]:
        check_thread(thread)
        if not event_ids:
            return {}
        found = await self._call(self._client.hmget(ids_key(self.prefix, thread), list(event_ids)))
        return {i: _text(o) for i, o in zip(event_ids, found, strict=True) if o is not None}

    async def _read_pages(
        self, cursors: Sequence[tuple[str, Offset]], limit: int | None
    ) -> list[_Page | StoreError]:
        """For each (thread, after): epoch, trim mark and entries, in one round trip.

        MULTI makes each thread's meta and entries consistent with trimming (on
        Redis Cluster, where one MULTI cannot span slots, a read script per
        thread does). A thread whose commands fail (say a key of the wrong
        type) gets a :class:`StoreError` in its place (:class:`StoreUnavailable`
        when its cluster master is down); the others are unaffected.
        """
        results: list[Any]
        if self._cluster is not None:
            results = []
            for reply in await self._call(self._cluster.read_pages(cursors, limit)):
                results += [reply, reply] if isinstance(reply, Exception) else [reply[:2], reply[2]]
        else:
            pipe = self._client.pipeline(transaction=True)
            for thread, after in cursors:
                pipe.hmget(meta_key(self.prefix, thread), ["epoch", "trimmed"])
                if offset_key(after) == _MAX_OFFSET:
                    pipe.xrange(stream_key(self.prefix, thread), min="+", max="+", count=0)
                elif limit is None:
                    pipe.xrange(stream_key(self.prefix, thread), min=f"({after}")
                else:
                    pipe.xrange(stream_key(self.prefix, thread), min=f"({after}", count=limit)
            results = await self._call(pipe.execute(raise_on_error=False))
        pages: list[_Page | StoreError] = []
        for i, (thread, _) in enumerate(cursors):
            meta, raw = results[2 * i], results[2 * i + 1]
            failed = next((r for r in (meta, raw) if isinstance(r, Exception)), None)
            if failed is not None and _unavailable(failed, cluster=self._cluster is not None):
                pages.append(self._failure(failed))
                continue
            if failed is not None:
                pages.append(StoreError(f"thread {thread!r}: Redis error: {failed}"))
                continue
            epoch, trimmed = meta
            entries = [_entry(item) for item in raw]
            if epoch is None and entries:
                # Written with a plain XADD (another language) and never read:
                # the stream gets its epoch now.
                epoch = await self._ensure_epoch(thread)
            pages.append(
                _Page(
                    epoch=_text(epoch) if epoch else None,
                    trimmed=_text(trimmed) if trimmed else None,
                    entries=entries,
                )
            )
        return pages

    async def _shared_page(self, thread: str, after: Offset, limit: int) -> _Page:
        """:meth:`_read_page`, one read for all who ask for the same page at once.

        Viewers that resume together (a gateway restart, a network blip) ask
        for the same pages of the same thread: one round trip and one parse
        serve them all. A caller that gives up does not cancel the read for
        the others; a failure reaches them all.
        """
        key = (thread, after, limit)
        read = self._reads.get(key)
        if read is None:
            read = asyncio.ensure_future(self._read_page(thread, after, limit))
            self._reads[key] = read
            read.add_done_callback(lambda done: self._forget_read(key, done))
        return await asyncio.shield(read)

    def _forget_read(self, key: tuple[str, Offset, int], read: asyncio.Future[_Page]) -> None:
        if self._reads.get(key) is read:
            del self._reads[key]
        if not read.cancelled():
            read.exception()  # retrieved: whoever awaited it got it

    async def _read_page(self, thread: str, after: Offset, limit: int | None) -> _Page:
        (page,) = await self._read_pages([(thread, after)], limit)
        if isinstance(page, StoreError):
            raise page
        return page

    async def _ensure_epoch(self, thread: str) -> str | None:
        meta = meta_key(self.prefix, thread)
        pipe = self._client.pipeline(transaction=True)
        pipe.exists(stream_key(self.prefix, thread))
        pipe.hget(meta, "epoch")
        exists, epoch = await self._call(pipe.execute())
        if epoch is not None or not exists:
            return _text(epoch) if epoch is not None else None
        await self._call(self._client.hsetnx(meta, "epoch", secrets.token_hex(8)))
        epoch = await self._call(self._client.hget(meta, "epoch"))
        return _text(epoch) if epoch is not None else None

    async def _fetch(
        self, thread: str, after: Offset, limit: int
    ) -> tuple[str | None, list[Entry]]:
        offset_key(after)
        page = await self._read_page(thread, after, limit)
        if page.expired(after):
            first = await self._call(self._client.xrange(stream_key(self.prefix, thread), count=1))
            raise OffsetExpired(thread, after, _text(first[0][0]) if first else None)
        return page.epoch, page.entries

    async def read(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> list[Entry]:
        check_thread(thread)
        if limit is not None:
            return (await self._fetch(thread, after, limit))[1]
        out: list[Entry] = []
        cursor = after
        while True:
            _, page = await self._fetch(thread, cursor, READ_PAGE)
            out += page
            if len(page) < READ_PAGE:
                return out
            cursor = page[-1].offset

    async def read_available(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> Available:
        check_thread(thread)
        offset_key(after)
        if limit is not None:
            page = await self._shared_page(thread, _normal(after), limit)
            return Available(page.epoch, page.trimmed, list(page.entries), page.expired(after))
        for attempt in range(READ_TRIES):
            # The last try reads everything in one MULTI: consistent whatever
            # the producers do meanwhile, at the price of one large reply.
            size = None if attempt == READ_TRIES - 1 else READ_PAGE
            page = await self._read_page(thread, after, size)
            epoch, trimmed, entries = page.epoch, page.trimmed, list(page.entries)
            gap = page.expired(after)
            while size is not None and len(page.entries) == size:
                cursor = entries[-1].offset
                page = await self._read_page(thread, cursor, size)
                if page.epoch != epoch:
                    break  # re-created meanwhile: start over
                if page.expired(cursor):
                    # Trimming overtook this read: what it has is trimmed now;
                    # go on after the new trim mark, with a gap. (Otherwise the
                    # trim mark stays the one read with the first entry: the
                    # entries follow it without a hole.)
                    gap = True
                    trimmed = page.trimmed
                    entries = []
                entries += page.entries
            else:
                return Available(epoch, trimmed, entries, gap)
        raise AssertionError("unreachable")  # pragma: no cover

    async def epoch(self, thread: str) -> str | None:
        check_thread(thread)
        return await self._ensure_epoch(thread)

    async def last_offset(self, thread: str) -> Offset:
        last = await self._call(self._client.xrevrange(stream_key(self.prefix, thread), count=1))
        return _text(last[0][0]) if last else START

    def subscribe(self, thread: str, after: Offset | None = None) -> FeedSubscription:
        return FeedSubscription(self, thread, after, max_pending_bytes=self._max_pending)

    async def _register(self, sub: FeedSubscription) -> None:
        await self._reader.register(sub)

    def _unregister(self, sub: FeedSubscription) -> None:
        self._reader.unregister(sub)

    @property
    def live_threads(self) -> int:
        """Threads the live reader currently serves."""
        return self._reader.threads

    # -- operators --------------------------------------------------------------------------

    async def info(self, thread: str) -> ThreadInfo | None:
        check_thread(thread)
        epoch = await self.epoch(thread)
        if epoch is None:
            return None
        stream = stream_key(self.prefix, thread)
        pipe = self._client.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        pipe.xrevrange(stream, count=1)
        pipe.hmget(meta_key(self.prefix, thread), ["run", "trimmed", "bytes"])
        pipe.pttl(stream)
        length, first, last, (run, trimmed, size), pttl = await self._call(pipe.execute())
        return ThreadInfo(
            thread=thread,
            epoch=epoch,
            length=int(length),
            first=_text(first[0][0]) if first else None,
            last=_text(last[0][0]) if last else None,
            trimmed=_text(trimmed) if trimmed else None,
            run_id=_text(run) if run else None,
            ttl=pttl / 1000 if pttl and pttl > 0 else None,
            bytes=int(size) if size else 0,
        )

    async def threads(self, limit: int = 1000) -> list[str]:
        pattern = f"{self.prefix}:{{*}}:events"
        head, tail = len(self.prefix) + 2, len("}:events")
        found: set[str] = set()
        if self._cluster is not None:
            for key in await self._call(self._cluster.scan(pattern, limit)):
                found.add(_text(key)[head:-tail])
            return sorted(found)[:limit]
        cursor: Any = 0
        while True:
            cursor, keys = await self._call(
                self._client.scan(cursor, match=pattern, count=1000, _type="stream")
            )
            for key in keys:
                found.add(_text(key)[head:-tail])
            if not cursor or len(found) >= limit:
                break
        return sorted(found)[:limit]

    async def delete(self, thread: str) -> bool:
        check_thread(thread)
        keys = [
            stream_key(self.prefix, thread),
            meta_key(self.prefix, thread),
            ids_key(self.prefix, thread),
            checkpoint_key(self.prefix, thread),
        ]
        channel = notify_channel(self.prefix, thread)
        if self._cluster is not None:
            # No tenant sets on a cluster (no quota there): the thread's keys only.
            removed = await self._call(self._client.delete(*keys))
            await self._call(self._client.spublish(channel, "deleted"))
            return bool(removed)
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(*keys)
        # Its slot in the tenant's quota is free at once (also when the quota
        # is off: a set left from when it was on must not count it).
        pipe.srem(tenant_key(self.prefix, tenant_of(thread)), thread)
        removed, _ = await self._call(pipe.execute())
        # Tell live readers, so their subscribers learn of the reset now.
        await self._call(self._client.publish(channel, "deleted"))
        return bool(removed)

    async def put_checkpoint(self, thread: str, checkpoint: Checkpoint) -> None:
        check_thread(thread)
        keys = [checkpoint_key(self.prefix, thread), meta_key(self.prefix, thread)]
        args: list[Any] = [
            checkpoint.offset,
            checkpoint.epoch,
            checkpoint.events,
            int(checkpoint.complete),
            int(self.retention.ttl * 1000),
        ]
        await self._call(self._client.eval(CHECKPOINT_SCRIPT, len(keys), *keys, *args))

    async def get_checkpoint(self, thread: str) -> Checkpoint | None:
        check_thread(thread)
        raw = await self._call(
            self._client.hmget(
                checkpoint_key(self.prefix, thread), ["offset", "epoch", "events", "complete"]
            )
        )
        offset, epoch, events, complete = raw
        if offset is None or epoch is None or not isinstance(events, bytes):
            return None
        return Checkpoint(_text(offset), _text(epoch), events, complete == b"1")

    async def ping(self) -> None:
        """:class:`StoreUnavailable` unless Redis answers (on a cluster: every master)."""
        if self._cluster is not None:
            await self._call(self._cluster.ping(), "PING")
        else:
            await self._call(self._client.ping(), "PING")

    async def durability_warnings(self) -> list[str]:
        """Warnings about Redis settings that break the store's promises.

        Reads ``appendonly``, ``appendfsync``, ``save``, ``maxmemory`` and
        ``maxmemory-policy`` with CONFIG GET; a Redis that does not allow it
        (managed services) gets one warning saying so. See docs/store.md,
        "Redis settings the store needs". On Redis Cluster every master is
        checked, and each warning names the master.
        """
        names = ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy")
        per_server: dict[str, list[Any]]
        if self._cluster is not None:
            per_server = await self._call(self._cluster.config_get(names), "CONFIG GET")
        else:
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.config_get(name)
            replies = await self._call(pipe.execute(raise_on_error=False), "CONFIG GET")
            per_server = {self.url: replies}
        warnings: list[str] = []
        for where, replies in per_server.items():
            refused = next((r for r in replies if isinstance(r, Exception)), None)
            settings: dict[str, str] = {}
            for reply in replies:
                if isinstance(reply, dict):
                    settings.update({_text(k): _text(v) for k, v in reply.items()})
            if refused is not None or any(name not in settings for name in names):
                why = f"CONFIG GET failed: {refused}" if refused is not None else "incomplete reply"
                warnings.append(
                    f"Redis at {where} does not let the store read its settings ({why}); "
                    "check by hand that appendonly is yes and maxmemory-policy is noeviction "
                    "(docs/store.md, 'Redis settings the store needs')."
                )
                continue
            warnings += durability_problems(settings, where, uses_ttl=self.retention.ttl > 0)
        return warnings

    async def close(self) -> None:
        committing = [
            lane.committer
            for lane in self._lanes.values()
            if lane.committer is not None and not lane.committer.done()
        ]
        if committing:
            await asyncio.wait(committing, timeout=self.op_timeout)
        await self._reader.close()
        await self._client.aclose()
        if self._cluster is None:
            await self._client.connection_pool.disconnect()


def durability_problems(settings: dict[str, str], where: str, *, uses_ttl: bool) -> list[str]:
    """The warnings :meth:`RedisStore.durability_warnings` gives for *settings*
    (CONFIG GET names to values), about the Redis at *where*."""
    warnings = []
    appendonly = settings.get("appendonly", "").lower()
    fsync = settings.get("appendfsync", "").lower()
    save = settings.get("save", "").strip()
    policy = settings.get("maxmemory-policy", "").lower()
    maxmemory = settings.get("maxmemory", "0")
    if appendonly == "no" and not save:
        warnings.append(
            f'Redis at {where} persists nothing (appendonly no, save ""): a restart loses '
            "every thread (readers see new epochs); set appendonly yes "
            "(CONFIG SET appendonly yes, and in redis.conf)."
        )
    elif appendonly == "no":
        warnings.append(
            f'Redis at {where} has appendonly no (RDB snapshots only, save "{save}"): a '
            "restart rolls threads back to the last snapshot and loses the events stored "
            "since (readers see new epochs); set appendonly yes (CONFIG SET appendonly yes, "
            "and in redis.conf)."
        )
    elif fsync == "no":
        warnings.append(
            f"Redis at {where} has appendfsync no: a crash of its machine can lose the last "
            "~30 s of acknowledged events; set appendfsync everysec (at most ~1 s) or always."
        )
    if policy.startswith("allkeys-"):
        warnings.append(
            f"Redis at {where} has maxmemory-policy {policy} (maxmemory {maxmemory}): when "
            "memory runs out it evicts thread keys, events included; set maxmemory-policy "
            "noeviction (appends then fail instead of losing events)."
        )
    elif policy.startswith("volatile-") and uses_ttl:
        warnings.append(
            f"Redis at {where} has maxmemory-policy {policy} (maxmemory {maxmemory}) and the "
            "store gives threads a ttl (7 days unless set), which makes their keys "
            "evictable; set maxmemory-policy noeviction, or the store's ttl option to 0 "
            "(threads then never expire)."
        )
    return warnings
