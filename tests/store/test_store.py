"""The ThreadStore contract, run against both stores (memory and a real redis-server)."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import msgpack
import pytest

from agui_hub.errors import (
    AppendConflict,
    InvalidEvent,
    InvalidOffset,
    OffsetExpired,
    SubscriptionLagged,
    ThreadReset,
    TooManyThreads,
)
from agui_hub.store import open_store
from agui_hub.store.contract import (
    START,
    Available,
    Checkpoint,
    EventInput,
    Expected,
    Retention,
    ThreadStore,
    encode_event_data,
    offset_key,
    tenant_of,
)
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore
from agui_hub.store.urls import parse_store_url, redact_url

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..streams import collect
from .conftest import StoreFactory

pytestmark = pytest.mark.timeout(60)


def content(i: int, message: str = "m1") -> dict[str, Any]:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"d{i}"}


def item(i: int, prefix: str = "e") -> EventInput:
    return EventInput.of(content(i), f"{prefix}{i}")


def deltas(entries: list[Any]) -> list[str]:
    return [msgpack.unpackb(e.data)["delta"] for e in entries]


async def test_append_and_read_in_order(make_store: StoreFactory) -> None:
    store = await make_store()
    offsets = await store.append("t", [item(i) for i in range(5)])
    assert len(offsets) == 5
    assert [offset_key(o) for o in offsets] == sorted(offset_key(o) for o in offsets)
    assert len(set(offsets)) == 5
    entries = await store.read("t")
    assert [e.offset for e in entries] == offsets
    assert deltas(entries) == [f"d{i}" for i in range(5)]
    assert [e.event_id for e in entries] == [f"e{i}" for i in range(5)]
    assert {e.type for e in entries} == {"TEXT_MESSAGE_CONTENT"}
    assert deltas(await store.read("t", after=offsets[1])) == ["d2", "d3", "d4"]
    assert deltas(await store.read("t", after=offsets[1], limit=2)) == ["d2", "d3"]
    assert await store.read("t", after=offsets[-1]) == []
    assert await store.last_offset("t") == offsets[-1]


async def test_unknown_thread_is_empty(make_store: StoreFactory) -> None:
    store = await make_store()
    assert await store.read("nobody") == []
    assert await store.epoch("nobody") is None
    assert await store.last_offset("nobody") == START
    assert await store.info("nobody") is None
    assert await store.delete("nobody") is False


async def test_retry_with_the_same_event_id_appends_nothing(make_store: StoreFactory) -> None:
    store = await make_store()
    first = await store.append("t", [item(1), item(2)])
    again = await store.append("t", [item(2), item(3), item(3)])
    assert again[0] == first[1]
    assert again[1] == again[2]  # a duplicate inside one batch too
    assert deltas(await store.read("t")) == ["d1", "d2", "d3"]


async def test_concurrent_appends_get_their_own_offsets(make_store: StoreFactory) -> None:
    """Many concurrent callers on several threads (group commit on Redis)."""
    store = await make_store()
    calls = [(f"t{n % 3}", [item(n, "c"), item(n + 1000, "c")]) for n in range(60)]
    results = await asyncio.gather(*(store.append(t, items) for t, items in calls))
    for (thread, items), offsets in zip(calls, results, strict=True):
        stored = {e.offset: e.event_id for e in await store.read(thread)}
        assert [stored[o] for o in offsets] == [i.event_id for i in items]
        assert offset_key(offsets[0]) < offset_key(offsets[1])
    for n in range(3):
        assert len(await store.read(f"t{n}")) == 40


async def test_concurrent_retries_of_one_event_store_it_once(make_store: StoreFactory) -> None:
    store = await make_store()
    results = await asyncio.gather(*(store.append("t", [item(7)]) for _ in range(10)))
    assert len({tuple(r) for r in results}) == 1
    assert deltas(await store.read("t")) == ["d7"]


async def test_conditional_append_goes_through_only_on_an_unchanged_thread(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    # A thread that does not exist yet: expected as such.
    with pytest.raises(AppendConflict):
        await store.append("t", [item(0)], expect=Expected("not-an-epoch", START))
    assert await store.epoch("t") is None  # nothing created
    first = await store.append("t", [item(1)], expect=Expected(None, START))
    epoch = await store.epoch("t")
    assert epoch is not None

    second = await store.append("t", [item(2), item(3)], expect=Expected(epoch, first[0]))
    # Someone else appended after what the caller saw: nothing is appended.
    for stale in (Expected(epoch, first[0]), Expected(epoch, START), Expected(None, START)):
        with pytest.raises(AppendConflict) as caught:
            await store.append("t", [item(4)], expect=stale)
        assert caught.value.thread == "t" and caught.value.code == "append_conflict"
    assert deltas(await store.read("t")) == ["d1", "d2", "d3"]

    # A retried id under a holding expectation: its offset, nothing appended.
    again = await store.append("t", [item(3), item(4)], expect=Expected(epoch, second[1]))
    assert again[0] == second[1]
    assert deltas(await store.read("t")) == ["d1", "d2", "d3", "d4"]

    # A replay of a call that went through (redis-py resends a command whose
    # reply was lost) finds its own events after the offset it expected: a
    # conflict too (the caller reads them; its ids are known then).
    with pytest.raises(AppendConflict):
        await store.append("t", [item(2), item(3)], expect=Expected(epoch, first[0]))
    assert deltas(await store.read("t")) == ["d1", "d2", "d3", "d4"]

    # A re-created thread has another epoch: the old expectation fails.
    await store.delete("t")
    await store.append("t", [item(9)])
    with pytest.raises(AppendConflict):
        await store.append("t", [item(10)], expect=Expected(epoch, again[1]))
    assert deltas(await store.read("t")) == ["d9"]


async def test_conditional_append_after_trimming_and_among_concurrent_appends(
    make_store: StoreFactory,
) -> None:
    """Trimming is not a change: the expectation is about entries after the offset."""
    store = await make_store(Retention(max_len=2))
    offsets = await store.append("t", [item(i) for i in range(5)])
    epoch = await store.epoch("t")
    more = await store.append("t", [item(5)], expect=Expected(epoch, offsets[-1]))
    assert deltas(await store.read("t", after=offsets[-1])) == ["d5"]

    # Concurrent conditional appends with the same expectation: exactly one wins,
    # whatever group commit puts into one round trip.
    contenders = [
        store.append("t", [item(100 + n)], expect=Expected(epoch, more[0])) for n in range(8)
    ]
    results = await asyncio.gather(*contenders, return_exceptions=True)
    assert sum(isinstance(r, list) for r in results) == 1
    assert all(isinstance(r, (list, AppendConflict)) for r in results), results
    # Unconditional appends queued together with conditional ones keep working.
    mixed = await asyncio.gather(
        store.append("t", [item(200)]),
        store.append("t", [item(201)], expect=Expected(epoch, more[0])),
        store.append("t", [item(202)]),
        return_exceptions=True,
    )
    assert isinstance(mixed[0], list) and isinstance(mixed[2], list)
    assert isinstance(mixed[1], AppendConflict)


async def test_run_id_is_inherited_from_run_started(make_store: StoreFactory) -> None:
    store = await make_store()
    started = {"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}
    await store.append("t", [EventInput.of(started, "s"), item(1)])
    await store.append("t", [EventInput(content(2), "x", run_id="explicit")])
    assert [e.run_id for e in await store.read("t")] == ["r1", "r1", "explicit"]
    info = await store.info("t")
    assert info is not None and info.run_id == "r1" and info.length == 3


async def test_epoch_is_stable_and_changes_when_recreated(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [item(1)])
    epoch = await store.epoch("t")
    assert epoch
    await store.append("t", [item(2)])
    assert await store.epoch("t") == epoch
    assert await store.delete("t") is True
    assert await store.epoch("t") is None
    await store.append("t", [item(1)])
    assert await store.epoch("t") not in (None, epoch)
    assert deltas(await store.read("t")) == ["d1"]  # the old id was forgotten


async def test_trim_by_length_and_offset_expired(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_len=3))
    offsets = [(await store.append("t", [item(i)]))[0] for i in range(6)]
    assert deltas(await store.read("t", after=offsets[2])) == ["d3", "d4", "d5"]
    with pytest.raises(OffsetExpired) as info:
        await store.read("t")
    assert info.value.first == offsets[3] and info.value.offset == START
    with pytest.raises(OffsetExpired):
        await store.read("t", after=offsets[1])
    thread = await store.info("t")
    assert thread is not None and thread.length == 3 and thread.trimmed == offsets[2]
    # The id of a trimmed event is forgotten: publishing it again appends again.
    assert (await store.append("t", [item(0)]))[0] != offsets[0]


async def test_trim_by_age(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_age=0.3))
    old = await store.append("t", [item(1), item(2)])
    await asyncio.sleep(0.6 * TIMEOUT_SCALE)
    new = await store.append("t", [item(3)])
    assert deltas(await store.read("t", after=old[-1])) == ["d3"]
    with pytest.raises(OffsetExpired):
        await store.read("t")
    assert [e.offset for e in await store.read("t", after=old[-1])] == new


async def test_idle_thread_expires_whole(make_store: StoreFactory) -> None:
    store = await make_store(Retention(ttl=0.3))
    await store.append("t", [item(1)])
    assert await store.epoch("t") is not None
    info = await store.info("t")
    assert info is not None and info.ttl is not None and 0 < info.ttl <= 0.3
    await asyncio.sleep(0.7 * TIMEOUT_SCALE)
    assert await store.epoch("t") is None
    assert await store.read("t") == []
    assert "t" not in await store.threads()


async def test_threads_and_delete(make_store: StoreFactory) -> None:
    store = await make_store()
    for name in ["b", "a", "thread/with:odd{chars}"]:
        await store.append(name, [item(1)])
    assert await store.threads() == ["a", "b", "thread/with:odd{chars}"]
    assert deltas(await store.read("thread/with:odd{chars}")) == ["d1"]
    assert await store.delete("a") is True
    assert await store.threads() == ["b", "thread/with:odd{chars}"]


# Names whose `}` would end a Redis Cluster hash tag early (`}abc`: an empty tag, each
# key in its own slot), and names that look like the escaped form of another.
BRACE_NAMES = ["}", "{", "}{", "{}", "}abc", "a{b}c", "a}b", "%7D", "%7D}%25"]


async def names_round_trip(store: ThreadStore, names: list[str]) -> None:
    """Every operation of the contract on each of *names*, in a store that holds nothing else."""
    for name in names:
        offsets = await store.append(name, [item(1), item(2)])
        assert await store.append(name, [item(2)]) == offsets[1:], name  # its ids hash
        assert deltas(await store.read(name)) == ["d1", "d2"], name
        async with store.subscribe(name, after=offsets[0]) as feed:
            task = asyncio.create_task(collect(feed, 2))
            await asyncio.sleep(0.05)
            conditional = Expected(after=offsets[1], epoch=await store.epoch(name))
            offsets += await store.append(name, [item(3)], expect=conditional)
            got = await asyncio.wait_for(task, 10 * TIMEOUT_SCALE)
        assert deltas(got) == ["d2", "d3"], name
        info = await store.info(name)
        assert info is not None and info.thread == name and info.length == 3, (name, info)
        epoch = info.epoch
        await store.put_checkpoint(name, Checkpoint(offsets[1], epoch, b"\x90", complete=True))
        assert await store.get_checkpoint(name) == Checkpoint(offsets[1], epoch, b"\x90", True)
    assert await store.threads() == sorted(names)  # the listing reads the names back
    for name in names:
        assert await store.delete(name) is True, name
        assert await store.epoch(name) is None and await store.read(name) == [], name
        assert await store.get_checkpoint(name) is None, name
    assert await store.threads() == []


async def test_names_with_braces_are_threads_like_any(make_store: StoreFactory) -> None:
    await names_round_trip(await make_store(), [*BRACE_NAMES, "plain", "tenant/x"])


async def test_bad_arguments(make_store: StoreFactory) -> None:
    store = await make_store()
    with pytest.raises(InvalidOffset, match="expected '<ms>-<seq>'"):
        await store.read("t", after="12")
    with pytest.raises(InvalidEvent, match="thread name"):
        await store.append("", [item(1)])
    for thread in ("a\nb", "a\x7fb", "csi\x9b2J", "nel\x85x"):  # C0, DEL, C1
        with pytest.raises(InvalidEvent, match="control characters"):
            await store.read(thread)
        with pytest.raises(InvalidEvent, match="control characters"):
            await store.append(thread, [item(1)])
    with pytest.raises(InvalidOffset):
        store.subscribe("t", after="nope")


async def test_subscribe_from_start_then_live(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [item(i) for i in range(3)])
    async with store.subscribe("t", after=START) as feed:
        task = asyncio.create_task(collect(feed, 6))
        await asyncio.sleep(0.05)
        await store.append("t", [item(i) for i in range(3, 6)])
        got = await asyncio.wait_for(task, 10 * TIMEOUT_SCALE)
    assert deltas(got) == [f"d{i}" for i in range(6)]
    assert feed.last == got[-1].offset


async def test_subscribe_live_only(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [item(1)])
    async with store.subscribe("t") as feed:
        await store.append("t", [item(2)])
        got = await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)
    assert deltas(got) == ["d2"]


async def test_handoff_under_concurrent_appends(make_store: StoreFactory) -> None:
    """Subscribers that join at random points get exactly the events after their offset."""
    store = await make_store()
    total = 300
    done = asyncio.Event()

    async def publish() -> None:
        for i in range(0, total, 3):
            await store.append("t", [item(i), item(i + 1), item(i + 2)])
            await asyncio.sleep(0)
        done.set()

    async def join_late(delay: float) -> None:
        await asyncio.sleep(delay)
        before = await store.read("t", after=START)
        after = before[-1].offset if before else START
        expected_first = len(before)
        if expected_first == total:
            return  # joined after the end: nothing to check
        async with store.subscribe("t", after=after) as feed:
            got = await asyncio.wait_for(collect(feed, total - expected_first), 20 * TIMEOUT_SCALE)
        assert deltas(got) == [f"d{i}" for i in range(expected_first, total)]

    rng = random.Random(5)
    publisher = asyncio.create_task(publish())
    await asyncio.gather(*(join_late(rng.random() * 0.02) for _ in range(8)))
    await publisher
    assert done.is_set()


async def test_concurrent_publishers_one_order(
    make_store: StoreFactory, request: pytest.FixtureRequest
) -> None:
    store = await make_store()
    # For Redis, several clients (stores) publish at once; all readers see one order.
    stores = [store]
    if isinstance(store, RedisStore):
        stores += [RedisStore(store.url, prefix=store.prefix) for _ in range(3)]
    else:
        stores *= 4

    async def publish(n: int, publisher: ThreadStore) -> None:
        for i in range(50):
            await publisher.append("t", [EventInput.of(content(i, f"p{n}"), f"p{n}-{i}")])

    await asyncio.gather(*(publish(n, s) for n, s in enumerate(stores)))
    first = await store.read("t")
    assert len(first) == 200
    for other in stores:
        assert [e.offset for e in await other.read("t")] == [e.offset for e in first]
    for n in range(4):  # each publisher's events keep their own order
        mine = [msgpack.unpackb(e.data)["delta"] for e in first if e.event_id.startswith(f"p{n}-")]
        assert mine == [f"d{i}" for i in range(50)]
    for extra in stores[1:]:
        if extra is not store:
            await extra.close()


async def test_slow_subscriber_lags_then_resumes(make_store: StoreFactory) -> None:
    store = await make_store(max_pending_bytes=2000)
    async with store.subscribe("t") as feed:
        reading = asyncio.create_task(collect(feed, 1))
        await asyncio.sleep(0.05)  # caught up: the feed is live now
        await store.append("t", [item(0)])
        first = await asyncio.wait_for(reading, 10 * TIMEOUT_SCALE)
        # The consumer stops reading while a burst arrives.
        await store.append("t", [item(i) for i in range(1, 200)])
        await asyncio.sleep(0.2)
        with pytest.raises(SubscriptionLagged) as info:
            await asyncio.wait_for(collect(feed, 199), 10 * TIMEOUT_SCALE)
    assert info.value.last == first[0].offset
    async with store.subscribe("t", after=info.value.last) as again:
        rest = await asyncio.wait_for(collect(again, 199), 10 * TIMEOUT_SCALE)
    assert deltas(rest) == [f"d{i}" for i in range(1, 200)]


async def test_subscription_from_a_trimmed_offset_expires(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_len=2))
    await store.append("t", [item(i) for i in range(5)])
    with pytest.raises(OffsetExpired):
        async with store.subscribe("t", after=START) as feed:
            await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)


async def test_deleting_a_subscribed_thread_resets_its_subscribers(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    await store.append("t", [item(1)])
    async with store.subscribe("t", after=START) as feed:
        assert deltas(await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)) == ["d1"]
        await store.delete("t")
        await store.append("t", [item(2)])
        with pytest.raises(ThreadReset):
            await asyncio.wait_for(collect(feed, 1), 10 * TIMEOUT_SCALE)


def test_store_urls() -> None:
    assert isinstance(open_store(None), MemoryStore)
    assert isinstance(open_store("memory://"), MemoryStore)
    parsed = parse_store_url("redis://h:1/2?max_len=10&ttl=60&prefix=x&socket_keepalive=true")
    assert parsed.redis_url == "redis://h:1/2?socket_keepalive=true"
    assert parsed.prefix == "x"
    assert parsed.retention == Retention(max_len=10, ttl=60)
    assert parsed.op_timeout is None and parsed.outage_grace is None
    assert parse_store_url("rediss://h/0").scheme == "rediss"
    with pytest.raises(ValueError, match="unsupported store URL"):
        open_store("postgres://x")
    with pytest.raises(ValueError, match="not a number"):
        open_store("memory://?max_len=lots")
    with pytest.raises(ValueError, match="unknown store URL option"):
        open_store("memory://?maxlen=3")
    with pytest.raises(ValueError, match="negative"):
        Retention(max_len=-1)
    with pytest.raises(ValueError, match="finite"):
        Retention(max_age=float("nan"))


def test_store_url_options_are_checked() -> None:
    """Only our options and the ones redis-py documents; a typo is refused at
    once, naming the option and the known ones (not at the first connection)."""
    with pytest.raises(ValueError, match=r"'maxlen'.*known options: prefix, max_len") as caught:
        parse_store_url("redis://:pw@h:1/0?maxlen=5")
    assert "pw" not in str(caught.value) and "socket_timeout" in str(caught.value)
    with pytest.raises(ValueError, match="'decode_responses'"):
        parse_store_url("redis://h/0?decode_responses=true")
    with pytest.raises(ValueError, match="needs a rediss:// URL"):
        parse_store_url("redis://h/0?ssl_cert_reqs=none")
    accepted = parse_store_url(
        "rediss://u:p@h:1/0?ssl_cert_reqs=none&client_name=gw&health_check_interval=5"
        "&socket_timeout=2&max_len=3&op_timeout=1.5&outage_grace=0"
    )
    assert accepted.redis_url == (
        "rediss://u:p@h:1/0?ssl_cert_reqs=none&client_name=gw&health_check_interval=5"
        "&socket_timeout=2"
    )
    assert (accepted.op_timeout, accepted.outage_grace) == (1.5, 0.0)
    for bad in ("max_len=-1", "max_age=nan", "ttl=inf", "op_timeout=0", "outage_grace=-2"):
        with pytest.raises(ValueError, match=bad.split("=")[0]):
            parse_store_url(f"redis://h/0?{bad}")
    with pytest.raises(ValueError, match="op_timeout"):
        RedisStore("redis://h/0", op_timeout=float("nan"))
    # RedisStore's own URL is checked too; our options go to open_store().
    with pytest.raises(ValueError, match="open_store"):
        RedisStore("redis://h/0?max_len=5")
    with pytest.raises(ValueError, match="'maxlen'"):
        RedisStore("redis://h/0?maxlen=5")


async def test_store_url_options_reach_the_store(redis_server: RedisServer) -> None:
    store = open_store(f"{redis_server.url}?op_timeout=1.5&outage_grace=0.5&prefix=opts")
    assert isinstance(store, RedisStore)
    assert (store.op_timeout, store.outage_grace, store.prefix) == (1.5, 0.5, "opts")
    await store.ping()
    await store.close()
    default = open_store(redis_server.url)
    assert isinstance(default, RedisStore) and default.op_timeout == 5.0
    await default.close()


def test_redact_url() -> None:
    assert redact_url("redis://u:secret@h:6379/1?db=1&x=y") == "redis://u:***@h:6379/1?db=1&x=y"
    assert redact_url("rediss://:secret@h/0") == "rediss://:***@h/0"
    assert redact_url("redis://h:6379/0?password=secret&client_name=a") == (
        "redis://h:6379/0?password=***&client_name=a"
    )
    assert redact_url("redis://user@h/0") == "redis://user@h/0"  # no password: as it is
    assert redact_url("redis://u:p%40ss@h/0") == "redis://u:***@h/0"
    assert redact_url("memory://") == "memory://"
    assert "secret" not in redact_url("redis://u:secret@[::1/0")  # unparseable: still redacted
    store = RedisStore("redis://u:secret@h:1/0")
    assert store.url == "redis://u:***@h:1/0" and "secret" not in repr(store)


def test_offsets_are_ascii_digits_only() -> None:
    assert offset_key("1-0") == (1, 0)
    assert offset_key("0001-02") == (1, 2)
    for bad in ("\u0661-0", "1-\u0660", "\uff11-0", "1-0\n", " 1-0", "-1-0", "1_0-0", "1-0-0"):
        with pytest.raises(InvalidOffset):
            offset_key(bad)
    with pytest.raises(InvalidOffset):
        offset_key(f"{2**64}-0")


async def test_stores_refuse_non_ascii_offsets(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [item(1)])
    arabic_one = "\u0661-0"
    with pytest.raises(InvalidOffset):
        await store.read("t", after=arabic_one)
    with pytest.raises(InvalidOffset):
        await store.read_available("t", after=arabic_one)
    with pytest.raises(InvalidOffset):
        store.subscribe("t", after=arabic_one)
    epoch = await store.epoch("t")
    with pytest.raises(InvalidOffset):
        await store.append("t", [item(2)], expect=Expected(epoch, arabic_one))


async def test_read_available_never_expires(make_store: StoreFactory) -> None:
    """What is stored after max(after, trimmed), with the epoch and trim mark read
    with it; gap says whether events after `after` were trimmed."""
    store = await make_store(Retention(max_len=3))
    assert await store.read_available("nobody") == Available(None, None, [], False)
    offsets = [(await store.append("t", [item(i)]))[0] for i in range(6)]
    epoch = await store.epoch("t")
    whole = await store.read_available("t")
    assert (whole.epoch, whole.trimmed, whole.gap) == (epoch, offsets[2], True)
    assert deltas(whole.entries) == ["d3", "d4", "d5"]
    from_trim = await store.read_available("t", after=offsets[2])
    assert not from_trim.gap and deltas(from_trim.entries) == ["d3", "d4", "d5"]
    later = await store.read_available("t", after=offsets[3], limit=1)
    assert not later.gap and deltas(later.entries) == ["d4"]
    early = await store.read_available("t", after=offsets[0], limit=2)
    assert early.gap and deltas(early.entries) == ["d3", "d4"]
    head = await store.read_available("t", after=offsets[5])
    assert head == Available(epoch, offsets[2], [], False)


async def test_read_available_keeps_up_with_a_producer_that_trims(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """max_len 20 and a producer appending flat out: where info() then read()
    raced into OffsetExpired, read_available always answers, and its entries
    are a gap-free run that ends at most at the head."""
    import agui_hub.store.redis.store as redis_store

    monkeypatch.setattr(redis_store, "READ_PAGE", 4)  # several pages per call on Redis
    store = await make_store(Retention(max_len=20))
    producing = True

    async def produce() -> None:
        n = 0
        while producing:
            await store.append("t", [item(n, "p")])
            n += 1
            if n % 5 == 0:
                await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    try:
        await asyncio.sleep(0.05)
        gaps = 0
        for _ in range(60):
            got = await store.read_available("t")
            numbers = [int(d[1:]) for d in deltas(got.entries)]
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
            assert got.trimmed is not None
            assert offset_key(got.entries[0].offset) > offset_key(got.trimmed)
            assert got.epoch == await store.epoch("t")
            gaps += got.gap
            await asyncio.sleep(0)
        assert gaps == 60  # the beginning is always trimmed: incomplete, never an error
    finally:
        producing = False
        await producer


async def test_durability_warnings(make_store: StoreFactory) -> None:
    store = await make_store()
    warnings = await store.durability_warnings()
    assert all(isinstance(w, str) and w for w in warnings)
    if isinstance(store, MemoryStore):
        assert warnings == []
    else:  # the test server persists nothing
        assert any("appendonly" in w for w in warnings)


async def test_checkpoints_move_forward_only_within_the_epoch(make_store: StoreFactory) -> None:
    store = await make_store()
    offsets = await store.append("t", [item(i) for i in range(3)])
    epoch = await store.epoch("t")
    assert epoch is not None
    assert await store.get_checkpoint("t") is None
    second = Checkpoint(offsets[1], epoch, b"\x90", complete=True)
    await store.put_checkpoint("t", second)
    assert await store.get_checkpoint("t") == second
    await store.put_checkpoint("t", Checkpoint(offsets[0], epoch, b"\x91\x01"))  # older
    assert await store.get_checkpoint("t") == second
    await store.put_checkpoint("t", Checkpoint(offsets[2], "another-epoch", b"\x90"))
    assert await store.get_checkpoint("t") == second
    third = Checkpoint(offsets[2], epoch, b"\x90", complete=False)
    await store.put_checkpoint("t", third)
    assert await store.get_checkpoint("t") == third
    await store.delete("t")
    assert await store.get_checkpoint("t") is None


async def test_stored_ids_answers_which_events_are_already_stored(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    assert await store.stored_ids("t", ["e1"]) == {}
    offsets = await store.append("t", [item(1), item(2)])
    assert await store.stored_ids("t", ["e2", "e9", "e1"]) == {"e1": offsets[0], "e2": offsets[1]}


# -- retention by bytes --------------------------------------------------------------------


def big(i: int) -> EventInput:
    """An event whose stored payload has the same size for every i < 10000."""
    return EventInput.of(content(i) | {"delta": f"b{i:04d}" + "x" * 200}, f"b{i}")


SIZE = len(encode_event_data(big(0).event))
"""Bytes each big() event counts against max_bytes."""


def bigs(entries: list[Any]) -> list[str]:
    return [delta[:5] for delta in deltas(entries)]


async def test_trim_by_bytes_like_a_length_trim(make_store: StoreFactory) -> None:
    """The oldest events go until the payloads fit; readers past them get
    OffsetExpired, their ids are forgotten, info() counts the bytes kept."""
    store = await make_store(Retention(max_len=0, max_bytes=3 * SIZE + SIZE // 2))
    offsets: list[str] = []
    for i in range(6):
        offsets += await store.append("t", [big(i)])
        info = await store.info("t")
        assert info is not None
        assert (info.length, info.bytes) == (min(i + 1, 3), min(i + 1, 3) * SIZE)
    assert bigs(await store.read("t", after=offsets[2])) == ["b0003", "b0004", "b0005"]
    with pytest.raises(OffsetExpired) as caught:
        await store.read("t")
    assert caught.value.first == offsets[3]
    info = await store.info("t")
    assert info is not None and info.trimmed == offsets[2] and info.first == offsets[3]
    available = await store.read_available("t", after=offsets[0])
    assert available.gap and available.trimmed == offsets[2]
    # The id of a trimmed event is forgotten: publishing it again appends again.
    again = await store.append("t", [big(0)])
    assert offset_key(again[0]) > offset_key(offsets[5])
    assert bigs(await store.read("t", after=offsets[3])) == ["b0004", "b0005", "b0000"]


async def test_an_append_larger_than_max_bytes_keeps_its_own_events(
    make_store: StoreFactory,
) -> None:
    store = await make_store(Retention(max_len=0, max_bytes=2 * SIZE))
    first = await store.append("t", [big(0)])
    batch = await store.append("t", [big(i) for i in range(1, 6)])  # 5 * SIZE on its own
    info = await store.info("t")
    assert info is not None
    assert (info.length, info.bytes, info.trimmed) == (5, 5 * SIZE, first[0])
    assert bigs(await store.read("t", after=first[0])) == [f"b000{i}" for i in range(1, 6)]
    # The next append trims what is over, down to max_bytes.
    last = await store.append("t", [big(6)])
    info = await store.info("t")
    assert info is not None
    assert (info.length, info.bytes, info.trimmed) == (2, 2 * SIZE, batch[3])
    assert [e.offset for e in await store.read("t", after=batch[3])] == [batch[4], last[0]]


async def test_byte_total_follows_length_trims_retries_and_deletes(
    make_store: StoreFactory,
) -> None:
    store = await make_store(Retention(max_len=2, max_bytes=0))
    offsets = await store.append("t", [big(i) for i in range(5)])
    info = await store.info("t")
    assert info is not None and (info.length, info.bytes) == (2, 2 * SIZE)
    # A retry stores nothing and counts nothing.
    assert await store.append("t", [big(4)]) == [offsets[4]]
    info = await store.info("t")
    assert info is not None and info.bytes == 2 * SIZE
    assert await store.delete("t") is True
    await store.append("t", [big(7)])
    info = await store.info("t")
    assert info is not None and (info.length, info.bytes) == (1, SIZE)


async def test_byte_total_follows_age_trims(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_age=0.3))
    await store.append("t", [big(1), big(2)])
    info = await store.info("t")
    assert info is not None and info.bytes == 2 * SIZE
    await asyncio.sleep(0.6 * TIMEOUT_SCALE)
    await store.append("t", [big(3)])
    info = await store.info("t")
    assert info is not None and (info.length, info.bytes) == (1, SIZE)


# -- defaults --------------------------------------------------------------------------------


def test_default_retention() -> None:
    r = Retention()
    assert (r.max_len, r.max_age, r.ttl, r.max_bytes, r.max_tenant_threads) == (
        100_000,
        0.0,
        604_800.0,
        134_217_728,
        0,
    )


async def test_threads_expire_after_seven_days_by_default(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [item(1)])
    info = await store.info("t")
    assert info is not None and info.ttl is not None and 604_700 < info.ttl <= 604_800
    assert info.bytes == len(encode_event_data(content(1)))
    forever = await make_store(Retention(ttl=0))
    await forever.append("t", [item(1)])
    info = await forever.info("t")
    assert info is not None and info.ttl is None


# -- threads per tenant ------------------------------------------------------------------------


def test_tenant_of() -> None:
    assert tenant_of("tenant-42/run-1") == "tenant-42"
    assert tenant_of("a/b/c") == "a"
    assert tenant_of("plain") == ""
    assert tenant_of("/x") == ""


async def test_threads_per_tenant_are_bounded(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_tenant_threads=2))
    a = await store.append("acme/a", [item(1)])
    await store.append("acme/b", [item(1)])
    with pytest.raises(TooManyThreads) as caught:
        await store.append("acme/c", [item(1)])
    message = str(caught.value)
    assert "'acme'" in message and "max_tenant_threads=2" in message and "delete" in message
    assert caught.value.code == "too_many_threads"
    # Nothing was stored.
    assert await store.epoch("acme/c") is None and await store.read("acme/c") == []
    assert await store.threads() == ["acme/a", "acme/b"]
    # Other tenants have their own quota; ids without "/" share the tenant "".
    await store.append("other/a", [item(1)])
    await store.append("x", [item(1)])
    await store.append("y", [item(1)])
    with pytest.raises(TooManyThreads, match="thread ids without '/'"):
        await store.append("z", [item(1)])
    # Existing threads are never refused: a retry, new events, a conditional append.
    assert await store.append("acme/a", [item(1)]) == a
    more = await store.append("acme/a", [item(2)])
    epoch = await store.epoch("acme/a")
    await store.append("acme/a", [item(3)], expect=Expected(epoch, more[0]))
    # A conditional append that would create a thread is refused too.
    with pytest.raises(TooManyThreads):
        await store.append("acme/c", [item(1)], expect=Expected(None, START))
    # A deleted thread frees its slot at once.
    assert await store.delete("acme/b") is True
    await store.append("acme/c", [item(1)])
    assert await store.threads() == ["acme/a", "acme/c", "other/a", "x", "y"]
    with pytest.raises(TooManyThreads):
        await store.append("acme/b", [item(1)])


async def test_concurrent_creations_stop_at_the_quota(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_tenant_threads=3))
    results = await asyncio.gather(
        *(store.append(f"acme/t{n}", [item(n)]) for n in range(10)), return_exceptions=True
    )
    created = [f"acme/t{n}" for n, r in enumerate(results) if isinstance(r, list)]
    assert len(created) == 3
    assert all(isinstance(r, (list, TooManyThreads)) for r in results), results
    assert await store.threads() == sorted(created)


async def test_expired_threads_free_their_tenant_slot(make_store: StoreFactory) -> None:
    store = await make_store(Retention(max_tenant_threads=1, ttl=0.3))
    await store.append("acme/a", [item(1)])
    with pytest.raises(TooManyThreads):
        await store.append("acme/b", [item(1)])
    await asyncio.sleep(0.7 * TIMEOUT_SCALE)
    await store.append("acme/b", [item(1)])
    assert await store.threads() == ["acme/b"]
    # The expired thread is a new one now, and the quota is taken.
    with pytest.raises(TooManyThreads):
        await store.append("acme/a", [item(2)])


def test_store_url_retention_options() -> None:
    parsed = parse_store_url("memory://?max_bytes=1000&max_tenant_threads=5&ttl=0")
    assert parsed.retention == Retention(ttl=0, max_bytes=1000, max_tenant_threads=5)
    assert parse_store_url("memory://").retention == Retention()
    redis = parse_store_url("redis://h/0?max_bytes=0&db=1&max_tenant_threads=7")
    assert redis.redis_url == "redis://h/0?db=1"
    assert (redis.retention.max_bytes, redis.retention.max_tenant_threads) == (0, 7)
    assert redis.retention.ttl == 604_800.0
    store = open_store("memory://?max_tenant_threads=3&max_bytes=64")
    assert (store.retention.max_tenant_threads, store.retention.max_bytes) == (3, 64)
    for bad, message in (
        ("max_bytes=-1", "max_bytes='-1' must be 0 or more"),
        ("max_bytes=1.5", "max_bytes='1.5' must be a whole number"),
        ("max_bytes=inf", "max_bytes='inf' must be a whole number"),
        ("max_tenant_threads=nan", "max_tenant_threads='nan' must be a whole number"),
        ("max_tenant_threads=lots", "max_tenant_threads='lots' is not a number"),
        ("ttl=-5", "ttl='-5' must be 0 or more"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_store_url(f"redis://h/0?{bad}")
    with pytest.raises(ValueError, match="max_bytes must be a whole number"):
        Retention(max_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tenant_threads must be a whole number"):
        Retention(max_tenant_threads=True)
    with pytest.raises(ValueError, match="negative"):
        Retention(max_tenant_threads=-1)
    for option in ("max_bytes=5", "max_tenant_threads=5"):
        with pytest.raises(ValueError, match="open_store"):
            RedisStore(f"redis://h/0?{option}")
