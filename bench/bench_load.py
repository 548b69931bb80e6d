"""The load shapes a relay sees: the gateway against peers measured in the same run.

Usage::

    python bench/bench_load.py [--runs 3] [--only single,pipelined,paced,burst,threads,resume]
        [--quick] [--json PATH] [--chart PATH.png] [--peers python,node]
        [--server-loop uvloop] [--gateway-arg=--workers=2]

Starts its own redis-server (loopback, no persistence, a free port), the
gateway as a separate process (``python -m agui_hub.cli serve``, with the
per-address connection cap and the per-connection rate limits lifted so that
they are not what is measured), and the bare ``websockets`` broadcast server of
``bench_gateway.py`` (``--bare-server``: no Redis, no validation; it
broadcasts what it is told to at once). This process runs the agents (the
publishing connections, msgpack by default, with ``eventIds`` as the
``Publisher`` sends them) and every viewer (JSON by default), on raw asyncio
sockets (``bench_gateway.Client``: frames counted by their prefix, not
decoded), on uvloop unless ``--client-loop asyncio``. Every case reports
medians of ``--runs`` runs, the hub and its peers alternating which goes
first; ``--json PATH`` keeps every raw result. A measurement that fails (a
refused subscribe, a timeout) is reported as FAILED and the run goes on.

1. single-publish: one agent connection sends single-event ``publish``
   commands into one thread, each awaited before the next (events/s),
   against raw ``XADD`` of the same msgpack bytes and fields, awaited one at a
   time from redis-py. Goal: hub / raw >= 0.5 (the hub's path is two hops,
   agent -> gateway -> Redis, and validates and sequence-checks each event).
2. pipelined-publish: the same, with ``--window`` commands unanswered at most
   (answers counted as they come). Goal: >= 10,000 events/s. Raw pipelined
   ``XADD`` (``--window`` per round trip), for information.
3. paced grid: ``--paced-rates`` deliveries/s offered to N
   (``--paced-viewers``) subscribers of one thread, i.e. rate / N events/s,
   each event one publish command from an agent connection (pipelined: at
   most ``--paced-window`` unanswered), for ``--paced-seconds`` (at most
   ``--paced-max-events`` events). The publisher wakes up once a millisecond
   and sends what is due. Each event carries a time stamp
   (``@T<perf_counter_ns>~`` in its delta, as in bench_gateway's latency
   step): its send time, or its scheduled time when the publisher is more
   than a millisecond late (held back by unanswered commands or by this
   process's CPU), so that a publisher falling behind shows in the latency
   instead of hiding it. Per system: achieved deliveries/s, sustained (>= 95%
   of the offered deliveries arrived within the run + 1 s), p50 / p99 publish
   -> delivery latency over every delivery, CPU of server + Redis per
   delivery, deliveries lost (not arrived ``--drain`` seconds later). Peer: the
   bare server, told by the same publish commands (``publish`` on its control
   connection: encode the frame, broadcast it at once, answer).
4. burst grid: N subscribers per thread x M threads (``--burst-cells``),
   ``--burst-deliveries`` deliveries per cell published as fast as possible,
   as bench_gateway's fan-out does (``RedisStore.append``, batches of
   ``--publish-batch`` into one thread, one event per call round robin into
   many); the bare server broadcasts the same frames. Deliveries/s (first
   publish -> last delivery), lost deliveries, hub / bare. No latency: in a
   burst it is queueing by construction.
5. many threads: ``--threads`` threads x ``--viewers`` viewers (a connection
   per viewer and thread), ``--thread-events`` events per thread, one event
   per publish command, round robin over the threads, from ``--agents`` agent
   connections (each at most ``--window`` unanswered), against the bare server
   told by the same commands. Goal: hub / bare >= 0.8. A second row publishes
   with ``RedisStore.append`` against the bare server's pre-encoded broadcast
   (bench_gateway's many-threads case). The seconds to connect and subscribe
   every viewer are reported per system. Then, paced: ``--threads-rates``
   events/s (default 1,000) offered round robin over the same threads by one
   agent for ``--paced-seconds``, reported as case 3 (p50 / p99 publish ->
   delivery, sustained, CPU per delivery).
6. resume storm: ``--resume`` cells of threads x viewers; every viewer had
   seen its thread up to an offset X (after ``--history`` events) and is
   ``--behind`` events behind. All reconnect at once
   (``CONNECT_CONCURRENCY`` handshakes in flight), each subscribing as soon as
   it is connected, ``from: {"offset": X, "epoch": E}``: seconds until every
   viewer holds every missed event, in order, none lost or twice (each event
   carries its index; every viewer's list is checked; a reply without
   ``recovered: true`` and the same epoch is counted), and deliveries/s. Peer,
   for scale only: the bare server replaying the same frames from memory to
   each connection that subscribes from a position.
7. ``--peers python,node`` (``npm ci`` in bench/peers, run here when
   node_modules is missing or with ``--npm-ci``; skipped with a message
   without node and npm) adds two peers to cases 3, 4 and 5: ``node-ws``, the
   bare server again on Node's ``ws`` package, and ``socketio``, a Socket.IO 4
   server with ``@socket.io/redis-streams-adapter`` on the benchmark's Redis
   (every room emit is an XADD to the adapter's stream, then the local
   broadcast; it answers a publish at once, having nothing to wait for). The
   load client speaks Engine.IO v4 / Socket.IO to it over the raw WebSocket
   (``/socket.io/?EIO=4&transport=websocket``, ``40``, ``42["c",...]`` out,
   ``42["m",...]`` in, ping ``2`` answered ``3``); JSON viewers only.

``--chart PATH.png`` draws deliveries/s per system for the paced and burst
cells, and p99 for the paced ones. ``--quick`` is a smoke run (tiny sizes, one
run, well under a minute). ``--server-loop uvloop`` runs the gateway and the
bare server on uvloop; ``--gateway-arg`` passes anything else to ``serve``.
Absolute rates on a shared 2-core machine are noise: the ratios, and where a
system stops keeping up, are the result. CPU% columns are of one core; the
server's includes its child processes (``--workers``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import msgpack
import redis.asyncio as aioredis

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_gateway as bg
from bench_gateway import Child, Client, CpuMeter, percentile, settle

from agui_hub.store.contract import EventInput
from agui_hub.wire.codec import encode_msgpack

HOST = bg.HOST
NO_LIMIT = "1000000000"
"""Rate limits far above what one connection can send here."""
TICK_NS = 1_000_000
"""The paced publisher wakes up at most once a millisecond and sends what is due."""
PEERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")
CASES = ("single", "pipelined", "paced", "burst", "threads", "resume")


# -- connections ---------------------------------------------------------------------------


def encode_command(frame: dict[str, Any], encoding: str) -> bytes:
    return msgpack.packb(frame) if encoding == "msgpack" else json.dumps(frame).encode()


class Agent(Client):
    """A publishing connection: commands sent without waiting, their answers counted."""

    def __init__(self, port: int, encoding: str) -> None:
        super().__init__(port, encoding)
        self.opcode = 2 if encoding == "msgpack" else 1
        self.sent = 0
        self.acked = 0
        self.errors: Counter[str] = Counter()
        self.first_error: dict[str, Any] | None = None
        self._room: asyncio.Future[None] | None = None
        self._limit = 0

    def reply(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind not in ("published", "error"):
            super().reply(frame)
            return
        self.acked += 1
        if kind == "error":
            self.errors[str(frame.get("code"))] += 1
            self.first_error = self.first_error or frame
        room = self._room
        if room is not None and not room.done() and self.sent - self.acked < self._limit:
            room.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._room is not None and not self._room.done():
            self._room.set_exception(ConnectionError(f"agent closed ({self.close_code})"))

    def publish(self, payload: bytes) -> None:
        self.send_frame(self.opcode, payload)
        self.sent += 1

    async def room(self, limit: int) -> None:
        """Return when fewer than *limit* commands are unanswered."""
        while self.sent - self.acked >= limit:
            if self.closed.done():
                raise ConnectionError(f"agent closed ({self.close_code})")
            self._limit = limit
            self._room = asyncio.get_running_loop().create_future()
            try:
                await self._room
            finally:
                self._room = None


class Viewer(Client):
    """Counts event frames; with stamps on, keeps the integer each one carries
    (``@T<n>~``) instead of a latency: the resume storm's order check."""

    def _stamp(self, buf: bytearray, start: int, end: int) -> None:
        i = buf.find(bg.STAMP, start, end)
        if i >= 0 and self.latencies is not None:
            self.latencies.append(int(buf[i + 2 : buf.find(b"~", i, end)]))


