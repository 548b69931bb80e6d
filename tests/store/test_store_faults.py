"""Store faults on real redis-server processes: a stalled Redis (SIGSTOP),
malformed entries, rewinds (RDB restore, eviction), settings and secrets."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import msgpack
import pytest
import redis.asyncio as aioredis

import agui_hub.store.redis.appends as redis_appends
from agui_hub.errors import StoreError, StoreUnavailable, ThreadReset
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store import open_store
from agui_hub.store.contract import START, Checkpoint, EventInput, FeedState, Retention
from agui_hub.store.redis.store import (
    RedisStore,
    durability_problems,
    ids_key,
    meta_key,
    notify_channel,
    stream_key,
)

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..streams import collect

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
WAIT = 10 * TIMEOUT_SCALE


def item(i: int, prefix: str = "e") -> EventInput:
    event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}"}
    return EventInput.of(event, f"{prefix}{i}")


def delta(entry: Any) -> str:
    return str(msgpack.unpackb(entry.data)["delta"])


async def within(awaitable: Awaitable[T], seconds: float = WAIT) -> T:
    return await asyncio.wait_for(awaitable, seconds)


class Stopped:
    """SIGSTOP a redis-server for the duration of a ``with`` block (SIGCONT after)."""

    def __init__(self, server: RedisServer) -> None:
        assert server.process is not None
        self.pid = server.process.pid

    def __enter__(self) -> Stopped:
        os.kill(self.pid, signal.SIGSTOP)
        return self

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


@pytest.fixture
async def admin(own_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(own_redis.url)
    yield client
    await client.aclose()


@pytest.fixture
def stopped_guard(own_redis: RedisServer) -> Iterator[None]:
    """Never leave the test's redis-server stopped, whatever the test did."""
    yield
    if own_redis.process is not None:
        os.kill(own_redis.process.pid, signal.SIGCONT)


# -- deadlines ----------------------------------------------------------------------------


async def test_every_operation_fails_fast_on_a_stalled_redis(
    own_redis: RedisServer, stopped_guard: None
) -> None:
    """SIGSTOP: every call answers StoreUnavailable within op_timeout, not after
    redis-py's socket timeout times its retries."""
    store = RedisStore(own_redis.url, op_timeout=0.5)
    offsets = await store.append("t", [item(0)])
    epoch = await store.epoch("t")
    assert epoch is not None
    calls: dict[str, Any] = {
        "append": lambda: store.append("t", [item(1)]),
        "read": lambda: store.read("t"),
        "read_available": lambda: store.read_available("t"),
        "epoch": lambda: store.epoch("t"),
        "last_offset": lambda: store.last_offset("t"),
        "info": lambda: store.info("t"),
        "stored_ids": lambda: store.stored_ids("t", ["e0"]),
        "put_checkpoint": lambda: store.put_checkpoint("t", Checkpoint(offsets[0], epoch, b"")),
        "get_checkpoint": lambda: store.get_checkpoint("t"),
        "threads": lambda: store.threads(),
        "ping": lambda: store.ping(),
        "durability_warnings": lambda: store.durability_warnings(),
        "subscribe": lambda: store.subscribe("t2").open(),
    }
    try:
        with Stopped(own_redis):
            for name, call in calls.items():
                began = time.monotonic()
                with pytest.raises(StoreUnavailable) as caught:
                    await within(call())
                took = time.monotonic() - began
                assert took < 0.5 + 1.0 * TIMEOUT_SCALE, f"{name} took {took:.2f} s"
                assert "within 0.5 s" in str(caught.value), name
                if name == "append":
                    assert "retry with the same event ids" in str(caught.value)
        assert store.live_threads == 0  # the failed subscribe left nothing behind
        # Redis back: everything works again, and the retried append is stored once.
        assert await within(store.append("t", [item(1)]))
        assert [delta(e) for e in await store.read("t")] == ["d0", "d1"]
    finally:
        await store.close()


async def test_timed_out_calls_do_not_leak_connections(
    own_redis: RedisServer, admin: aioredis.Redis, stopped_guard: None
) -> None:
    store = RedisStore(own_redis.url, op_timeout=0.3, max_connections=4)
    try:
        await store.append("t", [item(0)])
        with Stopped(own_redis):
            for _round in range(3):
                results = await within(
                    asyncio.gather(
                        *(store.ping() for _ in range(10)),
                        *(store.read("t") for _ in range(10)),
                        *(store.append("t", [item(100 + n)]) for n in range(10)),
                        return_exceptions=True,
                    )
                )
                assert all(isinstance(r, StoreUnavailable) for r in results), results
        # The pool still serves, at its size: nothing was kept "in use" for ever.
        await within(asyncio.gather(*(store.ping() for _ in range(20))))
        assert await within(store.append("t", [item(1)]))
        me = await admin.client_id()
        clients = [c for c in await admin.client_list() if int(c["id"]) != me]
        assert len(clients) <= 4
        pool = store._client.connection_pool
        assert len(pool._in_use_connections) == 0
    finally:
        await store.close()


