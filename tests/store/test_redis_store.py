"""Redis-only behaviour of agui_hub.store.redis.store, on real redis-server processes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis

import agui_hub.store.redis.resp as redis_resp
import agui_hub.store.redis.store as redis_store
from agui_hub.errors import OffsetExpired, StoreUnavailable, ThreadReset, TooManyThreads
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store.contract import START, EventInput, FeedState, Retention, encode_event_data
from agui_hub.store.redis.store import (
    RedisStore,
    durability_problems,
    meta_key,
    notify_channel,
    runs_key,
    stream_key,
    tenant_key,
)

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..streams import collect

pytestmark = pytest.mark.timeout(90)


def item(i: int) -> EventInput:
    event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}"}
    return EventInput.of(event, f"e{i}")


async def client_ids(admin: aioredis.Redis) -> set[int]:
    """Ids of the client connections Redis sees, except the one asking."""
    me = await admin.client_id()
    return {int(c["id"]) for c in await admin.client_list() if int(c["id"]) != me}


async def test_data_and_epoch_survive_a_restart_with_aof(own_redis_aof: RedisServer) -> None:
    store = RedisStore(own_redis_aof.url)
    offsets = await store.append("t", [item(1), item(2)])
    epoch = await store.epoch("t")
    own_redis_aof.restart()
    assert await store.epoch("t") == epoch
    assert [e.offset for e in await store.read("t")] == offsets
    # Idempotency survives too: the retry returns the stored offset.
    assert await store.append("t", [item(2)]) == [offsets[1]]
    await store.close()


async def test_restart_without_persistence_changes_the_epoch(own_redis: RedisServer) -> None:
    store = RedisStore(own_redis.url)
    await store.append("t", [item(1)])
    epoch = await store.epoch("t")
    async with store.subscribe("t", after=START) as feed:
        assert len(await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)) == 1
        own_redis.restart()  # everything is gone
        await store.append("t", [item(1)])
        new_epoch = await store.epoch("t")
        assert new_epoch not in (None, epoch)
        with pytest.raises(ThreadReset) as info:
            await asyncio.wait_for(collect(feed, 1), 20 * TIMEOUT_SCALE)
    assert info.value.old_epoch == epoch and info.value.new_epoch in (None, new_epoch)
    await store.close()


async def test_live_feed_recovers_after_a_restart_with_aof(own_redis_aof: RedisServer) -> None:
    store = RedisStore(own_redis_aof.url)
    await store.append("t", [item(0)])
    async with store.subscribe("t", after=START) as feed:
        assert len(await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)) == 1
        own_redis_aof.restart()
        for i in range(1, 4):
            await store.append("t", [item(i)])
        got = await asyncio.wait_for(collect(feed, 3), 20 * TIMEOUT_SCALE)
    assert [msgpack.unpackb(e.data)["delta"] for e in got] == ["d1", "d2", "d3"]
    await store.close()


async def test_unreachable_redis_is_store_unavailable(own_redis: RedisServer) -> None:
    store = RedisStore(own_redis.url, socket_timeout=1.0)
    await store.ping()
    own_redis.stop(kill=True)
    with pytest.raises(StoreUnavailable, match="unavailable"):
        await store.ping()
    with pytest.raises(StoreUnavailable):
        await store.append("t", [item(1)])
    own_redis.start()
    assert await store.append("t", [item(1)])
    await store.close()


async def test_connections_stay_constant_with_many_live_threads(own_redis: RedisServer) -> None:
    admin = aioredis.Redis.from_url(own_redis.url)
    store = RedisStore(own_redis.url, max_connections=4)
    feeds = []
    first = store.subscribe("thread-0")
    await first.open()
    feeds.append(first)
    await store.append("thread-0", [item(0)])
    await asyncio.gather(*(store.ping() for _ in range(20)))  # the pool at its size
    with_one = await client_ids(admin)
    for n in range(1, 500):
        feed = store.subscribe(f"thread-{n}")
        feeds.append(feed)
    await asyncio.gather(*(feed.open() for feed in feeds[1:]))
    assert store.live_threads == 500
    await asyncio.gather(*(store.append(f"thread-{n}", [item(n)]) for n in range(500)))
    with_many = await client_ids(admin)
    # Same connections: none opened for the new threads, none dropped and reopened.
    assert with_many == with_one
    assert len(with_many) <= 5  # pool of 4 + the live reader's pub/sub connection
    for feed in feeds:
        await feed.close()
    await store.close()
    await admin.aclose()


async def test_plain_xadd_from_another_language_is_readable(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix="plainxadd")
    raw = aioredis.Redis.from_url(redis_server.url)
    payload = msgpack.packb({"type": "CUSTOM", "name": "n", "value": 1})
    async with store.subscribe("t", after=START) as feed:
        reading = asyncio.create_task(collect(feed, 1))
        await asyncio.sleep(0.05)
        offset = await raw.xadd(stream_key("plainxadd", "t"), {"event": payload, "id": "x1"})
        await raw.publish(notify_channel("plainxadd", "t"), offset)
        got = await asyncio.wait_for(reading, 10 * TIMEOUT_SCALE)
    assert got[0].data == payload and got[0].event_id == "x1"
    assert await store.epoch("t")  # created on first read
    await raw.aclose()
    await store.close()


async def test_the_ttl_is_refreshed_once_a_sixteenth_of_it_passed_and_every_key_has_one(
    redis_server: RedisServer,
) -> None:
    """An append refreshes the keys' TTL only once a sixteenth of it has passed
    (two PEXPIREs fewer per append), and at once when a key may be new: every
    key of a thread always has a TTL."""
    prefix = f"ttl-{uuid.uuid4().hex[:6]}"
    store = RedisStore(redis_server.url, prefix=prefix, retention=Retention(ttl=1000))
    raw = aioredis.Redis.from_url(redis_server.url)
    keys = [stream_key(prefix, "t"), f"{prefix}:{{t}}:meta", f"{prefix}:{{t}}:ids"]

    async def ttls() -> list[int]:
        return [await raw.pttl(key) for key in keys]

    try:
        await store.append("t", [item(0)])  # a new thread: every key gets one
        first = await ttls()
        assert all(990_000 < t <= 1_000_000 for t in first), first
        await asyncio.sleep(0.3)
        await store.append("t", [item(1)])  # within the sixteenth: not refreshed
        assert all(t < f - 250 for t, f in zip(await ttls(), first, strict=True))
        # A sixteenth of the TTL (62.5 s) has passed since the refresh:
        expires = int(await raw.hget(keys[1], "expires"))
        await raw.hset(keys[1], "expires", str(expires - 63_000))
        await store.append("t", [item(2)])
        assert all(t > 999_000 for t in await ttls())
        # A key made anew gets one at once: the stream lost (a new epoch).
        await raw.delete(keys[0])
        await store.append("t", [item(3)])
        assert all(t > 999_000 for t in await ttls())
    finally:
        await raw.aclose()
        await store.close()


async def test_the_index_of_runs_expires_with_its_thread(redis_server: RedisServer) -> None:
    """The index is made by a thread's first RUN_STARTED, perhaps long after the
    thread: it gets a TTL at once, and is refreshed with the other keys."""
    prefix = f"ttl-{uuid.uuid4().hex[:6]}"
    store = RedisStore(redis_server.url, prefix=prefix, retention=Retention(ttl=1000))
    raw = aioredis.Redis.from_url(redis_server.url)
    runs, meta = runs_key(prefix, "t"), f"{prefix}:{{t}}:meta"
    try:
        await store.append("t", [item(0)])
        await asyncio.sleep(0.3)
        started = {"type": "RUN_STARTED", "threadId": "t", "runId": "late"}
        await store.append("t", [EventInput.of(started, "s")])
        assert 990_000 < await raw.pttl(runs) <= 1_000_000
        expires = int(await raw.hget(meta, "expires"))
        await raw.hset(meta, "expires", str(expires - 63_000))
        await raw.pexpire(runs, 500_000)
        await store.append("t", [item(1)])  # a refresh: every key, the index too
        assert await raw.pttl(runs) > 999_000
    finally:
        await raw.aclose()
        await store.close()


async def test_retention_options_reach_redis(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix="ret", retention=Retention(max_len=2, ttl=30))
    await store.append("t", [item(i) for i in range(4)])
    raw = aioredis.Redis.from_url(redis_server.url)
    assert await raw.xlen(stream_key("ret", "t")) == 2
    assert 0 < await raw.ttl(stream_key("ret", "t")) <= 30
    assert await raw.hlen("ret:{t}:ids") == 2  # ids of trimmed events are forgotten
    await raw.aclose()
    await store.close()


async def test_subscribers_learn_of_a_long_outage(own_redis: RedisServer) -> None:
    store = RedisStore(own_redis.url, socket_timeout=0.5, outage_grace=0.5)
    await store.append("t", [item(0)])
    async with store.subscribe("t", after=START) as feed:
        assert len(await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)) == 1
        reading = asyncio.create_task(collect(feed, 1))
        await asyncio.sleep(0.2)
        assert feed.state is FeedState.LIVE  # caught up, waiting on the live reader
        own_redis.stop(kill=True)
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(reading, 20 * TIMEOUT_SCALE)
    own_redis.start()  # empty: this server keeps nothing
    # Once Redis is back, a new subscription works again, live events included.
    async with store.subscribe("t", after=START) as again:
        reading = asyncio.create_task(collect(again, 1))
        await asyncio.sleep(0.1)
        await store.append("t", [item(1)])
        got = await asyncio.wait_for(reading, 10 * TIMEOUT_SCALE)
    assert msgpack.unpackb(got[0].data)["delta"] == "d1"
    await store.close()


async def test_resubscribing_right_after_closing_still_gets_live_events(
    redis_server: RedisServer,
) -> None:
    # Closing the last subscription schedules an UNSUBSCRIBE; a new subscription
    # to the same thread made before it runs must not lose its notifications.
    store = RedisStore(redis_server.url, prefix="resub")
    for round_ in range(5):
        first = store.subscribe("t")
        await first.open()
        await first.close()
        async with store.subscribe("t") as feed:
            reading = asyncio.create_task(collect(feed, 1))
            await asyncio.sleep(0.05)
            await store.append("t", [item(round_)])
            got = await asyncio.wait_for(reading, 10 * TIMEOUT_SCALE)
        assert msgpack.unpackb(got[0].data)["delta"] == f"d{round_}"
    await store.close()


async def test_a_conditional_append_replayed_by_redis_py_gets_its_offsets(
    own_redis: RedisServer,
) -> None:
    """redis-py resends a command whose reply timed out; the resend of a conditional
    append finds the first one's entries after the expected offset. It is answered
    with their offsets, not a conflict, so the writer does not refuse its own event."""
    thread = "replayed"
    store = RedisStore(own_redis.url, socket_timeout=0.3)
    admin = aioredis.Redis.from_url(own_redis.url)
    try:
        writer = ThreadWriter(store)
        await writer.publish(thread, [{"type": "RUN_STARTED", "threadId": thread, "runId": "r"}])
        await writer.publish(thread, [{"type": "TEXT_MESSAGE_START", "messageId": "m"}])
        before = await evalsha_calls(admin)
        # A script keeps the server busy for 0.8 s: the append waits in its
        # socket, and its reply comes after the socket timeout.
        busy = asyncio.create_task(admin.eval(BUSY_SCRIPT, 0, 800_000))
        await asyncio.sleep(0.1)
        # An event that may not come twice: judged again after the first went
        # through, it would break the rules.
        end = {"type": "TEXT_MESSAGE_END", "messageId": "m"}
        offsets = await asyncio.wait_for(writer.publish(thread, [end]), 10 * TIMEOUT_SCALE)
        await busy
        assert await evalsha_calls(admin) - before >= 2, "redis-py did not resend the append"

        entries = await store.read(thread)
        types = [e.type for e in entries]
        assert types == ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_END"]
        assert offsets == [entries[-1].offset]
        # The writer's state is right: the message is closed, the run goes on.
        await writer.publish(thread, [{"type": "TEXT_MESSAGE_START", "messageId": "m2"}])
    finally:
        await admin.aclose()
        await store.close()


BUSY_SCRIPT = """
local start = redis.call('TIME')
repeat
  local now = redis.call('TIME')
