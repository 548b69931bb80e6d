"""The Python client and publisher against bare websockets and raw redis-py.

Usage::

    python bench/bench_client.py [--runs 5] [--events 20000] [--publish-events 2000]
        [--batch-events 20000] [--batch 100] [--only receive,gateway,redis]
        [--timeout 20] [--gateway-thread] [--profile CASE,...]

Everything runs in this process, on loopback. The gateway (``Gateway`` on the
in-memory store, 127.0.0.1, a free port) is served by the same event loop as
the clients, so every rate includes the gateway's work, alike for the ceiling
and for the client; the ratio says what the client costs on top of a bare
client. Measured in the same run, against ceilings measured in the same run:

1. receive: a thread holding ``--events`` realistic events (one run: token
   deltas in explicit and chunked messages, tool calls with results, state
   deltas, steps) replayed from "start" to its last offset by

   * bare: a ``websockets`` client that sends the subscribe command and
     decodes every frame (``msgpack.unpackb`` / ``json.loads``): the ceiling;
   * ``HubClient.subscribe(thread, "start")`` iterated to the last offset,
     subscribing as soon as the client is connected, as the README does
     ("at once"), and 50 ms later, outside the timing ("settled"), once the
     client's connection task runs; the two must agree (the client sends one
     subscribe per connection either way);
   * settled, with ``state=True``, and with ``expand_chunks=True``;

   for msgpack and JSON. One bare run per run and encoding is the ceiling of
   every client row. The thread's channel is kept warm by an in-process live
   subscriber, so every replay costs the gateway the same.
2. publish through the gateway (msgpack; ``--publish-encodings msgpack,json``
   for both): a bare ``websockets`` request/response loop (a publish command
   with ``eventIds``, then await its reply) against ``Publisher(ws_url)``,
   one event at a time (``--publish-events``, ``Publisher.publish``) and in
   batches of ``--batch`` (``--batch-events``, ``Publisher.publish_batch``).
   The bare loop sends ``eventIds`` too, so the gateway does the same work.
3. publish straight into Redis (a redis-server started here on a free port,
   no persistence; skipped when ``redis-server`` is missing):
   ``Publisher("redis://...?max_len=0")`` one event at a time and in batches,
   against redis-py ``XADD`` of the same msgpack bytes and fields, awaited one
   by one and pipelined ``--batch`` per round trip.

Rates are events/s (stored events: an expanded chunk counts once); the ratio
ours / ceiling is taken run by run and reported as the median of ``--runs``
runs with its spread (min-max). The order of the cases rotates from run to
run. Each row also gives the CPU time of this thread per event (the clients,
and the gateway with them). Every loop is bounded by its count and by
``--timeout`` seconds (a row that timed out says INCOMPLETE).

``--gateway-thread`` serves the gateway from an event loop in a thread of its
own instead and adds the gateway thread's CPU per event, so that each side's
cost can be read apart. A diagnostic, not the default: the GIL still runs one
side at a time, and two loops handing frames to each other through it make
the rates bimodal from run to run. ``--profile`` runs the named cases once
more under cProfile (this thread: the clients, and the gateway unless
``--gateway-thread``) and prints where the time went; a wrong name lists the
cases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import pstats
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import msgpack
from websockets.asyncio.client import ClientConnection, connect

from agui_hub.agui.events import validate_wire
from agui_hub.agui.reducer import ThreadState
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.client.hub_client import HubClient, Subscribed, ThreadEvent
from agui_hub.client.publisher import Publisher
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.wire.codec import Encoding, encode_msgpack
from agui_hub.wire.protocol import SUBPROTOCOL_JSON, SUBPROTOCOL_MSGPACK, CloseCode, StartKind

HOST = "127.0.0.1"
SUBPROTOCOL = {"msgpack": SUBPROTOCOL_MSGPACK, "json": SUBPROTOCOL_JSON}
MAX_RECEIVE = 256 * 1024 * 1024
"""The bare client's max_size: the same as HubClient's default."""
T = TypeVar("T")


# -- workload ---------------------------------------------------------------------------------

# fmt: off
WORDS = [" the", " agent", " streams", " tokens", " to", " every", " viewer", ".", "\n", " and",
         " checks", " each", " one", ",", " then", " relays", " it"]
# fmt: on


def workload(n: int, thread: str, *, finish: bool, seed: int = 11) -> list[dict[str, Any]]:
    """Exactly *n* canonical events of one valid run (every prefix is valid too).

    About 85% TEXT_MESSAGE_CONTENT / TEXT_MESSAGE_CHUNK token deltas (one message
    in five is chunked), tool calls with arguments and a result, state deltas,
    steps. With *finish* the run ends with RUN_FINISHED (nothing left open).
    """
    rng = random.Random(seed)
    ts = 1764700000000
    run_id = f"run-{thread}"
    head: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run_id, "timestamp": ts},
        {"type": "STATE_SNAPSHOT", "snapshot": {"progress": 0, "log": []}},
    ]
    body: list[dict[str, Any]] = []
    k = 0
    budget = n - len(head) - (1 if finish else 0)
    while True:
        k += 1
        roll = rng.random()
        seg: list[dict[str, Any]] = []
        if roll < 0.70:  # an assistant message, explicit or (one in five) chunked
            mid = f"msg-{k}"
            deltas = [rng.choice(WORDS) for _ in range(rng.randint(20, 60))]
            if rng.random() < 0.2:
                seg.append(
                    {
                        "type": "TEXT_MESSAGE_CHUNK",
                        "messageId": mid,
                        "role": "assistant",
                        "delta": deltas[0],
                        "timestamp": ts + k,
                    }
                )
                seg += [
                    {"type": "TEXT_MESSAGE_CHUNK", "messageId": mid, "delta": d} for d in deltas[1:]
                ]
                # Explicit events end the chunk stream (for the expander): a state delta.
                seg.append(
                    {
                        "type": "STATE_DELTA",
                        "delta": [{"op": "replace", "path": "/progress", "value": k}],
                    }
                )
            else:
                seg.append(
                    {
                        "type": "TEXT_MESSAGE_START",
                        "messageId": mid,
                        "role": "assistant",
                        "timestamp": ts + k,
                    }
                )
                seg += [
                    {"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": d} for d in deltas
                ]
                seg.append({"type": "TEXT_MESSAGE_END", "messageId": mid})
        elif roll < 0.85:  # a tool call with its result
            call = f"call-{k}"
            seg.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": call,
                    "toolCallName": "search_docs",
                    "timestamp": ts + k,
                }
            )
            args = ['{"query": ', '"redis', " streams", '", "limit": ', "5}"]
            seg += [{"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": a} for a in args]
            seg.append({"type": "TOOL_CALL_END", "toolCallId": call})
            seg.append(
                {
                    "type": "TOOL_CALL_RESULT",
                    "messageId": f"result-{k}",
                    "toolCallId": call,
                    "content": '{"hits": 3}',
                    "role": "tool",
                }
            )
        elif roll < 0.95:  # a state delta
            seg.append(
                {
                    "type": "STATE_DELTA",
                    "delta": [
                        {"op": "replace", "path": "/progress", "value": k},
                        {"op": "add", "path": "/log/-", "value": f"step {k}"},
                    ],
                }
            )
        else:  # a step around a short message
            mid = f"msg-{k}"
            seg.append({"type": "STEP_STARTED", "stepName": f"plan-{k}"})
            seg.append({"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"})
            seg += [
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": rng.choice(WORDS)}
                for _ in range(5)
            ]
            seg.append({"type": "TEXT_MESSAGE_END", "messageId": mid})
            seg.append({"type": "STEP_FINISHED", "stepName": f"plan-{k}"})
        if len(body) + len(seg) > budget:
            break
        body += seg
    # Fill up to exactly n with single, self-contained events.
    while len(body) < budget:
        body.append(
            {
                "type": "STATE_DELTA",
                "delta": [{"op": "replace", "path": "/progress", "value": len(body)}],
            }
        )
    events = head + body
    if finish:
        events.append({"type": "RUN_FINISHED", "threadId": thread, "runId": run_id})
    return events[:n]


def check_workload(events: list[dict[str, Any]]) -> None:
    """Canonical wire dicts, a valid sequence, and a state that folds without error."""
    verifier, state = SequenceVerifier(thread="check"), ThreadState()
    for index, event in enumerate(events):
        if validate_wire(event) != event:
            raise SystemExit(f"event {index} is not a canonical wire event: {event}")
        verifier.verify(event)
        state.apply(event)


def fold(events: list[dict[str, Any]]) -> ThreadState:
    state = ThreadState()
    for event in events:
        state.apply(event)
    return state


# -- the gateway, in this process --------------------------------------------------------------


class Keeper:
    """An in-process live subscriber that keeps a thread's channel (and fold) warm."""

    encoding = Encoding.MSGPACK

    def __init__(self) -> None:
        self.closed: tuple[CloseCode, str] | None = None

    @property
    def is_open(self) -> bool:
        return self.closed is None

    def send(self, frame: bytes | str) -> bool:
        return True

    async def drained(self) -> None:
        return None

    def has_room(self) -> bool:
        return True

    def close_soon(self, code: CloseCode, reason: str) -> None:
        self.closed = (code, reason)


