"""Departed clients leave nothing behind; a stalled store gives fast, clear answers.

Issue 10, "Every connection is freed, and every buffer is bounded" and "A
stalled store gives fast, clear answers", as real WebSocket clients against
in-process gateways (where the gateway's objects are inspected) and
``agui-hub serve`` processes (where their RSS and sockets are measured), on
the memory store and on real redis-server processes.

What "gone" means here, for a client that left (or stopped reading until the
gateway gave up on it):

- the gateway holds no :class:`~agui_hub.gateway.connection.Connection` for it
  (``gateway.connections``) and the thread's channel no member for it;
- once no viewer of a thread is left: no channel for the thread
  (``gateway.hub.channels``), no live feed in the store
  (``store.live_threads``) and no Redis pub/sub subscription to the thread's
  notify channel (``PUBSUB NUMSUB``);
- for a gateway process: no server-side TCP connection left (established or
  half-closed), and its RSS back within :data:`RSS_MARGIN` of its baseline.

Bounds used (each also in the assertion messages):

- an aborted client is gone within :data:`ABORT_GRACE` seconds;
- a client that stops reading is gone within ping_interval + ping_timeout +
  :data:`WS_CLOSE_TIMEOUT` (websockets' default close timeout, the longest a
  close handshake with a peer that reads nothing may take) + :data:`ABORT_GRACE`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from agui_hub.gateway.server import Gateway
from agui_hub.store import open_store
from agui_hub.store.contract import EventInput, ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore, notify_channel

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import GatewayProcess, start_gateway
from ..runs import new_thread
from .test_server import JSON, MSGPACK, WAIT, Client, Harness, events_of, http_get

KIB = 1024
MIB = 1024 * KIB

ABORT_GRACE = 5.0 * TIMEOUT_SCALE
"""Seconds a gateway may take to free what an aborted client held."""
WS_CLOSE_TIMEOUT = 10.0
"""websockets' default close timeout: a close handshake with a peer that reads
nothing is abandoned (transport aborted) after this long."""
PING = 1.0
"""ping_interval and ping_timeout of the gateways here that must notice stalled readers."""
STALLED_GRACE = (2 * PING + WS_CLOSE_TIMEOUT) * TIMEOUT_SCALE + ABORT_GRACE
"""Seconds a gateway may take to free a client that stopped reading. (websockets'
own keepalive cannot do it alone: once the peer's window is full the transport is
paused, and its ping waits in ``drain()`` for ever, so ping_timeout never starts.)"""
OP_TIMEOUT = 1.0
"""The store URL's ``op_timeout`` in the stalled-store tests."""
OUTAGE_GRACE = 2.0
"""The store URL's ``outage_grace`` in the stalled-store tests."""
RSS_MARGIN = 30 * MIB
"""How far above its baseline (its RSS after a first round of the same load) a
gateway process's RSS may be once a second round's clients are gone (30 clients
replaying 5 MiB of history each, then 32 MiB of live events published)."""


# -- events and stores ----------------------------------------------------------------------


def text_history(thread: str, count: int, size: int = 1000) -> list[dict[str, Any]]:
    """A run's start, a message's start, then *count* deltas of *size* characters."""
    pad = "x" * size
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *(
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"{i:06d}{pad}"}
            for i in range(count)
        ),
    ]


def text_more(start: int, count: int, size: int = 1000) -> list[dict[str, Any]]:
    pad = "x" * size
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"{i:06d}{pad}"}
        for i in range(start, start + count)
    ]


def blobs(start: int, count: int, size: int) -> list[dict[str, Any]]:
    """CUSTOM events: relayed like any other, folded into nothing (the reducer ignores
    them), so that a channel's folded state does not grow with them."""
    pad = "y" * size
    return [
        {"type": "CUSTOM", "name": "blob", "value": f"{i:06d}{pad}"}
        for i in range(start, start + count)
    ]


async def append_events(
    store: ThreadStore, thread: str, events: list[dict[str, Any]], *, batch: int = 500
) -> list[str]:
    """Append straight to the store (a producer writing to the store, not the gateway)."""
    tag = uuid.uuid4().hex[:8]
    offsets: list[str] = []
    for i in range(0, len(events), batch):
        chunk = events[i : i + batch]
        offsets += await store.append(
            thread, [EventInput.of(e, f"{tag}-{i + j}") for j, e in enumerate(chunk)]
        )
    return offsets


def stored(entries: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.offset, msgpack.unpackb(e.data, raw=False)) for e in entries]


@pytest.fixture(params=["memory", "redis"])
def store_maker(request: pytest.FixtureRequest) -> Callable[[], ThreadStore]:
    """Makes the store of this test's gateway: memory, or the shared Redis under a fresh prefix."""
    if request.param == "memory":
        return MemoryStore
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-leaks-{uuid.uuid4().hex}"
    return lambda: RedisStore(server.url, prefix=prefix)


