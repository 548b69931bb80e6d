"""The live reader on Redis Cluster: one sharded pub/sub connection per master.

:class:`ClusterLiveReader` routes each live thread to the :class:`ShardReader`
of its slot's master (the single-node :class:`~agui_hub.store.redis.live.LiveReader`
on one master's connection, with SSUBSCRIBE) and moves threads between them
when slots move: a lost connection, a MOVED reply, a ``sunsubscribe`` Redis
sends when its node loses a slot, or the periodic check of the slot map. A
moved thread keeps its cursor and is subscribed on its new master; the
confirmation makes the reader check the entry at the cursor (a failover to a
replica that had not received the newest entries is a rewind: the thread gets
a new epoch and its subscribers resync) and read after the cursor. See
:mod:`agui_hub.store.redis.cluster` for the rest of what differs on a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.crc import key_slot
from redis.exceptions import SlotNotCoveredError

from ...errors import StoreError, StoreUnavailable
from ..contract import FeedSubscription
from .cluster import ClusterOps
from .keys import notify_channel
from .live import LiveFeed, LiveReader, LiveSource

__all__ = ["ClusterLiveReader", "ShardReader"]

log = logging.getLogger("agui_hub.redis_cluster")

CHECK_INTERVAL = 1.0
"""Seconds between two checks that every live thread is served by the reader of
its slot's master (in the client's slot map, which MOVED replies update)."""

REFRESH_INTERVAL = 5.0
"""Seconds between two topology refreshes (CLUSTER SLOTS) while threads are live:
a slot can move without any error reaching this process."""

REFRESH_SPACING = 0.25
"""Refreshes asked for at once (several masters' readers reconnecting) share one."""

FOLLOW_FOR = 10.0
"""Seconds a thread whose subscription Redis dropped (its slot moved) waits for
the slot map to name its new master before it is subscribed again in place."""


class ShardReader(LiveReader):
    """The live threads of one master, on one sharded pub/sub connection to it.

    The single-node reader (cursors, carried entries, catch-up reads, rewind
    checks, outage handling) with SSUBSCRIBE. When its connection is lost it
    asks :class:`ClusterLiveReader` to refresh the slot map first, so that
    the threads a failover moved go to their new master's reader.
    """

    _MESSAGE = "smessage"
    _MESSAGE_BYTES = b"smessage"
    _SUBSCRIBED = "ssubscribe"

    def __init__(self, source: LiveSource, router: ClusterLiveReader, node: ClusterNode) -> None:
        super().__init__(source)
        self.node = node.name
        self._router = router
        options = router.ops.node_options()
        connection_class = options.pop("connection_class", aioredis.Connection)
        pool = aioredis.ConnectionPool(
            connection_class=connection_class,
            max_connections=2,  # the pub/sub connection, and its replacement
            host=node.host,
            port=node.port,
            **options,
        )
        self._redis = aioredis.Redis(connection_pool=pool)
        self._broken: BaseException | None = None
        """A subscription that could not be sent: the next pass reconnects."""

    def __repr__(self) -> str:
        return f"<live reader of {self.node}: {len(self._feeds)} threads>"

    def _new_pubsub(self) -> Any:
        return self._redis.pubsub()

    async def _subscribe_channels(self, channels: Sequence[str]) -> None:
        # One SSUBSCRIBE names channels of one slot only.
        by_slot: dict[int, list[str]] = {}
        for channel in channels:
            by_slot.setdefault(key_slot(channel.encode()), []).append(channel)
        for group in by_slot.values():
            await self._pubsub.ssubscribe(*group)

    async def _unsubscribe_channel(self, channel: str) -> None:
        await self._pubsub.sunsubscribe(channel)

    async def _resubscribe(self) -> None:
        # The master may be gone (failover) or serve other slots now: the
        # threads it no longer serves move to their masters' readers first.
        await self._router.refresh()
        self._broken = None
        await super()._resubscribe()

    async def _pump(self) -> None:
        if self._broken is not None:
            broken, self._broken = self._broken, None
            raise broken
        await super()._pump()

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "sunsubscribe":
            channel = message.get("channel")
            if isinstance(channel, bytes) and channel in self._channels:
                # Not asked for (an UNSUBSCRIBE is sent only for a channel
                # already forgotten): Redis drops the subscriptions of a slot its
                # node lost. The thread moves to the slot's new master.
                self._forget_channel(channel)
                self._router.moved(self, self._channels[channel])
        super()._handle(message)

    def _forget_channel(self, channel: bytes) -> None:
        """Keep redis-py's pub/sub from subscribing *channel* here again when it
        reconnects on its own."""
        pubsub = self._pubsub
        if pubsub is not None:
            for name in (channel, channel.decode(errors="replace")):
                pubsub.shard_channels.pop(name, None)

    def adopt(self, thread: str, feed: LiveFeed) -> None:
        """Serve *thread* (with its *feed*: cursor, epoch, subscribers) from now on."""
        channel = notify_channel(self._prefix, thread)
        self._feeds[thread] = feed
        self._channels[channel.encode()] = thread
        self._ensure_running()
        self._chore(self._subscribe_adopted(channel))

    def release(self, thread: str) -> LiveFeed:
        """Stop serving *thread*; its feed (for :meth:`adopt` on another reader)."""
        feed = self._feeds.pop(thread)
        channel = notify_channel(self._prefix, thread).encode()
        self._channels.pop(channel, None)
        self._dirty.discard(thread)
        self._recheck.discard(thread)
        self._forget_channel(channel)
        return feed

    async def _subscribe_adopted(self, channel: str) -> None:
        try:
            async with asyncio.timeout(self._calls.op_timeout), self._pubsub_lock:
                if self._closed or channel.encode() not in self._channels:
                    return
                await self._subscribe_channels([channel])
        except Exception as exc:
            # The next pass reconnects, and subscribes every thread of this reader.
            log.warning("redis cluster: subscribing on %s failed: %r", self.node, exc)
            self._broken = self._broken or StoreUnavailable(
                f"subscribing on {self.node} failed: {exc!r}"
            )

    def movable(self) -> list[str]:
        """The threads whose subscription was confirmed (or is due on a reconnect).

        A feed whose first subscribe is still pending stays: its registration
        settles it here (a failure then reaches only its own waiters), and the
        next check moves it once it is ready."""
        prefix = self._prefix
        return [
            thread
            for thread, feed in self._feeds.items()
            if feed.ready.is_set() and notify_channel(prefix, thread).encode() in self._channels
        ]

    async def close(self) -> None:
        await super().close()
        with contextlib.suppress(Exception):
            await self._redis.aclose()
        with contextlib.suppress(Exception):
            await self._redis.connection_pool.disconnect()


class ClusterLiveReader:
    """The live reader of a store on Redis Cluster: one :class:`ShardReader` per
    master, each thread served by its slot's master's reader.

    Threads move between readers when their slot's master changes; a moved
    thread keeps its cursor and epoch, so its subscribers see nothing but, at
    worst, a resync when the failover lost entries they had read. *source* is
    what each master's reader works with, *ops* the cluster's client (whose
    slot map says which master serves a thread). The store uses it as it uses
    a single-node :class:`~agui_hub.store.redis.live.LiveReader`.
    """

    def __init__(self, source: LiveSource, ops: ClusterOps) -> None:
        self._source = source
        self._calls = source.calls
        self.ops = ops
        self._shards: dict[str, ShardReader] = {}
        self._refresh_lock = asyncio.Lock()
        self._refreshed = -math.inf
        self._watch: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Future[None]] = set()
        self._lost: dict[ShardReader, set[str]] = {}
        """Per reader, the threads whose subscription Redis dropped (see :meth:`moved`)."""
        self._following: set[ShardReader] = set()
        self._retired: list[ShardReader] = []
        """Readers of nodes that serve nothing any more, closed (or closing)."""
        self._closed = False

    @property
    def threads(self) -> int:
        """How many threads the readers of all masters serve."""
        return sum(len(shard._feeds) for shard in self._shards.values())

    @property
    def masters(self) -> list[str]:
        """The masters this reader holds a live connection for (host:port)."""
        return sorted(name for name, shard in self._shards.items() if shard._feeds)

    async def register(self, sub: FeedSubscription) -> None:
        """Serve *sub*'s thread live; bounded by the store's ``op_timeout``."""
        try:
            async with asyncio.timeout(self._calls.op_timeout):
                self._ensure_watching()
                while True:
                    # Where the thread is served now (it may move while a
                    # registration that this one waited on was cancelled).
                    owner = None if self._holder(sub.thread) else await self._owner(sub.thread)
                    shard = self._holder(sub.thread)
                    if shard is None:
                        assert owner is not None
                        shard = self._shard(owner)
                    if await shard._register_once(sub):
                        return
                    await asyncio.sleep(0)  # never a busy loop: the deadline must fire
        except TimeoutError:
            raise self._calls.timed_out(f"the subscription to thread {sub.thread!r}") from None

    def unregister(self, sub: FeedSubscription) -> None:
        shard = self._holder(sub.thread)
        if shard is not None:
            shard.unregister(sub)

    def _holder(self, thread: str) -> ShardReader | None:
        for shard in self._shards.values():
            if thread in shard._feeds:
                return shard
        return None

    async def _owner(self, thread: str) -> ClusterNode:
        try:
            return self.ops.owner(thread)
        except SlotNotCoveredError:
            # The client has not met the cluster yet (or lost its slot map).
            await self._calls.call(self.ops.client.initialize())
            try:
                return self.ops.owner(thread)
            except SlotNotCoveredError as exc:
                raise StoreUnavailable(f"Redis Cluster at {self._calls.url}: {exc}") from exc

    def _shard(self, node: ClusterNode) -> ShardReader:
        shard = self._shards.get(node.name)
        if shard is None:
            shard = self._shards[node.name] = ShardReader(self._source, self, node)
        return shard

    # -- following the slots ------------------------------------------------------------

    async def refresh(self) -> None:
        """Read the slot map again (CLUSTER SLOTS, from any reachable node), then
        move each live thread to its master's reader. Never raises a Redis error:
        an unreachable cluster keeps the slot map it had."""
        async with self._refresh_lock:
            loop = asyncio.get_running_loop()
            if loop.time() - self._refreshed >= REFRESH_SPACING:
                try:
                    await self._calls.call(self.ops.client.nodes_manager.initialize())
                except StoreError as exc:
                    log.warning("redis cluster: reading the slot map failed: %s", exc)
                self._refreshed = loop.time()
            self.reroute()

    def moved(self, shard: ShardReader, thread: str) -> None:
        """Redis dropped *thread*'s subscription on *shard*'s node: its slot moved.

        The nodes learn of a new owner a little after the old one lets go, so
        the slot map is read again until it names another master for the
        thread (then the thread moves), for up to :data:`FOLLOW_FOR` seconds;
        after that the thread is subscribed again where the map says it is.
        """
        if self._closed:
            return
        self._lost.setdefault(shard, set()).add(thread)
        if shard not in self._following:
            self._following.add(shard)
            self._chore(self._follow(shard))

    async def _follow(self, shard: ShardReader) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FOLLOW_FOR
        pause = REFRESH_SPACING
        try:
            while True:
                await asyncio.sleep(pause)
                await self.refresh()
                lost = self._lost.get(shard, set())
                lost &= set(shard._feeds)  # the moved ones (and those dropped) are done
                if not lost:
                    return
                if loop.time() >= deadline:
                    break
                pause = min(pause * 2, 1.0)
            # The slot map still says this node: subscribe again (a MOVED reply
            # makes the reader reconnect, which reads the map once more).
            for thread in lost:
                shard.adopt(thread, shard.release(thread))
        finally:
            self._following.discard(shard)
            self._lost.pop(shard, None)

    def reroute(self) -> None:
        """Move every live thread whose slot another master serves now to that
        master's reader; close the readers of nodes that serve nothing."""
        for shard in list(self._shards.values()):
            for thread in shard.movable():
                try:
                    owner = self.ops.owner(thread)
                except SlotNotCoveredError:
                    continue  # no slot map for now: stay
                if owner.name != shard.node:
                    target = self._shard(owner)
                    log.info(
                        "redis cluster: thread %r moves from %s to %s",
                        thread,
                        shard.node,
                        owner.name,
                    )
                    target.adopt(thread, shard.release(thread))
        masters = {node.name for node in self.ops.client.get_primaries()}
        for name, shard in list(self._shards.items()):
            if not shard._feeds and name not in masters:
                del self._shards[name]
                self._retired.append(shard)
                self._chore(shard.close())

    def _ensure_watching(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watching(), name="agui-hub cluster watch")

    async def _watching(self) -> None:
        """Every :data:`CHECK_INTERVAL` seconds, reroute against the client's slot map
        (which MOVED replies to commands update); every :data:`REFRESH_INTERVAL`,
        read the slot map first."""
        loop = asyncio.get_running_loop()
        while not self._closed:
            await asyncio.sleep(CHECK_INTERVAL)
            try:
                if not self.threads:
                    continue
                if loop.time() - self._refreshed >= REFRESH_INTERVAL:
                    await self.refresh()
                else:
                    self.reroute()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("redis cluster: following the slot map failed")

    def _chore(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)
        task.add_done_callback(_log_failure)

    async def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for chore in list(self._chores):
            chore.cancel()
        for shard in [*self._shards.values(), *self._retired]:
            await shard.close()
        self._shards.clear()
        self._retired.clear()


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("redis cluster: %s", task.exception())
