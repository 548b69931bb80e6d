"""The Redis store on a real Redis Cluster: three masters and three replicas on
loopback (tests/redis_cluster.py), threads on every master, gateways on the
cluster, and master failovers during a run."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest
from redis.crc import key_slot

from agui_hub.client.hub_client import HubClient, Item, Snapshot, ThreadEvent
from agui_hub.client.publisher import Publisher
from agui_hub.errors import AppendConflict, StoreError, StoreUnavailable, ThreadReset
from agui_hub.store.contract import (
    START,
    Checkpoint,
    EventInput,
    Expected,
    FeedSubscription,
    PresenceChange,
    PresenceEntry,
    Retention,
    offset_key,
)
from agui_hub.store.redis.cluster import cluster_options
from agui_hub.store.redis.keys import presence_keys
from agui_hub.store.redis.store import (
    RedisStore,
    checkpoint_key,
    ids_key,
    meta_key,
    notify_channel,
    stream_key,
)

from ..conftest import TIMEOUT_SCALE
from ..processes import Gateways, http_status
from .test_store import BRACE_NAMES, names_round_trip

if TYPE_CHECKING:
    from ..redis_cluster import ClusterNode, RedisCluster

pytest_plugins = ["tests.redis_cluster"]  # the redis_cluster and own_redis_cluster fixtures

pytestmark = pytest.mark.timeout(180)


def item(thread: str, i: int) -> EventInput:
    event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}"}
    return EventInput.of(event, f"{thread}-e{i}")


def url_of(cluster: RedisCluster, prefix: str) -> str:
    """The cluster's store URL with *prefix* (tests share the cluster)."""
    return f"{cluster.url}?prefix={prefix}"


def fresh_prefix() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


@contextlib.asynccontextmanager
async def cluster_store(cluster: RedisCluster, **options: Any) -> AsyncIterator[RedisStore]:
    store = RedisStore(cluster.url, prefix=fresh_prefix(), **options)
    try:
        yield store
    finally:
        await store.close()


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout * TIMEOUT_SCALE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# -- the URL -----------------------------------------------------------------------------------


