"""Presence (who is watching a thread): the store contract on both stores, and what
the Redis store adds (keys in the thread's slot, one round trip per call, two
gateways on one Redis, errors), on real redis-server processes."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Histogram
from redis.asyncio.connection import AbstractConnection
from redis.crc import key_slot

from agui_hub.errors import InvalidEvent, StoreError, StoreUnavailable
from agui_hub.gateway.metrics import TimedStore
from agui_hub.store.contract import (
    EventInput,
    PresenceChange,
    PresenceEntry,
    PresencePage,
    ThreadStore,
)
from agui_hub.store.redis.keys import presence_keys, stream_key
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from .conftest import StoreFactory
from .test_store import BRACE_NAMES

pytestmark = pytest.mark.timeout(60)

TTL = 30.0
"""A ttl no test outlives: entries put with it stay until removed."""


def entry(
    connection: str, joined: int = 1_764_700_000_000, subject: str = "alice", **client: Any
) -> PresenceEntry:
    return PresenceEntry(connection, subject, joined, client or None)


async def page_of(store: ThreadStore, thread: str, limit: int = 100) -> PresencePage:
    (page,) = await store.presence([thread], limit)
    assert page is not None
    return page


async def connections(store: ThreadStore, thread: str) -> list[str]:
    return [e.connection for e in (await page_of(store, thread)).entries]


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Poll *check* until it holds; the seconds it took (fails after *timeout*)."""
    started = time.monotonic()
    deadline = started + timeout * TIMEOUT_SCALE
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


# -- the contract, on both stores ----------------------------------------------------------