class GatewayHost:
    """A Gateway on the memory store, in this process.

    By default it is served by this thread's event loop, next to the clients:
    every figure then includes the gateway's work, alike for the ceiling and
    the client. With *own_thread* it gets an event loop in a thread of its
    own, so that the CPU time of each side can be read apart (the GIL still
    serializes them, and the two loops handing frames to each other through
    the GIL make rates bimodal from run to run: a diagnostic, not the default).
    """

    def __init__(self, *, own_thread: bool = False) -> None:
        self.own_thread = own_thread
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.gateway: Gateway | None = None
        self.url = ""
        self.keepers: list[Keeper] = []

    def _run(self) -> None:
        assert self.loop is not None
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        """Run *coro* in the gateway's loop and await its result from this loop."""
        if self.loop is None:
            return await asyncio.wait_for(coro, timeout)
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    def cpu(self) -> float | None:
        """CPU seconds the gateway thread has used (``None``: it shares this thread)."""
        if self.thread is None or self.thread.ident is None:
            return None
        return time.clock_gettime(time.pthread_getcpuclockid(self.thread.ident))

    async def start(self) -> None:
        if self.own_thread:
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self._run, name="gateway", daemon=True)
            self.thread.start()

        async def start() -> str:
            self.gateway = Gateway(GatewayConfig(host=HOST, port=0, store="memory://"))
            await self.gateway.start()
            return f"ws://{HOST}:{self.gateway.config.port}"

        self.url = await self.call(start())

    async def fill(self, thread: str, events: list[dict[str, Any]]) -> str:
        """Keep *thread* warm, publish *events* into it (checked, 1000 per call); last offset."""

        async def fill() -> str:
            assert self.gateway is not None
            keeper = Keeper()
            self.keepers.append(keeper)
            await self.gateway.hub.subscribe(keeper, thread, None, StartKind.LIVE, None)
            offsets: list[str] = []
            for i in range(0, len(events), 1000):
                part = events[i : i + 1000]
                ids = [f"fill-{thread}-{i + j}" for j in range(len(part))]
                offsets += await self.gateway.hub.publish(thread, part, ids)
            return offsets[-1]

        return await self.call(fill())

    async def stop(self) -> None:
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                await self.call(self.gateway.drain(), timeout=30)
        if self.loop is not None and self.thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self.thread.join, 10)
            if not self.thread.is_alive():
                self.loop.close()