def redis_port(store: ThreadStore) -> int | None:
    if not isinstance(store, RedisStore):
        return None
    kwargs = store._client.connection_pool.connection_kwargs
    return int(kwargs["port"])


def numsub(port: int, channel: str) -> int:
    """``PUBSUB NUMSUB channel`` on the Redis at *port* (which must be running)."""
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as client:
        ((_name, count),) = client.pubsub_numsub(channel)
        return int(count)


def live_feeds(store: ThreadStore) -> int:
    """Threads the store currently follows live for this process."""
    if hasattr(store, "live_threads"):
        return int(store.live_threads)
    subs = getattr(store, "_subs", None)  # the memory store's registrations
    return len(subs) if subs is not None else 0


async def eventually(check: Callable[[], str | None], timeout: float, what: str) -> float:
    """Poll *check* (None: fine, otherwise what is wrong) until fine; the seconds it took."""
    start = time.monotonic()
    problem = check()
    while problem:
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: still after {timeout:.1f}s: {problem}")
        await asyncio.sleep(0.05)
        problem = check()
    return time.monotonic() - start


# -- what the gateway holds ---------------------------------------------------------------------


def connection_of(gateway: Gateway, local_port: int) -> Any:
    """The gateway's connection for the client socket on *local_port*, or None."""
    for conn in list(gateway.connections):
        address = conn.ws.remote_address
        if address is not None and address[1] == local_port:
            return conn
    return None


def _attributes(obj: Any) -> Iterator[Any]:
    names: set[str] = set()
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        names.update([slots] if isinstance(slots, str) else slots)
    names.update(getattr(obj, "__dict__", {}))
    for name in names:
        with contextlib.suppress(AttributeError):
            yield getattr(obj, name)


def _size(item: Any) -> int:
    if isinstance(item, bytes | bytearray | str):
        return len(item)
    data = getattr(item, "data", None)
    if isinstance(data, bytes) and hasattr(item, "offset"):
        return len(data)  # a store Entry
    if isinstance(item, tuple):
        return sum(_size(x) for x in item if not isinstance(x, dict))
    return 0


def held_bytes(obj: Any) -> int:
    """Bytes of frames / entries *obj* holds in its list and deque attributes (whatever
    their names): a channel member's catch-up buffer, a connection's send queue."""
    if obj is None:
        return 0
    total = 0
    for value in _attributes(obj):
        if isinstance(value, list | deque):
            total += sum(_size(item) for item in list(value))
    return total


def members_of(gateway: Gateway, thread: str) -> dict[Any, Any]:
    channel = gateway.hub.channels.get(thread)
    return dict(channel.members) if channel is not None else {}


def still_held(gateway: Gateway, thread: str, conns: list[Any]) -> str | None:
    """How many of *conns* the gateway still holds as connections, channel members."""
    members = members_of(gateway, thread)
    held = sum(c in gateway.connections for c in conns)
    member = sum(c in members for c in conns)
    if held or member:
        return f"{held} of {len(conns)} still connections, {member} still channel members"
    return None


def leftovers(gateway: Gateway, thread: str, keep: set[Any], redis_at: int | None) -> str | None:
    """What the gateway still holds for *thread* beyond the connections in *keep*."""
    problems = []
    extra = [c for c in gateway.connections if c not in keep]
    if extra:
        problems.append(f"{len(extra)} connection(s) of departed clients")
    members = members_of(gateway, thread)
    stale = [m for m in members if m not in keep]
    if stale:
        problems.append(f"{len(stale)} channel member(s) of departed clients")
    if not keep:
        if thread in gateway.hub.channels:
            problems.append("a channel for the thread")
        if live_feeds(gateway.store):
            problems.append(f"{live_feeds(gateway.store)} live feed(s) in the store")
        if redis_at is not None:
            assert isinstance(gateway.store, RedisStore)
            count = numsub(redis_at, notify_channel(gateway.store.prefix, thread))
            if count:
                problems.append(f"{count} Redis subscription(s) to the thread's notify channel")
    return "; ".join(problems) or None


# -- clients ------------------------------------------------------------------------------------


