"""Publisher (agui_hub.client.publisher): one API over a store URL or a gateway's ws:// URL.

Each behaviour runs against four backends: ``memory://`` (the publisher's
own in-process store), ``redis://…?prefix=<unique>`` on the session
redis-server, and a ``ws://`` URL of an in-process Gateway over a MemoryStore
and over a RedisStore. What was stored is read back from the store itself,
never only from what the publisher answered.

The fault tests put ``tests/proxy.py`` between the publisher and Redis or the
gateway and lose the reply of the one request that stores the events: the
publisher must return, and the thread must hold every event exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import ag_ui.core as official
import msgpack
import pytest
import redis.asyncio as aioredis
from websockets.frames import Frame, Opcode

from agui_hub.agui import events as models
from agui_hub.client.publisher import Publisher, SequenceCheck
from agui_hub.errors import (
    HubUnreachable,
    InvalidEvent,
    PatchError,
    SequenceError,
    StoreUnavailable,
)
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import Offset, ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore, stream_key
from agui_hub.wire.offsets import START, offset_key

from ..conftest import TIMEOUT_SCALE, RedisServer, free_port
from ..proxy import FaultProxy, WebSocketPayloads
from ..runs import content, end, new_thread, run_finished, run_started, start

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing."""
OFFSET = re.compile(r"\d+-\d+")

T = TypeVar("T")
Event = dict[str, Any]


async def within(awaitable: Awaitable[T], timeout: float = WAIT) -> T:
    """*awaitable*, or TimeoutError after *timeout* seconds."""
    return await asyncio.wait_for(awaitable, timeout)


# -- events ----------------------------------------------------------------------------------


def increasing(offsets: Sequence[Offset]) -> bool:
    keys = [offset_key(o) for o in offsets]
    return all(a < b for a, b in itertools.pairwise(keys))


# -- backends ----------------------------------------------------------------------------------


@dataclass
class Backend:
    """Where a test publishes (``url``) and how it reads back what was stored."""

    kind: str
    url: str
    store: ThreadStore | None
    """A handle on the stored threads; None for memory://, whose store is the publisher's."""
    gateway: Gateway | None = None
    publishers: list[Publisher] = field(default_factory=list)

    def publisher(self, **options: Any) -> Publisher:
        publisher = Publisher(self.url, **options)
        self.publishers.append(publisher)
        return publisher

    def store_of(self, publisher: Publisher) -> ThreadStore:
        """The store that holds what *publisher* published."""
        store = self.store if self.store is not None else publisher._store
        assert store is not None
        return store

    async def stored(self, publisher: Publisher, thread: str) -> list[tuple[Offset, Event, str]]:
        """(offset, event, event id) of every stored event of *thread*, oldest first."""
        entries = await within(self.store_of(publisher).read(thread, after=START))
        return [(e.offset, msgpack.unpackb(e.data, raw=False), e.event_id) for e in entries]

    async def close(self) -> None:
        for publisher in self.publishers:
            await within(publisher.close())
        if self.gateway is not None:
            await within(self.gateway.drain(), 15 * TIMEOUT_SCALE)  # closes its store
        elif self.store is not None:
            await within(self.store.close())


async def start_gateway(store: ThreadStore) -> Gateway:
    gateway = Gateway(GatewayConfig(host="127.0.0.1", port=0, ping_interval=None), store=store)
    await within(gateway.start())
    return gateway


def gateway_url(gateway: Gateway) -> str:
    return f"ws://127.0.0.1:{gateway.config.port}/"