# -- measurements -----------------------------------------------------------------------------


@dataclass
class Sample:
    """One measurement: *count* events in *seconds*, and the CPU each side used."""

    count: int
    expected: int
    seconds: float
    thread_cpu: float
    gateway_cpu: float | None = None
    note: str = ""

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.count == self.expected

    @property
    def thread_us(self) -> float:
        return 1e6 * self.thread_cpu / self.count if self.count else float("nan")

    @property
    def gateway_us(self) -> float | None:
        if self.gateway_cpu is None or not self.count:
            return None
        return 1e6 * self.gateway_cpu / self.count


class Meter:
    """Wall time and CPU time of this thread (and of the gateway thread) around a loop."""

    def __init__(self, host: GatewayHost | None) -> None:
        self.host = host

    def __enter__(self) -> Meter:
        self.stopped = False
        gc.collect()
        self.cpu0 = time.thread_time()
        self.gw0 = self.host.cpu() if self.host else None
        self.t0 = time.perf_counter()
        return self

    def stop(self) -> None:
        """Read the clocks (the first call counts; later ones change nothing)."""
        if self.stopped:
            return
        self.stopped = True
        self.seconds = time.perf_counter() - self.t0
        self.cpu = time.thread_time() - self.cpu0
        gw = self.host.cpu() if self.host else None
        self.gw = gw - self.gw0 if gw is not None and self.gw0 is not None else None

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sample(self, count: int, expected: int, note: str = "") -> Sample:
        return Sample(count, expected, self.seconds, self.cpu, self.gw, note)


