"""A thread's channel survives what one entry, a reload, a burst or a race can do (issue 10).

Every test runs an in-process :class:`Gateway` on 127.0.0.1 with real
WebSocket clients (the helpers of ``tests/gateway/test_server.py``), over the memory
store and a real redis-server where the store matters. Poisoned entries are
written straight into the store, as a plain-XADD producer (or a bug) would:
the gateway's own publish checks never see them. What is asserted is what a
client sees: the frames, their order, and the close codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from agui_hub.agui.reducer import fold
from agui_hub.client.publisher import Publisher
from agui_hub.errors import AguiHubError, OffsetExpired, StoreUnavailable
from agui_hub.gateway.fanout import channels as hub_module
from agui_hub.gateway.fanout import checkpoints as checkpoints_module
from agui_hub.store import memory as memory_store_module
from agui_hub.store.contract import Checkpoint, EventInput, FeedSubscription, Retention, ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore, notify_channel, stream_key
from agui_hub.wire.offsets import START, offset_key

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..runs import new_thread
from . import test_server
from .test_server import JSON, MSGPACK, WAIT, Client, Harness, events_of, memory_store, url

pytestmark = pytest.mark.timeout(60)

SHORT = 5 * TIMEOUT_SCALE
"""Longest wait for something a healthy gateway sends at once."""

Event = dict[str, Any]
Frame = dict[str, Any]


# The fixtures of tests/gateway/test_server.py (harness: memory and Redis; mem: memory).
harness = test_server.harness
mem = test_server.mem
store_factory = test_server.store_factory


# -- events -------------------------------------------------------------------------------


def custom(name: str, value: Any = None) -> Event:
    return {"type": "CUSTOM", "name": name, "value": value}


def content(message: str, delta: str) -> Event:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": delta}


def opening(thread: str, run: str = "r1", message: str = "m1") -> list[Event]:
    """A run started and a message open: what producer events continue."""
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
    ]


def nest(levels: int) -> dict[str, Any]:
    """``{"a": {"a": ... {}}}``: *levels* dicts inside one another, around an empty one."""
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


DEEP = 250
DEEP_PATH = "/a" * DEEP
"""The path of the innermost (empty) dict of ``nest(DEEP)``."""


def deep_state_events() -> list[Event]:
    """A 250-deep STATE_SNAPSHOT, then two STATE_DELTAs that each add 250 levels
    under the deepest point: valid events one by one, a 750-deep state folded."""
    return [
        {"type": "STATE_SNAPSHOT", "snapshot": nest(DEEP)},
        {
            "type": "STATE_DELTA",
            "delta": [{"op": "add", "path": f"{DEEP_PATH}/b", "value": nest(DEEP)}],
        },
        {
            "type": "STATE_DELTA",
            "delta": [{"op": "add", "path": f"{DEEP_PATH}/b{DEEP_PATH}/c", "value": nest(DEEP)}],
        },
    ]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def has_bytes(value: Any) -> bool:
    if isinstance(value, bytes):
        return True
    if isinstance(value, dict):
        return any(has_bytes(v) for v in value.values())
    if isinstance(value, list):
        return any(has_bytes(v) for v in value)
    return False


# -- writing straight into a store ---------------------------------------------------------


async def raw_redis(store: RedisStore) -> aioredis.Redis:
    return aioredis.Redis.from_url(store.url, decode_responses=False)


async def xadd(store: RedisStore, thread: str, fields: dict[str, bytes]) -> str:
    """A plain XADD (docs/store.md "Publishing from another language"), then the PUBLISH."""
    client = await raw_redis(store)
    try:
        offset = await client.xadd(stream_key(store.prefix, thread), fields)  # type: ignore[arg-type]
        await client.publish(notify_channel(store.prefix, thread), offset)
    finally:
        await client.aclose()
    return offset.decode() if isinstance(offset, bytes) else str(offset)


async def memory_raw_append(store: MemoryStore, thread: str, data: bytes, event_type: str) -> str:
    """Append bytes that are not an encodable event (the memory store's append encodes)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory_store_module, "encode_event_data", lambda event: data)
        (offset,) = await store.append(thread, [EventInput({"type": event_type}, uuid.uuid4().hex)])
    return offset


async def write_event(store: ThreadStore, thread: str, event: Event, event_id: str = "") -> str:
    """Store *event* as it is, without the gateway's checks."""
    event_id = event_id or uuid.uuid4().hex
    if isinstance(store, RedisStore):
        return await xadd(
            store,
            thread,
            {
                "event": msgpack.packb(event, use_bin_type=True),
                "id": event_id.encode(),
                "type": str(event.get("type", "")).encode(),
            },
        )
    (offset,) = await store.append(thread, [EventInput.of(event, event_id)])
    return offset


@dataclass
class Stored:
    """One entry this test wrote: its offset, its event (None: not an event), poison or not."""

    offset: str
    event: Any
    poison: bool = False


async def write_poison(store: ThreadStore, thread: str, case: str) -> list[Stored]:
    if case == "deep_state":
        return [
            Stored(await write_event(store, thread, event), event, True)
            for event in deep_state_events()
        ]
    if case == "no_message_id":
        event = {"type": "TEXT_MESSAGE_START", "role": "assistant"}
        return [Stored(await write_event(store, thread, event), event, True)]
    if case == "binary":
        event = custom("blob", b"\x00\xffbinary\x01")
        return [Stored(await write_event(store, thread, event), event, True)]
    if case == "bad_id":
        assert isinstance(store, RedisStore)
        event = custom("bad-id", 1)
        fields = {
            "event": msgpack.packb(event, use_bin_type=True),
            "id": b"\xff\xfe",
            "type": b"CUSTOM",
        }
        return [Stored(await xadd(store, thread, fields), event, True)]
    if case == "not_msgpack":
        data = b"\xc1\xc1 this is not msgpack"
        if isinstance(store, RedisStore):
            offset = await xadd(store, thread, {"event": data, "id": b"nm-1", "type": b"CUSTOM"})
        else:
            assert isinstance(store, MemoryStore)
            offset = await memory_raw_append(store, thread, data, "CUSTOM")
        return [Stored(offset, None, True)]
    raise AssertionError(case)


# -- reading frames ------------------------------------------------------------------------


def describe(frames: list[Frame], last: int = 4) -> str:
    out = []
    for f in frames[-last:]:
        text = json.dumps(f, default=repr)
        out.append(text if len(text) < 300 else text[:300] + "…")
    return "; ".join(out)


async def read_until(
    client: Client, until: Callable[[Frame], bool], what: str, timeout: float = SHORT
) -> list[Frame]:
    """Frames up to and including the first that *until* accepts; an AssertionError that
    says what arrived (and the close code) when it does not come."""
    deadline = time.monotonic() + timeout
    frames: list[Frame] = []
    for _ in range(100_000):
        left = deadline - time.monotonic()
        try:
            frame = await client.recv(max(0.01, left))
        except TimeoutError:
            raise AssertionError(
                f"{what}: nothing matching within {timeout:.0f}s (connection "
                f"{'closed ' + str(client.ws.close_code) if client.ws.close_code else 'open'}); "
                f"{len(frames)} frames: {describe(frames)}"
            ) from None
        except ConnectionClosed:
            raise AssertionError(
                f"{what}: closed with {client.ws.close_code} {client.ws.close_reason!r}; "
                f"{len(frames)} frames before: {describe(frames)}"
            ) from None
        frames.append(frame)
        if until(frame):
            return frames
    raise AssertionError(f"{what}: too many frames")


async def until_event(
    client: Client, thread: str, offset: str, what: str, **kw: Any
) -> list[Frame]:
    return await read_until(
        client,
        lambda f: f["type"] == "event" and f.get("thread") == thread and f["offset"] == offset,
        what,
        **kw,
    )


async def until_at(client: Client, thread: str, offset: str, what: str) -> list[Frame]:
    """Frames until *client* has *thread* at *offset*: its event, or a snapshot there or later."""
    key = offset_key(offset)

    def there(f: Frame) -> bool:
        if f.get("thread") != thread:
            return False
        if f["type"] == "event":
            return bool(f["offset"] == offset)
        return f["type"] == "snapshot" and offset_key(f["offset"]) >= key

    return await read_until(client, there, what)


async def still_open(client: Client, what: str) -> None:
    """A ping round trip: the connection is open and answers."""
    try:
        reply = await client.request({"type": "ping"}, timeout=SHORT)
    except ConnectionClosed:
        raise AssertionError(
            f"{what}: closed with {client.ws.close_code} {client.ws.close_reason!r}"
        ) from None
    assert reply["type"] == "pong", reply


async def close_code_of(client: Client, timeout: float = SHORT) -> int | None:
    """The code the server closes *client* with, reading meanwhile; None if still open."""
    try:
        return await client.closed_code(timeout)
    except (AssertionError, TimeoutError):
        return None


def check_relayed(
    got: list[tuple[str, Any]], stored: list[Stored], *, binary_ok: bool, what: str
) -> None:
    """*got* is the stored stream in order: each valid entry exactly once, poisoned
    ones optional (but in their place, and as stored when the encoding can say it)."""
    offsets = [o for o, _ in got]
    assert len(offsets) == len(set(offsets)), f"{what}: duplicates {offsets}"
    assert all(offset_key(a) < offset_key(b) for a, b in itertools.pairwise(offsets)), (
        f"{what}: out of order {offsets}"
    )
    by_offset = {s.offset: s for s in stored}
    for offset, event in got:
        assert offset in by_offset, f"{what}: an event at {offset} nobody stored"
        expected = by_offset[offset]
        if expected.event is not None and (binary_ok or not has_bytes(expected.event)):
            assert event == expected.event, f"{what}: event at {offset} differs"
    missing = [s.offset for s in stored if not s.poison and s.offset not in offsets]
    assert not missing, f"{what}: valid events missing: {missing}"


# -- 1. a channel survives anything one entry can do ----------------------------------------

POISONS = ["deep_state", "no_message_id", "binary", "not_msgpack", "bad_id"]
FOLD_FAILS = {"deep_state", "no_message_id", "not_msgpack"}
"""Cases with an entry the snapshot cannot fold (complete: false)."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", POISONS)
async def test_a_poisoned_entry_does_not_break_the_thread(
    harness: Harness, store_factory: Callable[..., ThreadStore], case: str
) -> None:
    gateway = await harness.gateway()
    store = gateway.store
    if case == "bad_id" and not isinstance(store, RedisStore):
        pytest.skip("an entry id that is not UTF-8 exists only in Redis")
    thread, other = new_thread(), new_thread()

    # Viewers of the thread (both encodings) and of another, healthy thread.
    live_json = await harness.client(gateway, JSON)
    live_msgpack = await harness.client(gateway, MSGPACK)
    other_viewer = await harness.client(gateway, MSGPACK)
    publisher = await harness.client(gateway, JSON)
    prefix = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "a"},
    ]
    stored = [
        Stored(o, e) for o, e in zip(await publisher.publish(thread, prefix), prefix, strict=True)
    ]
    for viewer in (live_json, live_msgpack):
        await viewer.subscribe(thread, "start")
    await other_viewer.subscribe(other, "live")
    other_first = await write_event(store, other, custom("o1"))
    await until_event(other_viewer, other, other_first, "other-thread viewer, before")

    stored += await write_poison(store, thread, case)
    suffix: list[Event] = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "b"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"after": True}},
    ]
    for event in suffix:
        stored.append(Stored(await write_event(store, thread, event), event))
    other_second = await write_event(store, other, custom("o2"))

    # The viewers of the thread get every later valid event, in order; not closed.
    for viewer, binary in ((live_json, False), (live_msgpack, True)):
        name = f"{case}: {'msgpack' if binary else 'JSON'} viewer"
        frames = await until_event(viewer, thread, stored[-1].offset, name)
        check_relayed(events_of(frames, thread), stored, binary_ok=binary, what=name)
        if case == "binary" and binary:
            assert stored[3].offset in [o for o, _ in events_of(frames, thread)], (
                f"{name}: the binary event was not relayed to msgpack"
            )
    # The other thread's viewer too (an entry of one thread must not touch others).
    frames = await until_event(other_viewer, other, other_second, f"{case}: other-thread viewer")
    assert [o for o, _ in events_of(frames, other)] == [other_second]

    # Late subscribers are served: from "snapshot" and from "start", both encodings.
    expected = fold([s.event for s in stored if not s.poison])
    late: list[tuple[Client, bool, str]] = []
    for protocol in (JSON, MSGPACK):
        for start in ("snapshot", "start"):
            client = await harness.client(gateway, protocol)
            name = f"{case}: late {protocol} from {start}"
            command = {"type": "subscribe", "id": f"late-{start}", "thread": thread, "from": start}
            await client.send(command)
            frames = await read_until(
                client,
                lambda f: f["type"] in ("subscribed", "error"),
                name + " (reply)",
            )
            reply = frames[-1]
            assert reply["type"] == "subscribed" and reply["id"] == f"late-{start}", (
                f"{name}: {reply}"
            )
            assert len(frames) == 1, f"{name}: frames before the reply: {describe(frames)}"
            if start == "snapshot":
                snap = await client.recv(SHORT)
                assert snap["type"] == "snapshot", f"{name}: {snap}"
                if case in FOLD_FAILS:
                    assert snap["complete"] is False, f"{name}: snapshot says complete"
                got = fold(snap["events"])
                assert got.messages == expected.messages, f"{name}: snapshot messages"
                assert got.state == expected.state, f"{name}: snapshot state"
            else:
                frames = await until_event(client, thread, stored[-1].offset, name)
                check_relayed(
                    events_of(frames, thread), stored, binary_ok=protocol == MSGPACK, what=name
                )
            late.append((client, protocol == MSGPACK, name))

    # And everyone gets what follows.
    tail = [custom("tail"), {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"}]
    tail_offsets = [await write_event(store, thread, e) for e in tail]
    everyone = [(live_json, False, "live JSON"), (live_msgpack, True, "live msgpack"), *late]
    for client, _binary, name in everyone:
        frames = await until_event(client, thread, tail_offsets[-1], f"{case}: {name}, tail")
        assert events_of(frames, thread) == list(zip(tail_offsets, tail, strict=True)), (
            f"{case}: {name}"
        )
        await still_open(client, f"{case}: {name}")
    await still_open(other_viewer, f"{case}: other-thread viewer")


async def test_publishing_the_deep_deltas_is_refused(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = new_thread()
    publisher = await harness.client(gateway, MSGPACK)
    viewer = await harness.client(gateway, JSON)
    await viewer.subscribe(thread, "live")
    started = await publisher.publish(
        thread, [{"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}]
    )
    snapshot, *deltas = deep_state_events()
    reply = await publisher.request({"type": "publish", "thread": thread, "events": [snapshot]})
    # The 250-deep snapshot itself may be over the depth limit.
    assert reply["type"] == "published" or (
        reply["type"] == "error" and reply["code"] == "limit_exceeded"
    ), reply
    published = started + reply.get("offsets", [])
    for delta in deltas:
        reply = await publisher.request({"type": "publish", "thread": thread, "events": [delta]})
        assert reply["type"] == "error", f"a delta to a 500+-deep state was stored: {reply}"
        assert reply["code"] in ("limit_exceeded", "patch_error"), reply
    entries = await gateway.store.read(thread)
    assert [e.offset for e in entries] == published
    assert not [e for e in entries if e.type == "STATE_DELTA"]
    # Both connections still work, and the thread too.
    offsets = await publisher.publish(thread, [custom("after")])
    frames = await until_event(viewer, thread, offsets[-1], "viewer after the refusals")
    assert [o for o, _ in events_of(frames, thread)] == [*published, *offsets]


# -- 2. the last-resort handler -------------------------------------------------------------


async def test_a_channel_that_fails_closes_its_members_and_is_forgotten(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agui_hub")
    gateway = await harness.gateway()
    thread, other = new_thread(), new_thread()
    viewers = [await harness.client(gateway, p) for p in (JSON, MSGPACK)]
    for viewer in viewers:
        await viewer.subscribe(thread, "live")
    other_viewer = await harness.client(gateway, JSON)
    await other_viewer.subscribe(other, "live")
    publisher = await harness.client(gateway, MSGPACK)
    await publisher.publish(thread, opening(thread))
    await publisher.publish(other, opening(other))
    for viewer in (*viewers, other_viewer):
        await read_until(
            viewer,
            lambda f: f["type"] == "event" and f["event"]["type"] == ("TEXT_MESSAGE_START"),
            "viewers before the fault",
        )

    original = hub_module.ThreadChannel._deliver
    fault = RuntimeError("injected channel fault")
    fired: list[str] = []

    def faulty(self: Any, entry: Any, *args: Any, **kwargs: Any) -> Any:
        if self.thread == thread and not fired:
            fired.append(entry.offset)
            raise fault
        return original(self, entry, *args, **kwargs)

    monkeypatch.setattr(hub_module.ThreadChannel, "_deliver", faulty)
    first = await publisher.publish(thread, [custom("one")])
    codes = [await close_code_of(viewer) for viewer in viewers]
    assert fired == first, "the injected fault did not fire"
    assert codes == [1011, 1011], f"members of the failed channel: close codes {codes}"
    logged = [
        r
        for r in caplog.records
        if r.name.startswith("agui_hub")
        and r.levelno >= logging.WARNING
        and (
            (r.exc_info is not None and r.exc_info[1] is fault)
            or "injected channel fault" in r.getMessage()
        )
    ]
    assert logged, "the channel's failure was not logged"
    deadline = time.monotonic() + SHORT
    while thread in gateway.hub.channels and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert thread not in gateway.hub.channels, "the failed channel is still registered"

    # The other thread was not touched.
    other_offsets = await publisher.publish(other, [custom("other")])
    frames = await until_event(other_viewer, other, other_offsets[-1], "other-thread viewer")
    assert [o for o, _ in events_of(frames, other)] == other_offsets

    # A new subscriber starts afresh and gets what was stored, then what follows.
    again = await harness.client(gateway, MSGPACK)
    await again.subscribe(thread, "start")
    later = await publisher.publish(thread, [custom("two")])
    frames = await until_event(again, thread, later[-1], "subscriber after the failure")
    got = [o for o, _ in events_of(frames, thread)]
    assert got[-2:] == first + later and len(got) == 4, got


# -- 3. reloads and resets cannot kill a channel --------------------------------------------


class JitterStore:
    """A memory store whose calls take 0-3 ms: the windows a real store has."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner

    def subscribe(self, thread: str, after: str | None = None) -> FeedSubscription:
        return self.inner.subscribe(thread, after)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def jittery(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(random.random() * 0.0015)
            result = await attr(*args, **kwargs)
            await asyncio.sleep(random.random() * 0.0015)
            return result

        return jittery


@dataclass
class Producer:
    """Appends CUSTOM events flat out through ``store.append`` until stopped (bounded)."""

    store: ThreadStore
    thread: str
    max_events: int = 30_000
    max_seconds: float = 20.0
    appended: int = 0
    errors: list[BaseException] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, workers: int = 2) -> None:
        self._tasks = [asyncio.create_task(self._run(w)) for w in range(workers)]

    async def _run(self, worker: int) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and self.appended < self.max_events:
            if time.monotonic() > deadline:
                return
            try:
                await self.store.append(
                    self.thread,
                    [EventInput.of(content("m1", f"{worker}.{self.appended} "))],
                )
            except AguiHubError as exc:
                self.errors.append(exc)
                return
            self.appended += 1
            if isinstance(self.store, MemoryStore):
                await asyncio.sleep(0)  # its appends never yield

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), WAIT)