until (now[1] - start[1]) * 1000000 + (now[2] - start[2]) >= tonumber(ARGV[1])
return 1
"""
"""Keeps the server busy for ARGV[1] microseconds (commands of others wait)."""


async def evalsha_calls(admin: aioredis.Redis) -> int:
    stats = await admin.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


# -- read_available: pages, trimming and epochs --------------------------------------------


def payload_delta(entry: Any) -> str:
    return str(msgpack.unpackb(entry.data)["delta"])


async def test_read_available_goes_on_after_trimming_overtakes_it(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "READ_PAGE", 2)
    store = RedisStore(redis_server.url, prefix=f"ra{uuid.uuid4().hex[:8]}")
    store.retention = Retention(max_len=6)
    offsets = await store.append("t", [item(i) for i in range(6)])
    read_page = store._read_page
    calls = 0

    async def trimming_between_pages(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:  # after the first page: four more events trim e0..e3
            await store.append("t", [item(i) for i in range(6, 10)])
        return await read_page(*args)

    monkeypatch.setattr(store, "_read_page", trimming_between_pages)
    got = await store.read_available("t")
    assert got.gap and got.trimmed == offsets[3]
    assert [payload_delta(e) for e in got.entries] == [f"d{i}" for i in range(4, 10)]
    await store.close()


async def test_read_available_starts_over_when_the_epoch_changes(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_store, "READ_PAGE", 2)
    store = RedisStore(redis_server.url, prefix=f"ra{uuid.uuid4().hex[:8]}")
    await store.append("t", [item(i) for i in range(5)])
    read_page = store._read_page
    calls = 0

    async def recreated_between_pages(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            await store.delete("t")
            await store.append("t", [item(i) for i in range(100, 103)])
        return await read_page(*args)

    monkeypatch.setattr(store, "_read_page", recreated_between_pages)
    got = await store.read_available("t")
    assert got.epoch == await store.epoch("t") and not got.gap
    assert [payload_delta(e) for e in got.entries] == ["d100", "d101", "d102"]
    await store.close()


async def test_read_available_ends_with_one_atomic_read(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread re-created between every two pages: after a bounded number of
    tries it reads everything in one MULTI instead of failing."""
    monkeypatch.setattr(redis_store, "READ_PAGE", 2)
    store = RedisStore(redis_server.url, prefix=f"ra{uuid.uuid4().hex[:8]}")
    await store.append("t", [item(i) for i in range(5)])
    read_page = store._read_page
    sizes: list[int | None] = []

    async def always_recreated(thread: str, after: str, limit: int | None) -> Any:
        sizes.append(limit)
        if after != START:
            await store.delete("t")
            await store.append("t", [item(i) for i in range(5)])
        return await read_page(thread, after, limit)

    monkeypatch.setattr(store, "_read_page", always_recreated)
    got = await store.read_available("t")
    assert [payload_delta(e) for e in got.entries] == [f"d{i}" for i in range(5)]
    assert sizes[-1] is None and sizes.count(None) == 1
    assert len(sizes) == 2 * (redis_store.READ_TRIES - 1) + 1
    await store.close()