async def test_entries_are_added_refreshed_and_removed(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.presence_update([PresenceChange("t", put=[entry("g1-1"), entry("g1-2")])], TTL)
    assert await connections(store, "t") == ["g1-1", "g1-2"]
    # A refresh replaces the stored values (the same connection: still one entry).
    await store.presence_update(
        [PresenceChange("t", put=[entry("g1-1", subject="bob", name="web")])], TTL
    )
    page = await page_of(store, "t")
    assert page.count == 2
    assert page.entries[0] == entry("g1-1", subject="bob", name="web")
    # gone goes first, then put: an id in both stays; unknown ids are ignored.
    await store.presence_update(
        [PresenceChange("t", put=[entry("g1-3")], gone=["g1-1", "g1-3", "nobody"])], TTL
    )
    assert await connections(store, "t") == ["g1-2", "g1-3"]
    await store.presence_update([PresenceChange("t", gone=["g1-2", "g1-3"])], TTL)
    assert await page_of(store, "t") == PresencePage(0, [], 0)
    # Nothing to do is no error.
    await store.presence_update([], TTL)
    await store.presence_update([PresenceChange("t")], TTL)
    assert await store.presence([], 10) == []


async def test_a_thread_nobody_watches_is_empty_with_version_0(make_store: StoreFactory) -> None:
    store = await make_store()
    assert await store.presence(["never", "seen"], 5) == [PresencePage(0, [], 0)] * 2
    assert await store.presence(["never"], 5, [0]) == [None]


async def test_count_and_order_by_joined_then_connection_with_a_limit(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    # Ties by connection id as code points, which is also the order of their UTF-8
    # bytes (Redis's): "z" before "ä".
    joined = {"c": 100, "a": 100, "z": 50, "b2": 200, "b": 100, "ä": 100}
    await store.presence_update(
        [PresenceChange("t", put=[entry(c, j) for c, j in joined.items()])], TTL
    )
    expected = sorted(joined, key=lambda c: (joined[c], c))
    assert expected == ["z", "a", "b", "c", "ä", "b2"]
    page = await page_of(store, "t", limit=3)
    assert page.count == 6
    assert [e.connection for e in page.entries] == expected[:3]
    assert [e.joined for e in page.entries] == [50, 100, 100]
    assert await connections(store, "t") == expected
    page = await page_of(store, "t", limit=1)
    assert (page.count, [e.connection for e in page.entries]) == (6, ["z"])


async def test_versions_change_on_join_leave_and_new_values_not_on_refresh(
    make_store: StoreFactory,
) -> None:
    store = await make_store()

    async def version() -> int:
        return (await page_of(store, "t")).version

    seen = [await version()]
    assert seen == [0]
    await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
    seen.append(await version())
    # A refresh keeps the version; the same entry with other values is a change.
    await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
    assert await version() == seen[-1]
    await store.presence_update([PresenceChange("t", put=[entry("a", name="web")])], TTL)
    seen.append(await version())
    await store.presence_update([PresenceChange("t", put=[entry("a", name="web")])], TTL)
    assert await version() == seen[-1]
    # So does removing what is not there.
    await store.presence_update([PresenceChange("t", gone=["nobody"])], TTL)
    assert await version() == seen[-1]
    await store.presence_update([PresenceChange("t", put=[entry("b")])], TTL)
    seen.append(await version())
    await store.presence_update([PresenceChange("t", gone=["a"])], TTL)
    seen.append(await version())
    # A join and a leave in one change is one change of the version.
    await store.presence_update([PresenceChange("t", put=[entry("c")], gone=["b"])], TTL)
    seen.append(await version())
    await store.presence_update([PresenceChange("t", gone=["c"])], TTL)
    assert await version() == 0
    # Joined again: a version the thread never had, so no reader's known one matches.
    await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
    seen.append(await version())
    assert len(set(seen)) == len(seen), seen


async def test_known_versions_answer_none_for_unchanged_threads(make_store: StoreFactory) -> None:
    store = await make_store()
    threads = ["t1", "t2", "t3", "empty"]
    await store.presence_update(
        [PresenceChange(t, put=[entry(f"{t}-a")]) for t in threads[:3]], TTL
    )
    pages = await store.presence(threads, 10)
    known = [p.version if p is not None else None for p in pages]
    assert await store.presence(threads, 10, known) == [None, None, None, None]
    # A refresh changes nothing a reader sees; a join and a leave do.
    await store.presence_update(
        [
            PresenceChange("t1", put=[entry("t1-a")]),
            PresenceChange("t2", put=[entry("t2-b")]),
            PresenceChange("t3", gone=["t3-a"]),
        ],
        TTL,
    )
    again = await store.presence(threads, 10, known)
    assert again[0] is None and again[3] is None
    assert again[1] is not None and [e.connection for e in again[1].entries] == ["t2-a", "t2-b"]
    assert again[2] == PresencePage(0, [], 0)
    # None in known: that thread is answered whatever its version.
    mixed = await store.presence(threads, 10, [None, known[1], None, 0])
    assert mixed[0] == pages[0] and mixed[1] is not None and mixed[3] is None


async def test_entries_expire_after_their_ttl(make_store: StoreFactory) -> None:
    store = await make_store()
    started = time.monotonic()
    await store.presence_update(
        [PresenceChange("t", put=[entry("short"), entry("refreshed")])], 0.3
    )
    await store.presence_update([PresenceChange("t", put=[entry("long")])], TTL)
    before = await page_of(store, "t")
    assert before.count == 3
    # A refresh within the ttl keeps an entry past its first ttl.
    await asyncio.sleep(0.2)
    await store.presence_update([PresenceChange("t", put=[entry("refreshed")])], 0.3)

    async def short_gone() -> bool:
        return "short" not in await connections(store, "t")

    await wait_until(short_gone, 3, "the entry with a 0.3 s ttl to expire")
    assert time.monotonic() - started >= 0.3
    after = await page_of(store, "t")
    assert [e.connection for e in after.entries] == ["long", "refreshed"]
    assert after.version != before.version  # expiry is a change
    # Expiry also shows to a reader that knows the version from before it.
    (seen,) = await store.presence(["t"], 10, [before.version])
    assert seen is not None and seen.count == 2

    async def refreshed_gone() -> bool:
        return await connections(store, "t") == ["long"]

    await wait_until(refreshed_gone, 3, "the refreshed entry to expire")


async def test_expired_entries_go_before_an_update_counts_its_changes(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    await store.presence_update([PresenceChange("t", put=[entry("a")])], 0.1)
    await asyncio.sleep(0.25)
    # Put again after it expired: a join again (a new version), not a refresh.
    (before,) = await store.presence(["t"], 10, [None])
    await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
    page = await page_of(store, "t")
    assert page.count == 1
    assert before is not None and before.count == 0
    assert page.version not in (0, before.version)


async def test_many_threads_in_one_call(make_store: StoreFactory) -> None:
    store = await make_store()
    threads = [f"room-{i}" for i in range(200)]
    await store.presence_update(
        [PresenceChange(t, put=[entry(f"{t}-b", 2), entry(f"{t}-a", 1)]) for t in threads], TTL
    )
    pages = await store.presence(threads, 1)
    for thread, page in zip(threads, pages, strict=True):
        assert page is not None and page.count == 2
        assert [e.connection for e in page.entries] == [f"{thread}-a"]
    known = [p.version if p is not None else None for p in pages]
    await store.presence_update([PresenceChange(t, gone=[f"{t}-a"]) for t in threads[::2]], TTL)
    again = await store.presence(threads, 10, known)
    assert [p is None for p in again] == [i % 2 == 1 for i in range(200)]


async def test_client_info_round_trips(make_store: StoreFactory) -> None:
    store = await make_store()
    client = {
        "name": "web",
        "device": "laptöp",
        "tabs": 3,
        "zoom": 1.25,
        "big": 2**53,
        "negative": -7,
        "mobile": False,
        "beta": True,
        "team": None,
        "": "empty key",
    }
    await store.presence_update(
        [
            PresenceChange(
                "t",
                put=[
                    PresenceEntry("c1", "alice", 1_764_700_000_123, client),
                    PresenceEntry("c2", "anonymous", 1_764_700_000_124),
                    PresenceEntry("c3", "ünï 🚀", 1_764_700_000_125, {}),
                ],
            )
        ],
        TTL,
    )
    client["name"] = "changed after the call"  # the store kept its own copy
    first, second, third = (await page_of(store, "t")).entries
    assert first == PresenceEntry("c1", "alice", 1_764_700_000_123, {**client, "name": "web"})
    assert type(first.client["tabs"]) is int and type(first.client["zoom"]) is float
    assert second.client is None and third.client == {}
    assert third.subject == "ünï 🚀"
    assert first.as_json() == {
        "connection": "c1",
        "subject": "alice",
        "joined": 1_764_700_000_123,
        "client": first.client,
    }
    assert second.as_json() == {
        "connection": "c2",
        "subject": "anonymous",
        "joined": 1_764_700_000_124,
    }
    assert "client" in third.as_json()


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, True])
async def test_a_bad_ttl_is_refused(make_store: StoreFactory, ttl: float) -> None:
    store = await make_store()
    with pytest.raises(ValueError, match="presence ttl"):
        await store.presence_update([PresenceChange("t", put=[entry("a")])], ttl)
    assert await page_of(store, "t") == PresencePage(0, [], 0)


@pytest.mark.parametrize("limit", [0, -5, True, 1.5])
async def test_a_bad_limit_is_refused(make_store: StoreFactory, limit: Any) -> None:
    store = await make_store()
    with pytest.raises(ValueError, match="presence limit"):
        await store.presence(["t"], limit)


async def test_known_versions_must_match_the_threads(make_store: StoreFactory) -> None:
    store = await make_store()
    with pytest.raises(ValueError, match="one per thread"):
        await store.presence(["a", "b"], 10, [0])


async def test_a_bad_thread_name_is_refused(make_store: StoreFactory) -> None:
    store = await make_store()
    with pytest.raises(InvalidEvent):
        await store.presence_update([PresenceChange(" t", put=[entry("a")])], TTL)
    with pytest.raises(InvalidEvent):
        await store.presence(["ok", ""], 10)


async def test_presence_outlives_deleting_its_thread(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [EventInput.of({"type": "RUN_STARTED", "threadId": "t", "runId": "r"})])
    await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
    assert await store.delete("t")
    # The viewers are still there.
    assert await connections(store, "t") == ["a"]
    assert await store.threads() == []


async def test_names_with_braces_have_their_own_presence(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.presence_update(
        [PresenceChange(name, put=[entry(f"c{i}")]) for i, name in enumerate(BRACE_NAMES)], TTL
    )
    pages = await store.presence(BRACE_NAMES, 10)
    assert [[e.connection for e in p.entries] for p in pages if p is not None] == [
        [f"c{i}"] for i in range(len(BRACE_NAMES))
    ]


async def test_timed_store_times_presence_calls(make_store: StoreFactory) -> None:
    registry = CollectorRegistry()
    latency = Histogram("latency", "", ["operation"], registry=registry)
    errors = Counter("errors", "", ["operation"], registry=registry)
    store = TimedStore(await make_store(), latency, errors)
    await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
    assert await connections(store, "t") == ["a"]
    for operation in ("presence_update", "presence"):
        count = registry.get_sample_value("latency_count", {"operation": operation})
        assert count == 1, operation
    with pytest.raises(ValueError):
        await store.presence(["t"], 0)


# -- Redis: keys, round trips, gateways sharing it, failures ---------------------------------


def redis_store(server: RedisServer, prefix: str | None = None, **options: Any) -> RedisStore:
    return RedisStore(server.url, prefix=prefix or f"p{uuid.uuid4().hex[:10]}", **options)


def test_presence_keys_are_in_the_thread_slot() -> None:
    for name in ["t", "a{b}c", "}x", "50%}", *BRACE_NAMES]:
        keys = presence_keys("agui", name)
        assert len(set(keys)) == 4
        assert {key_slot(k.encode()) for k in keys} == {key_slot(stream_key("agui", name).encode())}
    assert presence_keys("agui", "t") == [
        "agui:{t}:presence:exp",
        "agui:{t}:presence:joined",
        "agui:{t}:presence:who",
        "agui:{t}:presence:v",
    ]


async def test_two_gateways_on_one_redis_see_each_others_entries(
    redis_server: RedisServer,
) -> None:
    prefix = f"p{uuid.uuid4().hex[:10]}"
    one, two = redis_store(redis_server, prefix), redis_store(redis_server, prefix)
    try:
        await one.presence_update([PresenceChange("t", put=[entry("g1-1", 20)])], TTL)
        await two.presence_update([PresenceChange("t", put=[entry("g2-1", 10, "bob")])], TTL)
        seen_by_one, seen_by_two = await page_of(one, "t"), await page_of(two, "t")
        assert seen_by_one == seen_by_two
        assert [e.connection for e in seen_by_one.entries] == ["g2-1", "g1-1"]
        # A refresh by one gateway is no change for the other.
        await one.presence_update([PresenceChange("t", put=[entry("g1-1", 20)])], TTL)
        assert await two.presence(["t"], 10, [seen_by_two.version]) == [None]
        await two.presence_update([PresenceChange("t", gone=["g2-1"])], TTL)
        (changed,) = await one.presence(["t"], 10, [seen_by_one.version])
        assert changed is not None and [e.connection for e in changed.entries] == ["g1-1"]
        # Another prefix is another hub.
        assert await page_of(redis_store(redis_server), "t") == PresencePage(0, [], 0)
    finally:
        await one.close()
        await two.close()


async def test_a_dead_gateways_keys_expire_with_its_entries(redis_server: RedisServer) -> None:
    store = redis_store(redis_server)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        keys = presence_keys(store.prefix, "t")
        await store.presence_update([PresenceChange("t", put=[entry("short")])], 0.5)
        await store.presence_update([PresenceChange("t", put=[entry("long")])], 2)
        # The keys live as long as the longest-lived entry, not the last ttl given.
        await store.presence_update([PresenceChange("t", put=[entry("short")])], 0.5)
        for key in keys:
            assert 1000 < await admin.pttl(key) <= 2000, key
        # Nobody calls any more (the gateway died): Redis removes everything.

        async def gone() -> bool:
            return not await admin.exists(*keys)

        await wait_until(gone, 5, "the presence keys to expire")
        # Leaving the last entry removes the keys at once.
        await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
        await store.presence_update([PresenceChange("t", gone=["a"])], TTL)
        assert not await admin.exists(*keys)
    finally:
        await admin.aclose()
        await store.close()


async def test_each_call_is_one_round_trip_on_the_stores_pool(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 threads: one script call each, all sent in one write on a pooled connection."""
    store = redis_store(own_redis)
    admin = aioredis.Redis.from_url(own_redis.url)
    sends = 0
    original = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        nonlocal sends
        sends += 1
        await original(self, *args, **kwargs)

    async def stats() -> tuple[int, int]:
        commands = await admin.info("commandstats")
        connections = await admin.info("stats")
        return (
            int(commands.get("cmdstat_evalsha", {}).get("calls", 0)),
            int(connections["total_connections_received"]),
        )

    threads = [f"room-{i}" for i in range(200)]
    try:
        # Warm: the pool's connection made, the scripts loaded.
        await store.presence_update([PresenceChange("warm", put=[entry("w")])], TTL)
        await store.presence(["warm"], 1)
        monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
        evalsha, connected = await stats()
        sends = 0
        await store.presence_update(
            [PresenceChange(t, put=[entry(f"{t}-a")]) for t in threads], TTL
        )
        assert sends == 1
        sends = 0
        pages = await store.presence(threads, 10)
        assert sends == 1
        assert all(p is not None and p.count == 1 for p in pages)
        sends = 0
        assert await store.presence(threads, 10, [p.version for p in pages if p]) == [None] * 200
        assert sends == 1
        now_evalsha, now_connected = await stats()
        # One script call per thread, no connection opened for them (the admin's
        # INFO goes on its own connection, made before).
        assert now_evalsha - evalsha == 3 * 200
        assert now_connected == connected
    finally:
        monkeypatch.undo()
        await admin.aclose()
        await store.close()


async def test_scripts_lost_by_redis_are_loaded_again(redis_server: RedisServer) -> None:
    store = redis_store(redis_server)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
        await admin.script_flush()
        await store.presence_update(
            [PresenceChange("t", put=[entry("b")]), PresenceChange("u", put=[entry("c")])], TTL
        )
        await admin.script_flush()
        assert [p.count for p in await store.presence(["t", "u"], 10) if p] == [2, 1]
    finally:
        await admin.aclose()
        await store.close()


async def test_a_broken_record_is_skipped_and_a_wrong_key_is_a_store_error(
    redis_server: RedisServer,
) -> None:
    store = redis_store(redis_server)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        await store.presence_update([PresenceChange("t", put=[entry("a"), entry("b")])], TTL)
        _, _, who, _ = presence_keys(store.prefix, "t")
        await admin.hset(who, "a", b"\xc1 not msgpack")
        page = await page_of(store, "t")
        assert page.count == 2 and [e.connection for e in page.entries] == ["b"]
        # A key of another type: that thread's call fails, as a store error.
        exp, *_ = presence_keys(store.prefix, "bad")
        await admin.set(exp, "not a zset")
        with pytest.raises(StoreError, match="'bad'") as raised:
            await store.presence(["t", "bad"], 10)
        assert not isinstance(raised.value, StoreUnavailable)
        with pytest.raises(StoreError, match="'bad'"):
            await store.presence_update([PresenceChange("bad", put=[entry("a")])], TTL)
        # A client msgpack cannot store is refused before anything is sent.
        with pytest.raises(ValueError):
            await store.presence_update([PresenceChange("t", put=[entry("c", bad=object())])], TTL)
        assert (await page_of(store, "t")).count == 2
    finally:
        await admin.aclose()
        await store.close()


async def test_an_unavailable_redis_is_store_unavailable(own_redis: RedisServer) -> None:
    store = redis_store(own_redis, op_timeout=1.0)
    try:
        await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
        own_redis.stop()
        with pytest.raises(StoreUnavailable):
            await store.presence_update([PresenceChange("t", put=[entry("a")])], TTL)
        with pytest.raises(StoreUnavailable):
            await store.presence(["t"], 10)
        own_redis.start()
        # Back (no persistence: the entries went with the restart).
        await store.presence_update([PresenceChange("t", put=[entry("b")])], TTL)
        assert await connections(store, "t") == ["b"]
    finally:
        await store.close()


async def test_the_stored_layout_and_redis_clock(redis_server: RedisServer) -> None:
    """What docs/store.md says is stored: expiry on Redis's clock (a gateway whose
    clock is off by a day expires nothing early), ``joined`` as given, msgpack
    [subject, joined, client]."""
    store = redis_store(redis_server)
    admin = aioredis.Redis.from_url(redis_server.url)
    try:
        day_ago = int(time.time() * 1000) - 86_400_000
        await store.presence_update(
            [PresenceChange("t", put=[entry("c1", day_ago, name="web"), entry("c2", 5)])], 10
        )
        exp, joined, who, v = presence_keys(store.prefix, "t")
        seconds, micros = await admin.time()
        redis_ms = seconds * 1000 + micros // 1000
        expires = await admin.zscore(exp, "c1")
        assert expires is not None and 0 <= redis_ms + 10_000 - expires < 1000
        assert await admin.zscore(joined, "c1") == day_ago
        assert msgpack.unpackb(await admin.hget(who, "c1")) == ["alice", day_ago, {"name": "web"}]
        assert msgpack.unpackb(await admin.hget(who, "c2")) == ["alice", 5, None]
        assert int(await admin.get(v)) == (await page_of(store, "t")).version
    finally:
        await admin.aclose()
        await store.close()