async def reload_gateway(harness: Harness, retention: Retention) -> tuple[Any, ThreadStore]:
    """A gateway, and another handle on its store for a producer. In memory the
    gateway's calls take 0-3 ms (JitterStore): the windows a real store has."""
    if harness.store_factory is memory_store:
        inner = MemoryStore(retention=retention)
        return await harness.gateway(store=JitterStore(inner)), inner
    return await harness.gateway(retention=retention), harness.store_factory(retention=retention)


@pytest.mark.timeout(60)
async def test_reloads_under_a_fast_producer_answer_every_subscribe(harness: Harness) -> None:
    retention = Retention(max_len=20)
    gateway, producer_store = await reload_gateway(harness, retention)
    thread = new_thread()
    await producer_store.append(thread, [EventInput.of(e) for e in opening(thread)])
    producer = Producer(producer_store, thread)
    producer.start()
    answers: list[str] = []
    try:
        before = producer.appended
        for i in range(120):
            start = "live" if i % 2 == 0 else "start"
            client = await harness.client(gateway, JSON if i % 4 < 2 else MSGPACK)
            try:
                reply = await client.request(
                    {"type": "subscribe", "id": i, "thread": thread, "from": start}, timeout=SHORT
                )
                if reply["type"] == "subscribed":
                    answers.append("subscribed")
                    # Leave: the next subscribe loads the thread afresh.
                    left = await client.request({"type": "unsubscribe", "thread": thread})
                    assert left["type"] == "unsubscribed", left
                else:
                    answers.append(f"{start}: {reply.get('code')}: {reply.get('message')}")
            except ConnectionClosed:
                answers.append(f"{start}: closed {client.ws.close_code} {client.ws.close_reason}")
            except TimeoutError:
                answers.append(f"{start}: no reply")
            finally:
                harness.clients.remove(client)
                await client.close()
        during = producer.appended - before
    finally:
        await producer.stop()
        if isinstance(producer_store, RedisStore):
            await producer_store.close()
    assert not producer.errors, producer.errors
    assert during >= 200, f"the producer appended only {during} events meanwhile"
    failed = [a for a in answers if a != "subscribed"]
    assert not failed, f"{len(failed)} of 120 subscribes not answered `subscribed`: {failed[:5]}"


