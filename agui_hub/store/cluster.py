"""The Redis store on Redis Cluster (``redis+cluster://``, ``rediss+cluster://``).

:class:`~agui_hub.store.redis.RedisStore` talks to a cluster when its URL
says so::

    redis+cluster://10.0.0.1:7000,10.0.0.2:7000/?prefix=agui&ttl=86400

The hosts are seeds: any reachable one tells the store the whole cluster
(CLUSTER SLOTS), and the store follows the cluster's changes. What differs
from a single Redis is here; the key layout, scripts and contracts are the
same (docs/store.md), and docs/cluster.md says what a failover costs.

- Every key of a thread carries the ``{thread}`` hash tag, so a thread lives
  in one slot, on one master: the append script, the read script and the
  rewind check each run on the thread's master (EVALSHA per master, the
  script loaded again on a master that does not know it, after a failover).
- Notifications are sharded pub/sub: the scripts SPUBLISH on the thread's
  ``notify`` channel (same slot), which reaches only the subscribers
  connected to that master (PUBLISH would be broadcast to every node).
- The live reader keeps one pub/sub connection per master (SSUBSCRIBE), not
  per thread: :class:`ClusterLiveReader` routes each live thread to the
  reader of its slot's master (a :class:`_ShardReader`, the single-node
  reader on one master's connection) and moves threads between them when
  slots move: a lost connection, a MOVED reply, a ``sunsubscribe`` Redis
  sends when its node loses a slot, or the periodic check of the slot map.
  A moved thread keeps its cursor and is subscribed on its new master; the
  confirmation makes the reader check the entry at the cursor (a failover to
  a replica that had not received the newest entries is a rewind: the thread
  gets a new epoch and its subscribers resync) and read after the cursor.
- ``max_tenant_threads`` is refused: the tenant's set of threads and its
  threads are in different slots, which one script cannot check atomically.

Needs Redis 7.0 or later (sharded pub/sub).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisError, SlotNotCoveredError

from ..errors import StoreError, StoreUnavailable
from ..wire.offsets import Offset
from .contract import FeedSubscription, offset_key
from .redis import (
    _MAX_OFFSET,
    CLUSTER_SCHEMES,
    _Feed,
    _LiveReader,
    meta_key,
    notify_channel,
    stream_key,
)

if TYPE_CHECKING:
    from .redis import RedisStore

__all__ = ["READ_SCRIPT", "ClusterLiveReader", "ClusterOps", "cluster_options"]

log = logging.getLogger("agui_hub.redis_cluster")

DEFAULT_PORT = 6379

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


# -- the URL --------------------------------------------------------------------------------


def cluster_options(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes and redis-py options of a ``redis+cluster://`` URL.

    ``redis+cluster://[user[:password]@]host[:port][,host[:port]...][/0][?options]``;
    ``rediss+cluster://`` for TLS. The options are those of ``redis://`` that
    redis-py's cluster client takes (``ssl_*`` only with ``rediss+cluster``);
    a database other than 0 (a cluster has only 0), an empty host list or an
    option the cluster client does not take is a :class:`ValueError`.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES:
        raise ValueError(
            f"not a Redis Cluster URL (redis+cluster:// or rediss+cluster://): {scheme}"
        )
    userinfo, at, hosts = parts.netloc.rpartition("@")
    seeds = [_host_port(item) for item in hosts.split(",")]
    path = parts.path.strip("/")
    if path not in ("", "0"):
        raise ValueError(
            f"Redis Cluster has only database 0: drop /{path} from the store URL "
            "(use the prefix option to keep several hubs apart)"
        )
    first_host, first_port = seeds[0]
    host = f"[{first_host}]" if ":" in first_host else first_host
    single = (
        f"{scheme.removesuffix('+cluster')}://{userinfo + '@' if at else ''}"
        f"{host}:{first_port}/0" + (f"?{parts.query}" if parts.query else "")
    )
    options: dict[str, Any] = dict(parse_url(single))
    if options.pop("db", 0) not in (0, None):
        raise ValueError("Redis Cluster has only database 0: drop the db option from the URL")
    for name in ("host", "port"):
        options.pop(name, None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    accepted = inspect.signature(RedisCluster.__init__).parameters
    for name in options:
        if name not in accepted:
            raise ValueError(f"store URL option {name!r} does not apply to Redis Cluster")
    return seeds, options


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(
            "a Redis Cluster URL needs host:port of at least one node, comma-separated"
        )
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port {port!r} for {host} in the Redis Cluster URL")
    return host, int(port)


# -- scripts ----------------------------------------------------------------------------------


def sharded(script: str) -> str:
    """*script* with its notifications on sharded pub/sub (SPUBLISH: only the
    subscribers of the thread's master receive them)."""
    replaced = script.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
    assert "'PUBLISH'" not in replaced
    return replaced


# KEYS: stream, meta; ARGV: after ("" for nothing: only meta), count (0: all).
# Returns {epoch or nil, trimmed or nil, entries after `after`}: what the
# single-node store reads in one MULTI (HMGET + XRANGE), atomically, in the slot.
READ_SCRIPT = """
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
"""


# -- the client and what differs ------------------------------------------------------------


class ClusterOps:
    """What :class:`~agui_hub.store.redis.RedisStore` does differently on a cluster.

    Owns the redis-py cluster client (:attr:`client`). Each method returns
    what the store's single-node code gets from its own calls, so the store
    keeps one code path around them (bounded by ``op_timeout``, errors
    mapped to :class:`~agui_hub.errors.StoreUnavailable` / ``StoreError``).
    """

    def __init__(
        self, store: RedisStore, url: str, max_connections: int, socket_timeout: float
    ) -> None:
        seeds, options = cluster_options(url)
        self._store = store
        # The store bounds the commands in flight to max_connections (the
        # cluster client fails instead of waiting for a free connection); the
        # slack covers commands abandoned on their deadline still winding down.
        self.max_connections = int(options.pop("max_connections", max_connections))
        settings: dict[str, Any] = {
            "max_connections": 2 * self.max_connections,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
            "health_check_interval": 15,
            "decode_responses": False,
            "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        }
        settings.update(options)
        if settings.get("decode_responses"):
            raise ValueError("decode_responses must stay off: event payloads are msgpack bytes")
        self.client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in seeds], **settings
        )
        try:
            # A thread's epoch is made in a MULTI on its slot: older redis-py cluster
            # clients refuse transactions outright (before any network I/O).
            self.client.pipeline(transaction=True)
        except RedisError as exc:
            raise ValueError(
                f"this redis-py ({redis.__version__}) has no transactions on Redis Cluster "
                f"({exc}): the cluster store needs a newer one, pip install -U 'redis[hiredis]'"
            ) from None
        self._read_sha = _sha(READ_SCRIPT)

    def scripts(self, append: str, check: str) -> tuple[str, str]:
        """The append and rewind-check scripts as they run on a cluster."""
        return sharded(append), sharded(check)

    def live_reader(self) -> ClusterLiveReader:
        return ClusterLiveReader(self._store, self)

    async def load_script(self, script: str) -> None:
        """SCRIPT LOAD on every master (a replica promoted by a failover may not
        have the scripts the old master had)."""
        await self.client.execute_command(
            "SCRIPT LOAD", script, target_nodes=RedisCluster.PRIMARIES
        )

    async def run_scripts(
        self, script: str, sha: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """EVALSHA *sha* for each (keys, args) in *calls*, on the master of its keys'
        slot; each reply in order, an error as its exception.

        One pipeline: redis-py sends each master its calls at once, follows
        MOVED / ASK per call and retries connection errors after refreshing
        the slot map (safe: the scripts are idempotent, see the store). Calls
        a master answers NOSCRIPT to are sent again after loading *script*.
        """
        limit = self._store._limit
        assert limit is not None
        async with limit:
            return await self._run_scripts(script, sha, calls)

    async def _run_scripts(
        self, script: str, sha: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        replies = await self._evalsha(sha, calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            await self.load_script(script)
            again = await self._evalsha(sha, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _evalsha(
        self, sha: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    async def read_pages(
        self, cursors: Sequence[tuple[str, Offset]], limit: int | None
    ) -> list[Any]:
        """For each (thread, after): ``[epoch, trimmed, raw entries]`` (or the
        exception), read atomically on the thread's master. (Called through the
        store's ``_call``, which bounds it.)"""
        prefix = self._store.prefix
        calls = []
        for thread, after in cursors:
            keys = [stream_key(prefix, thread), meta_key(prefix, thread)]
            tail = offset_key(after) == _MAX_OFFSET  # nothing can follow it
            calls.append((keys, ["" if tail else after, limit or 0]))
        return await self._run_scripts(READ_SCRIPT, self._read_sha, calls)

    async def scan(self, pattern: str, limit: int) -> list[bytes]:
        """Keys matching *pattern* (streams) on every master, up to about *limit*."""
        found: list[bytes] = []
        async for key in self.client.scan_iter(
            match=pattern, count=1000, _type="stream", target_nodes=RedisCluster.PRIMARIES
        ):
            found.append(key)
            if len(found) >= limit:
                break
        return found

    async def ping(self) -> None:
        """PING every master of the current slot map."""
        await self.client.execute_command("PING", target_nodes=RedisCluster.PRIMARIES)

    async def config_get(self, names: Sequence[str]) -> dict[str, list[Any]]:
        """CONFIG GET *names* on every master: replies per master (a dict, or the
        exception), keyed by how the store names it in a warning."""
        if not self.client.get_primaries():
            await self.client.initialize()
        out: dict[str, list[Any]] = {}
        for node in self.client.get_primaries():
            try:
                reply: Any = await self.client.config_get(*names, target_nodes=node)
            except Exception as exc:
                reply = exc
            out[f"{self._store.url} (master {node.name})"] = [reply]
        return out

    def owner(self, thread: str) -> ClusterNode:
        """The master of *thread*'s slot in the client's slot map (SlotNotCoveredError
        before the client knows the cluster)."""
        slot = key_slot(notify_channel(self._store.prefix, thread).encode())
        return self.client.nodes_manager.get_node_from_slot(slot)

    def lane(self, thread: str) -> str:
        """Which appends *thread*'s share a round trip with: its master's (host:port),
        or ``""`` before the client knows the cluster."""
        try:
            return self.owner(thread).name
        except SlotNotCoveredError:
            return ""

    def node_options(self) -> dict[str, Any]:
        """Connection options of a connection of ours to one node (pub/sub)."""
        options = dict(self.client.get_connection_kwargs())
        for name in ("max_connections", "response_callbacks", "redis_connect_func"):
            options.pop(name, None)
        return options


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


# -- the live reader --------------------------------------------------------------------------


class _ShardReader(_LiveReader):
    """The live threads of one master, on one sharded pub/sub connection to it.

    The single-node reader (cursors, carried entries, catch-up reads, rewind
    checks, outage handling) with SSUBSCRIBE. When its connection is lost it
    asks :class:`ClusterLiveReader` to refresh the slot map first, so that
    the threads a failover moved go to their new master's reader.
    """

    _MESSAGE = "smessage"
    _MESSAGE_BYTES = b"smessage"
    _SUBSCRIBED = "ssubscribe"

    def __init__(self, store: RedisStore, router: ClusterLiveReader, node: ClusterNode) -> None:
        super().__init__(store)
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

    def adopt(self, thread: str, feed: _Feed) -> None:
        """Serve *thread* (with its *feed*: cursor, epoch, subscribers) from now on."""
        channel = notify_channel(self._store.prefix, thread)
        self._feeds[thread] = feed
        self._channels[channel.encode()] = thread
        self._ensure_running()
        self._chore(self._subscribe_adopted(channel))

    def release(self, thread: str) -> _Feed:
        """Stop serving *thread*; its feed (for :meth:`adopt` on another reader)."""
        feed = self._feeds.pop(thread)
        channel = notify_channel(self._store.prefix, thread).encode()
        self._channels.pop(channel, None)
        self._dirty.discard(thread)
        self._recheck.discard(thread)
        self._forget_channel(channel)
        return feed

    async def _subscribe_adopted(self, channel: str) -> None:
        try:
            async with asyncio.timeout(self._store.op_timeout), self._pubsub_lock:
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
        prefix = self._store.prefix
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
    """The live reader of a store on Redis Cluster: one :class:`_ShardReader` per
    master, each thread served by its slot's master's reader.

    Threads move between readers when their slot's master changes; a moved
    thread keeps its cursor and epoch, so its subscribers see nothing but, at
    worst, a resync when the failover lost entries they had read.
    """

    def __init__(self, store: RedisStore, ops: ClusterOps) -> None:
        self._store = store
        self.ops = ops
        self._shards: dict[str, _ShardReader] = {}
        self._refresh_lock = asyncio.Lock()
        self._refreshed = -math.inf
        self._watch: asyncio.Task[None] | None = None
        self._chores: set[asyncio.Future[None]] = set()
        self._lost: dict[_ShardReader, set[str]] = {}
        """Per reader, the threads whose subscription Redis dropped (see :meth:`moved`)."""
        self._following: set[_ShardReader] = set()
        self._retired: list[_ShardReader] = []
        """Readers of nodes that serve nothing any more, closed (or closing)."""
        self._closed = False

    @property
    def threads(self) -> int:
        return sum(len(shard._feeds) for shard in self._shards.values())

    @property
    def masters(self) -> list[str]:
        """The masters this reader holds a live connection for (host:port)."""
        return sorted(name for name, shard in self._shards.items() if shard._feeds)

    async def register(self, sub: FeedSubscription) -> None:
        """Serve *sub*'s thread live; bounded by the store's ``op_timeout``."""
        try:
            async with asyncio.timeout(self._store.op_timeout):
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
            raise self._store._timed_out(f"the subscription to thread {sub.thread!r}") from None

    def unregister(self, sub: FeedSubscription) -> None:
        shard = self._holder(sub.thread)
        if shard is not None:
            shard.unregister(sub)

    def _holder(self, thread: str) -> _ShardReader | None:
        for shard in self._shards.values():
            if thread in shard._feeds:
                return shard
        return None

    async def _owner(self, thread: str) -> ClusterNode:
        try:
            return self.ops.owner(thread)
        except SlotNotCoveredError:
            # The client has not met the cluster yet (or lost its slot map).
            await self._store._call(self.ops.client.initialize())
            try:
                return self.ops.owner(thread)
            except SlotNotCoveredError as exc:
                raise StoreUnavailable(f"Redis Cluster at {self._store.url}: {exc}") from exc

    def _shard(self, node: ClusterNode) -> _ShardReader:
        shard = self._shards.get(node.name)
        if shard is None:
            shard = self._shards[node.name] = _ShardReader(self._store, self, node)
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
                    await self._store._call(self.ops.client.nodes_manager.initialize())
                except StoreError as exc:
                    log.warning("redis cluster: reading the slot map failed: %s", exc)
                self._refreshed = loop.time()
            self.reroute()

    def moved(self, shard: _ShardReader, thread: str) -> None:
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

    async def _follow(self, shard: _ShardReader) -> None:
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
