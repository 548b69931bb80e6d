"""The Redis live reader's notifications that carry their entries, on a real redis-server.

An append notifies with its new entries and the offset they follow; a
reader whose cursor is exactly there delivers them without a read. Every
other notification (too large, a gap, a plain producer's, a forged or
garbled one, another epoch) makes the reader read after its cursor, as
before, so that nothing is lost, repeated or made up.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis

from agui_hub.errors import OffsetExpired
from agui_hub.store.contract import START, Entry, EventInput, FeedSubscription, Retention
from agui_hub.store.redis.live import carried_entries
from agui_hub.store.redis.store import RedisStore, notify_channel, stream_key

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..streams import collect

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE


def item(i: int, size: int = 0) -> EventInput:
    event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}" + "x" * size}
    return EventInput.of(event, f"e{i}")


class Reads:
    """Counts the live reader's reads (one call per batch of notified threads)."""

    def __init__(self, store: RedisStore) -> None:
        self.count = 0
        reader = store._reader
        fetch = reader._fetch_dirty

        async def counted() -> None:
            self.count += 1
            await fetch()

        reader._fetch_dirty = counted  # type: ignore[method-assign]


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStore]:
    # Each test closes it (in its own event loop).
    yield RedisStore(redis_server.url, prefix=f"live-{uuid.uuid4().hex[:8]}")


async def live_feed(store: RedisStore, thread: str) -> tuple[FeedSubscription, Reads]:
    """A live feed of *thread* (which exists), its first read done."""
    feed = store.subscribe(thread)
    await feed.open()
    reads = Reads(store)
    # The subscription's confirmation makes one read: wait until it is done.
    for _ in range(200):
        if not store._reader._dirty:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    reads.count = 0
    return feed, reads


async def test_small_appends_reach_the_feed_without_reads(store: RedisStore) -> None:
    offsets = await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        for i in range(1, 201):
            offsets += await store.append("t", [item(i)])
        got = await asyncio.wait_for(collect(feed, 200), WAIT)
        assert [e.offset for e in got] == offsets[1:]
        assert [e.event_id for e in got] == [f"e{i}" for i in range(1, 201)]
        assert got == await store.read("t", after=offsets[0])  # the same entries, field by field
        assert reads.count == 0
    finally:
        await feed.close()
        await store.close()