# -- entries written by others -------------------------------------------------------------


def test_entry_never_raises() -> None:
    def entry(*fields: Any) -> Any:
        return redis_resp.parse_entry([b"5-1", list(fields)])

    e = entry(b"event", b"\x80", b"id", b"\xff\xfe", b"run", b"r", b"type", b"X")
    assert (e.offset, e.data, e.event_id, e.run_id, e.type) == (
        "5-1",
        b"\x80",
        "\ufffd\ufffd",
        "r",
        "X",
    )
    e = entry(b"id", b"only")
    assert (e.data, e.event_id, e.run_id, e.type) == (b"", "only", None, "")
    e = entry(b"type", b"T", b"event", b"\x90")
    assert (e.data, e.event_id, e.type) == (b"\x90", "5-1", "T")  # no id: the offset
    e = entry(b"event", b"\x90", b"run", b"r", b"id", b"i", b"type", b"T")  # another order
    assert (e.event_id, e.run_id) == ("i", "r")
    e = entry(b"odd")
    assert e.data == b"" and e.event_id == "5-1"


# -- retention by bytes: the total in meta ----------------------------------------------------


def sized(i: int, pad: int = 100) -> EventInput:
    event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"{i:05d}" + "x" * pad}
    return EventInput.of(event, f"s{i}")