@pytest.fixture(params=["memory", "redis", "gateway-memory", "gateway-redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    kind: str = request.param
    prefix = f"test-publisher-{uuid.uuid4().hex}"
    made: Backend
    if kind == "memory":
        made = Backend(kind, "memory://", None)
    elif kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = Backend(kind, f"{server.url}?prefix={prefix}", RedisStore(server.url, prefix=prefix))
    else:
        store: ThreadStore
        if kind == "gateway-memory":
            store = MemoryStore()
        else:
            server = request.getfixturevalue("redis_server")
            store = RedisStore(server.url, prefix=prefix)
        gateway = await start_gateway(store)
        made = Backend(kind, gateway_url(gateway), store, gateway)
    try:
        yield made
    finally:
        await made.close()


STORE_URLS = ["memory", "redis"]
SHARED = ["redis", "gateway-memory", "gateway-redis"]
"""Backends a second Publisher instance reaches too (memory:// is per instance)."""


# -- publishing ----------------------------------------------------------------------------------


async def test_publish_returns_the_offset_of_the_stored_event(backend: Backend) -> None:
    thread = new_thread()
    async with backend.publisher() as publisher:
        first = await within(publisher.publish(thread, run_started(thread)))
        second = await within(publisher.publish(thread, start("m1")))
        rows = await backend.stored(publisher, thread)

    assert OFFSET.fullmatch(first) and OFFSET.fullmatch(second)
    assert increasing([first, second])
    assert [(offset, event) for offset, event, _ in rows] == [
        (first, run_started(thread)),
        (second, start("m1")),
    ]
    ids = [event_id for *_, event_id in rows]
    assert len(set(ids)) == 2 and all(ids)  # made up by the publisher, one per event


async def test_publish_batch_stores_the_events_in_order(backend: Backend) -> None:
    thread = new_thread()
    events = [run_started(thread), start("m1"), content("m1", "Hel"), content("m1", "lo")]
    events += [end("m1"), run_finished(thread)]
    ids = [f"batch-{i}" for i in range(len(events))]
    async with backend.publisher() as publisher:
        offsets = await within(publisher.publish_batch(thread, events, ids))
        assert await within(publisher.publish_batch(thread, [])) == []
        rows = await backend.stored(publisher, thread)

    assert len(offsets) == 6 and increasing(offsets)
    assert rows == list(zip(offsets, events, ids, strict=True))


async def test_more_than_1000_events_go_as_ordered_batches(backend: Backend) -> None:
    thread = new_thread()
    deltas = [content("m1", f"d{i} ") for i in range(1200)]
    events = [run_started(thread), start("m1"), *deltas, end("m1"), run_finished(thread)]
    async with backend.publisher() as publisher:
        offsets = await within(publisher.publish_batch(thread, events))
        rows = await backend.stored(publisher, thread)

    assert len(offsets) == 1204 and increasing(offsets)
    assert [offset for offset, _, _ in rows] == offsets
    assert [event for _, event, _ in rows] == events
    assert len({event_id for *_, event_id in rows}) == 1204


async def test_a_long_batch_is_stored_batch_by_batch(backend: Backend) -> None:
    """Each batch of 1000 is all or nothing: a bad event in the second keeps the first."""
    thread = new_thread()
    head = [run_started(thread), start("m1"), *(content("m1", f"d{i}") for i in range(998))]
    tail = [content("m1", "ok"), content("m2", "m2 was never started"), end("m1")]
    async with backend.publisher() as publisher:
        with pytest.raises(SequenceError) as caught:
            await within(publisher.publish_batch(thread, [*head, *tail]))
        assert caught.value.rule == "message_not_open"
        assert caught.value.index == 1001  # counted in the caller's events
        rows = await backend.stored(publisher, thread)
        assert [event for _, event, _ in rows] == head
        # The producer resends what was not stored, corrected.
        await within(publisher.publish_batch(thread, [content("m1", "ok"), end("m1")]))
        assert len(await backend.stored(publisher, thread)) == 1002


async def test_dicts_our_models_and_official_ag_ui_events_are_stored_canonically(
    backend: Backend,
) -> None:
    thread = new_thread()
    published: list[Any] = [
        official.RunStartedEvent(thread_id=thread, run_id="r1"),
        models.TextMessageStartEvent(message_id="m1"),
        {"type": "TEXT_MESSAGE_CONTENT", "message_id": "m1", "delta": "Hi"},  # snake_case
        official.TextMessageContentEvent(message_id="m1", delta=" there"),
        official.TextMessageEndEvent(message_id="m1"),
        official.ToolCallStartEvent(
            tool_call_id="tc1", tool_call_name="search", parent_message_id="m1"
        ),
        official.ToolCallArgsEvent(tool_call_id="tc1", delta='{"q": "é"}'),
        official.ToolCallEndEvent(tool_call_id="tc1"),
        official.ToolCallResultEvent(message_id="tr1", tool_call_id="tc1", content="42"),
        official.StateSnapshotEvent(snapshot={"progress": 1, "notes": []}),
    ]
    wire = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hi"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": " there"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "tc1",
            "toolCallName": "search",
            "parentMessageId": "m1",
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": "tc1", "delta": '{"q": "é"}'},
        {"type": "TOOL_CALL_END", "toolCallId": "tc1"},
        {"type": "TOOL_CALL_RESULT", "messageId": "tr1", "toolCallId": "tc1", "content": "42"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"progress": 1, "notes": []}},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]
    async with backend.publisher() as publisher:
        offsets = await within(publisher.publish_batch(thread, published))
        last = official.RunFinishedEvent(thread_id=thread, run_id="r1")
        offsets.append(await within(publisher.publish(thread, last)))
        rows = await backend.stored(publisher, thread)

    assert [(offset, event) for offset, event, _ in rows] == list(zip(offsets, wire, strict=True))