async def test_live_viewers_learn_of_a_stalled_redis(
    own_redis: RedisServer, stopped_guard: None
) -> None:
    """With Redis stopped the pub/sub connection just goes quiet: the reader
    PINGs it, and fails its subscriptions after outage_grace."""
    store = RedisStore(own_redis.url, op_timeout=1.0, outage_grace=1.0)
    try:
        await store.append("t", [item(0)])
        async with store.subscribe("t", after=START) as feed:
            assert len(await within(collect(feed, 1))) == 1
            reading = asyncio.create_task(collect(feed, 1))
            await asyncio.sleep(0.2)
            assert feed.state is FeedState.LIVE
            with Stopped(own_redis):
                began = time.monotonic()
                with pytest.raises(StoreUnavailable, match="unavailable"):
                    await within(reading)
                took = time.monotonic() - began
            # silence (1 s) + PING deadline (1 s) + grace (1 s from the PING), with slack
            assert took < 5.0 * TIMEOUT_SCALE, took
        # Redis resumed: a new subscription gets live events again.
        async with store.subscribe("t") as again:
            reading = asyncio.create_task(collect(again, 1))
            await asyncio.sleep(0.1)
            await store.append("t", [item(1)])
            assert [delta(e) for e in await within(reading)] == ["d1"]
    finally:
        await store.close()


async def test_a_quiet_thread_is_not_an_outage(own_redis: RedisServer) -> None:
    """Minutes without events are normal: the PINGs are answered, nothing fails."""
    store = RedisStore(own_redis.url, op_timeout=0.5, outage_grace=0.5)
    try:
        async with store.subscribe("t") as feed:
            reading = asyncio.create_task(collect(feed, 1))
            await asyncio.sleep(3.5)  # several rounds of silence and PING
            assert not reading.done()
            await store.append("t", [item(1)])
            assert [delta(e) for e in await within(reading)] == ["d1"]
    finally:
        await store.close()


# -- malformed entries ------------------------------------------------------------------------


async def test_a_malformed_entry_fails_neither_its_thread_nor_others(
    redis_server: RedisServer,
) -> None:
    """Entries written by a plain XADD with a non-UTF-8 id, without an event
    field, with fields in another order: read and relayed as they are; the
    other live threads of the reader's batch are unaffected."""
    prefix = "malformed"
    store = RedisStore(redis_server.url, prefix=prefix)
    raw = aioredis.Redis.from_url(redis_server.url)
    payload = msgpack.packb({"type": "CUSTOM", "name": "n", "value": 1})
    try:
        async with store.subscribe("bad") as bad, store.subscribe("good") as good:
            reading_bad = asyncio.create_task(collect(bad, 3))
            reading_good = asyncio.create_task(collect(good, 2))
            await asyncio.sleep(0.1)
            stream = stream_key(prefix, "bad")
            await raw.xadd(stream, {"event": payload, "id": b"\xff\xfe", "type": "CUSTOM"})
            await raw.xadd(stream, {"id": "no-event", "type": b"\xc3"})
            last = await raw.xadd(stream, {"type": "CUSTOM", "id": "x", "run": "r", "event": b"1"})
            await store.append("good", [item(1)])
            await raw.publish(notify_channel(prefix, "bad"), last)
            await store.append("good", [item(2)])
            got_bad = await within(reading_bad)
            got_good = await within(reading_good)
        assert [e.event_id for e in got_bad] == ["\ufffd\ufffd", "no-event", "x"]
        assert [e.data for e in got_bad] == [payload, b"", b"1"]
        assert [e.type for e in got_bad] == ["CUSTOM", "\ufffd", "CUSTOM"]
        assert got_bad[2].run_id == "r"
        assert [delta(e) for e in got_good] == ["d1", "d2"]
        # Reads see the same entries.
        assert [e.event_id for e in await store.read("bad")] == ["\ufffd\ufffd", "no-event", "x"]
    finally:
        await raw.aclose()
        await store.close()


