"""How a connection delivers frames: flushed at the end of a turn, or by its writer.

Every frame goes into the connection's bounded queue. At the end of the turn
of the event loop the gateway flushes the queues that got frames: written to
the socket there and then while it has room (``Connection.flush``), left to
the connection's writer task while the socket is over its high-water mark
(docs/gateway.md, "Slow consumers"). These tests run a real gateway on the
memory store with real WebSocket clients on 127.0.0.1, and check what that
must not change: every viewer gets the stored order, a client that stops
reading is still dropped, the counters count what was sent, and a connection
going away under a write never disturbs the thread's other viewers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from agui_hub.gateway import connection
from agui_hub.gateway.connection import Connection, ConnectionState
from agui_hub.gateway.server import Gateway
from agui_hub.wire.codec import Encoding
from agui_hub.wire.protocol import CloseCode, encode_frame, pong_frame

from ..conftest import TIMEOUT_SCALE
from .test_server import JSON, MSGPACK, WAIT, Client, Frame, Harness, memory_store, text_deltas

pytestmark = pytest.mark.timeout(60)

WRITE_TIMEOUT = 0.5
"""The gateway's write_timeout in the tests of a client that stops reading."""


@pytest.fixture
async def mem() -> AsyncIterator[Harness]:
    h = Harness(memory_store)
    try:
        yield h
    finally:
        await h.close()


@dataclass
class Paths:
    """How many frames went out each way."""

    flushed: int = 0
    """Written by a flush at the end of a turn of the event loop."""
    queued: int = 0
    """Written by a connection's writer task."""


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> Paths:
    """Counts the frames each way writes."""
    counted = Paths()
    flush = Connection.flush
    write_messages = connection.write_messages

    def counting_flush(self: Connection) -> None:
        before = self.gateway.counters.frames_out
        flush(self)
        counted.flushed += self.gateway.counters.frames_out - before

    async def counting_write_messages(ws: Any, frames: list[bytes | str]) -> None:
        counted.queued += len(frames)
        await write_messages(ws, frames)

    monkeypatch.setattr(Connection, "flush", counting_flush)
    monkeypatch.setattr(connection, "write_messages", counting_write_messages)
    return counted