@pytest.mark.timeout(60)
async def test_a_publisher_beside_a_fast_producer_never_sees_offset_expired(
    harness: Harness,
) -> None:
    retention = Retention(max_len=20)
    gateway, producer_store = await reload_gateway(harness, retention)
    thread = new_thread()
    await producer_store.append(thread, [EventInput.of(e) for e in opening(thread)])
    if isinstance(gateway.store, RedisStore):
        target = f"{gateway.store.url}?prefix={gateway.store.prefix}&max_len=20"
    else:
        target = url(gateway)  # the memory store is reached through the gateway
    producer = Producer(producer_store, thread)
    producer.start(workers=1)
    failures: list[BaseException] = []
    offsets: list[str] = []
    try:
        async with Publisher(target, retry_for=5) as publisher:
            for i in range(50):
                try:
                    offsets.append(
                        await asyncio.wait_for(publisher.publish(thread, custom("pub", i)), WAIT)
                    )
                except Exception as exc:
                    failures.append(exc)
    finally:
        await producer.stop()
        if isinstance(producer_store, RedisStore):
            await producer_store.close()
    assert not producer.errors, producer.errors
    said = [f"{type(e).__name__}: {e}" for e in failures]
    expired = [  # a local OffsetExpired, or the gateway's offset_expired error frame
        s
        for e, s in zip(failures, said, strict=True)
        if isinstance(e, OffsetExpired) or getattr(e, "code", None) == "offset_expired"
    ]
    assert not expired, f"{len(expired)} of 50 publishes failed with OffsetExpired: {expired[:3]}"
    # Losing the optimistic append to a producer that never pauses is the one
    # documented way to fail (StoreUnavailable: retry with the same ids).
    others = [s for e, s in zip(failures, said, strict=True) if not isinstance(e, StoreUnavailable)]
    assert not others, f"publishes failed: {others[:3]}"
    assert offsets and len(set(offsets)) == len(offsets)
    assert producer.appended >= 200, "the producer did not run alongside"