def decoder(encoding: str) -> Callable[[bytes | str], Any]:
    if encoding == "msgpack":
        return lambda data: msgpack.unpackb(data, raw=False)
    return json.loads


def encoder(encoding: str) -> Callable[[Any], bytes | str]:
    if encoding == "msgpack":
        packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        return packer.pack  # type: ignore[no-any-return]
    return lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))


async def bare_connect(url: str, encoding: str) -> ClientConnection:
    ws = await connect(
        url,
        subprotocols=[SUBPROTOCOL[encoding]],  # type: ignore[list-item]
        max_size=MAX_RECEIVE,
        open_timeout=10,
    )
    if ws.subprotocol != SUBPROTOCOL[encoding]:
        raise SystemExit(f"the gateway did not accept {SUBPROTOCOL[encoding]}")
    return ws


async def receive_bare(
    host: GatewayHost, encoding: str, thread: str, last: str, n: int, timeout: float
) -> Sample:
    """Subscribe from "start" on a bare websockets connection, decode frames to *last*."""
    ws = await bare_connect(host.url, encoding)
    decode, encode = decoder(encoding), encoder(encoding)
    count, note = 0, ""
    try:
        with Meter(host) as meter:
            try:
                async with asyncio.timeout(timeout):
                    await ws.send(
                        encode({"type": "subscribe", "id": 1, "thread": thread, "from": "start"})
                    )
                    async for data in ws:
                        frame = decode(data)
                        if frame["type"] == "event":
                            count += 1
                            if frame["offset"] == last:
                                break
            except TimeoutError:
                note = "timed out"
            meter.stop()
    finally:
        await ws.close()
    return meter.sample(count, n, note)


async def receive_client(
    host: GatewayHost,
    encoding: str,
    thread: str,
    last: str,
    n: int,
    timeout: float,
    *,
    state: bool = False,
    expand_chunks: bool = False,
    settle: bool = False,
    messages: int | None = None,
) -> Sample:
    """``HubClient.subscribe(thread, "start")`` iterated to *last*.

    As the README does it: subscribe as soon as the client is connected. With
    *settle*, 50 ms later (outside the timing), once the client's connection
    task runs.
    """
    count, subscribed, note = 0, 0, ""
    async with HubClient(host.url, encoding=encoding, give_up_after=timeout) as hub:
        if settle:
            await asyncio.sleep(0.05)
        sub = hub.subscribe(thread, "start", state=state, expand_chunks=expand_chunks)
        with Meter(host) as meter:
            try:
                async with asyncio.timeout(timeout), sub:
                    previous = None
                    async for item in sub:
                        if isinstance(item, ThreadEvent):
                            if item.offset != previous:  # expanded pieces share an offset
                                previous = item.offset
                                count += 1
                            if item.offset == last:
                                break
                        elif isinstance(item, Subscribed):
                            subscribed += 1
                    meter.stop()
            except TimeoutError:
                note = "timed out"
            meter.stop()
        if subscribed > 1:
            note += f" resubscribed {subscribed - 1}x (lagged)"
        folded = len(sub.state.messages) if sub.state is not None else None
        if state and messages is not None and folded != messages:
            note += f" state has {folded} messages, not {messages}"
    return meter.sample(count, n, note.strip())


def publish_events(n: int, thread: str) -> list[dict[str, Any]]:
    return workload(n, thread, finish=False)