async def small_window_client(h: Harness, gateway: Gateway, protocol: str) -> Client:
    """A client with a 4 KiB receive buffer and a one-message queue: what it does not
    read stays in the gateway, not in kernel buffers on its side."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.wait_for(
        asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gateway.config.port)), WAIT
    )
    return await h.client(gateway, protocol, sock=sock, max_queue=1)


def local_port(client: Client) -> int:
    return int(client.ws.local_address[1])


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    n = len(payload)
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


class RawClient:
    """A WebSocket client on a bare socket: it does the handshake, sends frames (well
    formed or not), and reads nothing unless asked; not even pings get answered."""

    def __init__(self, sock: socket.socket, protocol: str, rest: bytes) -> None:
        self.sock = sock
        self.protocol = protocol
        self.binary = protocol == MSGPACK
        self.buffer = bytearray(rest)

    @classmethod
    async def connect(cls, port: int, protocol: str = JSON, *, rcvbuf: int = 4096) -> RawClient:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        try:
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), WAIT)
            key = base64.b64encode(os.urandom(16)).decode()
            request = (
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
            )
            await loop.sock_sendall(sock, request.encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), WAIT)
                if not chunk:
                    raise ConnectionError(f"handshake: connection closed after {head!r}")
                head += chunk
        except BaseException:
            sock.close()
            raise
        status, _, rest = head.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 101"), status
        return cls(sock, protocol, rest)

    @property
    def local_port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def send_frame(
        self, opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask: bool = True
    ) -> None:
        header = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
        n = len(payload)
        bit = 0x80 if mask else 0
        if n < 126:
            header += bytes([bit | n])
        elif n < 65536:
            header += bytes([bit | 126]) + struct.pack("!H", n)
        else:
            header += bytes([bit | 127]) + struct.pack("!Q", n)
        if mask:
            key = os.urandom(4)
            header += key
            payload = _mask(payload, key)
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_sendall(self.sock, header + payload), WAIT
        )

    async def send(self, frame: Any) -> None:
        if self.binary:
            await self.send_frame(0x2, msgpack.packb(frame, use_bin_type=True))
        else:
            await self.send_frame(0x1, json.dumps(frame).encode())

    async def _fill(self, n: int, deadline: float) -> bool:
        loop = asyncio.get_running_loop()
        while len(self.buffer) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(self.sock, 65536), remaining)
            except (ConnectionError, OSError):
                return False
            if not chunk:
                return False
            self.buffer += chunk
        return True

    async def read_frame(self, timeout: float = WAIT) -> tuple[int, bytes] | None:
        """The next server frame (opcode, payload); None at end of stream."""
        deadline = time.monotonic() + timeout
        if not await self._fill(2, deadline):
            return None
        first, second = self.buffer[0], self.buffer[1]
        length, at = second & 0x7F, 2
        if length == 126:
            if not await self._fill(4, deadline):
                return None
            length, at = struct.unpack("!H", self.buffer[2:4])[0], 4
        elif length == 127:
            if not await self._fill(10, deadline):
                return None
            length, at = struct.unpack("!Q", self.buffer[2:10])[0], 10
        if not await self._fill(at + length, deadline):
            return None
        payload = bytes(self.buffer[at : at + length])
        del self.buffer[: at + length]
        return first & 0x0F, payload

    async def close_code(self, timeout: float = WAIT) -> int | None:
        """Read until the server's close frame; its code (None: the stream just ended)."""
        deadline = time.monotonic() + timeout
        for _ in range(1_000_000):
            frame = await self.read_frame(max(0.01, deadline - time.monotonic()))
            if frame is None:
                return None
            opcode, payload = frame
            if opcode == 0x8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        raise AssertionError("no close frame")

    def abort(self) -> None:
        """Drop the connection without a close frame (TCP reset)."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


# -- gateway processes --------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def settled_rss(pid: int, samples: int = 5) -> int:
    """The smallest of a few RSS samples 200 ms apart (a transient allocation aside)."""
    values = []
    for _ in range(samples):
        values.append(rss_bytes(pid))
        await asyncio.sleep(0.2)
    return min(values)


async def no_client_connections(port: int) -> None:
    """Wait until the process listening on *port* holds no TCP connection (the
    clients' last frees are then done or under way: settled_rss() samples for 1 s)."""
    await eventually(
        lambda: (
            f"{server_side_connections(port)} connection(s) still open"
            if server_side_connections(port)
            else None
        ),
        ABORT_GRACE,
        "the gateway to let its last clients go",
    )


def server_side_connections(port: int) -> int:
    """TCP connections the process listening on *port* holds open (established, or
    half-closed by the peer and not yet closed by the server)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, state = fields[1], fields[3]
                if int(local.rsplit(":", 1)[1], 16) == port and state in ("01", "08"):
                    count += 1  # ESTABLISHED, CLOSE_WAIT
    return count


# -- A1: departed viewers are freed --------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_departed_viewers_leave_nothing_behind(
    store_maker: Callable[[], ThreadStore],
) -> None:
    """Viewers that abort mid-history, or stop reading until the ping timeout, are freed;
    once the last viewer leaves, no channel, feed or Redis subscription remains."""
    store = store_maker()
    h = Harness(lambda retention=None: store)
    raws: list[RawClient] = []
    try:
        gateway = await h.gateway(
            store=store, send_queue_bytes=64 * KIB, ping_interval=PING, ping_timeout=PING
        )
        redis_at = redis_port(store)
        thread = new_thread()
        offsets = await append_events(store, thread, blobs(0, 20_000, 1000))

        keeper = await h.client(gateway, MSGPACK)
        await keeper.subscribe(thread, "live")
        keeper_conn = connection_of(gateway, local_port(keeper))
        assert keeper_conn is not None

        # Aborters: subscribe from the start, read a little, stop, then vanish
        # without a close frame while most of their history is still pending.
        aborted, aborters = [], []
        for i in range(6):
            client = await small_window_client(h, gateway, JSON if i % 2 else MSGPACK)
            aborters.append(client)
            await client.subscribe(thread, "start")
            frames = [await client.recv() for _ in range(20)]
            assert events_of(frames)[0][0] == offsets[0]
            conn = connection_of(gateway, local_port(client))
            assert conn is not None
            aborted.append(conn)
        await asyncio.sleep(0.5)  # their windows fill: the gateway holds the rest
        assert all(c in members_of(gateway, thread) for c in aborted), "aborters not members"
        for client in aborters:
            client.ws.transport.abort()

        # Stalled readers: raw sockets that subscribe and never read again (no
        # pongs either): the gateway must give up on them.
        for i in range(4):
            raw = await RawClient.connect(gateway.config.port, MSGPACK if i % 2 else JSON)
            raws.append(raw)
            await raw.send({"type": "subscribe", "id": i, "thread": thread, "from": "start"})
        await eventually(
            lambda: (
                None
                if all(
                    connection_of(gateway, r.local_port) in members_of(gateway, thread)
                    for r in raws
                )
                else "stalled readers not subscribed yet"
            ),
            WAIT,
            "stalled readers subscribe",
        )
        stalled = [connection_of(gateway, r.local_port) for r in raws]
        stalled_at = time.monotonic()

        # Live events meanwhile: the keeper gets them (the channel is healthy).
        # (Paced on the keeper, 10 KiB at a time: it must never be a slow consumer.)
        live: list[str] = []
        for i in range(30):
            live += await append_events(store, thread, blobs(20_000 + 10 * i, 10, 1000))
            await keeper.until_offset(thread, live[-1])
        assert len(live) == 300

        took = await eventually(
            lambda: still_held(gateway, thread, aborted),
            ABORT_GRACE,
            "aborted viewers freed",
        )
        print(f"aborted viewers freed after {took:.2f}s")
        remaining = STALLED_GRACE - (time.monotonic() - stalled_at)
        await eventually(
            lambda: still_held(gateway, thread, stalled),
            max(1.0, remaining),
            "stalled viewers freed (ping timeout)",
        )
        print(f"stalled viewers freed {time.monotonic() - stalled_at:.2f}s after they stopped")
        await eventually(
            lambda: leftovers(gateway, thread, {keeper_conn}, redis_at), ABORT_GRACE, "leftovers"
        )
        assert set(members_of(gateway, thread)) == {keeper_conn}

        # The keeper still gets every live event, then leaves normally: nothing is left.
        more = await append_events(store, thread, blobs(20_300, 10, 1000))
        frames = await keeper.until_offset(thread, more[-1])
        assert [o for o, _ in events_of(frames)] == more
        await keeper.close()
        await eventually(
            lambda: leftovers(gateway, thread, set(), redis_at),
            ABORT_GRACE,
            "after the last viewer",
        )
    finally:
        for raw in raws:
            raw.abort()
        await h.close()
        await store.close()


# -- A2: a slow reader catching up is bounded ----------------------------------------------------


@pytest.mark.timeout(60)
async def test_slow_reader_catching_up_holds_a_bounded_buffer(
    store_maker: Callable[[], ThreadStore],
) -> None:
    """A slow but alive viewer (one frame per 50 ms) replaying 8 MiB of history while
    4 MiB of live events arrive: what the gateway holds for it (channel member buffer + send
    queue) stays within 2 x send_queue_bytes + 64 KiB. It either gets every event in
    order or is closed with 4000 (slow consumer) after a prefix."""
    queue = 256 * KIB
    bound = 2 * queue + 64 * KIB
    store = store_maker()
    h = Harness(lambda retention=None: store)
    try:
        gateway = await h.gateway(store=store, send_queue_bytes=queue)
        thread = new_thread()
        # More history than kernel socket buffers absorb (4 MiB at most here): the
        # replay is still going on while the live events arrive.
        history = blobs(0, 8_000, 1000)
        offsets = await append_events(store, thread, history)

        slow = await small_window_client(h, gateway, JSON)
        await slow.subscribe(thread, "start")
        conn = connection_of(gateway, local_port(slow))
        assert conn is not None

        peak = {"held": 0, "member": 0, "queue": 0, "samples": 0, "seen_member": 0}
        stop_sampling = asyncio.Event()

        async def sample() -> None:
            while not stop_sampling.is_set():
                member = members_of(gateway, thread).get(conn)
                in_member, in_queue = held_bytes(member), held_bytes(conn)
                peak["samples"] += 1
                peak["seen_member"] += member is not None
                peak["member"] = max(peak["member"], in_member)
                peak["queue"] = max(peak["queue"], in_queue)
                peak["held"] = max(peak["held"], in_member + in_queue)
                await asyncio.sleep(0.01)

        got: list[dict[str, Any]] = []
        paced = asyncio.Event()
        paced.set()

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                for _ in range(100_000):
                    frame = await slow.recv(timeout=3 * WAIT)
                    got.append(frame)
                    if frame["type"] == "event" and frame["offset"] == expected_last[0]:
                        return
                    if paced.is_set():
                        await asyncio.sleep(0.05)

        expected_last = [""]
        sampler = asyncio.create_task(sample())
        reader = asyncio.create_task(read())
        live: list[str] = []
        live_events: list[dict[str, Any]] = []
        for i in range(40):  # 4 MiB over ~4 s
            batch = blobs(8_000 + 100 * i, 100, 1000)
            live += await append_events(store, thread, batch, batch=100)
            live_events += batch
            await asyncio.sleep(0.1)
        expected_last[0] = live[-1]
        await asyncio.sleep(1.0)
        paced.clear()  # now read as fast as possible
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), 4 * WAIT)
        stop_sampling.set()
        await sampler
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader

        print(
            f"peak held for the slow reader: {peak['held']} bytes (member buffer "
            f"{peak['member']}, send queue {peak['queue']}); bound {bound}; "
            f"{peak['samples']} samples"
        )
        assert peak["seen_member"], "the slow reader was never a member of the channel"
        assert peak["queue"] > 0, "nothing seen queued: held_bytes() does not see the queue"
        assert peak["held"] <= bound, (
            f"the gateway held {peak['held']} bytes for one slow reader "
            f"(member buffer {peak['member']}, send queue {peak['queue']}), "
            f"over the bound {bound} (send_queue_bytes {queue})"
        )
        everything = list(zip(offsets + live, history + live_events, strict=True))
        received = events_of(got)
        assert received == everything[: len(received)], "not a prefix of the thread, in order"
        if len(received) < len(everything):
            assert slow.ws.close_code == 4000, (
                f"got {len(received)} of {len(everything)} events, then close "
                f"{slow.ws.close_code}; expected everything, or 4000 (slow consumer)"
            )
    finally:
        await h.close()
        await store.close()


# -- A3: a subscribe while the store is unavailable leaves nothing -------------------------------


def stalled_store_url(server: RedisServer, prefix: str) -> str:
    return f"{server.url}?prefix={prefix}&op_timeout={OP_TIMEOUT:g}&outage_grace={OUTAGE_GRACE:g}"


@contextlib.contextmanager
def redis_stopped(server: RedisServer) -> Iterator[Callable[[], None]]:
    """Yields a function that SIGSTOPs *server*; SIGCONT whatever happens."""
    assert server.process is not None
    pid = server.process.pid
    stopped = []

    def stop() -> None:
        if not stopped:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(time.monotonic())

    try:
        yield stop
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)


async def told_unavailable(client: Client, command_id: Any, deadline: float) -> str:
    """Read *client* until its command is refused with store_unavailable or it is closed
    with 1013; what happened. AssertionError at *deadline* (loop.time())."""
    loop = asyncio.get_running_loop()
    try:
        for _ in range(100_000):
            frame = await client.recv(max(0.01, deadline - loop.time()))
            if frame["type"] == "error" and frame.get("id") == command_id:
                assert frame["code"] == "store_unavailable", frame
                return "error store_unavailable"
            assert not (frame["type"] == "subscribed" and frame.get("id") == command_id), (
                f"subscribed while Redis is stopped: {frame}"
            )
    except ConnectionClosed:
        assert client.ws.close_code == 1013, (client.ws.close_code, client.ws.close_reason)
        return "closed 1013"
    except TimeoutError:
        raise AssertionError("neither store_unavailable nor 1013 in time") from None
    raise AssertionError("no answer")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("when", ["before-subscribe", "after-redis-subscribe"])
async def test_subscribe_while_store_unavailable_leaves_no_feed(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A subscribe while Redis is stopped is answered store_unavailable (or closed with
    1013) within op_timeout + 4 s; once Redis is back no Redis subscription, live feed
    or channel remains for the thread. "after-redis-subscribe" stops Redis right after
    the gateway's SUBSCRIBE reached it: FeedSubscription.open() fails after SUBSCRIBE."""
    prefix = f"sub-down-{uuid.uuid4().hex[:8]}"
    store = open_store(stalled_store_url(own_redis, prefix))
    h = Harness(lambda retention=None: store)
    thread = new_thread()
    channel = notify_channel(prefix, thread)
    loop = asyncio.get_running_loop()
    try:
        with redis_stopped(own_redis) as stop_redis:
            gateway = await h.gateway(store=store)
            publisher = await h.client(gateway)
            await publisher.publish(thread, text_history(thread, 3, size=10))
            client = await h.client(gateway, MSGPACK)
            await client.ping()
            hooked: list[float] = []
            if when == "after-redis-subscribe":
                from redis.asyncio.client import PubSub

                original = PubSub.subscribe

                async def subscribe_then_stop(self: Any, *args: Any, **kwargs: Any) -> Any:
                    result = await original(self, *args, **kwargs)
                    names = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
                    if channel in names and not hooked:
                        deadline = time.monotonic() + 5
                        while numsub(own_redis.port, channel) < 1 and time.monotonic() < deadline:
                            time.sleep(0.01)
                        hooked.append(loop.time())
                        stop_redis()
                    return result

                monkeypatch.setattr(PubSub, "subscribe", subscribe_then_stop)
            else:
                stop_redis()
                hooked.append(loop.time())
            sent = loop.time()
            await client.send({"type": "subscribe", "id": "s1", "thread": thread, "from": "start"})
            outcome = await told_unavailable(client, "s1", sent + OP_TIMEOUT + 4 + WAIT)
            assert hooked, (
                "the gateway never SUBSCRIBEd through redis.asyncio PubSub.subscribe: "
                "update this test's hook"
            )
            took = loop.time() - hooked[0]
            print(f"{when}: {outcome} {took:.2f}s after Redis stopped")
            assert took <= OP_TIMEOUT + 4, f"{outcome} only after {took:.1f}s"
        # Redis continues (SIGCONT) here.
        monkeypatch.undo()

        def left() -> str | None:
            problems = []
            if members_of(gateway, thread):
                problems.append(f"{len(members_of(gateway, thread))} channel member(s)")
            if thread in gateway.hub.channels:
                problems.append("a channel for the thread")
            if live_feeds(store):
                problems.append(f"{live_feeds(store)} live feed(s) in the store")
            count = numsub(own_redis.port, channel)
            if count:
                problems.append(f"{count} Redis subscription(s) to {channel}")
            return "; ".join(problems) or None

        await eventually(left, ABORT_GRACE + WAIT, "after Redis came back")
        # And the thread works again.
        again = await h.client(gateway)
        reply = await again.subscribe(thread, "start")
        assert reply["recovered"] is True
        assert (await again.request({"type": "unsubscribe", "thread": thread}))[
            "type"
        ] == "unsubscribed"
        await eventually(left, ABORT_GRACE, "after an unsubscribe")
    finally:
        await h.close()


# -- A4: RSS after mixed aborts -----------------------------------------------------------------


@pytest.mark.timeout(120)
async def test_gateway_process_rss_returns_near_baseline_after_mixed_aborts(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """30 clients replay a 5,000-event thread (1 KiB each) from an ``agui-hub serve``
    process and leave in five ways (abort mid-history, abort at once, stop reading,
    close normally, unsubscribe then close); then 32 MiB of live events are published
    to the thread. Afterwards the process holds no client connection.

    Done twice: the first round is the warm-up (the allocator's high-water mark of
    this very load; glibc keeps freed heap), the RSS after it the baseline. After the
    second round (on a thread of its own, the same as the first's), RSS is within
    RSS_MARGIN of it: whatever the departed clients of a round keep (their queues,
    buffers, the live events buffered for them) shows as growth."""
    prefix = f"rss-{uuid.uuid4().hex[:8]}"
    writer = RedisStore(own_redis.url, prefix=prefix)
    threads = [new_thread() for _ in range(3)]  # one for the first replays, one per round
    started: list[GatewayProcess] = []
    raws: list[RawClient] = []
    clients: list[Client] = []
    try:
        first = {t: await append_events(writer, t, blobs(0, 5_000, 1000)) for t in threads}
        gw = start_gateway(
            tmp_path,
            f"{own_redis.url}?prefix={prefix}",
            args=["--send-queue-bytes", str(256 * KIB), "--ping-interval", str(PING)],
            env={"AGUI_HUB_PING_TIMEOUT": str(PING)},
            started=started,
        )
        pid = gw.process.pid

        async def open_client(protocol: str) -> Client:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await asyncio.wait_for(
                asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.port)), WAIT
            )
            ws = await connect(
                gw.url,
                subprotocols=[protocol],  # type: ignore[list-item]
                sock=sock,
                max_queue=1,
                proxy=None,
                open_timeout=WAIT,
                close_timeout=2,
            )
            client = Client(ws)
            clients.append(client)
            return client

        # Two full replays, read to the end, closed normally.
        readers = [await open_client(p) for p in (JSON, MSGPACK)]
        thread = threads[0]
        for reader in readers:
            await reader.subscribe(thread, "start")
        for reader in readers:
            frames = await reader.until_offset(thread, first[thread][-1], timeout=6 * WAIT)
            assert len(events_of(frames)) == len(first[thread])
            await reader.close()
        await no_client_connections(gw.port)
        start_rss = await settled_rss(pid)

        async def leave(thread: str, style: str, i: int) -> None:
            protocol = JSON if i % 2 else MSGPACK
            if style == "stop-reading":
                raw = await RawClient.connect(gw.port, protocol)
                raws.append(raw)
                await raw.send({"type": "subscribe", "id": i, "thread": thread, "from": "start"})
                return
            client = await open_client(protocol)
            if style == "abort-at-once":
                await client.send({"type": "subscribe", "id": i, "thread": thread, "from": "start"})
                client.ws.transport.abort()
                return
            await client.subscribe(thread, "start")
            for _ in range(10 + 37 * i % 150):
                await client.recv()
            if style == "abort":
                await asyncio.sleep(0.3)
                client.ws.transport.abort()
            elif style == "close":
                await client.close()
            elif style == "unsubscribe":
                reply = await client.request(
                    {"type": "unsubscribe", "thread": thread}, timeout=3 * WAIT
                )
                assert reply["type"] == "unsubscribed", reply
                await client.close()

        styles = ["abort", "abort-at-once", "stop-reading", "close", "unsubscribe"]
        measured: list[tuple[int, int, Any, float]] = []
        for thread in threads[1:]:
            await asyncio.gather(*(leave(thread, styles[i % 5], i) for i in range(30)))
            left_at = time.monotonic()
            during = rss_bytes(pid)
            # Live events after they left: whatever still holds them grows.
            await append_events(writer, thread, blobs(5_000, 2_048, 16 * KIB), batch=64)
            with contextlib.suppress(AssertionError):
                await eventually(
                    lambda: (
                        f"{server_side_connections(gw.port)} connection(s) still open"
                        if server_side_connections(gw.port)
                        else None
                    ),
                    STALLED_GRACE + 5,
                    "every client gone from the gateway process",
                )
            held = server_side_connections(gw.port)
            took = time.monotonic() - left_at
            for raw in raws:
                raw.abort()
            raws.clear()
            await no_client_connections(gw.port)
            measured.append((during, await settled_rss(pid), held, took))

        (during1, baseline, held1, took1), (during2, after, held2, took2) = measured
        report = (
            f"gateway RSS: at start {start_rss / MIB:.1f} MiB; round 1 (warm-up): "
            f"{during1 / MIB:.1f} MiB with the clients, {baseline / MIB:.1f} MiB after "
            f"(the baseline); round 2: {during2 / MIB:.1f} MiB with the clients, "
            f"{after / MIB:.1f} MiB after: {(after - baseline) / MIB:+.1f} MiB "
            f"(margin {RSS_MARGIN / MIB:.0f} MiB). Client connections still held: "
            f"{held1} ({took1:.1f}s after round 1), {held2} ({took2:.1f}s after round 2)"
        )
        print(report)
        assert held1 == 0 and held2 == 0, report
        assert after - baseline <= RSS_MARGIN, report
        # The gateway still serves the thread.
        check = await open_client(MSGPACK)
        reply = await check.subscribe(threads[0], "live")
        assert reply["recovered"] is True
        assert "Traceback" not in gw.log(), gw.log()[-4000:]
    finally:
        for raw in raws:
            raw.abort()
        for client in clients:
            client.ws.transport.abort()
        for process in started:
            process.kill()
            print(f"---- gateway log ----\n{process.log()[-3000:]}")
        await writer.close()