async def byte_totals(raw: aioredis.Redis, prefix: str, thread: str) -> tuple[int, int]:
    """(the total kept in meta, the sum of the stored payloads)."""
    kept = await raw.hget(meta_key(prefix, thread), "bytes")
    entries: Any = await raw.xrange(stream_key(prefix, thread))
    return int(kept or 0), sum(len(fields[b"event"]) for _, fields in entries)


async def test_byte_total_in_meta_follows_every_trim(redis_server: RedisServer) -> None:
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    size = len(encode_event_data(sized(0).event))
    store = RedisStore(redis_server.url, prefix=prefix, retention=Retention(max_len=4, max_bytes=0))
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await store.append("t", [sized(i) for i in range(6)])  # max_len trims 2
        assert await byte_totals(raw, prefix, "t") == (4 * size, 4 * size)
        store.retention = Retention(max_len=0, max_age=0.3, max_bytes=0)
        await asyncio.sleep(0.6 * TIMEOUT_SCALE)
        await store.append("t", [sized(6)])  # max_age trims the 4 others
        assert await byte_totals(raw, prefix, "t") == (size, size)
        store.retention = Retention(max_len=0, max_bytes=2 * size)
        await store.append("t", [sized(i) for i in range(7, 10)])  # kept whole: its own
        assert await byte_totals(raw, prefix, "t") == (3 * size, 3 * size)
        await store.append("t", [sized(10)])  # max_bytes trims 2
        assert await byte_totals(raw, prefix, "t") == (2 * size, 2 * size)
        info = await store.info("t")
        assert info is not None and info.bytes == 2 * size
        assert await raw.xlen(stream_key(prefix, "t")) == 2
        assert await raw.hlen(f"{prefix}:{{t}}:ids") == 2  # ids of trimmed events forgotten
    finally:
        await raw.aclose()
        await store.close()


