"""The HTTP bridge: upstream relay and SSE fan-out, against ceilings measured in the same run.

Usage::

    python bench/bench_bridge.py [--runs 3] [--stores memory,redis] [--only relay,fanout]
        [--deltas 20000] [--agent-batch 1,16] [--viewers 10,100] [--events 20000,2000]
        [--profile PREFIX]

Starts an upstream AG-UI agent as a separate process (this script with
``--agent-server``: a raw ASGI app on uvicorn, its delta frames encoded with
``ag_ui.encoder.EventEncoder`` once, before the first measured run),
redis-server on a free loopback port (no persistence) when ``redis`` is among
``--stores``, and per store one gateway process (``python -m agui_hub.cli
serve --store ... --http-port P --agents b1=URL,...``; the per-connection rate
limits and the per-address cap lifted so that they are not what is measured).
This process runs every client. Loopback only; every wait is bounded by
``--timeout``.

1. Upstream relay. The agent answers a POST with one run: RUN_STARTED,
   TEXT_MESSAGE_START, ``--deltas`` K TEXT_MESSAGE_CONTENT deltas,
   TEXT_MESSAGE_END, RUN_FINISHED (K + 4 events), as fast as it can, B
   events per write, i.e. per HTTP chunk (``--agent-batch``, one row per
   value: 1 is an agent that yields event by event, the usual case).

   * hub: a WebSocket viewer subscribes to a fresh thread, then
     ``HubClient.run(thread, agent)`` asks the gateway to run the agent there
     (the gateway POSTs, parses the SSE, validates and stores the events and
     fans them out). Measured: the ``running`` reply -> the viewer has the
     run's last event ("reply ms" is the command -> reply time).
   * direct, the ceiling: the same agent read directly with httpx (POST,
     iterate the body's bytes, split lines, ``json.loads`` each ``data:``
     line), POST -> the last event.
   * publish, for reference: the same K + 4 events published into a fresh
     thread through the gateway's WebSocket ``publish`` command, B per
     command, one command at a time (the appends the bridge makes when each
     HTTP chunk is stored on its own), to a viewer as above; first command ->
     the viewer has the last event. hub / publish says what the bridge's HTTP
     side costs next to the store and fan-out every event pays anyway.

   events/s each way; hub / direct and hub / publish.
2. SSE fan-out against WebSocket fan-out, same gateway process. One thread,
   N viewers (``--viewers``), E events (``--events``: one value per N, or one
   for all) published through the gateway by one WebSocket connection of this
   process (``publish`` commands of ``--publish-batch`` events, msgpack,
   encoded before the clock starts, at most ``--publish-window``
   unanswered). The viewers are either N SSE streams (``GET
   /threads/<t>/events?from=live`` on the HTTP listener) or N WebSocket
   subscribers (JSON subprotocol, ``from: live``): the same JSON text per
   event either way. deliveries/s = N * E / (first publish -> the last
   viewer has its last event); SSE / WS, and SSE / WS of deliveries per
   CPU-second of the gateway (what a delivery costs it, whatever the client
   could take).

The clients cost little, so that they are not the bottleneck: each WebSocket
viewer is ``bench_gateway.Client`` (raw asyncio socket, frames counted by
their header and prefix, not decoded: under 1 us of Python per frame, but a
frame at a time, about 50-60% of a core at N = 100 here); each SSE viewer is
a raw asyncio socket that counts ``\\nid: `` in each read with ``bytes.count``
(a C loop over the bytes, no Python per event: about 5-10% of a core). The
relay's hub viewer counts frames too; the direct reader ``json.loads`` each
event (1-2 us, what a real client of the agent pays). Every row shows the CPU
use (% of one core) of the gateway, the agent, this process ("client"),
Redis, and processes that are not this benchmark's ("other": the box is a
shared 2-core machine). Absolute rates are noise; the ratios are the result.
Medians of ``--runs`` runs; the sides of a ratio take turns going first.
``--profile PREFIX`` samples the first store's gateway and the agent with
py-spy for the whole benchmark and prints where their time went (run it on
its own: sampling costs CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qs

import httpx
import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_gateway as bg
from bench_gateway import HOST, Child, Client, cpu_seconds, machine_busy, settle

from agui_hub.client.hub_client import HubClient

NO_LIMIT = "1000000000"
"""Rate limits far above what one connection sends here."""
MESSAGE_ID = "msg-1"
WARM_DELTAS = 2000
"""Deltas of the warm-up run of each path (not measured)."""
CONNECT_CONCURRENCY = 100
EVENT_ID = b"\nid: "
"""What the SSE viewers count: each thread event has an ``id:`` line (the subscribed
event before them has none)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# -- the upstream agent (a separate process) ----------------------------------------------