async def test_a_sequence_error_stores_nothing_and_says_why(backend: Backend) -> None:
    thread = new_thread()
    async with backend.publisher() as publisher:
        with pytest.raises(SequenceError) as caught:
            await within(
                publisher.publish_batch(thread, [run_started(thread), start("m1"), content("m2")])
            )
        error = caught.value
        assert error.rule == "message_not_open"
        message = str(error)
        assert "[message_not_open] TEXT_MESSAGE_CONTENT" in message
        assert "'m2'" in message and "not open" in message
        assert await backend.stored(publisher, thread) == []

        # A single event that may not come first.
        with pytest.raises(SequenceError) as first:
            await within(publisher.publish(thread, end("m1")))
        assert first.value.rule == "run_not_started"
        assert await backend.stored(publisher, thread) == []
        assert await within(backend.store_of(publisher).epoch(thread)) is None

        # Nothing of the rejected batch was recorded: the corrected one is accepted.
        fixed = [run_started(thread), start("m1"), content("m1")]
        offsets = await within(publisher.publish_batch(thread, fixed))
        rows = await backend.stored(publisher, thread)
    assert [(offset, event) for offset, event, _ in rows] == list(zip(offsets, fixed, strict=True))


async def test_an_invalid_event_raises_and_stores_nothing(backend: Backend) -> None:
    thread = new_thread()
    missing_delta = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1"}
    async with backend.publisher() as publisher:
        with pytest.raises(InvalidEvent) as caught:
            await within(publisher.publish(thread, missing_delta))
        assert "delta" in str(caught.value)
        with pytest.raises(InvalidEvent):
            await within(
                publisher.publish_batch(thread, [run_started(thread), {"type": "NO_SUCH_EVENT"}])
            )
        with pytest.raises(InvalidEvent):
            await within(publisher.publish(thread, "not an event at all"))
        assert await backend.stored(publisher, thread) == []
        # Still usable.
        offset = await within(publisher.publish(thread, run_started(thread)))
        rows = await backend.stored(publisher, thread)
    assert [(o, e) for o, e, _ in rows] == [(offset, run_started(thread))]


async def test_an_explicit_event_id_makes_a_republish_idempotent(backend: Backend) -> None:
    thread = new_thread()
    async with backend.publisher() as publisher:
        first = await within(publisher.publish(thread, run_started(thread), event_id="agent-7-1"))
        # RUN_STARTED again would break the rules (a run is active): the id
        # answers it from the store before any check.
        again = await within(publisher.publish(thread, run_started(thread), event_id="agent-7-1"))
        assert again == first
        # A batch whose first event is known: same offset, the rest appended.
        offsets = await within(
            publisher.publish_batch(
                thread, [run_started(thread), start("m1")], ["agent-7-1", "agent-7-2"]
            )
        )
        rows = await backend.stored(publisher, thread)
    assert offsets[0] == first and increasing(offsets)
    assert rows == [
        (first, run_started(thread), "agent-7-1"),
        (offsets[1], start("m1"), "agent-7-2"),
    ]


@pytest.mark.parametrize("backend", SHARED, indirect=True)
async def test_a_restarted_agent_republishing_stores_nothing_twice(backend: Backend) -> None:
    thread = new_thread()
    events = [run_started(thread), start("m1"), content("m1", "a")]
    ids = ["job-42-1", "job-42-2", "job-42-3"]
    async with backend.publisher() as before:
        offsets = await within(before.publish_batch(thread, events, ids))
    # The agent restarts: a new Publisher, a new connection, the same ids.
    async with backend.publisher() as after:
        for event, event_id, offset in zip(events, ids, offsets, strict=True):
            assert await within(after.publish(thread, event, event_id=event_id)) == offset
        more = await within(after.publish_batch(thread, [*events, end("m1")], [*ids, "job-42-4"]))
        rows = await backend.stored(after, thread)
    assert more[:3] == offsets
    assert rows == list(zip(more, [*events, end("m1")], [*ids, "job-42-4"], strict=True))