async def test_byte_trim_reads_a_bounded_number_of_entries_per_append(
    redis_server: RedisServer,
) -> None:
    """A thread far over max_bytes (the limit was lowered) is trimmed by at most
    1024 entries per append; later appends go on until it fits."""
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    size = len(encode_event_data(sized(0, pad=0).event))
    store = RedisStore(redis_server.url, prefix=prefix, retention=Retention(max_bytes=0))
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        for start in range(0, 1500, 500):
            await store.append("t", [sized(i, pad=0) for i in range(start, start + 500)])
        store.retention = Retention(max_bytes=10 * size)
        await store.append("t", [sized(1500, pad=0)])
        assert await raw.xlen(stream_key(prefix, "t")) == 1501 - 1024
        assert await byte_totals(raw, prefix, "t") == (477 * size, 477 * size)
        info = await store.info("t")
        assert info is not None and info.trimmed is not None
        with pytest.raises(OffsetExpired) as caught:
            await store.read("t")
        assert caught.value.first == info.first
        kept = [e.offset for e in await store.read("t", after=info.trimmed)]
        assert len(kept) == 477
        last = await store.append("t", [sized(1501, pad=0)])
        # The oldest go first, the new event stays: the newest 9 of before and it.
        assert [e.offset for e in await store.read("t", after=kept[-10])] == kept[-9:] + last
        assert await raw.xlen(stream_key(prefix, "t")) == 10
        assert await byte_totals(raw, prefix, "t") == (10 * size, 10 * size)
    finally:
        await raw.aclose()
        await store.close()


async def test_a_lost_stream_resets_the_byte_total(redis_server: RedisServer) -> None:
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    size = len(encode_event_data(sized(0).event))
    store = RedisStore(redis_server.url, prefix=prefix)
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await store.append("t", [sized(i) for i in range(3)])
        epoch = await store.epoch("t")
        await raw.delete(stream_key(prefix, "t"))  # evicted alone
        await store.append("t", [sized(3)])
        assert await store.epoch("t") != epoch
        assert await byte_totals(raw, prefix, "t") == (size, size)
    finally:
        await raw.aclose()
        await store.close()


