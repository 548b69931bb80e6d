"""The Redis thread store (``redis://``, ``rediss://``): one stream per thread.

Keys of one thread share the ``{thread}`` hash tag, so they live in one Redis
Cluster slot and one Lua script may touch them all (``agui`` is the default
prefix)::

    agui:{<thread>}:events   stream: one entry per event (see the entry format below)
    agui:{<thread>}:meta     hash: epoch, run (current run id), trimmed (last trimmed offset)
    agui:{<thread>}:ids      hash: event id -> offset, for idempotent publishing
    agui:{<thread>}:notify   pub/sub channel: "new entries", the last offset as payload

Entry format (fields of each stream entry, values are bytes):

    event   msgpack of the event's canonical wire dict (camelCase, no null optionals)
    id      the producer's event id (idempotency key)
    run     the run id the event belongs to ("" when unknown)
    type    the event type, e.g. TEXT_MESSAGE_CONTENT

Publishing (:meth:`RedisStore.append`) is one Lua script: it checks each event
id, appends, creates the epoch if the thread is new, trims by length and age,
refreshes the idle TTL and notifies live readers, atomically. A retried call
with the same event ids returns the original offsets and appends nothing, so
redis-py's automatic retries cannot duplicate an event. A conditional append
(``expect``) first checks, in the same script, that the epoch is the expected
one and that no entry follows the expected offset.

Live tail: one reader per store object (per process) serves every thread that
has local subscribers. It keeps one pub/sub connection, subscribes to a
thread's notify channel while the thread has subscribers, and on a
notification reads the new entries with XRANGE after an explicit last-seen
offset (never ``$``), batched in one pipeline for all notified threads. Adding
or removing a thread sends SUBSCRIBE / UNSUBSCRIBE on the same connection: no
blocking read is cancelled, no connection opened. Commands go through one
bounded connection pool, so a process holds the same number of Redis
connections for 1 or 10,000 live threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import AppendConflict, OffsetExpired, StoreError, StoreUnavailable
from .store import (
    PAGE_SIZE,
    START,
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
)

__all__ = ["RedisStore"]

log = logging.getLogger(__name__)

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


# -- scripts -----------------------------------------------------------------------------

# KEYS: stream, meta, ids
# ARGV: epoch candidate, max_len, max_age_ms, ttl_ms, channel, n,
#       expected after ("" appends unconditionally), expected epoch ("" for none),
#       then n times: event id, run id, type, msgpack payload
# Returns: {epoch, {offset per event}}, or {"conflict"} when the expectation fails
APPEND_SCRIPT = """
local stream, meta, ids = KEYS[1], KEYS[2], KEYS[3]
local max_len, max_age_ms, ttl_ms = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local channel, n = ARGV[5], tonumber(ARGV[6])
local expect_after, expect_epoch = ARGV[7], ARGV[8]

local epoch = redis.call('HGET', meta, 'epoch')
if expect_after ~= '' then
  -- Any entry after the expected offset was appended by someone else (by
  -- this script or a plain XADD), or by an earlier try of this very call
  -- whose reply was lost: either way the caller must read it first.
  if (epoch or '') ~= expect_epoch
      or #redis.call('XRANGE', stream, '(' .. expect_after, '+', 'COUNT', 1) > 0 then
    return {'conflict'}
  end
end
if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', meta, 'epoch', epoch)
end
local run = redis.call('HGET', meta, 'run') or ''

local offsets, added = {}, 0
for i = 0, n - 1 do
  local base = 9 + i * 4
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
    added = added + 1
  end
end