def delta_text(i: int) -> str:
    return f" token{i % 50}"


class AgentApp:
    """A raw ASGI AG-UI agent: ``POST /run?deltas=K&batch=B`` answers one text run.

    The delta frames are encoded with the official SDK's encoder once per K and
    kept; each request only encodes its RUN_STARTED and RUN_FINISHED.
    """

    def __init__(self) -> None:
        from ag_ui.encoder import EventEncoder

        self.encoder = EventEncoder()
        self.content_type = self.encoder.get_content_type().encode()
        self.deltas: dict[int, list[bytes]] = {}

    def delta_frames(self, count: int) -> list[bytes]:
        from ag_ui.core import TextMessageContentEvent

        frames = self.deltas.get(count)
        if frames is None:
            frames = [
                self.encoder.encode(
                    TextMessageContentEvent(message_id=MESSAGE_ID, delta=delta_text(i))
                ).encode()
                for i in range(count)
            ]
            self.deltas = {count: frames}
        return frames

    def frames(self, run_input: dict[str, Any], deltas: int) -> list[bytes]:
        from ag_ui.core import (
            RunFinishedEvent,
            RunStartedEvent,
            TextMessageEndEvent,
            TextMessageStartEvent,
        )

        thread, run = run_input["threadId"], run_input["runId"]
        encode = self.encoder.encode
        return [
            encode(RunStartedEvent(thread_id=thread, run_id=run)).encode(),
            encode(TextMessageStartEvent(message_id=MESSAGE_ID, role="assistant")).encode(),
            *self.delta_frames(deltas),
            encode(TextMessageEndEvent(message_id=MESSAGE_ID)).encode(),
            encode(RunFinishedEvent(thread_id=thread, run_id=run)).encode(),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = bytearray()
        for _ in range(100_000):  # bounded: a RunAgentInput is not that many parts
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            run_input = json.loads(body)
            deltas = int(query.get("deltas", ["5"])[0])
            batch = max(1, int(query.get("batch", ["1"])[0]))
            frames = self.frames(run_input, deltas)
        except (ValueError, KeyError, TypeError) as exc:
            text = f"bad request: {exc!r}".encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"text/plain")]})  # fmt: skip
            await send({"type": "http.response.body", "body": text})
            return
        headers = [(b"content-type", self.content_type), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(0, len(frames), batch):
            body_part = frames[i] if batch == 1 else b"".join(frames[i : i + batch])
            await send({"type": "http.response.body", "body": body_part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def agent_server(port: int) -> None:
    import uvicorn

    config = uvicorn.Config(
        AgentApp(),
        host=HOST,
        port=port,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    uvicorn.Server(config).run()


# -- processes -------------------------------------------------------------------------------


@dataclass
class Gateway:
    store: str
    child: Child
    http_port: int
    redis_pid: int | None

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def port(self) -> int:
        return self.child.port

    def pids(self) -> dict[str, int]:
        out = {"gateway": self.pid}
        if self.redis_pid is not None:
            out["redis"] = self.redis_pid
        return out


def start_agent() -> Child:
    port = bg.free_port()
    argv = [sys.executable, os.path.abspath(__file__), "--agent-server", "--port", str(port)]
    return bg.start_child("agent", argv, port, None)


def start_gateway(
    store: str, store_url: str, agents: dict[str, str], redis_pid: int | None
) -> Gateway:
    http_port = bg.free_port()
    spec = ",".join(f"{name}={url}" for name, url in agents.items())
    extra = [
        "--http-port", str(http_port), "--agents", spec,
        "--max-commands-per-second", NO_LIMIT, "--max-events-per-second", NO_LIMIT,
    ]  # fmt: skip
    child = bg.start_gateway(store_url, extra)
    try:
        bg.http_ready(http_port, "/healthz")
    except BaseException:
        child.stop()
        raise
    return Gateway(store, child, http_port, redis_pid)


# -- measuring ------------------------------------------------------------------------------


class Meter:
    """CPU-seconds of named processes, this process ("client") and everything else."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.own = time.process_time()
        self.machine = machine_busy()
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, float]:
        used = {name: cpu_seconds(pid) - self.start[name] for name, pid in self.pids.items()}
        used["client"] = time.process_time() - self.own
        used["other"] = max(0.0, machine_busy() - self.machine - sum(used.values()))
        used["window"] = time.perf_counter() - self.t0
        return used


@dataclass
class Result:
    """One measurement: items (events or deliveries) expected and seen, seconds, CPU."""

    expected: int
    got: int
    seconds: float
    cpu: dict[str, float]
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.got / self.seconds if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.got == self.expected and not self.note

    def pct(self, party: str) -> float:
        window = self.cpu.get("window", 0.0)
        return 100 * self.cpu.get(party, 0.0) / window if window > 0 else float("nan")


def run_events(thread: str, run: str, deltas: int) -> list[dict[str, Any]]:
    """The agent's run as wire dicts (what :class:`AgentApp` encodes)."""
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "TEXT_MESSAGE_START", "messageId": MESSAGE_ID, "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": MESSAGE_ID, "delta": delta_text(i)}
          for i in range(deltas)),
        {"type": "TEXT_MESSAGE_END", "messageId": MESSAGE_ID},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run},
    ]  # fmt: skip


