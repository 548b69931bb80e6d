"""The gateway as real processes: reconnect storms, failover, SIGKILL, SIGTERM drain.

Every gateway here is an ``agui-hub serve`` subprocess on a free loopback
port, killed by the ``gateways`` fixture's finalizer whatever happens. Viewers
are :class:`ResumingViewer` instances: a small client that does what
docs/protocol.md asks of a front end (keep the last offset per thread and the
epoch of the last ``subscribed``; on a closed connection reconnect, possibly
to another gateway, and subscribe with ``{"offset", "epoch"}``), and that
fails the test on any gap, duplicate, reordering or unexpected
``recovered: false``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import Gateways, http_status

pytestmark = pytest.mark.timeout(120)

SEED = int(os.environ.get("AGUI_HUB_TEST_SEED", "20240611"))
SUBPROTOCOL = {"json": "agui-hub.v1.json", "msgpack": "agui-hub.v1.msgpack"}
Event = dict[str, Any]


# -- gateway processes ----------------------------------------------------------------------


def redis_store_url(redis: RedisServer) -> str:
    return f"{redis.url}?prefix=gwproc-{uuid.uuid4().hex[:12]}"


# -- frames ------------------------------------------------------------------------------------


def encode(frame: dict[str, Any], encoding: str) -> str | bytes:
    if encoding == "json":
        return json.dumps(frame, ensure_ascii=False)
    return msgpack.packb(frame, use_bin_type=True)


def decode(data: str | bytes, encoding: str) -> dict[str, Any]:
    if encoding == "json":
        assert isinstance(data, str), "a JSON connection got a binary frame"
        frame = json.loads(data)
    else:
        assert isinstance(data, bytes), "a msgpack connection got a text frame"
        frame = msgpack.unpackb(data, raw=False)
    assert isinstance(frame, dict), frame
    return frame


def offset_key(offset: str) -> tuple[int, int]:
    ms, seq = offset.split("-")
    return int(ms), int(seq)


def open_ws(url: str, encoding: str) -> Any:
    return connect(
        url,
        subprotocols=[SUBPROTOCOL[encoding]],  # type: ignore[list-item]
        proxy=None,
        open_timeout=5 * TIMEOUT_SCALE,
        close_timeout=2,
        max_size=None,
        # Never pause reading: with a saturated queue the closing handshake of a
        # graceful client-side close cannot complete (python-websockets#1555).
        max_queue=None,
        compression=None,
    )


# -- an AG-UI run --------------------------------------------------------------------------------


DELTAS = ["Hel", "lo", ", ", "wörld", " ✓", "🙂", " the", " quick", " brown", " fox", "\n", '"q"']


def build_run(thread: str, run_id: str, n_events: int, rng: random.Random) -> list[Event]:
    """A valid run of exactly *n_events* events: text messages with many deltas, tool calls."""
    events: list[Event] = [{"type": "RUN_STARTED", "threadId": thread, "runId": run_id}]
    remaining = n_events - 2  # RUN_STARTED and RUN_FINISHED
    counter = 0
    while remaining > 0:
        counter += 1
        if remaining >= 20 and rng.random() < 0.3:
            call = f"{run_id}-call-{counter}"
            size = 4 + rng.randint(1, 6)  # start, args..., end, result
            if remaining - size < 3:
                size = remaining
            events.append({"type": "TOOL_CALL_START", "toolCallId": call, "toolCallName": "lookup"})
            for i in range(size - 3):
                delta = '{"q": ' if i == 0 else f'"part{i}"'
                events.append({"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": delta})
            events.append({"type": "TOOL_CALL_END", "toolCallId": call})
            events.append(
                {
                    "type": "TOOL_CALL_RESULT",
                    "messageId": f"{run_id}-result-{counter}",
                    "toolCallId": call,
                    "content": f"result {counter} ✓",
                }
            )
        else:
            size = 2 + rng.randint(20, 150)  # start, contents..., end
            if remaining - size < 3:
                size = remaining
            message = f"{run_id}-msg-{counter}"
            events.append({"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"})
            for _ in range(size - 2):
                events.append(
                    {
                        "type": "TEXT_MESSAGE_CONTENT",
                        "messageId": message,
                        "delta": rng.choice(DELTAS),
                    }
                )
            events.append({"type": "TEXT_MESSAGE_END", "messageId": message})
        remaining -= size
    events.append({"type": "RUN_FINISHED", "threadId": thread, "runId": run_id})
    assert len(events) == n_events
    return events


@dataclass
class Publisher:
    """Publishes a prebuilt run through a gateway, in small batches, with eventIds.

    With ``retry`` > 0, after that fraction of the batches it acts as if the
    reply was lost: it drops the connection, reconnects to the next of
    ``urls`` and publishes the same batch with the same eventIds again, which
    must answer the same offsets (docs/protocol.md, publish).
    """

    url: str
    thread: str
    events: list[Event]
    encoding: str = "json"
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))
    max_batch: int = 10
    pause: float = 0.003
    retry: float = 0.0
    urls: list[str] = field(default_factory=list)
    published: list[tuple[str, Event]] = field(default_factory=list)
    retried: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    progress_at: int = 0
    """Set :attr:`progress` once this many events are published."""

    async def _publish(
        self, ws: ClientConnection, command: int, events: list[Event], ids: list[str]
    ) -> list[str]:
        frame = {
            "type": "publish",
            "id": command,
            "thread": self.thread,
            "events": events,
            "eventIds": ids,
        }
        await ws.send(encode(frame, self.encoding))
        reply = decode(await asyncio.wait_for(ws.recv(), 10 * TIMEOUT_SCALE), self.encoding)
        assert reply.get("type") == "published", f"publish #{command} failed: {reply}"
        assert reply.get("id") == command and reply.get("thread") == self.thread, reply
        offsets: list[str] = reply["offsets"]
        assert len(offsets) == len(events), reply
        return offsets

    async def run(self) -> list[tuple[str, Event]]:
        ids = [f"{self.thread}-ev-{i:05d}" for i in range(len(self.events))]
        urls = self.urls or [self.url]
        current = 0
        ws = await open_ws(urls[current], self.encoding)
        try:
            position, command = 0, 0
            while position < len(self.events):
                size = self.rng.randint(1, self.max_batch)
                batch = self.events[position : position + size]
                batch_ids = ids[position : position + size]
                command += 1
                offsets = await self._publish(ws, command, batch, batch_ids)
                # The first batch (RUN_STARTED) is always retried when retrying at all.
                if self.retry and (position == 0 or self.rng.random() < self.retry):
                    # The reply "was lost": drop the socket, retry elsewhere.
                    ws.transport.abort()
                    current = (current + 1) % len(urls)
                    ws = await open_ws(urls[current], self.encoding)
                    command += 1
                    again = await self._publish(ws, command, batch, batch_ids)
                    assert again == offsets, (
                        f"retry of publish #{command - 1}: {again} != {offsets}"
                    )
                    self.retried += 1
                self.published.extend(zip(offsets, batch, strict=True))
                position += len(batch)
                if self.progress_at and position >= self.progress_at:
                    self.progress.set()
                if self.pause:
                    await asyncio.sleep(self.rng.uniform(0, 2 * self.pause))
        finally:
            ws.transport.abort()
        self.progress.set()
        offsets = [offset for offset, _ in self.published]
        assert offsets == sorted(offsets, key=offset_key) and len(set(offsets)) == len(offsets)
        return self.published


# -- the resuming viewer -------------------------------------------------------------------------


@dataclass
class Chaos:
    """Client-side disconnects at random moments (seeded)."""

    rng: random.Random
    max_events: int = 120
    max_seconds: float = 0.12


@dataclass
class ThreadView:
    target: int
    """Stop once this many events of the thread were received."""
    offset: str | None = None
    epoch: str | None = None
    received: list[tuple[str, Event]] = field(default_factory=list)


class ResumingViewer:
    """A front end that resumes by offset and epoch, across reconnects and gateways.

    ``urls`` are tried in order: a connection is made to the current one; when
    it is refused, or the server closed with 1012 (draining), the next one is
    current; with ``pick`` each connection goes to a random one. With ``chaos``
    the viewer closes its own socket at random moments (after some events,
    after some time, or right after subscribing; gracefully or by aborting the
    TCP connection) and resumes.
    """

    def __init__(
        self,
        name: str,
        urls: list[str],
        encoding: str,
        threads: dict[str, int],
        *,
        chaos: Chaos | None = None,
        allow_unrecovered: bool = False,
        pick: random.Random | None = None,
        max_connections: int = 3000,
    ) -> None:
        self.name = name
        self.urls = list(urls)
        self.current = 0
        self.encoding = encoding
        self.threads = {thread: ThreadView(target) for thread, target in threads.items()}
        self.chaos = chaos
        self.allow_unrecovered = allow_unrecovered
        self.pick = pick
        self.max_connections = max_connections
        self.connections = 0
        self.resumes = 0
        """Subscriptions sent with ``{"offset", "epoch"}``."""
        self.client_closes = 0
        self.server_close_codes: list[int | None] = []
        self.connected_urls: list[str] = []
        self.subscribed_frames: list[dict[str, Any]] = []
        self.subscribed = asyncio.Event()
        """Set once every thread got its first ``subscribed``."""
        self._command = 0

    # -- state ------------------------------------------------------------------------------

    def done(self) -> bool:
        return all(len(view.received) >= view.target for view in self.threads.values())

    def summary(self) -> str:
        parts = [
            f"{t}: {len(v.received)}/{v.target} last={v.offset}" for t, v in self.threads.items()
        ]
        return (
            f"{self.name} ({self.encoding}): {', '.join(parts)}; connections={self.connections} "
            f"resumes={self.resumes} server closes={self.server_close_codes[-5:]}"
        )

    def _handle(self, frame: dict[str, Any], pending: dict[Any, str]) -> None:
        kind = frame.get("type")
        thread = frame.get("thread")
        if kind == "event":
            view = self.threads.get(thread)  # type: ignore[arg-type]
            assert view is not None, f"{self.name}: event of an unknown thread: {frame}"
            assert not any(pending.get(i) == thread for i in pending), (
                f"{self.name}: event before 'subscribed': {frame}"
            )
            offset = frame["offset"]
            if view.offset is not None:
                assert offset_key(offset) > offset_key(view.offset), (
                    f"{self.name}: duplicate or reordered event {offset} after {view.offset} "
                    f"(event #{len(view.received)}): {frame['event']}"
                )
            view.offset = offset
            view.received.append((offset, frame["event"]))
        elif kind == "subscribed":
            view = self.threads.get(thread)  # type: ignore[arg-type]
            assert view is not None, frame
            self.subscribed_frames.append(frame)
            if "id" in frame:
                assert pending.pop(frame["id"], None) == thread, (
                    f"{self.name}: unexpected reply {frame}"
                )
            if not frame["recovered"] and not self.allow_unrecovered:
                pytest.fail(
                    f"{self.name}: subscribed with recovered=false after resuming from "
                    f"offset={view.offset} epoch={view.epoch}: {frame}"
                )
            if frame["recovered"] and view.offset is not None:
                assert frame["epoch"] == view.epoch, (
                    f"{self.name}: recovered=true in another epoch: {frame}, had {view.epoch}"
                )
            view.epoch = frame["epoch"]
            if not pending:
                self.subscribed.set()
        elif kind == "snapshot":
            if not self.allow_unrecovered:
                pytest.fail(f"{self.name}: unexpected snapshot: {frame}")
        elif kind == "error":
            pytest.fail(f"{self.name}: error frame: {frame}")
        else:
            pytest.fail(f"{self.name}: unexpected frame: {frame}")

    # -- the loop ---------------------------------------------------------------------------

    async def run(self, deadline: float) -> None:
        while not self.done():
            assert time.monotonic() < deadline, f"out of time: {self.summary()}"
            assert self.connections < self.max_connections, f"too many: {self.summary()}"
            if self.pick is not None:
                self.current = self.pick.randrange(len(self.urls))
            url = self.urls[self.current]
            try:
                ws = await open_ws(url, self.encoding)
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                if isinstance(exc, InvalidStatus) and exc.response.status_code != 503:
                    raise
                self.current = (self.current + 1) % len(self.urls)
                await asyncio.sleep(0.02)
                continue
            self.connections += 1
            self.connected_urls.append(url)
            try:
                await self._session(ws, deadline)
            finally:
                with contextlib.suppress(Exception):
                    ws.transport.abort()

    async def _session(self, ws: ClientConnection, deadline: float) -> None:
        chaos = self.chaos
        plan = "none"
        budget_events, budget_until = 0, deadline
        if chaos is not None:
            roll = chaos.rng.random()
            if roll < 0.05:
                plan = "after_subscribe"
            elif roll < 0.5:
                plan = "events"
                budget_events = chaos.rng.randint(1, chaos.max_events)
            else:
                plan = "time"
                budget_until = min(
                    deadline, time.monotonic() + chaos.rng.uniform(0.005, chaos.max_seconds)
                )
        pending: dict[Any, str] = {}
        try:
            for thread, view in self.threads.items():
                self._command += 1
                start: Any = "start"
                if view.offset is not None:
                    start = {"offset": view.offset, "epoch": view.epoch}
                    self.resumes += 1
                pending[self._command] = thread
                await ws.send(
                    encode(
                        {"type": "subscribe", "id": self._command, "thread": thread, "from": start},
                        self.encoding,
                    )
                )
            if plan == "after_subscribe":
                await self._client_close(ws)
                return
            events = 0
            while True:
                if self.done():
                    # Anything more would be a duplicate: listen a moment for it.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(0.2):
                            while True:
                                self._handle(decode(await ws.recv(), self.encoding), pending)
                    await ws.close()
                    return
                timeout = max(0.0, min(budget_until, deadline) - time.monotonic())
                try:
                    async with asyncio.timeout(timeout):
                        data = await ws.recv()
                except TimeoutError:
                    if plan == "time":
                        await self._client_close(ws)
                        return
                    raise AssertionError(f"out of time: {self.summary()}") from None
                frame = decode(data, self.encoding)
                self._handle(frame, pending)
                if frame.get("type") == "event":
                    events += 1
                    if plan == "events" and events >= budget_events:
                        await self._client_close(ws)
                        return
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            self.server_close_codes.append(code)
            if code == 1012:
                self.current = (self.current + 1) % len(self.urls)  # any other gateway
            else:
                assert code in (None, 1001, 1011, 1013, 4000), f"{self.name}: closed {exc}"

    async def _client_close(self, ws: ClientConnection) -> None:
        assert self.chaos is not None
        self.client_closes += 1
        if self.chaos.rng.random() < 0.5:
            ws.transport.abort()
        else:
            with contextlib.suppress(ConnectionClosed, TimeoutError):
                await ws.close()


def assert_exact(viewer: ResumingViewer, thread: str, published: list[tuple[str, Event]]) -> None:
    """Zero lost, duplicated or reordered events: by offset and by content."""
    received = viewer.threads[thread].received
    got_offsets = [offset for offset, _ in received]
    want_offsets = [offset for offset, _ in published]
    if got_offsets != want_offsets:
        missing = sorted(set(want_offsets) - set(got_offsets), key=offset_key)
        extra = [o for o in got_offsets if o not in set(want_offsets)]
        duplicated = len(got_offsets) - len(set(got_offsets))
        pytest.fail(
            f"{viewer.name}: offsets differ: got {len(got_offsets)}, want {len(want_offsets)}; "
            f"missing {missing[:5]}; unexpected {extra[:5]}; {duplicated} duplicated"
        )
    for index, ((offset, got), (_, want)) in enumerate(zip(received, published, strict=True)):
        assert got == want, f"{viewer.name}: event #{index} at {offset}: {got} != {want}"


def spawn(viewers: list[ResumingViewer], seconds: float) -> list[asyncio.Task[None]]:
    """Start the viewers, each bounded by a common deadline."""
    deadline = time.monotonic() + seconds * TIMEOUT_SCALE
    return [asyncio.create_task(v.run(deadline), name=v.name) for v in viewers]


async def join(
    tasks: list[asyncio.Task[Any]], viewers: list[ResumingViewer], seconds: float
) -> list[Any]:
    """Wait for *tasks*, bounded in time; on failure cancel the rest."""
    try:
        async with asyncio.timeout(seconds * TIMEOUT_SCALE):
            return await asyncio.gather(*tasks)
    except TimeoutError:
        pytest.fail("timed out:\n" + "\n".join(v.summary() for v in viewers))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_subscribed(viewers: list[ResumingViewer]) -> None:
    async with asyncio.timeout(10 * TIMEOUT_SCALE):
        for viewer in viewers:
            await viewer.subscribed.wait()


# -- 1. reconnect storm ---------------------------------------------------------------------------


N_STORM = 2000


@pytest.mark.parametrize("store", ["redis", "memory"])
async def test_reconnect_storm_loses_duplicates_and_reorders_nothing(
    store: str, gateways: Gateways, request: pytest.FixtureRequest
) -> None:
    if store == "redis":
        url = redis_store_url(request.getfixturevalue("redis_server"))
        # Two gateways on one Redis: each resume goes to either of them.
        procs = [gateways.start(url), gateways.start(url)]
    else:
        procs = [gateways.start("memory://")]
    thread = f"storm-{store}-{uuid.uuid4().hex[:8]}"
    rng = random.Random(SEED)
    events = build_run(thread, "run-storm", N_STORM, rng)
    publisher = Publisher(procs[0].url, thread, events, encoding="msgpack", rng=rng)

    viewers = []
    for i in range(6):
        encoding = "json" if i % 2 == 0 else "msgpack"
        urls = [p.url for p in procs]
        viewer = ResumingViewer(
            f"viewer{i}",
            urls,
            encoding,
            {thread: N_STORM},
            chaos=Chaos(random.Random(SEED + i)),
            # With two gateways: each resume goes to a random one.
            pick=random.Random(SEED * 7 + i) if len(procs) > 1 else None,
        )
        viewers.append(viewer)

    started = time.monotonic()
    tasks = [*spawn(viewers, 45), asyncio.create_task(publisher.run())]
    published = (await join(tasks, viewers, 50))[-1]
    elapsed = time.monotonic() - started

    assert len(published) == N_STORM
    assert [event for _, event in published] == events
    for viewer in viewers:
        assert_exact(viewer, thread, published)
        # Every disconnect was the client's: the gateways closed nothing themselves.
        assert viewer.server_close_codes == [], viewer.summary()
    cycles = sum(v.resumes for v in viewers)
    assert cycles >= 100, [v.summary() for v in viewers]
    assert sum(v.client_closes for v in viewers) >= 100
    if len(procs) > 1:
        for viewer in viewers:
            assert {p.url for p in procs} <= set(viewer.connected_urls), viewer.summary()
    for proc in procs:
        assert proc.process.poll() is None, proc.log()
    print(f"storm on {store}: {cycles} resumes in {elapsed:.1f} s")


# -- 2. two gateways, one Redis; SIGKILL mid-run ---------------------------------------------------


async def test_two_gateways_fan_out_and_viewers_survive_sigkill_of_theirs(
    gateways: Gateways, redis_server: RedisServer
) -> None:
    url = redis_store_url(redis_server)
    a, b = gateways.start(url), gateways.start(url)
    rng = random.Random(SEED + 100)

    # A viewer on A sees what is published through B, at B's offsets.
    thread = f"cross-{uuid.uuid4().hex[:8]}"
    events = build_run(thread, "run-cross", 80, rng)
    viewer = ResumingViewer("viewer-on-a", [a.url], "json", {thread: len(events)})
    tasks = spawn([viewer], 20)
    await wait_subscribed([viewer])
    assert viewer.subscribed_frames[0]["epoch"] is None  # an empty thread so far
    publisher = Publisher(b.url, thread, events, encoding="msgpack", rng=rng, pause=0.001)
    published = await publisher.run()
    await join(tasks, [viewer], 20)
    assert_exact(viewer, thread, published)
    assert viewer.connected_urls == [a.url]
    # The first event created the epoch, announced with a new `subscribed`.
    assert isinstance(viewer.threads[thread].epoch, str), viewer.subscribed_frames

    # Viewers on A, a run published through B, A killed mid-run: they resume on B.
    thread = f"kill-{uuid.uuid4().hex[:8]}"
    n = 900
    events = build_run(thread, "run-kill", n, rng)
    viewers = [
        ResumingViewer(f"a-viewer{i}", [a.url, b.url], encoding, {thread: n})
        for i, encoding in enumerate(["json", "msgpack", "json", "msgpack"])
    ]
    tasks = spawn(viewers, 40)
    await wait_subscribed(viewers)
    publisher = Publisher(b.url, thread, events, rng=rng, progress_at=n // 3)
    publishing = asyncio.create_task(publisher.run())
    async with asyncio.timeout(20 * TIMEOUT_SCALE):
        await publisher.progress.wait()
    a.signal(signal.SIGKILL)
    at_kill = [len(v.threads[thread].received) for v in viewers]
    assert await asyncio.to_thread(a.wait, 5 * TIMEOUT_SCALE) == -signal.SIGKILL
    published = (await join([*tasks, publishing], viewers, 40))[-1]

    assert len(published) == n
    assert all(count < n for count in at_kill), at_kill  # killed mid-run
    for v in viewers:
        assert_exact(v, thread, published)
        assert v.connected_urls[0] == a.url and v.connected_urls[-1] == b.url, v.summary()
        assert v.server_close_codes == [None], v.summary()  # no close frame: killed
        resumed = [f for f in v.subscribed_frames if "id" in f][1:]
        assert resumed and all(f["recovered"] is True for f in resumed), v.subscribed_frames
    assert b.process.poll() is None, b.log()


# -- 3. SIGTERM: drain with 1012, exit 0, resume elsewhere ---------------------------------------


async def test_sigterm_drains_with_1012_exits_0_and_viewers_resume_elsewhere(
    gateways: Gateways, redis_server: RedisServer
) -> None:
    url = redis_store_url(redis_server)
    g1, g2 = gateways.start(url), gateways.start(url)
    thread = f"drain-{uuid.uuid4().hex[:8]}"
    n = 700
    rng = random.Random(SEED + 200)
    events = build_run(thread, "run-drain", n, rng)
    # One viewer fails over to the other gateway, one waits for g1 to come back.
    to_other = ResumingViewer("to-other", [g1.url, g2.url], "json", {thread: n})
    to_restarted = ResumingViewer("to-restarted", [g1.url], "msgpack", {thread: n})
    viewers = [to_other, to_restarted]
    tasks = spawn(viewers, 40)
    await wait_subscribed(viewers)
    publisher = Publisher(g2.url, thread, events, rng=rng, progress_at=n // 3)
    publishing = asyncio.create_task(publisher.run())
    async with asyncio.timeout(20 * TIMEOUT_SCALE):
        await publisher.progress.wait()

    started = time.monotonic()
    g1.signal(signal.SIGTERM)
    code = await asyncio.to_thread(g1.wait, 10 * TIMEOUT_SCALE)
    drained_in = time.monotonic() - started
    assert code == 0, f"exit code {code} after SIGTERM:\n{g1.log()}"
    assert drained_in < 5 * TIMEOUT_SCALE, f"drain took {drained_in:.1f} s:\n{g1.log()}"
    assert "draining" in g1.log() and "stopped" in g1.log(), g1.log()
    restarted = await asyncio.to_thread(gateways.start, url, port=g1.port)

    published = (await join([*tasks, publishing], viewers, 40))[-1]
    for v in viewers:
        assert v.server_close_codes == [1012], v.summary()
        assert_exact(v, thread, published)
        resumed = [f for f in v.subscribed_frames if "id" in f][1:]
        assert resumed and all(f["recovered"] is True for f in resumed), v.subscribed_frames
    assert to_other.connected_urls[-1] == g2.url, to_other.connected_urls
    assert to_restarted.connections >= 2 and set(to_restarted.connected_urls) == {g1.url}
    assert restarted.process.poll() is None, restarted.log()


# -- 4. no --store: the memory store, said so at start-up ----------------------------------------


async def test_without_store_flag_the_gateway_uses_memory_and_says_so(gateways: Gateways) -> None:
    proc = gateways.start(None)
    deadline = time.monotonic() + 5 * TIMEOUT_SCALE
    while "listening" not in proc.log() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    log = proc.log()
    assert f"agui-hub listening on ws://127.0.0.1:{proc.port}" in log, log
    assert "memory://" in log, log
    assert http_status(proc.port, "/readyz") == 200

    # It does relay: publish, then read back from the start.
    thread = f"mem-{uuid.uuid4().hex[:8]}"
    events = build_run(thread, "run-mem", 12, random.Random(SEED))
    published = await Publisher(proc.url, thread, events, pause=0).run()
    viewer = ResumingViewer("memory-viewer", [proc.url], "msgpack", {thread: len(events)})
    await join(spawn([viewer], 10), [viewer], 10)
    assert_exact(viewer, thread, published)

    proc.signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 10 * TIMEOUT_SCALE) == 0, proc.log()


# -- 5. a publisher retrying with the same eventIds on another gateway ---------------------------


async def test_publisher_retry_with_same_event_ids_on_another_gateway(
    gateways: Gateways, redis_server: RedisServer
) -> None:
    url = redis_store_url(redis_server)
    a, b = gateways.start(url), gateways.start(url)
    thread = f"retry-{uuid.uuid4().hex[:8]}"
    rng = random.Random(SEED + 300)
    n = 300
    events = build_run(thread, "run-retry", n, rng)
    viewers = [
        ResumingViewer(
            f"viewer{i}",
            [a.url, b.url],
            encoding,
            {thread: n},
            chaos=Chaos(random.Random(SEED + 300 + i)),
            pick=random.Random(SEED + 310 + i),
        )
        for i, encoding in enumerate(["json", "msgpack"])
    ]
    publisher = Publisher(a.url, thread, events, rng=rng, retry=0.5, urls=[a.url, b.url])
    tasks = [*spawn(viewers, 30), asyncio.create_task(publisher.run())]
    published = (await join(tasks, viewers, 35))[-1]
    assert publisher.retried > 0
    for viewer in viewers:
        assert_exact(viewer, thread, published)