def test_a_cluster_url_names_seeds_and_options() -> None:
    seeds, options = cluster_options(
        "redis+cluster://user:secret@10.0.0.1:7000,10.0.0.2,[::1]:7002/?socket_timeout=2"
    )
    assert seeds == [("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002)]
    assert options["username"] == "user" and options["password"] == "secret"
    assert options["socket_timeout"] == 2.0 and "ssl" not in options
    _, tls = cluster_options("rediss+cluster://h:7000/0?ssl_cert_reqs=none")
    assert tls["ssl"] is True and tls["ssl_cert_reqs"] == "none"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://h:7000/3", "only database 0"),
        ("redis+cluster://h:7000/?db=2", "only database 0"),
        ("redis+cluster://h:70000/", "bad port"),
        ("redis+cluster://h:7000,,h2:7000/", "host:port"),
        ("redis+cluster://h:7000/?timeout=3", "does not apply to Redis Cluster"),
        ("redis+cluster://h:7000/?ssl_certfile=x", "needs a rediss:// URL"),
        ("redis+cluster://h:7000/?maxlen=5", "unknown store URL option 'maxlen'"),
    ],
)
def test_a_bad_cluster_url_is_refused_at_once(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisStore(url)


def test_a_tenant_quota_is_refused_on_a_cluster() -> None:
    with pytest.raises(ValueError, match="max_tenant_threads is not available on Redis Cluster"):
        RedisStore("redis+cluster://h:7000/", retention=Retention(max_tenant_threads=10))


def test_the_password_stays_out_of_the_cluster_store_url() -> None:
    store = RedisStore("redis+cluster://u:hunter2@h1:7000,h2:7001/")
    assert "hunter2" not in store.url and "hunter2" not in repr(store)
    assert "h1:7000,h2:7001" in store.url


# -- thread names with braces ---------------------------------------------------------------


async def test_names_with_braces_keep_their_keys_in_one_slot(redis_cluster: RedisCluster) -> None:
    """`}abc` as `{}abc}` would be hashed by the whole key, each key to its own slot,
    and its appends would fail CROSSSLOT: the tag is escaped, whatever the name."""
    names = [*BRACE_NAMES, "plain"]
    async with cluster_store(redis_cluster) as store:
        for name in names:
            builders = (stream_key, meta_key, ids_key, checkpoint_key, notify_channel)
            slots = {key_slot(build(store.prefix, name).encode()) for build in builders}
            assert len(slots) == 1, (name, slots)
        # The names land on more than one master: the test is not one node's.
        ranges = redis_cluster.slot_ranges()
        masters = {redis_cluster.master_of(stream_key(store.prefix, n), ranges).port for n in names}
        assert len(masters) > 1, masters
        await names_round_trip(store, names)


# -- publishing and reading on every master ------------------------------------------------


async def test_threads_on_every_master_are_written_and_read(redis_cluster: RedisCluster) -> None:
    threads = redis_cluster.threads_on_every_master(per_master=2)
    async with cluster_store(redis_cluster) as store:
        offsets = {}
        for thread in threads:
            offsets[thread] = await store.append(thread, [item(thread, i) for i in range(3)])
            # A retry stores nothing twice, on whichever master the thread is.
            assert await store.append(thread, [item(thread, 2)]) == offsets[thread][2:]
        ranges = redis_cluster.slot_ranges()
        for thread in threads:
            # The thread's stream is on its slot's master, and only there.
            master = redis_cluster.master_of(stream_key(store.prefix, thread), ranges)
            key = stream_key(store.prefix, thread)
            assert master.command("XLEN", key).strip() == "3"
            entries = await store.read(thread)
            assert [e.offset for e in entries] == offsets[thread]
            assert [e.event_id for e in entries] == [f"{thread}-e{i}" for i in range(3)]
            available = await store.read_available(thread, after=offsets[thread][0])
            assert [e.offset for e in available.entries] == offsets[thread][1:]
            assert not available.gap
            epoch = await store.epoch(thread)
            assert epoch is not None and available.epoch == epoch
            assert await store.last_offset(thread) == offsets[thread][-1]
            info = await store.info(thread)
            assert info is not None and info.length == 3 and info.last == offsets[thread][-1]
            assert await store.stored_ids(thread, [f"{thread}-e1", "nope"]) == {
                f"{thread}-e1": offsets[thread][1]
            }
            checkpoint = Checkpoint(offsets[thread][1], epoch, b"\x90", True)
            await store.put_checkpoint(thread, checkpoint)
            assert await store.get_checkpoint(thread) == checkpoint
            # A conditional append checks the expectation in the thread's slot.
            with pytest.raises(AppendConflict):
                await store.append(
                    thread, [item(thread, 9)], expect=Expected(epoch, offsets[thread][0])
                )
            stored = await store.append(
                thread, [item(thread, 9)], expect=Expected(epoch, offsets[thread][-1])
            )
            assert offset_key(stored[0]) > offset_key(offsets[thread][-1])
        assert await store.threads() == sorted(threads)
        assert await store.delete(threads[0])
        assert await store.epoch(threads[0]) is None
        assert await store.threads() == sorted(threads[1:])
        await store.ping()


async def test_a_master_that_lost_the_scripts_gets_them_again(redis_cluster: RedisCluster) -> None:
    """NOSCRIPT (a replica promoted, a SCRIPT FLUSH): the store loads its scripts
    on every master and sends the calls again; nothing is stored twice."""
    threads = redis_cluster.threads_on_every_master(per_master=1)
    async with cluster_store(redis_cluster) as store:
        first = {t: await store.append(t, [item(t, 0)]) for t in threads}
        for master in redis_cluster.masters_now():
            assert master.command("SCRIPT", "FLUSH").strip() == "OK"
        for thread in threads:
            again = await store.append(thread, [item(thread, 0), item(thread, 1)])
            assert again[0] == first[thread][0]
        for master in redis_cluster.masters_now():
            master.command("SCRIPT", "FLUSH")
        for thread in threads:  # the read script too
            assert len(await store.read(thread)) == 2


async def test_presence_of_threads_on_every_master_in_one_call(
    redis_cluster: RedisCluster,
) -> None:
    """One call: each master runs the script of its own threads (their keys in one
    slot), once per thread; a master that lost the scripts gets them again."""

    def evalsha_calls(master: ClusterNode) -> int:
        stats = master.info("commandstats").get("cmdstat_evalsha", "calls=0,")
        return int(stats.split(",")[0].removeprefix("calls="))

    per_master = 10
    threads = redis_cluster.threads_on_every_master(per_master=per_master)
    async with cluster_store(redis_cluster) as store:
        put = [
            PresenceChange(
                t, put=[PresenceEntry(f"{t}-b", "bob", 2), PresenceEntry(f"{t}-a", "al", 1)]
            )
            for t in threads
        ]
        # Warm: both scripts loaded on every master.
        await store.presence_update(put, 30)
        await store.presence(threads, 1)
        masters = redis_cluster.masters_now()
        before = {m.port: evalsha_calls(m) for m in masters}
        await store.presence_update(put, 30)
        pages = await store.presence(threads, 1)
        known = [p.version if p is not None else None for p in pages]
        assert await store.presence(threads, 1, known) == [None] * len(threads)
        # 3 calls per thread, each on its thread's master only.
        assert {m.port: evalsha_calls(m) - before[m.port] for m in masters} == {
            m.port: 3 * per_master for m in masters
        }
        ranges = redis_cluster.slot_ranges()
        for thread, page in zip(threads, pages, strict=True):
            assert page is not None and page.count == 2
            assert [e.connection for e in page.entries] == [f"{thread}-a"]
            exp = presence_keys(store.prefix, thread)[0]
            assert redis_cluster.master_of(exp, ranges).command("ZCARD", exp).strip() == "2"
        for master in masters:
            assert master.command("SCRIPT", "FLUSH").strip() == "OK"
        await store.presence_update([PresenceChange(t, gone=[f"{t}-a"]) for t in threads], 30)
        for master in masters:
            master.command("SCRIPT", "FLUSH")
        again = await store.presence(threads, 5, known)
        assert [[e.connection for e in p.entries] for p in again if p is not None] == [
            [f"{t}-b"] for t in threads
        ]


async def test_a_redis_url_naming_a_cluster_node_says_what_to_use(
    redis_cluster: RedisCluster,
) -> None:
    threads = redis_cluster.threads_on_every_master(per_master=1)
    node = redis_cluster.master_of(f"x:{{{threads[0]}}}")
    store = RedisStore(f"redis://127.0.0.1:{node.port}/0", prefix=fresh_prefix())
    try:
        for thread in threads:
            # Its own threads too: a script's keys include the tenant's set.
            with pytest.raises(StoreError, match=r"open the store with redis\+cluster://"):
                await store.append(thread, [item(thread, 0)])
        for thread in threads[1:]:
            with pytest.raises(StoreError, match=r"a node of a Redis Cluster"):
                await store.read(thread)
    finally:
        await store.close()


async def test_durability_is_checked_on_every_master(redis_cluster: RedisCluster) -> None:
    master = redis_cluster.masters_now()[1]
    async with cluster_store(redis_cluster) as store:
        assert await store.durability_warnings() == []
        assert master.command("CONFIG", "SET", "appendonly", "no").strip() == "OK"
        try:
            warnings = await store.durability_warnings()
        finally:
            master.command("CONFIG", "SET", "appendonly", "yes")
    assert len(warnings) == 1, warnings
    assert f"master {master.name}" in warnings[0] and "appendonly yes" in warnings[0]


# -- the live reader over masters ------------------------------------------------------------


async def collect(feed: FeedSubscription, count: int) -> list[str]:
    offsets: list[str] = []
    async for entry in feed:
        offsets.append(entry.offset)
        if len(offsets) == count:
            break
    return offsets


async def sharded_subscribers(cluster: RedisCluster) -> dict[str, int]:
    """Per master: the client connections subscribed to sharded channels."""
    counts = {}
    for master in cluster.masters_now():
        clients = master.command("CLIENT", "LIST").splitlines()
        counts[master.name] = sum(
            1
            for line in clients
            if any(f.startswith("ssub=") and f != "ssub=0" for f in line.split())
        )
    return counts


async def test_live_threads_share_one_connection_per_master(redis_cluster: RedisCluster) -> None:
    threads = redis_cluster.threads_on_every_master(per_master=10)
    async with cluster_store(redis_cluster) as store:
        for thread in threads:
            await store.append(thread, [item(thread, 0)])
        feeds = [store.subscribe(thread, after=START) for thread in threads]
        await asyncio.gather(*(feed.open() for feed in feeds))
        try:
            assert store.live_threads == len(threads)
            reading = [asyncio.create_task(collect(feed, 21)) for feed in feeds]
            for i in range(1, 21):
                await asyncio.gather(*(store.append(t, [item(t, i)]) for t in threads))
            got = await asyncio.wait_for(asyncio.gather(*reading), 30 * TIMEOUT_SCALE)
            for thread, offsets in zip(threads, got, strict=True):
                assert offsets == [e.offset for e in await store.read(thread)]
            # One sharded pub/sub connection on each master, whatever the threads.
            assert await sharded_subscribers(redis_cluster) == {
                m.name: 1 for m in redis_cluster.masters_now()
            }
        finally:
            for feed in feeds:
                await feed.close()


async def test_a_live_feed_follows_its_thread_through_a_failover(
    own_redis_cluster: RedisCluster,
) -> None:
    """CLUSTER FAILOVER moves the slots of one master to its replica (nothing lost):
    the feeds of its threads move with them; every event arrives once, in order."""
    cluster = own_redis_cluster
    threads = cluster.threads_on_every_master(per_master=1)
    victim = cluster.master_of(f"x:{{{threads[0]}}}")
    replica = cluster.replica_of(victim)
    async with cluster_store(cluster) as store:
        feeds = [store.subscribe(thread, after=START) for thread in threads]
        await asyncio.gather(*(feed.open() for feed in feeds))
        reading = [asyncio.create_task(collect(feed, 40)) for feed in feeds]
        try:
            for i in range(40):
                if i == 20:
                    await asyncio.to_thread(cluster.failover, replica)
                await asyncio.gather(*(append_retrying(store, t, i) for t in threads))
            got = await asyncio.wait_for(asyncio.gather(*reading), 60 * TIMEOUT_SCALE)
            for thread, offsets in zip(threads, got, strict=True):
                assert offsets == [e.offset for e in await store.read(thread)]
            # The reader's connections follow the masters.
            masters = store._reader.masters  # type: ignore[union-attr]
            assert replica.name in masters and victim.name not in masters
        finally:
            for feed in feeds:
                await feed.close()


async def test_a_live_feed_follows_its_thread_when_its_slot_moves(
    own_redis_cluster: RedisCluster,
) -> None:
    """Resharding: the thread's slot migrates to another master while it is
    published to and followed. Redis drops the sharded subscription of the slot
    on the old master; the feed moves and gets every event once, in order."""
    cluster = own_redis_cluster
    thread = cluster.threads_on_every_master(per_master=1)[0]
    source = cluster.master_of(f"x:{{{thread}}}")
    target = next(m for m in cluster.masters_now() if m.port != source.port)
    async with cluster_store(cluster) as store:
        feed = store.subscribe(thread, after=START)
        await feed.open()
        reading = asyncio.create_task(collect(feed, 40))
        try:
            for i in range(40):
                if i == 20:
                    slot = key_slot(thread.encode())
                    await asyncio.to_thread(cluster.move_slot, slot, target)
                await append_retrying(store, thread, i)
            got = await asyncio.wait_for(reading, 30 * TIMEOUT_SCALE)
            assert got == [e.offset for e in await store.read(thread)]
            assert store._reader.masters == [target.name]  # type: ignore[union-attr]
            assert target.command("XLEN", stream_key(store.prefix, thread)).strip() == "40"
        finally:
            await feed.close()


async def test_a_subscribe_stalled_while_its_slot_moves_leaves_nothing_behind(
    own_redis_cluster: RedisCluster,
) -> None:
    """The thread's master stalls a subscribe, and the thread's slot moves meanwhile:
    the stalled subscribes fail (store_unavailable) without leaving a failed feed
    for the thread, the event loop keeps turning, and the next subscribe works."""
    cluster = own_redis_cluster
    thread = cluster.threads_on_every_master(per_master=1)[0]
    source = cluster.master_of(f"x:{{{thread}}}")
    target = next(m for m in cluster.masters_now() if m.port != source.port)
    async with cluster_store(cluster, op_timeout=1.0) as store:
        await store.ping()
        reader: Any = store._reader
        shard = reader._shard(reader.ops.owner(thread))
        subscribe_channels = shard._subscribe_channels

        async def stalled(channels: Any) -> None:
            slot = key_slot(thread.encode())
            await asyncio.to_thread(cluster.move_slot, slot, target)
            reader._refreshed = -1e9
            await reader.refresh()
            await asyncio.sleep(30)  # the master never answers

        shard._subscribe_channels = stalled
        beats = 0

        async def heartbeat() -> None:
            nonlocal beats
            while True:
                beats += 1
                await asyncio.sleep(0.05)

        beating = asyncio.create_task(heartbeat())
        try:
            feeds = [store.subscribe(thread, after=START) for _ in range(2)]
            results = await asyncio.gather(*(f.open() for f in feeds), return_exceptions=True)
            assert all(isinstance(r, StoreUnavailable) for r in results), results
            shard._subscribe_channels = subscribe_channels
            before = beats
            feed = store.subscribe(thread, after=START)
            await asyncio.wait_for(feed.open(), 10 * TIMEOUT_SCALE)
            try:
                offset = await append_retrying(store, thread, 0)
                assert await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE) == [offset]
            finally:
                await feed.close()
            assert beats > before, "the event loop stood still"
        finally:
            beating.cancel()