# -- B: a stalled store gives fast, clear answers ------------------------------------------------


@pytest.mark.timeout(90)
async def test_stalled_redis_gets_fast_answers_and_nothing_is_lost(own_redis: RedisServer) -> None:
    """Redis SIGSTOPped for 8 s (store URL op_timeout=1, outage_grace=2): a publish is
    answered store_unavailable within op_timeout + 2 s; a ping sent right after it on
    the same connection is answered within 1 s, before the publish; a live viewer is
    told (1013 or a store_unavailable error) within outage_grace + 4 s; after SIGCONT
    the publish retried with its event ids is stored once and a resuming viewer gets
    every stored event exactly once, in order."""
    prefix = f"stall-{uuid.uuid4().hex[:8]}"
    store = open_store(stalled_store_url(own_redis, prefix))
    h = Harness(lambda retention=None: store)
    loop = asyncio.get_running_loop()
    thread = new_thread()
    try:
        gateway = await h.gateway(store=store)
        publisher = await h.client(gateway, MSGPACK)
        head = text_history(thread, 10, size=20)
        head_offsets = await publisher.publish(thread, head, [f"h{i}" for i in range(len(head))])
        viewer = await h.client(gateway, JSON)
        reply = await viewer.subscribe(thread, "start")
        epoch = reply["epoch"]
        assert epoch
        frames = await viewer.until_offset(thread, head_offsets[-1])
        seen = events_of(frames)

        batch = text_more(100, 3, size=20)
        batch_ids = ["b0", "b1", "b2"]
        viewer_outcome: dict[str, Any] = {}

        async def watch_viewer(since: float) -> None:
            deadline = since + OUTAGE_GRACE + 4
            try:
                for _ in range(100_000):
                    frame = await viewer.recv(max(0.01, deadline - loop.time()))
                    if frame["type"] == "event":
                        seen.append((frame["offset"], frame["event"]))
                    elif frame["type"] == "error":
                        assert frame["code"] == "store_unavailable", frame
                        viewer_outcome["how"] = "error store_unavailable"
                        viewer_outcome["after"] = loop.time() - since
                        return
            except ConnectionClosed:
                viewer_outcome["how"] = f"closed {viewer.ws.close_code}"
                viewer_outcome["code"] = viewer.ws.close_code
                viewer_outcome["after"] = loop.time() - since
            except TimeoutError:
                viewer_outcome["how"] = "told nothing"

        with redis_stopped(own_redis) as stop_redis:
            stop_redis()
            stopped = loop.time()
            watcher = asyncio.create_task(watch_viewer(stopped))
            sent = loop.time()
            await publisher.send(
                {
                    "type": "publish",
                    "id": "p1",
                    "thread": thread,
                    "events": batch,
                    "eventIds": batch_ids,
                }
            )
            await publisher.send({"type": "ping", "id": "k1"})
            pinged = loop.time()
            pong_at = publish_at = None
            publish_reply: dict[str, Any] = {}
            with contextlib.suppress(TimeoutError):
                for _ in range(1000):
                    frame = await publisher.recv(
                        max(0.01, sent + OP_TIMEOUT + 2 + WAIT - loop.time())
                    )
                    if frame.get("id") == "k1" and pong_at is None:
                        assert frame["type"] == "pong", frame
                        pong_at = loop.time()
                    elif frame.get("id") == "p1" and publish_at is None:
                        publish_at, publish_reply = loop.time(), frame
                    if pong_at is not None and publish_at is not None:
                        break
            await watcher
            # Stay stopped ~8 s in all.
            await asyncio.sleep(max(0.0, stopped + 8 - loop.time()))
        resumed = loop.time()

        report = (
            f"publish answered {publish_reply.get('code') or publish_reply.get('type')} after "
            f"{(publish_at - sent) if publish_at else float('nan'):.2f}s; pong after "
            f"{(pong_at - pinged) if pong_at else float('nan'):.2f}s; viewer "
            f"{viewer_outcome.get('how')} after {viewer_outcome.get('after', float('nan')):.2f}s"
        )
        print(report)
        assert publish_at is not None, f"the publish was not answered in time: {report}"
        assert publish_reply["type"] == "error", publish_reply
        assert publish_reply["code"] == "store_unavailable", publish_reply
        assert publish_at - sent <= OP_TIMEOUT + 2, report
        assert pong_at is not None, f"no pong while the publish waited: {report}"
        assert pong_at - pinged < 1.0, report
        assert pong_at < publish_at, f"the ping waited for the publish: {report}"
        assert viewer_outcome.get("how") in ("error store_unavailable", "closed 1013"), report
        assert viewer_outcome["after"] <= OUTAGE_GRACE + 4, report

        # After SIGCONT: everything works again.
        await publisher.ping()
        offsets = await publisher.publish(thread, batch, batch_ids)  # the retry
        tail = [
            {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
            {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
        ]
        offsets += await publisher.publish(thread, tail, ["t0", "t1"])
        print(f"publishing again {loop.time() - resumed:.2f}s after SIGCONT")
        # The viewer resumes on a new connection from the last event it has.
        viewer.ws.transport.abort()
        position = {"offset": seen[-1][0], "epoch": epoch}
        viewer = await h.client(gateway, JSON)
        reply = await viewer.subscribe(thread, position)
        assert reply["recovered"] is True, reply
        frames = await viewer.until_offset(thread, offsets[-1], timeout=2 * WAIT)
        assert not [f for f in frames if f["type"] == "snapshot"], "a snapshot: events were lost"
        seen += events_of(frames)

        truth = stored(await store.read(thread))
        assert seen == truth, "the viewer's events differ from the stored thread"
        deltas = [e["delta"] for _, e in truth if e.get("type") == "TEXT_MESSAGE_CONTENT"]
        for event in batch:
            assert deltas.count(event["delta"]) == 1, (
                f"{event['delta'][:8]} stored {deltas.count(event['delta'])} times"
            )
        status, body = await http_get(gateway.config.port, "/readyz")
        assert status == 200, body
    finally:
        await h.close()