def run_input(thread: str) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": str(uuid.uuid4()),
        "state": {},
        "messages": [],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }


class SseViewer(asyncio.Protocol):
    """One SSE stream on a raw asyncio socket: counts ``\\nid: `` (thread events) per read.

    ``subscribed`` resolves once the hub's ``event: subscribed`` arrived; ``done`` once
    ``target`` events were counted (or the stream ended). Any other ``event:`` line
    after that (``close``, ``hub-error``) is kept in ``trouble``.
    """

    def __init__(self, port: int, path: str) -> None:
        self.port = port
        self.path = path
        loop = asyncio.get_running_loop()
        self.subscribed: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.in_body = False
        self.seen = bytearray()
        self.tail = b""
        self.count = 0
        self.target = 0
        self.done_at = 0.0
        self.trouble = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(
            f"GET {self.path} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
            f"Accept: text/event-stream\r\n\r\n".encode()
        )

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.subscribed, self.done, self.closed):
            if not future.done():
                if future is self.subscribed:
                    future.set_exception(ConnectionError(f"SSE stream closed: {exc}"))
                else:
                    future.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            if not self.head.startswith(b"HTTP/1.1 200"):
                line = bytes(self.head.split(b"\r\n", 1)[0]).decode(errors="replace")
                self.subscribed.set_exception(ConnectionError(line))
                assert self.transport is not None
                self.transport.close()
                return
            self.in_body = True
            data = bytes(self.head[end + 4 :])
            self.head.clear()
        if not self.subscribed.done():
            self.seen += data
            mark = self.seen.find(b"event: subscribed")
            if mark < 0:
                return
            self.subscribed.set_result(None)
            end = self.seen.find(b"\n\n", mark)
            data = bytes(self.seen[end + 2 :]) if end >= 0 else b""
            self.seen.clear()
        chunk = self.tail + data
        self.count += chunk.count(EVENT_ID)
        if b"\nevent: " in chunk and not self.trouble:
            at = chunk.find(b"\nevent: ")
            self.trouble = chunk[at + 1 : at + 200]
        self.tail = chunk[-4:]
        if self.count >= self.target > 0 and not self.done.done():
            self.done_at = time.perf_counter()
            self.done.set_result(None)

    def arm(self, target: int) -> None:
        self.count, self.target, self.done_at = 0, target, 0.0

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def sse_connect(port: int, thread: str, count: int) -> list[SseViewer]:
    loop = asyncio.get_running_loop()
    viewers: list[SseViewer] = []
    path = f"/threads/{thread}/events?from=live"

    async def one() -> None:
        _, viewer = await loop.create_connection(lambda: SseViewer(port, path), HOST, port)
        viewers.append(viewer)
        await asyncio.wait_for(viewer.subscribed, 30)

    try:
        for i in range(0, count, CONNECT_CONCURRENCY):
            await asyncio.gather(*(one() for _ in range(min(CONNECT_CONCURRENCY, count - i))))
    except BaseException:
        await sse_close(viewers)
        raise
    return viewers