async def append_retrying(store: RedisStore, thread: str, i: int) -> str:
    """Append event *i*, retrying while the thread's master is unavailable (as the
    publisher does); its offset."""
    deadline = time.monotonic() + 60 * TIMEOUT_SCALE
    while True:
        try:
            return (await store.append(thread, [item(thread, i)]))[0]
        except StoreError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_failover_that_loses_events_a_feed_has_read_resets_it(
    own_redis_cluster: RedisCluster,
) -> None:
    """A master dies with acknowledged events its replica never received (the link
    was cut first): a live feed that had read them ends with ThreadReset once the
    replica took over; the thread has a new epoch, the others are untouched."""
    cluster = own_redis_cluster
    threads = cluster.threads_on_every_master(per_master=1)
    victim = cluster.master_of(f"x:{{{threads[0]}}}")
    replica = cluster.replica_of(victim)
    async with cluster_store(cluster) as store:
        for thread in threads:
            await store.append(thread, [item(thread, 0)])
        epoch = await store.epoch(threads[0])
        feeds = [store.subscribe(thread, after=START) for thread in threads]
        await asyncio.gather(*(feed.open() for feed in feeds))
        try:
            lost = cut_replication(cluster, victim, replica)
            for i in range(1, 6):  # acknowledged by the master alone
                await store.append(threads[0], [item(threads[0], i)])
            got = await asyncio.wait_for(collect(feeds[0], 6), 10 * TIMEOUT_SCALE)
            kill_and_promote_started = time.monotonic()
            cluster.kill(victim)
            lost()
            # While the dead master's slots have no owner, its threads' appends
            # fail (to be retried); those of the other masters are not held up.
            with pytest.raises(StoreUnavailable):
                await store.append(threads[0], [item(threads[0], 99)])
            for thread in threads[1:]:
                started = time.monotonic()
                await store.append(thread, [item(thread, 1)])
                assert time.monotonic() - started < 1.0 * TIMEOUT_SCALE
            await asyncio.to_thread(cluster.wait_master, replica)
            promoted_after = time.monotonic() - kill_and_promote_started
            with pytest.raises(ThreadReset):
                await asyncio.wait_for(collect(feeds[0], 1), 30 * TIMEOUT_SCALE)
            # The replica's stream lacks what the feed had read: new epoch, told.
            stored = [e.offset for e in await store.read(threads[0])]
            assert stored == got[:1]
            assert await store.epoch(threads[0]) not in (None, epoch)
            # The threads on the other masters go on as before.
            for thread, feed in zip(threads[1:], feeds[1:], strict=True):
                reading = asyncio.create_task(collect(feed, 3))
                await append_retrying(store, thread, 2)
                offsets = await asyncio.wait_for(reading, 30 * TIMEOUT_SCALE)
                assert offsets == [e.offset for e in await store.read(thread)]
        finally:
            for feed in feeds:
                await feed.close()
    print(f"replica promoted {promoted_after:.1f} s after the master was killed")


