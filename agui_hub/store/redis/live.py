"""The Redis store's live tail: one reader per store object (per process) serves
every thread that has local subscribers.

It keeps one pub/sub connection and subscribes to a thread's notify channel
while the thread has subscribers. A notification from the append script
carries the new entries (up to ``notify_bytes`` of events) and the offset
they follow: when that is the reader's cursor, the reader delivers them as
they are, with no read. Otherwise (a larger append, a missed notification, a
plain producer's notification, which may say anything) it reads the new
entries with XRANGE after an explicit last-seen offset (never ``$``), batched
in one pipeline for all notified threads. Adding or removing a thread sends
SUBSCRIBE / UNSUBSCRIBE on the same connection: no blocking read is
cancelled, no connection opened. Commands go through the store's bounded
connection pool, so a process holds the same number of Redis connections for
1 or 10,000 live threads. The reader PINGs a silent pub/sub connection (a
stalled Redis just goes quiet), and after a reconnect checks that the entry
at each cursor is still stored (a restore from an older RDB snapshot rolls
streams back under their epoch).

On Redis Cluster, :mod:`agui_hub.store.redis.cluster_live` runs one of these per
master.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import secrets
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.exceptions import NoScriptError, RedisError

from ...errors import OffsetExpired, StoreError, StoreUnavailable
from ..contract import PAGE_SIZE, START, Entry, FeedSubscription, Offset, offset_key
from ..urls import DEFAULT_OUTAGE_GRACE
from .calls import RedisCalls, bounded
from .keys import checkpoint_key, meta_key, notify_channel, runs_key, stream_key
from .pages import Page, ThreadPages
from .resp import text
from .scripts import Script

__all__ = ["OUTAGE_GRACE", "LiveFeed", "LiveReader", "LiveSource", "carried_entries"]

log = logging.getLogger("agui_hub.redis_store")


@dataclass(frozen=True, slots=True)
class LiveSource:
    """What a live reader works with, from its store."""

    calls: RedisCalls
    """The store's client: pub/sub connections, commands within ``op_timeout``."""
    pages: ThreadPages
    """Reads what notifications do not carry."""
    check_script: Script
    """The rewind check run after a reconnect (sharded on a cluster)."""
    prefix: str
    """The store's key prefix."""
    outage_grace: float
    """Seconds of failed reconnects after which the reader fails its
    subscriptions with StoreUnavailable (it keeps trying)."""


@dataclass
class LiveFeed:
    """One thread with local subscribers: where the reader is in its stream."""

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

_CARRIED = b"\x94\x01"
"""How a notification that carries its entries begins: msgpack of
``[1, epoch, offset before them, [offset, id, run, type, payload, ...]]``."""


class _Interrupted(Exception):
    """The registration a subscription waited on was cancelled: register again."""


class _Stalled(StoreUnavailable):
    """The pub/sub connection went silent and did not answer a PING."""

    def __init__(self, message: str, since: float) -> None:
        super().__init__(message)
        self.since = since