@pytest.mark.parametrize("backend", STORE_URLS, indirect=True)
async def test_sequence_off_stores_what_strict_rejects(backend: Backend) -> None:
    thread, other = new_thread(), new_thread()
    out_of_order = content("m9", "repair")  # no run, no message started
    async with backend.publisher() as strict:
        assert strict.sequence is SequenceCheck.STRICT
        with pytest.raises(SequenceError) as caught:
            await within(strict.publish(other, out_of_order))
        assert caught.value.rule == "run_not_started"
        assert await backend.stored(strict, other) == []
    async with backend.publisher(sequence="off") as relaxed:
        assert relaxed.sequence is SequenceCheck.OFF
        offset = await within(relaxed.publish(thread, out_of_order, event_id="fix-1"))
        assert await within(relaxed.publish(thread, out_of_order, event_id="fix-1")) == offset
        with pytest.raises(InvalidEvent):  # each event is still validated
            await within(relaxed.publish(thread, {"type": "TEXT_MESSAGE_CONTENT"}))
        assert await backend.stored(relaxed, thread) == [(offset, out_of_order, "fix-1")]


async def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError, match="gateway"):
        Publisher("ws://127.0.0.1:1/", sequence="off")
    with pytest.raises(ValueError, match="gateway"):
        Publisher("wss://hub.example/", sequence=SequenceCheck.OFF)
    for url in ("http://127.0.0.1:8765/", "ftp://x/", "postgres://db/0"):
        with pytest.raises(ValueError, match="unsupported store URL"):
            Publisher(url)
    with pytest.raises(ValueError):
        Publisher("memory://", sequence="lenient")
    async with Publisher("memory://") as publisher:
        with pytest.raises(ValueError, match="one id per event"):
            await within(publisher.publish_batch("t", [run_started("t")], ["a", "b"]))
    gateway = Publisher(f"ws://127.0.0.1:{free_port()}/")  # never connected: checked first
    with pytest.raises(ValueError, match="one id per event"):
        await within(gateway.publish_batch("t", [run_started("t"), start("m")], ["a"]))
    await gateway.close()


@pytest.mark.parametrize("step", [1, 7, 100_000])
def test_the_proxy_reads_masked_websocket_frames(step: int) -> None:
    """What the fault tests rely on: markers are found in unmasked payloads, split anyhow."""
    request = b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n"
    payloads = [b"small", b"m" * 300 + b"marker-300", b"l" * 70_000 + b"marker-70000"]
    frames = [Frame(Opcode.BINARY, p).serialize(mask=True) for p in payloads]
    wire = request + b"".join(frames)
    assert b"marker-300" not in wire and b"marker-70000" not in wire  # masked on the wire
    decoder = WebSocketPayloads()
    seen = b"".join(decoder.feed(wire[i : i + step]) for i in range(0, len(wire), step))
    assert seen == request + b"".join(payloads)


# -- faults: the reply is lost, the backend goes away ---------------------------------------------


@pytest.mark.parametrize("shape", ["one event", "batch"])
async def test_redis_reply_of_the_append_lost(redis_server: RedisServer, shape: str) -> None:
    """The append script runs, its reply never arrives: the event is stored once."""
    thread, prefix = new_thread(), f"test-publisher-{uuid.uuid4().hex}"
    direct = aioredis.Redis.from_url(redis_server.url)
    key = stream_key(prefix, thread)
    marker = f"reply-lost-{uuid.uuid4().hex}"  # only the append's payload carries it
    try:
        async with FaultProxy("127.0.0.1", redis_server.port) as proxy:
            url = f"redis://127.0.0.1:{proxy.port}/0?prefix={prefix}"
            async with Publisher(url, retry_for=WAIT) as publisher:
                # Warm up: the script is loaded, the connection pool is open.
                await within(publisher.publish_batch(thread, [run_started(thread), start("m1")]))
                proxy.drop_reply_after(marker.encode())
                if shape == "one event":
                    events = [content("m1", marker)]
                    offsets = [await within(publisher.publish(thread, events[0]))]
                else:
                    events = [content("m1", "before"), content("m1", marker), content("m1", "!")]
                    ids = [f"{prefix}-{i}" for i in range(3)]
                    offsets = await within(publisher.publish_batch(thread, events, ids))
                assert proxy.dropped == 1 and proxy.armed == 0
                assert proxy.accepted >= 2  # the client had to reconnect
                # The connection goes on working.
                offsets.append(await within(publisher.publish(thread, content("m1", "after"))))

        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await within(direct.xrange(key)))
        stored = [(o.decode(), msgpack.unpackb(f[b"event"], raw=False)) for o, f in entries]
        assert [e for _, e in stored] == [
            run_started(thread),
            start("m1"),
            *events,
            content("m1", "after"),
        ]
        assert [o for o, _ in stored[2:]] == offsets
        assert await within(direct.xlen(key)) == 3 + len(events)
        assert sum(marker.encode() in f[b"event"] for _, f in entries) == 1
        assert len({f[b"id"] for _, f in entries}) == len(entries)
    finally:
        await direct.aclose()