class SlowStore:
    """A memory store behind ~*delay* seconds of latency per call (half each way);
    remembers every checkpoint it actually stored."""

    def __init__(self, inner: MemoryStore, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.retention = inner.retention
        self.stored_checkpoints: list[tuple[str, Checkpoint]] = []

    def subscribe(self, thread: str, after: str | None = None) -> FeedSubscription:
        return self.inner.subscribe(thread, after)

    async def _wait(self) -> None:
        await asyncio.sleep(self.delay / 2 * (0.5 + random.random()))

    async def put_checkpoint(self, thread: str, checkpoint: Checkpoint) -> None:
        await self._wait()
        await self.inner.put_checkpoint(thread, checkpoint)
        # The memory store answers without yielding: this is what it kept.
        if await self.inner.get_checkpoint(thread) is checkpoint:
            self.stored_checkpoints.append((thread, checkpoint))
        await self._wait()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def slow(*args: Any, **kwargs: Any) -> Any:
            await self._wait()
            result = await attr(*args, **kwargs)
            await self._wait()
            return result

        return slow


def run_events(thread: str, run: str, deltas: int) -> list[Event]:
    message = f"{run}-m"
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        *(
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"{run}.{i} "}
            for i in range(deltas)
        ),
    ]


@pytest.mark.timeout(60)
async def test_checkpoints_never_pair_a_state_with_another_cursor(
    mem: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "CHECKPOINT_EVERY", 5)
    # A frozen clock: every epoch's offsets start at <T>-0, so that a cursor of
    # the previous epoch is also an offset of the next one.
    inner = MemoryStore(clock=lambda: 1_700_000_000.0)
    store = SlowStore(inner, 0.05)
    gateway = await mem.gateway(store=store)
    thread = new_thread()
    viewer = await mem.client(gateway, MSGPACK)
    history: dict[str, list[tuple[str, Event]]] = {}

    async def burst(run: str, deltas: int) -> str:
        offsets = [
            (await inner.append(thread, [EventInput.of(e)]))[0]
            for e in run_events(thread, run, deltas)
        ]
        return offsets[-1]

    last = await burst("r0", 18)
    await viewer.subscribe(thread, "live")
    for cycle in range(1, 7):
        last = await burst(f"r{cycle}a", 18 + cycle)
        await until_at(viewer, thread, last, f"cycle {cycle}: viewer")
        await asyncio.sleep(0.2)  # the checkpoints in flight land
        last = await burst(f"r{cycle}c", 10 + cycle)
        await until_at(viewer, thread, last, f"cycle {cycle}: viewer, second burst")
        # Reset while checkpoints are in flight: delete and re-create the thread.
        epoch = await inner.epoch(thread)
        assert epoch is not None
        history[epoch] = [(e.offset, unpack(e.data)) for e in await inner.read(thread)]
        assert await inner.delete(thread)
        last = await burst(f"r{cycle}b", 3 + 2 * cycle)
        await until_at(viewer, thread, last, f"cycle {cycle}: viewer after the reset")
    await asyncio.sleep(0.5)  # checkpoints in flight land
    epoch = await inner.epoch(thread)
    assert epoch is not None
    history[epoch] = [(e.offset, unpack(e.data)) for e in await inner.read(thread)]
    await still_open(viewer, "viewer")

    checked = 0
    for name, checkpoint in store.stored_checkpoints:
        assert name == thread
        events = history.get(checkpoint.epoch)
        assert events is not None, f"a checkpoint of an epoch that never existed: {checkpoint}"
        offsets = [o for o, _ in events]
        where = f"checkpoint at {checkpoint.offset} (epoch {checkpoint.epoch})"
        assert checkpoint.offset == START or checkpoint.offset in offsets, (
            f"{where}: not an offset of its epoch"
        )
        upto = [e for o, e in events if offset_key(o) <= offset_key(checkpoint.offset)]
        assert fold(unpack(checkpoint.events)).compact() == fold(upto).compact(), (
            f"{where}: its state is not the fold of its epoch up to its offset"
        )
        checked += 1
    assert checked >= 6, f"only {checked} checkpoints were stored"