async def sse_close(viewers: Sequence[SseViewer]) -> None:
    for v in viewers:
        v.close()
    if viewers:
        await asyncio.wait([v.closed for v in viewers], timeout=10)


async def until_done(
    publisher: asyncio.Task[Any], done: Sequence[asyncio.Future[None]], timeout: float
) -> None:
    """Wait until every *done* resolved, *timeout* passed, or *publisher* failed."""
    deadline = time.monotonic() + timeout
    waiting: set[asyncio.Future[Any]] = {f for f in done if not f.done()}
    while waiting and time.monotonic() < deadline:
        watch = waiting if publisher.done() else {*waiting, publisher}
        finished, _ = await asyncio.wait(
            watch, timeout=deadline - time.monotonic(), return_when=asyncio.FIRST_COMPLETED
        )
        if publisher in finished and publisher.exception() is not None:
            return
        waiting -= finished


class Bench:
    def __init__(self, args: argparse.Namespace, agent: Child) -> None:
        self.args = args
        self.agent = agent
        self.serial = 0
        self.batches = [int(b) for b in args.agent_batch.split(",")]
        self.http = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(args.timeout))

    def name(self, what: str) -> str:
        self.serial += 1
        return f"{what}{self.serial}-{uuid.uuid4().hex[:6]}"

    def agent_url(self, deltas: int, batch: int) -> str:
        return f"http://{HOST}:{self.agent.port}/run?deltas={deltas}&batch={batch}"

    # -- 1. relay ------------------------------------------------------------------------

    def agents(self) -> dict[str, str]:
        """The gateway's agents: ``b<B>`` streams ``--deltas`` B events per write, ``warm``
        a short run."""
        agents = {f"b{b}": self.agent_url(self.args.deltas, b) for b in self.batches}
        return {**agents, "warm": self.agent_url(WARM_DELTAS, 1)}

    async def relay_hub(self, gw: Gateway, hub: HubClient, agent: str, deltas: int) -> Result:
        """A viewer on a fresh thread, then ``run``: the reply -> the run's last event."""
        thread = self.name(f"relay-{gw.store}-")
        target = deltas + 4
        viewers = await bg.connect(gw.port, 1, "json")
        viewer = viewers[0]
        try:
            await bg.subscribe([(viewer, thread)])
            viewer.arm(target)
            pids = {**gw.pids(), "agent": self.agent.pid}
            await settle(list(pids.values()))
            meter = Meter(pids)
            t0 = time.perf_counter()
            reply = await hub.run(thread, agent, timeout=self.args.timeout)
            t1 = time.perf_counter()
            await asyncio.wait([viewer.done], timeout=self.args.timeout)
            t2 = viewer.done_at or time.perf_counter()
            cpu = meter.stop()
            await asyncio.sleep(0.05)  # frames past the target would show duplicates
            note = "" if reply.get("type") == "running" else f"reply {reply}"
            if viewer.count > target:
                note = f"{viewer.count - target} frames too many"
            return Result(target, min(viewer.count, target), t2 - t1, cpu, note,
                          {"reply_ms": 1000 * (t1 - t0)})  # fmt: skip
        finally:
            await bg.close_all(viewers)

    async def relay_direct(self, deltas: int, batch: int) -> Result:
        """The agent read directly: POST -> the last event's ``json.loads``."""
        target = deltas + 4
        pids = {"agent": self.agent.pid}
        await settle(list(pids.values()))
        meter = Meter(pids)
        count, last_type, t_last = 0, None, 0.0
        t0 = time.perf_counter()
        async with (
            asyncio.timeout(self.args.timeout),
            self.http.stream(
                "POST",
                self.agent_url(deltas, batch),
                json=run_input(self.name("direct-")),
                headers={"Accept": "text/event-stream"},
            ) as response,
        ):
            if response.status_code != 200:
                raise SystemExit(f"the agent answered {response.status_code}")
            rest = b""
            async for chunk in response.aiter_bytes():
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if line.startswith(b"data:"):
                        event = json.loads(line[5:])
                        count += 1
                        last_type = event.get("type")
                t_last = time.perf_counter()
        cpu = meter.stop()
        note = "" if last_type == "RUN_FINISHED" else f"last event {last_type}"
        return Result(target, count, t_last - t0, cpu, note)

    async def relay_publish(self, gw: Gateway, control: Client, deltas: int, batch: int) -> Result:
        """The run's events published through the gateway instead: *batch* events
        per ``publish`` command, one command at a time (the appends the bridge makes), to a
        viewer as in :meth:`relay_hub`; first command -> the last event."""
        thread = self.name(f"publish-{gw.store}-")
        events = run_events(thread, str(uuid.uuid4()), deltas)
        frames = [
            msgpack.packb({"type": "publish", "id": k + 1, "thread": thread,
                           "events": events[i : i + batch],
                           "eventIds": [f"p:{i + j}" for j in range(len(events[i : i + batch]))]})
            for k, i in enumerate(range(0, len(events), batch))
        ]  # fmt: skip
        viewers = await bg.connect(gw.port, 1, "json")
        viewer = viewers[0]
        try:
            await bg.subscribe([(viewer, thread)])
            viewer.arm(len(events))
            pids = gw.pids()
            await settle(list(pids.values()))
            meter = Meter(pids)
            t0 = time.perf_counter()
            publisher = asyncio.create_task(self.publish_frames(control, frames, 1))
            await until_done(publisher, [viewer.done], self.args.timeout)
            t1 = viewer.done_at or time.perf_counter()
            cpu = meter.stop()
            await publisher
            await asyncio.sleep(0.05)
            note = (
                f"{viewer.count - len(events)} frames too many"
                if viewer.count > len(events)
                else ""
            )
            return Result(len(events), min(viewer.count, len(events)), t1 - t0, cpu, note)
        finally:
            await bg.close_all(viewers)

    # -- 2. fan-out ----------------------------------------------------------------------

    async def publish_frames(self, control: Client, frames: list[bytes], window: int) -> float:
        """Send pre-encoded publish commands, at most *window* unanswered; the seconds it took.

        Raises :class:`RuntimeError` on a reply that is not ``published``."""
        t0 = time.perf_counter()
        inflight = 0
        for frame in [*frames, *([None] * window)]:
            if inflight >= window or (frame is None and inflight):
                reply = await asyncio.wait_for(control.replies.get(), self.args.timeout)
                inflight -= 1
                if reply.get("type") != "published":
                    raise RuntimeError(f"publish: {reply}")
            if frame is not None:
                control.send_frame(0x2, frame)
                inflight += 1
        return time.perf_counter() - t0

    def publish_commands(self, thread: str, events: list[dict[str, Any]], tag: str) -> list[bytes]:
        """``publish`` commands of *events*, ``--publish-batch`` each; event ids ``tag:<n>``."""
        batch = self.args.publish_batch
        out = []
        for k, i in enumerate(range(0, len(events), batch)):
            part = events[i : i + batch]
            ids = [f"{tag}:{i + j}" for j in range(len(part))]
            command = {"type": "publish", "id": k + 1, "thread": thread, "events": part,
                       "eventIds": ids}  # fmt: skip
            out.append(msgpack.packb(command))
        return out

    async def fanout(self, gw: Gateway, control: Client, kind: str, n: int, events: int) -> Result:
        thread = self.name(f"fan-{gw.store}-{kind}-{n}-")
        first = self.publish_commands(thread, [bg.run_started(thread)], "start")
        await self.publish_frames(control, first, 1)
        frames = self.publish_commands(thread, bg.workload(events), "load")
        ws: list[Client] = []
        sse: list[SseViewer] = []
        try:
            if kind == "ws":
                ws = await bg.connect(gw.port, n, "json")
                await bg.subscribe([(c, thread) for c in ws])
            else:
                sse = await sse_connect(gw.http_port, thread, n)
            viewers: list[Client | SseViewer] = [*ws, *sse]
            for v in viewers:
                v.arm(events)
            pids = gw.pids()
            await settle(list(pids.values()))
            meter = Meter(pids)
            t0 = time.perf_counter()
            publisher = asyncio.create_task(
                self.publish_frames(control, frames, self.args.publish_window)
            )
            await until_done(publisher, [v.done for v in viewers], self.args.timeout)
            t1 = time.perf_counter()
            cpu = meter.stop()
            publish_seconds = await publisher  # raises what stopped the publisher
            got = sum(min(v.count, events) for v in viewers)
            last = max((v.done_at for v in viewers if v.done_at), default=t1)
            seconds = (last if got == n * events else t1) - t0
            await asyncio.sleep(0.05)
            notes = []
            if any(v.count > events for v in viewers):
                notes.append("more events than published (duplicates)")
            trouble = {bytes(v.trouble[:60]) for v in sse if v.trouble}
            if trouble:
                notes.append(f"SSE: {sorted(trouble)}")
            closed = [c.close_code for c in ws if c.close_code is not None]
            if closed:
                notes.append(f"WS closed: {closed[:5]}")
            return Result(n * events, got, seconds, cpu, "; ".join(notes),
                          {"publish_s": publish_seconds})  # fmt: skip
        finally:
            await bg.close_all(ws)
            await sse_close(sse)
            await settle([gw.pid])