@dataclass
class Recorder:
    """Reads every frame of one client in the background, optionally slowly."""

    client: Client
    pause_every: int = 0
    pause: float = 0.0
    frames: list[Frame] = field(default_factory=list)
    messages: int = 0
    size: int = 0
    closed: int | None = None
    task: asyncio.Task[None] | None = None

    def start(self) -> Recorder:
        self.task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        try:
            for _ in range(10_000_000):
                data = await self.client.ws.recv()
                self.messages += 1
                self.size += len(data)
                self.frames.append(self.client.decode(data))
                if self.pause_every and self.messages % self.pause_every == 0:
                    await asyncio.sleep(self.pause)
        except ConnectionClosed:
            self.closed = self.client.ws.close_code

    def offsets(self, thread: str) -> list[str]:
        return [f["offset"] for f in self.frames if f["type"] == "event" and f["thread"] == thread]

    def has(self, predicate: Any) -> bool:
        return any(predicate(f) for f in self.frames)

    async def wait_for(self, predicate: Any, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            frames = self.frames
            if any(predicate(f) for f in frames[seen:]):
                return
            seen = len(frames)
            if self.task is not None and self.task.done():
                break
            await asyncio.sleep(0.01)
        raise AssertionError(f"not received in time; last frames: {self.frames[-2:]}")

    async def wait_for_offset(self, thread: str, offset: str, timeout: float = WAIT) -> None:
        await self.wait_for(
            lambda f: f["type"] == "event" and f["thread"] == thread and f["offset"] == offset,
            timeout,
        )

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def small_window_client(h: Harness, gateway: Gateway, protocol: str) -> Client:
    """A client behind a slow link: 4 KiB socket buffers on both sides, so that what
    it has not read yet stays in the gateway's transport (loopback's kernel buffers
    would otherwise take megabytes)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.config.port)), WAIT
    )
    client = await h.client(gateway, protocol, sock=sock, max_queue=1, max_size=None)
    theirs = connection_of(gateway, client).ws.transport.get_extra_info("socket")
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    return client


def connection_of(gateway: Gateway, client: Client) -> Connection:
    port = client.ws.local_address[1]
    (conn,) = [c for c in gateway.connections if c.ws.remote_address[1] == port]  # type: ignore[index]
    return conn


async def gone(gateway: Gateway, conn: Connection, timeout: float) -> float:
    """Seconds until *conn* is no longer one of the gateway's connections."""
    started = time.monotonic()
    deadline = started + timeout
    while conn in gateway.connections:
        if time.monotonic() > deadline:
            raise AssertionError(f"connection still open after {timeout:.1f} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def start_events(thread: str) -> list[dict[str, Any]]:
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
    ]


def end_events(thread: str) -> list[dict[str, Any]]:
    return [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]


async def stored_after(gateway: Gateway, thread: str, offset: str) -> list[str]:
    return [e.offset for e in await gateway.store.read(thread, after=offset)]


# -- order ----------------------------------------------------------------------------------


async def test_order_holds_across_flushes_and_the_writers(mem: Harness, paths: Paths) -> None:
    # Single events (flushed to idle connections) between batches of 100
    # larger ones (past the socket's buffer: the writer takes the rest), to
    # prompt viewers and to slow ones behind small windows: every viewer gets
    # exactly the stored order, whichever way each frame went out.
    gateway = await mem.gateway(send_queue_bytes=256 * 1024)
    thread = "order"
    publisher = await mem.client(gateway, MSGPACK)
    await publisher.publish(thread, start_events(thread))
    recorders: list[tuple[Recorder, str]] = []
    for i in range(16):
        protocol = (JSON, MSGPACK)[i % 2]
        if i % 4 == 3:
            client = await small_window_client(mem, gateway, protocol)
            recorder = Recorder(client, pause_every=20, pause=0.002)
        else:
            recorder = Recorder(await mem.client(gateway, protocol))
        reply = await recorder.client.subscribe(thread, "live")
        recorders.append((recorder.start(), reply["offset"]))
    position = 0
    for _round in range(5):
        for _ in range(10):
            await publisher.publish(thread, text_deltas("m1", 1, start=position))
            position += 1
        await publisher.publish(thread, text_deltas("m1", 100, start=position, size=2048))
        position += 100
    (last,) = (await publisher.publish(thread, end_events(thread)))[-1:]
    try:
        for recorder, _ in recorders:
            await recorder.wait_for_offset(thread, last, timeout=3 * WAIT)
        for recorder, subscribed_at in recorders:
            expected = await stored_after(gateway, thread, subscribed_at)
            assert len(expected) == position + 2
            got = recorder.offsets(thread)
            first = next(
                (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), None
            )
            assert got == expected, f"{len(got)} events, the first out of place at {first}"
    finally:
        for recorder, _ in recorders:
            await recorder.stop()
    assert paths.flushed > 0, "no frame was written by a flush"
    assert paths.queued > 0, "no frame was written by a writer"


# -- a client that stops reading --------------------------------------------------------------


async def test_a_viewer_that_stops_reading_is_dropped_while_another_gets_everything(
    mem: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agui_hub.server")
    gateway = await mem.gateway(send_queue_bytes=64 * 1024, write_timeout=WRITE_TIMEOUT)
    thread = "stalls"
    publisher = await mem.client(gateway, MSGPACK)
    await publisher.publish(thread, start_events(thread))
    fast = Recorder(await mem.client(gateway, JSON))
    subscribed_at = (await fast.client.subscribe(thread, "live"))["offset"]
    fast.start()
    stalled = await small_window_client(mem, gateway, JSON)
    await stalled.subscribe(thread, "live")
    stalled_conn = connection_of(gateway, stalled)
    assert isinstance(stalled.ws.transport, asyncio.Transport)
    stalled.ws.transport.pause_reading()  # from here on it reads nothing
    try:
        # One event at a time, as a live run streams: 80 x 8 KiB, far more than
        # the stalled client's windows and the gateway's queue.
        offsets = []
        for i in range(80):
            offsets += await publisher.publish(thread, text_deltas("m1", 1, start=i, size=8192))
        offsets += await publisher.publish(thread, end_events(thread))
        published_at = time.monotonic()
        await fast.wait_for_offset(thread, offsets[-1])
        assert fast.offsets(thread) == await stored_after(gateway, thread, subscribed_at)
        # Nothing left its socket for write_timeout: dropped by the second look
        # of the watchdog at the latest.
        await gone(gateway, stalled_conn, (3 * WRITE_TIMEOUT + 2) * TIMEOUT_SCALE)
        took = time.monotonic() - published_at
        assert took <= (3 * WRITE_TIMEOUT + 2) * TIMEOUT_SCALE
        assert "no write progress" in caplog.text
        assert fast.closed is None
        await publisher.ping()  # the gateway and the others carry on
    finally:
        await fast.stop()


async def test_a_viewer_whose_buffer_one_flush_filled_is_still_dropped(
    mem: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # The frame that fills the socket's buffer is written by a flush, and then
    # the thread goes quiet: nothing is queued, so only the writer's wait for
    # the socket (under the watchdog) can notice that the client reads nothing.
    caplog.set_level(logging.INFO, logger="agui_hub.server")
    gateway = await mem.gateway(write_timeout=WRITE_TIMEOUT)
    thread = "one-big-frame"
    publisher = await mem.client(gateway, MSGPACK)
    await publisher.publish(thread, start_events(thread))
    stalled = await small_window_client(mem, gateway, JSON)
    await stalled.subscribe(thread, "live")
    conn = connection_of(gateway, stalled)
    assert isinstance(stalled.ws.transport, asyncio.Transport)
    stalled.ws.transport.pause_reading()
    (offset,) = await publisher.publish(thread, text_deltas("m1", 1, size=600_000))
    deadline = time.monotonic() + WAIT
    while not conn.ws.paused and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert conn.ws.paused, "the 600 KB frame did not fill the socket's buffer"
    assert not conn._queue, "the frame is still queued"
    assert conn.state is ConnectionState.OPEN
    await gone(gateway, conn, (3 * WRITE_TIMEOUT + 2) * TIMEOUT_SCALE)
    assert "no write progress" in caplog.text
    assert offset
    await publisher.ping()


# -- counters ---------------------------------------------------------------------------------


async def test_counters_count_every_frame_and_byte_sent(mem: Harness, paths: Paths) -> None:
    gateway = await mem.gateway(send_queue_bytes=128 * 1024)
    thread = "counted"
    # Every client reads from its first frame on, so that what all of them
    # received is everything the gateway sent (replies included).
    recorders = [Recorder(await mem.client(gateway, p)).start() for p in (JSON, MSGPACK) * 3]
    for protocol in (JSON, MSGPACK):  # behind slow links: their bursts are queued
        client = await small_window_client(mem, gateway, protocol)
        recorders.append(Recorder(client, pause_every=10, pause=0.005).start())
    publisher, viewers = recorders[0], recorders[1:]

    async def command(recorder: Recorder, frame: Frame) -> Frame:
        await recorder.client.send(frame)
        await recorder.wait_for(lambda f: f.get("id") == frame["id"])
        return next(f for f in recorder.frames if f.get("id") == frame["id"])

    published: list[str] = []

    async def publish(events: list[dict[str, Any]]) -> None:
        reply = await command(
            publisher,
            {"type": "publish", "id": f"p{len(published)}", "thread": thread, "events": events},
        )
        assert reply["type"] == "published", reply
        published.extend(reply["offsets"])

    try:
        await publish(start_events(thread))
        for viewer in viewers:
            reply = await command(
                viewer, {"type": "subscribe", "id": "s", "thread": thread, "from": "start"}
            )
            assert reply["type"] == "subscribed", reply
        for i in range(30):
            await publish(text_deltas("m1", 1, start=i))
        await publish(text_deltas("m1", 100, start=30, size=4096))  # a burst: queued in part
        for i in range(130, 150):
            await publish(text_deltas("m1", 1, start=i))
        await publish(end_events(thread))
        for viewer in viewers:
            await viewer.wait_for_offset(thread, published[-1])
            assert viewer.offsets(thread) == published
        for recorder in recorders:  # whatever was on its way has arrived
            await command(recorder, {"type": "ping", "id": "last"})
        counters = gateway.counters
        assert counters.frames_out == sum(r.messages for r in recorders)
        assert counters.bytes_out == sum(r.size for r in recorders)
        assert paths.flushed > 0 and paths.queued > 0
        assert counters.frames_out == paths.flushed + paths.queued
    finally:
        for recorder in recorders:
            await recorder.stop()


# -- connections going away under a write -----------------------------------------------------


async def test_connections_closing_mid_stream_never_disturb_the_channel(
    mem: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # Viewers leave while events are flushed to them, every way a connection
    # can end: the client aborts or closes, the gateway closes it or its
    # socket dies. The channel keeps relaying to everyone else.
    caplog.set_level(logging.WARNING)
    gateway = await mem.gateway()
    thread = "leaving"
    publisher = await mem.client(gateway, MSGPACK)
    await publisher.publish(thread, start_events(thread))
    recorders: list[Recorder] = []
    subscribed_at: list[str] = []
    for i in range(24):
        recorder = Recorder(await mem.client(gateway, (JSON, MSGPACK)[i % 2]))
        subscribed_at.append((await recorder.client.subscribe(thread, "live"))["offset"])
        recorders.append(recorder.start())
    channel = gateway.hub.channels[thread]
    conns = [connection_of(gateway, r.client) for r in recorders]
    leaving = {k: [(recorders[i], conns[i]) for i in range(k, 16, 4)] for k in range(4)}
    closers: list[asyncio.Task[None]] = []
    offsets: list[str] = []
    for i in range(160):
        offsets += await publisher.publish(thread, text_deltas("m1", 1, start=i))
        if i == 20:
            for recorder, _ in leaving[0]:
                recorder.client.ws.transport.abort()
        elif i == 50:
            for recorder, _ in leaving[1]:
                closers.append(asyncio.create_task(recorder.client.ws.close()))
        elif i == 80:
            for _, conn in leaving[2]:
                conn.close_soon(CloseCode.GOING_AWAY, "leaving")
        elif i == 110:
            for _, conn in leaving[3]:
                # Its socket dies, and frames come before the connection hears
                # of it: they are not written to the dead socket.
                conn.ws.transport.abort()
                for _ in range(50):
                    assert conn.send(encode_frame(pong_frame("x"), conn.encoding))
    offsets += await publisher.publish(thread, end_events(thread))
    stayed = recorders[16:]
    try:
        for recorder, at in zip(stayed, subscribed_at[16:], strict=True):
            await recorder.wait_for_offset(thread, offsets[-1])
            assert recorder.offsets(thread) == await stored_after(gateway, thread, at)
            assert recorder.closed is None
        for k in range(4):
            for _, conn in leaving[k]:
                await gone(gateway, conn, WAIT)
                assert conn not in channel.members
        assert gateway.hub.channels[thread] is channel, "the channel was rebuilt"
        assert len(channel.members) == len(stayed)
        problems = [
            r
            for r in caplog.records
            if r.levelno >= logging.ERROR or (r.levelno >= logging.WARNING and r.name == "asyncio")
        ]
        assert not problems, [r.getMessage() for r in problems]
        await asyncio.wait_for(asyncio.gather(*closers, return_exceptions=True), WAIT)
    finally:
        for recorder in recorders:
            await recorder.stop()


async def test_a_write_that_fails_closes_only_that_connection(
    mem: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # A transport that raises on write (uvloop's, once its handle is closed):
    # that connection is dropped, the channel and the other viewers carry on.
    gateway = await mem.gateway()
    thread = "write-fails"
    publisher = await mem.client(gateway, MSGPACK)
    await publisher.publish(thread, start_events(thread))
    recorders = [Recorder(await mem.client(gateway, p)) for p in (JSON, MSGPACK, JSON)]
    at = [(await r.client.subscribe(thread, "live"))["offset"] for r in recorders]
    for recorder in recorders:
        recorder.start()
    channel = gateway.hub.channels[thread]
    broken = connection_of(gateway, recorders[0].client)
    calls = 0

    def write(data: bytes) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("unable to perform operation: the handler is closed")

    broken.ws.transport.write = write  # type: ignore[method-assign]
    offsets: list[str] = []
    for i in range(20):
        offsets += await publisher.publish(thread, text_deltas("m1", 1, start=i))
    try:
        for recorder, subscribed_at in zip(recorders[1:], at[1:], strict=True):
            await recorder.wait_for_offset(thread, offsets[-1])
            assert recorder.offsets(thread) == await stored_after(gateway, thread, subscribed_at)
        await gone(gateway, broken, WAIT)
        assert calls == 1, "the broken connection was written to after it failed"
        failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [r.getMessage() for r in failures] == [f"connection {broken.remote}: write failed"]
        assert gateway.hub.channels[thread] is channel
        assert broken not in channel.members
    finally:
        for recorder in recorders:
            await recorder.stop()


async def test_frames_wait_for_the_writer_while_the_socket_is_full(mem: Harness) -> None:
    # While the writer waits for the socket, frames stay queued (a flush does
    # not write them past it), and go out after what it wrote, in order.
    gateway = await mem.gateway()
    client = await mem.client(gateway, MSGPACK)
    await client.ping()
    conn = connection_of(gateway, client)
    ws = conn.ws
    sent = gateway.counters.frames_out
    frames = [encode_frame(pong_frame(name), Encoding.MSGPACK) for name in "abcd"]
    ws.pause_writing()  # what the transport calls past the high-water mark
    try:
        conn.send(frames[0])
        deadline = time.monotonic() + WAIT
        while conn._watchdog is None and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert conn._watchdog is not None, "the writer does not wait for the socket"
        conn.send(frames[1])
        conn.send(frames[2])
        await asyncio.sleep(0.05)
        assert list(conn._queue) == frames[1:3], "written while the socket was full"
        assert gateway.counters.frames_out == sent + 1
    finally:
        ws.resume_writing()
    assert [(await client.recv())["id"] for _ in range(3)] == ["a", "b", "c"]
    assert gateway.counters.frames_out == sent + 3
    # Idle again: the next frame goes out with the flush of its turn.
    while conn._wake is None and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    conn.send(frames[3])
    assert (await client.recv())["id"] == "d"
    assert gateway.counters.frames_out == sent + 4
    assert conn._wake is not None and not conn._wake.done(), "the writer was woken"