# -- 5. "slow consumer" means the consumer ---------------------------------------------------


class GatedFeed(FeedSubscription):
    """A feed that hands out nothing while its gate is closed (its queue fills meanwhile)."""

    def __init__(self, backend: Any, thread: str, after: str | None, gate: asyncio.Event) -> None:
        super().__init__(backend, thread, after)
        self._gate = gate

    async def __anext__(self) -> Any:
        await self._gate.wait()
        return await super().__anext__()


class StallingStore:
    """A memory store whose live feeds stall while ``gate`` is clear."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()

    def subscribe(self, thread: str, after: str | None = None) -> FeedSubscription:
        return GatedFeed(self.inner, thread, after, self.gate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Reader:
    """Reads a client's frames promptly in the background."""

    client: Client
    frames: list[Frame] = field(default_factory=list)
    closed: int | None = None
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self.frames.append(await self.client.recv(3600))
        except ConnectionClosed:
            self.closed = self.client.ws.close_code

    def has(self, thread: str, offset: str) -> bool:
        return any(
            f["type"] == "event" and f.get("thread") == thread and f["offset"] == offset
            for f in self.frames[-50:]
        )

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@contextlib.contextmanager
def stopped(server: RedisServer) -> Iterator[None]:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


async def non_reader(gateway: Any, thread: str) -> Any:
    """A client that subscribes, reads the reply, and then never reads again."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.config.port)), WAIT
    )
    ws = await connect(
        url(gateway),
        sock=sock,
        subprotocols=[Subprotocol(JSON)],
        proxy=None,
        max_queue=1,
        max_size=None,
    )
    await ws.send(json.dumps({"type": "subscribe", "id": 1, "thread": thread, "from": "live"}))
    reply = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
    assert reply["type"] == "subscribed", reply
    return ws


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_store_stall_does_not_close_prompt_viewers(
    kind: str, request: pytest.FixtureRequest
) -> None:
    thread = new_thread()
    server: RedisServer | None = None
    if kind == "redis":
        server = request.getfixturevalue("own_redis")
        prefix = f"stall-{uuid.uuid4().hex[:8]}"
        gateway_store: Any = RedisStore(server.url, prefix=prefix)
        producer_store: Any = RedisStore(server.url, prefix=prefix)
    else:
        inner = MemoryStore()
        gateway_store = StallingStore(inner)
        producer_store = inner
    h = Harness(memory_store)
    quiet = None
    readers: list[Reader] = []
    try:
        gateway = await h.gateway(store=gateway_store)
        await producer_store.append(
            thread,
            [
                EventInput.of({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
                EventInput.of(
                    {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}
                ),
            ],
        )
        for i in range(8):
            client = await h.client(gateway, JSON if i % 2 else MSGPACK)
            reply = await client.subscribe(thread, "live")
            readers.append(Reader(client))
        position = reply["offset"]
        quiet = await non_reader(gateway, thread)
        for reader in readers:
            reader.start()

        pad = "x" * (16 * 1024)
        count = 400  # 6.4 MiB: more than the 4 MiB send queue, less than a feed's 8 MiB
        events = [
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"{i} {pad}"}
            for i in range(count)
        ]
        if server is not None:
            with stopped(server):
                pending = []
                for i in range(0, count, 10):
                    batch = [EventInput.of(e) for e in events[i : i + 10]]
                    pending.append(asyncio.ensure_future(producer_store.append(thread, batch)))
                    await asyncio.sleep(0.025)
            results = await asyncio.wait_for(asyncio.gather(*pending), 3 * WAIT)
        else:
            gateway_store.gate.clear()
            results = []
            try:
                for i in range(0, count, 10):
                    batch = [EventInput.of(e) for e in events[i : i + 10]]
                    results.append(await producer_store.append(thread, batch))
                    await asyncio.sleep(0.025)
            finally:
                gateway_store.gate.set()
        last = results[-1][-1]

        deadline = time.monotonic() + 4 * WAIT
        while time.monotonic() < deadline:
            if all(r.closed is not None or r.has(thread, last) for r in readers):
                break
            await asyncio.sleep(0.05)
        closed = [r.closed for r in readers if r.closed is not None]
        assert not closed, f"{len(closed)} of 8 prompt viewers were closed: codes {closed}"
        stored = [(e.offset, unpack(e.data)) for e in await producer_store.read(thread, position)]
        assert stored[-1][0] == last
        for i, reader in enumerate(readers):
            got = events_of(reader.frames, thread)
            assert len(got) == len(stored) and got == stored, (
                f"viewer {i}: {len(got)} events of {len(stored)}, or not in order"
            )
    finally:
        for reader in readers:
            await reader.stop()
        if quiet is not None:
            quiet.transport.abort()
        await h.close()
        if producer_store is not gateway_store and isinstance(producer_store, RedisStore):
            await producer_store.close()


# -- 6. a snapshot can always be delivered -------------------------------------------------


async def test_a_snapshot_larger_than_the_send_queue_is_delivered(harness: Harness) -> None:
    gateway = await harness.gateway(send_queue_bytes=256 * 1024)
    thread = new_thread()
    publisher = await harness.client(gateway, MSGPACK)
    deltas = [f"{i:03d}" + "y" * (16 * 1024 - 3) for i in range(64)]  # 1 MiB of text
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"blob": "s" * (600 * 1024), "n": 1}},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": d} for d in deltas),
    ]
    await publisher.publish(thread, events[:2])
    for i in range(2, len(events), 8):
        await publisher.publish(thread, events[i : i + 8])
    expected = fold(events)

    viewers = [await harness.client(gateway, p, max_size=None) for p in (JSON, MSGPACK)]
    for viewer in viewers:
        await viewer.send({"type": "subscribe", "id": "s", "thread": thread, "from": "snapshot"})
    for viewer in viewers:
        what = f"{'msgpack' if viewer.binary else 'JSON'} snapshot subscriber"
        first = await read_until(viewer, lambda f: True, what)
        assert first[0]["type"] == "subscribed" and first[0]["id"] == "s", first[0]
        frames = await read_until(viewer, lambda f: True, what + " (snapshot)")
        snap = frames[0]
        assert snap["type"] == "snapshot", f"{what}: {describe(frames)}"
        got = fold(snap["events"])
        assert snap["complete"] is True
        assert got.messages == expected.messages, f"{what}: the message is not whole"
        assert got.state == expected.state, f"{what}: the state is not whole"
    tail = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "end"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]
    offsets = await publisher.publish(thread, tail)
    for viewer in viewers:
        what = f"{'msgpack' if viewer.binary else 'JSON'} snapshot subscriber, live"
        frames = await until_event(viewer, thread, offsets[-1], what)
        assert events_of(frames, thread) == list(zip(offsets, tail, strict=True)), what
        await still_open(viewer, what)


# -- 7. the subscribe reply comes first, with a true epoch ----------------------------------


@dataclass
class Subscription:
    """What a viewer makes of one subscription's frames, checked as they come."""

    thread: str
    command_id: Any
    requested: tuple[str, str | None] | None
    """(offset, epoch) of a resume; None for "start"."""
    what: str
    epoch: str | None = None
    position: str | None = None
    segments: list[tuple[str | None, str, list[tuple[str, Event]]]] = field(default_factory=list)
    """Per stretch of events: (epoch, position it continues from, events)."""
    expect_snapshot: bool = False
    replied: bool = False
    seen: list[Frame] = field(default_factory=list)

    def frames(self) -> str:
        return describe(self.seen, last=8)

    def reached(self, epoch: str | None, offset: str) -> Callable[[], bool]:
        """Whether this viewer is at *offset* of *epoch* (an event or a snapshot there)."""
        return lambda: self.epoch == epoch and self.position == offset and not self.expect_snapshot

    def take(self, frame: Frame) -> None:
        self.seen.append(frame)
        what = f"{self.what}: {json.dumps(frame, default=repr)[:300]} (frames: {self.frames()})"
        kind = frame["type"]
        if not self.replied:
            assert kind == "subscribed" and frame.get("id") == self.command_id, (
                f"the first frame is not the reply: {what}"
            )
        if kind == "subscribed":
            assert frame["epoch"] is not None or frame["offset"] == START, (
                f"epoch null with a non-zero offset: {what}"
            )
            assert not self.expect_snapshot, f"a snapshot was due: {what}"
            if not self.replied:
                self.replied = True
                self.epoch = frame["epoch"]
                if frame["recovered"]:
                    if self.requested is not None and self.requested[1] is not None:
                        assert frame["epoch"] == self.requested[1], (
                            f"recovered: true with another epoch than the one asked: {what}"
                        )
                    self.position = START if self.requested is None else self.requested[0]
                    self.segments.append((self.epoch, self.position, []))
                else:
                    self.expect_snapshot = True
                return
            assert "id" not in frame, f"a second reply: {what}"
            if frame["recovered"]:
                # The thread's first event made its epoch: the same stream goes on.
                assert self.epoch is None and frame["epoch"], f"announcement: {what}"
                self.epoch = frame["epoch"]
                assert self.segments, what
                _, position, events = self.segments[-1]
                self.segments[-1] = (self.epoch, position, events)
            else:
                self.epoch = frame["epoch"]
                self.expect_snapshot = True
        elif kind == "snapshot":
            assert self.expect_snapshot, f"a snapshot without a subscribed before it: {what}"
            assert frame["epoch"] == self.epoch, f"snapshot of another epoch: {what}"
            self.expect_snapshot = False
            self.position = frame["offset"]
            self.segments.append((self.epoch, frame["offset"], []))
        elif kind == "event":
            assert not self.expect_snapshot, f"an event before the snapshot: {what}"
            assert self.position is not None and self.segments, what
            assert offset_key(frame["offset"]) > offset_key(self.position), (
                f"an event at or before the position {self.position}: {what}"
            )
            self.position = frame["offset"]
            self.segments[-1][2].append((frame["offset"], frame["event"]))
        else:
            raise AssertionError(f"unexpected frame: {what}")

    def check(self, history: dict[str, list[tuple[str, Event]]], final_epoch: str) -> None:
        """Each stretch is exactly the stored events after its position: the last
        one up to the end, earlier ones (cut by a reset) a prefix."""
        assert self.replied and not self.expect_snapshot, f"{self.what}: incomplete"
        for i, (epoch, position, events) in enumerate(self.segments):
            stored = [
                (o, e)
                for o, e in history.get(epoch or "", [])
                if offset_key(o) > offset_key(position)
            ]
            if i == len(self.segments) - 1:
                assert epoch == final_epoch, (
                    f"{self.what}: ended in epoch {epoch}, the thread's is {final_epoch} "
                    f"(frames: {self.frames()})"
                )
                assert events == stored, (
                    f"{self.what}: after {position} got {[o for o, _ in events]}, "
                    f"stored {[o for o, _ in stored]} (frames: {self.frames()})"
                )
            else:
                assert events == stored[: len(events)], (
                    f"{self.what}: a gap or a stale event after {position}: "
                    f"{[o for o, _ in events]} vs {[o for o, _ in stored]} "
                    f"(frames: {self.frames()})"
                )