async def test_a_thread_without_a_byte_total_is_measured_once(
    redis_server: RedisServer,
) -> None:
    """Written before the total was kept (no `bytes` in meta), or by a plain
    XADD: the next append counts what the stream holds."""
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    size = len(encode_event_data(sized(0).event))
    store = RedisStore(redis_server.url, prefix=prefix, retention=Retention(max_bytes=0))
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await store.append("old", [sized(i) for i in range(3)])
        await raw.hdel(meta_key(prefix, "old"), "bytes")
        await store.append("old", [sized(3)])
        assert await byte_totals(raw, prefix, "old") == (4 * size, 4 * size)
        plain = msgpack.packb({"type": "CUSTOM", "name": "n", "value": "v" * 50})
        await raw.xadd(stream_key(prefix, "plain"), {"event": plain, "id": "x1"})
        assert await store.epoch("plain")  # read first: the epoch is made then
        await store.append("plain", [sized(0)])
        assert await byte_totals(raw, prefix, "plain") == (len(plain) + size,) * 2
    finally:
        await raw.aclose()
        await store.close()


# -- threads per tenant: the tenant set -------------------------------------------------------


async def test_tenant_set_follows_creations_deletes_and_expiry(redis_server: RedisServer) -> None:
    prefix = f"tq{uuid.uuid4().hex[:8]}"
    store = RedisStore(
        redis_server.url, prefix=prefix, retention=Retention(max_tenant_threads=2, ttl=0.4)
    )
    raw = aioredis.Redis.from_url(redis_server.url)
    acme = tenant_key(prefix, "acme")
    try:
        await store.append("acme/a", [item(1)])
        await store.append("acme/b", [item(1)])
        await store.append("loose", [item(1)])
        assert await raw.smembers(acme) == {b"acme/a", b"acme/b"}
        assert await raw.smembers(tenant_key(prefix, "")) == {b"loose"}
        with pytest.raises(TooManyThreads):
            await store.append("acme/c", [item(1)])
        assert await raw.exists(stream_key(prefix, "acme/c"), meta_key(prefix, "acme/c")) == 0
        assert await raw.smembers(acme) == {b"acme/a", b"acme/b"}
        await store.delete("acme/a")
        assert await raw.smembers(acme) == {b"acme/b"}
        await store.append("acme/c", [item(1)])
        assert await raw.smembers(acme) == {b"acme/b", b"acme/c"}
        await asyncio.sleep(0.9 * TIMEOUT_SCALE)  # both expire; their ids stay in the set
        assert await raw.smembers(acme) == {b"acme/b", b"acme/c"}
        await store.append("acme/d", [item(1)])  # at the limit: the dead are dropped
        assert await raw.smembers(acme) == {b"acme/d"}
    finally:
        await raw.aclose()
        await store.close()


async def test_a_try_at_the_quota_checks_a_bounded_sample(redis_server: RedisServer) -> None:
    """At its limit a tenant's creation checks at most 64 members for expiry, however
    large the quota: trying again and again at the limit costs Redis little."""
    prefix = f"tq{uuid.uuid4().hex[:8]}"
    store = RedisStore(
        redis_server.url, prefix=prefix, retention=Retention(max_tenant_threads=200, ttl=1.0)
    )
    raw = aioredis.Redis.from_url(redis_server.url)
    acme = tenant_key(prefix, "acme")
    try:
        await asyncio.gather(*(store.append(f"acme/{n}", [item(1)]) for n in range(200)))
        assert await raw.scard(acme) == 200
        await asyncio.sleep(1.5 * TIMEOUT_SCALE)  # every one of them expired
        await store.append("acme/new", [item(1)])  # a sample of the dead made room
        assert await raw.scard(acme) == 200 - 64 + 1
    finally:
        await raw.aclose()
        await store.close()


async def test_the_quota_prunes_threads_with_braces_by_their_keys(
    redis_server: RedisServer,
) -> None:
    """The append script finds a member's keys by its tag, as the store names them:
    a live thread with a `}` is kept, an expired one dropped."""
    prefix = f"tq{uuid.uuid4().hex[:8]}"
    store = RedisStore(
        redis_server.url, prefix=prefix, retention=Retention(max_tenant_threads=2, ttl=0.5)
    )
    raw = aioredis.Redis.from_url(redis_server.url)
    acme = tenant_key(prefix, "acme")
    try:
        await store.append("acme/}a", [item(1)])
        await store.append("acme/%7D}", [item(1)])
        with pytest.raises(TooManyThreads):  # both alive: neither is taken for gone
            await store.append("acme/c", [item(1)])
        assert await raw.smembers(acme) == {b"acme/}a", b"acme/%7D}"}
        await asyncio.sleep(1.1 * TIMEOUT_SCALE)  # both expire
        await store.append("acme/d", [item(1)])
        assert await raw.smembers(acme) == {b"acme/d"}
    finally:
        await raw.aclose()
        await store.close()