SIO_EVENT_PREFIX = b'42["m",{"type":"event"'
"""How the Socket.IO peer's event frames start: the event "m" carrying a gateway frame."""


class SioClient(Client):
    """The load client speaking Engine.IO v4 / Socket.IO over the raw WebSocket.

    The peer wraps the gateway's frames in Socket.IO events: commands go out
    as ``42["c",{...}]``, frames come as ``42["m",{...}]`` (counted by that
    prefix). The connection counts as open once the namespace is joined.
    """

    def __init__(self, port: int, encoding: str) -> None:
        super().__init__(port, encoding)
        self.prefix = SIO_EVENT_PREFIX

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        key = base64.b64encode(os.urandom(16)).decode()
        self.transport.write(
            f"GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )

    def on_open(self) -> None:
        pass  # not before the namespace's "40"

    def control(self, opcode: int, payload: bytes) -> None:
        if payload.startswith(b"42"):
            self.reply(json.loads(payload[2:])[1])
        elif payload == b"2":  # Engine.IO ping
            self.send_frame(0x1, b"3")
        elif payload.startswith(b"40"):
            if not self.opened.done():
                self.opened.set_result(None)
        elif payload.startswith(b"0"):  # Engine.IO open: join the main namespace
            self.send_frame(0x1, b"40")
        elif payload.startswith(b"44") and not self.opened.done():
            self.opened.set_exception(ConnectionError(f"Socket.IO refused: {payload!r}"))

    def send(self, frame: dict[str, Any]) -> None:
        self.send_frame(0x1, sio_command(frame))


class SioAgent(SioClient, Agent):
    pass


def sio_command(frame: dict[str, Any]) -> bytes:
    return b'42["c",' + json.dumps(frame).encode() + b"]"


# -- systems --------------------------------------------------------------------------------


@dataclass
class System:
    """A server under test: ``hub`` (gateway + Redis) or a peer speaking the same frames."""

    name: str
    child: Child
    is_hub: bool
    """The gateway: its events go into its store (``RedisStore.append`` feeds it in
    bench_gateway's fan-out); a peer is told what to broadcast instead."""
    publish_extra: dict[str, Any] = field(default_factory=dict)
    """Fields the peer's publish command needs beyond the hub's."""
    agent_encoding: str = "msgpack"
    viewer: Callable[[int, str], Client] = Client
    agent: Callable[[int, str], Client] = Agent
    socketio: bool = False

    def encode(self, command: dict[str, Any]) -> bytes:
        if self.socketio:
            return sio_command(command)
        return encode_command(command, self.agent_encoding)

    async def agents(self, count: int) -> list[Agent]:
        return cast(
            list[Agent], await bg.connect(self.port, count, self.agent_encoding, self.agent)
        )

    @property
    def port(self) -> int:
        return self.child.port

    @property
    def pid(self) -> int:
        return self.child.pid


@dataclass
class Sample:
    """One measurement of one system. *done* of *count* units (events or deliveries)."""

    case: str
    cell: str
    system: str
    run: int
    count: int
    done: int
    seconds: float
    cpu: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    """Why the measurement failed (then nothing else in it counts)."""

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def share(self, party: str) -> float:
        return self.cpu.get(party, 0.0) / self.cpu["window"] if self.cpu.get("window") else 0.0

    @property
    def us_per(self) -> float:
        """CPU microseconds of server + Redis per unit done."""
        busy = self.cpu.get("server", 0.0) + self.cpu.get("redis", 0.0)
        return 1e6 * busy / self.done if self.done else float("nan")

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate, "us_per": self.us_per}


def paced_cell(viewers: int, rate: float) -> str:
    return f"N={viewers} @{rate:,.0f}/s"


def text_events(count: int, message: str = "m", stamp: bool = False) -> list[dict[str, Any]]:
    """TEXT_MESSAGE_CONTENT deltas of one open message (optionally ``@T<index>~``)."""
    return [
        {
            "type": "TEXT_MESSAGE_CONTENT",
            "messageId": message,
            "delta": f"@T{i}~" if stamp else f" token{i % 50}",
        }
        for i in range(count)
    ]


def opening(thread: str, message: str = "m") -> list[dict[str, Any]]:
    return [
        bg.run_started(thread),
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
    ]