def cut_replication(
    cluster: RedisCluster, master: ClusterNode, replica: ClusterNode
) -> Callable[[], None]:
    """Stop *replica* and drop its link: what *master* acknowledges from now on
    exists on the master alone. Returns what resumes the replica."""
    cluster.pause(replica)
    reply = master.command("CLIENT", "KILL", "TYPE", "replica").strip()
    assert reply == "1", reply
    return lambda: cluster.resume(replica)


# -- gateways on the cluster --------------------------------------------------------------------


class Viewer:
    """A HubClient subscribed to threads from their start; keeps every item."""

    def __init__(self, url: str, threads: list[str]) -> None:
        self.url = url
        self.threads = threads
        self.items: dict[str, list[Item]] = {t: [] for t in threads}
        self._tasks: list[asyncio.Task[None]] = []
        self._hub: HubClient | None = None

    async def start(self) -> None:
        self._hub = HubClient(self.url, backoff_max=1.0)
        await self._hub.connect()
        self._tasks = [asyncio.create_task(self._follow(t)) for t in self.threads]

    async def _follow(self, thread: str) -> None:
        assert self._hub is not None
        async with self._hub.subscribe(thread, "start") as sub:
            async for entry in sub:
                self.items[thread].append(entry)

    def offsets(self, thread: str) -> list[str]:
        """The offsets of the events received since the last snapshot."""
        out: list[str] = []
        for entry in self.items[thread]:
            if isinstance(entry, Snapshot):
                out = []
            elif isinstance(entry, ThreadEvent):
                out.append(entry.offset)
        return out

    def snapshot(self, thread: str) -> Snapshot | None:
        snapshots = [e for e in self.items[thread] if isinstance(e, Snapshot)]
        return snapshots[-1] if snapshots else None

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._hub is not None:
            await self._hub.close()