async def gateway_over(kind: str, request: pytest.FixtureRequest) -> Gateway:
    if kind == "memory":
        return await start_gateway(MemoryStore())
    server: RedisServer = request.getfixturevalue("redis_server")
    return await start_gateway(RedisStore(server.url, prefix=f"test-pub-{uuid.uuid4().hex}"))


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_gateway_reply_of_the_publish_lost(
    kind: str, encoding: str, request: pytest.FixtureRequest
) -> None:
    """The gateway stores the batch, its "published" frame is lost: retried, stored once."""
    thread = new_thread()
    gateway = await gateway_over(kind, request)
    try:
        async with FaultProxy("127.0.0.1", gateway.config.port, websocket=True) as proxy:
            url = f"ws://127.0.0.1:{proxy.port}/"
            async with Publisher(url, encoding=encoding, retry_for=WAIT) as publisher:
                first = await within(publisher.publish(thread, run_started(thread)))
                ids = [f"evt-{uuid.uuid4().hex}" for _ in range(3)]
                proxy.drop_reply_after(ids[1].encode())
                events = [start("m1"), content("m1", "once"), content("m1", "only")]
                offsets = await within(publisher.publish_batch(thread, events, ids))
                await proxy.wait_dropped(1, timeout=WAIT)
                assert proxy.dropped == 1 and proxy.armed == 0
                assert proxy.accepted == 2  # one reconnection
                tail = await within(
                    publisher.publish_batch(thread, [end("m1"), run_finished(thread)])
                )

        entries = await within(gateway.store.read(thread))
        assert [e.offset for e in entries] == [first, *offsets, *tail]
        assert [msgpack.unpackb(e.data, raw=False) for e in entries] == [
            run_started(thread),
            *events,
            end("m1"),
            run_finished(thread),
        ]
        assert [e.event_id for e in entries[1:4]] == ids
    finally:
        await within(gateway.drain(), 15 * TIMEOUT_SCALE)


RETRY_FOR = 1.0


@pytest.mark.parametrize("was_up", [True, False], ids=["went-down", "never-up"])
async def test_redis_down_for_good_raises_after_retry_for(
    own_redis: RedisServer, was_up: bool
) -> None:
    thread = new_thread()
    port = own_redis.port if was_up else free_port()
    async with Publisher(f"redis://127.0.0.1:{port}/0", retry_for=RETRY_FOR) as publisher:
        if was_up:
            await within(publisher.publish(thread, run_started(thread)))
            own_redis.stop()
        began = time.monotonic()
        with pytest.raises(StoreUnavailable) as caught:
            await within(publisher.publish(thread, start("m1")))
        elapsed = time.monotonic() - began
    assert str(port) in str(caught.value)
    assert 0.5 * RETRY_FOR <= elapsed <= RETRY_FOR + 3 * TIMEOUT_SCALE


async def test_gateway_down_for_good_raises_after_retry_for() -> None:
    thread = new_thread()
    gateway = await start_gateway(MemoryStore())
    try:
        proxy = await FaultProxy("127.0.0.1", gateway.config.port, websocket=True).start()
        async with Publisher(f"ws://127.0.0.1:{proxy.port}/", retry_for=RETRY_FOR) as publisher:
            await within(publisher.publish(thread, run_started(thread)))
            await proxy.close()  # the port refuses from now on
            began = time.monotonic()
            with pytest.raises(HubUnreachable):
                await within(publisher.publish(thread, start("m1")))
            elapsed = time.monotonic() - began
        assert 0.5 * RETRY_FOR <= elapsed <= RETRY_FOR + 3 * TIMEOUT_SCALE
        assert [e.type for e in await within(gateway.store.read(thread))] == ["RUN_STARTED"]
    finally:
        await within(gateway.drain(), 15 * TIMEOUT_SCALE)


