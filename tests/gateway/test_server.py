"""The gateway over real WebSocket connections on 127.0.0.1 (docs/protocol.md).

Every test starts its own in-process :class:`Gateway` on a free port, talks to
it with ``websockets`` clients speaking either subprotocol, and drains it at
the end. Tests where the store matters run against the memory store and a
real Redis (the session ``redis_server``, isolated by a key prefix per test).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agui_hub.agui.reducer import fold
from agui_hub.errors import StoreError
from agui_hub.gateway import connection
from agui_hub.gateway.connection import ConnectionState
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import Retention, ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..runs import realistic_run

pytestmark = pytest.mark.timeout(60)

JSON = "agui-hub.v1.json"
MSGPACK = "agui-hub.v1.msgpack"
WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing to arrive."""
REPLIES = {"subscribed", "unsubscribed", "published", "pong", "error", "runs", "presence",
           "authenticated"}  # fmt: skip

Event = dict[str, Any]
Frame = dict[str, Any]


# -- event streams ------------------------------------------------------------------------


def text_deltas(message: str, count: int, *, start: int = 0, size: int = 0) -> list[Event]:
    pad = "x" * size
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"w{i} {pad}"}
        for i in range(start, start + count)
    ]


def folded(events: list[Event], state: Any = None) -> tuple[Any, Any]:
    """What a viewer shows after folding *events*: (messages, state)."""
    result = fold(events, state)
    return result.messages, result.state


def offset_order(a: str, b: str) -> bool:
    """Whether offset *a* comes strictly before offset *b*."""
    return tuple(map(int, a.split("-"))) < tuple(map(int, b.split("-")))


# -- clients --------------------------------------------------------------------------------


class Client:
    """A test client: encodes commands and decodes frames per its subprotocol."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.binary = ws.subprotocol == MSGPACK
        assert ws.subprotocol in (JSON, MSGPACK)
        self.pending: deque[Frame] = deque()
        """Frames read while waiting for a reply, in arrival order, returned first."""
        self._ids = itertools.count(1)

    def encode(self, frame: Any) -> bytes | str:
        if self.binary:
            return msgpack.packb(frame, use_bin_type=True)  # type: ignore[no-any-return]
        return json.dumps(frame)

    def decode(self, data: bytes | str) -> Frame:
        if self.binary:
            assert isinstance(data, bytes), "a msgpack connection got a text frame"
            frame = msgpack.unpackb(data, raw=False)
        else:
            assert isinstance(data, str), "a JSON connection got a binary frame"
            frame = json.loads(data)
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str), frame
        return frame

    async def send(self, frame: Any) -> None:
        await self.ws.send(self.encode(frame))

    async def _read(self, timeout: float) -> Frame:
        return self.decode(await asyncio.wait_for(self.ws.recv(), timeout))

    async def recv(self, timeout: float = WAIT) -> Frame:
        if self.pending:
            return self.pending.popleft()
        return await self._read(timeout)

    async def collect(
        self, until: Callable[[Frame], bool], *, limit: int = 20_000, timeout: float = WAIT
    ) -> list[Frame]:
        """Frames up to and including the first for which *until* is true."""
        deadline = time.monotonic() + timeout
        frames: list[Frame] = []
        for _ in range(limit):
            frame = await self.recv(max(0.01, deadline - time.monotonic()))
            frames.append(frame)
            if until(frame):
                return frames
        raise AssertionError(f"no matching frame within {limit} frames: last {frames[-3:]}")

    async def request(self, frame: Frame, *, timeout: float = WAIT) -> Frame:
        """Send a command and return its reply; other frames stay pending, in order."""
        command_id = frame.setdefault("id", f"c{next(self._ids)}")
        await self.send(frame)
        for i, seen in enumerate(self.pending):
            if seen.get("id") == command_id and seen["type"] in REPLIES:
                del self.pending[i]
                return seen
        deadline = time.monotonic() + timeout
        for _ in range(100_000):
            seen = await self._read(max(0.01, deadline - time.monotonic()))
            if seen.get("id") == command_id and seen["type"] in REPLIES:
                return seen
            self.pending.append(seen)
        raise AssertionError("no reply")

    async def ping(self) -> None:
        reply = await self.request({"type": "ping"})
        assert reply["type"] == "pong", reply

    async def subscribe(self, thread: str, start: Any = "live", **extra: Any) -> Frame:
        before = len(self.pending)
        reply = await self.request({"type": "subscribe", "thread": thread, "from": start, **extra})
        assert reply["type"] == "subscribed", reply
        assert reply["thread"] == thread
        # The reply comes before any frame of the subscription.
        early = list(itertools.islice(self.pending, before, None))
        assert not [f for f in early if f.get("thread") == thread], early
        return reply

    async def publish(
        self, thread: str, events: list[Event], ids: list[str] | None = None
    ) -> list[str]:
        frame: Frame = {"type": "publish", "thread": thread, "events": events}
        if ids is not None:
            frame["eventIds"] = ids
        reply = await self.request(frame)
        assert reply["type"] == "published", reply
        assert reply["thread"] == thread
        offsets = reply["offsets"]
        assert len(offsets) == len(events)
        return offsets  # type: ignore[no-any-return]

    async def publish_all(
        self, thread: str, events: list[Event], *, batch: int = 25, tag: str = ""
    ) -> list[str]:
        """Publish in batches with event ids; return every offset."""
        offsets: list[str] = []
        tag = tag or uuid.uuid4().hex[:8]
        for i in range(0, len(events), batch):
            chunk = events[i : i + batch]
            ids = [f"{tag}-{i + j}" for j in range(len(chunk))]
            offsets += await self.publish(thread, chunk, ids)
        return offsets

    async def until_offset(self, thread: str, offset: str, **kwargs: Any) -> list[Frame]:
        """Every frame up to the event frame of *thread* at *offset*."""
        return await self.collect(
            lambda f: f["type"] == "event" and f["thread"] == thread and f["offset"] == offset,
            **kwargs,
        )

    async def closed_code(self, timeout: float = WAIT) -> int | None:
        """Read until the server closes the connection; its close code."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ConnectionClosed):
            for _ in range(1_000_000):
                await self._read(max(0.01, deadline - time.monotonic()))
        assert self.ws.close_code is not None, "the connection is still open"
        return self.ws.close_code

    async def close(self) -> None:
        """Close, reading what still arrives meanwhile (a paused reader cannot close)."""

        async def discard() -> None:
            with contextlib.suppress(Exception):
                for _ in range(1_000_000):
                    await self.ws.recv()

        reader = asyncio.create_task(discard())
        try:
            await asyncio.wait_for(self.ws.close(), 3)
        except Exception:
            self.ws.transport.abort()
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader


def events_of(frames: list[Frame], thread: str | None = None) -> list[tuple[str, Event]]:
    return [
        (f["offset"], f["event"])
        for f in frames
        if f["type"] == "event" and (thread is None or f["thread"] == thread)
    ]


def only(frames: list[Frame], kind: str) -> list[Frame]:
    return [f for f in frames if f["type"] == kind]


def url(gateway: Gateway, path: str = "/") -> str:
    return f"ws://127.0.0.1:{gateway.config.port}{path}"


class Harness:
    """Gateways and clients of one test, all torn down at its end."""

    def __init__(self, store_factory: Callable[..., ThreadStore]) -> None:
        self.store_factory = store_factory
        self.gateways: list[Gateway] = []
        self.clients: list[Client] = []

    async def gateway(
        self, store: ThreadStore | None = None, retention: Retention | None = None, **config: Any
    ) -> Gateway:
        config.setdefault("ping_interval", None)
        if store is None:
            store = self.store_factory(retention=retention)
        gateway = Gateway(GatewayConfig(host="127.0.0.1", port=0, **config), store=store)
        await gateway.start()
        self.gateways.append(gateway)
        return gateway

    def shared_store(self, gateway: Gateway) -> ThreadStore:
        """Another handle on *gateway*'s store, for a second gateway (the same one in memory)."""
        if isinstance(gateway.store, MemoryStore):
            return gateway.store
        return self.store_factory(retention=gateway.store.retention)

    async def client(self, gateway: Gateway, protocol: str = JSON, **kwargs: Any) -> Client:
        ws = await connect(
            url(gateway),
            subprotocols=[protocol],  # type: ignore[list-item]
            proxy=None,
            open_timeout=WAIT,
            close_timeout=2,
            **kwargs,
        )
        client = Client(ws)
        self.clients.append(client)
        return client

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients))
        for gateway in self.gateways:
            if not gateway._draining:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(gateway.drain(), 15)