# -- reporting ------------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cpu_cell(results: Sequence[Result], party: str) -> str:
    values = [r.pct(party) for r in results if party in r.cpu]
    return f"{med(values):.0f}" if values else "-"


def progress(label: str, r: Result, unit: str) -> None:
    parties = [p for p in ("gateway", "agent", "client", "redis", "other") if p in r.cpu]
    cpu = " ".join(f"{p} {r.pct(p):.0f}" for p in parties)
    extra = "".join(f", {k} {v:.2f}" for k, v in r.extra.items())
    flag = "" if r.complete else f"  INCOMPLETE {r.got}/{r.expected} {r.note}"
    print(f"  {label}: {r.rate:>10,.0f} {unit}/s, {r.seconds:6.3f} s{extra}; cpu% {cpu}{flag}",
          flush=True)  # fmt: skip


def ratios(a: Sequence[Result], b: Sequence[Result]) -> list[float]:
    return [x.rate / y.rate for x, y in zip(a, b, strict=True) if y.rate > 0]


def flags(results: Sequence[Result]) -> str:
    bad = [r for r in results if not r.complete]
    if not bad:
        return ""
    return "  INCOMPLETE: " + "; ".join(f"{r.got}/{r.expected} {r.note}" for r in bad)


def report_relay(
    rows: list[tuple[str, int, list[Result], list[Result], list[Result]]],
    args: argparse.Namespace,
) -> None:
    print(
        f"1. Upstream relay: one run of {args.deltas} deltas + 4 events, as fast as the agent "
        f"can; events/s, median of {args.runs} runs"
    )
    print(
        f"  {'store':>6} {'batch':>5} {'hub/s':>8} {'direct/s':>9} {'hub/direct':>10} "
        f"{'(per run)':<15} {'publish/s':>9} {'hub/publish':>11} {'reply ms':>8}  "
        f"{'cpu%: gateway':>13} {'agent':>9} {'client':>9} {'redis':>5} {'other':>9}"
    )
    for store, batch, hub, direct, publish in rows:
        r = ratios(hub, direct)
        p = ratios(hub, publish)
        print(
            f"  {store:>6} {batch:>5} {med([x.rate for x in hub]):>8,.0f} "
            f"{med([x.rate for x in direct]):>9,.0f} {med(r):>10.2f} "
            f"{' '.join(f'{x:.2f}' for x in r):<15} "
            f"{med([x.rate for x in publish]):>9,.0f} {med(p):>11.2f} "
            f"{med([x.extra['reply_ms'] for x in hub]):>8.1f}  "
            f"{cpu_cell(hub, 'gateway') + '/' + cpu_cell(publish, 'gateway'):>13} "
            f"{cpu_cell(hub, 'agent') + '/' + cpu_cell(direct, 'agent'):>9} "
            f"{cpu_cell(hub, 'client') + '/' + cpu_cell(direct, 'client'):>9} "
            f"{cpu_cell(hub, 'redis'):>5} "
            f"{cpu_cell(hub, 'other') + '/' + cpu_cell(direct, 'other'):>9}"
            f"{flags(hub + direct + publish)}"
        )
    print(
        "  batch: events per agent write (per HTTP chunk). hub: `run` reply -> the WebSocket\n"
        "  viewer has the last event. direct (the ceiling): httpx POST -> the last event\n"
        "  json-decoded. publish (for reference): the same events published through the\n"
        "  gateway, batch per command, one command at a time, first command -> the viewer has\n"
        "  the last event. reply ms: `run` command -> `running` reply. cpu% of one core (2 in\n"
        "  all): gateway in hub / publish runs; agent, client, other in hub / direct runs"
    )