async def test_a_broken_thread_fails_only_its_own_subscriptions(
    redis_server: RedisServer,
) -> None:
    prefix = "brokenkey"
    store = RedisStore(redis_server.url, prefix=prefix)
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await store.append("broken", [item(0)])
        async with store.subscribe("broken") as broken, store.subscribe("good") as good:
            failing = asyncio.create_task(collect(broken, 1))
            reading = asyncio.create_task(collect(good, 2))
            await asyncio.sleep(0.1)
            # Someone overwrites the thread's stream with a string: XRANGE fails
            # with WRONGTYPE, for that thread only.
            await raw.delete(stream_key(prefix, "broken"))
            await raw.set(stream_key(prefix, "broken"), "oops")
            await store.append("good", [item(1)])
            await raw.publish(notify_channel(prefix, "broken"), "1-0")
            await store.append("good", [item(2)])
            with pytest.raises(StoreError, match="broken") as caught:
                await within(failing)
            assert not isinstance(caught.value, StoreUnavailable)
            assert [delta(e) for e in await within(reading)] == ["d1", "d2"]
    finally:
        await raw.delete(stream_key(prefix, "broken"))
        await raw.aclose()
        await store.close()


# -- rewinds ---------------------------------------------------------------------------------


async def test_an_rdb_restore_is_a_new_epoch_for_live_viewers(
    own_redis: RedisServer, admin: aioredis.Redis
) -> None:
    """Redis without AOF, restarted from an older RDB snapshot: the stream rolls
    back under the same epoch. The live reader notices on reconnect that the
    entry it read last is gone: a new epoch, and its viewers get ThreadReset,
    even when a producer appended first (new offsets after the lost ones)."""
    store = RedisStore(own_redis.url)
    producer = RedisStore(own_redis.url)
    try:
        await store.append("t", [item(i) for i in range(10)])
        epoch = await store.epoch("t")
        await admin.save()
        await store.append("t", [item(i) for i in range(10, 15)])
        async with store.subscribe("t", after=START) as feed:
            assert len(await within(collect(feed, 15))) == 15
            own_redis.stop(kill=True)
            own_redis.start()  # loads the snapshot: 10 events, the same epoch
            assert await producer.epoch("t") == epoch
            assert len(await producer.read("t")) == 10
            await producer.append("t", [item(99)])  # before the reader reconnects
            with pytest.raises(ThreadReset) as caught:
                await within(collect(feed, 1), 20 * TIMEOUT_SCALE)
        new_epoch = await store.epoch("t")
        assert caught.value.old_epoch == epoch
        assert new_epoch not in (None, epoch) and caught.value.new_epoch == new_epoch
        # A resume "after offset 15 in the old epoch" is now told to resync.
        assert await producer.epoch("t") == new_epoch
        assert [delta(e) for e in await store.read("t")][-2:] == ["d9", "d99"]
    finally:
        await producer.close()
        await store.close()


async def test_an_rdb_restore_is_a_new_epoch_for_a_writer(
    own_redis: RedisServer, admin: aioredis.Redis
) -> None:
    """The writer's conditional append expects an entry that the restore took
    away: new epoch, conflict; the writer rebuilds and stores its event."""
    store = RedisStore(own_redis.url)
    writer = ThreadWriter(store)
    thread = "w"
    try:
        await writer.publish(thread, [{"type": "RUN_STARTED", "threadId": thread, "runId": "r"}])
        await writer.publish(thread, [{"type": "TEXT_MESSAGE_START", "messageId": "m"}])
        epoch = await store.epoch(thread)
        await admin.save()
        for i in range(5):
            content = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"x{i}"}
            await writer.publish(thread, [content])
        own_redis.stop(kill=True)
        own_redis.start()
        assert await store.epoch(thread) == epoch
        content = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "after"}
        await within(writer.publish(thread, [content]))
        assert await store.epoch(thread) not in (None, epoch)
        types = [e.type for e in await store.read(thread)]
        assert types == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    finally:
        await store.close()


async def test_an_evicted_events_stream_is_a_new_epoch(
    own_redis: RedisServer, admin: aioredis.Redis
) -> None:
    """allkeys-* eviction can take the stream alone: the next append must not
    re-create it under the old epoch (a resume would then miss events)."""
    store = RedisStore(own_redis.url)
    try:
        first = await store.append("t", [item(i) for i in range(5)])
        epoch = await store.epoch("t")
        async with store.subscribe("t", after=START) as feed:
            assert len(await within(collect(feed, 5))) == 5
            await admin.delete(stream_key("agui", "t"))  # evicted
            again = await store.append("t", [item(5), item(0)])
            with pytest.raises(ThreadReset) as caught:
                await within(collect(feed, 1))
        new_epoch = await store.epoch("t")
        assert new_epoch not in (None, epoch) and caught.value.old_epoch == epoch
        # A fresh start: the lost ids are forgotten (a retry of a lost event is stored).
        assert again[1] != first[0]
        assert [delta(e) for e in await store.read("t")] == ["d5", "d0"]
        info = await store.info("t")
        assert info is not None and info.trimmed is None

        # Evicted, then re-created by a plain XADD before the hub appends: detected too.
        await admin.delete(stream_key("agui", "t"))
        await admin.xadd(stream_key("agui", "t"), {"event": b"\x80", "id": "plain"})
        await store.append("t", [item(6)])
        assert await store.epoch("t") not in (None, epoch, new_epoch)
    finally:
        await store.close()