async def publish_until(url: str, thread: str, stop: asyncio.Event, acked: list[str]) -> None:
    """A run on *thread* through the gateway at *url*: events until *stop*, each
    offset the gateway acknowledged in *acked* (the publisher retries while the
    store is unavailable, with the same event ids)."""
    async with Publisher(url, retry_for=90 * TIMEOUT_SCALE) as publisher:
        start = [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "r"},
            {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
        ]
        for n, event in enumerate(start):
            acked.append(await publisher.publish(thread, event, event_id=f"{thread}-s{n}"))
        i = 0
        while not stop.is_set():
            event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}"}
            acked.append(await publisher.publish(thread, event, event_id=f"{thread}-c{i}"))
            i += 1
            await asyncio.sleep(0.01)


async def settle(viewers: list[Viewer], store: RedisStore, threads: list[str]) -> dict[str, Any]:
    """Wait until every viewer has each thread's newest stored event; the stored
    offsets per thread."""
    stored: dict[str, list[str]] = {}
    for thread in threads:
        stored[thread] = [e.offset for e in await store.read(thread)]
    last = {t: offsets[-1] for t, offsets in stored.items()}

    def caught_up() -> bool:
        return all(v.offsets(t)[-1:] == [last[t]] for v in viewers for t in threads)

    await wait_for(caught_up, 30, "every viewer to receive the newest events")
    return stored