async def settle(
    client: Client,
    subs: dict[str, Subscription],
    done: Callable[[], bool],
    quiet: float = 0.03,
) -> None:
    """Feed every frame that arrives to its subscription until a ping's pong has
    come and *done* holds (or SHORT seconds passed: check() says what is
    missing), then for *quiet* seconds more (what arrives then is extra)."""
    ping_id = f"ping-{uuid.uuid4().hex[:6]}"
    with contextlib.suppress(ConnectionClosed):  # then recv() says so, after what it holds
        await client.send({"type": "ping", "id": ping_id})
    ponged = False
    deadline = time.monotonic() + SHORT
    for _ in range(10_000):
        finished = ponged and done()
        left = deadline - time.monotonic()
        try:
            frame = await client.recv(quiet if finished or left <= 0 else left)
        except TimeoutError:
            if ponged:
                return
            raise AssertionError("no pong") from None
        except ConnectionClosed:
            raise AssertionError(
                f"closed with {client.ws.close_code} {client.ws.close_reason!r}; "
                + "; ".join(f"{sub.what}: {sub.frames()}" for sub in subs.values())
            ) from None
        if frame["type"] == "pong" and frame.get("id") == ping_id:
            ponged = True
            continue
        if frame["type"] in ("unsubscribed",):
            continue
        sub = subs.get(frame.get("thread", ""))
        assert sub is not None, f"a frame of no subscription: {frame}"
        sub.take(frame)
    raise AssertionError("frames kept coming")