async def test_run_ids_and_batches_are_carried_as_stored(store: RedisStore) -> None:
    run = {"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}
    await store.append("t", [EventInput.of(run, "start")])
    feed, reads = await live_feed(store, "t")
    try:
        await store.append("t", [item(i) for i in range(50)])  # one append, one notification
        got = await asyncio.wait_for(collect(feed, 50), WAIT)
        stored = await store.read("t")
        assert got == stored[1:]
        assert {e.run_id for e in got} == {"r1"}  # the stored run, filled in by the script
        assert reads.count == 0
    finally:
        await feed.close()
        await store.close()


async def test_an_append_over_notify_bytes_is_read(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix=f"live-{uuid.uuid4().hex[:8]}", notify_bytes=1000)
    await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        await store.append("t", [item(1, size=2000)])  # over the bound: offset only
        await store.append("t", [item(2)])  # small, and follows what was read
        got = await asyncio.wait_for(collect(feed, 2), WAIT)
        assert [e.event_id for e in got] == ["e1", "e2"]
        assert len(got[0].data) > 2000
        assert reads.count == 1
    finally:
        await feed.close()
        await store.close()


async def test_no_entries_carried_when_disabled(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, prefix=f"live-{uuid.uuid4().hex[:8]}", notify_bytes=0)
    admin = aioredis.from_url(redis_server.url)
    pubsub = admin.pubsub()
    try:
        await pubsub.subscribe(notify_channel(store.prefix, "t"))
        await pubsub.get_message(timeout=1)  # the confirmation
        (offset,) = await store.append("t", [item(0)])
        message = await pubsub.get_message(timeout=WAIT)
        assert message is not None and message["data"] == offset.encode()
    finally:
        await pubsub.aclose()
        await admin.aclose()
        await store.close()


async def test_a_plain_xadd_in_between_makes_the_reader_read(
    store: RedisStore, redis_server: RedisServer
) -> None:
    """Entries a plain producer added without notifying are not skipped: the next
    carried notification does not follow the reader's cursor, so it reads both."""
    admin = aioredis.from_url(redis_server.url)
    await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        plain = (await admin.xadd(stream_key(store.prefix, "t"), {"event": b"\x80"})).decode()
        (carried,) = await store.append("t", [item(1)])
        got = await asyncio.wait_for(collect(feed, 2), WAIT)
        assert [e.offset for e in got] == [plain, carried]
        assert reads.count == 1
    finally:
        await admin.aclose()
        await feed.close()
        await store.close()


@pytest.mark.parametrize(
    "payload",
    [
        b"1-0",  # a plain producer's: an offset
        b"rewound",
        b"\x94\x01",  # the prefix of a carried one, cut short
        msgpack.packb([1, "epoch", "0-0", ["1-1", "id", "", "T"]]),  # an entry cut short
        msgpack.packb([1, "epoch", "0-0", "not a list"]),
        msgpack.packb([1, b"\xff", b"0-0", []]),  # an epoch that is not UTF-8
        msgpack.packb([1, "epoch", "0-0", []]),  # nothing carried
    ],
)
async def test_garbled_notifications_fall_back_to_a_read(
    store: RedisStore, redis_server: RedisServer, payload: bytes
) -> None:
    admin = aioredis.from_url(redis_server.url)
    await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        await admin.publish(notify_channel(store.prefix, "t"), payload)
        for _ in range(100):
            if reads.count:
                break
            await asyncio.sleep(0.02)
        assert reads.count == 1
        (offset,) = await store.append("t", [item(1)])
        got = await asyncio.wait_for(collect(feed, 1), WAIT)
        assert [e.offset for e in got] == [offset]
        assert feed._error is None
    finally:
        await admin.aclose()
        await feed.close()
        await store.close()


async def test_a_notification_of_another_epoch_is_not_delivered(
    store: RedisStore, redis_server: RedisServer
) -> None:
    """Entries that claim another epoch at the reader's very cursor are read, not
    believed: the stored stream says what comes next."""
    admin = aioredis.from_url(redis_server.url)
    (first,) = await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        fake = msgpack.packb([1, "other-epoch", first, ["9999999999999-0", "x", "", "T", b"\x80"]])
        await admin.publish(notify_channel(store.prefix, "t"), fake)
        (second,) = await store.append("t", [item(1)])
        got = await asyncio.wait_for(collect(feed, 1), WAIT)
        assert [e.offset for e in got] == [second]
        assert reads.count >= 1
    finally:
        await admin.aclose()
        await feed.close()
        await store.close()


async def test_entries_trimmed_by_their_own_append_are_not_carried(
    redis_server: RedisServer,
) -> None:
    """max_len below the batch: the newest kept entries are stored, the others
    were trimmed by the same call; the reader must not deliver trimmed entries."""
    store = RedisStore(
        redis_server.url,
        prefix=f"live-{uuid.uuid4().hex[:8]}",
        retention=Retention(max_len=5),
    )
    await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        await store.append("t", [item(i) for i in range(1, 21)])
        with pytest.raises(OffsetExpired):
            await asyncio.wait_for(collect(feed, 20), WAIT)
        assert reads.count >= 1
    finally:
        await feed.close()
        await store.close()


async def test_a_conditional_append_carries_its_entries(store: RedisStore) -> None:
    from agui_hub.store.contract import Expected

    (first,) = await store.append("t", [item(0)])
    epoch = await store.epoch("t")
    feed, reads = await live_feed(store, "t")
    try:
        after = first
        for i in range(1, 21):
            (after,) = await store.append("t", [item(i)], expect=Expected(epoch, after))
        got = await asyncio.wait_for(collect(feed, 20), WAIT)
        assert [e.event_id for e in got] == [f"e{i}" for i in range(1, 21)]
        assert reads.count == 0
    finally:
        await feed.close()
        await store.close()


async def test_many_threads_in_one_burst_are_delivered_in_order(store: RedisStore) -> None:
    threads = [f"t{i}" for i in range(50)]
    for t in threads:
        await store.append(t, [item(0)])
    feeds: dict[str, FeedSubscription] = {}
    for t in threads:
        feeds[t] = store.subscribe(t)
        await feeds[t].open()
    try:
        expected: dict[str, list[str]] = {t: [] for t in threads}
        for i in range(1, 21):
            results = await asyncio.gather(*(store.append(t, [item(i)]) for t in threads))
            for t, offsets in zip(threads, results, strict=True):
                expected[t] += offsets
        got: dict[str, list[Entry]] = {}
        for t in threads:
            got[t] = await asyncio.wait_for(collect(feeds[t], 20), WAIT)
        assert {t: [e.offset for e in got[t]] for t in threads} == expected
    finally:
        for f in feeds.values():
            await f.close()
        await store.close()


async def test_a_late_subscriber_gets_history_then_carried_entries(store: RedisStore) -> None:
    offsets: list[str] = []
    for i in range(30):
        offsets += await store.append("t", [item(i)])
    feed = store.subscribe("t", after=START)
    try:
        task: asyncio.Task[Any] = asyncio.ensure_future(collect(feed, 60))
        for i in range(30, 60):
            offsets += await store.append("t", [item(i)])
        got = await asyncio.wait_for(task, WAIT)
        assert [e.offset for e in got] == offsets
    finally:
        await feed.close()
        await store.close()


async def test_the_same_page_asked_at_once_is_read_once(store: RedisStore) -> None:
    """A resume storm asks for the same page of a thread many times at once: one
    round trip serves them all, and a caller that gives up does not fail the others."""
    offsets: list[str] = []
    for i in range(50):
        offsets += await store.append("t", [item(i)])
    reads = 0
    read_page = store._read_page

    async def counted(*args: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read_page(*args)

    store._read_page = counted  # type: ignore[method-assign]
    try:
        quitter = asyncio.ensure_future(store.read_available("t", after=offsets[9], limit=20))
        pages = [store.read_available("t", after=offsets[9], limit=20) for _ in range(200)]
        await asyncio.sleep(0)  # every read asked for before the first answers
        quitter.cancel()
        results = await asyncio.wait_for(asyncio.gather(*pages), WAIT)
        assert reads == 1
        assert all([e.offset for e in r.entries] == offsets[10:30] for r in results)
        # Another page, or the same one asked later, is read again.
        await store.read_available("t", after=offsets[29], limit=20)
        await store.read_available("t", after=offsets[9], limit=20)
        assert reads == 3
    finally:
        await store.close()


@pytest.mark.parametrize(
    "entries",
    [
        ["+2", "id", "", "T", 5],  # a payload that is not bytes
        ["0-1", "id", "", "T", b"\x80"],  # not after the cursor
        ["+2", "id", "", "T", b"\x80", "+1", "id2", "", "T", b"\x80"],  # out of order
        ["not-an-offset", "id", "", "T", b"\x80"],
        ["+2", "id", "", "T"],  # cut short
    ],
)
async def test_a_bad_notification_at_the_cursor_is_read_not_believed(
    store: RedisStore, redis_server: RedisServer, entries: list[Any]
) -> None:
    """Entries that claim to follow the cursor but are not well formed make
    the reader read: no feed fails, this thread's nor another's."""
    admin = aioredis.from_url(redis_server.url)
    (first,) = await store.append("t", [item(0)])
    await store.append("u", [item(0)])
    feed, reads = await live_feed(store, "t")
    other = store.subscribe("u")
    await other.open()
    try:
        epoch = await store.epoch("t")
        ms = int(first.split("-")[0])
        # "+n": an offset n ms after the cursor (believable but for what is wrong).
        entries = [f"{ms + int(x[1:])}-0" if x in ("+1", "+2") else x for x in entries]
        await admin.publish(
            notify_channel(store.prefix, "t"), msgpack.packb([1, epoch, first, entries])
        )
        (second,) = await store.append("t", [item(1)])
        (third,) = await store.append("u", [item(1)])
        got = await asyncio.wait_for(collect(feed, 1), WAIT)
        assert [e.offset for e in got] == [second]
        assert [e.offset for e in await asyncio.wait_for(collect(other, 1), WAIT)] == [third]
        assert reads.count >= 1 and feed._error is None and other._error is None
    finally:
        await admin.aclose()
        await other.close()
        await feed.close()
        await store.close()


async def test_a_notification_of_entries_already_read_is_skipped(
    store: RedisStore, redis_server: RedisServer
) -> None:
    """A read made after an append can take that append's entries before its
    notification is handled: the notification then brings nothing new and
    costs no second read (and delivers nothing twice)."""
    admin = aioredis.from_url(redis_server.url)
    (first,) = await store.append("t", [item(0)])
    feed, reads = await live_feed(store, "t")
    try:
        epoch = await store.epoch("t")
        (second,) = await store.append("t", [item(1)])
        assert [e.offset for e in await asyncio.wait_for(collect(feed, 1), WAIT)] == [second]
        # The notification of the entry just delivered, once more (prev is not the cursor).
        stale = msgpack.packb([1, epoch, first, [second, "e1", "", "T", b"\x80"]])
        await admin.publish(notify_channel(store.prefix, "t"), stale)
        (third,) = await store.append("t", [item(2)])
        got = await asyncio.wait_for(collect(feed, 1), WAIT)
        assert [e.offset for e in got] == [third]
        assert reads.count == 0
    finally:
        await admin.aclose()
        await feed.close()
        await store.close()


def test_carried_entries_at_or_before_the_cursor_are_nothing_new() -> None:
    entry = ["5-0", "id", "", "T", b"\x80"]
    note = msgpack.packb([1, "ep", "3-0", entry])
    assert carried_entries(note, "5-0", "ep") == ("ep", [])
    assert carried_entries(note, "7-0", "ep") == ("ep", [])
    assert carried_entries(note, "4-0", "ep") is None  # a gap: read
    assert carried_entries(note, "5-0", "other") is None  # another epoch: read
    assert carried_entries(note, "5-0", None) is None  # no epoch known yet: read
    following = carried_entries(note, "3-0", "ep")
    assert following is not None and [e.offset for e in following[1]] == ["5-0"]


async def test_a_subscribe_on_an_idle_reader_is_confirmed_at_once(store: RedisStore) -> None:
    """The reader with nothing subscribed starts reading as soon as a SUBSCRIBE
    goes out, instead of at its next look (every 50 ms): a first viewer's
    subscribe is not 50 ms slower than the next ones."""
    took = []
    try:
        for i in range(9):
            started = time.perf_counter()
            feed = store.subscribe(f"idle-{i}")
            await asyncio.wait_for(feed.open(), WAIT)
            took.append(time.perf_counter() - started)
            await feed.close()
            await asyncio.sleep(0.1)  # idle again before the next one
    finally:
        await store.close()
    assert statistics.median(took) < 0.02, took  # 52 ms each when it looked every 50 ms