async def test_two_gateways_relay_threads_on_every_master(
    redis_cluster: RedisCluster, gateways: Gateways
) -> None:
    prefix = fresh_prefix()
    url = url_of(redis_cluster, prefix)
    threads = redis_cluster.threads_on_every_master(per_master=2)
    first, second = gateways.start(url), gateways.start(url)
    viewers = [Viewer(first.url, threads), Viewer(second.url, threads)]
    for viewer in viewers:
        await viewer.start()
    stop = asyncio.Event()
    acked: dict[str, list[str]] = {t: [] for t in threads}
    publishing = [asyncio.create_task(publish_until(first.url, t, stop, acked[t])) for t in threads]
    await wait_for(lambda: all(len(a) >= 30 for a in acked.values()), 60, "30 events a thread")
    stop.set()
    await asyncio.gather(*publishing)
    store = RedisStore(redis_cluster.url, prefix=prefix)
    try:
        stored = await settle(viewers, store, threads)
    finally:
        await store.close()
    for thread in threads:
        assert stored[thread] == acked[thread]
        for viewer in viewers:
            assert viewer.offsets(thread) == stored[thread]  # each once, in order
            assert viewer.snapshot(thread) is None
    for viewer in viewers:
        await viewer.stop()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["failover", "kill"])
async def test_viewers_on_two_gateways_get_every_event_through_a_failover(
    own_redis_cluster: RedisCluster, gateways: Gateways, how: str
) -> None:
    """A master fails over while runs are published on threads of every master:
    CLUSTER FAILOVER on its replica, or SIGKILL of the master (its replica in
    sync). Publishing resumes after store_unavailable answers; every viewer ends
    with every acknowledged event exactly once, in order, and no resync."""
    cluster = own_redis_cluster
    prefix = fresh_prefix()
    url = url_of(cluster, prefix)
    threads = cluster.threads_on_every_master(per_master=1)
    victim = cluster.master_of(f"x:{{{threads[0]}}}")
    replica = cluster.replica_of(victim)
    first, second = gateways.start(url), gateways.start(url)
    viewers = [Viewer(first.url, threads), Viewer(second.url, threads)]
    for viewer in viewers:
        await viewer.start()
    stop = asyncio.Event()
    acked: dict[str, list[str]] = {t: [] for t in threads}
    publishing = [asyncio.create_task(publish_until(first.url, t, stop, acked[t])) for t in threads]
    await wait_for(lambda: all(len(a) >= 20 for a in acked.values()), 60, "20 events a thread")
    before = len(acked[threads[0]])
    started = time.monotonic()
    if how == "failover":
        await asyncio.to_thread(cluster.failover, replica)
    else:
        cluster.kill(victim)
        await asyncio.to_thread(cluster.wait_master, replica)
    promoted = time.monotonic() - started
    await wait_for(lambda: len(acked[threads[0]]) >= before + 20, 60, "publishing to resume")
    stop.set()
    await asyncio.gather(*publishing)
    store = RedisStore(cluster.url, prefix=prefix)
    try:
        stored = await settle(viewers, store, threads)
    finally:
        await store.close()
    for thread in threads:
        assert stored[thread] == acked[thread]
        for viewer in viewers:
            assert viewer.offsets(thread) == stored[thread]
            assert viewer.snapshot(thread) is None
    for viewer in viewers:
        await viewer.stop()
    print(f"{how}: the replica served the slots {promoted:.1f} s later")