def report_fanout(
    rows: list[tuple[str, int, int, list[Result], list[Result]]], args: argparse.Namespace
) -> None:
    print(
        f"2. Fan-out of one thread to N viewers, SSE streams vs WebSocket subscribers "
        f"(deliveries/s, median of {args.runs} runs; publish: {args.publish_batch} events per "
        f"command, {args.publish_window} unanswered)"
    )
    print(
        f"  {'store':>6} {'N':>4} {'events':>6} {'deliveries':>10} {'SSE/s':>9} {'WS/s':>9} "
        f"{'SSE/WS':>6} {'(per run)':<16} {'per cpu-s':>9}  {'cpu%: gateway':>13} {'client':>7} "
        f"{'redis':>7} {'other':>7}"
    )
    for store, n, events, sse, ws in rows:
        r = ratios(sse, ws)
        per_cpu = [
            x.got / x.cpu["gateway"] / (y.got / y.cpu["gateway"])
            for x, y in zip(sse, ws, strict=True)
            if x.cpu["gateway"] > 0 and y.cpu["gateway"] > 0 and y.got
        ]
        print(
            f"  {store:>6} {n:>4} {events:>6} {n * events:>10} {med([x.rate for x in sse]):>9,.0f} "
            f"{med([x.rate for x in ws]):>9,.0f} {med(r):>6.2f} "
            f"{' '.join(f'{x:.2f}' for x in r):<16} {med(per_cpu):>9.2f}  "
            f"{cpu_cell(sse, 'gateway') + '/' + cpu_cell(ws, 'gateway'):>13} "
            f"{cpu_cell(sse, 'client') + '/' + cpu_cell(ws, 'client'):>7} "
            f"{cpu_cell(sse, 'redis') + '/' + cpu_cell(ws, 'redis'):>7} "
            f"{cpu_cell(sse, 'other') + '/' + cpu_cell(ws, 'other'):>7}{flags(sse + ws)}"
        )
    print(
        "  deliveries/s: N * events / (first publish -> last delivery); per cpu-s: SSE / WS of\n"
        "  deliveries per CPU-second of the gateway (what a delivery costs it); cpu% of one core\n"
        "  (2 in all), in the SSE / the WebSocket runs"
    )


