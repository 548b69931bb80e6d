"""agui_hub.client.hub_client against real gateways on 127.0.0.1 (docs/protocol.md).

Every test starts in-process :class:`Gateway` instances on loopback ports,
connects :class:`HubClient` objects over real WebSockets (msgpack and JSON)
and checks what the subscriptions yield item by item: the ``Subscribed`` /
``Snapshot`` / ``ThreadEvent`` items, the ``position`` after each, resumes
after lost connections and restarted gateways (no loss, no duplicate), the
client-side queue bound, chunk expansion, folded state, publishing and the
errors. Stores: the memory store and a RedisStore on the session
redis-server, under a key prefix of the test's own. Events are published
either through a client or with a :class:`ThreadWriter` straight into the
store, so that they keep coming while a gateway is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgpack
import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from agui_hub.agui.reducer import fold
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.client.hub_client import (
    ClientState,
    HubClient,
    Item,
    Position,
    Snapshot,
    Subscribed,
    Subscription,
    ThreadEvent,
)
from agui_hub.errors import (
    ClientError,
    CommandRejected,
    ConnectionRejected,
    Forbidden,
    HubUnreachable,
    InvalidEvent,
    PayloadTooLarge,
    SequenceError,
    Unauthorized,
)
from agui_hub.gateway.auth import Anonymous, Credentials, Grants, Identity, TokenSource
from agui_hub.gateway.connection import Connection, ConnectionState
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store.contract import Retention, ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore
from agui_hub.wire.codec import decode
from agui_hub.wire.offsets import offset_key
from agui_hub.wire.protocol import SUBPROTOCOL_JSON, SUBPROTOCOL_MSGPACK, CloseCode

from ..conftest import TIMEOUT_SCALE, RedisServer, free_port
from ..runs import realistic_run

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing to arrive."""
ENCODINGS = ["msgpack", "json"]

Event = dict[str, Any]


# -- event streams ------------------------------------------------------------------------


def run_events(thread: str, run: str, *, turns: int = 2) -> list[Event]:
    """A short :func:`realistic_run` (~50 events for two turns)."""
    return realistic_run(thread, run, turns=turns, deltas=12, args=4)


def opening(thread: str, run: str, message: str) -> list[Event]:
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "STATE_SNAPSHOT", "snapshot": {"n": 0}},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
    ]


def deltas(message: str, count: int, *, start: int = 0, size: int = 0) -> list[Event]:
    pad = "x" * size
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"w{i} {pad}"}
        for i in range(start, start + count)
    ]


def folded(events: list[Event], base: list[Event] | None = None) -> tuple[Any, Any]:
    """What a viewer shows after folding *events* (after *base*): (messages, state)."""
    result = fold(events, fold(base) if base is not None else None)
    return result.messages, result.state


def strictly_increasing(offsets: list[str]) -> bool:
    keys = [offset_key(o) for o in offsets]
    return all(a < b for a, b in itertools.pairwise(keys))


def thread_events(items: list[Item]) -> list[tuple[str, Event]]:
    return [(i.offset, i.event) for i in items if isinstance(i, ThreadEvent)]


def of_kind(items: list[Item], kind: type[Any]) -> list[Any]:
    return [i for i in items if isinstance(i, kind)]


# -- reading subscriptions --------------------------------------------------------------------


class Reader:
    """Iterates one subscription in a task; keeps every item and the position after it.

    With *pace*, it sleeps that long every 16 items (a slowish consumer).
    ``close_codes`` has the client's last close code at each resumed ``Subscribed``.
    """

    def __init__(self, sub: Subscription, *, pace: float = 0.0) -> None:
        self.sub = sub
        self.pace = pace
        self.items: list[Item] = []
        self.positions: list[Position | None] = []
        self.close_codes: list[int | None] = []
        self.error: BaseException | None = None
        self.ended = False
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for item in self.sub:
                self.items.append(item)
                self.positions.append(self.sub.position)
                if isinstance(item, Subscribed) and item.resumed:
                    self.close_codes.append(self.sub.client.close_code)
                self._changed.set()
                if self.pace and len(self.items) % 16 == 0:
                    await asyncio.sleep(self.pace)
        except Exception as exc:
            self.error = exc
        finally:
            self.ended = True
            self._changed.set()

    async def until(self, done: Callable[[list[Item]], bool], timeout: float = WAIT) -> None:
        """Wait until *done(items)* holds; fail if the subscription ends or errs first."""
        async with asyncio.timeout(timeout):
            while not done(self.items):
                if self.ended:
                    raise AssertionError(f"subscription ended ({self.error!r}) before: "
                                         f"{self.items[-3:]}")  # fmt: skip
                self._changed.clear()
                await self._changed.wait()

    async def until_offset(self, offset: str, timeout: float = WAIT) -> None:
        target = offset_key(offset)
        await self.until(
            lambda items: any(
                isinstance(i, ThreadEvent) and offset_key(i.offset) >= target for i in items
            ),
            timeout,
        )

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def take(sub: Subscription, count: int, timeout: float = WAIT) -> list[tuple[Item, Any]]:
    """The next *count* items of *sub*, each with the position after it."""
    out: list[tuple[Item, Any]] = []
    async with asyncio.timeout(timeout):
        for _ in range(count):
            item = await anext(sub)
            out.append((item, sub.position))
    return out


async def take_until_offset(
    sub: Subscription, offset: str, timeout: float = WAIT, limit: int = 100_000
) -> list[tuple[Item, Any]]:
    """Items of *sub* (with positions) up to the event at *offset*, inclusive.

    With chunk expansion an offset can yield several items; the position
    moves past it with the last of them.
    """
    out: list[tuple[Item, Any]] = []
    async with asyncio.timeout(timeout):
        for _ in range(limit):
            item = await anext(sub)
            out.append((item, sub.position))
            reached = sub.position is not None and sub.position.offset == offset
            if isinstance(item, ThreadEvent) and item.offset == offset and reached:
                return out
    raise AssertionError(f"offset {offset} not reached within {limit} items")


# -- gateways, stores, clients ------------------------------------------------------------------


class Env:
    """Stores, gateways, writers and clients of one test, all torn down at its end.

    ``kind`` is ``"memory"`` (one MemoryStore shared by every gateway of the
    test, as a restarted in-process gateway would keep it) or ``"redis"`` (a
    RedisStore per gateway / writer, all under one key prefix).
    """

    def __init__(self, kind: str, redis_url: str | None) -> None:
        self.kind = kind
        self.redis_url = redis_url
        self.prefix = f"test-client-{uuid.uuid4().hex}"
        self.retention = Retention()
        self._memory: MemoryStore | None = None
        self.stores: list[ThreadStore] = []
        self.gateways: list[Gateway] = []
        self.clients: list[HubClient] = []

    def store(self) -> ThreadStore:
        """A handle on this test's store (a new connection for Redis)."""
        if self.kind == "memory":
            if self._memory is None:
                self._memory = MemoryStore(retention=self.retention)
            return self._memory
        assert self.redis_url is not None
        store = RedisStore(self.redis_url, prefix=self.prefix, retention=self.retention)
        self.stores.append(store)
        return store

    def writer(self) -> ThreadWriter:
        """Publishes straight into the store (works while no gateway runs)."""
        return ThreadWriter(self.store())

    async def gateway(self, port: int = 0, authenticator: Any = None, **config: Any) -> Gateway:
        config.setdefault("ping_interval", None)
        gateway = Gateway(
            GatewayConfig(host="127.0.0.1", port=port, **config),
            store=self.store(),
            authenticator=authenticator,
        )
        await asyncio.wait_for(gateway.start(), WAIT)
        self.gateways.append(gateway)
        return gateway

    async def client(
        self, gateway: Gateway | int, encoding: str = "msgpack", **kwargs: Any
    ) -> HubClient:
        port = gateway if isinstance(gateway, int) else gateway.config.port
        kwargs.setdefault("open_timeout", WAIT)
        client = HubClient(f"ws://127.0.0.1:{port}", encoding=encoding, **kwargs)
        self.clients.append(client)
        await asyncio.wait_for(client.connect(), WAIT)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), WAIT)
        for gateway in self.gateways:
            if not gateway._draining:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(gateway.drain(), WAIT)
        for store in self.stores:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(store.close(), WAIT)


@pytest.fixture(params=["memory", "redis"])
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    redis_url = None
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        redis_url = server.url
    e = Env(request.param, redis_url)
    try:
        yield e
    finally:
        await e.close()


@pytest.fixture
async def mem() -> AsyncIterator[Env]:
    """The memory store only, for what does not depend on the store."""
    e = Env("memory", None)
    try:
        yield e
    finally:
        await e.close()


@pytest.fixture
async def redis_env(redis_server: RedisServer) -> AsyncIterator[Env]:
    e = Env("redis", redis_server.url)
    try:
        yield e
    finally:
        await e.close()


def server_connection(gateway: Gateway, client: HubClient) -> Connection:
    """The gateway's side of *client*'s current connection."""
    assert client._link.ws is not None
    port = client._link.ws.local_address[1]
    (conn,) = [
        c
        for c in gateway.connections
        if c.ws.remote_address[1] == port  # type: ignore[index]
    ]
    return conn