def memory_store(retention: Retention | None = None) -> ThreadStore:
    return MemoryStore(retention=retention)


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> Callable[..., ThreadStore]:
    """Makes the store a gateway runs on: memory, or Redis under a prefix of this test."""
    if request.param == "memory":
        return memory_store
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-server-{uuid.uuid4().hex}"

    def redis_store(retention: Retention | None = None) -> ThreadStore:
        return RedisStore(server.url, prefix=prefix, retention=retention)

    return redis_store


@pytest.fixture
async def harness(store_factory: Callable[..., ThreadStore]) -> AsyncIterator[Harness]:
    h = Harness(store_factory)
    try:
        yield h
    finally:
        await h.close()


@pytest.fixture
async def mem() -> AsyncIterator[Harness]:
    """A harness on the memory store only (for what does not depend on the store)."""
    h = Harness(memory_store)
    try:
        yield h
    finally:
        await h.close()


# -- 1. fan-out -----------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False], ids=["batched-writes", "one-send-per-frame"])
async def test_viewers_receive_identical_sequences(
    harness: Harness, batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ways a connection writes its frames: in batches, and the fallback
    # for a websockets without the calls the batches need.
    monkeypatch.setattr(connection, "_BATCHED_WRITES", batched)
    gateway = await harness.gateway()
    thread = "fan-out"
    viewers = [
        await harness.client(gateway, protocol) for protocol in (JSON, MSGPACK, JSON, MSGPACK, JSON)
    ]
    for viewer in viewers:
        reply = await viewer.subscribe(thread, "live")
        assert (reply["epoch"], reply["offset"], reply["recovered"]) == (None, "0-0", True)
    publisher = await harness.client(gateway, MSGPACK)
    events = realistic_run(thread, "run-1")
    assert 280 <= len(events) <= 320
    offsets = await publisher.publish_all(thread, events)
    assert len(set(offsets)) == len(offsets)

    expected = list(zip(offsets, events, strict=True))
    received = []
    for viewer in viewers:
        frames = await viewer.until_offset(thread, offsets[-1])
        # The thread did not exist: its first event announced the epoch first.
        assert frames[0]["type"] == "subscribed" and frames[0]["epoch"]
        assert frames[0]["recovered"] is True
        assert all(f["type"] == "event" for f in frames[1:])
        received.append((frames[0]["epoch"], events_of(frames)))
    for epoch, got in received:
        assert epoch == received[0][0]
        assert got == expected  # same offsets, same events, as published


async def test_publishers_and_viewers_on_two_threads_do_not_mix(mem: Harness) -> None:
    gateway = await mem.gateway()
    viewer = await mem.client(gateway, MSGPACK)
    await viewer.subscribe("a")
    await viewer.subscribe("b")
    pub_a, pub_b = await mem.client(gateway), await mem.client(gateway, MSGPACK)
    run_a, run_b = realistic_run("a", "ra", turns=2), realistic_run("b", "rb", turns=2)
    offsets_a, offsets_b = await asyncio.gather(
        pub_a.publish_all("a", run_a, batch=7), pub_b.publish_all("b", run_b, batch=5)
    )
    got: dict[str, list[tuple[str, Event]]] = {"a": [], "b": []}
    done: set[str] = set()
    for _ in range(len(run_a) + len(run_b) + 10):
        frame = await viewer.recv()
        if frame["type"] == "event":
            got[frame["thread"]].append((frame["offset"], frame["event"]))
            if frame["offset"] == {"a": offsets_a, "b": offsets_b}[frame["thread"]][-1]:
                done.add(frame["thread"])
        if done == {"a", "b"}:
            break
    assert got["a"] == list(zip(offsets_a, run_a, strict=True))
    assert got["b"] == list(zip(offsets_b, run_b, strict=True))


# -- 2. subscribe modes ----------------------------------------------------------------------


async def test_subscribe_modes(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "modes"
    publisher = await harness.client(gateway)
    history = realistic_run(thread, "r1", turns=2)
    offsets = await publisher.publish_all(thread, history)
    epoch = (await publisher.subscribe(thread))["epoch"]
    assert isinstance(epoch, str) and epoch
    last = offsets[-1]

    clients = {
        mode: await harness.client(gateway, protocol)
        for mode, protocol in [
            ("live", JSON),
            ("start", MSGPACK),
            ("snapshot", JSON),
            ("resume", MSGPACK),
            ("resume-at-end", JSON),
        ]
    }
    replies = {
        "live": await clients["live"].subscribe(thread, "live"),
        "start": await clients["start"].subscribe(thread, "start"),
        "snapshot": await clients["snapshot"].subscribe(thread, "snapshot"),
        "resume": await clients["resume"].subscribe(
            thread, {"offset": offsets[49], "epoch": epoch}
        ),
        "resume-at-end": await clients["resume-at-end"].subscribe(
            thread, {"offset": last, "epoch": epoch}
        ),
    }
    for reply in replies.values():
        assert (reply["epoch"], reply["offset"], reply["recovered"]) == (epoch, last, True)

    # The live tail: a second run.
    tail = realistic_run(thread, "r2", turns=1)
    tail_offsets = await publisher.publish_all(thread, tail)
    expected_tail = list(zip(tail_offsets, tail, strict=True))
    everything = list(zip(offsets + tail_offsets, history + tail, strict=True))

    frames = {mode: await c.until_offset(thread, tail_offsets[-1]) for mode, c in clients.items()}
    assert events_of(frames["live"]) == expected_tail
    assert events_of(frames["resume-at-end"]) == expected_tail
    assert events_of(frames["start"]) == everything
    assert events_of(frames["resume"]) == everything[50:]  # exactly after the offset
    for mode in ("live", "start", "resume", "resume-at-end"):
        assert [f["type"] for f in frames[mode]] == ["event"] * len(frames[mode])

    snap, *rest = frames["snapshot"]
    assert snap["type"] == "snapshot"
    assert (snap["thread"], snap["offset"], snap["epoch"], snap["complete"]) == (
        thread,
        last,
        epoch,
        True,
    )
    assert len(snap["events"]) < 10  # compact: not every delta
    assert events_of(rest) == expected_tail
    assert folded(snap["events"]) == folded(history)
    assert folded([e for _, e in events_of(rest)], fold(snap["events"])) == folded(history + tail)


async def test_subscriber_before_the_thread_exists_gets_the_epoch(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "not-yet"
    early = {mode: await harness.client(gateway, MSGPACK) for mode in ("live", "start", "snap")}
    for mode, start in [("live", "live"), ("start", "start"), ("snap", "snapshot")]:
        reply = await early[mode].subscribe(thread, start)
        assert (reply["epoch"], reply["offset"], reply["recovered"]) == (None, "0-0", True)
    assert (await early["snap"].recv())["type"] == "snapshot"  # of nothing yet

    publisher = await harness.client(gateway)
    events = realistic_run(thread, "r1", turns=1)
    offsets = await publisher.publish_all(thread, events, batch=10)
    epoch = (await publisher.subscribe(thread, "live"))["epoch"]
    for client in early.values():
        frames = await client.until_offset(thread, offsets[-1])
        announce, *rest = frames
        assert announce["type"] == "subscribed"
        assert (announce["thread"], announce["epoch"], announce["recovered"]) == (
            thread,
            epoch,
            True,
        )
        assert "id" not in announce  # not a reply to a command
        assert events_of(rest) == list(zip(offsets, events, strict=True))
        assert len(rest) == len(events)


async def test_run_filter(mem: Harness) -> None:
    gateway = await mem.gateway()
    thread = "runs"
    publisher = await mem.client(gateway)
    run1 = realistic_run(thread, "r1", turns=1)
    offsets1 = await publisher.publish_all(thread, run1)
    viewer = await mem.client(gateway)
    await viewer.subscribe(thread, "start", run="r2")
    reference = await mem.client(gateway, MSGPACK)
    await reference.subscribe(thread, "live", run="r3")
    run2 = realistic_run(thread, "r2", turns=1)
    offsets2 = await publisher.publish_all(thread, run2)
    run3 = realistic_run(thread, "r3", turns=1)
    offsets3 = await publisher.publish_all(thread, run3)
    frames = await viewer.until_offset(thread, offsets2[-1])
    assert events_of(frames) == list(zip(offsets2, run2, strict=True))  # not run 1
    frames = await reference.until_offset(thread, offsets3[-1])
    assert events_of(frames) == list(zip(offsets3, run3, strict=True))  # not run 2
    assert offset_order(offsets1[-1], offsets2[0])
    # Run 3 reached every subscriber by now: nothing of it came to the "r2" viewer.
    await viewer.ping()
    assert not viewer.pending


# -- 3. trimmed offsets, other epochs: snapshots --------------------------------------------


async def test_trimmed_offset_gets_a_complete_snapshot(harness: Harness) -> None:
    gateway = await harness.gateway(retention=Retention(max_len=60))
    thread = "trimmed"
    # A viewer from before the first event keeps the thread's channel folding
    # everything: the snapshot is complete although the store trimmed.
    keeper = await harness.client(gateway, MSGPACK)
    await keeper.subscribe(thread, "live")
    publisher = await harness.client(gateway)
    events = realistic_run(thread, "r1", turns=4)
    head, tail = events[:-30], events[-30:]
    offsets: list[str] = []
    for i in range(0, len(head), 20):
        offsets += await publisher.publish_all(thread, head[i : i + 20], tag=f"h{i}")
        await keeper.until_offset(thread, offsets[-1])  # stay well within max_len
    epoch = (await publisher.subscribe(thread))["epoch"]

    late = await harness.client(gateway)
    reply = await late.subscribe(thread, {"offset": offsets[10], "epoch": epoch})
    assert (reply["epoch"], reply["offset"], reply["recovered"]) == (epoch, offsets[-1], False)
    snap = await late.recv()
    assert snap["type"] == "snapshot"
    assert (snap["offset"], snap["epoch"], snap["complete"]) == (offsets[-1], epoch, True)
    assert folded(snap["events"]) == folded(head)

    tail_offsets = await publisher.publish_all(thread, tail, tag="tail")
    frames = await late.until_offset(thread, tail_offsets[-1])
    assert events_of(frames) == list(zip(tail_offsets, tail, strict=True))
    assert folded(tail, fold(snap["events"])) == folded(events)

    # "start" when the beginning was trimmed: a snapshot too, never a partial replay.
    again = await harness.client(gateway, MSGPACK)
    reply = await again.subscribe(thread, "start")
    assert reply["recovered"] is False
    snap = await again.recv()
    assert snap["type"] == "snapshot" and snap["complete"] is True
    assert folded(snap["events"]) == folded(events)


async def test_wrong_epoch_gets_a_snapshot(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "epochs"
    publisher = await harness.client(gateway)
    events = realistic_run(thread, "r1", turns=3)
    head, tail = events[:100], events[100:]
    offsets = await publisher.publish_all(thread, head)
    epoch = (await publisher.subscribe(thread))["epoch"]
    other = "0" * 16 if epoch != "0" * 16 else "1" * 16

    viewers = []
    for start in (
        {"offset": offsets[5], "epoch": other},
        {"offset": "0-0", "epoch": other},
    ):
        viewer = await harness.client(gateway, MSGPACK)
        reply = await viewer.subscribe(thread, start)
        assert (reply["epoch"], reply["offset"], reply["recovered"]) == (epoch, offsets[-1], False)
        snap = await viewer.recv()
        assert snap["type"] == "snapshot"
        assert (snap["offset"], snap["epoch"], snap["complete"]) == (offsets[-1], epoch, True)
        assert folded(snap["events"]) == folded(head)
        viewers.append((viewer, snap))

    tail_offsets = await publisher.publish_all(thread, tail)
    for viewer, snap in viewers:
        frames = await viewer.until_offset(thread, tail_offsets[-1])
        assert events_of(frames) == list(zip(tail_offsets, tail, strict=True))
        assert folded(tail, fold(snap["events"])) == folded(events)


async def test_an_offset_without_epoch_is_taken_in_the_current_epoch(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "typed-offset"
    publisher = await harness.client(gateway)
    events = realistic_run(thread, "r1", turns=2)
    offsets = await publisher.publish_all(thread, events)
    epoch = (await publisher.subscribe(thread))["epoch"]
    for start in ({"offset": offsets[5]}, {"offset": offsets[5], "epoch": None}):
        viewer = await harness.client(gateway, MSGPACK)
        reply = await viewer.subscribe(thread, start)
        assert (reply["epoch"], reply["offset"], reply["recovered"]) == (epoch, offsets[-1], True)
        frames = await viewer.until_offset(thread, offsets[-1])
        assert events_of(frames) == list(zip(offsets[6:], events[6:], strict=True))


async def test_snapshot_is_incomplete_when_trimmed_before_folding(harness: Harness) -> None:
    max_len = 60
    gateway = await harness.gateway(retention=Retention(max_len=max_len))
    thread = "incomplete"
    publisher = await harness.client(gateway)
    events = realistic_run(thread, "r1", turns=3)
    head, tail = events[:-20], events[-20:]
    offsets = await publisher.publish_all(thread, head, batch=20)
    stored = head[-max_len:]  # nobody watched: only the newest events were ever folded

    snapshot_viewer = await harness.client(gateway)
    reply = await snapshot_viewer.subscribe(thread, "snapshot")
    epoch = reply["epoch"]
    assert (reply["offset"], reply["recovered"]) == (offsets[-1], True)
    snap = await snapshot_viewer.recv()
    assert snap["type"] == "snapshot"
    assert (snap["offset"], snap["epoch"], snap["complete"]) == (offsets[-1], epoch, False)
    # The snapshot reflects what is still stored, not the trimmed beginning.
    assert folded(snap["events"]) == folded(stored)
    assert folded(snap["events"]) != folded(head)

    resumer = await harness.client(gateway, MSGPACK)
    reply = await resumer.subscribe(thread, {"offset": offsets[0], "epoch": epoch})
    assert reply["recovered"] is False
    snap2 = await resumer.recv()
    assert snap2["type"] == "snapshot" and snap2["complete"] is False
    assert folded(snap2["events"]) == folded(stored)

    tail_offsets = await publisher.publish_all(thread, tail, batch=20)
    for viewer, s in ((snapshot_viewer, snap), (resumer, snap2)):
        frames = await viewer.until_offset(thread, tail_offsets[-1])
        assert events_of(frames) == list(zip(tail_offsets, tail, strict=True))
        assert folded(tail, fold(s["events"])) == folded(stored + tail)


# -- 4. late joiners of long threads --------------------------------------------------------


async def test_late_joiner_gets_a_small_snapshot_then_live(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "long"
    publisher = await harness.client(gateway, MSGPACK)
    start = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"tokens": 0}},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
    ]
    deltas = text_deltas("m1", 3000)
    history = start + deltas
    offsets = await publisher.publish_all(thread, history, batch=500)

    late = await harness.client(gateway)
    reply = await late.subscribe(thread, "snapshot")
    assert (reply["offset"], reply["recovered"]) == (offsets[-1], True)
    snap = await late.recv()
    assert snap["type"] == "snapshot" and snap["complete"] is True
    assert snap["offset"] == offsets[-1]
    kinds = [e["type"] for e in snap["events"]]
    assert kinds == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT", "TEXT_MESSAGE_START"]
    (message,) = snap["events"][1]["messages"]
    assert message["content"] == "".join(e["delta"] for e in deltas)

    live = [
        *text_deltas("m1", 5, start=3000),
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/tokens", "value": 3005}]},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]
    live_offsets = await publisher.publish(thread, live)
    frames = await late.until_offset(thread, live_offsets[-1])
    assert events_of(frames) == list(zip(live_offsets, live, strict=True))
    assert folded(live, fold(snap["events"])) == folded(history + live)


# -- 5. publish ------------------------------------------------------------------------------


async def check_nothing_stored(
    harness: Harness, gateway: Gateway, thread: str, offsets: list[str], events: list[Event]
) -> None:
    """A fresh "from start" subscriber sees exactly *events* at *offsets*."""
    checker = await harness.client(gateway, MSGPACK)
    await checker.subscribe(thread, "start")
    frames = await checker.until_offset(thread, offsets[-1])
    assert events_of(frames) == list(zip(offsets, events, strict=True))
    await checker.ping()
    assert not checker.pending  # and nothing after them


async def test_publish_acknowledges_with_offsets(harness: Harness) -> None:
    gateway = await harness.gateway()
    client = await harness.client(gateway)
    events = realistic_run("ack", "r1", turns=1)
    reply = await client.request(
        {"type": "publish", "id": "p-1", "thread": "ack", "events": events[:12]}
    )
    assert reply["type"] == "published" and reply["id"] == "p-1" and reply["thread"] == "ack"
    offsets = reply["offsets"]
    assert len(offsets) == 12 and len(set(offsets)) == 12
    keys = [tuple(int(p) for p in o.split("-")) for o in offsets]
    assert keys == sorted(keys)
    more = await client.request(
        {"type": "publish", "id": 2, "thread": "ack", "events": [events[12]]}
    )
    assert (more["type"], more["id"], len(more["offsets"])) == ("published", 2, 1)
    assert offset_order(offsets[-1], more["offsets"][0])
    # Without an id, the reply has none.
    await client.send({"type": "publish", "thread": "ack", "events": [events[13]]})
    reply = await client.recv()
    assert reply["type"] == "published" and "id" not in reply


async def test_invalid_event_is_rejected_and_nothing_stored(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "invalid"
    viewer = await harness.client(gateway)
    await viewer.subscribe(thread)
    client = await harness.client(gateway, MSGPACK)
    good = realistic_run(thread, "r1", turns=1)
    offsets = await client.publish(thread, good[:3])
    await viewer.until_offset(thread, offsets[-1])

    for bad_batch in (
        [{"type": "NOT_AN_EVENT"}],
        [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "r1-m0"}],  # no delta
        [{"type": "TEXT_MESSAGE_CONTENT", "messageId": 5, "delta": "x"}],
        [good[3], {"messageId": "r1-m0", "delta": "x"}],  # one bad event spoils the batch
        ["not an object"],
    ):
        reply = await client.request(
            {"type": "publish", "id": 9, "thread": thread, "events": bad_batch}
        )
        assert reply["type"] == "error", reply
        assert (reply["code"], reply["id"], reply["thread"]) == ("invalid_event", 9, thread)
        assert reply["message"]
        assert reply["index"] == len(bad_batch) - 1  # the last event of each is at fault
    more = await client.publish(thread, good[3:6])
    frames = await viewer.until_offset(thread, more[-1])
    assert events_of(frames) == list(zip(more, good[3:6], strict=True))
    await check_nothing_stored(harness, gateway, thread, offsets + more, good[:6])


async def test_sequence_error_stores_nothing_of_the_batch(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "sequence"
    viewer = await harness.client(gateway, MSGPACK)
    await viewer.subscribe(thread)
    client = await harness.client(gateway)

    # The first event of a thread must start a run.
    reply = await client.request(
        {"type": "publish", "id": 1, "thread": thread, "events": text_deltas("m", 1)}
    )
    assert (reply["type"], reply["code"], reply["id"], reply["thread"]) == (
        "error",
        "sequence_error",
        1,
        thread,
    )
    assert "run_not_started" in reply["message"]

    good = realistic_run(thread, "r1", turns=1)
    offsets = await client.publish(thread, good[:4])
    # A batch whose third event breaks the rules: none of it is stored.
    batch = [*good[4:6], {"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"}]
    reply = await client.request(
        {
            "type": "publish",
            "id": "b",
            "thread": thread,
            "events": batch,
            "eventIds": ["x1", "x2", "x3"],
        }
    )
    assert (reply["type"], reply["code"], reply["id"]) == ("error", "sequence_error", "b")
    assert "message_not_open" in reply["message"]
    assert reply["index"] == 2  # the third event is at fault
    # RUN_FINISHED with a message open.
    reply = await client.request(
        {"type": "publish", "id": "f", "thread": thread, "events": [good[-1]]}
    )
    assert (reply["code"], reply["id"]) == ("sequence_error", "f")
    assert "run_finished_with_open_items" in reply["message"]

    # The producer carries on from where it was (the rejected events changed nothing),
    # and the ids of the rejected batch were not taken.
    more = await client.publish(thread, good[4:6], ["x1", "x2"])
    frames = await viewer.until_offset(thread, more[-1])
    assert events_of(frames) == list(zip(offsets + more, good[:6], strict=True))
    await check_nothing_stored(harness, gateway, thread, offsets + more, good[:6])


async def test_event_ids_make_publishing_idempotent(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "idempotent"
    viewer = await harness.client(gateway, MSGPACK)
    await viewer.subscribe(thread)
    client = await harness.client(gateway)
    first = await client.publish(
        thread,
        [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
            {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        ],
        ["e0", "e1"],
    )
    deltas = text_deltas("m1", 5)
    ids = [f"d{i}" for i in range(5)]
    offsets = await client.publish(thread, deltas, ids)
    # Retried (the producer did not see the ack): same offsets, nothing stored twice.
    assert await client.publish(thread, deltas, ids) == offsets
    assert await client.publish(thread, deltas[2:4], ids[2:4]) == offsets[2:4]
    end = [{"type": "TEXT_MESSAGE_END", "messageId": "m1"}]
    last = await client.publish(thread, end, ["e-end"])
    frames = await viewer.until_offset(thread, last[-1])
    all_offsets = first + offsets + last
    assert [o for o, _ in events_of(frames)] == all_offsets  # no duplicates for viewers
    await check_nothing_stored(
        harness,
        gateway,
        thread,
        all_offsets,
        [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
            {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
            *deltas,
            *end,
        ],
    )


async def test_retrying_a_batch_that_opens_things_returns_the_same_offsets(
    harness: Harness,
) -> None:
    # A retry is answered from the ids, not judged again by the sequence rules
    # (RUN_STARTED twice would otherwise be run_already_active).
    gateway = await harness.gateway()
    thread = "retry"
    viewer = await harness.client(gateway, MSGPACK)
    await viewer.subscribe(thread)
    client = await harness.client(gateway)
    batch = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "hi"},
    ]
    ids = ["a1", "a2", "a3"]
    offsets = await client.publish(thread, batch, ids)
    reply = await client.request(
        {"type": "publish", "id": "again", "thread": thread, "events": batch, "eventIds": ids}
    )
    assert reply == {"type": "published", "id": "again", "thread": thread, "offsets": offsets}
    # Half retried, half new: the known ids keep their offsets, the new ones are stored.
    end = [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]
    mixed = await client.publish(thread, [batch[2], *end], ["a3", "a4", "a5"])
    assert mixed[0] == offsets[2]
    assert offset_order(offsets[2], mixed[1]) and offset_order(mixed[1], mixed[2])
    frames = await viewer.until_offset(thread, mixed[-1])
    assert events_of(frames) == list(zip([*offsets, *mixed[1:]], [*batch, *end], strict=True))
    await check_nothing_stored(harness, gateway, thread, [*offsets, *mixed[1:]], [*batch, *end])


# -- 6. bad input ---------------------------------------------------------------------------

JSON_BAD_FRAMES: list[tuple[bytes | str, str, Any]] = [
    (b'{"type": "ping", "id": 1}', "bad_frame", None),  # binary on a JSON connection
    ("not json", "bad_frame", None),
    ('{"type": "ping", "id": 1', "bad_frame", None),
    ("[1, 2]", "bad_frame", None),
    ('"ping"', "bad_frame", None),
    ('{"type": "subscribe"}', "bad_command", None),
    ('{"type": "frobnicate", "id": 11}', "unknown_command", 11),
    ('{"id": 12}', "bad_command", 12),
    ('{"type": "subscribe", "id": 13}', "bad_command", 13),
    ('{"type": "subscribe", "id": 14, "thread": 5}', "bad_command", 14),
    ('{"type": "subscribe", "id": 15, "thread": "t", "from": "later"}', "bad_command", 15),
    (
        '{"type": "subscribe", "id": 16, "thread": "t", "from": {"offset": "x"}}',
        "invalid_offset",
        16,
    ),
    ('{"type": "publish", "id": 17, "thread": "t"}', "bad_command", 17),
    ('{"type": "publish", "id": 18, "thread": "t", "events": []}', "bad_command", 18),
    ('{"type": "unsubscribe", "id": "u"}', "bad_command", "u"),
    ('{"type": "ping", "id": 1.5}', "bad_command", None),
]

MSGPACK_BAD_FRAMES: list[tuple[bytes | str, str, Any]] = [
    ('{"type": "ping", "id": 1}', "bad_frame", None),  # text on a msgpack connection
    (b"\xc1", "bad_frame", None),
    (b"\x82\xa4type", "bad_frame", None),
    (msgpack.packb([1, 2]), "bad_frame", None),
    (msgpack.packb({"type": "ping", "id": b"bin"}, use_bin_type=True), "bad_frame", None),
    (msgpack.packb({"type": "frobnicate", "id": 21}), "unknown_command", 21),
    (msgpack.packb({"id": 22}), "bad_command", 22),
    (msgpack.packb({"type": "subscribe", "id": 23, "thread": ""}), "bad_command", 23),
    (msgpack.packb({"type": "publish", "id": 24, "thread": "t", "events": {}}), "bad_command", 24),
    (
        msgpack.packb({"type": "subscribe", "id": 25, "thread": "t", "from": {"offset": 1}}),
        "invalid_offset",
        25,
    ),
]


@pytest.mark.parametrize(
    ("protocol", "cases"), [(JSON, JSON_BAD_FRAMES), (MSGPACK, MSGPACK_BAD_FRAMES)]
)
async def test_bad_input_gets_error_frames_and_the_connection_stays(
    mem: Harness, protocol: str, cases: list[tuple[bytes | str, str, Any]]
) -> None:
    gateway = await mem.gateway()
    client = await mem.client(gateway, protocol)
    for data, code, command_id in cases:
        await client.ws.send(data)
        frame = await client.recv()
        assert frame["type"] == "error", (data, frame)
        assert frame["code"] == code, (data, frame)
        assert frame.get("id") == command_id, (data, frame)
        assert isinstance(frame["message"], str) and frame["message"]
        await client.ping()  # still working
    assert client.ws.close_code is None


@pytest.mark.parametrize(
    "data",
    [
        '{"type": "ping", "id": "\\ud800"}',
        '{"type": "subscribe", "id": 1, "thread": "t\\ud800"}',
        '{"type": "publish", "id": 2, "thread": "s", "events": [{"type": "RUN_STARTED", '
        '"threadId": "s", "runId": "\\udfff"}]}',
    ],
    ids=["ping-id", "subscribe-thread", "publish-event"],
)
async def test_lone_surrogates_get_an_error_frame(mem: Harness, data: str) -> None:
    gateway = await mem.gateway()
    client = await mem.client(gateway, JSON)
    await client.ws.send(data)
    with contextlib.suppress(TimeoutError):
        frame = await client.recv(timeout=2)
        assert frame["type"] == "error"
        assert frame["code"] in {"bad_frame", "bad_command", "invalid_event"}
    await client.ping()


@pytest.mark.parametrize("offset", ["1-0\n", "1-99999999999999999999"])
async def test_resume_offset_that_is_not_a_stream_id_on_redis(
    redis_server: RedisServer, offset: str
) -> None:
    h = Harness(lambda retention=None: RedisStore(redis_server.url, prefix=uuid.uuid4().hex))
    try:
        gateway = await h.gateway()
        client = await h.client(gateway)
        await client.publish("t", [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}])
        epoch = (await client.subscribe("t"))["epoch"]
        reply = await client.request(
            {
                "type": "subscribe",
                "id": 5,
                "thread": "t",
                "from": {"offset": offset, "epoch": epoch},
            }
        )
        assert reply["type"] == "error"
        assert (reply["code"], reply["id"]) == ("invalid_offset", 5)
    finally:
        await h.close()


async def test_oversize_frame_closes_only_that_connection(mem: Harness) -> None:
    gateway = await mem.gateway(max_frame_bytes=4096)
    other = await mem.client(gateway, MSGPACK)
    await other.subscribe("big")
    big = await mem.client(gateway)
    await big.ping()
    # Over max_frame_bytes: an error frame, and the connection stays.
    await big.ws.send(json.dumps({"type": "ping", "id": "p", "pad": "x" * 10_000}))
    reply = await big.recv()
    assert (reply["type"], reply["code"]) == ("error", "payload_too_large")
    await big.ping()
    # Over the WebSocket limit (4 x max_frame_bytes): closed with 1009.
    await big.ws.send(json.dumps({"type": "ping", "pad": "x" * (4 * 4096 + 1)}))
    assert await big.closed_code() == 1009
    # The other connection is untouched.
    await other.ping()
    publisher = await mem.client(gateway)
    offsets = await publisher.publish(
        "big", [{"type": "RUN_STARTED", "threadId": "big", "runId": "r"}]
    )
    frames = await other.until_offset("big", offsets[-1])
    assert len(events_of(frames)) == 1
    # A frame just under the limit is fine.
    ok = await mem.client(gateway, MSGPACK)
    await ok.ws.send(msgpack.packb({"type": "ping", "id": 1, "pad": "x" * 3000}))
    assert await ok.recv() == {"type": "pong", "id": 1}


async def test_hundreds_of_subscriptions_on_one_connection(harness: Harness) -> None:
    limit = 300
    gateway = await harness.gateway(max_subscriptions=limit)
    client = await harness.client(gateway, MSGPACK)
    threads = [f"many-{i}" for i in range(limit)]
    # Pipelined: all commands first, then the replies (about different
    # threads, so in any order: matched by id).
    for i, thread in enumerate(threads):
        await client.send({"type": "subscribe", "id": i, "thread": thread})
    replies = {}
    for _ in threads:
        reply = await client.recv()
        assert reply["type"] == "subscribed"
        replies[reply["id"]] = reply["thread"]
    assert replies == dict(enumerate(threads))

    reply = await client.request({"type": "subscribe", "id": "one-more", "thread": "many-x"})
    assert reply["type"] == "error"
    assert (reply["code"], reply["id"], reply["thread"]) == (
        "too_many_subscriptions",
        "one-more",
        "many-x",
    )
    # Subscribing again to a thread it has is a restart, not one more.
    again = await client.subscribe(threads[7], "live")
    assert again["recovered"] is True

    publisher = await harness.client(gateway)
    picked = [threads[0], threads[7], threads[150], threads[-1]]
    offsets = {
        t: (await publisher.publish(t, [{"type": "RUN_STARTED", "threadId": t, "runId": "r"}]))[0]
        for t in picked
    }
    seen: dict[str, str] = {}
    for _ in range(4 * len(picked)):
        frame = await client.recv()
        if frame["type"] == "event":
            seen[frame["thread"]] = frame["offset"]
        if len(seen) == len(picked):
            break
    assert seen == offsets

    # Unsubscribing frees a place.
    reply = await client.request({"type": "unsubscribe", "id": "u", "thread": threads[3]})
    assert reply == {"type": "unsubscribed", "id": "u", "thread": threads[3]}
    await client.subscribe("many-x")


async def test_unsubscribe(harness: Harness) -> None:
    gateway = await harness.gateway()
    client = await harness.client(gateway)
    reply = await client.request({"type": "unsubscribe", "id": 1, "thread": "never"})
    assert reply["type"] == "error"
    assert (reply["code"], reply["id"], reply["thread"]) == ("not_subscribed", 1, "never")

    await client.subscribe("a")
    await client.subscribe("b")
    reply = await client.request({"type": "unsubscribe", "id": 2, "thread": "a"})
    assert reply == {"type": "unsubscribed", "id": 2, "thread": "a"}
    reply = await client.request({"type": "unsubscribe", "id": 3, "thread": "a"})
    assert (reply["code"], reply["id"]) == ("not_subscribed", 3)

    publisher = await harness.client(gateway, MSGPACK)
    await publisher.publish("a", [{"type": "RUN_STARTED", "threadId": "a", "runId": "r"}])
    offsets = await publisher.publish("b", [{"type": "RUN_STARTED", "threadId": "b", "runId": "r"}])
    frames = await client.until_offset("b", offsets[-1])
    assert not [f for f in frames if f.get("thread") == "a"]  # nothing of "a" any more
    await client.ping()
    assert not client.pending


# -- 7. HTTP: handshake, health, readiness --------------------------------------------------


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        body = await asyncio.wait_for(reader.readexactly(length), WAIT)
        return status, body.decode()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@pytest.mark.parametrize("offered", [None, ["chat"], ["agui-hub.v2.json"]])
async def test_a_client_without_our_subprotocol_is_refused(
    mem: Harness, offered: list[str] | None
) -> None:
    gateway = await mem.gateway()
    with pytest.raises(InvalidStatus) as info:
        await connect(url(gateway), subprotocols=offered, proxy=None, open_timeout=WAIT)  # type: ignore[arg-type]
    response = info.value.response
    assert response.status_code == 400
    body = response.body.decode()
    assert "agui-hub.v1.json" in body and "agui-hub.v1.msgpack" in body


@pytest.mark.parametrize(
    ("offered", "chosen"),
    [
        ([JSON, MSGPACK], JSON),
        ([MSGPACK, JSON], MSGPACK),
        (["chat", MSGPACK], MSGPACK),
        (["chat", JSON, "other"], JSON),
    ],
)
async def test_subprotocol_is_the_first_supported_in_the_clients_order(
    mem: Harness, offered: list[str], chosen: str
) -> None:
    gateway = await mem.gateway()
    ws = await connect(url(gateway), subprotocols=offered, proxy=None, open_timeout=WAIT)  # type: ignore[arg-type]
    client = Client(ws)
    mem.clients.append(client)
    assert ws.subprotocol == chosen
    await client.ping()


async def test_healthz_and_readyz(mem: Harness) -> None:
    gateway = await mem.gateway()
    assert await http_get(gateway.config.port, "/healthz") == (200, "ok\n")
    status, body = await http_get(gateway.config.port, "/readyz")
    assert (status, body.strip()) == (200, "ready")
    assert (await http_get(gateway.config.port, "/healthz?probe=1"))[0] == 200


async def test_readyz_reports_redis_down(own_redis: RedisServer) -> None:
    h = Harness(lambda retention=None: RedisStore(own_redis.url, prefix="readyz"))
    try:
        gateway = await h.gateway()
        assert (await http_get(gateway.config.port, "/readyz"))[0] == 200
        own_redis.stop()
        status, body = await http_get(gateway.config.port, "/readyz")
        assert status == 503
        assert "store unavailable" in body
        assert (await http_get(gateway.config.port, "/healthz"))[0] == 200  # still alive
        own_redis.start()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if (await http_get(gateway.config.port, "/readyz"))[0] == 200:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("not ready again after Redis came back")
    finally:
        await h.close()


async def test_store_durability_warnings_in_readyz_and_the_durable_flag(
    own_redis: RedisServer,
) -> None:
    # The test Redis persists nothing (appendonly no, save ""): warned, served.
    h = Harness(lambda retention=None: RedisStore(own_redis.url, prefix="durable"))
    try:
        gateway = await h.gateway()
        status, body = await http_get(gateway.config.port, "/readyz")
        assert status == 200
        assert body.startswith("ready\n") and "warning: " in body and "appendonly" in body
    finally:
        await h.close()
    # Refused with --require-durable-store, until the settings are fixed.
    strict = Gateway(
        GatewayConfig(port=0, require_durable_store=True),
        store=RedisStore(own_redis.url, prefix="durable"),
    )
    with pytest.raises(StoreError, match="appendonly"):
        await strict.start()
    await strict.store.close()


# -- 8. slow consumers --------------------------------------------------------------------


async def test_slow_consumer_catches_up_from_the_store_without_loss(harness: Harness) -> None:
    bound = 256 * 1024
    gateway = await harness.gateway(send_queue_bytes=bound)
    thread = "slow"
    fast = await harness.client(gateway, MSGPACK)
    await fast.subscribe(thread)

    # The slow client: a tiny receive window and a client queue of one frame,
    # so that what it does not read piles up in the gateway's send queue.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.config.port)), WAIT
    )
    slow = await harness.client(gateway, JSON, sock=sock, max_queue=1)
    await slow.subscribe(thread)
    local_port = sock.getsockname()[1]
    (slow_conn,) = [
        c
        for c in gateway.connections
        if c.ws.remote_address[1] == local_port  # type: ignore[index]
    ]

    publisher = await harness.client(gateway, MSGPACK)
    start = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
    ]
    published = list(start)
    offsets = await publisher.publish(thread, start)
    fast_frames = await fast.until_offset(thread, offsets[-1])
    slow_frames = await slow.until_offset(thread, offsets[-1])
    # From here on the slow client reads nothing, for ~4 MB of events.
    caught_up = 0
    for i in range(1, 61):
        batch = text_deltas("m1", 4, start=4 * i, size=16 * 1024)
        new = await publisher.publish(thread, batch)
        published.extend(batch)
        offsets.extend(new)
        # Pace on the fast reader: it must never be the one that falls behind.
        fast_frames.extend(await fast.until_offset(thread, new[-1]))
        # The gateway holds at most its bound plus one frame for the slow one.
        assert slow_conn._queued_bytes <= bound + 20 * 1024
        caught_up = max(caught_up, gateway.hub.stats()["catching_up"])
    assert slow_conn.state is ConnectionState.OPEN, "a slow reader is not closed"
    assert caught_up >= 1, "the slow reader never fell back to the store"
    end = [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]
    offsets += await publisher.publish(thread, end)
    published += end
    fast_frames += await fast.until_offset(thread, offsets[-1])
    everything = list(zip(offsets, published, strict=True))
    assert events_of(fast_frames) == everything  # the fast reader got everything

    # Once it reads again, the slow one gets every event exactly once, in order.
    slow_frames += await slow.until_offset(thread, offsets[-1], timeout=3 * WAIT)
    assert events_of(slow_frames) == everything
    assert only(slow_frames, "snapshot") == []
    assert slow.ws.close_code is None


async def test_subscribes_whose_snapshots_are_not_read_keep_the_queue_bounded(
    mem: Harness,
) -> None:
    # Each subscribe from "snapshot" queues a ~200 KB snapshot; a client that
    # sends hundreds of them and reads nothing is closed (4000), never holds
    # more than twice its queue bound (plus the frame that crossed it).
    bound = 256 * 1024
    gateway = await mem.gateway(send_queue_bytes=bound)
    publisher = await mem.client(gateway)
    await publisher.publish(
        "big",
        [
            {"type": "RUN_STARTED", "threadId": "big", "runId": "r"},
            {"type": "STATE_SNAPSHOT", "snapshot": {"x": "y" * 200_000}},
        ],
    )
    greedy = await mem.client(gateway, MSGPACK)
    (conn,) = [c for c in gateway.connections if c.encoding.value == "msgpack"]
    most = 0
    for i in range(300):
        with contextlib.suppress(ConnectionClosed):
            await greedy.send({"type": "subscribe", "id": i, "thread": "big", "from": "snapshot"})
        most = max(most, conn._queued_bytes)
        if conn.state is not ConnectionState.OPEN:
            break
        await asyncio.sleep(0)
    assert conn.state is not ConnectionState.OPEN
    assert most <= 2 * bound + 210_000
    # Whatever was already on its way drains to the client, then the close.
    assert await greedy.closed_code(timeout=3 * WAIT) == 4000
    deadline = time.monotonic() + WAIT
    while conn in gateway.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert conn not in gateway.connections
    await publisher.ping()  # the others carry on


async def test_replaying_history_larger_than_the_send_queue(harness: Harness) -> None:
    gateway = await harness.gateway(send_queue_bytes=256 * 1024)
    thread = "big-history"
    publisher = await harness.client(gateway, MSGPACK)
    events = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *text_deltas("m1", 40, size=16 * 1024),  # 640 KiB in all, 16 KiB each
    ]
    offsets: list[str] = []
    for i in range(0, len(events), 8):
        offsets += await publisher.publish(thread, events[i : i + 8])
    reader = await harness.client(gateway, MSGPACK)
    await reader.subscribe(thread, "start")
    frames = await reader.until_offset(thread, offsets[-1])
    assert events_of(frames) == list(zip(offsets, events, strict=True))


# -- 9. drain and idle connections ----------------------------------------------------------


async def test_drain_closes_clients_with_1012(harness: Harness) -> None:
    gateway = await harness.gateway()
    clients = [await harness.client(gateway, p) for p in (JSON, MSGPACK, JSON)]
    await clients[0].subscribe("drain")
    await clients[1].subscribe("drain", "start")
    publisher = clients[2]
    await publisher.publish("drain", [{"type": "RUN_STARTED", "threadId": "drain", "runId": "r"}])
    drained = asyncio.create_task(gateway.drain())
    codes = await asyncio.gather(*(c.closed_code() for c in clients))
    await asyncio.wait_for(drained, 3 * WAIT)
    assert codes == [1012, 1012, 1012]
    assert all(c.ws.close_reason for c in clients)
    # No new connections once drained.
    with pytest.raises((OSError, InvalidStatus, asyncio.TimeoutError)):
        await connect(url(gateway), subprotocols=[JSON], proxy=None, open_timeout=2)  # type: ignore[list-item]


async def test_idle_connection_is_closed_with_4001(mem: Harness) -> None:
    gateway = await mem.gateway(idle_timeout=0.3)
    idle = await mem.client(gateway)
    busy = await mem.client(gateway)
    await busy.subscribe("keep")
    assert await idle.closed_code() == 4001
    await asyncio.sleep(0.5)
    await busy.ping()  # a subscribed connection is not idle


async def test_a_connection_that_sends_is_not_idle_and_one_that_stops_is(mem: Harness) -> None:
    gateway = await mem.gateway(idle_timeout=0.4)
    talker = await mem.client(gateway)
    for _ in range(8):  # 1.2 s of pings, each well within the timeout
        await asyncio.sleep(0.15)
        await talker.ping()
    # Subscribed, then no longer: idle from then on, closed within two timeouts.
    await talker.subscribe("briefly")
    await asyncio.sleep(0.6)
    await talker.ping()
    reply = await talker.request({"type": "unsubscribe", "id": 9, "thread": "briefly"})
    assert reply["type"] == "unsubscribed"
    assert await talker.closed_code(2.0) == 4001


# -- the runs of a thread -------------------------------------------------------------------


async def test_runs_lists_the_tree_of_runs(harness: Harness) -> None:
    gateway = await harness.gateway()
    client = await harness.client(gateway)
    thread = "branches"

    def started(run: str, parent: str | None = None) -> Event:
        event: Event = {"type": "RUN_STARTED", "threadId": thread, "runId": run}
        if parent is not None:
            event["parentRunId"] = parent
        return event

    def ended(run: str) -> Event:
        return {"type": "RUN_FINISHED", "threadId": thread, "runId": run}

    first = await client.publish(thread, [started("r1"), ended("r1")])
    await client.publish(thread, [started("r2"), ended("r2")])
    await client.publish(thread, [started("r3", parent="r1"), ended("r3")])
    reply = await client.request({"type": "runs", "thread": thread})
    assert reply["type"] == "runs" and reply["thread"] == thread and reply["more"] is False
    assert reply["agents"] == []  # none configured on this gateway
    assert [(r["runId"], r["parentRunId"], r["status"]) for r in reply["runs"]] == [
        ("r1", None, "finished"),
        ("r2", "r1", "finished"),
        ("r3", "r1", "finished"),
    ]
    assert (reply["runs"][0]["first"], reply["runs"][0]["last"]) == tuple(first)
    newest = await client.request({"type": "runs", "thread": thread, "limit": 1})
    assert [r["runId"] for r in newest["runs"]] == ["r3"] and newest["more"] is True
    empty = await client.request({"type": "runs", "thread": "no-such-thread"})
    assert empty["runs"] == [] and empty["more"] is False
    for limit in (0, 5000, "3", True):
        bad = await client.request({"type": "runs", "thread": thread, "limit": limit})
        assert bad["type"] == "error" and bad["code"] == "bad_command", (limit, bad)


def turn(thread: str, run: str, text: str, parent: str | None = None) -> list[Event]:
    """One run answering with one message *text* (message id ``m-<run>``)."""
    started: Event = {"type": "RUN_STARTED", "threadId": thread, "runId": run}
    if parent is not None:
        started["parentRunId"] = parent
    message = f"m-{run}"
    return [
        started,
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": text},
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run},
    ]


def texts(messages: list[Any]) -> list[str]:
    return [m["content"] for m in messages]


async def test_a_branch_subscription_sees_its_branch_only(harness: Harness) -> None:
    gateway = await harness.gateway()
    publisher = await harness.client(gateway)
    thread = "branchy"
    first = turn(thread, "r1", "a")
    first.insert(1, {"type": "STATE_SNAPSHOT", "snapshot": {"shared": True}})
    await publisher.publish(thread, first)
    await publisher.publish(thread, turn(thread, "r2", "b"))  # continues r1
    last_r3 = (await publisher.publish(thread, turn(thread, "r3", "c", parent="r1")))[-1]

    on_r2, on_r3, whole = [await harness.client(gateway) for _ in range(3)]
    await on_r2.subscribe(thread, "start", branch="r2")
    await on_r3.subscribe(thread, "start", branch="r3")
    await whole.subscribe(thread, "start")
    # Live: r4 continues r3 (named), r5 continues the run before it (r4): both
    # extend r3's branch; r6 regenerates r2's answer (another branch).
    await publisher.publish(thread, turn(thread, "r4", "d", parent="r3"))
    await publisher.publish(thread, turn(thread, "r5", "e"))
    end = (await publisher.publish(thread, turn(thread, "r6", "f", parent="r1")))[-1]

    def answers(frames: list[Frame]) -> list[str]:
        return texts(folded([e for _, e in events_of(frames, thread)])[0])

    all_frames = await whole.until_offset(thread, end)
    assert answers(all_frames) == ["a", "b", "c", "d", "e", "f"]
    r3_frames = await on_r3.collect(
        lambda f: f["type"] == "event" and f["event"]["type"] == "RUN_FINISHED"
        and f["event"]["runId"] == "r5"
    )  # fmt: skip
    assert answers(r3_frames) == ["a", "c", "d", "e"]
    assert folded([e for _, e in events_of(r3_frames)])[1] == {"shared": True}
    # r2's viewer got a, b; then nothing of r3..r6 (r6 continues r1, not r2).
    await on_r2.ping()
    r2_frames = list(on_r2.pending)
    assert answers(r2_frames) == ["a", "b"]

    # A snapshot on a branch folds that branch only.
    late = await harness.client(gateway)
    await late.subscribe(thread, "snapshot", branch="r6")
    snap = await late.recv()
    assert snap["type"] == "snapshot"
    assert texts(folded(snap["events"])[0]) == ["a", "f"]
    assert folded(snap["events"])[1] == {"shared": True}

    # Resume on a branch from before its extension: what extended it comes along.
    again = await harness.client(gateway)
    epoch = (await whole.subscribe(thread, "live"))["epoch"]
    await again.subscribe(thread, {"offset": last_r3, "epoch": epoch}, branch="r3")
    resumed = await again.collect(
        lambda f: f["type"] == "event" and f["event"]["type"] == "RUN_FINISHED"
        and f["event"]["runId"] == "r5"
    )  # fmt: skip
    assert answers(resumed) == ["d", "e"]

    unknown = await late.request(
        {"type": "subscribe", "thread": "branchy", "from": "live", "branch": "nope"}
    )
    assert unknown["type"] == "error" and unknown["code"] == "unknown_run", unknown
    both = await late.request(
        {"type": "subscribe", "thread": thread, "from": "live", "branch": "r1", "run": "r1"}
    )
    assert both["type"] == "error" and both["code"] == "bad_command", both


async def test_viewers_joining_one_branch_share_its_fold(
    mem: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second snapshot join of a branch reads nothing of the thread: it gets the
    first one's snapshot, then what came since, as that first viewer did."""
    store = MemoryStore()
    gateway = await mem.gateway(store=store)
    publisher = await mem.client(gateway)
    thread = "shared-branch"
    await publisher.publish(thread, turn(thread, "r1", "a"))
    await publisher.publish(thread, turn(thread, "r2", "b"))
    await publisher.publish(thread, turn(thread, "r3", "c", parent="r1"))
    whole = await mem.client(gateway)
    await whole.subscribe(thread, "live")  # the channel stays loaded
    reads = 0
    read = store.read_available

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read(*args, **kwargs)

    monkeypatch.setattr(store, "read_available", counted)
    first = await mem.client(gateway)
    await first.subscribe(thread, "snapshot", branch="r2")
    first_snapshot = await first.recv()
    folded_once = reads
    assert folded_once >= 1
    await publisher.publish(thread, turn(thread, "r4", "d"))  # continues r3
    more = await publisher.publish(thread, turn(thread, "r5", "e", parent="r2"))
    await whole.until_offset(thread, more[-1])
    second = await mem.client(gateway)
    await second.subscribe(thread, "snapshot", branch="r2")
    assert await second.recv() == first_snapshot
    frames = await second.until_offset(thread, more[-1])
    assert [o for o, _ in events_of(frames, thread)] == more  # r4 is another branch's
    assert reads == folded_once, "the second join read the thread again"
    # A branch asked for at another run is folded for itself (r3, then r4 after it).
    third = await mem.client(gateway)
    await third.subscribe(thread, "snapshot", branch="r3")
    snapshot = await third.recv()
    assert texts(folded(snapshot["events"])[0]) == ["a", "c", "d"]
    assert reads > folded_once


async def test_a_branch_resumes_over_the_trimmed_runs_of_another(harness: Harness) -> None:
    """Retention trimmed another branch's run after a branch viewer's position: its
    resume is complete (none of its events were lost), and it goes on."""
    gateway = await harness.gateway(retention=Retention(max_len=5))
    publisher = await harness.client(gateway)
    thread = "trimmed-branches"
    await publisher.publish(thread, turn(thread, "r1", "a"))
    position = (await publisher.publish(thread, turn(thread, "r3", "c", parent="r1")))[-1]
    epoch = (await publisher.subscribe(thread, "live"))["epoch"]
    other = turn(thread, "r4", "x", parent="r1")  # another version of r3's answer
    other[3:3] = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-r4", "delta": f" {i}"} for i in range(3)
    ]
    await publisher.publish(thread, other)
    continued = await publisher.publish(thread, turn(thread, "r5", "e", parent="r3"))
    # The channel has relayed the lot (its own feed may have had to reload over the
    # trimming: that resyncs everyone, and is not what is tested here).
    await publisher.collect(lambda f: f.get("offset") == continued[-1])
    viewer = await harness.client(gateway)
    reply = await viewer.subscribe(thread, {"offset": position, "epoch": epoch}, branch="r3")
    assert reply["recovered"] is True, reply
    frames = await viewer.until_offset(thread, continued[-1])
    assert [o for o, _ in events_of(frames, thread)] == continued
    # A viewer on r4's branch from the same position lost events of its branch.
    loser = await harness.client(gateway)
    lost = await loser.subscribe(thread, {"offset": position, "epoch": epoch}, branch="r4")
    assert lost["recovered"] is False
    snapshot = await loser.recv()
    assert snapshot["type"] == "snapshot" and snapshot["complete"] is False


async def test_a_branch_is_resynced_when_trimming_overtakes_the_gateway(
    harness: Harness,
) -> None:
    """Appends faster than the live reader, over a short retention: the channel
    reloads the thread in the same epoch. A branch viewer gets a snapshot of its
    branch (as a whole-thread viewer gets one of the thread), never anything of
    another branch, and goes on."""
    gateway = await harness.gateway(retention=Retention(max_len=6))
    publisher = await harness.client(gateway)
    thread = "overtaken-branch"
    await publisher.publish(thread, turn(thread, "r1", "a"))
    await publisher.publish(thread, turn(thread, "r2", "b"))
    on_r2, whole = await harness.client(gateway), await harness.client(gateway)
    epoch = (await on_r2.subscribe(thread, "live", branch="r2"))["epoch"]
    await whole.subscribe(thread, "live")
    long_run = turn(thread, "r3", "c", parent="r2")  # longer than the retention
    long_run[3:3] = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m-r3", "delta": f" {i}"} for i in range(9)
    ]
    await publisher.publish(thread, long_run)
    others = await publisher.publish(thread, turn(thread, "r4", "x", parent="r1"))
    others += await publisher.publish(thread, turn(thread, "r5", "y"))  # continues r4
    on_r3 = await publisher.publish(thread, turn(thread, "r6", "e", parent="r3"))

    async def until_at(client: Client, offset: str) -> list[Frame]:
        """Frames up to the event at *offset*, or a snapshot that folds it."""
        return await client.collect(
            lambda f: f["type"] in ("event", "snapshot") and f["offset"] == offset
        )

    frames = await until_at(on_r2, on_r3[-1])
    assert not [f for f in frames if f["type"] == "error"], frames
    assert not {o for o, _ in events_of(frames, thread)} & set(others), "another branch's"
    resyncs = [i for i, f in enumerate(frames) if f["type"] == "subscribed"]
    base: Any = None
    tail = frames
    for at in resyncs:  # each a reply without id, then the branch's snapshot
        resync, snapshot = frames[at : at + 2]
        assert resync["recovered"] is False and resync["epoch"] == epoch and "id" not in resync
        assert snapshot["type"] == "snapshot" and snapshot["offset"] == resync["offset"]
        shown = texts(folded(snapshot["events"])[0])
        assert not {"x", "y"} & set(shown), shown
        base, tail = fold(snapshot["events"]), frames[at + 2 :]
    if not resyncs:  # the memory store's feed hands appends over as they are made
        assert isinstance(gateway.store, MemoryStore), "the channel did not reload"
    messages = folded([e for _, e in events_of(tail, thread)], base)[0]
    assert texts(messages)[-1:] == ["e"], messages
    await until_at(whole, on_r3[-1])
    # The subscription is alive: it goes on with its branch (r7 continues r6).
    more = await publisher.publish(thread, turn(thread, "r7", "f"))
    assert await until_at(on_r2, more[-1])
    skipped = await publisher.publish(thread, turn(thread, "r8", "z", parent="r4"))
    more = await publisher.publish(thread, turn(thread, "r9", "g", parent="r7"))
    frames = await until_at(on_r2, more[-1])
    assert not {o for o, _ in events_of(frames, thread)} & set(skipped)
    for snapshot in only(frames, "snapshot"):
        assert "z" not in texts(folded(snapshot["events"])[0])


