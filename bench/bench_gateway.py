"""WebSocket fan-out of the gateway against a bare ``websockets`` broadcast.

Usage::

    python bench/bench_gateway.py [--runs 3] [--fanout 10:20000,100:2000,1000:200]
        [--threads 1000 --viewers 3 --thread-events 20] [--idle 10000]
        [--only fanout,threads,latency,memory]

Starts its own redis-server on a free loopback port (no persistence), the
gateway as a separate process (``python -m agui_hub.cli serve``), and a bare
``websockets`` server, also a separate process (this script with
``--bare-server``). This process is the load client and the publisher. It
measures, in the same run, with the same client and the same frame bytes:

* fan-out of one thread to N subscribers: events appended with
  ``RedisStore.append`` (``--publish-batch`` events per call), delivered by the
  gateway to N WebSocket connections; deliveries/s = N * events / (first
  append -> last delivery). Ceiling: the bare server broadcasts the same
  pre-encoded event frames (``protocol.event_frame`` of the same msgpack
  bytes, with offsets of the same length) with ``websockets.broadcast`` to
  the same N connections, from the command that starts it to the last
  delivery;
* many threads: ``--threads`` threads with ``--viewers`` connections each
  (one connection per viewer and thread), ``--thread-events`` events per
  thread appended round robin, one event per append call, one call per
  thread in flight; ceiling: the bare broadcast of the same frames in the
  same order to the same connections;
* latency: p50 / p99 from the append call to the delivery of events that
  carry the send time (``perf_counter_ns`` in a TEXT_MESSAGE_CONTENT delta), to
  ``--latency-viewers`` connections, one event per append call, paced at
  ``--latency-fractions`` (0.5 and 0.25) of the peak rate the fan-out step
  measured there;
* memory: VmRSS of a fresh gateway process before and after opening
  ``--idle`` idle connections, each subscribed to one thread (all to the same
  thread, then each to its own), and the same for a fresh bare server.

The load client speaks WebSocket on raw asyncio sockets (handshake by hand,
client frames masked with a zero key, server frames counted by their header
and prefix, not decoded): under 1 us of Python per frame, but its socket reads
still cost about as much CPU per frame as the bare server's writes (a
``websockets`` client measured the same), so at small N the bare ceiling
fills both cores. Hence two ratios per row: deliveries/s (what a client
sees), and deliveries per CPU-second of the server process (what a delivery
costs the server, whatever else ran). Each row also shows the CPU use (% of
one core) of the server, this process, Redis, and of processes that are not
this benchmark's ("other": on a shared machine, other work slows both servers
alike only if it runs evenly). Absolute rates are noise; the ratios are the
result. Prints medians of ``--runs`` runs (hub and bare alternate which goes
first). ``--profile PREFIX`` samples the gateway and the bare server with
py-spy during the fan-out, threads and latency steps (use it in a run of its
own: sampling costs the servers some CPU) and prints where their time went.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack

from agui_hub.agui.events import validate_wire
from agui_hub.store.contract import EventInput
from agui_hub.store.redis import RedisStore
from agui_hub.wire.codec import Encoding, encode_msgpack
from agui_hub.wire.protocol import SUBPROTOCOL_JSON, SUBPROTOCOL_MSGPACK, event_frame

HOST = "127.0.0.1"
MESSAGE_LEN = 500
"""Events per assistant message in the workload (START, deltas, END)."""
CONNECT_CONCURRENCY = 100
"""Handshakes in flight: the servers listen with asyncio's default backlog of 100."""
SUBPROTOCOL = {"json": SUBPROTOCOL_JSON, "msgpack": SUBPROTOCOL_MSGPACK}
EVENT_PREFIX = {"json": b'{"type":"event"', "msgpack": b"\x84\xa4type\xa5event"}
STAMP = b"@T"
"""Marks the send time in a latency event's delta: ``@T<perf_counter_ns>~``."""
CLOCK_TICK = os.sysconf("SC_CLK_TCK")