class LiveReader:
    """Serves every live thread of one store from one pub/sub connection.

    The store registers each subscription (:meth:`register`,
    :meth:`unregister`) and closes the reader with itself (:meth:`close`).

    On Redis Cluster one of these serves the threads of one master, over sharded
    pub/sub (see :mod:`agui_hub.store.redis.cluster_live`): the hooks below
    (:meth:`_new_pubsub`, :meth:`_subscribe_channels`,
    :meth:`_unsubscribe_channel` and the message kinds) are what differs.
    """

    _MESSAGE = "message"
    """The kind of a notification (``smessage`` for sharded pub/sub)."""
    _MESSAGE_BYTES = b"message"
    _SUBSCRIBED = "subscribe"
    """The kind of a subscription's confirmation (``ssubscribe`` for sharded pub/sub)."""

    def __init__(self, source: LiveSource) -> None:
        self._calls = source.calls
        self._pages = source.pages
        self._check_script = source.check_script
        self._prefix = source.prefix
        self._outage_grace = source.outage_grace
        self._feeds: dict[str, LiveFeed] = {}
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
        self._subscribed = asyncio.Event()
        """Set when a SUBSCRIBE went out: an idle reader starts reading at once."""

    @property
    def threads(self) -> int:
        """How many threads this reader serves."""
        return len(self._feeds)

    @property
    def _pong_deadline(self) -> float:
        return min(PONG_DEADLINE, self._calls.op_timeout)

    async def register(self, sub: FeedSubscription) -> None:
        """Serve *sub*'s thread live; bounded by the store's ``op_timeout``."""
        try:
            async with asyncio.timeout(self._calls.op_timeout):
                await self._register(sub)
        except TimeoutError:
            raise self._calls.timed_out(f"the subscription to thread {sub.thread!r}") from None

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
            feed = self._feeds[thread] = LiveFeed(cursor=START)
            feed.subs.add(sub)  # before any await: the confirmation may come first
            channel = notify_channel(self._prefix, thread)
            try:
                # Cursor first, then SUBSCRIBE; once the subscription is confirmed
                # the reader reads after the cursor, covering the window between.
                feed.cursor = await self._pages.last_offset(thread)
                self._channels[channel.encode()] = thread
                self._ensure_running()
                async with self._pubsub_lock:
                    await self._calls.call(self._subscribe_channels([channel]))
                self._subscribed.set()
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
        """Stop serving *sub*; the thread's channel is left with its last subscriber."""
        feed = self._feeds.get(sub.thread)
        if feed is None:
            return
        feed.subs.discard(sub)
        if not feed.subs and feed.ready.is_set():
            self._drop(sub.thread, unsubscribe=True)

    def _drop(self, thread: str, *, unsubscribe: bool = False) -> None:
        self._feeds.pop(thread, None)
        channel = notify_channel(self._prefix, thread)
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
            async with asyncio.timeout(self._calls.op_timeout), self._pubsub_lock:
                if self._closed or channel.encode() in self._channels:
                    return  # closing, or the thread became live again meanwhile
                await bounded(self._unsubscribe_channel(channel), self._calls.op_timeout)

    def _new_pubsub(self) -> Any:
        """A pub/sub object (its connection opens with its first command)."""
        return self._calls.client.pubsub()

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
        calls = self._calls
        while not self._closed:
            try:
                if reconnect:
                    # Bounded: a half-open or stalled connection must not hang the
                    # reader, nor keep it from failing its subscriptions in time.
                    timeout = calls.op_timeout
                    if down_since is not None:
                        left = self._outage_grace - (loop.time() - down_since)
                        timeout = max(0.1, min(timeout, left + 0.05))
                    await bounded(self._resubscribe(), timeout)
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
                if now - down_since >= self._outage_grace:
                    self._fail_all(
                        StoreUnavailable(
                            f"Redis at {calls.url} is unavailable "
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
            channels = [notify_channel(self._prefix, t) for t in self._feeds]
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
        calls, prefix = self._calls, self._prefix
        feeds = [
            (thread, feed)
            for thread in threads
            if (feed := self._feeds.get(thread)) is not None
            and feed.epoch is not None
            and feed.cursor != START
        ]
        if not feeds:
            return
        checks = [
            (
                4,
                stream_key(prefix, thread),
                meta_key(prefix, thread),
                checkpoint_key(prefix, thread),
                runs_key(prefix, thread),
                feed.cursor,
                feed.epoch or "",
                secrets.token_hex(8),
                notify_channel(prefix, thread),
            )
            for thread, feed in feeds
        ]
        results: list[Any] = []
        for _attempt in range(2):
            pipe = calls.client.pipeline(transaction=False)
            for check in checks:
                pipe.evalsha(self._check_script.sha, *check)
            results = await calls.call(pipe.execute(raise_on_error=False))
            if not any(isinstance(r, NoScriptError) for r in results):
                break
            await calls.call(calls.load_script(self._check_script.source))
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
                    text(result[0]),
                )
            self._dirty.add(thread)

    async def _pump(self) -> None:
        """Wait for notifications, then fetch what they announce.

        A connection silent for :data:`SILENCE` seconds gets a PING; no answer
        within the deadline raises :class:`_Stalled` (an outage).
        """
        pubsub = self._pubsub
        if not self._channels or pubsub is None or pubsub.connection is None:
            # Nothing subscribed (yet): wait for a SUBSCRIBE to go out, whose
            # confirmation the next turn reads (50 ms at most, to look again).
            self._ping_sent = None
            self._subscribed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):
                    await self._subscribed.wait()
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
                    await bounded(pubsub.ping(_PING_TOKEN), self._calls.op_timeout)
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

    def _carried(self, thread: str, feed: LiveFeed, data: Any) -> bool:
        """Deliver the entries a notification carries; ``False``: read them instead.

        Only when they follow the feed's cursor exactly in the feed's epoch
        (nothing in between was missed) and the feed is not waiting for a
        read already: otherwise, and for a plain producer's notification (an
        offset), the thread is read after its cursor as before.
        """
        if not feed.ready.is_set() or type(data) is not bytes or data[:2] != _CARRIED:
            return False
        carried = carried_entries(data, feed.cursor, feed.epoch)
        if carried is None:
            return False
        epoch, entries = carried
        if not entries:
            return True  # read already
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
        pages = await self._pages.read_batch(cursors, PAGE_SIZE)
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

    async def _deliver(self, thread: str, feed: LiveFeed, page: Page) -> None:
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
            feed.cursor = await self._pages.last_offset(thread)
            return
        if entries:
            feed.cursor = entries[-1].offset
            for sub in list(feed.subs):
                sub._on_live(entries, epoch)
            if len(entries) == PAGE_SIZE:
                self._dirty.add(thread)

    async def close(self) -> None:
        """Stop reading, and close the subscriptions still registered."""
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


def carried_entries(
    data: bytes, cursor: Offset, epoch: str | None
) -> tuple[str, list[Entry]] | None:
    """The epoch and entries a notification (*data*, see :data:`_CARRIED`)
    carries, if they follow *cursor* exactly in *epoch* (``None``: any epoch);
    no entries when all of them are at or before *cursor* in that epoch (a
    read made after the append took them already); ``None`` when they do not
    follow, or when *data* is not such a notification: the thread is then
    read after its cursor instead.
    """
    try:
        _, epoch_raw, prev, flat = msgpack.unpackb(data, raw=True, use_list=True)
        carried_epoch = epoch_raw.decode()
        if epoch is not None and carried_epoch != epoch:
            return None
        if not flat or len(flat) % 5 or not all(type(x) is bytes for x in flat):
            return None
        if prev.decode() != cursor:
            read = epoch is not None and offset_key(flat[-5].decode()) <= offset_key(cursor)
            return (carried_epoch, []) if read else None
        # Anyone may publish on the channel: only entries that really
        # follow the cursor, in order, are believed (else: read).
        last = offset_key(cursor)
        entries = []
        for i in range(0, len(flat), 5):
            offset = flat[i].decode()
            key = offset_key(offset)
            if key <= last:
                return None
            last = key
            run = flat[i + 2].decode()
            entries.append(
                Entry(offset, flat[i + 4], flat[i + 1].decode(), run or None, flat[i + 3].decode())
            )
    except Exception:  # not ours after all, whatever it is: read
        return None
    return carried_epoch, entries


async def _close_quietly(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("redis live reader: %s", task.exception())