async def wait_for(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll *condition* until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def publish_all(
    writer: ThreadWriter, thread: str, events: list[Event], *, batch: int = 25
) -> list[str]:
    offsets: list[str] = []
    tag = uuid.uuid4().hex[:8]
    for i in range(0, len(events), batch):
        chunk = events[i : i + batch]
        ids = [f"{tag}-{i + j}" for j in range(len(chunk))]
        offsets += await writer.publish(thread, chunk, ids)
    return offsets


class Received:
    """Every frame the gateway's connections receive from clients, decoded, in order.

    Wraps :meth:`Connection.receive` for the test (*monkeypatch* undoes it), so
    it sees each command before the gateway parses or judges it: what reached
    the gateway, whatever became of it. (The authentication seam is asked once
    per connection, not per command.)
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.frames: list[Any] = []
        original = Connection.receive

        async def receive(conn: Connection, data: bytes | str) -> None:
            try:
                self.frames.append(decode(data, conn.encoding, max_size=None))
            except Exception as exc:  # recorded all the same: it reached the gateway
                self.frames.append({"type": f"undecodable: {exc}"})
            await original(conn, data)

        monkeypatch.setattr(Connection, "receive", receive)

    def types(self) -> list[Any]:
        return [f.get("type") if isinstance(f, dict) else None for f in self.frames]

    def threads(self, kind: str) -> list[Any]:
        """The thread of each frame of type *kind* (``publish``, ``subscribe``, ...)."""
        return [
            f.get("thread") for f in self.frames if isinstance(f, dict) and f.get("type") == kind
        ]


# -- 1. subscribe: live, start, snapshot, from a position ----------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_subscribe_modes_yield_exact_items_and_positions(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    writer = env.writer()
    thread = "modes"
    history = run_events(thread, "r1")
    offsets = await publish_all(writer, thread, history)
    assert len(offsets) == len(history) and strictly_increasing(offsets)
    epoch = await gateway.store.epoch(thread)
    assert isinstance(epoch, str) and epoch
    last = offsets[-1]
    k = 17  # resume after the 18th event

    starts: dict[str, Any] = {
        "live": "live",
        "start": "start",
        "snapshot": "snapshot",
        "position": Position(offsets[k], epoch),
    }
    clients = {mode: await env.client(gateway, encoding) for mode in starts}
    subs = {mode: clients[mode].subscribe(thread, start) for mode, start in starts.items()}
    async with contextlib.AsyncExitStack() as stack:
        for sub in subs.values():
            await stack.enter_async_context(sub)
        # The reply comes first, with the thread's newest offset and epoch.
        first = {mode: await take(sub, 1) for mode, sub in subs.items()}
        for mode, [(item, position)] in first.items():
            assert item == Subscribed(thread, epoch, last, recovered=True, resumed=False), mode
            assert subs[mode].recovered is True
            expected_position = {
                "live": Position(last, epoch),
                "start": Position("0-0", epoch),
                "snapshot": None,  # the snapshot that follows sets it
                "position": Position(offsets[k], epoch),
            }[mode]
            assert position == expected_position, mode

        # What comes before the live tail.
        got = await take(subs["start"], len(history))
        assert thread_events([i for i, _ in got]) == list(zip(offsets, history, strict=True))
        assert [p for _, p in got] == [Position(o, epoch) for o in offsets]
        got = await take(subs["position"], len(history) - k - 1)
        assert thread_events([i for i, _ in got]) == list(
            zip(offsets[k + 1 :], history[k + 1 :], strict=True)
        )
        assert [p for _, p in got] == [Position(o, epoch) for o in offsets[k + 1 :]]
        [(snap, position)] = await take(subs["snapshot"], 1)
        assert isinstance(snap, Snapshot)
        assert (snap.thread, snap.offset, snap.epoch, snap.complete) == (thread, last, epoch, True)
        assert len(snap.events) < len(history) // 4  # compact, not a replay
        assert folded(snap.events) == folded(history)
        assert position == Position(last, epoch)

        # The live tail reaches every mode, with strictly increasing offsets.
        tail = run_events(thread, "r2", turns=1)
        tail_offsets = await publish_all(writer, thread, tail, batch=7)
        assert offset_key(last) < offset_key(tail_offsets[0])
        for mode, sub in subs.items():
            got = await take(sub, len(tail))
            items = [i for i, _ in got]
            assert all(isinstance(i, ThreadEvent) and i.thread == thread for i in items), mode
            assert thread_events(items) == list(zip(tail_offsets, tail, strict=True)), mode
            assert [p for _, p in got] == [Position(o, epoch) for o in tail_offsets], mode
            assert sub.position == Position(tail_offsets[-1], epoch)

        conns = {mode: server_connection(gateway, c) for mode, c in clients.items()}
        assert all(conn.threads == {thread} for conn in conns.values())

    # Leaving the block unsubscribed: the gateway's connections no longer have the thread.
    for mode, client in clients.items():
        await asyncio.wait_for(client.ping(), WAIT)  # commands are handled in order
        assert conns[mode].threads == set(), mode
        assert conns[mode].state is ConnectionState.OPEN
    await wait_for(lambda: thread not in gateway.hub.channels)
    # The subscriptions are over, and the thread can be subscribed again.
    for sub in subs.values():
        async with asyncio.timeout(WAIT):
            assert [item async for item in sub] == []
    again = clients["live"].subscribe(thread)
    async with again:
        [(item, _)] = await take(again, 1)
        assert item == Subscribed(thread, epoch, tail_offsets[-1], recovered=True, resumed=False)


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_subscribe_before_the_thread_exists(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    client = await env.client(gateway, encoding)
    thread = "not-yet"
    subs = {
        "live": client.subscribe(thread, "live"),
        "start": (await env.client(gateway, encoding)).subscribe(thread, "start"),
        "snapshot": (await env.client(gateway, encoding)).subscribe(thread, "snapshot"),
    }
    for mode, sub in subs.items():
        await sub.open()
        [(item, position)] = await take(sub, 1)
        assert item == Subscribed(thread, None, "0-0", recovered=True, resumed=False), mode
        if mode == "snapshot":
            [(snap, position)] = await take(sub, 1)
            assert isinstance(snap, Snapshot)
            assert (snap.offset, snap.epoch) == ("0-0", None)
            assert folded(snap.events) == folded([])
        assert position == Position("0-0", None), mode

    writer = env.writer()
    events = run_events(thread, "r1", turns=1)
    offsets = await publish_all(writer, thread, events, batch=9)
    epoch = await gateway.store.epoch(thread)
    assert epoch
    for mode, sub in subs.items():
        got = await take(sub, len(events) + 1)
        # The first event created the epoch: announced before the events.
        (announce, position), *rest = got
        assert isinstance(announce, Subscribed), mode
        assert (announce.thread, announce.epoch, announce.recovered, announce.resumed) == (
            thread,
            epoch,
            True,
            False,
        )
        assert position == Position("0-0", epoch), mode
        assert thread_events([i for i, _ in rest]) == list(zip(offsets, events, strict=True))
        assert [p for _, p in rest] == [Position(o, epoch) for o in offsets]
        await sub.close()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_position_carries_over_to_another_client(mem: Env, encoding: str) -> None:
    gateway = await mem.gateway()
    writer = mem.writer()
    thread = "handover"
    events = run_events(thread, "r1")
    offsets = await publish_all(writer, thread, events)
    first = await mem.client(gateway, encoding)
    async with first.subscribe(thread, "start") as sub:
        got = await take(sub, 1 + 30)
        kept = sub.position
    assert kept == Position(offsets[29], await gateway.store.epoch(thread))
    assert isinstance(kept, Position)
    await first.close()

    # Stored as JSON, picked up by another process: exactly the rest.
    restored = Position.from_json(kept.to_json())
    second = await mem.client(gateway, "json" if encoding == "msgpack" else "msgpack")
    async with second.subscribe(thread, restored) as sub:
        more = await take(sub, 1 + len(events) - 30)
    assert isinstance(more[0][0], Subscribed) and more[0][0].recovered is True
    seen = thread_events([i for i, _ in got + more])
    assert seen == list(zip(offsets, events, strict=True))


# -- 2. resume after lost connections, while a publisher keeps publishing -------------------------


class Feeder:
    """Publishes one long message into a thread in small batches, in a task."""

    def __init__(
        self,
        writer: ThreadWriter,
        thread: str,
        *,
        batches: int,
        size: int = 5,
        pause: float = 0.005,
        pad: int = 0,
    ) -> None:
        self.writer = writer
        self.thread = thread
        self.events: list[Event] = []
        self.offsets: list[str] = []
        self.batches = batches
        self.size = size
        self.pause = pause
        self.pad = pad
        self.tag = uuid.uuid4().hex[:8]
        self.task: asyncio.Task[None] | None = None

    async def begin(self) -> None:
        """Publish the opening events (the run, a message)."""
        await self._publish([*opening(self.thread, "r1", "m1")])

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def _publish(self, batch: list[Event]) -> None:
        base = len(self.events)
        ids = [f"{self.tag}-{base + j}" for j in range(len(batch))]
        self.offsets += await self.writer.publish(self.thread, batch, ids)
        self.events += batch

    async def _run(self) -> None:
        for i in range(self.batches):
            await self._publish(deltas("m1", self.size, start=i * self.size, size=self.pad))
            await asyncio.sleep(self.pause)
        await self._publish(
            [
                {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
                {"type": "STATE_SNAPSHOT", "snapshot": {"n": len(self.events)}},
                {"type": "RUN_FINISHED", "threadId": self.thread, "runId": "r1"},
            ]
        )

    async def finished(self) -> None:
        assert self.task is not None
        await asyncio.wait_for(self.task, 3 * WAIT)

    def everything(self) -> list[tuple[str, Event]]:
        return list(zip(self.offsets, self.events, strict=True))


def check_resumed_stream(
    items: list[Item], feeder: Feeder, epoch: str, *, subscribes: int
) -> list[Subscribed]:
    """Every event exactly once, in order; the resubscriptions recovered everything."""
    assert thread_events(items) == feeder.everything()
    subscribed = of_kind(items, Subscribed)
    assert of_kind(items, Snapshot) == []
    assert subscribed[0].resumed is False and subscribed[0].recovered is True
    resumes = subscribed[1:]
    assert len(resumes) >= subscribes
    for item in resumes:
        assert (item.resumed, item.recovered, item.epoch) == (True, True, epoch)
    return resumes


DROPS: dict[str, Callable[[Connection], None]] = {
    "1012": lambda conn: conn.close_soon(CloseCode.SERVICE_RESTART, "restart"),
    "4000": lambda conn: conn.close_soon(CloseCode.SLOW_CONSUMER, "slow consumer"),
    "1011": lambda conn: conn.close_soon(CloseCode.INTERNAL_ERROR, "internal error"),
    "abort": lambda conn: conn.ws.transport.abort(),
}


@pytest.mark.parametrize("how", list(DROPS))
@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_resume_after_the_gateway_drops_the_connection(
    env: Env, encoding: str, how: str
) -> None:
    gateway = await env.gateway()
    thread = "dropped"
    feeder = Feeder(env.writer(), thread, batches=60)
    await feeder.begin()
    epoch = await gateway.store.epoch(thread)
    client = await env.client(gateway, encoding, backoff_min=0.02, backoff_max=0.2)
    sub = client.subscribe(thread, "start", state=True)
    reader = Reader(await sub.open())
    await reader.until_offset(feeder.offsets[-1])
    feeder.start()

    drops = 3
    for n in range(1, drops + 1):
        # Drop the connection mid-stream, while events keep coming.
        seen = len(thread_events(reader.items))
        await reader.until(lambda items, seen=seen: len(thread_events(items)) >= seen + 20)
        conn = server_connection(gateway, client)
        assert feeder.task is not None and not feeder.task.done()  # still publishing
        DROPS[how](conn)
        await reader.until(lambda items, n=n: len(of_kind(items, Subscribed)) > n)
        assert client.reconnects == n
        assert client.close_code == (1006 if how == "abort" else int(how))
        assert client.state is ClientState.OPEN
    await feeder.finished()
    await reader.until_offset(feeder.offsets[-1])
    assert len(feeder.events) > 300

    check_resumed_stream(reader.items, feeder, epoch, subscribes=drops)
    assert sub.position == Position(feeder.offsets[-1], epoch)
    assert sub.state is not None
    assert (sub.state.messages, sub.state.state) == folded(feeder.events)
    await reader.stop()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_resume_across_a_gateway_restart_on_the_same_port(env: Env, encoding: str) -> None:
    port = free_port()  # not ephemeral: see conftest.free_port
    gateway = await env.gateway(port)
    thread = "restarted"
    feeder = Feeder(env.writer(), thread, batches=80, pause=0.01)
    await feeder.begin()
    epoch = await gateway.store.epoch(thread)
    client = await env.client(port, encoding, backoff_min=0.05, backoff_max=0.3)
    viewer = await env.client(port, "json" if encoding == "msgpack" else "msgpack")
    reader = Reader(await client.subscribe(thread, "live", state=True).open())
    other = Reader(await viewer.subscribe(thread, "start").open())
    await reader.until(lambda items: len(items) >= 1)
    feeder.start()
    await reader.until(lambda items: len(thread_events(items)) >= 40)

    # The whole gateway goes away; events keep being stored meanwhile.
    await asyncio.wait_for(gateway.drain(), WAIT)
    await wait_for(lambda: not client.connected)
    assert client.close_code == CloseCode.SERVICE_RESTART
    offsets_when_stopped = len(feeder.offsets)
    await asyncio.sleep(0.3)
    assert client.state is ClientState.RECONNECTING
    assert len(feeder.offsets) > offsets_when_stopped + 5
    # A new gateway on the same port over the same store: the clients come back by themselves.
    assert feeder.task is not None and not feeder.task.done()
    await env.gateway(port)
    await feeder.finished()
    await reader.until_offset(feeder.offsets[-1])
    await other.until_offset(feeder.offsets[-1])
    assert client.reconnects == 1 and viewer.reconnects == 1
    assert client.state is ClientState.OPEN

    # "live" from the first event on: the opening events are not in it.
    items = reader.items
    first_event = next(i for i in items if isinstance(i, ThreadEvent))
    start = feeder.offsets.index(first_event.offset)
    assert start == 3
    assert thread_events(items) == feeder.everything()[start:]
    (resumed,) = of_kind(items, Subscribed)[1:]
    assert (resumed.resumed, resumed.recovered, resumed.epoch) == (True, True, epoch)
    assert of_kind(items, Snapshot) == []
    check_resumed_stream(other.items, feeder, epoch, subscribes=1)
    sub = reader.sub
    assert sub.position == Position(feeder.offsets[-1], epoch)
    assert sub.state is not None
    # Its state: the fold of the events it saw (the opening was before it subscribed).
    assert (sub.state.messages, sub.state.state) == folded([e for _, e in thread_events(items)])
    await reader.stop()
    await other.stop()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_bursts_over_the_send_queue_need_no_reconnect(env: Env, encoding: str) -> None:
    # Bursts of ~40 KiB against a 16 KiB send queue: whether the gateway hands
    # each burst to the socket in time or the client falls back to reading the
    # store at its own pace (test_server covers that path for sure), it is
    # never closed and loses nothing.
    gateway = await env.gateway(send_queue_bytes=16 * 1024)
    thread = "slow"
    feeder = Feeder(env.writer(), thread, batches=8, size=100, pad=400, pause=0.05)
    await feeder.begin()
    epoch = await gateway.store.epoch(thread)
    client = await env.client(gateway, encoding, backoff_min=0.02, backoff_max=0.2)
    caught_up = 0
    async with client.subscribe(thread, "start") as sub:
        reader = Reader(sub, pace=0.001)
        feeder.start()
        assert feeder.task is not None
        while not feeder.task.done():
            caught_up = max(caught_up, gateway.hub.stats()["catching_up"])
            await asyncio.sleep(0.002)
        await feeder.finished()
        await reader.until_offset(feeder.offsets[-1], timeout=3 * WAIT)
        await reader.stop()
    print(f"members catching up at once, at most: {caught_up}")
    assert client.reconnects == 0
    assert not reader.close_codes
    assert check_resumed_stream(reader.items, feeder, epoch, subscribes=0) == []


# -- 3. resumes that cannot be complete: a snapshot -------------------------------------------


class Gate:
    """An Authenticator that lets everyone in but holds handshakes while it is shut.

    Connections without a token are anonymous with every grant (as without
    authentication). ``authenticate`` is awaited at each handshake that carries
    a token, so a client given ``token=`` is held there on every (re)connection
    while the gate is shut; its token is its subject, with every grant.
    """

    def __init__(self) -> None:
        self.anonymous: Identity | None = Anonymous().anonymous
        self.opened = asyncio.Event()
        self.opened.set()
        self.held = 0

    async def authenticate(self, credentials: Credentials) -> Identity:
        if not self.opened.is_set():
            self.held += 1
            await asyncio.wait_for(self.opened.wait(), WAIT)
        return Identity(credentials.token, Grants.everything())

    def revoked(self, identity: Identity) -> bool:
        return False

    def reload(self) -> None:
        pass


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_resume_after_the_history_was_trimmed_gets_a_snapshot(
    env: Env, encoding: str
) -> None:
    env.retention = Retention(max_len=20)
    gate = Gate()
    gateway = await env.gateway(authenticator=gate)
    thread = "trimmed"
    # A viewer from before the first event keeps the gateway folding the whole
    # thread, so the snapshot is complete although the store trims.
    keeper = Reader(await (await env.client(gateway)).subscribe(thread, "live").open())
    await keeper.until(lambda items: len(items) >= 1)
    writer = env.writer()
    events = opening(thread, "r1", "m1") + deltas("m1", 10)
    offsets = await publish_all(writer, thread, events)
    epoch = await gateway.store.epoch(thread)
    # With a token, so that its reconnection is authenticated, and held, at the handshake.
    client = await env.client(
        gateway, encoding, backoff_min=0.02, backoff_max=0.1, token="trimmed-viewer"
    )
    sub = await client.subscribe(thread, "start", state=True).open()
    before = await take_until_offset(sub, offsets[-1])
    assert thread_events([i for i, _ in before]) == list(zip(offsets, events, strict=True))
    kept = sub.position
    assert kept == Position(offsets[-1], epoch)

    # Disconnected (and held off) while 45 more events go by: the stream keeps 20.
    gate.opened.clear()
    server_connection(gateway, client).close_soon(CloseCode.SERVICE_RESTART, "restart")
    await wait_for(lambda: gate.held >= 1)
    missed = [
        *deltas("m1", 40, start=10),
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/n", "value": 45}]},
        {"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "assistant"},
        *deltas("m2", 2),
    ]
    missed_offsets = []
    for i in range(0, len(missed), 10):
        # Paced on the keeper: a live reader more than 20 events behind would
        # find its cursor trimmed and resync the channel (a snapshot, correct
        # but not what this test looks at), which a loaded machine can cause.
        missed_offsets += await publish_all(writer, thread, missed[i : i + 10], batch=10)
        await keeper.until_offset(missed_offsets[-1])
    info = await gateway.store.info(thread)
    assert info is not None and info.length == 20 and info.trimmed is not None
    assert offset_key(kept.offset) < offset_key(info.trimmed)  # the resume point is gone
    gate.opened.set()

    after = await take(sub, 2)
    (resync, pos1), (snap, pos2) = after
    assert resync == Subscribed(thread, epoch, missed_offsets[-1], recovered=False, resumed=True)
    assert pos1 == kept  # unchanged until the snapshot
    assert isinstance(snap, Snapshot)
    assert (snap.thread, snap.offset, snap.epoch, snap.complete) == (
        thread,
        missed_offsets[-1],
        epoch,
        True,
    )
    assert pos2 == Position(missed_offsets[-1], epoch)
    assert folded(snap.events) == folded(events + missed)
    assert sub.recovered is False
    assert sub.state is not None
    assert (sub.state.messages, sub.state.state) == folded(events + missed)

    # Then the live tail, folded on top.
    tail = [*deltas("m2", 3, start=2), {"type": "TEXT_MESSAGE_END", "messageId": "m2"}]
    tail_offsets = await publish_all(writer, thread, tail)
    got = await take(sub, len(tail))
    assert thread_events([i for i, _ in got]) == list(zip(tail_offsets, tail, strict=True))
    assert (sub.state.messages, sub.state.state) == folded(events + missed + tail)
    assert client.reconnects == 1
    await sub.close()
    await keeper.stop()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_resume_after_the_thread_was_recreated_gets_a_snapshot(
    env: Env, encoding: str
) -> None:
    port = free_port()
    gateway = await env.gateway(port)
    thread = "recreated"
    writer = env.writer()
    first = run_events(thread, "r1", turns=1)
    offsets = await publish_all(writer, thread, first)
    old_epoch = await gateway.store.epoch(thread)
    client = await env.client(port, encoding, backoff_min=0.02, backoff_max=0.2)
    sub = await client.subscribe(thread, "start", state=True).open()
    await take_until_offset(sub, offsets[-1])
    assert sub.position == Position(offsets[-1], old_epoch)

    # While the client is away the thread is deleted and created again.
    await asyncio.wait_for(gateway.drain(), WAIT)
    store = env.store()
    assert await store.delete(thread)
    second = run_events(thread, "r2")
    head, tail = second[:30], second[30:]
    head_offsets = await publish_all(writer, thread, head, batch=10)
    new_epoch = await store.epoch(thread)
    assert new_epoch and new_epoch != old_epoch
    await env.gateway(port)

    (resync, pos1), (snap, pos2) = await take(sub, 2)
    assert resync == Subscribed(thread, new_epoch, head_offsets[-1], recovered=False, resumed=True)
    assert pos1 == Position(offsets[-1], old_epoch)
    assert isinstance(snap, Snapshot)
    assert (snap.offset, snap.epoch, snap.complete) == (head_offsets[-1], new_epoch, True)
    assert pos2 == Position(head_offsets[-1], new_epoch)
    assert sub.state is not None
    # Nothing of the first run is left: the state is the new thread's.
    assert (sub.state.messages, sub.state.state) == folded(head)
    assert [r.run_id for r in sub.state.runs] == ["r2"]

    tail_offsets = await publish_all(writer, thread, tail, batch=10)
    got = await take(sub, len(tail))
    assert thread_events([i for i, _ in got]) == list(zip(tail_offsets, tail, strict=True))
    assert [p for _, p in got] == [Position(o, new_epoch) for o in tail_offsets]
    assert (sub.state.messages, sub.state.state) == folded(second)
    assert client.reconnects == 1
    await sub.close()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_thread_recreated_while_subscribed(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "reset-live"
    writer = env.writer()
    first = run_events(thread, "r1", turns=1)
    offsets = await publish_all(writer, thread, first)
    old_epoch = await gateway.store.epoch(thread)
    client = await env.client(gateway, encoding)
    reader = Reader(await client.subscribe(thread, "start", state=True).open())
    await reader.until_offset(offsets[-1])
    seen = len(reader.items)

    assert await gateway.store.delete(thread)
    second = run_events(thread, "r2", turns=1)
    head, tail = second[:20], second[20:]
    head_offsets = await publish_all(writer, thread, head, batch=5)
    new_epoch = await gateway.store.epoch(thread)
    assert new_epoch and new_epoch != old_epoch
    # The resync may come before, amid or after the new events: it ends at the newest.
    await reader.until(lambda items: reader.sub.position == Position(head_offsets[-1], new_epoch))
    tail_offsets = await publish_all(writer, thread, tail, batch=5)
    await reader.until_offset(tail_offsets[-1])

    items, positions = reader.items[seen:], reader.positions[seen:]
    resync = items[0]
    assert isinstance(resync, Subscribed)
    assert (resync.recovered, resync.resumed) == (False, False)
    assert positions[0] == Position(offsets[-1], old_epoch)  # unchanged until the snapshot
    snaps = [n for n, i in enumerate(items) if isinstance(i, Snapshot)]
    assert snaps == [1]
    snap = items[1]
    assert isinstance(snap, Snapshot) and snap.epoch in (None, new_epoch)
    assert positions[1] == Position(snap.offset, snap.epoch)
    # After the snapshot: an announcement of the new epoch if it had none, then events.
    rest = items[2:]
    announced = of_kind(rest, Subscribed)
    assert [(a.epoch, a.recovered) for a in announced] == (
        [] if snap.epoch == new_epoch else [(new_epoch, True)]
    )
    got = thread_events(rest)
    expected = list(zip(head_offsets + tail_offsets, second, strict=True))
    assert got == expected[len(expected) - len(got) :]
    assert got[-len(tail) :] == expected[-len(tail) :]
    assert folded([e for _, e in got], snap.events) == folded(second)
    assert reader.positions[-1] == Position(tail_offsets[-1], new_epoch)
    assert reader.sub.state is not None
    assert (reader.sub.state.messages, reader.sub.state.state) == folded(second)
    assert client.reconnects == 0
    await reader.stop()


# -- 4. the client-side queue bound ----------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_small_client_queue_lags_and_catches_up_without_loss(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "lagging"
    writer = env.writer()
    events = opening(thread, "r1", "m1")
    offsets = await publish_all(writer, thread, events)
    epoch = await gateway.store.epoch(thread)
    witness = Reader(await (await env.client(gateway)).subscribe(thread, "live").open())
    client = await env.client(gateway, encoding)
    max_queue = 8
    sub = client.subscribe(thread, "start", max_queue=max_queue)
    async with sub:
        got = await take(sub, 1 + len(events))
        # The consumer pauses while 300 events arrive.
        more = deltas("m1", 300)
        offsets += await publish_all(writer, thread, more, batch=50)
        events += more
        await witness.until_offset(offsets[-1])
        await asyncio.wait_for(client.ping(), WAIT)  # every frame before the pong was read
        assert len(sub._queue) <= max_queue  # the bound held: the rest was left in the hub
        # It reads again, slowly, while more keeps coming.
        reader = Reader(sub, pace=0.002)
        more = deltas("m1", 100, start=300)
        offsets += await publish_all(writer, thread, more, batch=10)
        events += more
        await reader.until_offset(offsets[-1], timeout=3 * WAIT)
        await reader.stop()
        got += list(zip(reader.items, reader.positions, strict=True))

    items = [i for i, _ in got]
    assert thread_events(items) == list(zip(offsets, events, strict=True))
    # Lagging resubscribed from where it stopped: complete, never a snapshot, no reconnect.
    subscribed = of_kind(items, Subscribed)
    assert len(subscribed) >= 2
    assert all(s.recovered and s.epoch == epoch for s in subscribed)
    assert of_kind(items, Snapshot) == []
    assert client.reconnects == 0
    positions = [p for i, p in got if isinstance(i, ThreadEvent)]
    assert positions == [Position(o, epoch) for o in offsets]
    await witness.stop()


# -- 5. chunk expansion and folded state --------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_expand_chunks_yields_start_content_end_with_source_offsets(
    mem: Env, encoding: str
) -> None:
    gateway = await mem.gateway()
    thread = "chunks"
    client = await mem.client(gateway, encoding)
    published = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "Hel"},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": "lo"},
        {"type": "TOOL_CALL_CHUNK", "toolCallId": "tc1", "toolCallName": "search",
         "parentMessageId": "m1", "delta": '{"q"'},
        {"type": "TOOL_CALL_CHUNK", "toolCallId": "tc1", "delta": ": 1}"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m2", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m2", "delta": "ok"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"done": True}},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]  # fmt: skip
    first = await client.publish(thread, published[:1])
    epoch = await gateway.store.epoch(thread)
    raw = client.subscribe(thread, "start")
    other = await mem.client(gateway, encoding)
    expanded = other.subscribe(thread, "start", expand_chunks=True, state=True)
    async with raw, expanded:
        await take(raw, 1)
        await take(expanded, 1)
        o = first + await client.publish(thread, published[1:])
        # The raw subscription yields what was stored, one item per offset.
        got_raw = await take(raw, len(published))
        assert thread_events([i for i, _ in got_raw]) == list(zip(o, published, strict=True))
        expected = [
            (o[0], published[0], o[0]),
            (o[1], {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}, o[0]),
            (o[1], {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hel"}, o[1]),
            (o[2], {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "lo"}, o[2]),
            (o[3], {"type": "TEXT_MESSAGE_END", "messageId": "m1"}, o[2]),
            (o[3], {"type": "TOOL_CALL_START", "toolCallId": "tc1", "toolCallName": "search",
                    "parentMessageId": "m1"}, o[2]),
            (o[3], {"type": "TOOL_CALL_ARGS", "toolCallId": "tc1", "delta": '{"q"'}, o[3]),
            (o[4], {"type": "TOOL_CALL_ARGS", "toolCallId": "tc1", "delta": ": 1}"}, o[4]),
            (o[5], {"type": "TOOL_CALL_END", "toolCallId": "tc1"}, o[4]),
            (o[5], {"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "assistant"}, o[5]),
            (o[6], {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "ok"}, o[6]),
            (o[7], {"type": "TEXT_MESSAGE_END", "messageId": "m2"}, o[6]),
            (o[7], published[7], o[7]),
            (o[8], published[8], o[8]),
        ]  # fmt: skip
        got = await take(expanded, len(expected))
        assert [(i.offset, i.event) for i, _ in got] == [(a, b) for a, b, _ in expected]
        # The position moves only with the last piece of a frame.
        assert [p for _, p in got] == [Position(c, epoch) for _, _, c in expected]
        assert all(isinstance(i, ThreadEvent) and i.thread == thread for i, _ in got)
        assert expanded.state is not None
        assert (expanded.state.messages, expanded.state.state) == folded(published)
        assert expanded.state.messages == [
            {"id": "m1", "role": "assistant", "content": "Hello",
             "toolCalls": [{"id": "tc1", "type": "function",
                            "function": {"name": "search", "arguments": '{"q": 1}'}}]},
            {"id": "m2", "role": "assistant", "content": "ok"},
        ]  # fmt: skip


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_state_follows_the_fold_of_the_thread(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "state"
    writer = env.writer()
    history = run_events(thread, "r1")
    offsets = await publish_all(writer, thread, history)
    client = await env.client(gateway, encoding)
    subs = {
        start: (await env.client(gateway, encoding)).subscribe(thread, start, state=True)
        for start in ("start", "snapshot")
    }
    subs["live"] = client.subscribe(thread, "live", state=True)
    readers = {start: Reader(await sub.open()) for start, sub in subs.items()}
    await readers["start"].until_offset(offsets[-1])
    await readers["snapshot"].until(lambda items: len(of_kind(items, Snapshot)) == 1)
    await readers["live"].until(lambda items: len(items) == 1)
    assert subs["start"].state is not None and subs["snapshot"].state is not None
    for start in ("start", "snapshot"):
        state = subs[start].state
        assert state is not None
        assert (state.messages, state.state) == folded(history), start
    live_state = subs["live"].state
    assert live_state is not None and (live_state.messages, live_state.state) == ([], {})

    second = run_events(thread, "r2", turns=3)
    more = await publish_all(writer, thread, second, batch=11)
    for reader in readers.values():
        await reader.until_offset(more[-1])
    for start, sub in subs.items():
        state = sub.state
        assert state is not None
        expected = folded(second) if start == "live" else folded(history + second)
        assert (state.messages, state.state) == expected, start
        assert state.messages != [] and state.state["progress"] == 3
    full = subs["start"].state
    assert full is not None and [r.run_id for r in full.runs] == ["r1", "r2"]
    for reader in readers.values():
        await reader.stop()


# -- 6. publishing through the client -------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_returns_offsets_and_reaches_another_client(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "published"
    publisher = await env.client(gateway, encoding)
    viewer = await env.client(gateway, "json" if encoding == "msgpack" else "msgpack")
    events = run_events(thread, "r1", turns=1)
    async with viewer.subscribe(thread, "live") as sub:
        await take(sub, 1)
        offsets = await publisher.publish(thread, events[:10])
        offsets += await publisher.publish(thread, events[10:])
        assert len(offsets) == len(events) and strictly_increasing(offsets)
        epoch = await gateway.store.epoch(thread)
        got = await take(sub, 1 + len(events))
        announce = got[0][0]  # the first event created the thread's epoch
        assert isinstance(announce, Subscribed)
        assert (announce.epoch, announce.recovered, announce.resumed) == (epoch, True, False)
        assert thread_events([i for i, _ in got]) == list(zip(offsets, events, strict=True))
    stored = await gateway.store.read(thread)
    assert [e.offset for e in stored] == offsets
    assert await publisher.publish(thread, []) == []


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_with_the_same_event_ids_stores_once(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "idempotent"
    client = await env.client(gateway, encoding)
    batch = opening(thread, "r1", "m1") + deltas("m1", 4)
    ids = [f"evt-{i}" for i in range(len(batch))]
    offsets = await client.publish(thread, batch, ids)
    again = await client.publish(thread, batch, ids)
    assert again == offsets
    # Half retried, half new: the known ids keep their offsets.
    end = [{"type": "TEXT_MESSAGE_END", "messageId": "m1"}]
    mixed = await client.publish(thread, [batch[-1], *end], [ids[-1], "evt-end"])
    assert mixed[0] == offsets[-1] and offset_key(mixed[1]) > offset_key(offsets[-1])
    # Another client retrying the same ids gets the same answer.
    other = await env.client(gateway, "json" if encoding == "msgpack" else "msgpack")
    assert await other.publish(thread, batch[:2], ids[:2]) == offsets[:2]
    stored = await gateway.store.read(thread)
    assert [e.offset for e in stored] == [*offsets, mixed[1]]
    assert [e.event_id for e in stored] == [*ids, "evt-end"]
    # Without ids the client makes up fresh ones: the same event is stored each time.
    await client.publish(thread, [{"type": "TEXT_MESSAGE_START", "messageId": "m2"}])
    delta = deltas("m2", 1)
    one, two = await client.publish(thread, delta), await client.publish(thread, delta)
    assert offset_key(mixed[1]) < offset_key(one[0]) < offset_key(two[0])
    stored = await gateway.store.read(thread, after=mixed[1])
    assert [e.offset for e in stored][1:] == [*one, *two]
    assert len({e.event_id for e in stored}) == 3


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_sequence_error_stores_nothing(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "sequence"
    client = await env.client(gateway, encoding)
    # The first event of a thread must start a run.
    with pytest.raises(SequenceError) as info:
        await client.publish(thread, deltas("m1", 1))
    assert info.value.rule == "run_not_started"
    assert info.value.code == "sequence_error"
    assert await gateway.store.epoch(thread) is None  # not even created

    offsets = await client.publish(thread, opening(thread, "r1", "m1"))
    # A batch whose last event breaks the rules: none of it is stored.
    bad = [*deltas("m1", 2), {"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"}]
    with pytest.raises(SequenceError) as info:
        await client.publish(thread, bad, ["b1", "b2", "b3"])
    assert info.value.rule == "message_not_open"
    assert info.value.index == 2  # from the error frame
    assert "nope" in str(info.value)
    with pytest.raises(SequenceError) as info:
        await client.publish(thread, [{"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"}])
    assert info.value.rule == "run_finished_with_open_items"
    assert [e.offset for e in await gateway.store.read(thread)] == offsets
    # The connection is fine, and the rejected ids were not taken.
    more = await client.publish(thread, bad[:2], ["b1", "b2"])
    assert [e.offset for e in await gateway.store.read(thread)] == offsets + more
    assert client.reconnects == 0 and client.connected


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_checks_locally_before_sending(
    mem: Env, encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    received = Received(monkeypatch)
    gateway = await mem.gateway()
    thread = "local"
    client = await mem.client(gateway, encoding, max_frame_bytes=4096)
    run = [{"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}]

    with pytest.raises(InvalidEvent):
        await client.publish(thread, [{"type": "NOT_AN_EVENT"}])
    with pytest.raises(InvalidEvent):
        await client.publish(thread, [*run, {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m"}])
    with pytest.raises(PayloadTooLarge) as too_large:
        await client.publish(thread, [*run, *deltas("m1", 1, size=10_000)])
    assert too_large.value.limit == 4096 and too_large.value.size > 10_000
    with pytest.raises(ValueError, match="1000"):
        await client.publish(thread, run + deltas("m1", 1000))
    with pytest.raises(ValueError, match="one id per event"):
        await client.publish(thread, run, ["a", "b"])
    # Nothing reached the gateway: the round trip of a ping comes after any of it.
    await asyncio.wait_for(client.ping(), WAIT)
    assert received.threads("publish") == []
    assert received.types() == ["ping"]  # what was sent: only the ping
    assert await gateway.store.epoch(thread) is None

    # Just under the limit is sent and stored.
    offsets = await client.publish(thread, [*run, {"type": "CUSTOM", "name": "pad",
                                                    "value": "x" * 3000}])  # fmt: skip
    assert received.threads("publish") == [thread]
    assert [e.offset for e in await gateway.store.read(thread)] == offsets


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_during_a_gateway_restart_completes_without_duplicates(
    env: Env, encoding: str
) -> None:
    port = free_port()
    gateway = await env.gateway(port)
    thread = "publish-restart"
    client = await env.client(port, encoding, backoff_min=0.05, backoff_max=0.3)
    events = opening(thread, "r1", "m1")
    offsets = await client.publish(thread, events)
    batches = [deltas("m1", 5, start=5 * i) for i in range(30)]
    answered: list[list[str]] = []

    async def publish_batches() -> None:
        for batch in batches:
            answered.append(await client.publish(thread, batch))
            await asyncio.sleep(0.01)

    publishing = asyncio.create_task(publish_batches())
    await wait_for(lambda: len(answered) >= 3)
    await asyncio.wait_for(gateway.drain(), WAIT)
    stopped_at = len(answered)
    await asyncio.sleep(0.3)
    assert not client.connected
    assert len(answered) <= stopped_at + 1  # publishes wait for the connection
    await env.gateway(port)
    await asyncio.wait_for(publishing, 3 * WAIT)
    assert stopped_at < len(batches) and len(answered) == len(batches)
    assert client.reconnects == 1

    offsets += [o for batch in answered for o in batch]
    events += [e for batch in batches for e in batch]
    assert strictly_increasing(offsets)
    # Stored once each, in order, exactly at the offsets the client was given.
    stored = await env.store().read(thread)
    assert [e.offset for e in stored] == offsets
    assert [msgpack.unpackb(e.data, raw=False) for e in stored] == events


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_retried_after_a_lost_reply_is_stored_once(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "lost-reply"
    client = await env.client(gateway, encoding, backoff_min=0.02, backoff_max=0.1)
    offsets = await client.publish(thread, opening(thread, "r1", "m1"))
    stored_calls: list[list[str]] = []
    original = gateway.hub.publish

    async def publish_then_cut(
        thread: str, events: Any, event_ids: Any = None, **options: Any
    ) -> list[str]:
        result = await original(thread, events, event_ids, **options)
        stored_calls.append(list(event_ids or []))
        if len(stored_calls) == 1:
            # Stored, but the connection dies before the reply leaves.
            for conn in list(gateway.connections):
                conn.ws.transport.abort()
        return result

    gateway.hub.publish = publish_then_cut  # type: ignore[method-assign]
    batch = deltas("m1", 4)
    more = await asyncio.wait_for(client.publish(thread, batch), WAIT)
    assert client.reconnects == 1 and client.close_code == 1006
    # The retry carried the same ids and was answered with the stored offsets.
    assert len(stored_calls) == 2 and stored_calls[0] == stored_calls[1]
    stored = await gateway.store.read(thread)
    assert [e.offset for e in stored] == offsets + more
    assert [msgpack.unpackb(e.data, raw=False) for e in stored][3:] == batch


# -- 7. errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_nothing_listening_raises_hub_unreachable_quickly(encoding: str) -> None:
    port = free_port()
    began = time.monotonic()
    client = HubClient(f"ws://127.0.0.1:{port}", encoding=encoding, open_timeout=WAIT)
    with pytest.raises(HubUnreachable) as info:
        await asyncio.wait_for(client.connect(), WAIT)
    assert time.monotonic() - began < 2 * TIMEOUT_SCALE
    assert str(port) in str(info.value)
    with pytest.raises(HubUnreachable):
        async with HubClient(f"ws://127.0.0.1:{port}", encoding=encoding):
            pass
    # Not a WebSocket URL at all.
    with pytest.raises(HubUnreachable):
        await HubClient(f"http://127.0.0.1:{port}").connect()
    # Used before connect: a clear error, not a hang.
    with pytest.raises(ClientError, match="connect"):
        await client.publish("t", [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}])


class RefuseAll:
    """An Authenticator refusing every token as revoked (HTTP 403), and anonymity."""

    anonymous: Identity | None = None

    def __init__(self) -> None:
        self.refused: list[Credentials] = []

    async def authenticate(self, credentials: Credentials) -> Identity:
        self.refused.append(credentials)
        raise Forbidden("these credentials were revoked")

    def revoked(self, identity: Identity) -> bool:
        return True

    def reload(self) -> None:
        pass


async def test_refused_connection_raises_connection_rejected(mem: Env) -> None:
    refuse = RefuseAll()
    gateway = await mem.gateway(authenticator=refuse)
    for encoding in ENCODINGS:
        # With a token: refusals happen at the handshake, where the token is
        # judged. (Without one, a gateway that requires authentication accepts
        # the connection and waits auth_timeout for an auth command, then
        # closes with 4401: tests/client/test_client_auth.py covers that.)
        client = HubClient(
            f"ws://127.0.0.1:{gateway.config.port}", encoding=encoding, token="refused"
        )
        with pytest.raises(ConnectionRejected) as info:
            await asyncio.wait_for(client.connect(), WAIT)
        assert info.value.close_code == CloseCode.FORBIDDEN  # HTTP 403
        assert not isinstance(info.value, HubUnreachable)
    assert refuse.refused == [Credentials("refused", TokenSource.HEADER)] * 2  # no retry
    assert gateway.connections == set()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_refused_subscription_fails_only_that_subscription(mem: Env, encoding: str) -> None:
    # Anonymous connections may read "public" only, and publish anywhere.
    gateway = await mem.gateway(
        authenticator=Anonymous(Grants(subscribe=("public",), publish=("*",)))
    )
    client = await mem.client(gateway, encoding)
    secret = client.subscribe("secret", "start")
    public = client.subscribe("public", "start")
    reader = Reader(await public.open())
    await reader.until(lambda items: len(items) == 1)
    with pytest.raises(CommandRejected) as info:
        async with asyncio.timeout(WAIT):
            async for _ in secret:
                pass
    assert info.value.code == "forbidden" and info.value.thread == "secret"
    with pytest.raises(CommandRejected):  # and it stays failed
        await asyncio.wait_for(anext(secret), WAIT)

    # The other subscription, the connection and publishing are fine.
    offsets = await client.publish("public", opening("public", "r1", "m1"))
    await client.publish("secret", opening("secret", "r1", "m1"))  # publishing is allowed
    await reader.until_offset(offsets[-1])
    assert thread_events(reader.items) == list(
        zip(offsets, opening("public", "r1", "m1"), strict=True)
    )
    assert not reader.ended and client.connected and client.reconnects == 0
    assert server_connection(gateway, client).threads == {"public"}
    # The refused thread is not held by the client: it may be asked for again (and refused again).
    again = client.subscribe("secret", "live")
    with pytest.raises(CommandRejected):
        await asyncio.wait_for(anext(again), WAIT)
    await reader.stop()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_give_up_after_raises_hub_unreachable_in_time(env: Env, encoding: str) -> None:
    port = free_port()
    gateway = await env.gateway(port)
    give_up = 1.0
    client = await env.client(
        port, encoding, backoff_min=0.05, backoff_max=0.2, give_up_after=give_up
    )
    reader = Reader(await client.subscribe("gone", "live").open())
    other = Reader(await client.subscribe("gone-too", "start").open())
    await reader.until(lambda items: len(items) == 1)
    began = time.monotonic()
    await asyncio.wait_for(gateway.drain(), WAIT)  # for good
    async with asyncio.timeout(give_up + 3 * TIMEOUT_SCALE):
        await reader.task
        await other.task
    elapsed = time.monotonic() - began
    assert isinstance(reader.error, HubUnreachable)
    assert isinstance(other.error, HubUnreachable)
    assert give_up - 0.05 <= elapsed <= give_up + 2 * TIMEOUT_SCALE
    assert client.reconnects == 0
    with pytest.raises(HubUnreachable):
        await asyncio.wait_for(
            client.publish("gone", [{"type": "RUN_STARTED", "threadId": "g", "runId": "r"}]),
            WAIT,
        )


async def test_subscribing_a_thread_twice_on_one_client_is_an_error(mem: Env) -> None:
    gateway = await mem.gateway()
    client = await mem.client(gateway)
    first = await client.subscribe("twice", "live").open()
    with pytest.raises(ValueError, match="already subscribed"):
        client.subscribe("twice", "start")
    # Two created before either is opened: the second one to open is refused.
    a, b = client.subscribe("pair"), client.subscribe("pair")
    await a.open()
    with pytest.raises(ValueError, match="already subscribed"):
        await b.open()
    with pytest.raises(ValueError):
        client.subscribe("x", "later")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.subscribe("x", max_queue=1)
    # Another client may follow the same thread; this one again after closing the first.
    other = await mem.client(gateway, "json")
    await other.subscribe("twice").open()
    await first.close()
    again = await client.subscribe("twice", "live").open()
    [(item, _)] = await take(again, 1)
    assert isinstance(item, Subscribed) and item.thread == "twice"


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_close_ends_every_subscription(mem: Env, encoding: str) -> None:
    gateway = await mem.gateway()
    client = await mem.client(gateway, encoding)
    readers = [Reader(await client.subscribe(t, "start").open()) for t in ("c1", "c2", "c3")]
    for reader in readers:
        await reader.until(lambda items: len(items) == 1)
    assert len(gateway.connections) == 1
    await asyncio.wait_for(client.close(), WAIT)
    async with asyncio.timeout(WAIT):
        for reader in readers:
            await reader.task
    assert all(r.ended and r.error is None for r in readers)  # iteration simply stopped
    assert client.state is ClientState.CLOSED and not client.connected
    await wait_for(lambda: not gateway.connections)
    with pytest.raises(ClientError):
        await client.publish("c1", [{"type": "RUN_STARTED", "threadId": "c1", "runId": "r"}])
    with pytest.raises(ClientError):
        await client.subscribe("c4").open()
    await client.close()  # twice is fine


# -- 8. fan-out ---------------------------------------------------------------------------------


async def test_two_clients_see_identical_sequences(env: Env) -> None:
    gateway = await env.gateway()
    thread = "fan-out"
    writer = env.writer()
    history = run_events(thread, "r1", turns=1)
    offsets = await publish_all(writer, thread, history)
    clients = [await env.client(gateway, encoding) for encoding in ENCODINGS]
    readers = [Reader(await c.subscribe(thread, "start").open()) for c in clients]
    publisher = await env.client(gateway, "json")
    more = run_events(thread, "r2")
    for i in range(0, len(more), 13):
        offsets += await publisher.publish(thread, more[i : i + 13])
    for reader in readers:
        await reader.until_offset(offsets[-1])
    a, b = (r.items for r in readers)
    assert a == b  # the same items, field by field, over msgpack and JSON
    assert thread_events(a) == list(zip(offsets, history + more, strict=True))
    assert readers[0].positions == readers[1].positions
    for reader in readers:
        await reader.stop()


# -- 9. run filter, stale positions, closes for good, headers, outages --------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_run_filter_survives_a_reconnect(mem: Env, encoding: str) -> None:
    gateway = await mem.gateway()
    thread = "runs"
    writer = mem.writer()
    run1, run2, run3 = (run_events(thread, r, turns=1) for r in ("r1", "r2", "r3"))
    offsets1 = await publish_all(writer, thread, run1)
    client = await mem.client(gateway, encoding, backoff_min=0.02, backoff_max=0.1)
    sub = await client.subscribe(thread, "start", run="r2").open()
    [(first, _)] = await take(sub, 1)
    assert isinstance(first, Subscribed) and first.recovered
    offsets2 = await publish_all(writer, thread, run2[:10])
    got = await take(sub, 10)
    server_connection(gateway, client).close_soon(CloseCode.SERVICE_RESTART, "restart")
    offsets2 += await publish_all(writer, thread, run2[10:])
    offsets3 = await publish_all(writer, thread, run3)
    got += await take_until_offset(sub, offsets2[-1])
    items = [i for i, _ in got]
    assert thread_events(items) == list(zip(offsets2, run2, strict=True))  # not r1, r3
    (resumed,) = of_kind(items, Subscribed)
    assert (resumed.resumed, resumed.recovered) == (True, True)
    assert offset_key(offsets1[-1]) < offset_key(offsets2[0])
    # Run 3 went by meanwhile: nothing of it comes.
    marker = await writer.publish(thread, [{"type": "RUN_STARTED", "threadId": thread,
                                            "runId": "r2"}])  # fmt: skip
    [(item, position)] = await take(sub, 1)
    assert item == ThreadEvent(thread, marker[0], {"type": "RUN_STARTED", "threadId": thread,
                                                    "runId": "r2"})  # fmt: skip
    assert offset_key(offsets3[-1]) < offset_key(marker[0])
    assert position == Position(marker[0], await gateway.store.epoch(thread))
    await sub.close()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_branch_survives_a_reconnect(mem: Env, encoding: str) -> None:
    """Resumed on its branch: nothing lost, nothing of another branch, and
    the runs that continued the branch while the connection was down."""
    gateway = await mem.gateway()
    thread = "branches"
    writer = mem.writer()

    def run(run_id: str, parent: str) -> list[dict[str, Any]]:
        events = run_events(thread, run_id, turns=1)
        events[0] = {**events[0], "parentRunId": parent}
        return events

    await publish_all(writer, thread, run_events(thread, "r1", turns=1))
    await publish_all(writer, thread, run("r2", "r1"))
    offsets3 = await publish_all(writer, thread, run("r3", "r1"))
    client = await mem.client(gateway, encoding, backoff_min=0.02, backoff_max=0.1)
    sub = await client.subscribe(thread, "start", branch="r3").open()
    got = await take_until_offset(sub, offsets3[-1])
    seen = thread_events([i for i, _ in got])
    assert {e.get("runId") for _, e in seen if "runId" in e} == {"r1", "r3"}
    server_connection(gateway, client).close_soon(CloseCode.SERVICE_RESTART, "restart")
    offsets4 = await publish_all(writer, thread, run("r4", "r3"))  # continues the branch
    await publish_all(writer, thread, run("r5", "r2"))  # another branch
    offsets6 = await publish_all(writer, thread, run("r6", "r4"))
    got = await take_until_offset(sub, offsets6[-1])
    events = thread_events([i for i, _ in got])
    assert {e.get("runId") for _, e in events if "runId" in e} == {"r4", "r6"}
    assert [o for o, _ in events] == offsets4 + offsets6  # every one, once, in order
    assert sub.branch == "r6"
    await sub.close()


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_subscribe_from_a_position_of_another_epoch(env: Env, encoding: str) -> None:
    gateway = await env.gateway()
    thread = "other-epoch"
    writer = env.writer()
    events = run_events(thread, "r1", turns=1)
    offsets = await publish_all(writer, thread, events)
    epoch = await gateway.store.epoch(thread)
    stale = Position(offsets[3], "0" * 16 if epoch != "0" * 16 else "1" * 16)
    client = await env.client(gateway, encoding)
    async with client.subscribe(thread, stale, state=True) as sub:
        assert sub.position == stale
        (resync, pos1), (snap, pos2) = await take(sub, 2)
    assert resync == Subscribed(thread, epoch, offsets[-1], recovered=False, resumed=False)
    assert pos1 == stale
    assert isinstance(snap, Snapshot) and (snap.offset, snap.epoch) == (offsets[-1], epoch)
    assert pos2 == Position(offsets[-1], epoch)
    assert sub.state is not None and (sub.state.messages, sub.state.state) == folded(events)


@pytest.mark.parametrize("code", [CloseCode.UNAUTHORIZED, CloseCode.FORBIDDEN, CloseCode.NORMAL])
async def test_gateway_closing_for_good_is_not_retried(mem: Env, code: CloseCode) -> None:
    gateway = await mem.gateway()
    client = await mem.client(gateway, backoff_min=0.01, backoff_max=0.05)
    reader = Reader(await client.subscribe("t", "live").open())
    await reader.until(lambda items: len(items) == 1)
    server_connection(gateway, client).close_soon(code, "go away")
    async with asyncio.timeout(WAIT):
        await reader.task
    assert isinstance(reader.error, ConnectionRejected)
    assert reader.error.close_code == code
    await asyncio.sleep(0.2)  # time enough for several retries
    assert client.reconnects == 0 and not gateway.connections
    with pytest.raises(ConnectionRejected):
        await asyncio.wait_for(client.ping(), WAIT)


async def test_headers_reach_the_authenticator(mem: Env) -> None:
    class Tokens:
        """Accepts the token "good" only; no anonymous access."""

        anonymous: Identity | None = None

        def __init__(self) -> None:
            self.seen: list[Credentials] = []

        async def authenticate(self, credentials: Credentials) -> Identity:
            self.seen.append(credentials)
            if credentials.token != "good":
                raise Unauthorized("not a good token")
            return Identity("good", Grants.everything())

        def revoked(self, identity: Identity) -> bool:
            return False

        def reload(self) -> None:
            pass

    tokens = Tokens()
    gateway = await mem.gateway(authenticator=tokens)
    good = await mem.client(gateway, headers={"Authorization": "Bearer good"})
    assert await asyncio.wait_for(good.ping(), WAIT) >= 0
    url = f"ws://127.0.0.1:{gateway.config.port}"
    bad = HubClient(url, headers={"Authorization": "Bearer bad"})
    with pytest.raises(ConnectionRejected) as info:
        await asyncio.wait_for(bad.connect(), WAIT)
    assert info.value.close_code == CloseCode.UNAUTHORIZED  # HTTP 401
    assert tokens.seen == [
        Credentials("good", TokenSource.HEADER),
        Credentials("bad", TokenSource.HEADER),
    ]
    # An Authorization header that is not a bearer token is refused before
    # the authenticator is asked.
    malformed = HubClient(url, headers={"Authorization": "x"})
    with pytest.raises(ConnectionRejected):
        await asyncio.wait_for(malformed.connect(), WAIT)
    assert len(tokens.seen) == 2


async def test_subscribing_while_reconnecting_takes_effect_once_back(env: Env) -> None:
    port = free_port()
    gateway = await env.gateway(port)
    client = await env.client(port, backoff_min=0.05, backoff_max=0.2)
    writer = env.writer()
    events = run_events("outage", "r1", turns=1)
    offsets = await publish_all(writer, "outage", events)
    await asyncio.wait_for(gateway.drain(), WAIT)
    await wait_for(lambda: not client.connected)
    sub = await client.subscribe("outage", "start").open()  # while no connection
    await env.gateway(port)
    got = await take(sub, 1 + len(events))
    assert got[0][0] == Subscribed(
        "outage", await writer.store.epoch("outage"), offsets[-1], recovered=True, resumed=False
    )
    assert thread_events([i for i, _ in got]) == list(zip(offsets, events, strict=True))
    assert client.reconnects == 1


# -- 10. regressions: bugs these tests found ------------------------------------------


def publish_frame_size(thread: str, event: Event, event_id: str, command_id: int, enc: str) -> int:
    """The size of the publish frame the client sends (docs/protocol.md, publish)."""
    frame = {"type": "publish", "thread": thread, "events": [event], "eventIds": [event_id],
             "id": command_id}  # fmt: skip
    if enc == "msgpack":
        return len(msgpack.packb(frame, use_bin_type=True))
    return len(json.dumps(frame, ensure_ascii=False, separators=(",", ":")).encode())


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_publish_just_over_the_frame_limit_is_refused_locally(
    mem: Env, encoding: str
) -> None:
    limit = 4096
    gateway = await mem.gateway(max_frame_bytes=limit)
    thread = "edge"
    client = await mem.client(gateway, encoding, max_frame_bytes=limit)
    reader = Reader(await client.subscribe(thread, "live").open())
    await client.publish(thread, [{"type": "RUN_STARTED", "threadId": thread, "runId": "r"}])
    for _ in range(300):  # command ids now take 3 digits / 2 msgpack bytes, not 1
        await asyncio.wait_for(client.ping(), WAIT)
    # An event whose publish frame is at the limit with id 0, and over it with a real id.
    event: Event = {"type": "CUSTOM", "name": "pad", "value": ""}
    for pad in range(limit, 0, -1):
        event["value"] = "x" * pad
        if publish_frame_size(thread, event, "e1", 0, encoding) <= limit:
            break
    assert publish_frame_size(thread, event, "e1", 0, encoding) <= limit
    assert publish_frame_size(thread, event, "e1", 300, encoding) > limit
    with pytest.raises(PayloadTooLarge):
        await asyncio.wait_for(client.publish(thread, [event], ["e1"]), WAIT)
    # Refused before sending: the connection and the subscriptions on it are untouched.
    await asyncio.wait_for(client.ping(), WAIT)
    assert client.reconnects == 0 and client.close_code is None
    assert len(of_kind(reader.items, Subscribed)) == 2  # the reply and the epoch's announcement
    await reader.stop()


async def test_close_ends_a_publish_waiting_for_the_connection(mem: Env) -> None:
    port = free_port()
    gateway = await mem.gateway(port)
    client = await mem.client(port, backoff_min=0.05, backoff_max=0.2)  # give_up_after=None
    await asyncio.wait_for(gateway.drain(), WAIT)  # and no gateway comes back
    await wait_for(lambda: not client.connected)
    publishing = asyncio.create_task(
        client.publish("t", [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}])
    )
    await asyncio.sleep(0.2)
    assert not publishing.done()  # waiting for the connection, as it should
    await asyncio.wait_for(client.close(), WAIT)
    try:
        async with asyncio.timeout(TIMEOUT_SCALE):
            with pytest.raises(ClientError):
                await publishing
    finally:
        publishing.cancel()


async def test_giving_up_ends_a_publish_waiting_for_the_connection(mem: Env) -> None:
    port = free_port()
    gateway = await mem.gateway(port)
    give_up, own = 0.5, 3 * TIMEOUT_SCALE  # the client gives up long before the publish would
    client = await mem.client(port, backoff_min=0.05, backoff_max=0.2, give_up_after=give_up)
    began = time.monotonic()
    await asyncio.wait_for(gateway.drain(), WAIT)
    await wait_for(lambda: not client.connected)
    publishing = asyncio.create_task(
        client.publish("t", [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}], timeout=own)
    )
    try:
        with pytest.raises(HubUnreachable):
            await asyncio.wait_for(publishing, WAIT)
        assert time.monotonic() - began < give_up + 1.5 * TIMEOUT_SCALE < own
    finally:
        publishing.cancel()


@pytest.mark.parametrize("continuation", ["with-id", "without-id"])
async def test_chunk_stream_continues_across_a_snapshot(mem: Env, continuation: str) -> None:
    gateway = await mem.gateway()
    thread = "chunk-snapshot"
    client = await mem.client(gateway)
    head = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "Hel"},
    ]
    await client.publish(thread, head)
    late = await mem.client(gateway, "json")
    sub = await late.subscribe(thread, "snapshot", expand_chunks=True, state=True).open()
    (_, _), (snap, _) = await take(sub, 2)
    assert isinstance(snap, Snapshot)
    more: Event = {"type": "TEXT_MESSAGE_CHUNK", "delta": "lo"}
    if continuation == "with-id":
        more["messageId"] = "m1"
    tail = [more, {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"}]
    offsets = await client.publish(thread, tail)
    got = await take_until_offset(sub, offsets[-1])
    expanded = [i.event for i, _ in got if isinstance(i, ThreadEvent)]
    assert expanded == [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "lo"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        tail[-1],
    ]
    # The snapshot and what follows it make one valid AG-UI sequence...
    verifier = SequenceVerifier(thread=thread)
    for event in [*snap.events, *expanded]:
        verifier.verify(event)
    # ... and the state is the thread's.
    assert sub.state is not None
    assert (sub.state.messages, sub.state.state) == folded(head + tail)


async def test_subscribing_right_after_connecting_sends_one_subscribe(
    mem: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection task must not resubscribe what subscribe() just sent."""
    received = Received(monkeypatch)
    gateway = await mem.gateway()
    thread = "once"
    writer = mem.writer()
    events = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *deltas("m1", 50),
    ]
    offsets = await writer.publish(thread, events[:2])
    offsets += await writer.publish(thread, events[2:])
    # As in the README: nothing between connecting and subscribing (not even the
    # loop iteration that asyncio.wait_for would add).
    async with asyncio.timeout(WAIT):
        async with (
            HubClient(f"ws://127.0.0.1:{gateway.config.port}") as client,
            client.subscribe(thread, "start") as sub,
        ):
            got = await take_until_offset(sub, offsets[-1])
            await client.ping()
    assert [i.offset for i, _ in got if isinstance(i, ThreadEvent)] == offsets
    assert received.threads("subscribe") == [thread]