@pytest.mark.timeout(240)
async def test_viewers_are_told_when_a_failover_loses_acknowledged_events(
    own_redis_cluster: RedisCluster, gateways: Gateways
) -> None:
    """The master dies with acknowledged events its replica never got: viewers that
    had them get a resync (a snapshot of the new epoch), never a silently shorter
    history; the threads of the other masters are relayed exactly."""
    cluster = own_redis_cluster
    prefix = fresh_prefix()
    url = url_of(cluster, prefix)
    threads = cluster.threads_on_every_master(per_master=1)
    victim = cluster.master_of(f"x:{{{threads[0]}}}")
    replica = cluster.replica_of(victim)
    first, second = gateways.start(url), gateways.start(url)
    viewers = [Viewer(first.url, threads), Viewer(second.url, threads)]
    for viewer in viewers:
        await viewer.start()
    stop = asyncio.Event()
    acked: dict[str, list[str]] = {t: [] for t in threads}
    publishing = [asyncio.create_task(publish_until(first.url, t, stop, acked[t])) for t in threads]
    await wait_for(lambda: all(len(a) >= 20 for a in acked.values()), 60, "20 events a thread")
    resume = cut_replication(cluster, victim, replica)
    cut_at = len(acked[threads[0]])
    await wait_for(lambda: len(acked[threads[0]]) >= cut_at + 20, 30, "events on the master only")
    seen = acked[threads[0]][-1]
    await wait_for(
        lambda: all(seen in v.offsets(threads[0]) for v in viewers), 30, "viewers to see them"
    )
    cluster.kill(victim)
    resume()
    await asyncio.to_thread(cluster.wait_master, replica)
    await wait_for(lambda: len(acked[threads[0]]) >= cut_at + 40, 60, "publishing to resume")
    stop.set()
    await asyncio.gather(*publishing)
    store = RedisStore(cluster.url, prefix=prefix)
    try:
        stored = await settle(viewers, store, threads)
        epoch = await store.epoch(threads[0])
    finally:
        await store.close()
    lost = [o for o in acked[threads[0]] if o not in stored[threads[0]]]
    # About the 20 published after the cut (a few may have reached the replica before
    # the link was down): enough for every viewer to have seen lost events.
    assert len(lost) >= 5, "the failover lost (almost) nothing: the test could not tell"
    for viewer in viewers:
        snapshot = viewer.snapshot(threads[0])
        assert snapshot is not None, "a viewer that had lost events was not told"
        assert snapshot.epoch == epoch
        after = [o for o in stored[threads[0]] if offset_key(o) > offset_key(snapshot.offset)]
        assert viewer.offsets(threads[0]) == after
    for thread in threads[1:]:
        assert stored[thread] == acked[thread]
        for viewer in viewers:
            assert viewer.offsets(thread) == stored[thread]
            assert viewer.snapshot(thread) is None
    for viewer in viewers:
        await viewer.stop()
    print(f"lost {len(lost)} acknowledged events; every viewer resynced")


async def test_a_gateway_requiring_a_durable_store_serves_on_a_durable_cluster(
    redis_cluster: RedisCluster, gateways: Gateways
) -> None:
    # Every master runs with AOF and noeviction: nothing to refuse.
    gateway = gateways.start(url_of(redis_cluster, fresh_prefix()), "--require-durable-store")
    assert http_status(gateway.port, "/readyz") == 200