async def publish_bare(
    host: GatewayHost, encoding: str, thread: str, n: int, batch: int, timeout: float
) -> Sample:
    """A request/response loop: publish *batch* events (with eventIds), await the reply."""
    events = publish_events(n, thread)
    ws = await bare_connect(host.url, encoding)
    decode, encode = decoder(encoding), encoder(encoding)
    done, note = 0, ""
    try:
        with Meter(host) as meter:
            try:
                async with asyncio.timeout(timeout):
                    for i in range(0, n, batch):
                        part = events[i : i + batch]
                        await ws.send(
                            encode(
                                {
                                    "type": "publish",
                                    "id": i,
                                    "thread": thread,
                                    "events": part,
                                    "eventIds": [f"bare-{i + j}" for j in range(len(part))],
                                }
                            )
                        )
                        reply = decode(await ws.recv())
                        if reply.get("type") != "published" or len(reply["offsets"]) != len(part):
                            raise SystemExit(f"bare publish refused: {reply}")
                        done += len(part)
            except TimeoutError:
                note = "timed out"
            meter.stop()
    finally:
        await ws.close()
    return meter.sample(done, n, note)


async def publish_publisher(
    url: str,
    host: GatewayHost | None,
    thread: str,
    n: int,
    batch: int,
    timeout: float,
    encoding: str = "msgpack",
) -> Sample:
    """``Publisher(url).publish`` one at a time (*batch* 1), else ``publish_batch``."""
    events = publish_events(n, thread)
    done, note = 0, ""
    kwargs: dict[str, Any] = {"encoding": encoding} if url.startswith("ws") else {}
    async with Publisher(url, retry_for=timeout, **kwargs) as publisher:
        if not url.startswith("ws"):
            await publisher.publish_batch(f"{thread}-warm", publish_events(2, f"{thread}-warm"))
        with Meter(host) as meter:
            try:
                async with asyncio.timeout(timeout):
                    if batch == 1:
                        for event in events:
                            await publisher.publish(thread, event)
                            done += 1
                    else:
                        for i in range(0, n, batch):
                            offsets = await publisher.publish_batch(thread, events[i : i + batch])
                            done += len(offsets)
            except TimeoutError:
                note = "timed out"
            meter.stop()
    return meter.sample(done, n, note)


# -- Redis -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def start_redis() -> tuple[subprocess.Popen[bytes], str] | None:
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="agui-bench-")
    proc = subprocess.Popen(
        [
            binary,
            "--bind",
            HOST,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=0.2).close()
            return proc, f"redis://{HOST}:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.terminate()
    raise SystemExit("redis-server did not start")


async def raw_xadd(client: Any, key: str, n: int, batch: int, timeout: float) -> Sample:
    """XADD of the msgpack bytes the store would keep: awaited one by one, or pipelined."""
    events = publish_events(n, key)
    rows = [(encode_msgpack(e), str(e["type"])) for e in events]
    done, note = 0, ""
    with Meter(None) as meter:
        try:
            async with asyncio.timeout(timeout):
                if batch == 1:
                    for i, (payload, kind) in enumerate(rows):
                        await client.xadd(
                            key, {"event": payload, "id": f"raw-{i}", "run": "", "type": kind}
                        )
                        done += 1
                else:
                    for i in range(0, n, batch):
                        pipe = client.pipeline(transaction=False)
                        for j, (payload, kind) in enumerate(rows[i : i + batch]):
                            pipe.xadd(
                                key,
                                {"event": payload, "id": f"raw-{i + j}", "run": "", "type": kind},
                            )
                        done += len(await pipe.execute())
        except TimeoutError:
            note = "timed out"
        meter.stop()
    return meter.sample(done, n, note)


# -- running and reporting ----------------------------------------------------------------------


@dataclass
class Case:
    """A ceiling and the client measured against it, run after run."""

    section: str
    name: str
    ceiling_name: str
    n: int
    ceiling: list[Sample] = field(default_factory=list)
    ours: list[Sample] = field(default_factory=list)

    def ratios(self) -> list[float]:
        """ours / ceiling in events/s, run by run."""
        return [o.rate / c.rate for o, c in zip(self.ours, self.ceiling, strict=False) if c.rate]

    def cpu_ratios(self) -> list[float]:
        """ceiling / ours in CPU time of this thread per event, run by run.

        Steadier than wall time on a shared machine (time the process was not
        running does not count); with the gateway in this thread it is the
        events/s ratio the process would get alone. For Redis it leaves out
        the server and the waiting: what the client costs this process.
        """
        pairs = zip(self.ours, self.ceiling, strict=False)
        return [c.thread_us / o.thread_us for o, c in pairs if o.count and c.count]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f}-{max(values):.2f}"