# -- 11. failing gateways: backoff, untrusted replies, frames the client cannot take ---------


Handler = Callable[["FakeGateway", ServerConnection], Awaitable[None]]


class FakeGateway:
    """A stand-in gateway on 127.0.0.1: accepts the agui-hub subprotocols and runs *handler*.

    For what a real gateway does not do on purpose (fail every connection, reply
    wrongly, send frames over the client's limits). ``connected`` has the
    monotonic time of every accepted connection, ``commands`` every command
    received (JSON subprotocol).
    """

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.connected: list[float] = []
        self.commands: list[dict[str, Any]] = []
        self._server: Server | None = None

    async def __aenter__(self) -> FakeGateway:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            self.port,
            subprotocols=[Subprotocol(SUBPROTOCOL_JSON), Subprotocol(SUBPROTOCOL_MSGPACK)],
            max_size=None,
            ping_interval=None,
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await asyncio.wait_for(self._server.wait_closed(), WAIT)

    async def _handle(self, ws: ServerConnection) -> None:
        self.connected.append(time.monotonic())
        with contextlib.suppress(ConnectionClosed):
            await self.handler(self, ws)

    async def commands_of(self, ws: ServerConnection) -> AsyncIterator[dict[str, Any]]:
        async for data in ws:
            command = json.loads(data)
            self.commands.append(command)
            yield command