async def send_soon(client: Client, frame: Frame) -> None:
    """Send *frame* within 3 ms: sometimes before, sometimes after what it races."""
    await asyncio.sleep(random.random() * 0.003)
    await client.send(frame)


@pytest.fixture(params=["memory", "redis"])
async def race_gateway(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Harness, Any, Any]]:
    """A gateway, and the store handle a racing producer writes through."""
    if request.param == "memory":
        inner = MemoryStore()
        h = Harness(memory_store)
        gateway = await h.gateway(store=JitterStore(inner))
        producer: Any = inner
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix = f"race-{uuid.uuid4().hex}"
        h = Harness(lambda retention=None: RedisStore(server.url, prefix=prefix))
        gateway = await h.gateway()
        producer = RedisStore(server.url, prefix=prefix)
    try:
        yield h, gateway, producer
    finally:
        await h.close()
        if isinstance(producer, RedisStore):
            await producer.close()


RACE_LANES = 4
"""The race tests run their tries in this many lanes at once, each with its own two
connections and threads: every try is the same race, the waits of one lane (for the
frames, then for quiet) pass while the others race."""


async def keep_the_live_reader_busy(h: Harness, gateway: Any) -> None:
    """Subscribe a connection to a thread of its own for the test's length.

    A Redis gateway's live reader with no thread subscribed polls every 50 ms for
    one; without this, each try's first subscribe (the anchor's, made before the
    race) waits for that poll. The racing subscribe always finds the thread's
    channel up (the anchor's), this or not."""
    keeper = await h.client(gateway, JSON)
    await keeper.subscribe(f"keeper-{uuid.uuid4().hex[:6]}", "live")


async def in_lanes(
    tries: int, seconds: float, race: Callable[[int, Client, Client], Any], h: Harness, gateway: Any
) -> int:
    """Run ``race(i, anchor, racer)`` for i in range(tries), in RACE_LANES lanes at
    once, until *seconds* have passed; how many tries ran."""
    await keep_the_live_reader_busy(h, gateway)
    deadline = time.monotonic() + seconds
    done = 0

    async def lane(first: int) -> None:
        nonlocal done
        anchor = await h.client(gateway, MSGPACK)  # keeps each thread's channel up
        racer = await h.client(gateway, JSON)
        for i in range(first, tries, RACE_LANES):
            if time.monotonic() > deadline:
                break
            await race(i, anchor, racer)
            done += 1

    await asyncio.gather(*(lane(k) for k in range(RACE_LANES)))
    return done