async def test_an_evicted_ids_hash_lets_no_retry_duplicate(
    own_redis: RedisServer, admin: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RedisStore(own_redis.url)
    try:
        offsets = await store.append("t", [item(i) for i in range(3)])
        epoch = await store.epoch("t")
        await admin.delete(ids_key("agui", "t"))  # evicted
        # The retry is recognised: the ids were rebuilt from the stream.
        assert await store.append("t", [item(1), item(3)]) == [
            offsets[1],
            (await store.read("t"))[-1].offset,
        ]
        assert [delta(e) for e in await store.read("t")] == ["d0", "d1", "d2", "d3"]
        assert await store.epoch("t") == epoch
        assert await admin.hlen(ids_key("agui", "t")) == 4

        # A stream too long to rebuild from: a new epoch, announced to viewers.
        monkeypatch.setattr(redis_appends, "IDS_REBUILD_LIMIT", 2)
        async with store.subscribe("t", after=START) as feed:
            assert len(await within(collect(feed, 4))) == 4
            await admin.delete(ids_key("agui", "t"))
            await store.append("t", [item(2)])
            with pytest.raises(ThreadReset):
                await within(collect(feed, 1))
        assert await store.epoch("t") not in (None, epoch)
    finally:
        await store.close()


async def test_trimming_every_id_is_not_taken_for_an_eviction(own_redis: RedisServer) -> None:
    """Only plain-XADD entries left after trimming: the ids hash empties
    legitimately, which is no rewind."""
    store = RedisStore(own_redis.url, retention=Retention(max_len=2))
    raw = aioredis.Redis.from_url(own_redis.url)
    try:
        await store.append("t", [item(0)])
        epoch = await store.epoch("t")
        for n in range(2):
            await raw.xadd(stream_key("agui", "t"), {"event": b"\x80", "id": f"plain{n}"})
        await store.append("t", [item(1)])  # trims e0 and plain0
        await store.append("t", [item(1)])  # a retry
        assert await store.epoch("t") == epoch
        available = await store.read_available("t")
        assert [e.event_id for e in available.entries] == ["plain1", "e1"]
        assert available.gap
    finally:
        await raw.aclose()
        await store.close()


# -- settings and secrets -----------------------------------------------------------------


async def test_durability_warnings_name_the_setting_and_the_fix(
    own_redis: RedisServer, admin: aioredis.Redis
) -> None:
    store = RedisStore(own_redis.url, retention=Retention(ttl=0))
    ttl_store = open_store(f"{own_redis.url}?ttl=60")
    try:
        (warning,) = await store.durability_warnings()  # the fixture: no AOF, no RDB
        assert "appendonly no" in warning and "appendonly yes" in warning
        await admin.config_set("appendonly", "yes")
        await admin.config_set("maxmemory-policy", "noeviction")
        assert await store.durability_warnings() == []
        await admin.config_set("maxmemory-policy", "allkeys-lru")
        (warning,) = await store.durability_warnings()
        assert "allkeys-lru" in warning and "noeviction" in warning
        await admin.config_set("maxmemory-policy", "volatile-lru")
        assert await store.durability_warnings() == []
        (warning,) = await ttl_store.durability_warnings()
        assert "volatile-lru" in warning and "ttl" in warning
        await admin.config_set("appendonly", "no")
        await admin.config_set("save", "3600 1")
        warnings = await store.durability_warnings()
        assert any("RDB snapshots only" in w for w in warnings)
    finally:
        await ttl_store.close()
        await store.close()


async def test_durability_warnings_without_config_permission(
    own_redis: RedisServer, admin: aioredis.Redis
) -> None:
    await admin.acl_setuser(
        "app",
        enabled=True,
        passwords=["+s3cret!"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config"],
    )
    port = own_redis.port
    store = RedisStore(f"redis://app:s3cret!@127.0.0.1:{port}/0")
    try:
        (warning,) = await store.durability_warnings()
        assert "could not" in warning or "does not let" in warning
        assert "s3cret" not in warning and "app:***@" in warning
    finally:
        await store.close()


def test_durability_problems_for_each_setting() -> None:
    safe = {
        "appendonly": "yes",
        "appendfsync": "everysec",
        "save": "",
        "maxmemory": "0",
        "maxmemory-policy": "noeviction",
    }
    assert durability_problems(safe, "r", uses_ttl=True) == []
    assert len(durability_problems({**safe, "appendfsync": "no"}, "r", uses_ttl=False)) == 1
    assert (
        durability_problems({**safe, "maxmemory-policy": "volatile-ttl"}, "r", uses_ttl=False) == []
    )
    for settings in (
        {**safe, "appendonly": "no"},
        {**safe, "maxmemory-policy": "allkeys-random"},
        {**safe, "maxmemory-policy": "volatile-ttl"},
    ):
        (warning,) = durability_problems(settings, "r", uses_ttl=True)
        assert warning.endswith(".") and "set " in warning


async def test_the_password_never_shows(
    own_redis: RedisServer, stopped_guard: None, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"redis://user:hunter2@127.0.0.1:{own_redis.port}/0"
    store = RedisStore(url, op_timeout=0.5, outage_grace=0.5)
    caplog.set_level(logging.DEBUG, logger="agui_hub")
    try:
        assert "hunter2" not in repr(store) and "hunter2" not in store.url
        own_redis.stop(kill=True)
        messages = []
        for call in (store.ping(), store.append("t", [item(0)]), store.read("t")):
            with pytest.raises(StoreUnavailable) as caught:
                await within(call)
            messages.append(str(caught.value))
        with pytest.raises(StoreUnavailable) as caught:
            await within(store.subscribe("t").open())
        messages.append(str(caught.value))
        for message in messages:
            assert "hunter2" not in message and "user:***@127.0.0.1" in message, message
        assert "hunter2" not in caplog.text
    finally:
        await store.close()


async def test_a_failed_subscribe_unsubscribes(
    own_redis: RedisServer, admin: aioredis.Redis, stopped_guard: None
) -> None:
    """A subscription whose start fails (the store stalled after SUBSCRIBE) leaves
    no registration and no Redis subscription behind."""
    store = RedisStore(own_redis.url, op_timeout=0.5)
    try:
        await store.append("t", [item(0)])
        async with store.subscribe("other"):
            with Stopped(own_redis):
                for _ in range(3):
                    with pytest.raises(StoreUnavailable):
                        await within(store.subscribe("t").open())
            assert store.live_threads == 1
            channel = notify_channel("agui", "t")
            for _ in range(50):
                counts = dict(await admin.pubsub_numsub(channel))
                if counts.get(channel.encode(), 0) == 0:
                    break
                await asyncio.sleep(0.1)
            assert counts.get(channel.encode(), 0) == 0
            # And the thread can be subscribed to afterwards.
            async with store.subscribe("t") as feed:
                reading = asyncio.create_task(collect(feed, 1))
                await asyncio.sleep(0.1)
                await store.append("t", [item(1)])
                assert [delta(e) for e in await within(reading)] == ["d1"]
        assert await admin.hget(meta_key("agui", "t"), "epoch")
    finally:
        await store.close()


async def test_a_cancelled_subscribe_does_not_fail_the_one_waiting_on_it(
    own_redis: RedisServer, admin: aioredis.Redis, stopped_guard: None
) -> None:
    """Two viewers subscribe to the same thread at once and the first goes away (its
    client disconnected) while the second waits for the first's registration: the
    second registers afresh and gets its events (it was answered store_unavailable)."""
    store = RedisStore(own_redis.url, op_timeout=5)
    try:
        await store.append("t", [item(0)])
        async with store.subscribe("other"):
            for n in range(1, 6):  # the same race, a few times
                first = store.subscribe("t")
                second = store.subscribe("t")
                with Stopped(own_redis):
                    # Redis is stopped: the first registration hangs in its first
                    # command, and the second waits for it.
                    opening = asyncio.create_task(first.open())
                    await asyncio.sleep(0.05)
                    waiting = asyncio.create_task(second.open())
                    await asyncio.sleep(0.05)
                    assert not waiting.done()
                    opening.cancel()
                    await asyncio.sleep(0.05)
                await within(waiting)  # opened, not StoreUnavailable
                with pytest.raises(asyncio.CancelledError):
                    await opening
                try:
                    reading = asyncio.create_task(collect(second, 1))
                    await asyncio.sleep(0.1)
                    await store.append("t", [item(n)])
                    assert [delta(e) for e in await within(reading)] == [f"d{n}"]
                finally:
                    await second.close()
                assert store.live_threads == 1  # "other" only
    finally:
        await store.close()