def frame(**fields: Any) -> str:
    return json.dumps(fields)


async def close_at_once(fake: FakeGateway, ws: ServerConnection) -> None:
    await ws.close(CloseCode.INTERNAL_ERROR, "internal error")


async def close_on_subscribe(fake: FakeGateway, ws: ServerConnection) -> None:
    async for command in fake.commands_of(ws):
        await ws.send(frame(type="error", id=command["id"], code="store_unavailable",
                            message="store unavailable", thread=command.get("thread")))  # fmt: skip
        await ws.close(CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")


@pytest.mark.parametrize(
    ("failing", "jitter"), [(close_at_once, "max"), (close_on_subscribe, "random")]
)
async def test_a_gateway_that_fails_every_connection_is_not_hammered(
    monkeypatch: pytest.MonkeyPatch, failing: Handler, jitter: str
) -> None:
    """The backoff grows over accepted-then-failed connections (it used to restart at ~0)."""
    if jitter == "max":  # every pause at its cap: 0.05, 0.1, 0.2, 0.4, 0.8, 1, 1, ...
        monkeypatch.setattr(random, "uniform", lambda low, high: high)
    window = 3.0
    async with FakeGateway(failing) as fake:
        client = HubClient(fake.url, encoding="json", backoff_min=0.05, backoff_max=1.0)
        await asyncio.wait_for(client.connect(), WAIT)
        sub = await client.subscribe("t", "live").open()
        try:
            await asyncio.sleep(window)
        finally:
            await asyncio.wait_for(client.close(), WAIT)
        assert sub._error is None  # still trying: none of these closes is final
    began = fake.connected[0]
    reconnects = len([t for t in fake.connected if t - began <= window]) - 1
    gaps = [b - a for a, b in itertools.pairwise(fake.connected)]
    if jitter == "max":
        # 0.05 + 0.1 + 0.2 + 0.4 + 0.8 + 1 = 2.55 s: six reconnects in 3 s (168 in 5 s before).
        assert 4 <= reconnects <= 7, gaps
        caps = [min(1.0, 0.05 * 2**n) for n in range(len(gaps))]
        assert all(gap >= 0.9 * cap for gap, cap in zip(gaps, caps, strict=True)), gaps
        assert gaps[3] > 4 * gaps[0], gaps
    else:
        # Full jitter: ~10 on average in 3 s; the bound is far above any likely draw.
        assert 3 <= reconnects <= 20, gaps


@pytest.mark.parametrize("proof", ["subscribed", "pong"])
async def test_backoff_starts_again_once_a_connection_proved_healthy(
    mem: Env, monkeypatch: pytest.MonkeyPatch, proof: str
) -> None:
    """A subscription confirmed, or a command answered, resets the pause to backoff_min."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    gateway = await mem.gateway()
    client = await mem.client(gateway, backoff_min=0.05, backoff_max=5.0)
    reader = None
    if proof == "subscribed":
        reader = Reader(await client.subscribe("healthy", "live").open())
        await reader.until(lambda items: len(items) == 1)
    began = time.monotonic()
    drops = 6  # without resets: 0.05 + 0.1 + ... + 1.6 = 3.15 s of pauses
    for n in range(1, drops + 1):
        if proof == "pong":
            await asyncio.wait_for(client.ping(), WAIT)
        server_connection(gateway, client).close_soon(CloseCode.INTERNAL_ERROR, "internal error")
        if reader is not None:
            await reader.until(lambda items, n=n: len(of_kind(items, Subscribed)) > n)
        else:
            await wait_for(lambda n=n: client.reconnects == n and client.connected)
    assert client.reconnects == drops
    assert time.monotonic() - began < 1.5 * TIMEOUT_SCALE
    if reader is not None:
        await reader.stop()


OLD_EPOCH, NEW_EPOCH, THIRD_EPOCH = "a" * 16, "b" * 16, "c" * 16


async def recovers_in_another_epoch(fake: FakeGateway, ws: ServerConnection) -> None:
    """Answers a resume with recovered: true in a new epoch (the bug the client must catch)."""
    snapshots = 0
    async for command in fake.commands_of(ws):
        thread, start, command_id = command["thread"], command["from"], command["id"]
        if isinstance(start, dict):
            await ws.send(frame(type="subscribed", id=command_id, thread=thread,
                                epoch=NEW_EPOCH, offset="9-0", recovered=True))  # fmt: skip
            # An event of the new epoch that does not follow the client's position.
            await ws.send(frame(type="event", thread=thread, offset="5-0",
                                event={"type": "CUSTOM", "name": "stale", "value": 5}))  # fmt: skip
        elif start == "snapshot":
            snapshots += 1
            epoch, at, then = (NEW_EPOCH, 9, 10) if snapshots == 1 else (THIRD_EPOCH, 20, 21)
            await ws.send(frame(type="subscribed", id=command_id, thread=thread, epoch=epoch,
                                offset=f"{at}-0", recovered=True))  # fmt: skip
            await ws.send(frame(type="snapshot", thread=thread, offset=f"{at}-0", epoch=epoch,
                                complete=True, events=[{"type": "CUSTOM", "name": "s",
                                                        "value": at}]))  # fmt: skip
            await ws.send(frame(type="event", thread=thread, offset=f"{then}-0",
                                event={"type": "CUSTOM", "name": "e", "value": then}))  # fmt: skip
            if snapshots == 1:
                # An announcement claiming recovery across epochs: not trusted either.
                await ws.send(frame(type="subscribed", thread=thread, epoch=THIRD_EPOCH,
                                    offset="11-0", recovered=True))  # fmt: skip
                stale = {"type": "CUSTOM", "name": "stale", "value": 11}
                await ws.send(frame(type="event", thread=thread, offset="11-0", event=stale))


async def test_recovered_true_in_another_epoch_is_not_trusted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="agui_hub.client")
    start = Position("3-0", OLD_EPOCH)
    async with (
        FakeGateway(recovers_in_another_epoch) as fake,
        HubClient(fake.url, encoding="json") as client,
    ):
        sub = await client.subscribe("t", start).open()
        got = await take(sub, 6)
    items = [item for item, _ in got]
    assert items == [
        Subscribed("t", NEW_EPOCH, "9-0", recovered=False, resumed=False),
        Snapshot("t", "9-0", NEW_EPOCH, True, [{"type": "CUSTOM", "name": "s", "value": 9}]),
        ThreadEvent("t", "10-0", {"type": "CUSTOM", "name": "e", "value": 10}),
        Subscribed("t", THIRD_EPOCH, "20-0", recovered=False, resumed=True),
        Snapshot("t", "20-0", THIRD_EPOCH, True, [{"type": "CUSTOM", "name": "s", "value": 20}]),
        ThreadEvent("t", "21-0", {"type": "CUSTOM", "name": "e", "value": 21}),
    ]
    assert [position for _, position in got] == [
        start,
        Position("9-0", NEW_EPOCH),
        Position("10-0", NEW_EPOCH),
        Position("10-0", NEW_EPOCH),
        Position("20-0", THIRD_EPOCH),
        Position("21-0", THIRD_EPOCH),
    ]
    assert [c["from"] for c in fake.commands] == [start.to_json(), "snapshot", "snapshot"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("not trusted" in w for w in warnings), warnings


def snapshot_of(thread: str, size: int) -> str:
    """A snapshot frame of about *size* bytes: one long message, as a 27 MB thread has."""
    events = [
        {"type": "MESSAGES_SNAPSHOT",
         "messages": [{"id": "m1", "role": "assistant", "content": "x" * size}]},
    ]  # fmt: skip
    return frame(type="snapshot", thread=thread, offset="1-0", epoch=NEW_EPOCH, complete=True,
                 events=events)  # fmt: skip


def sends_after_subscribe(payload: str | bytes) -> Handler:
    async def handler(fake: FakeGateway, ws: ServerConnection) -> None:
        async for command in fake.commands_of(ws):
            await ws.send(frame(type="subscribed", id=command["id"], thread=command["thread"],
                                epoch=NEW_EPOCH, offset="1-0", recovered=True))  # fmt: skip
            if isinstance(payload, bytes):
                await ws.send(payload, text=True)  # a text frame that is not UTF-8
            else:
                await ws.send(payload)
        await ws.wait_closed()

    return handler


async def test_the_default_receive_limit_takes_a_large_snapshot() -> None:
    size = 30_000_000
    async with (
        FakeGateway(sends_after_subscribe(snapshot_of("big", size))) as fake,
        HubClient(fake.url, encoding="json") as client,
    ):
        assert client.max_receive_bytes is not None and client.max_receive_bytes >= 64 * 2**20
        sub = await client.subscribe("big", "snapshot").open()
        (_, _), (snap, _) = await take(sub, 2)
        assert isinstance(snap, Snapshot)
        assert len(snap.events[0]["messages"][0]["content"]) == size
        assert client.reconnects == 0


@pytest.mark.parametrize("sent", ["over max_receive_bytes", "not UTF-8"])
async def test_a_gateway_frame_the_client_cannot_take_ends_it_without_a_reconnect_loop(
    sent: str,
) -> None:
    limit = 64 * 1024
    if sent == "not UTF-8":
        payload: str | bytes = b'{"type": "event", "thread": "t", "\xff": 1}'
        code = 1007
    else:
        payload, code = snapshot_of("t", 2 * limit), 1009
    async with FakeGateway(sends_after_subscribe(payload)) as fake:
        client = HubClient(fake.url, encoding="json", backoff_min=0.01, backoff_max=0.05,
                           max_receive_bytes=limit)  # fmt: skip
        try:
            await asyncio.wait_for(client.connect(), WAIT)
            reader = Reader(await client.subscribe("t", "snapshot").open())
            async with asyncio.timeout(WAIT):
                await reader.task
            assert isinstance(reader.error, ConnectionRejected), reader.error
            assert reader.error.close_code == code == client.close_code
            if code == 1009:
                assert "max_receive_bytes" in str(reader.error), str(reader.error)
            assert "not reconnecting" in str(reader.error)
            await asyncio.sleep(0.3)  # time enough for many reconnects (there used to be)
            assert len(fake.connected) == 1 and client.reconnects == 0
            with pytest.raises(ConnectionRejected):
                await asyncio.wait_for(client.ping(), WAIT)
        finally:
            await asyncio.wait_for(client.close(), WAIT)


def closes_with(code: int) -> Handler:
    async def handler(fake: FakeGateway, ws: ServerConnection) -> None:
        await ws.close(code, "refused")

    return handler


@pytest.mark.parametrize("code", [1002, 1007, 1009])
async def test_a_gateway_refusing_the_client_frames_is_not_retried_in_a_loop(code: int) -> None:
    """Codes that say "fix the client": one resume, then a final error if nothing was answered."""
    async with FakeGateway(closes_with(code)) as fake:
        client = HubClient(fake.url, encoding="json", backoff_min=0.01, backoff_max=0.05)
        try:
            await asyncio.wait_for(client.connect(), WAIT)
            reader = Reader(await client.subscribe("t", "live").open())
            async with asyncio.timeout(WAIT):
                await reader.task
            assert isinstance(reader.error, ConnectionRejected), reader.error
            assert reader.error.close_code == code and "twice" in str(reader.error)
            await asyncio.sleep(0.3)
            assert len(fake.connected) == 2 and client.reconnects == 1
        finally:
            await asyncio.wait_for(client.close(), WAIT)


@pytest.mark.parametrize(
    "code",
    [CloseCode.GOING_AWAY, CloseCode.INTERNAL_ERROR, CloseCode.SERVICE_RESTART,
     CloseCode.TRY_AGAIN_LATER, CloseCode.SLOW_CONSUMER, CloseCode.IDLE_TIMEOUT],
)  # fmt: skip
async def test_every_resumable_close_code_resumes(mem: Env, code: CloseCode) -> None:
    gateway = await mem.gateway()
    thread = "codes"
    client = await mem.client(gateway, backoff_min=0.01, backoff_max=0.05)
    reader = Reader(await client.subscribe(thread, "start").open())
    first = await client.publish(thread, opening(thread, "r1", "m1"))
    await reader.until_offset(first[-1])
    for n in range(1, 4):  # again and again: each resume proved the connection healthy
        server_connection(gateway, client).close_soon(code, "bye")
        await reader.until(lambda items, n=n: len([i for i in of_kind(items, Subscribed)
                                                   if i.resumed]) == n)  # fmt: skip
        assert client.close_code == code and client.reconnects == n
    more = await client.publish(thread, deltas("m1", 3))
    await reader.until_offset(more[-1])
    assert [offset for offset, _ in thread_events(reader.items)] == first + more
    assert not reader.ended
    await reader.stop()


async def test_gateway_closing_with_1009_fails_the_publish_and_resumes(mem: Env) -> None:
    """A client whose max_frame_bytes is over the gateway's: the publish fails, the rest resumes."""
    gateway = await mem.gateway(max_frame_bytes=4096)
    thread = "too-big"
    client = await mem.client(gateway, backoff_min=0.01, backoff_max=0.05,
                              max_frame_bytes=1024 * 1024)  # fmt: skip
    reader = Reader(await client.subscribe(thread, "start").open())
    first = await client.publish(thread, opening(thread, "r1", "m1"))
    # Over the gateway's WebSocket frame limit (a few times max_frame_bytes), not
    # only over max_frame_bytes (which is answered payload_too_large, no close).
    big: Event = {"type": "CUSTOM", "name": "pad", "value": "x" * (32 * 4096)}
    for n in range(1, 3):  # twice: a resume in between proved the connection healthy
        with pytest.raises(CommandRejected) as info:
            await asyncio.wait_for(client.publish(thread, [big]), WAIT)
        assert info.value.code == "payload_too_large"
        await reader.until(lambda items, n=n: len([i for i in of_kind(items, Subscribed)
                                                   if i.resumed]) == n)  # fmt: skip
        assert client.close_code == 1009 and client.reconnects == n
    more = await client.publish(thread, deltas("m1", 2))
    await reader.until_offset(more[-1])
    assert [offset for offset, _ in thread_events(reader.items)] == first + more
    await reader.stop()