async def test_no_tenant_set_without_a_quota(redis_server: RedisServer) -> None:
    prefix = f"tq{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_server.url, prefix=prefix)
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        for n in range(3):
            await store.append(f"acme/{n}", [item(1)])
        assert await raw.exists(tenant_key(prefix, "acme")) == 0
    finally:
        await raw.aclose()
        await store.close()


# -- the default ttl and eviction policies -----------------------------------------------------


async def test_default_ttl_is_reported_under_a_volatile_policy(own_redis: RedisServer) -> None:
    """The default retention gives thread keys a TTL (7 days): evictable under
    volatile-*; ttl=0 keeps them out of reach of that policy."""
    admin = aioredis.Redis.from_url(own_redis.url)
    default = RedisStore(own_redis.url)
    forever = RedisStore(own_redis.url, retention=Retention(ttl=0))
    try:
        await admin.config_set("appendonly", "yes")
        await admin.config_set("maxmemory-policy", "volatile-lru")
        # Switching AOF on starts a rewrite of the initial AOF; until it is written
        # Redis refuses to shut down on SIGTERM ("Writing initial AOF, can't exit")
        # and the fixture would wait out its 10 s before killing it.
        async with asyncio.timeout(10 * TIMEOUT_SCALE):
            while True:
                persistence = await admin.info("persistence")
                if not (
                    persistence["aof_rewrite_in_progress"] or persistence["aof_rewrite_scheduled"]
                ):
                    break
                await asyncio.sleep(0.01)
        (warning,) = await default.durability_warnings()
        assert "volatile-lru" in warning and "ttl option to 0" in warning
        assert await forever.durability_warnings() == []
        await default.append("t", [item(1)])
        assert 604_700 < await admin.ttl(stream_key("agui", "t")) <= 604_800
    finally:
        await admin.aclose()
        await default.close()
        await forever.close()


def test_volatile_policy_warning_names_the_fix() -> None:
    settings = {"appendonly": "yes", "appendfsync": "everysec", "save": ""}
    (warning,) = durability_problems(
        {**settings, "maxmemory-policy": "volatile-ttl"}, "r", uses_ttl=True
    )
    assert "7 days unless set" in warning and "ttl option to 0" in warning


# -- key names: thread tags and the listing --------------------------------------------------


def test_keys_of_a_name_without_a_closing_brace_are_as_they_always_were() -> None:
    for thread in ("t", "tenant/x", "a{b", "{", "%7D", "é 🙂"):
        assert stream_key("agui", thread) == f"agui:{{{thread}}}:events"
        assert meta_key("agui", thread) == f"agui:{{{thread}}}:meta"
        assert notify_channel("agui", thread) == f"agui:{{{thread}}}:notify"
    assert stream_key("agui", "}abc") == "agui:{ %7Dabc}:events"
    assert stream_key("agui", "a%}") == "agui:{ a%25%7D}:events"


async def test_the_listing_reads_names_back_and_skips_other_layouts(
    redis_server: RedisServer,
) -> None:
    base = f"tl{uuid.uuid4().hex[:8]}"
    glob = RedisStore(redis_server.url, prefix=f"{base}*")
    other = RedisStore(redis_server.url, prefix=f"{base}x")
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        names = ["}", "}{", "{}", "a{b}c", "%7D", "plain"]
        for name in names:
            await glob.append(name, [item(1)])
        # Keys of a name with `}` as they were named before tags were escaped:
        # nobody's (the thread's keys are elsewhere), so not listed.
        await raw.xadd(f"{base}*:{{a}}b}}:events", {"event": encode_event_data({}), "id": "x"})
        await other.append("elsewhere", [item(1)])
        # `*` in a prefix is no wildcard: the other prefix's thread is not listed.
        assert await glob.threads() == sorted(names)
        assert await other.threads() == ["elsewhere"]
    finally:
        await raw.aclose()
        await glob.close()
        await other.close()