@dataclass
class Proxied:
    """A backend behind a FaultProxy: the URL to publish to and the store behind."""

    url: str
    proxy: FaultProxy
    store: ThreadStore


@pytest.fixture(params=["redis", "gateway"])
async def proxied(request: pytest.FixtureRequest) -> AsyncIterator[Proxied]:
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-publisher-{uuid.uuid4().hex}"
    if request.param == "redis":
        store = RedisStore(server.url, prefix=prefix)
        async with FaultProxy("127.0.0.1", server.port) as proxy:
            yield Proxied(f"redis://127.0.0.1:{proxy.port}/0?prefix={prefix}", proxy, store)
        await within(store.close())
    else:
        gateway = await start_gateway(MemoryStore())
        async with FaultProxy("127.0.0.1", gateway.config.port, websocket=True) as proxy:
            yield Proxied(f"ws://127.0.0.1:{proxy.port}/", proxy, gateway.store)
        await within(gateway.drain(), 15 * TIMEOUT_SCALE)


async def test_a_short_outage_is_ridden_out(proxied: Proxied) -> None:
    thread = new_thread()
    async with Publisher(proxied.url, retry_for=WAIT) as publisher:
        first = await within(publisher.publish(thread, run_started(thread)))
        proxied.proxy.refusing = True
        proxied.proxy.cut_all()
        pending = asyncio.create_task(publisher.publish(thread, start("m1")))
        await asyncio.sleep(0.5)
        assert not pending.done()
        assert proxied.proxy.refused >= 1
        proxied.proxy.refusing = False
        second = await within(pending)
    entries = await within(proxied.store.read(thread))
    assert [(e.offset, e.type) for e in entries] == [
        (first, "RUN_STARTED"),
        (second, "TEXT_MESSAGE_START"),
    ]


@pytest.mark.parametrize(
    "proxied",
    [
        "redis",
        "gateway",
    ],
    indirect=True,
)
async def test_the_first_publish_waits_for_a_backend_that_comes_up(proxied: Proxied) -> None:
    """retry_for covers a backend that is not up yet when the agent starts."""
    thread = new_thread()
    proxied.proxy.refusing = True
    publisher = Publisher(proxied.url, retry_for=WAIT)
    try:
        pending = asyncio.create_task(publisher.publish(thread, run_started(thread)))
        await asyncio.sleep(0.5)
        proxied.proxy.refusing = False
        offset = await within(pending)
    finally:
        await within(publisher.close())
    assert [e.offset for e in await within(proxied.store.read(thread))] == [offset]


async def test_a_gateway_publisher_recovers_after_a_long_outage() -> None:
    thread = new_thread()
    gateway = await start_gateway(MemoryStore())
    try:
        async with (
            FaultProxy("127.0.0.1", gateway.config.port, websocket=True) as proxy,
            Publisher(f"ws://127.0.0.1:{proxy.port}/", retry_for=RETRY_FOR) as publisher,
        ):
            await within(publisher.publish(thread, run_started(thread)))
            proxy.refusing = True
            proxy.cut_all()
            await asyncio.sleep(RETRY_FOR + 0.5)  # longer than retry_for, no publish meanwhile
            proxy.refusing = False
            # The gateway is reachable again: a store URL publisher would just work.
            offset = await within(publisher.publish(thread, start("m1")))
        assert (await within(gateway.store.read(thread)))[-1].offset == offset
    finally:
        await within(gateway.drain(), 15 * TIMEOUT_SCALE)


async def test_a_delta_that_does_not_apply_is_stored_unless_strict(backend: Backend) -> None:
    """The official client's way by default (stored, it changes nothing), on
    every backend; a store URL's strict_patches refuses it."""
    thread = new_thread()
    snapshot = {"type": "STATE_SNAPSHOT", "snapshot": {"n": 1}}
    bad = {"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/missing"}]}
    async with backend.publisher() as publisher:
        await within(publisher.publish_batch(thread, [run_started(thread), snapshot]))
        await within(publisher.publish(thread, bad))
        rows = await backend.stored(publisher, thread)
    assert [event for _, event, _ in rows][-1] == bad
    if backend.kind in STORE_URLS:
        other = new_thread()
        async with backend.publisher(strict_patches=True) as strict:
            await within(strict.publish_batch(other, [run_started(other), snapshot]))
            with pytest.raises(PatchError) as refused:
                await within(strict.publish(other, bad))
            assert refused.value.index == 0