-- Retention: forget the ids of trimmed entries, remember the last trimmed offset.
local function forget(entries)
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    for j = 1, #fields, 2 do
      if fields[j] == 'id' then
        redis.call('HDEL', ids, fields[j + 1])
        break
      end
    end
  end
  redis.call('HSET', meta, 'trimmed', entries[#entries][1])
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

if ttl_ms > 0 then
  redis.call('PEXPIRE', stream, ttl_ms)
  redis.call('PEXPIRE', meta, ttl_ms)
  redis.call('PEXPIRE', ids, ttl_ms)
end
if added > 0 then
  redis.call('PUBLISH', channel, offsets[#offsets])
end
return {epoch, offsets}
"""


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
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(raw: Sequence[Any]) -> Entry:
    """An Entry from one raw XRANGE item: ``[id, [field, value, ...]]``."""
    offset = raw[0].decode()
    fields = raw[1]
    if type(fields) is dict:  # a client whose XRANGE reply was parsed into a map
        fields = [x for pair in fields.items() for x in pair]
    if len(fields) == 8 and fields[0] == b"event" and fields[6] == b"type":
        # The layout the append script writes: event, id, run, type.
        run = fields[5]
        return Entry(
            offset,
            fields[1],
            fields[3].decode(),
            run.decode() if run else None,
            fields[7].decode(),
        )
    data, event_id, run, event_type = b"", None, None, None
    for i in range(0, len(fields), 2):
        name = fields[i]
        if name == b"event":
            data = fields[i + 1]
        elif name == b"id":
            event_id = fields[i + 1]
        elif name == b"run":
            run = fields[i + 1]
        elif name == b"type":
            event_type = fields[i + 1]
    return Entry(
        offset,
        data,
        event_id.decode() if event_id is not None else offset,
        run.decode() if run else None,
        event_type.decode() if event_type is not None else "",
    )


def _raw_reply(response: Any, **options: Any) -> Any:
    return response


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


OUTAGE_GRACE = 5.0
"""Default seconds the live reader keeps reconnecting before it fails its
subscriptions with StoreUnavailable (so that a gateway can tell its clients to
come back later)."""


class _LiveReader:
    """Serves every live thread of one store from one pub/sub connection."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._feeds: dict[str, _Feed] = {}
        self._channels: dict[bytes, str] = {}
        self._dirty: set[str] = set()
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # SUBSCRIBE / UNSUBSCRIBE / reconnect never overlap on the pub/sub
        # connection; reading messages goes on meanwhile.
        self._pubsub_lock = asyncio.Lock()
        self._chores: set[asyncio.Future[None]] = set()  # pending UNSUBSCRIBEs

    @property
    def threads(self) -> int:
        return len(self._feeds)

    async def register(self, sub: FeedSubscription) -> None:
        thread = sub.thread
        feed = self._feeds.get(thread)
        if feed is None:
            feed = self._feeds[thread] = _Feed(cursor=START)
            feed.subs.add(sub)  # before any await: the confirmation may come first
            try:
                # Cursor first, then SUBSCRIBE; once the subscription is confirmed
                # the reader reads after the cursor, covering the window between.
                feed.cursor = await self._store.last_offset(thread)
                channel = notify_channel(self._store.prefix, thread)
                self._channels[channel.encode()] = thread
                self._ensure_running()
                async with self._pubsub_lock:
                    await self._store._call(self._pubsub.subscribe(channel))
            except BaseException as exc:
                self._drop(thread)
                feed.error = exc  # concurrent registrations of the thread fail too
                feed.ready.set()
                raise
        else:
            feed.subs.add(sub)
        await feed.ready.wait()
        if feed.error is not None:
            feed.subs.discard(sub)
            raise feed.error

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
            task = asyncio.ensure_future(self._unsubscribe(channel))
            self._chores.add(task)
            task.add_done_callback(self._chores.discard)
            task.add_done_callback(_log_failure)

    async def _unsubscribe(self, channel: str) -> None:
        # Best effort: a pub/sub connection replaced after an outage may be gone.
        async with self._pubsub_lock:
            if self._closed or channel.encode() in self._channels:
                return  # closing, or the thread became live again meanwhile
            with contextlib.suppress(Exception):
                await self._pubsub.unsubscribe(channel)

    def _ensure_running(self) -> None:
        if self._pubsub is None:
            self._pubsub = self._store._client.pubsub()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="agui-hub redis live reader")

    def _fail_all(self, error: BaseException) -> None:
        for feed in self._feeds.values():
            for sub in list(feed.subs):
                sub._fail(error)

    async def _run(self) -> None:
        delay = 0.05
        down_since: float | None = None
        reconnect = False
        loop = asyncio.get_running_loop()
        while not self._closed:
            try:
                if reconnect:
                    # Bounded: a half-open connection must not hang the reader.
                    await asyncio.wait_for(self._resubscribe(), 2 * self._store.socket_timeout)
                    reconnect = False
                await self._pump()
                delay, down_since = 0.05, None
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError, TimeoutError, StoreUnavailable) as exc:
                now = loop.time()
                down_since = down_since or now
                if now - down_since > self._store.outage_grace:
                    self._fail_all(StoreUnavailable(f"Redis at {self._store.url}: {exc}"))
                    down_since = now
                log.warning("redis live reader: %s; reconnecting in %.2fs", exc, delay)
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
            old, self._pubsub = self._pubsub, self._store._client.pubsub()
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.aclose()
            channels = [notify_channel(self._store.prefix, t) for t in self._feeds]
            if channels:
                # Confirmations mark every thread dirty: what was published while
                # the connection was down is read after each thread's cursor.
                await self._pubsub.subscribe(*channels)

    async def _pump(self) -> None:
        """Wait for notifications, then fetch what they announce."""
        pubsub = self._pubsub
        if not self._channels or pubsub is None or pubsub.connection is None:
            await asyncio.sleep(0.05)  # nothing subscribed (yet)
            return
        message = await pubsub.get_message(timeout=1.0)
        budget = 10_000
        while message is not None and budget:
            self._handle(message)
            budget -= 1
            message = await pubsub.get_message(timeout=0)
        while self._dirty:
            await self._fetch_dirty()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        channel = message.get("channel")
        if not isinstance(channel, bytes):
            channel = str(channel).encode()
        thread = self._channels.get(channel)
        feed = self._feeds.get(thread) if thread is not None else None
        if feed is None or thread is None:
            return
        if kind in ("message", "subscribe"):
            self._dirty.add(thread)
        if kind == "subscribe" and not feed.ready.is_set():
            feed.ready.set()
            if not feed.subs:  # every subscriber left while we subscribed
                self._drop(thread, unsubscribe=True)

    async def _fetch_dirty(self) -> None:
        threads = [t for t in self._dirty if t in self._feeds]
        self._dirty.clear()
        if not threads:
            return
        cursors = [(t, self._feeds[t].cursor) for t in threads]
        pages = await self._store._read_pages(cursors, PAGE_SIZE)
        for thread, page in zip(threads, pages, strict=True):
            feed = self._feeds.get(thread)
            if feed is not None:
                await self._deliver(thread, feed, page)

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


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("redis live reader: %s", task.exception())


# -- the store ------------------------------------------------------------------------------


@dataclass(slots=True)
class _QueuedAppend:
    thread: str
    quads: list[Any]
    """(event id, run id, type, msgpack) per event, flat, as the script takes them."""
    count: int
    done: asyncio.Future[list[Offset]]
    expect: Expected | None


class RedisStore:
    """Thread streams in Redis. See the module docstring for keys and entries."""

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
    ) -> None:
        self.url = url
        self.outage_grace = outage_grace
        self.socket_timeout = socket_timeout
        self.prefix = prefix
        self.retention = retention or Retention()
        self._max_pending = max_pending_bytes
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
        # Entries are parsed once, straight into Entry tuples (see _entry), not
        # first into redis-py's (id, dict) pairs: catch-up reads are hot.
        self._client.set_response_callback("XRANGE", _raw_reply)
        self._append_sha = hashlib.sha1(APPEND_SCRIPT.encode()).hexdigest()
        # Group commit: appends that arrive while a round trip is in flight
        # go together in the next one (one pipeline), so many small concurrent
        # publishes cost few round trips. Order per thread is kept.
        self._queued: list[_QueuedAppend] = []
        self._committer: asyncio.Task[None] | None = None
        self._reader = _LiveReader(self)

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    def _unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"Redis at {self.url} is unavailable: {exc}")

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            return await awaitable
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise self._unavailable(exc) from exc
        except RedisError as exc:
            raise StoreError(f"Redis error: {exc}") from exc

    # -- writing --------------------------------------------------------------------------

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        check_thread(thread)
        if not events:
            return []
        quads: list[Any] = []
        for item in events:
            quads += [
                item.event_id,
                item.run_id or "",
                str(item.event.get("type", "")),
                encode_event_data(item.event),
            ]
        done: asyncio.Future[list[Offset]] = asyncio.get_running_loop().create_future()
        self._queued.append(_QueuedAppend(thread, quads, len(events), done, expect))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit(), name="agui-hub redis commit")
        # A cancelled caller cancels only its own future; the commit goes on for
        # the others that share its round trip (and the caller's events may still
        # be appended: retry with the same ids to find out).
        return await done

    async def _commit(self) -> None:
        while self._queued:
            batch, self._queued = self._queued[:1000], self._queued[1000:]
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
                replies = await self._run_appends(groups)
            except asyncio.CancelledError:
                for queued in batch:
                    if not queued.done.done():
                        queued.done.set_exception(StoreError("the store was closed"))
                raise
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                error = self._unavailable(exc)
            except RedisError as exc:
                error = StoreError(f"Redis error: {exc}")
            for index, (thread, members) in enumerate(groups):
                reply = error or replies[index]
                if not isinstance(reply, Exception) and len(reply) == 1:
                    reply = AppendConflict(thread)
                if isinstance(reply, Exception):
                    failure = reply
                    if not error and not isinstance(reply, AppendConflict):
                        failure = StoreError(f"append failed: {reply}")
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
        """
        r = self.retention
        for attempt in range(2):
            calls = []
            for thread, members in groups:
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
                ]
                for member in members:
                    args += member.quads
                keys = [
                    stream_key(self.prefix, thread),
                    meta_key(self.prefix, thread),
                    ids_key(self.prefix, thread),
                ]
                calls.append((len(keys), *keys, *args))
            if len(calls) == 1:
                # The common case when the load is light: no pipeline to build.
                try:
                    replies = [await self._client.evalsha(self._append_sha, *calls[0])]
                except NoScriptError as exc:
                    replies = [exc]
            else:
                pipe = self._client.pipeline(transaction=False)
                for call in calls:
                    pipe.evalsha(self._append_sha, *call)
                replies = await pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
                await self._client.script_load(APPEND_SCRIPT)
                continue
            return list(replies)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- reading --------------------------------------------------------------------------

    async def stored_ids(self, thread: str, event_ids: Sequence[str]) -> dict[str, Offset]:
        check_thread(thread)
        if not event_ids:
            return {}
        found = await self._call(self._client.hmget(ids_key(self.prefix, thread), list(event_ids)))
        return {i: _text(o) for i, o in zip(event_ids, found, strict=True) if o is not None}

    async def _read_pages(self, cursors: Sequence[tuple[str, Offset]], limit: int) -> list[_Page]:
        """For each (thread, after): epoch, trim mark and entries, in one round trip.

        MULTI makes each thread's meta and entries consistent with trimming.
        """
        pipe = self._client.pipeline(transaction=True)
        for thread, after in cursors:
            pipe.hmget(meta_key(self.prefix, thread), ["epoch", "trimmed"])
            pipe.xrange(stream_key(self.prefix, thread), min=f"({after}", count=limit)
        results = await self._call(pipe.execute())
        pages = []
        for i, (thread, _) in enumerate(cursors):
            (epoch, trimmed), raw = results[2 * i], results[2 * i + 1]
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
        (page,) = await self._read_pages([(thread, after)], limit)
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
            _, page = await self._fetch(thread, cursor, 5000)
            out += page
            if len(page) < 5000:
                return out
            cursor = page[-1].offset

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
        pipe.hmget(meta_key(self.prefix, thread), ["run", "trimmed"])
        pipe.pttl(stream)
        length, first, last, (run, trimmed), pttl = await self._call(pipe.execute())
        return ThreadInfo(
            thread=thread,
            epoch=epoch,
            length=int(length),
            first=_text(first[0][0]) if first else None,
            last=_text(last[0][0]) if last else None,
            trimmed=_text(trimmed) if trimmed else None,
            run_id=_text(run) if run else None,
            ttl=pttl / 1000 if pttl and pttl > 0 else None,
        )

    async def threads(self, limit: int = 1000) -> list[str]:
        pattern = f"{self.prefix}:{{*}}:events"
        head, tail = len(self.prefix) + 2, len("}:events")
        found: set[str] = set()
        async for key in self._client.scan_iter(match=pattern, count=1000, _type="stream"):
            found.add(_text(key)[head:-tail])
            if len(found) >= limit:
                break
        return sorted(found)

    async def delete(self, thread: str) -> bool:
        check_thread(thread)
        keys = [
            stream_key(self.prefix, thread),
            meta_key(self.prefix, thread),
            ids_key(self.prefix, thread),
            checkpoint_key(self.prefix, thread),
        ]
        removed = await self._call(self._client.delete(*keys))
        # Tell live readers, so their subscribers learn of the reset now.
        await self._call(self._client.publish(notify_channel(self.prefix, thread), "deleted"))
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
        await self._call(self._client.ping())

    async def close(self) -> None:
        if self._committer is not None and not self._committer.done():
            await asyncio.wait([self._committer], timeout=self.socket_timeout)
        await self._reader.close()
        await self._client.aclose()
        await self._client.connection_pool.disconnect()