@pytest.mark.timeout(60)
async def test_the_reply_comes_first_when_the_first_event_races(
    race_gateway: tuple[Harness, Any, Any],
) -> None:
    h, gateway, producer = race_gateway

    async def race(i: int, anchor: Client, racer: Client) -> None:
        thread = f"first-{i}-{uuid.uuid4().hex[:6]}"
        anchor_reply = await anchor.subscribe(thread, "live")
        anchor_sub = Subscription(thread, None, None, f"try {i}: anchor", replied=True)
        anchor_sub.position, anchor_sub.epoch = anchor_reply["offset"], anchor_reply["epoch"]
        anchor_sub.segments.append((anchor_reply["epoch"], anchor_reply["offset"], []))
        start: Any = "start" if i % 2 == 0 else {"offset": START}
        sub = Subscription(thread, f"s{i}", None, f"try {i}: from {start}")
        event = {"type": "RUN_STARTED", "threadId": thread, "runId": "r"}

        async def first_event() -> None:
            await asyncio.sleep(random.random() * 0.003)  # around the subscribe's arrival
            await producer.append(thread, [EventInput.of(event)])

        await asyncio.gather(
            send_soon(racer, {"type": "subscribe", "id": f"s{i}", "thread": thread, "from": start}),
            first_event(),
        )
        second = await producer.append(thread, [EventInput.of(custom("second"))])
        epoch = await producer.epoch(thread)
        history = {epoch: [(e.offset, unpack(e.data)) for e in await producer.read(thread)]}
        assert history[epoch][-1][0] == second[0]
        await asyncio.gather(
            settle(racer, {thread: sub}, sub.reached(epoch, second[0])),
            settle(anchor, {thread: anchor_sub}, anchor_sub.reached(epoch, second[0])),
        )
        sub.check(history, epoch)
        anchor_sub.check(history, epoch)
        for client in (racer, anchor):
            reply = await client.request({"type": "unsubscribe", "thread": thread})
            assert reply["type"] == "unsubscribed", reply

    tries = await in_lanes(200, 25 * TIMEOUT_SCALE, race, h, gateway)
    assert tries >= 50, f"only {tries} tries in the time"


@pytest.mark.timeout(60)
async def test_the_reply_comes_first_when_a_reset_races(
    race_gateway: tuple[Harness, Any, Any],
) -> None:
    h, gateway, producer = race_gateway

    async def race(i: int, anchor: Client, racer: Client) -> None:
        thread = f"reset-{i}-{uuid.uuid4().hex[:6]}"
        old = [custom("old", k) for k in range(3)]
        old_offsets = await producer.append(thread, [EventInput.of(e) for e in old])
        old_epoch = await producer.epoch(thread)
        history = {old_epoch: list(zip(old_offsets, old, strict=True))}
        anchor_reply = await anchor.subscribe(thread, "live")
        anchor_sub = Subscription(thread, None, None, f"try {i}: anchor", replied=True)
        anchor_sub.position, anchor_sub.epoch = anchor_reply["offset"], anchor_reply["epoch"]
        anchor_sub.segments.append((anchor_reply["epoch"], anchor_reply["offset"], []))
        if i % 2 == 0:
            start: Any = {"offset": old_offsets[0], "epoch": old_epoch}
            requested: tuple[str, str | None] | None = (old_offsets[0], old_epoch)
        else:
            start, requested = "start", None
        sub = Subscription(thread, f"s{i}", requested, f"try {i}: from {start}")

        async def reset() -> None:
            await asyncio.sleep(random.random() * 0.003)  # around the subscribe's arrival
            await producer.delete(thread)
            await producer.append(thread, [EventInput.of(custom("new", 0))])

        await asyncio.gather(
            send_soon(racer, {"type": "subscribe", "id": f"s{i}", "thread": thread, "from": start}),
            reset(),
        )
        (last,) = await producer.append(thread, [EventInput.of(custom("new", 1))])
        epoch = await producer.epoch(thread)
        assert epoch != old_epoch
        history[epoch] = [(e.offset, unpack(e.data)) for e in await producer.read(thread)]
        await asyncio.gather(
            settle(racer, {thread: sub}, sub.reached(epoch, last)),
            settle(anchor, {thread: anchor_sub}, anchor_sub.reached(epoch, last)),
        )
        sub.check(history, epoch)
        anchor_sub.check(history, epoch)
        for client in (racer, anchor):
            reply = await client.request({"type": "unsubscribe", "thread": thread})
            assert reply["type"] == "unsubscribed", reply

    tries = await in_lanes(100, 25 * TIMEOUT_SCALE, race, h, gateway)
    assert tries >= 30, f"only {tries} tries in the time"


# -- 8. offsets past the end, and offsets that are not ASCII --------------------------------


async def test_a_far_future_offset_gets_a_snapshot_not_silence(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = new_thread()
    publisher = await harness.client(gateway, MSGPACK)
    offsets = await publisher.publish(
        thread, [{"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}, custom("one")]
    )
    epoch = (await publisher.subscribe(thread, "live"))["epoch"]
    viewer = await harness.client(gateway, JSON)
    await viewer.send(
        {
            "type": "subscribe",
            "id": "far",
            "thread": thread,
            "from": {"offset": "99999999999999-0", "epoch": epoch},
        }
    )
    frames = await read_until(viewer, lambda f: True, "far-future resume")
    reply = frames[0]
    assert reply["type"] == "subscribed" and reply["id"] == "far", reply
    assert reply["recovered"] is False, f"recovered: true for an offset past the end: {reply}"
    assert reply["epoch"] == epoch and reply["offset"] == offsets[-1], reply
    snap = await viewer.recv(SHORT)
    assert snap["type"] == "snapshot" and snap["offset"] == offsets[-1], snap
    more = await publisher.publish(thread, [custom("two")])
    frames = await until_event(viewer, thread, more[-1], "far-future resume, live")
    assert events_of(frames, thread) == [(more[0], custom("two"))]


@pytest.mark.parametrize("offset", ["\u0661-0", "1-\u0661", "\u0661\u0662\u0663-0"])
async def test_an_offset_in_other_digits_is_invalid(harness: Harness, offset: str) -> None:
    gateway = await harness.gateway()
    thread = new_thread()
    publisher = await harness.client(gateway, MSGPACK)
    await publisher.publish(thread, opening(thread))
    viewer = await harness.client(gateway, JSON)
    reply = await viewer.request(
        {"type": "subscribe", "thread": thread, "from": {"offset": offset, "epoch": None}}
    )
    assert reply["type"] == "error" and reply["code"] == "invalid_offset", reply
    assert "agui" not in reply["message"] and "{" not in reply["message"], reply
    await still_open(viewer, "after invalid_offset")
    assert (await viewer.subscribe(thread, "live"))["recovered"] is True