class Load:
    """Everything the cases share: the servers, Redis, the store, the results."""

    def __init__(self, args: argparse.Namespace, store_url: str, redis_pid: int) -> None:
        self.args = args
        self.store_url = store_url
        self.redis_pid = redis_pid
        self.fan = bg.Bench(args, store_url, redis_pid)
        self.store = self.fan.store
        self.raw = aioredis.Redis.from_url(store_url)
        self.samples: list[Sample] = []
        self.serial = 0

    def name(self, what: str) -> str:
        self.serial += 1
        return f"{what}{self.serial}"

    def meter(self, system: System | None) -> CpuMeter:
        return CpuMeter(system.pid if system else self.redis_pid, self.redis_pid)

    def keep(self, sample: Sample) -> Sample:
        self.samples.append(sample)
        return sample

    def publish_command(
        self, system: System, ident: int, thread: str, events: list[dict[str, Any]]
    ) -> bytes:
        frame: dict[str, Any] = {"type": "publish", "id": ident, "thread": thread, "events": events}
        if not self.args.no_event_ids:
            frame["eventIds"] = [f"{thread}:{ident}:{j}" for j in range(len(events))]
        frame.update(system.publish_extra)
        return system.encode(frame)

    async def open_threads(self, system: System, agent: Agent, threads: Sequence[str]) -> None:
        """RUN_STARTED and an open message in each thread, through *agent* (not timed)."""
        ident = 0
        async with asyncio.timeout(self.args.timeout):
            for thread in threads:
                for event in opening(thread):
                    ident += 1
                    await agent.room(self.args.window)
                    agent.publish(self.publish_command(system, -ident, thread, [event]))
            await agent.room(1)
        if agent.errors:
            raise RuntimeError(f"opening threads on {system.name}: {agent.first_error}")

    # 1, 2. publish ----------------------------------------------------------------------

    async def publish_hub(self, system: System, count: int, window: int) -> Sample:
        """*count* single-event publishes into one thread, at most *window* unanswered."""
        thread = self.name("pub-")
        [agent] = await system.agents(1)
        try:
            await self.open_threads(system, agent, [thread])
            payloads = [
                self.publish_command(system, i, thread, [e])
                for i, e in enumerate(text_events(count))
            ]
            agent.errors.clear()
            start_acked = agent.acked
            await settle([system.pid, self.redis_pid])
            meter = self.meter(system)
            t0 = time.perf_counter()
            note = ""
            try:
                async with asyncio.timeout(self.args.timeout):
                    for payload in payloads:
                        await agent.room(window)
                        agent.publish(payload)
                    await agent.room(1)
            except TimeoutError:
                note = "timed out"
            seconds = time.perf_counter() - t0
            cpu = meter.stop()
            done = agent.acked - start_acked - sum(agent.errors.values())
            case = "single" if window == 1 else "pipelined"
            extra = {"errors": dict(agent.errors), "note": note, "window": window}
            return self.keep(
                Sample(case, f"x{count}", system.name, 0, count, done, seconds, cpu, extra)
            )
        finally:
            await bg.close_all([agent])

    async def publish_raw(self, count: int, batch: int) -> Sample:
        """XADD of the same bytes and fields the store keeps: one by one, or pipelined."""
        key = self.name("raw-xadd-")
        rows = [(encode_msgpack(e), str(e["type"])) for e in text_events(count)]
        await settle([self.redis_pid])
        meter = self.meter(None)
        t0 = time.perf_counter()
        done, note = 0, ""
        try:
            async with asyncio.timeout(self.args.timeout):
                if batch == 1:
                    for i, (payload, kind) in enumerate(rows):
                        await self.raw.xadd(
                            key, {"event": payload, "id": f"r{i}", "run": "", "type": kind}
                        )
                        done += 1
                else:
                    for i in range(0, count, batch):
                        pipe = self.raw.pipeline(transaction=False)
                        for j, (payload, kind) in enumerate(rows[i : i + batch]):
                            pipe.xadd(
                                key, {"event": payload, "id": f"r{i + j}", "run": "", "type": kind}
                            )
                        done += len(await pipe.execute())
        except TimeoutError:
            note = "timed out"
        seconds = time.perf_counter() - t0
        cpu = meter.stop()
        cpu["server"] = 0.0  # the meter's "server" was Redis itself
        await self.raw.delete(key)
        case = "single" if batch == 1 else "pipelined"
        return self.keep(
            Sample(
                case,
                f"x{count}",
                "raw XADD",
                0,
                count,
                done,
                seconds,
                cpu,
                {"note": note, "window": batch},
            )
        )

    # 3. paced ---------------------------------------------------------------------------

    async def paced(self, system: System, viewers: int, rate: float, threads: int = 1) -> Sample:
        """Deliveries offered at *rate* per second to *viewers* subscribers of each of
        *threads* threads, the events round robin over the threads."""
        args = self.args
        per_second = rate / viewers
        per_thread = max(
            1, min(args.paced_max_events, round(per_second * args.paced_seconds)) // threads
        )
        count = per_thread * threads
        duration = count / per_second
        names = bg.thread_names(self.name(f"paced-{system.name}-"), threads)
        [agent] = await system.agents(1)
        clients: list[Client] = []
        at_deadline: asyncio.Task[tuple[int, float]] | None = None
        try:
            await self.open_threads(system, agent, names)
            t_join = time.perf_counter()
            clients = await bg.connect(system.port, viewers * threads, args.encoding, system.viewer)
            await bg.subscribe([(c, names[i % threads]) for i, c in enumerate(clients)])
            join_seconds = time.perf_counter() - t_join
            for c in clients:
                c.arm(per_thread, latencies=True)
            agent.errors.clear()
            await settle([system.pid, self.redis_pid])
            meter = self.meter(system)
            interval_ns = 1e9 / per_second
            t0 = time.perf_counter()
            t0_ns = time.perf_counter_ns()
            deadline = t0 + duration + 1.0

            async def count_at_deadline() -> tuple[int, float]:
                """What had arrived by the deadline, and when the last of it did: the
                publisher may still be sending then."""
                await asyncio.sleep(deadline - time.perf_counter())
                arrived = sum(min(c.count, per_thread) for c in clients)
                return arrived, max((c.last_at for c in clients), default=deadline)

            at_deadline = asyncio.create_task(count_at_deadline())
            behind_ns = 0
            sent = 0
            ident = 0
            cmd: dict[str, Any] = {"type": "publish", **system.publish_extra}
            try:
                async with asyncio.timeout(duration + args.timeout):
                    while sent < count:
                        due = min(count, int((time.perf_counter_ns() - t0_ns) / interval_ns) + 1)
                        while sent < due:
                            await agent.room(args.paced_window)
                            scheduled = t0_ns + int(sent * interval_ns)
                            now = time.perf_counter_ns()
                            behind_ns = max(behind_ns, now - scheduled)
                            # Within a tick of its time, an event counts from its send;
                            # later, from when it was due: a publisher held back by
                            # unanswered commands must not hide that wait.
                            stamp = now if now - scheduled <= TICK_NS else scheduled
                            ident += 1
                            thread = names[sent % threads]
                            cmd["id"] = ident
                            cmd["thread"] = thread
                            cmd["events"] = [
                                {
                                    "type": "TEXT_MESSAGE_CONTENT",
                                    "messageId": "m",
                                    "delta": f"@T{stamp}~",
                                }
                            ]
                            if not args.no_event_ids:
                                cmd["eventIds"] = [f"{thread}:{ident}"]
                            agent.publish(system.encode(cmd))
                            sent += 1
                        if sent < count:
                            wait = (t0_ns + sent * interval_ns - time.perf_counter_ns()) / 1e9
                            # Not below a tick: uvloop's timers have millisecond
                            # resolution, and a shorter sleep would spin.
                            await asyncio.sleep(max(TICK_NS / 1e9, wait))
            except TimeoutError:
                pass
            sent_at = time.perf_counter() - t0
            await asyncio.wait(
                [c.done for c in clients], timeout=max(0.0, deadline - time.perf_counter())
            )
            if not at_deadline.done():
                at_deadline.cancel()  # everything arrived in time
                in_time = count * viewers
                last = max(c.done_at or t0 for c in clients)
            else:
                in_time, last = at_deadline.result()
            # Late is not lost: what is still on its way has --drain seconds more.
            await asyncio.wait([c.done for c in clients], timeout=args.drain)
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(args.drain):
                    await agent.room(1)
            cpu = meter.stop()
            expected = count * viewers
            delivered = sum(min(c.count, per_thread) for c in clients)
            lat = sorted(x for c in clients for x in c.latencies or ())
            ms = [x / 1e6 for x in lat]
            extra = {
                "viewers": viewers,
                "offered": rate,
                "events": count,
                "events_per_second": per_second,
                "in_time": in_time,
                "sustained": in_time >= 0.95 * expected,
                "lost": expected - delivered,
                "duplicates": sum(max(0, c.count - per_thread) for c in clients),
                "threads": threads,
                "join_seconds": join_seconds,
                "p50_ms": percentile(ms, 0.5),
                "p90_ms": percentile(ms, 0.9),
                "p99_ms": percentile(ms, 0.99),
                "max_ms": max(ms, default=float("nan")),
                "pacing_lag_ms": behind_ns / 1e6,
                "publish_seconds": sent_at,
                "acked": agent.acked,
                "errors": dict(agent.errors),
                "first_error": agent.first_error,
                "closed": dict(Counter(c.close_code for c in clients if c.close_code is not None)),
            }
            seconds = max(duration, last - t0)
            case, cell = "paced", paced_cell(viewers, rate)
            if threads > 1:
                case, cell = "threads-paced", f"{threads}x{viewers} @{per_second:,.0f} ev/s"
            return self.keep(
                Sample(
                    case,
                    cell,
                    system.name,
                    0,
                    expected,
                    in_time,
                    seconds,
                    cpu,
                    extra,
                )
            )
        finally:
            if at_deadline is not None:
                at_deadline.cancel()
            await bg.close_all([*clients, agent])
            await settle([system.pid])

    # 4. burst ---------------------------------------------------------------------------

    async def burst(self, system: System, viewers: int, threads: int, events: int) -> Sample:
        """bench_gateway's fan-out: *events* per thread, as fast as they go."""
        kind = "hub" if system.is_hub else "bare"
        # Duplicates raise (RuntimeError): the run records the measurement as failed.
        d = await self.fan.fanout(system.child, kind, threads, viewers, events, system.viewer)
        extra = {
            "viewers": viewers,
            "threads": threads,
            "events_per_thread": events,
            "lost": d.expected - d.delivered,
            "closed": dict(d.closed),
            "publish_seconds": d.publish_seconds,
        }
        return self.keep(
            Sample(
                "burst",
                f"{viewers}x{threads}",
                system.name,
                0,
                d.expected,
                d.delivered,
                d.seconds,
                d.cpu,
                extra,
            )
        )

    # 5. many threads --------------------------------------------------------------------

    async def many_threads(self, system: System) -> Sample:
        """One event per publish command, round robin over the threads, from a few agents."""
        args = self.args
        prefix = self.name(f"many-{system.name}-")
        names = bg.thread_names(prefix, args.threads)
        events = args.thread_events
        agents = await system.agents(args.agents)
        clients: list[Client] = []
        try:
            await asyncio.gather(
                *(
                    self.open_threads(system, agent, names[i :: args.agents])
                    for i, agent in enumerate(agents)
                )
            )
            t_join = time.perf_counter()
            clients = await bg.connect(
                system.port, args.threads * args.viewers, args.encoding, system.viewer
            )
            await bg.subscribe([(c, names[i % args.threads]) for i, c in enumerate(clients)])
            join_seconds = time.perf_counter() - t_join
            # One ordered list of commands per agent: agent i owns threads i, i + agents, ...
            plan: list[list[bytes]] = [[] for _ in agents]
            for k, event in enumerate(text_events(events)):
                for t, thread in enumerate(names):
                    cmd = self.publish_command(system, k, thread, [event])
                    plan[t % args.agents].append(cmd)
            for c in clients:
                c.arm(events)
            for agent in agents:
                agent.errors.clear()
            await settle([system.pid, self.redis_pid])
            meter = self.meter(system)
            t0 = time.perf_counter()

            async def drive(agent: Agent, payloads: list[bytes]) -> float:
                for payload in payloads:
                    await agent.room(args.window)
                    agent.publish(payload)
                await agent.room(1)
                return time.perf_counter() - t0

            drivers = [asyncio.create_task(drive(a, p)) for a, p in zip(agents, plan, strict=True)]
            await asyncio.wait([c.done for c in clients], timeout=args.timeout)
            t1 = time.perf_counter()
            done, _ = await asyncio.wait(drivers, timeout=max(1.0, args.timeout - (t1 - t0)))
            for task in drivers:
                task.cancel()
            cpu = meter.stop()
            expected = args.threads * args.viewers * events
            delivered = sum(min(c.count, events) for c in clients)
            last = max((c.done_at for c in clients if c.done_at), default=t1)
            seconds = (last if delivered == expected else t1) - t0
            errors: Counter[str] = Counter()
            for agent in agents:
                errors.update(agent.errors)
            publish = [t.result() for t in done if not t.cancelled() and t.exception() is None]
            extra = {
                "lost": expected - delivered,
                "duplicates": sum(max(0, c.count - events) for c in clients),
                "closed": dict(Counter(c.close_code for c in clients if c.close_code is not None)),
                "errors": dict(errors),
                "first_error": next((a.first_error for a in agents if a.first_error), None),
                "publish_seconds": max(publish) if len(publish) == len(agents) else None,
                "join_seconds": join_seconds,
            }
            cell = f"{args.threads}x{args.viewers} publish"
            return self.keep(
                Sample("threads", cell, system.name, 0, expected, delivered, seconds, cpu, extra)
            )
        finally:
            await bg.close_all([*clients, *agents])
            await settle([system.pid])

    async def many_threads_store(self, system: System) -> Sample:
        args = self.args
        kind = "hub" if system.is_hub else "bare"
        d = await self.fan.fanout(
            system.child, kind, args.threads, args.viewers, args.thread_events
        )
        extra = {
            "lost": d.expected - d.delivered,
            "closed": dict(d.closed),
            "publish_seconds": d.publish_seconds,
        }
        cell = f"{args.threads}x{args.viewers} append"
        return self.keep(
            Sample(
                "threads", cell, system.name, 0, d.expected, d.delivered, d.seconds, d.cpu, extra
            )
        )

    # 6. resume storm --------------------------------------------------------------------

    async def resume(self, system: System, threads: int, viewers: int) -> Sample:
        """*viewers* per thread, each *behind* events behind, reconnecting at once."""
        args = self.args
        behind = args.behind
        prefix = self.name(f"resume-{system.name}-")
        names = bg.thread_names(prefix, threads)
        missed = text_events(behind, stamp=True)
        positions: dict[str, dict[str, Any]] = {}
        control: list[Client] = []
        if system.is_hub:
            history = [EventInput.of(e) for e in text_events(args.history)]
            for thread in names:
                items = [EventInput.of(e) for e in opening(thread)] + history
                offsets = await self.store.append(thread, items)
                epoch = await self.store.epoch(thread)
                positions[thread] = {"offset": offsets[-1], "epoch": epoch}
                for i in range(0, behind, 500):
                    await self.store.append(thread, [EventInput.of(e) for e in missed[i : i + 500]])
        else:
            control = await bg.connect(system.port, 1, args.encoding)
            spec = {"type": "prepare", "prefix": prefix, "threads": threads, "events": missed}
            await control[0].command(spec, "prepared", timeout=120)
            positions = {t: {"offset": "1-0", "epoch": "bare"} for t in names}
        clients: list[Client] = []
        refused: list[str] = []
        not_recovered: list[str] = []
        retried: Counter[str] = Counter()
        live: list[Client] = []
        await settle([system.pid, self.redis_pid])
        loop = asyncio.get_running_loop()
        gate = asyncio.Semaphore(bg.CONNECT_CONCURRENCY)
        meter = self.meter(system)
        t0 = time.perf_counter()

        async def reconnect(thread: str) -> None:
            async with gate:
                _, client = await loop.create_connection(
                    lambda: Viewer(system.port, args.encoding), HOST, system.port
                )
                clients.append(client)
                await asyncio.wait_for(client.opened, 30)
            client.arm(behind, latencies=True)
            cmd = {"type": "subscribe", "id": 1, "thread": thread, "from": positions[thread]}
            pause = 1.0
            for attempt in range(args.resume_retries + 1):
                client.send(cmd)
                getter = asyncio.ensure_future(client.replies.get())
                closed: asyncio.Future[Any] = client.closed
                await asyncio.wait([getter, closed], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    refused.append(f"{thread}: closed with {client.close_code} before the reply")
                    return
                reply = getter.result()
                if reply.get("code") == "store_unavailable" and attempt < args.resume_retries:
                    # What a client is told to do: subscribe again after a pause,
                    # doubled each time (the Python client's backoff, from 1 s).
                    retried["store_unavailable"] += 1
                    await asyncio.sleep(pause)
                    pause *= 2
                    continue
                break
            if reply.get("type") != "subscribed":
                refused.append(f"{thread}: {reply}")
                return
            live.append(client)
            if not reply.get("recovered") or reply.get("epoch") != positions[thread]["epoch"]:
                not_recovered.append(f"{thread}: {reply}")

        note = ""
        subscribed = float("nan")
        try:
            try:
                async with asyncio.timeout(args.timeout):
                    outcomes = await asyncio.gather(
                        *(reconnect(t) for t in names for _ in range(viewers)),
                        return_exceptions=True,
                    )
                    subscribed = time.perf_counter() - t0
                    pending = [c.done for c in live if not c.done.done()]
                    if pending:
                        await asyncio.wait(pending)
            except TimeoutError:
                note = f"timed out after {args.timeout:g} s"
            else:
                failures = Counter(type(x).__name__ for x in outcomes if x is not None)
                if failures:
                    note = f"connections failed: {dict(failures)}"
            t1 = time.perf_counter()
            cpu = meter.stop()
            await asyncio.sleep(0.3)  # anything sent twice arrives meanwhile
            expected = threads * viewers * behind
            delivered = sum(min(c.count, behind) for c in clients)
            last = max((c.done_at for c in clients if c.done_at), default=t1)
            seconds = (last if delivered == expected else t1) - t0
            want = list(range(behind))
            out_of_order = sum(1 for c in clients if c.count == behind and c.latencies != want)
            extra = {
                "threads": threads,
                "viewers": viewers,
                "behind": behind,
                "connected": len(clients),
                "subscribe_seconds": subscribed,
                "lost": expected - delivered,
                "duplicates": sum(max(0, c.count - behind) for c in clients),
                "out_of_order": out_of_order,
                "not_recovered": len(not_recovered),
                "first_not_recovered": not_recovered[0] if not_recovered else None,
                "refused": len(refused),
                "first_refused": refused[0] if refused else None,
                "retried": dict(retried),
                "closed": dict(Counter(c.close_code for c in clients if c.close_code is not None)),
                "note": note,
            }
            return self.keep(
                Sample(
                    "resume",
                    f"{threads}x{viewers}",
                    system.name,
                    0,
                    expected,
                    delivered,
                    seconds,
                    cpu,
                    extra,
                )
            )
        finally:
            await bg.close_all([*clients, *control])
            await settle([system.pid])

    async def close(self) -> None:
        await self.raw.aclose()
        await self.store.close()


# -- reporting ---------------------------------------------------------------------------------


def med(values: Sequence[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def mid(runs: Sequence[Sample], value: Callable[[Sample], float]) -> float:
    """Median of *value* over the runs that did not fail."""
    return med([value(s) for s in runs if not s.error])


def fmt_ratio(values: Sequence[float]) -> str:
    return f"{med(values):.2f} ({' '.join(f'{v:.2f}' for v in values)})" if values else "-"


def progress(s: Sample) -> None:
    head = f"  {s.case} {s.cell} run {s.run} {s.system:>8}:"
    if s.error:
        print(f"{head} FAILED: {s.error}", flush=True)
        return
    bits = [f"{head} {s.rate:>10,.0f}/s {s.done}/{s.count}", f"{s.seconds:6.2f} s"]
    if "p99_ms" in s.extra:
        bits.append(f"p50 {s.extra['p50_ms']:.1f} ms p99 {s.extra['p99_ms']:.1f} ms")
    bits.append(
        f"cpu% srv {100 * s.share('server'):.0f} redis {100 * s.share('redis'):.0f} "
        f"client {100 * s.share('client'):.0f} other {100 * s.share('other'):.0f}"
    )
    for key in ("lost", "duplicates", "out_of_order", "not_recovered", "refused"):
        if s.extra.get(key):
            bits.append(f"{key} {s.extra[key]}")
    for key in ("retried", "closed", "errors", "first_error", "first_not_recovered"):
        if s.extra.get(key):
            bits.append(f"{key} {s.extra[key]}")
    for key in ("first_refused", "note"):
        if s.extra.get(key):
            bits.append(f"{key} {s.extra[key]}")
    print(", ".join(bits), flush=True)


def group(samples: Sequence[Sample], case: str) -> dict[str, dict[str, list[Sample]]]:
    """cell -> system -> runs, in the order first seen."""
    out: dict[str, dict[str, list[Sample]]] = {}
    for s in samples:
        if s.case == case:
            out.setdefault(s.cell, {}).setdefault(s.system, []).append(s)
    return out


def ratios(a: Sequence[Sample], b: Sequence[Sample]) -> list[float]:
    """Run by run (each run measured every system once)."""
    return [
        x.rate / y.rate
        for x, y in zip(a, b, strict=False)
        if not x.error and not y.error and y.rate > 0
    ]


def problems(runs: Sequence[Sample]) -> str:
    """Failed, lost, duplicated, refused or closed, summed over the runs."""
    total: Counter[str] = Counter()
    for s in runs:
        if s.error:
            total[f"FAILED ({s.error[:100]})"] += 1
            continue
        for key in ("lost", "duplicates", "out_of_order", "not_recovered", "refused"):
            total[key] += int(s.extra.get(key) or 0)
        for code, n in (s.extra.get("retried") or {}).items():
            total[f"retried after {code}"] += n
        for code, n in (s.extra.get("closed") or {}).items():
            total[f"close {code}"] += n
        for code, n in (s.extra.get("errors") or {}).items():
            total[f"error {code}"] += n
        if s.extra.get("note"):
            total[str(s.extra["note"])[:100]] += 1
    return ", ".join(f"{k} {v}" for k, v in total.items() if v) or "none"


def first_good(runs: Sequence[Sample]) -> Sample | None:
    return next((s for s in runs if not s.error), None)


def cpu_columns(runs: Sequence[Sample]) -> str:
    return (
        f"{100 * mid(runs, lambda s: s.share('server')):>9.0f} "
        f"{100 * mid(runs, lambda s: s.share('redis')):>5.0f} "
        f"{100 * mid(runs, lambda s: s.share('client')):>6.0f} "
        f"{100 * mid(runs, lambda s: s.share('other')):>5.0f}"
    )


def report_publish(samples: list[Sample], case: str, title: str, goal: str) -> None:
    cells = group(samples, case)
    if not cells:
        return
    print(title)
    print(
        f"  {'system':>9} {'events/s':>9} {'µs cpu/ev':>9}  {'cpu%: srv':>9} "
        f"{'redis':>5} {'client':>6} {'other':>5}  problems"
    )
    for systems in cells.values():
        for name, runs in systems.items():
            print(
                f"  {name:>9} {mid(runs, lambda s: s.rate):>9,.0f} "
                f"{mid(runs, lambda s: s.us_per):>9.1f}  {cpu_columns(runs)}  {problems(runs)}"
            )
        if "hub" in systems and "raw XADD" in systems:
            print(
                f"  hub / raw XADD: {fmt_ratio(ratios(systems['hub'], systems['raw XADD']))}"
                f"   {goal}"
            )
    print()


def report_paced(
    samples: list[Sample], seconds: float, case: str = "paced", title: str = ""
) -> None:
    cells = group(samples, case)
    if not cells:
        return
    title = title or (
        f"3. Paced: offered deliveries/s to N subscribers of one thread for {seconds:g} s, "
        f"one event per publish command"
    )
    print(
        f"{title}\n   (medians; sustained: runs with >= 95% delivered "
        f"within the run + 1 s; latency: publish -> delivery, every delivery)"
    )
    print(
        f"  {'cell':>17} {'events/s':>8} {'system':>9} {'achieved/s':>10} {'sustained':>9} "
        f"{'p50 ms':>7} {'p99 ms':>8} {'µs cpu/dlv':>10} {'cpu%: srv':>9} {'redis':>5} "
        f"{'client':>6} {'other':>5}  problems"
    )
    for cell, systems in cells.items():
        for name, runs in systems.items():
            ok = sum(1 for s in runs if not s.error and s.extra["sustained"])
            first = first_good(runs)
            per_second = first.extra["events_per_second"] if first else float("nan")
            print(
                f"  {cell:>17} {per_second:>8,.0f} {name:>9} "
                f"{mid(runs, lambda s: s.rate):>10,.0f} {f'{ok}/{len(runs)}':>9} "
                f"{mid(runs, lambda s: s.extra['p50_ms']):>7.1f} "
                f"{mid(runs, lambda s: s.extra['p99_ms']):>8.1f} "
                f"{mid(runs, lambda s: s.us_per):>10.2f} {cpu_columns(runs)}  {problems(runs)}"
            )
    print("  µs cpu/dlv: CPU of the server process + Redis per delivery\n")


def report_fanout(samples: list[Sample], case: str, title: str, goal: str = "") -> None:
    cells = group(samples, case)
    if not cells:
        return
    print(title)
    names = list(dict.fromkeys(n for systems in cells.values() for n in systems))
    peers = [n for n in names if n != "hub"]
    head = "".join(f" {n + '/s':>11}" for n in names)
    ratio_head = "".join(f" {'hub/' + p:>20}" for p in peers)
    print(
        f"  {'cell':>15} {'deliveries':>10}{head}{ratio_head} {'µs cpu/dlv hub':>14} "
        f"{'other%':>6}  problems"
    )
    for cell, systems in cells.items():
        hub = systems.get("hub", [])
        rates = "".join(f" {mid(systems.get(n, []), lambda s: s.rate):>11,.0f}" for n in names)
        rel = "".join(f" {fmt_ratio(ratios(hub, systems.get(p, []))):>20}" for p in peers)
        every = [s for runs in systems.values() for s in runs]
        first = first_good(every)
        count = first.count if first else 0
        per = mid(hub, lambda s: s.us_per)
        other = 100 * mid(every, lambda s: s.share("other"))
        print(f"  {cell:>15} {count:>10}{rates}{rel} {per:>14.2f} {other:>6.0f}  {problems(every)}")
    if goal:
        print(f"  {goal}")
    print()


def report_join(samples: list[Sample], case: str, connections: int) -> None:
    """Seconds to connect and subscribe the viewers of *case*, per system (medians)."""
    cells = group(samples, case)
    timed: dict[str, list[float]] = {}
    for systems in cells.values():
        for name, runs in systems.items():
            for s in runs:
                if not s.error and "join_seconds" in s.extra:
                    timed.setdefault(name, []).append(s.extra["join_seconds"])
    if not timed:
        return
    hub = med(timed["hub"]) if "hub" in timed else float("nan")
    print(f"  {connections:,} viewers connected and subscribed (s, median; hub / system):")
    for name, values in timed.items():
        print(f"  {name:>15} {med(values):>8.2f} {hub / med(values):>8.2f}")
    print()


def report_resume(samples: list[Sample], behind: int) -> None:
    cells = group(samples, "resume")
    if not cells:
        return
    print(
        f"6. Resume storm: every viewer {behind} events behind reconnects at once and "
        f"subscribes from its position"
    )
    print(
        f"  {'threads x viewers':>17} {'system':>9} {'seconds':>8} {'subscribed s':>12} "
        f"{'deliveries/s':>12} {'µs cpu/dlv':>10}  problems"
    )
    for cell, systems in cells.items():
        for name, runs in systems.items():
            print(
                f"  {cell:>17} {name:>9} {mid(runs, lambda s: s.seconds):>8.2f} "
                f"{mid(runs, lambda s: s.extra['subscribe_seconds']):>12.2f} "
                f"{mid(runs, lambda s: s.rate):>12,.0f} {mid(runs, lambda s: s.us_per):>10.2f}  "
                f"{problems(runs)}"
            )
        if "hub" in systems and "bare" in systems:
            print(
                f"  {'':>17} hub / bare replay from memory: "
                f"{fmt_ratio(ratios(systems['hub'], systems['bare']))}"
            )
    print()


def chart(samples: list[Sample], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paced = group(samples, "paced")
    burst = group(samples, "burst")
    panels = [(title, cells) for title, cells in (("paced", paced), ("burst", burst)) if cells]
    if not panels:
        print(f"--chart: no paced or burst results to draw; {path} not written")
        return
    rows = 1 + bool(paced)
    fig, axes = plt.subplots(
        rows, len(panels), figsize=(7 * len(panels), 4.5 * rows), squeeze=False
    )
    for col, (title, cells) in enumerate(panels):
        names = list(dict.fromkeys(n for systems in cells.values() for n in systems))
        labels = list(cells)
        width = 0.8 / max(1, len(names))
        metrics: list[tuple[str, Callable[[list[Sample]], float]]] = [
            ("deliveries/s (median)", lambda runs: mid(runs, lambda x: x.rate)),
        ]
        if title == "paced":
            metrics.append(
                ("p99 latency, ms (log)", lambda runs: mid(runs, lambda x: x.extra["p99_ms"]))
            )
        for row, (ylabel, value) in enumerate(metrics):
            ax = axes[row][col]
            for i, name in enumerate(names):
                xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(labels))]
                ys = [value(cells[c][name]) if name in cells[c] else 0.0 for c in labels]
                ax.bar(xs, ys, width, label=name)
            if title == "paced" and row == 0:
                firsts = [first_good([s for r in cells[c].values() for s in r]) for c in labels]
                offered = [f.extra["offered"] if f else float("nan") for f in firsts]
                ax.scatter(
                    range(len(labels)),
                    offered,
                    marker="_",
                    s=400,
                    color="black",
                    label="offered",
                    zorder=3,
                )
            if row == 1:
                ax.set_yscale("log")
            ax.set_xticks(range(len(labels)))
            ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{title}: {ylabel.split(' (')[0]}" + ("  (N x M)" * (title == "burst")))
            ax.legend(fontsize=8)
        if title == "burst" and rows == 2:
            axes[1][col].axis("off")
            axes[1][col].text(0.5, 0.5, "burst: no latency measured\n(queueing, by construction)",
                              ha="center", va="center", color="gray")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"chart written to {path}")


# -- node peers --------------------------------------------------------------------------------


def node_peers(args: argparse.Namespace, store_url: str) -> list[System]:
    """The Node peers of bench/peers (npm ci on demand); none if node or npm is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        print("--peers node: node or npm is not installed; skipping the Node peers")
        return []
    if args.npm_ci or not os.path.isdir(os.path.join(PEERS_DIR, "node_modules")):
        print("npm ci in bench/peers ...", flush=True)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=PEERS_DIR, capture_output=True, text=True
        )
        if done.returncode != 0:
            print(f"--peers node: npm ci failed, skipping the Node peers:\n{done.stderr[-2000:]}")
            return []
    out = []
    port = bg.free_port()
    argv = [node, os.path.join(PEERS_DIR, "ws-server.js"), "--port", str(port)]
    child = bg.start_child("node-ws", argv, port, None)
    extra = {"encoding": args.encoding}
    out.append(System("node-ws", child, False, extra, agent_encoding=args.agent_encoding))
    if args.encoding != "json":
        print("--peers node: Socket.IO speaks JSON only; no socketio peer with --encoding msgpack")
        return out
    port = bg.free_port()
    argv = [node, os.path.join(PEERS_DIR, "sio-server.js"), "--port", str(port),
            "--redis", store_url]  # fmt: skip
    child = bg.start_child("socketio", argv, port, None)
    out.append(System("socketio", child, False, {}, "json", SioClient, SioAgent, socketio=True))
    return out


# -- main --------------------------------------------------------------------------------------


def alternate(systems: Sequence[System], run: int) -> list[System]:
    """The hub first in even runs, last in odd ones (and the peers rotated)."""
    k = run % len(systems)
    return [*systems[k:], *systems[:k]]


async def bench(args: argparse.Namespace, redis_pid: int, store_url: str) -> Load:
    only = set(args.only.split(","))
    load = Load(args, store_url, redis_pid)
    children: list[Child] = []
    extra = ["--max-commands-per-second", NO_LIMIT, "--max-events-per-second", NO_LIMIT]
    if args.server_loop != "asyncio":  # so that a gateway without --loop still runs
        extra += ["--loop", args.server_loop]
    try:
        gateway = bg.start_gateway(store_url, [*extra, *args.gateway_arg])
        children.append(gateway)
        bare_child = bg.start_bare(["--loop", args.server_loop])
        children.append(bare_child)
        hub = System("hub", gateway, is_hub=True, agent_encoding=args.agent_encoding)
        bare = System(
            "bare",
            bare_child,
            is_hub=False,
            publish_extra={"encoding": args.encoding},
            agent_encoding=args.agent_encoding,
        )
        peers = [bare]
        if "node" in args.peers.split(","):
            node = node_peers(args, store_url)
            children += [s.child for s in node]
            peers += node
        systems = [hub, *peers]
        if args.systems:
            wanted = set(args.systems.split(","))
            systems = [s for s in systems if s.name in wanted]
        print(
            f"gateway pid {gateway.pid} port {gateway.port}; "
            + "; ".join(f"{s.name} pid {s.pid} port {s.port}" for s in peers)
            + f"; redis pid {redis_pid}",
            flush=True,
        )
        print(
            f"viewers {args.encoding}, agents {args.agent_encoding}, "
            f"eventIds {'off' if args.no_event_ids else 'on'}; cpu%: of one core "
            f"({os.cpu_count()} cores), other: processes that are not this benchmark's",
            flush=True,
        )

        async def attempt(
            make: Callable[[], Awaitable[Sample]], case: str, cell: str, system: str, run: int
        ) -> None:
            """One measurement; a failure is recorded and reported, and the run goes on
            (unless a server died)."""
            try:
                s = await make()
            except (RuntimeError, OSError) as exc:  # TimeoutError, ConnectionError too
                if any(child.proc.poll() is not None for child in children):
                    raise
                s = load.keep(Sample(case, cell, system, 0, 0, 0, 0.0, {}, error=repr(exc)[:300]))
            s.run = run + 1
            progress(s)

        if "single" in only or "pipelined" in only:
            for case, count, window in (
                ("single", args.single_events, 1),
                ("pipelined", args.pipelined_events, args.window),
            ):
                if case not in only:
                    continue
                for run in range(args.runs):
                    order = ("hub", "raw") if run % 2 == 0 else ("raw", "hub")
                    for which in order:
                        if which == "hub":
                            make = functools.partial(load.publish_hub, hub, count, window)
                        else:
                            make = functools.partial(load.publish_raw, count, window)
                        name = "hub" if which == "hub" else "raw XADD"
                        await attempt(make, case, f"x{count}", name, run)
            print()
            report_publish(
                load.samples,
                "single",
                f"1. Single publish: one agent, one event per command, each answer "
                f"awaited ({args.single_events} events)",
                "goal >= 0.5",
            )
            report_publish(
                load.samples,
                "pipelined",
                f"2. Pipelined publish: one agent, one event per command, "
                f"{args.window} unanswered at most ({args.pipelined_events} events; "
                f"raw: {args.window} XADD per round trip)",
                "for information; goal: hub >= 10,000 events/s",
            )

        if "paced" in only:
            for rate in (float(x) for x in args.paced_rates.split(",")):
                for n in (int(x) for x in args.paced_viewers.split(",")):
                    for run in range(args.runs):
                        for system in alternate(systems, run):
                            make = functools.partial(load.paced, system, n, rate)
                            await attempt(make, "paced", paced_cell(n, rate), system.name, run)
            print()
            report_paced(load.samples, args.paced_seconds)

        if "burst" in only:
            for cell in args.burst_cells.split(","):
                n, _, m = cell.partition("x")
                viewers, threads = int(n), int(m)
                events = max(1, args.burst_deliveries // (viewers * threads))
                for run in range(args.runs):
                    for system in alternate(systems, run):
                        make = functools.partial(load.burst, system, viewers, threads, events)
                        await attempt(make, "burst", f"{viewers}x{threads}", system.name, run)
            print()
            report_fanout(
                load.samples,
                "burst",
                f"4. Burst: N subscribers per thread x M threads, about "
                f"{args.burst_deliveries:,} deliveries per cell, published as fast as "
                f"they go\n   (RedisStore.append, {args.publish_batch} events per call "
                f"into one thread, one per call round robin into many)",
            )

        if "threads" in only:
            cell = f"{args.threads}x{args.viewers}"
            for run in range(args.runs):
                for system in alternate(systems, run):
                    if not args.threads_burst:
                        break
                    make = functools.partial(load.many_threads, system)
                    await attempt(make, "threads", f"{cell} publish", system.name, run)
                    if not args.no_append_row and system in (hub, bare):
                        make = functools.partial(load.many_threads_store, system)
                        await attempt(make, "threads", f"{cell} append", system.name, run)
            rates = [float(x) for x in args.threads_rates.split(",") if x]
            for rate in rates:
                for run in range(args.runs):
                    for system in alternate(systems, run):
                        make = functools.partial(
                            load.paced, system, args.viewers, rate * args.viewers, args.threads
                        )
                        cell = f"{args.threads}x{args.viewers} @{rate:,.0f} ev/s"
                        await attempt(make, "threads-paced", cell, system.name, run)
            print()
            report_fanout(
                load.samples,
                "threads",
                f"5. Many threads: {args.threads} threads x {args.viewers} viewers, "
                f"{args.thread_events} events per thread, one per publish, round robin "
                f"({args.agents} agents, {args.window} unanswered each; the append row: "
                f"RedisStore.append)",
                "goal (publish row): hub / bare >= 0.8",
            )
            report_join(load.samples, "threads", args.threads * args.viewers)
            report_paced(
                load.samples,
                args.paced_seconds,
                "threads-paced",
                f"5b. Many threads, paced: {args.threads} threads x {args.viewers} viewers, "
                f"events/s offered round robin over the threads for {args.paced_seconds:g} s, "
                f"one event per publish command, one agent",
            )

        if "resume" in only:
            for cell in args.resume.split(","):
                m, _, n = cell.partition("x")
                for run in range(args.runs):
                    for system in alternate([hub, bare], run):
                        make = functools.partial(load.resume, system, int(m), int(n))
                        await attempt(make, "resume", f"{m}x{n}", system.name, run)
            print()
            report_resume(load.samples, args.behind)
    except BaseException:
        for child in children:
            if child.proc.poll() is not None:
                print(f"{child.name} exited with {child.proc.returncode}; log:\n{child.tail()}")
        raise
    finally:
        for child in children:
            child.stop()
        await load.close()
    return load


QUICK = {
    "runs": 1,
    "single_events": 300,
    "pipelined_events": 2000,
    "paced_rates": "20000",
    "paced_viewers": "10,100",
    "paced_seconds": 1.0,
    "burst_cells": "10x1,10x10,100x1",
    "burst_deliveries": 20_000,
    "threads": 100,
    "thread_events": 10,
    "resume": "1x100",
    "behind": 100,
    "timeout": 20.0,
    "drain": 5.0,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--runs", type=int, default=3, help="runs per cell (median)")
    add("--only", default=",".join(CASES), help=f"cases, comma-separated: {','.join(CASES)}")
    add("--quick", action="store_true", help="a smoke run: tiny sizes, one run")
    add("--json", metavar="PATH", help="write every raw result here")
    add("--chart", metavar="PATH", help="PNG chart of the paced and burst cells")
    add("--peers", default="python", help="python (the bare server), or python,node")
    add("--npm-ci", action="store_true", help="run npm ci in bench/peers even if installed")
    add("--encoding", choices=["json", "msgpack"], default="json", help="viewers' frames")
    add("--agent-encoding", choices=["json", "msgpack"], default="msgpack")
    add("--no-event-ids", action="store_true", help="publish without eventIds")
    add(
        "--client-loop",
        choices=["asyncio", "uvloop"],
        default="uvloop",
        help="event loop of this process (the load)",
    )
    add(
        "--server-loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="event loop of the gateway (its --loop) and of the bare server",
    )
    add(
        "--gateway-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for agui-hub serve (repeat), e.g. --gateway-arg=--workers=2",
    )
    add("--timeout", type=float, default=60.0, help="seconds any one measurement may take")
    add("--window", type=int, default=256, help="unanswered publishes per agent (cases 2, 5)")
    add("--single-events", type=int, default=3000)
    add("--pipelined-events", type=int, default=20_000)
    add("--paced-rates", default="20000,100000", help="offered deliveries/s")
    add("--paced-viewers", default="10,100,1000", help="subscribers of the thread")
    add("--paced-seconds", type=float, default=5.0)
    add("--paced-max-events", type=int, default=50_000)
    add("--paced-window", type=int, default=1000, help="unanswered publishes, paced")
    add(
        "--drain",
        type=float,
        default=10.0,
        help="paced: seconds after the run + 1 s before what has not arrived counts as lost",
    )
    add(
        "--burst-cells",
        default="10x1,10x10,10x100,100x1,100x10,1000x1",
        help="N x M: subscribers per thread x threads",
    )
    add("--burst-deliveries", type=int, default=200_000)
    add("--publish-batch", type=int, default=50, help="events per append call, one thread")
    add("--threads", type=int, default=1000)
    add("--viewers", type=int, default=3)
    add("--thread-events", type=int, default=20)
    add("--agents", type=int, default=4)
    add(
        "--threads-rates",
        default="1000",
        help="case 5 paced: events/s round robin over the threads (comma-separated; empty: none)",
    )
    add("--systems", default="", help="only these systems (hub,bare,node-ws,socketio)")
    add(
        "--no-threads-burst",
        dest="threads_burst",
        action="store_false",
        help="case 5 without its burst rows (only the paced ones)",
    )
    add("--no-append-row", action="store_true", help="case 5 without the RedisStore.append row")
    add("--resume", default="1x1000,100x10", help="threads x viewers per thread")
    add("--behind", type=int, default=500, help="events each resuming viewer missed")
    add("--history", type=int, default=100, help="events before the viewers' position")
    add(
        "--resume-retries",
        type=int,
        default=5,
        help="subscribes again after store_unavailable (pause 1 s, doubled)",
    )
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            if parser.get_default(key) == getattr(args, key):
                setattr(args, key, value)
    unknown = set(args.only.split(",")) - set(CASES)
    if unknown:
        parser.error(f"--only: unknown case {', '.join(sorted(unknown))}; cases: {CASES}")

    print("command:", shlex.join([sys.executable, *sys.argv]), flush=True)
    bg.check_workload()
    proc, url = bg.start_redis()
    started = time.perf_counter()
    try:
        if args.client_loop == "uvloop":
            import uvloop

            load = uvloop.run(bench(args, proc.pid, url))
        else:
            load = asyncio.run(bench(args, proc.pid, url))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    print(f"done in {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "command": sys.argv,
                    "args": vars(args),
                    "results": [s.as_json() for s in load.samples],
                },
                f,
                indent=1,
            )
        print(f"raw results written to {args.json}")
    if args.chart:
        chart(load.samples, args.chart)


if __name__ == "__main__":
    main()