def progress(label: str, s: Sample) -> None:
    gw = f" gateway thread {s.gateway_us:5.1f}" if s.gateway_us is not None else ""
    flags = "" if s.complete else f"  INCOMPLETE {s.count}/{s.expected}"
    note = f"  {s.note}" if s.note else ""
    print(
        f"  {label:<46} {s.rate:>9,.0f} ev/s {s.seconds:6.2f} s  cpu us/ev: this thread "
        f"{s.thread_us:5.1f}{gw}{flags}{note}",
        flush=True,
    )


def report(cases: list[Case], runs: int, gateway_thread: bool) -> None:
    """The compact table: rates (medians), ratios run by run (median, min-max), CPU per event."""
    side = "the client side" if gateway_thread else "the clients and the in-loop gateway"
    print(
        f"\nSummary: events/s are medians of {runs} runs; ratio: ours / ceiling in events/s, run "
        f"by run (median, min-max);\ncpu us/ev: CPU time of this thread ({side}) per event, "
        f"ceiling/ours;\ncpu ratio: ceiling / ours in CPU per event, run by run (median)"
        + ("; gw us/ev: the gateway thread's." if gateway_thread else ".")
    )
    section = None
    for case in cases:
        if case.section != section:
            section = case.section
            print(
                f"{section}\n  {'ours / ceiling':<40} {'n':>6} {'ceiling/s':>9} {'ours/s':>8} "
                f"{'ratio':>5} {'min-max':>9} {'cpu us/ev':>11} {'cpu ratio':>9}"
                + (f" {'gw us/ev':>11}" if gateway_thread else "")
            )
        ratios = case.ratios()
        cpu = (
            f"{median([s.thread_us for s in case.ceiling]):.1f}/"
            f"{median([s.thread_us for s in case.ours]):.1f}"
        )
        gw = ""
        if gateway_thread:
            ceiling_gw = [s.gateway_us for s in case.ceiling if s.gateway_us is not None]
            ours_gw = [s.gateway_us for s in case.ours if s.gateway_us is not None]
            gw = f"{median(ceiling_gw):.1f}/{median(ours_gw):.1f}" if ours_gw else "-"
            gw = f" {gw:>11}"
        flags = [] if all(s.complete for s in case.ceiling + case.ours) else ["INCOMPLETE"]
        flags += sorted({s.note for s in case.ours + case.ceiling if s.note})
        label = f"{case.name} / {case.ceiling_name}"
        print(
            f"  {label:<40} {case.n:>6} {median([s.rate for s in case.ceiling]):>9,.0f} "
            f"{median([s.rate for s in case.ours]):>8,.0f} {median(ratios):>5.2f} "
            f"{spread(ratios):>9} {cpu:>11} {median(case.cpu_ratios()):>9.2f}{gw}"
            + ("  " + "; ".join(flags) if flags else "")
        )


def rotated(items: list[T], run: int) -> list[T]:
    k = run % len(items)
    return items[k:] + items[:k]