# -- thread re-created ----------------------------------------------------------------------


async def test_thread_recreated_while_subscribed(harness: Harness) -> None:
    gateway = await harness.gateway()
    thread = "recreated"
    viewer = await harness.client(gateway, MSGPACK)
    publisher = await harness.client(gateway)
    first = realistic_run(thread, "r1", turns=1)
    offsets = await publisher.publish_all(thread, first)
    reply = await viewer.subscribe(thread, "live")
    old_epoch = reply["epoch"]
    assert old_epoch and reply["offset"] == offsets[-1]

    assert await gateway.store.delete(thread)
    second = realistic_run(thread, "r2", turns=1)
    new_offsets = await publisher.publish_all(thread, second)
    frames = await viewer.until_offset(thread, new_offsets[-1])
    # First a new "subscribed" saying the history is not recovered, then a snapshot...
    resync, snap, *rest = frames
    assert resync["type"] == "subscribed" and resync["recovered"] is False
    assert "id" not in resync and resync["epoch"] != old_epoch
    assert snap["type"] == "snapshot" and snap["epoch"] == resync["epoch"]
    # ... then the new tail, in the new epoch (announced when it is created).
    epochs = [f["epoch"] for f in (resync, *rest) if f["type"] == "subscribed"]
    assert epochs[-1] and epochs[-1] != old_epoch
    tail = events_of(rest)
    assert tail == list(zip(new_offsets, second, strict=True))[len(second) - len(tail) :]
    assert folded([e for _, e in tail], fold(snap["events"])) == folded(second)