# -- processes ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_port(proc: subprocess.Popen[bytes], port: int, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not start")


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="agui-bench-")
    proc = subprocess.Popen(
        [binary, "--bind", HOST, "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    wait_port(proc, port, "redis-server", 10)
    return proc, f"redis://{HOST}:{port}/0"


def http_ready(port: int, path: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=1) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
                if sock.recv(100).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"no 200 from {path} on port {port}")


@dataclass
class Child:
    """A server process this script started; its output goes to a temporary log file."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return "".join(f.readlines()[-20:])


def start_child(name: str, argv: list[str], port: int, ready: str | None) -> Child:
    fd, log = tempfile.mkstemp(prefix=f"agui-bench-{name}-", suffix=".log")
    try:
        proc = subprocess.Popen(argv, stdout=fd, stderr=subprocess.STDOUT)
    finally:
        os.close(fd)
    child = Child(name, proc, port, log)
    try:
        wait_port(proc, port, name)
        if ready:
            http_ready(port, ready)
    except BaseException:
        child.stop()
        print(f"{name} log:\n{child.tail()}")
        raise
    return child


def start_gateway(store_url: str, extra: Sequence[str] = ()) -> Child:
    port = free_port()
    # Every client of the benchmark comes from one loopback address: lift the
    # per-address cap (1,000 by default) above the largest case.
    argv = [sys.executable, "-m", "agui_hub.cli", "serve", "--host", HOST, "--port", str(port),
            "--store", store_url, "--log-level", "WARNING",
            "--max-connections-per-address", "100000", *extra]  # fmt: skip
    return start_child("gateway", argv, port, "/readyz")


def start_bare(extra: Sequence[str] = ()) -> Child:
    port = free_port()
    argv = [sys.executable, os.path.abspath(__file__), "--bare-server", "--port", str(port),
            *extra]  # fmt: skip
    return start_child("bare", argv, port, None)


def process_tree(pid: int) -> list[int]:
    """*pid* and its descendants (a gateway started with ``--workers``), from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its descendants, from /proc/<pid>/stat."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            if p == pid:
                raise
            continue  # a child that just exited
        fields = stat[stat.rfind(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICK


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def settle(pids: Sequence[int], timeout: float = 10.0) -> None:
    """Wait until the servers are idle (under 5% of a core), so runs do not overlap."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = [cpu_seconds(p) for p in pids]
        await asyncio.sleep(0.3)
        if all(cpu_seconds(p) - b < 0.015 for p, b in zip(pids, before, strict=True)):
            return


# -- workload -------------------------------------------------------------------------------


def run_started(thread: str) -> dict[str, Any]:
    return {"type": "RUN_STARTED", "threadId": thread, "runId": "run-1"}


def workload(count: int) -> list[dict[str, Any]]:
    """A valid token stream: messages of MESSAGE_LEN events (START, deltas, END)."""
    out: list[dict[str, Any]] = []
    for i in range(count):
        k, j = divmod(i, MESSAGE_LEN)
        mid = f"msg-{k}"
        ts = 1764700000000 + i
        if j == 0:
            out.append({"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant",
                        "timestamp": ts})  # fmt: skip
        elif j == MESSAGE_LEN - 1:
            out.append({"type": "TEXT_MESSAGE_END", "messageId": mid, "timestamp": ts})
        else:
            out.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid,
                        "delta": f" token{i % 50}", "timestamp": ts})  # fmt: skip
    return out


def check_workload() -> None:
    """The events are canonical AG-UI wire dicts: what the gateway would have stored."""
    for event in [run_started("t"), *workload(MESSAGE_LEN + 1)[:2], workload(MESSAGE_LEN)[-1]]:
        if validate_wire(event) != event:
            raise SystemExit(f"not a canonical wire event: {event}")


def fake_offset(k: int) -> str:
    """An offset like the ones Redis gives (milliseconds-sequence), for the bare frames."""
    return f"{1764700000000 + k // 8}-{k % 8}"


def frame_bytes(thread: str, k: int, event: dict[str, Any], encoding: str) -> bytes:
    frame = event_frame(thread, fake_offset(k), encode_msgpack(event), Encoding(encoding))
    return frame.encode() if isinstance(frame, str) else frame


def thread_names(prefix: str, count: int) -> list[str]:
    return [prefix] if count == 1 else [f"{prefix}-{i}" for i in range(count)]


# -- the bare server ------------------------------------------------------------------------


async def bare_server(port: int) -> None:
    """Subscribe (just a set per thread), prepare (pre-encode), go (broadcast), nothing else.

    For bench_load.py also: ``publish`` (encode each event's frame and broadcast
    it at once, then answer ``published``: a relay that stores nothing), and a
    subscribe ``from`` a position, which sends the thread's prepared frames to
    that connection alone (a replay from memory).
    """
    from websockets.asyncio.server import ServerConnection, broadcast, serve
    from websockets.exceptions import ConnectionClosed

    subscribers: dict[str, set[ServerConnection]] = {}
    plan: list[tuple[str, bytes]] = []
    tasks: set[asyncio.Task[None]] = set()
    published: Counter[str] = Counter()

    def spawn(coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def replay(ws: ServerConnection, thread: str, binary: bool) -> None:
        sent = 0
        for t, frame in plan:
            if t == thread:
                broadcast([ws], frame, text=not binary)
                sent += 1
                if sent >= 4096:
                    sent = 0
                    await asyncio.sleep(0)

    async def blast(binary: bool) -> None:
        sent = 0
        for thread, frame in plan:
            conns = subscribers.get(thread)
            if conns:
                broadcast(conns, frame, text=not binary)
                sent += len(conns)
                if sent >= 4096:  # let the loop flush the transports now and then
                    sent = 0
                    await asyncio.sleep(0)

    async def handler(ws: ServerConnection) -> None:
        binary = ws.subprotocol == SUBPROTOCOL_MSGPACK
        encoding = "msgpack" if binary else "json"

        def encode(frame: dict[str, Any]) -> str | bytes:
            return msgpack.packb(frame) if binary else json.dumps(frame)

        joined: list[str] = []
        try:
            async for message in ws:
                cmd = msgpack.unpackb(message) if binary else json.loads(message)
                kind = cmd.get("type")
                if kind == "subscribe":
                    thread = cmd["thread"]
                    subscribers.setdefault(thread, set()).add(ws)
                    joined.append(thread)
                    await ws.send(encode({"type": "subscribed", "id": cmd.get("id"),
                                          "thread": thread, "epoch": "bare", "offset": "0-0",
                                          "recovered": True}))  # fmt: skip
                    if isinstance(cmd.get("from"), dict):
                        spawn(replay(ws, thread, binary))
                elif kind == "publish":
                    thread = cmd["thread"]
                    # The subscribers' encoding, which may differ from this connection's.
                    out = Encoding(cmd.get("encoding", encoding))
                    audience = subscribers.get(thread, set())
                    offsets = []
                    for event in cmd["events"]:
                        offset = fake_offset(published[thread])
                        published[thread] += 1
                        offsets.append(offset)
                        if audience:
                            frame = event_frame(thread, offset, encode_msgpack(event), out)
                            broadcast(audience, frame)
                    await ws.send(encode({"type": "published", "id": cmd.get("id"),
                                          "thread": thread, "offsets": offsets}))  # fmt: skip
                elif kind == "prepare":
                    # Same order as the hub's publisher: round robin over the threads.
                    names = thread_names(cmd["prefix"], cmd["threads"])
                    given = cmd["events"]
                    events = given if isinstance(given, list) else workload(given)
                    plan[:] = [
                        (t, frame_bytes(t, k, events[k], encoding))
                        for k in range(len(events))
                        for t in names
                    ]
                    await ws.send(encode({"type": "prepared", "frames": len(plan)}))
                elif kind == "go":
                    spawn(blast(binary))
        except ConnectionClosed:
            pass
        finally:
            for thread in joined:
                conns = subscribers.get(thread)
                if conns is not None:
                    conns.discard(ws)
                    if not conns:
                        del subscribers[thread]

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve(
        handler,
        HOST,
        port,
        subprotocols=[SUBPROTOCOL_MSGPACK, SUBPROTOCOL_JSON],  # type: ignore[list-item]
        compression=None,
    ):
        await stop.wait()


# -- the load client ---------------------------------------------------------------------------


class Client(asyncio.Protocol):
    """One WebSocket client connection on a raw asyncio transport.

    Before ``arm``: every server frame is decoded and queued as a reply.
    After: frames that start like an event frame are counted (and, for
    latency, their send stamp read); anything else is still a reply.
    """

    def __init__(self, port: int, encoding: str) -> None:
        self.port = port
        self.encoding = encoding
        self.prefix = EVENT_PREFIX[encoding]
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.handshaken = False
        self.counting = False
        self.count = 0
        self.target = 0
        self.done_at = 0.0
        self.last_at = 0.0
        """When the last counted frame arrived (one clock read per socket read)."""
        self.close_code: int | None = None
        self.latencies: list[int] | None = None

    # asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        key = base64.b64encode(os.urandom(16)).decode()
        self.transport.write(
            f"GET / HTTP/1.1\r\nHost: {HOST}:{self.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {SUBPROTOCOL[self.encoding]}\r\n\r\n".encode()
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.opened.done():
            self.opened.set_exception(ConnectionError(f"closed during the handshake: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.done.done():
            self.done.set_result(None)  # counted short: the caller sees count < target

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.handshaken:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end])
            del buf[: end + 4]
            if not head.startswith(b"HTTP/1.1 101"):
                self.opened.set_exception(ConnectionError(head.split(b"\r\n")[0].decode()))
                assert self.transport is not None
                self.transport.close()
                return
            self.handshaken = True
            self.on_open()
        pos, n = 0, len(buf)
        prefix, counting, counted = self.prefix, self.counting, self.count
        while n - pos >= 2:
            length = buf[pos + 1] & 0x7F
            if length < 126:
                start = pos + 2
            elif length == 126:
                if n - pos < 4:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                start = pos + 4
            else:
                if n - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                start = pos + 10
            end = start + length
            if end > n:
                break
            opcode = buf[pos] & 0x0F
            if opcode == 1 or opcode == 2:
                if counting and buf.startswith(prefix, start):
                    self.count += 1
                    if self.latencies is not None:
                        self._stamp(buf, start, end)
                    if self.count == self.target:
                        self.done_at = time.perf_counter()
                        if not self.done.done():
                            self.done.set_result(None)
                else:
                    self.control(opcode, bytes(buf[start:end]))
            elif opcode == 9:  # ping
                self.send_frame(0xA, bytes(buf[start:end]))
            elif opcode == 8:  # close
                self.close_code = (buf[start] << 8) | buf[start + 1] if length >= 2 else 1005
                self.send_frame(0x8, bytes(buf[start : start + 2]))
                assert self.transport is not None
                self.transport.close()
            pos = end
        if pos:
            del buf[:pos]
        if self.count != counted:
            self.last_at = time.perf_counter()

    def _stamp(self, buf: bytearray, start: int, end: int) -> None:
        i = buf.find(STAMP, start, end)
        if i >= 0:
            j = buf.find(b"~", i, end)
            assert self.latencies is not None
            self.latencies.append(time.perf_counter_ns() - int(buf[i + 2 : j]))

    # hooks for clients of other protocols (bench_load.py) ----------------------------------

    def on_open(self) -> None:
        """The server accepted the WebSocket handshake."""
        self.opened.set_result(None)

    def control(self, opcode: int, payload: bytes) -> None:
        """A text or binary frame that is not a counted event."""
        self.reply(msgpack.unpackb(payload) if opcode == 2 else json.loads(payload))

    def reply(self, frame: dict[str, Any]) -> None:
        """A decoded frame that is not a counted event (subclasses may take some)."""
        self.replies.put_nowait(frame)

    # commands -----------------------------------------------------------------------------

    def send_frame(self, opcode: int, payload: bytes) -> None:
        """A client frame, masked with a zero key (legal; the server unmasks a no-op)."""
        if self.transport is None or self.transport.is_closing():
            return
        n = len(payload)
        if n < 126:
            head = bytes((0x80 | opcode, 0x80 | n))
        elif n < 65536:
            head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
        self.transport.write(head + b"\0\0\0\0" + payload)

    def send(self, frame: dict[str, Any]) -> None:
        if self.encoding == "json":
            self.send_frame(0x1, json.dumps(frame).encode())
        else:
            self.send_frame(0x2, msgpack.packb(frame))

    async def command(self, frame: dict[str, Any], expect: str, timeout: float = 30) -> dict:
        self.send(frame)
        reply = await asyncio.wait_for(self.replies.get(), timeout)
        if reply.get("type") != expect:
            raise RuntimeError(f"{frame['type']}: expected {expect!r}, got {reply}")
        return reply

    def arm(self, target: int, latencies: bool = False) -> None:
        self.count, self.target, self.done_at, self.counting = 0, target, 0.0, True
        self.last_at = 0.0
        self.latencies = [] if latencies else None
        if target == 0 and not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.send_frame(0x8, (1000).to_bytes(2, "big"))
            self.transport.close()


async def connect(
    port: int, count: int, encoding: str, factory: Callable[[int, str], Client] = Client
) -> list[Client]:
    """Open *count* connections, CONNECT_CONCURRENCY handshakes at a time."""
    loop = asyncio.get_running_loop()
    clients: list[Client] = []

    async def one() -> Client:
        _, client = await loop.create_connection(lambda: factory(port, encoding), HOST, port)
        clients.append(client)
        await asyncio.wait_for(client.opened, 30)
        return client

    try:
        for i in range(0, count, CONNECT_CONCURRENCY):
            await asyncio.gather(*(one() for _ in range(min(CONNECT_CONCURRENCY, count - i))))
    except BaseException:
        await close_all(clients)
        raise
    return clients


async def subscribe(pairs: Sequence[tuple[Client, str]]) -> None:
    for i in range(0, len(pairs), CONNECT_CONCURRENCY * 5):
        await asyncio.gather(
            *(c.command({"type": "subscribe", "id": 1, "thread": t, "from": "live"}, "subscribed")
              for c, t in pairs[i : i + CONNECT_CONCURRENCY * 5])
        )  # fmt: skip


async def close_all(clients: Sequence[Client]) -> None:
    for c in clients:
        c.close()
    if clients:
        await asyncio.wait([c.closed for c in clients], timeout=10)


# -- measurements -------------------------------------------------------------------------------


def machine_busy() -> float:
    """CPU-seconds all processes of the machine spent (user + system, all cores).

    Interrupt time is left out: the loopback traffic of this benchmark shows up
    there (softirq), charged to no process.
    """
    with open("/proc/stat") as f:
        user, nice, system = (int(x) for x in f.readline().split()[1:4])
    return (user + nice + system) / CLOCK_TICK


class CpuMeter:
    """CPU used during a measurement: the server, Redis, this process, and everything else."""

    def __init__(self, server: int, redis: int) -> None:
        self.pids = [server, redis]
        self.start = [cpu_seconds(p) for p in self.pids]
        self.own = time.process_time()
        self.machine = machine_busy()
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        """CPU-seconds per party, and the window they were measured over."""
        server, redis = (cpu_seconds(p) - s for p, s in zip(self.pids, self.start, strict=True))
        own = time.process_time() - self.own
        machine = machine_busy() - self.machine
        return {
            "window": time.perf_counter() - self.t0,
            "server": server,
            "redis": redis,
            "client": own,
            "other": max(0.0, machine - server - redis - own),
        }


@dataclass
class Delivery:
    """One measurement: deliveries, time, CPU-seconds (see CpuMeter.stop)."""

    expected: int
    delivered: int
    seconds: float
    cpu: dict[str, float]
    publish_seconds: float | None = None
    closed: Counter[int] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    def share(self, party: str) -> float:
        """CPU use of *party* as a fraction of one core."""
        return self.cpu[party] / self.cpu["window"]

    @property
    def per_cpu_second(self) -> float:
        """Deliveries per CPU-second of the server: what it costs, whatever else ran."""
        return self.delivered / self.cpu["server"] if self.cpu["server"] > 0 else float("nan")

    @property
    def complete(self) -> bool:
        return self.delivered == self.expected and not self.closed


class Bench:
    def __init__(self, args: argparse.Namespace, store_url: str, redis_pid: int) -> None:
        self.args = args
        self.store_url = store_url
        self.redis_pid = redis_pid
        self.store = RedisStore(store_url.split("?")[0])
        self.serial = 0

    def name(self, what: str) -> str:
        self.serial += 1
        return f"{what}{self.serial}"

    async def fanout(
        self,
        server: Child,
        kind: str,
        threads: int,
        viewers: int,
        events: int,
        factory: Callable[[int, str], Client] = Client,
    ) -> Delivery:
        """*viewers* connections on each of *threads* threads; *events* events per thread.

        *factory* makes the connections (another protocol's client, for a peer)."""
        args = self.args
        prefix = self.name(f"{kind}-{threads}x{viewers}-")
        names = thread_names(prefix, threads)
        per_thread = workload(events)
        if kind == "hub":
            # The thread exists (has an epoch) before anyone subscribes.
            for i in range(0, len(names), 1000):
                await asyncio.gather(
                    *(self.store.append(t, [EventInput.of(run_started(t))])
                      for t in names[i : i + 1000])
                )  # fmt: skip
        clients = await connect(server.port, threads * viewers, args.encoding, factory)
        control: list[Client] = []
        try:
            await subscribe([(c, names[i % threads]) for i, c in enumerate(clients)])
            trigger: Callable[[], Awaitable[float | None]]
            if kind == "hub":
                calls = self.publish_calls(names, per_thread, threads)

                async def trigger() -> float | None:
                    return await self.publish(calls, threads)
            else:
                control = await connect(server.port, 1, args.encoding, factory)
                spec = {"type": "prepare", "prefix": prefix, "threads": threads, "events": events}
                await control[0].command(spec, "prepared", timeout=120)

                async def trigger() -> float | None:
                    control[0].send({"type": "go"})
                    return None

            for c in clients:
                c.arm(events)
            await settle([server.pid, self.redis_pid])
            meter = CpuMeter(server.pid, self.redis_pid)
            t0 = time.perf_counter()
            publisher = asyncio.create_task(trigger())
            await asyncio.wait([c.done for c in clients], timeout=args.timeout)
            t1 = time.perf_counter()
            publish_seconds = await publisher
            cpu = meter.stop()
            delivered = sum(min(c.count, events) for c in clients)
            last = max((c.done_at for c in clients if c.done_at), default=t1)
            seconds = (last if delivered == threads * viewers * events else t1) - t0
            if any(c.count > events for c in clients):
                raise RuntimeError(f"{kind}: more frames than events (duplicates)")
            return Delivery(
                expected=threads * viewers * events,
                delivered=delivered,
                seconds=seconds,
                cpu=cpu,
                publish_seconds=publish_seconds,
                closed=Counter(c.close_code for c in clients if c.close_code is not None),
            )
        finally:
            await close_all(clients + control)
            await settle([server.pid])

    def publish_calls(
        self, names: list[str], per_thread: list[dict[str, Any]], threads: int
    ) -> list[tuple[str, list[EventInput]]]:
        if threads == 1:
            batch = self.args.publish_batch
            items = [EventInput.of(e) for e in per_thread]
            return [(names[0], items[i : i + batch]) for i in range(0, len(items), batch)]
        # Round robin, one event per call: many agents streaming at once.
        return [(t, [EventInput.of(e)]) for e in per_thread for t in names]

    async def publish(self, calls: list[tuple[str, list[EventInput]]], inflight: int) -> float:
        """Append the calls, *inflight* at a time (concurrent calls commit together)."""
        t0 = time.perf_counter()
        for i in range(0, len(calls), inflight):
            await asyncio.gather(
                *(self.store.append(t, items) for t, items in calls[i : i + inflight])
            )
        return time.perf_counter() - t0

    async def latency(
        self, gateway: Child, viewers: int, rate: float, seconds: float
    ) -> tuple[list[int], Delivery, float]:
        """Send-stamped events at *rate* per second; latencies in ns, over every delivery."""
        args = self.args
        thread = self.name("lat-")
        await self.store.append(thread, [EventInput.of(run_started(thread))])
        await self.store.append(
            thread,
            [EventInput.of({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"})],
        )
        count = max(1, min(args.latency_max_events, int(rate * seconds)))
        clients = await connect(gateway.port, viewers, args.encoding)
        pending: set[asyncio.Task[Any]] = set()
        try:
            await subscribe([(c, thread) for c in clients])
            for c in clients:
                c.arm(count, latencies=True)
            await settle([gateway.pid, self.redis_pid])
            meter = CpuMeter(gateway.pid, self.redis_pid)
            t0 = time.perf_counter()
            interval = 1 / rate
            behind = 0.0
            for i in range(count):
                delay = t0 + i * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    behind = max(behind, -delay)
                event = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m",
                         "delta": f"@T{time.perf_counter_ns()}~"}  # fmt: skip
                task = asyncio.create_task(self.store.append(thread, [EventInput.of(event)]))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.wait([c.done for c in clients], timeout=args.timeout)
            t1 = time.perf_counter()
            result = Delivery(
                expected=count * viewers,
                delivered=sum(c.count for c in clients),
                seconds=t1 - t0,
                cpu=meter.stop(),
                closed=Counter(c.close_code for c in clients if c.close_code is not None),
            )
            return [x for c in clients for x in c.latencies or ()], result, behind
        finally:
            if pending:
                await asyncio.wait(pending, timeout=10)
            await close_all(clients)
            await settle([gateway.pid])

    async def ping_round_trips(self, rate: float, count: int = 300) -> list[float]:
        """Redis PING round trips (ms), one every 1/rate seconds (at most 3 s in all)."""
        interval = min(1 / rate, 3 / count)
        out = []
        for _ in range(count):
            t0 = time.perf_counter()
            await self.store.ping()
            out.append(1000 * (time.perf_counter() - t0))
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - t0)))
        return out

    async def memory(
        self, server: Child, count: int, own_threads: bool
    ) -> tuple[int, int, int, str]:
        """RSS (KiB) of *server* before and after idle subscribed connections; how many; why not
        all *count* (empty if all)."""
        args = self.args
        prefix = self.name("idle-")
        # Warm up: first connections and channels pay for imports and caches.
        warm = await connect(server.port, 200, args.encoding)
        await subscribe([(c, f"{prefix}warm-{i % 20}") for i, c in enumerate(warm)])
        await close_all(warm)
        await settle([server.pid])
        await asyncio.sleep(1)
        before = rss_kib(server.pid)
        clients: list[Client] = []
        error = ""
        try:
            for i in range(0, count, 1000):
                try:
                    batch = await connect(server.port, min(1000, count - i), args.encoding)
                except OSError as exc:
                    error = f"stopped at {len(clients)} connections: {exc}"
                    break
                clients += batch
                threads = [f"{prefix}{i + j}" if own_threads else prefix for j in range(len(batch))]
                try:
                    await subscribe(list(zip(batch, threads, strict=True)))
                except (RuntimeError, TimeoutError) as exc:
                    error = f"a subscribe failed after {i} connections: {exc}"
                    break
            await settle([server.pid])
            await asyncio.sleep(2)
            after = rss_kib(server.pid)
            open_clients = [c for c in clients if not c.closed.done()]
            if len(open_clients) < len(clients):
                codes = Counter(c.close_code for c in clients if c.closed.done())
                error += f" {len(clients) - len(open_clients)} closed by the server: {dict(codes)}"
            return before, after, len(open_clients), error.strip()
        finally:
            await close_all(clients)


# -- reporting ----------------------------------------------------------------------------------


def pct(runs: Sequence[Delivery], party: str) -> str:
    return f"{100 * statistics.median(d.share(party) for d in runs):.0f}"


def progress(label: str, d: Delivery) -> None:
    print(
        f"  {label}: {d.rate:>9,.0f} deliveries/s, {d.seconds:5.2f} s, "
        f"{d.delivered}/{d.expected}; cpu% server {pct([d], 'server')} client "
        f"{pct([d], 'client')} redis {pct([d], 'redis')} other {pct([d], 'other')}",
        flush=True,
    )


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def report_fanout(title: str, rows: list[tuple[str, list[Delivery], list[Delivery]]]) -> None:
    """Rates and ratios (medians); CPU use in % of one core, in the hub's / the bare's runs."""
    print(title)
    print(
        f"  {'case':>12} {'deliveries':>10} {'hub/s':>9} {'bare/s':>9} {'hub/bare':>8} "
        f"{'(per run)':<15} {'per cpu-s':>9}  {'cpu%: hub':>9} {'bare':>4} "
        f"{'client':>7} {'redis':>5} {'other':>7} {'publish s':>9}"
    )
    for case, hub, bare in rows:
        pairs = list(zip(hub, bare, strict=True))
        ratios = [h.rate / b.rate for h, b in pairs if b.rate]
        cpu_ratios = [h.per_cpu_second / b.per_cpu_second for h, b in pairs]
        flags = ""
        if not all(d.complete for d in hub + bare):
            flags = "  INCOMPLETE: " + "; ".join(
                f"{d.delivered}/{d.expected} closed {dict(d.closed)}"
                for d in hub + bare
                if not d.complete
            )
        publish = [d.publish_seconds for d in hub if d.publish_seconds is not None]
        client = f"{pct(hub, 'client')}/{pct(bare, 'client')}"
        other = f"{pct(hub, 'other')}/{pct(bare, 'other')}"
        print(
            f"  {case:>12} {hub[0].expected:>10} {statistics.median(d.rate for d in hub):>9,.0f} "
            f"{statistics.median(d.rate for d in bare):>9,.0f} "
            f"{statistics.median(ratios):>8.2f} {' '.join(f'{r:.2f}' for r in ratios):<15} "
            f"{statistics.median(cpu_ratios):>9.2f}  "
            f"{pct(hub, 'server'):>9} {pct(bare, 'server'):>4} "
            f"{client:>7} {pct(hub, 'redis'):>5} {other:>7} "
            f"{statistics.median(publish):>9.2f}{flags}"
        )
    print(
        "  hub/bare: ratio of deliveries/s, run by run (median); per cpu-s: ratio of deliveries "
        "per CPU-second\n  of the server process (its cost, whatever else the machine ran); "
        "cpu%: of one core (2 cores in all),\n  client and other (processes not this "
        "benchmark's) in the hub's / the bare's runs; publish s: first to\n  last append "
        "(the publisher kept ahead)"
    )


def start_profilers(
    prefix: str, children: list[Child]
) -> list[tuple[subprocess.Popen[bytes], str]]:
    """py-spy record (raw collapsed stacks, idle samples left out) of each child."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    profilers = []
    for child in children:
        out = f"{prefix}-{child.name}.txt"
        proc = subprocess.Popen(
            [py_spy, "record", "--pid", str(child.pid), "--format", "raw",
             "--rate", "200", "--output", out],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        profilers.append((proc, out))
    return profilers


def stop_profilers(profilers: list[tuple[subprocess.Popen[bytes], str]]) -> None:
    for proc, _ in profilers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=5)


def summarize_profile(path: str, top: int = 25) -> None:
    """Self and inclusive samples per function (lines merged), from py-spy's raw output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            if not stack:
                continue
            count = int(n)
            total += count
            # "func (path/file.py:123)" -> "func (path/file.py)"
            frames = [frame.rpartition(":")[0] + ")" for frame in stack.split(";")]
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    print(f"{path}: {total} samples of the busy threads (idle left out)")
    print("  self:")
    for frame, n in own.most_common(top):
        print(f"    {100 * n / total:5.1f}%  {frame}")
    print("  inclusive:")
    for frame, n in inclusive.most_common(top + 10):
        print(f"    {100 * n / total:5.1f}%  {frame}")


def parse_fanout(spec: str) -> list[tuple[int, int]]:
    out = []
    for part in spec.split(","):
        n, _, events = part.partition(":")
        out.append((int(n), int(events)))
    return out


# -- main ------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, redis_pid: int, store_url: str) -> None:
    only = set(args.only.split(","))
    b = Bench(args, store_url, redis_pid)
    children: list[Child] = []
    profilers: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        gateway = start_gateway(store_url)
        children.append(gateway)
        bare = start_bare()
        children.append(bare)
        print(f"gateway pid {gateway.pid} port {gateway.port}; bare pid {bare.pid} "
              f"port {bare.port}; redis pid {redis_pid}", flush=True)  # fmt: skip
        frame = frame_bytes("fan", 0, workload(2)[1], args.encoding)
        print(f"event frame ({args.encoding}), e.g. {len(frame)} bytes: {frame[:120]!r}")
        peak: dict[int, float] = {}

        if args.profile and only & {"fanout", "threads", "latency"}:
            profilers = start_profilers(args.profile, [gateway, bare])
            await asyncio.sleep(1)

        if "fanout" in only:
            rows = []
            for n, events in parse_fanout(args.fanout):
                results: dict[str, list[Delivery]] = {"hub": [], "bare": []}
                for run in range(args.runs):
                    order = ("hub", "bare") if run % 2 == 0 else ("bare", "hub")
                    for kind in order:
                        server = gateway if kind == "hub" else bare
                        d = await b.fanout(server, kind, 1, n, events)
                        results[kind].append(d)
                        progress(f"fan-out N={n} x{events} run {run + 1} {kind:>4}", d)
                rows.append((f"N={n} x{events}", results["hub"], results["bare"]))
                peak[n] = statistics.median(d.rate for d in results["hub"])
            print()
            report_fanout(
                f"1. Fan-out of one thread to N connections (deliveries/s, median of "
                f"{args.runs} runs; publish: {args.publish_batch} events per append call)",
                rows,
            )
            print()

        if "threads" in only:
            results = {"hub": [], "bare": []}
            for run in range(args.runs):
                order = ("hub", "bare") if run % 2 == 0 else ("bare", "hub")
                for kind in order:
                    server = gateway if kind == "hub" else bare
                    d = await b.fanout(server, kind, args.threads, args.viewers, args.thread_events)
                    results[kind].append(d)
                    progress(f"threads run {run + 1} {kind:>4}", d)
            print()
            report_fanout(
                f"2. Many threads: {args.threads} threads x {args.viewers} viewers = "
                f"{args.threads * args.viewers} connections (one per viewer and thread), "
                f"{args.thread_events} events per thread, round robin, one per append call",
                [(f"{args.threads}x{args.viewers}", results["hub"], results["bare"])],
            )
            print()

        if "latency" in only:
            viewers = args.latency_viewers
            if args.latency_rate:
                rates = [(args.latency_rate, "--latency-rate")]
            else:
                if viewers not in peak:
                    d = await b.fanout(gateway, "hub", 1, viewers, args.latency_probe_events)
                    peak[viewers] = d.rate
                rates = [
                    (f * peak[viewers] / viewers,
                     f"{f:g} x the peak {peak[viewers]:,.0f} deliveries/s at N={viewers}")
                    for f in (float(x) for x in args.latency_fractions.split(","))
                ]  # fmt: skip
            print(
                f"3. Latency, append -> delivery (every delivery to every connection), "
                f"N={viewers}, one event per append call"
            )
            print(
                f"  {'':>6} {'viewers':>7} {'events/s':>8} {'deliveries':>10} {'p50 ms':>7} "
                f"{'p90 ms':>7} {'p99 ms':>7} {'max ms':>7}  {'cpu%: gateway':>13} "
                f"{'client':>6} {'redis':>5} {'other':>5}"
            )
            for index, (rate, source) in enumerate(rates):
                print(f"  at {rate:,.0f} events/s = {rate * viewers:,.0f} deliveries/s: {source}")
                cases = [(f"run {run + 1}", viewers) for run in range(args.latency_runs)]
                if index == 0:
                    cases.append(("1 conn", 1))  # the same events to one connection: the hops
                for label, n in cases:
                    lat, d, behind = await b.latency(gateway, n, rate, args.latency_seconds)
                    ms = [x / 1e6 for x in lat]
                    print(
                        f"  {label:>6} {n:>7} {rate:>8,.0f} {d.delivered:>10} "
                        f"{percentile(ms, 0.5):>7.2f} {percentile(ms, 0.9):>7.2f} "
                        f"{percentile(ms, 0.99):>7.2f} {max(ms, default=0):>7.2f}  "
                        f"{pct([d], 'server'):>13} {pct([d], 'client'):>6} "
                        f"{pct([d], 'redis'):>5} {pct([d], 'other'):>5}"
                        + (f"  pacing lag {1000 * behind:.1f} ms" if behind > 0.005 else "")
                        + ("" if d.complete else f"  INCOMPLETE of {d.expected}, {dict(d.closed)}"),
                        flush=True,
                    )
            pings = await b.ping_round_trips(rates[0][0])
            print(
                f"  for reference, a Redis PING from this process at the first pace: "
                f"p50 {percentile(pings, 0.5):.2f} ms, p99 {percentile(pings, 0.99):.2f} ms\n"
                f"  (a delivery takes about 2.5 such round trips: append, notify, read, frame)"
            )
            print()

        stop_profilers(profilers)
        if "memory" in only:
            for child in children:
                child.stop()
            children.clear()
            print(f"4. Memory: VmRSS of a fresh server process, {args.idle} idle connections "
                  f"each subscribed to one thread")  # fmt: skip
            cases = [("gateway", False), ("gateway", True)]
            if not args.no_bare_memory:
                cases.append(("bare", False))
            for which, own in cases:
                server = start_gateway(store_url) if which == "gateway" else start_bare()
                children.append(server)
                try:
                    before, after, reached, error = await b.memory(server, args.idle, own)
                finally:
                    server.stop()
                    children.remove(server)
                threads = "its own thread" if own else "one shared thread"
                per = (after - before) / reached if reached else float("nan")
                print(
                    f"  {which:>7}, {threads:<17}: RSS {before / 1024:6.1f} MiB -> "
                    f"{after / 1024:6.1f} MiB with {reached} connections: "
                    f"{per:5.1f} KiB per connection" + (f"  ({error})" if error else ""),
                    flush=True,
                )
            print()
    except BaseException:
        for child in children:
            if child.proc.poll() is not None:
                print(f"{child.name} exited with {child.proc.returncode}; log:\n{child.tail()}")
        raise
    finally:
        stop_profilers(profilers)
        for child in children:
            child.stop()
        await b.store.close()
    for _, out in profilers:
        if os.path.exists(out):
            summarize_profile(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per fan-out ratio (median)")
    parser.add_argument("--fanout", default="10:20000,100:2000,1000:200",
                        help="N:events pairs for one thread")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--viewers", type=int, default=3, help="connections per thread")
    parser.add_argument("--thread-events", type=int, default=20, help="events per thread")
    parser.add_argument("--publish-batch", type=int, default=50,
                        help="events per append call, one thread")  # fmt: skip
    parser.add_argument("--encoding", choices=["json", "msgpack"], default="json")
    parser.add_argument("--latency-viewers", type=int, default=100)
    parser.add_argument("--latency-fractions", default="0.5,0.25",
                        help="rates for latency, as fractions of the N=100 peak")  # fmt: skip
    parser.add_argument("--latency-rate", type=float, help="events/s (default: from fan-out)")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--latency-max-events", type=int, default=20_000)
    parser.add_argument("--latency-probe-events", type=int, default=2000)
    parser.add_argument("--latency-runs", type=int, default=2)
    parser.add_argument("--idle", type=int, default=10_000, help="idle connections")
    parser.add_argument("--no-bare-memory", action="store_true")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per measurement")
    parser.add_argument("--only", default="fanout,threads,latency,memory")
    parser.add_argument("--profile", metavar="PREFIX", help="py-spy the servers in fan-out")
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()

    if args.bare_server:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(bare_server(args.port))
        else:
            asyncio.run(bare_server(args.port))
        return
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    check_workload()
    proc, url = start_redis()
    try:
        redis_pid = proc.pid
        asyncio.run(bench(args, redis_pid, url))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