async def bench(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    encodings = ["msgpack", "json"]
    pub_encodings = args.publish_encodings.split(",")
    timeout = args.timeout
    cases: list[Case] = []
    profiles: dict[str, Callable[[], Awaitable[Sample]]] = {}
    host = GatewayHost(own_thread=args.gateway_thread)
    redis: tuple[subprocess.Popen[bytes], str] | None = None
    redis_client: Any = None
    began = time.perf_counter()
    try:
        await host.start()
        where = "a thread of its own" if args.gateway_thread else "this thread's event loop"
        print(f"gateway {host.url}: memory store, served by {where}", flush=True)

        if "receive" in only:
            thread = "recv"
            events = workload(args.events, thread, finish=True)
            check_workload(events)
            messages = len(fold(events).messages)
            last = await host.fill(thread, events)
            chunked = sum(e["type"] == "TEXT_MESSAGE_CHUNK" for e in events)
            print(
                f"1. receive: thread {thread!r} holds {len(events)} events ({chunked} chunks, "
                f"{messages} messages), last offset {last}",
                flush=True,
            )
            variants: list[tuple[str, str, dict[str, Any]]] = [
                ("client", "HubClient, at once", {}),
                ("settled", "HubClient, settled", {"settle": True}),
                ("state", "HubClient, settled, state", {"settle": True, "state": True}),
                ("expand", "HubClient, settled, expand", {"settle": True, "expand_chunks": True}),
            ]
            by_enc: dict[str, list[Case]] = {}
            for enc in encodings:
                by_enc[enc] = [
                    Case(
                        f"1. receive {len(events)} events from start ({enc})",
                        name,
                        "bare",
                        len(events),
                    )
                    for _, name, _ in variants
                ]
                cases += by_enc[enc]
            for run in range(args.runs):
                plan = [(enc, i) for enc in encodings for i in range(-1, len(variants))]
                bare_of: dict[str, Sample] = {}
                for enc, index in rotated(plan, run):
                    if index < 0:
                        s = await receive_bare(host, enc, thread, last, len(events), timeout)
                        bare_of[enc] = s
                        progress(f"run {run + 1} receive {enc} bare", s)
                    else:
                        _, name, kw = variants[index]
                        s = await receive_client(
                            host, enc, thread, last, len(events), timeout, messages=messages, **kw
                        )
                        by_enc[enc][index].ours.append(s)
                        progress(f"run {run + 1} receive {enc} {name}", s)
                for enc in encodings:  # one bare per run and encoding: the ceiling of all
                    for case in by_enc[enc]:
                        case.ceiling.append(bare_of[enc])
            for enc in encodings:
                recv = (host, enc, thread, last, len(events), timeout)
                profiles[f"recv-{enc}-bare"] = partial(receive_bare, *recv)
                for key, _, kw in variants:
                    profiles[f"recv-{enc}-{key}"] = partial(receive_client, *recv, **kw)

        if "gateway" in only:
            gw_cases: dict[tuple[str, int], Case] = {}
            for enc in pub_encodings:
                for batch, n in ((1, args.publish_events), (args.batch, args.batch_events)):
                    name = "Publisher.publish" if batch == 1 else f"publish_batch({batch})"
                    ceiling = "bare x1" if batch == 1 else f"bare x{batch}"
                    case = Case(f"2. publish through the gateway ({enc})", name, ceiling, n)
                    gw_cases[(enc, batch)] = case
                    cases.append(case)
            for run in range(args.runs):
                plan2 = [
                    (enc, batch, kind)
                    for (enc, batch) in gw_cases
                    for kind in ("bare", "publisher")
                ]
                for enc, batch, kind in rotated(plan2, run):
                    case = gw_cases[(enc, batch)]
                    thread = f"pub-{enc}-{batch}-{kind}-{run}"
                    if kind == "bare":
                        s = await publish_bare(host, enc, thread, case.n, batch, timeout)
                        case.ceiling.append(s)
                    else:
                        s = await publish_publisher(
                            host.url, host, thread, case.n, batch, timeout, enc
                        )
                        case.ours.append(s)
                    progress(f"run {run + 1} gateway {enc} x{batch} {kind}", s)
            for (enc, batch), case in gw_cases.items():
                profiles[f"gw-{enc}-x{batch}-bare"] = partial(
                    publish_bare, host, enc, f"prof-bare-{enc}-{batch}", case.n, batch, timeout
                )
                profiles[f"gw-{enc}-x{batch}-publisher"] = partial(
                    publish_publisher,
                    host.url,
                    host,
                    f"prof-pub-{enc}-{batch}",
                    case.n,
                    batch,
                    timeout,
                    enc,
                )

        if "redis" in only:
            redis = start_redis()
            if redis is None:
                print(
                    "3. redis: skipped, redis-server is not installed "
                    "(apt-get install redis-server)"
                )
            else:
                import redis.asyncio as aioredis

                redis_client = aioredis.Redis.from_url(redis[1])
                await bench_redis(args, redis_client, redis[1], cases, profiles)

        if args.profile:
            for key in args.profile.split(","):
                if key not in profiles:
                    print(f"--profile: no case {key!r}; cases: {', '.join(profiles)}")
                    continue
                await profile(key, profiles[key], args.profile_top)
    finally:
        await host.stop()
        if redis_client is not None:
            await redis_client.aclose()
        if redis is not None:
            redis[0].terminate()
            redis[0].wait(timeout=10)
    report(cases, args.runs, args.gateway_thread)
    print(f"\nwall time {time.perf_counter() - began:.0f} s")
    print("command:", shlex.join(["python3", *sys.argv]))


async def bench_redis(
    args: argparse.Namespace,
    client: Any,
    url: str,
    cases: list[Case],
    profiles: dict[str, Callable[[], Awaitable[Sample]]],
) -> None:
    timeout = args.timeout
    await client.ping()
    section = "3. publish straight into Redis (msgpack bytes, no trimming)"
    rcases = {
        1: Case(section, "Publisher.publish", "raw XADD x1", args.publish_events),
        args.batch: Case(
            section,
            f"publish_batch({args.batch})",
            f"pipelined XADD x{args.batch}",
            args.batch_events,
        ),
    }
    seq_vs_pipe = Case(
        section, "Publisher.publish", f"pipelined XADD x{args.batch}", args.publish_events
    )
    cases += [rcases[1], seq_vs_pipe, rcases[args.batch]]
    for run in range(args.runs):
        prefix = f"bc{run}"
        store_url = f"{url}?prefix={prefix}&max_len=0"
        plan = [(batch, kind) for batch in rcases for kind in ("raw", "publisher")]
        for batch, kind in rotated(plan, run):
            case = rcases[batch]
            if kind == "raw":
                s = await raw_xadd(client, f"raw{run}:x{batch}", case.n, batch, timeout)
                case.ceiling.append(s)
            else:
                s = await publish_publisher(
                    store_url, None, f"pub-x{batch}", case.n, batch, timeout
                )
                case.ours.append(s)
            progress(f"run {run + 1} redis x{batch} {kind}", s)
        seq_vs_pipe.ceiling.append(rcases[args.batch].ceiling[-1])
        seq_vs_pipe.ours.append(rcases[1].ours[-1])
        await client.flushdb()
    for batch, case in rcases.items():
        profiles[f"redis-x{batch}-raw"] = partial(
            raw_xadd, client, f"prof-raw:x{batch}", case.n, batch, timeout
        )
        profiles[f"redis-x{batch}-publisher"] = partial(
            publish_publisher,
            f"{url}?prefix=prof&max_len=0",
            None,
            f"prof-x{batch}",
            case.n,
            batch,
            timeout,
        )


async def profile(key: str, make: Callable[[], Awaitable[Sample]], top: int) -> None:
    """Run one case under cProfile (this thread only: the client side) and print the top."""
    prof = cProfile.Profile()
    prof.enable()
    sample = await make()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print(f"\nprofile {key}: {sample.rate:,.0f} ev/s under cProfile, {sample.count} events")
    text = out.getvalue()
    print("\n".join(line for line in text.splitlines() if line.strip())[:20000])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per ratio (median)")
    parser.add_argument("--events", type=int, default=20_000, help="events to receive")
    parser.add_argument(
        "--publish-events", type=int, default=2000, help="events published one at a time"
    )
    parser.add_argument(
        "--batch-events", type=int, default=20_000, help="events published in batches"
    )
    parser.add_argument("--batch", type=int, default=100, help="events per batch")
    parser.add_argument(
        "--publish-encodings", default="msgpack", help="encodings of part 2 (msgpack,json)"
    )
    parser.add_argument("--only", default="receive,gateway,redis")
    parser.add_argument(
        "--timeout", type=float, default=20.0, help="seconds at most per measurement"
    )
    parser.add_argument(
        "--profile",
        help="cases to profile after the runs (comma-separated; "
        "a wrong name lists them), e.g. recv-msgpack-client",
    )
    parser.add_argument(
        "--gateway-thread",
        action="store_true",
        help="serve the gateway from a thread of its own (CPU by side)",
    )
    parser.add_argument("--profile-top", type=int, default=25)
    args = parser.parse_args()
    if not 1 <= args.batch <= 1000:
        parser.error("--batch is 1 to 1000 (the gateway's limit per publish)")
    print("command:", shlex.join(["python3", *sys.argv]), flush=True)
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