# -- main ------------------------------------------------------------------------------------


def pairs(viewers: str, events: str) -> list[tuple[int, int]]:
    ns = [int(x) for x in viewers.split(",")]
    es = [int(x) for x in events.split(",")]
    if len(es) == 1:
        es = es * len(ns)
    if len(es) != len(ns):
        raise SystemExit("--events: one value, or one per --viewers value")
    return list(zip(ns, es, strict=True))


async def bench(args: argparse.Namespace, redis: tuple[int, str] | None) -> None:
    only = set(args.only.split(","))
    stores = args.stores.split(",")
    children: list[Child] = []
    profilers: list[tuple[subprocess.Popen[bytes], str]] = []
    relay_rows: list[tuple[str, int, list[Result], list[Result], list[Result]]] = []
    fan_rows: list[tuple[str, int, int, list[Result], list[Result]]] = []
    agent = start_agent()
    children.append(agent)
    b = Bench(args, agent)
    try:
        for store in stores:
            if store == "redis":
                assert redis is not None
                redis_pid, store_url = redis
                gw = start_gateway(store, store_url, b.agents(), redis_pid)
            else:
                gw = start_gateway(store, "memory://", b.agents(), None)
            children.append(gw.child)
            print(
                f"[{store}] gateway pid {gw.pid} ws port {gw.port} http port {gw.http_port}; "
                f"agent pid {agent.pid} port {agent.port}"
                + (f"; redis pid {gw.redis_pid}" if gw.redis_pid else ""),
                flush=True,
            )
            if args.profile and not profilers:
                profilers = bg.start_profilers(args.profile, [gw.child, agent])
            try:
                if "relay" in only:
                    hub = HubClient(f"ws://{HOST}:{gw.port}", open_timeout=args.timeout)
                    await hub.connect()
                    control = (await bg.connect(gw.port, 1, "msgpack"))[0]
                    try:
                        # Warm up each path (connections, imports, the agent's frame cache).
                        await b.relay_hub(gw, hub, "warm", WARM_DELTAS)
                        await b.relay_direct(WARM_DELTAS, 1)
                        await b.relay_publish(gw, control, WARM_DELTAS, 1)
                        await b.relay_direct(args.deltas, 1)  # the agent's cache of --deltas
                        for batch in b.batches:
                            relay: dict[str, list[Result]] = {
                                "hub": [], "direct": [], "publish": []
                            }  # fmt: skip
                            for run in range(args.runs):
                                order = ["hub", "direct", "publish"]
                                for kind in order[run % 3 :] + order[: run % 3]:
                                    if kind == "hub":
                                        r = await b.relay_hub(gw, hub, f"b{batch}", args.deltas)
                                    elif kind == "direct":
                                        r = await b.relay_direct(args.deltas, batch)
                                    else:
                                        r = await b.relay_publish(gw, control, args.deltas, batch)
                                    relay[kind].append(r)
                                    progress(f"[{store}] relay x{batch} run {run + 1} {kind:>7}",
                                             r, "events")  # fmt: skip
                            relay_rows.append(
                                (store, batch, relay["hub"], relay["direct"], relay["publish"])
                            )
                    finally:
                        await bg.close_all([control])
                        await hub.close()
                if "fanout" in only:
                    control = (await bg.connect(gw.port, 1, "msgpack"))[0]
                    try:
                        for n, events in pairs(args.viewers, args.events):
                            results: dict[str, list[Result]] = {"sse": [], "ws": []}
                            for run in range(args.runs):
                                order = ("sse", "ws") if run % 2 == 0 else ("ws", "sse")
                                for kind in order:
                                    r = await b.fanout(gw, control, kind, n, events)
                                    results[kind].append(r)
                                    progress(f"[{store}] fan-out N={n} x{events} run {run + 1} "
                                             f"{kind:>3}", r, "deliveries")  # fmt: skip
                            fan_rows.append((store, n, events, results["sse"], results["ws"]))
                    finally:
                        await bg.close_all([control])
            finally:
                if profilers and store == stores[-1]:
                    bg.stop_profilers(profilers)
                gw.child.stop()
                children.remove(gw.child)
        print()
        if relay_rows:
            report_relay(relay_rows, args)
            print()
        if fan_rows:
            report_fanout(fan_rows, args)
            print()
    except BaseException:
        for child in children:
            if child.proc.poll() is not None:
                print(f"{child.name} exited with {child.proc.returncode}; log:\n{child.tail()}")
        raise
    finally:
        bg.stop_profilers(profilers)
        for child in children:
            child.stop()
        await b.http.aclose()
    for _, out in profilers:
        if os.path.exists(out):
            bg.summarize_profile(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per ratio (median)")
    parser.add_argument("--stores", default="memory,redis", help="memory and/or redis")
    parser.add_argument("--only", default="relay,fanout", help="relay and/or fanout")
    parser.add_argument("--deltas", type=int, default=20_000, help="text deltas of the run")
    parser.add_argument("--agent-batch", default="1,16",
                        help="events per agent write, one relay row each")  # fmt: skip
    parser.add_argument("--viewers", default="10,100", help="N viewers of one thread")
    parser.add_argument("--events", default="20000,2000",
                        help="events per fan-out: one value, or one per --viewers")  # fmt: skip
    parser.add_argument("--publish-batch", type=int, default=100, help="events per publish")
    parser.add_argument("--publish-window", type=int, default=4, help="publishes unanswered")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per measurement")
    parser.add_argument("--profile", metavar="PREFIX", help="py-spy the gateway and the agent")
    parser.add_argument("--agent-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.agent_server:
        agent_server(args.port)
        return
    unknown = set(args.stores.split(",")) - {"memory", "redis"}
    if unknown:
        raise SystemExit(f"--stores: unknown {sorted(unknown)}")
    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    proc: subprocess.Popen[bytes] | None = None
    redis: tuple[int, str] | None = None
    if "redis" in args.stores.split(","):
        proc, url = bg.start_redis()
        redis = (proc.pid, url)
    try:
        asyncio.run(bench(args, redis))
    finally:
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
