"""The gateway's HTTP listener (agui_hub/gateway/web.py) over real HTTP on 127.0.0.1.

Every test starts an in-process :class:`Gateway` with ``http_port=0`` on the memory
store or a real Redis (the session ``redis_server``, a key prefix per test), and a
real upstream AG-UI agent (tests/upstream_agent.py) it runs. The tests talk HTTP
with httpx (a raw socket where a client must stop reading) and WebSocket with
:class:`~agui_hub.client.hub_client.HubClient`, and check what they get against what the agent
sends when POSTed directly and against the events the store holds: ``POST
/agents/<name>`` relays a run with ``id: <offset>`` on every event and leaves it
running when the client goes; ``GET /threads/<thread>/events`` streams a thread from
its start, live or from a snapshot and resumes after ``Last-Event-ID`` without loss
or repeat; ``DELETE /threads/<thread>/run`` cancels; errors, CORS and JWT
authentication answer what they should; a reader that stops reading stays bounded;
a drain ends every stream with a ``close`` event its client resumes from elsewhere.
Regressions of a review: a ``from=live`` join's ``subscribed`` carries the offset to resume
from (and no other join's does); a POST is refused (run grant, per-address limit) before
its body is read, and the bodies being read at once are bounded (503 ``too_busy``);
``X-Forwarded-For`` does not choose the address a limit counts; a body nested 100,000
deep is a 400, not an internal error; the listener's connections are fitted to the
open-file limit.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import msgpack
import pytest

from agui_hub.agui.reducer import fold
from agui_hub.bridge.runs import UPSTREAM_KEEPALIVE
from agui_hub.client.hub_client import HubClient, Subscribed, ThreadEvent
from agui_hub.gateway import server as server_module
from agui_hub.gateway import web as web_module
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.config import FD_RESERVE, HANDSHAKE_HEADROOM
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.gateway.web import HttpApp
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..upstream_agent import UpstreamAgent, ok_transcript_text, serve_agent

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing to arrive."""
SECRET = "a-test-secret-of-at-least-32-bytes-for-hs256"
SLOW_COUNT = 40
"""Text deltas of the ``slow`` agent, one every SLOW_DELAY s (a run of about 1.2 s)."""
SLOW_DELAY = 0.03
TERMINAL = {"RUN_FINISHED", "RUN_ERROR"}

Event = dict[str, Any]


# -- SSE, read independently of agui_hub.wire.sse ----------------------------------------------


@dataclass
class Block:
    """What one SSE block (lines up to a blank line) set: WHATWG field semantics."""

    event: str | None = None
    id: str | None = None
    data: str | None = None
    """The data lines joined with "\\n"; ``None``: the block had no data line."""
    retry: int | None = None

    @property
    def json(self) -> Any:
        assert self.data is not None, f"a block without data: {self}"
        return json.loads(self.data)


class BlockParser:
    """Incremental: bytes in, completed blocks out (comment-only blocks dropped)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._block = Block()
        self._fields = 0

    def feed(self, data: bytes) -> list[Block]:
        self._text += self._decoder.decode(data)
        blocks: list[Block] = []
        while True:
            match = re.search(r"\r\n|\r|\n", self._text)
            if match is None or (match.group() == "\r" and match.end() == len(self._text)):
                return blocks
            line, self._text = self._text[: match.start()], self._text[match.end() :]
            if not line:
                if self._fields:
                    blocks.append(self._block)
                self._block, self._fields = Block(), 0
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            self._fields += 1
            if name == "data":
                self._block.data = (
                    value if self._block.data is None else self._block.data + "\n" + value
                )
            elif name == "event":
                self._block.event = value
            elif name == "id":
                self._block.id = value
            elif name == "retry":
                self._block.retry = int(value)


def parse_blocks(body: bytes) -> list[Block]:
    return BlockParser().feed(body)


def events_of(blocks: list[Block]) -> list[Event]:
    """The data of the unnamed blocks (AG-UI events), parsed."""
    return [b.json for b in blocks if b.data is not None and b.event is None]


class SseReader:
    """A streamed response read in the background into a queue of blocks."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.blocks: list[Block] = []
        """Every block taken with :meth:`next` so far."""
        self.raw = bytearray()
        """Every byte of the body read so far (comments included)."""
        self._queue: asyncio.Queue[Block | None] = asyncio.Queue()
        self.ended = False
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        parser = BlockParser()
        try:
            async for chunk in self.response.aiter_raw():
                self.raw += chunk
                for block in parser.feed(chunk):
                    self._queue.put_nowait(block)
        except httpx.HTTPError:
            pass
        finally:
            self._queue.put_nowait(None)

    async def next(self, timeout: float = WAIT) -> Block | None:
        """The next block; ``None`` once the response ended."""
        if self.ended:
            return None
        block = await asyncio.wait_for(self._queue.get(), timeout)
        if block is None:
            self.ended = True
        else:
            self.blocks.append(block)
        return block

    async def until(self, done: Callable[[Block], bool], timeout: float = WAIT) -> list[Block]:
        """Blocks up to and including the first *done* one (fails if the response ends)."""
        deadline = time.monotonic() + timeout
        taken: list[Block] = []
        while True:
            block = await self.next(max(0.01, deadline - time.monotonic()))
            assert block is not None, f"the response ended; last blocks {taken[-3:]}"
            taken.append(block)
            if done(block):
                return taken

    async def to_end(self, timeout: float = WAIT) -> list[Block]:
        """The blocks up to the end of the response (which must come within *timeout*)."""
        deadline = time.monotonic() + timeout
        taken: list[Block] = []
        while (block := await self.next(max(0.01, deadline - time.monotonic()))) is not None:
            taken.append(block)
        return taken

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


def is_event(type_: str) -> Callable[[Block], bool]:
    return lambda b: b.data is not None and b.event is None and b.json.get("type") == type_


def has_id(offset: str) -> Callable[[Block], bool]:
    return lambda b: b.id == offset


# -- the gateway, its agents and its store ------------------------------------------------


def new_thread() -> str:
    return f"web-{uuid.uuid4().hex[:10]}"


def user(message_id: str, text: str) -> Event:
    return {"id": message_id, "role": "user", "content": text}


def run_input(thread: str, messages: list[Event] | None = None, **extra: Any) -> Event:
    """A RunAgentInput (wire form), as an HttpAgent POSTs it."""
    return {
        "threadId": thread,
        "runId": f"run-{uuid.uuid4().hex[:8]}",
        "messages": [user("u1", "hello")] if messages is None else messages,
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **extra,
    }


def agents_spec(agent: UpstreamAgent) -> str:
    return ",".join(
        [
            f"ok={agent.url('ok')}",
            f"slow={agent.url('slow', count=SLOW_COUNT, delay=SLOW_DELAY)}",
            f"long={agent.url('slow', count=2000, delay=0.02)}",
            f"hang={agent.url('hang')}",
            f"boom={agent.url('status')}",
        ]
    )


class Web:
    """Gateways (with an HTTP listener) and clients of one test, torn down at its end."""

    def __init__(self, agent: UpstreamAgent, store_factory: Callable[[], ThreadStore]) -> None:
        self.agent = agent
        self.store_factory = store_factory
        self.gateways: list[Gateway] = []
        self.clients: list[HubClient] = []
        self.http = httpx.AsyncClient(trust_env=False, timeout=WAIT)

    async def gateway(self, store: ThreadStore | None = None, **config: Any) -> Gateway:
        config.setdefault("ping_interval", None)
        config.setdefault("agents", agents_spec(self.agent))
        gateway = Gateway(
            GatewayConfig(host="127.0.0.1", port=0, http_port=0, **config),
            store=store if store is not None else self.store_factory(),
        )
        await gateway.start()
        self.gateways.append(gateway)
        return gateway

    async def hub_client(self, gateway: Gateway, encoding: str) -> HubClient:
        client = HubClient(
            f"ws://127.0.0.1:{gateway.config.port}", encoding=encoding, open_timeout=WAIT
        )
        await client.connect()
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.close()
        await self.http.aclose()
        for gateway in self.gateways:
            if not gateway._draining:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(gateway.drain(), 15)


def http_app(gateway: Gateway) -> HttpApp:
    """The gateway's HTTP listener's ASGI app (its streams, its per-address counts)."""
    assert gateway.http is not None
    return gateway.http.app


def base(gateway: Gateway) -> str:
    return f"http://127.0.0.1:{gateway.config.http_port}"


@pytest.fixture(scope="module")
def agent() -> Iterator[UpstreamAgent]:
    """One agent for the module; tests that count its disconnects serve their own."""
    with serve_agent() as served:
        yield served


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> Callable[[], ThreadStore]:
    if request.param == "memory":
        return MemoryStore
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-web-{uuid.uuid4().hex}"
    return lambda: RedisStore(server.url, prefix=prefix)


@pytest.fixture
async def web(agent: UpstreamAgent, store_factory: Callable[[], ThreadStore]) -> AsyncIterator[Web]:
    w = Web(agent, store_factory)
    try:
        yield w
    finally:
        await w.close()


@pytest.fixture
async def mem(agent: UpstreamAgent) -> AsyncIterator[Web]:
    """Memory store only: for what does not depend on the store."""
    w = Web(agent, MemoryStore)
    try:
        yield w
    finally:
        await w.close()


def shared_store(gateway: Gateway, web: Web) -> ThreadStore:
    """Another handle on *gateway*'s store (the same object in memory)."""
    return gateway.store if isinstance(gateway.store, MemoryStore) else web.store_factory()


async def stored(gateway: Gateway, thread: str) -> list[tuple[str, Event]]:
    """The thread as the store holds it: (offset, event), oldest first."""
    entries = await gateway.store.read(thread)
    return [(e.offset, msgpack.unpackb(e.data, raw=False)) for e in entries]


async def wait_stored_end(gateway: Gateway, thread: str, runs: int = 1) -> list[tuple[str, Event]]:
    """The thread once it holds *runs* RUN_FINISHED / RUN_ERROR events (bounded wait)."""
    deadline = time.monotonic() + WAIT
    while True:
        events = await stored(gateway, thread)
        if sum(e["type"] in TERMINAL for _, e in events) >= runs:
            return events
        assert time.monotonic() < deadline, f"the run did not end: {[e['type'] for _, e in events]}"
        await asyncio.sleep(0.02)


async def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def post_agent(client: httpx.AsyncClient, url: str, body: Event) -> list[Event]:
    """The events the upstream agent itself answers to *body*."""
    response = await client.post(url, json=body)
    assert response.status_code == 200, response.text
    return events_of(parse_blocks(response.content))


@contextlib.asynccontextmanager
async def sse(
    client: httpx.AsyncClient, url: str, *, method: str = "GET", **kwargs: Any
) -> AsyncIterator[SseReader]:
    """An SSE response, read in the background; leaving the block drops the connection."""
    async with client.stream(method, url, **kwargs) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = SseReader(response)
        try:
            yield reader
        finally:
            await reader.close()


def without_input(event: Event) -> Event:
    return {k: v for k, v in event.items() if k != "input"}


def sse_event_transcript(blocks: list[Block]) -> list[tuple[str, Event]]:
    """(id, event) of the event blocks of a GET stream (each must carry its id)."""
    out = []
    for block in blocks:
        if block.data is not None and block.event is None:
            assert block.id is not None, f"an event without its id: {block}"
            out.append((block.id, block.json))
    return out


async def assert_serving(client: httpx.AsyncClient, gateway: Gateway) -> None:
    response = await client.get(base(gateway) + "/healthz")
    assert response.status_code == 200
    assert response.text == "ok\n"


# -- 1. POST /agents/<name> ---------------------------------------------------------------


async def test_post_relays_the_agents_run_with_offsets(web: Web, agent: UpstreamAgent) -> None:
    gateway = await web.gateway()
    thread = new_thread()
    body = run_input(thread, [user("u1", "what is 6 x 7?")])
    direct = await post_agent(web.http, agent.url("ok"), body)
    assert direct[0]["type"] == "RUN_STARTED" and direct[-1]["type"] == "RUN_FINISHED"

    response = await web.http.post(base(gateway) + "/agents/ok", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-store"
    blocks = parse_blocks(response.content)
    # Exactly the agent's events, as it sent them (its RUN_STARTED without an input).
    assert events_of(blocks) == direct
    assert "input" not in events_of(blocks)[0]
    # The response ended with the run: RUN_FINISHED is its last block.
    assert blocks[-1].json["type"] == "RUN_FINISHED"
    assert all(b.event is None for b in blocks), "hub frames of its own in a run's response"

    # Each id is the offset of that event in the thread.
    thread_events = await stored(gateway, thread)
    assert [b.id for b in blocks] == [offset for offset, _ in thread_events]
    assert [e for _, e in thread_events[1:]] == direct[1:]
    # The stored RUN_STARTED remembers the user's message the thread lacked.
    first = thread_events[0][1]
    assert without_input(first) == direct[0]
    assert first["input"]["messages"] == [user("u1", "what is 6 x 7?")]
    assert first["input"]["threadId"] == thread and first["input"]["runId"] == body["runId"]

    # A second turn: the client sends the whole conversation and one new message;
    # only that one is new to the thread.
    history = fold([e for _, e in thread_events]).messages
    assert history[0]["id"] == "u1"
    second = run_input(thread, [*history, user("u2", "thanks")], parentRunId=body["runId"])
    direct2 = await post_agent(web.http, agent.url("ok"), second)
    response2 = await web.http.post(base(gateway) + "/agents/ok", json=second)
    assert response2.status_code == 200, response2.text
    blocks2 = parse_blocks(response2.content)
    assert events_of(blocks2) == direct2
    assert ok_transcript_text(second["messages"]) in "".join(
        e.get("delta", "") for e in direct2 if e["type"] == "TEXT_MESSAGE_CONTENT"
    )
    after = await stored(gateway, thread)
    assert [o for o, _ in after[len(thread_events) :]] == [b.id for b in blocks2]
    started = after[len(thread_events)][1]
    assert started["input"]["messages"] == [user("u2", "thanks")]
    assert started["parentRunId"] == body["runId"]
    assert without_input(started) == direct2[0]


async def test_post_client_that_leaves_does_not_stop_the_run(
    store_factory: Callable[[], ThreadStore],
) -> None:
    # An agent of its own: its disconnect count is this test's evidence.
    with serve_agent() as own:
        web = Web(own, store_factory)
        try:
            gateway = await web.gateway()
            thread = new_thread()
            async with sse(web.http, base(gateway) + "/agents/slow", method="POST",
                           json=run_input(thread)) as reader:  # fmt: skip
                seen = await reader.until(lambda b: len(reader.blocks) >= 4)
            assert [b.json["type"] for b in seen[:2]] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
            assert gateway.bridge.runs.get(thread) is not None, "the run stopped with its client"
            events = [e for _, e in await wait_stored_end(gateway, thread)]
            assert [e["type"] for e in events] == [
                "RUN_STARTED", "TEXT_MESSAGE_START", *["TEXT_MESSAGE_CONTENT"] * SLOW_COUNT,
                "TEXT_MESSAGE_END", "RUN_FINISHED",
            ]  # fmt: skip
            deltas = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
            assert deltas == [f"{i} " for i in range(SLOW_COUNT)]
            assert own.disconnects == 0, "the hub closed the agent's response"
            # (Counted when the append returns, which is after readers can see it.)
            await wait_until(lambda: gateway.bridge.ended == {"finished": 1}, "the run counted")
            await wait_until(lambda: not http_app(gateway).streams, "the stream to be released")
            await assert_serving(web.http, gateway)
        finally:
            await web.close()


# -- 3. GET /threads/<thread>/events ------------------------------------------------------


async def test_get_from_start_live_and_snapshot(web: Web) -> None:
    gateway = await web.gateway()
    thread = new_thread()
    response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200
    history = await stored(gateway, thread)
    head = history[-1][0]
    epoch = await gateway.store.epoch(thread)
    url = base(gateway) + f"/threads/{thread}/events"

    # From the start (the default): retry, subscribed, then every event with its offset.
    async with sse(web.http, url) as reader:
        blocks = await reader.until(has_id(head))
    assert blocks[0].retry == 1000 and blocks[0].data is None
    assert blocks[1].event == "subscribed"
    assert blocks[1].json == {"thread": thread, "epoch": epoch, "offset": head, "recovered": True}
    assert sse_event_transcript(blocks[2:]) == history

    # From a snapshot: compacted events folding to the same thread, the last one
    # carrying the snapshot's offset.
    async with sse(web.http, url + "?from=snapshot") as reader:
        blocks = await reader.until(lambda b: b.id is not None)
    assert blocks[0].retry == 1000
    assert blocks[1].event == "subscribed" and blocks[1].json["recovered"] is True
    assert blocks[2].event == "snapshot"
    assert blocks[2].json == {"offset": head, "epoch": epoch, "complete": True}
    compacted = [b.json for b in blocks[3:]]
    assert all(b.event is None for b in blocks[3:])
    assert all(b.id is None for b in blocks[3:-1]) and blocks[-1].id == head
    assert len(compacted) < len(history)
    want = fold([e for _, e in history])
    got = fold(compacted)
    assert (got.messages, got.state) == (want.messages, want.state)

    # Live: nothing of the history, then the next run's events as they are stored.
    async with sse(web.http, url + "?from=live") as reader:
        subscribed = await reader.until(lambda b: b.event == "subscribed")
        assert subscribed[-1].json["offset"] == head
        more = run_input(thread, [user("u9", "again")])
        response = await web.http.post(base(gateway) + "/agents/ok", json=more)
        assert response.status_code == 200
        live = await reader.until(is_event("RUN_FINISHED"))
    now = await stored(gateway, thread)
    assert sse_event_transcript(live) == now[len(history) :]
    assert live[0].json["type"] == "RUN_STARTED" and live[0].json["runId"] == more["runId"]
    # Every stream that went is forgotten: no stream, no subscriber, no address count.
    await wait_until(
        lambda: (
            not http_app(gateway).streams
            and not http_app(gateway).per_address
            and gateway.hub.stats()["members"] == 0
        ),
        "the streams to be released",
    )


async def test_get_resumes_after_last_event_id(web: Web) -> None:
    gateway = await web.gateway()
    thread = new_thread()
    url = base(gateway) + f"/threads/{thread}/events"
    poster = asyncio.create_task(
        web.http.post(base(gateway) + "/agents/slow", json=run_input(thread))
    )
    # Cut a GET stream in the middle of the run...
    async with sse(web.http, url) as reader:
        first = await reader.until(lambda b: len(sse_event_transcript(reader.blocks)) >= 8)
    part1 = sse_event_transcript(first)
    last_id = part1[-1][0]
    assert gateway.bridge.runs.get(thread) is not None, "the run ended before the cut"
    # ... and resume it as EventSource does, with the Last-Event-ID header.
    async with sse(web.http, url, headers={"Last-Event-ID": last_id}) as reader:
        second = await reader.until(is_event("RUN_FINISHED"))
    assert second[0].retry == 1000
    assert second[1].event == "subscribed" and second[1].json["recovered"] is True
    part2 = sse_event_transcript(second)
    thread_events = await stored(gateway, thread)
    assert part1 + part2 == thread_events, "lost or repeated events across the resume"
    assert (await poster).status_code == 200

    # The query form (?lastEventId=), and the right epoch: exactly what follows.
    epoch = await gateway.store.epoch(thread)
    middle = thread_events[20][0]
    for query in (f"?lastEventId={middle}", f"?lastEventId={middle}&epoch={epoch}"):
        async with sse(web.http, url + query) as reader:
            blocks = await reader.until(has_id(thread_events[-1][0]))
        assert blocks[1].json["recovered"] is True
        assert sse_event_transcript(blocks) == thread_events[21:]


async def test_get_thread_names_percent_encoded(web: Web) -> None:
    gateway = await web.gateway()
    for thread in ("tenant/a", f"tenant/{uuid.uuid4().hex[:6]} ünï?#%&+"):
        response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
        assert response.status_code == 200
        history = await stored(gateway, thread)
        url = base(gateway) + f"/threads/{quote(thread, safe='')}/events"
        async with sse(web.http, url) as reader:
            blocks = await reader.until(has_id(history[-1][0]))
        assert blocks[1].json["thread"] == thread
        assert sse_event_transcript(blocks) == history
    # The "/" may also be sent as it is.
    response = await web.http.post(base(gateway) + "/agents/ok", json=run_input("tenant/b"))
    assert response.status_code == 200
    history = await stored(gateway, "tenant/b")
    async with sse(web.http, base(gateway) + "/threads/tenant/b/events") as reader:
        blocks = await reader.until(has_id(history[-1][0]))
    assert blocks[1].json["thread"] == "tenant/b"
    assert sse_event_transcript(blocks) == history
    # Not a thread name: 400.
    response = await web.http.get(base(gateway) + "/threads/%20x%20/events")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


async def test_get_positions_that_cannot_resume(web: Web) -> None:
    gateway = await web.gateway()
    thread = new_thread()
    response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200
    history = await stored(gateway, thread)
    head = history[-1][0]
    epoch = await gateway.store.epoch(thread)
    url = base(gateway) + f"/threads/{thread}/events"

    for bad in ("not-an-offset", "12", "1-2-3", "-1-0"):
        response = await web.http.get(url, headers={"Last-Event-ID": bad})
        assert response.status_code == 400, bad
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "invalid_offset"
        response = await web.http.get(url + f"?lastEventId={quote(bad)}")
        assert response.status_code == 400
    response = await web.http.get(url + "?from=yesterday")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"

    # Beyond the head, or from another epoch: a snapshot, never a silent gap.
    ms, seq = (int(x) for x in head.split("-"))
    beyond = f"{ms + 1000}-0"
    for headers, query in (
        ({"Last-Event-ID": beyond}, ""),
        ({}, f"?lastEventId={beyond}&epoch={epoch}"),
        ({"Last-Event-ID": history[3][0]}, "?epoch=not-the-epoch"),
        ({"Last-Event-ID": f"{ms}-{seq}"}, "?epoch=another"),
    ):
        async with sse(web.http, url + query, headers=headers) as reader:
            blocks = await reader.until(lambda b: b.id is not None)
        assert blocks[1].event == "subscribed"
        assert blocks[1].json["recovered"] is False, (headers, query)
        assert blocks[2].event == "snapshot" and blocks[2].json["offset"] == head
        assert blocks[-1].id == head
        got = fold([b.json for b in blocks[3:]])
        want = fold([e for _, e in history])
        assert (got.messages, got.state) == (want.messages, want.state)

    # The thread re-created under the stream: a resume with the old epoch is told so.
    assert await gateway.store.delete(thread)
    again = run_input(thread, [user("u7", "anew")])
    response = await web.http.post(base(gateway) + "/agents/ok", json=again)
    assert response.status_code == 200
    recreated = await stored(gateway, thread)
    new_epoch = await gateway.store.epoch(thread)
    assert new_epoch != epoch and recreated[0][1]["runId"] == again["runId"]
    async with sse(web.http, url + f"?epoch={epoch}", headers={"Last-Event-ID": head}) as reader:
        blocks = await reader.until(lambda b: b.id is not None)
    assert blocks[1].json["recovered"] is False and blocks[1].json["epoch"] == new_epoch
    assert blocks[2].event == "snapshot" and blocks[-1].id == recreated[-1][0]
    got = fold([b.json for b in blocks[3:]])
    want = fold([e for _, e in recreated])
    assert (got.messages, got.state) == (want.messages, want.state)


# -- 4. viewers of one bridged run: WebSocket and SSE -------------------------------------


async def ws_transcript(sub: Any, runs: int) -> list[tuple[str, Event]]:
    """(offset, event) a HubClient subscription yields until *runs* runs ended."""
    out: list[tuple[str, Event]] = []
    ended = 0
    async with asyncio.timeout(WAIT):
        async for item in sub:
            if isinstance(item, Subscribed):
                assert item.recovered
                continue
            assert isinstance(item, ThreadEvent), item
            out.append((item.offset, item.event))
            if item.event["type"] in TERMINAL:
                ended += 1
                if ended == runs:
                    return out
    raise AssertionError("the subscription ended")


async def test_websocket_and_sse_viewers_see_the_same_run(web: Web) -> None:
    gateway = await web.gateway()
    thread = new_thread()
    binary = await web.hub_client(gateway, "msgpack")
    text = await web.hub_client(gateway, "json")
    subs = [binary.subscribe(thread, "start"), text.subscribe(thread, "start")]
    for sub in subs:
        await sub.open()
    watchers = [asyncio.create_task(ws_transcript(sub, 2)) for sub in subs]
    url = base(gateway) + f"/threads/{thread}/events"
    async with sse(web.http, url) as reader:
        await reader.until(lambda b: b.event == "subscribed")
        response = await web.http.post(base(gateway) + "/agents/slow", json=run_input(thread))
        assert response.status_code == 200
        run1 = sse_event_transcript(await reader.until(is_event("RUN_FINISHED")))
    # The POST's own response: the same ids (its RUN_STARTED without the input).
    posted = parse_blocks(response.content)
    assert [b.id for b in posted] == [offset for offset, _ in run1]
    assert [without_input(e) for _, e in run1] == events_of(posted)

    # A second run: the SSE viewer drops in its middle and resumes.
    poster = asyncio.create_task(
        web.http.post(base(gateway) + "/agents/slow", json=run_input(thread, [user("u2", "more")]))
    )
    async with sse(web.http, url, headers={"Last-Event-ID": run1[-1][0]}) as reader:
        part1 = sse_event_transcript(
            await reader.until(lambda b: len(sse_event_transcript(reader.blocks)) >= 10)
        )
    assert gateway.bridge.runs.get(thread) is not None, "the run ended before the cut"
    async with sse(web.http, url, headers={"Last-Event-ID": part1[-1][0]}) as reader:
        part2 = sse_event_transcript(await reader.until(is_event("RUN_FINISHED")))
    assert (await poster).status_code == 200

    ws_binary, ws_text = [await w for w in watchers]
    thread_events = await stored(gateway, thread)
    assert ws_binary == thread_events
    assert ws_text == thread_events
    assert run1 + part1 + part2 == thread_events
    assert sum(e["type"] == "RUN_FINISHED" for _, e in thread_events) == 2


# -- 5. errors -----------------------------------------------------------------------------


async def test_error_answers_and_the_listener_goes_on(mem: Web) -> None:
    gateway = await mem.gateway(max_input_bytes=4096, allowed_origins="https://app.example")
    client = mem.http
    root = base(gateway)
    thread = new_thread()

    def error(response: httpx.Response, status: int, code: str) -> str:
        assert response.status_code == status, response.text
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        assert body["error"]["code"] == code, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        return str(body["error"]["message"])

    async def check(response: httpx.Response, status: int, code: str) -> str:
        message = error(response, status, code)
        await assert_serving(client, gateway)
        return message

    message = await check(
        await client.post(root + "/agents/nobody", json=run_input(thread)), 404, "unknown_agent"
    )
    assert "nobody" in message
    await check(await client.post(root + "/agents/ok", content=b"{not json"), 400, "bad_request")
    await check(await client.post(root + "/agents/ok", json=[1, 2]), 400, "bad_request")
    no_thread = run_input(thread)
    del no_thread["threadId"]
    await check(await client.post(root + "/agents/ok", json=no_thread), 400, "bad_request")
    await check(
        await client.post(root + "/agents/ok", json=run_input(thread, messages="hi")),  # type: ignore[arg-type]
        400,
        "invalid_event",
    )
    await check(
        await client.post(root + "/agents/ok", json=run_input(thread, [{"role": "user"}])),
        400,
        "invalid_event",
    )
    await check(
        await client.post(root + "/agents/ok", json=run_input(" padded ")), 400, "invalid_event"
    )
    big = run_input(thread, [user("u1", "x" * 5000)])
    message = await check(
        await client.post(root + "/agents/ok", json=big), 413, "payload_too_large"
    )
    assert "4096" in message
    # None of those started anything.
    assert await stored(gateway, thread) == []
    assert gateway.bridge.started_total == 0

    response = await client.get(root + "/agents/ok")
    await check(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    response = await client.post(root + f"/threads/{thread}/events")
    await check(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET"
    response = await client.get(root + f"/threads/{thread}/run")
    await check(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "DELETE"
    response = await client.post(root + "/healthz")
    await check(response, 405, "method_not_allowed")
    await check(await client.get(root + "/nothing/here"), 404, "not_found")
    await check(await client.get(root + "/"), 404, "not_found")
    response = await client.head(root + "/healthz")
    assert response.status_code == 200

    # CORS: a preflight from an allowed origin, a request from a foreign one.
    response = await client.options(
        root + "/agents/ok",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
    )
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in response.headers["access-control-allow-methods"]
    allowed_headers = response.headers["access-control-allow-headers"].lower()
    for name in ("content-type", "authorization", "last-event-id"):
        assert name in allowed_headers
    allowed = await client.post(
        root + "/agents/ok", json=run_input(new_thread()), headers={"Origin": "https://app.example"}
    )
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    for method, path in (("POST", "/agents/ok"), ("GET", f"/threads/{thread}/events"),
                         ("OPTIONS", "/agents/ok"), ("GET", "/healthz")):  # fmt: skip
        response = await client.request(
            method, root + path, json=run_input(thread) if method == "POST" else None,
            headers={"Origin": "https://evil.example"},
        )  # fmt: skip
        await check(response, 403, "forbidden")
        assert "access-control-allow-origin" not in response.headers
    assert await stored(gateway, thread) == []

    # Two Last-Event-ID headers: which one would it resume from?
    response = await client.get(
        root + f"/threads/{thread}/events",
        headers=[("Last-Event-ID", "1-0"), ("Last-Event-ID", "2-0")],
    )
    await check(response, 400, "bad_request")


async def test_post_into_a_thread_with_a_run_going(web: Web) -> None:
    gateway = await web.gateway()
    other = await web.gateway(store=shared_store(gateway, web))
    thread = new_thread()
    async with sse(web.http, base(gateway) + "/agents/long", method="POST",
                   json=run_input(thread)) as reader:  # fmt: skip
        await reader.until(is_event("TEXT_MESSAGE_START"))
        for name in ("ok", "long"):
            response = await web.http.post(
                base(gateway) + f"/agents/{name}", json=run_input(thread)
            )
            assert response.status_code == 409, response.text
            assert response.json()["error"]["code"] == "run_active"
        # Another gateway on the same store sees the run in the stored events.
        response = await web.http.post(base(other) + "/agents/ok", json=run_input(thread))
        assert response.status_code == 409, response.text
        assert response.json()["error"]["code"] == "run_active"
        await assert_serving(web.http, gateway)
        cancelled = await web.http.delete(base(gateway) + f"/threads/{thread}/run")
        assert cancelled.status_code == 200
        rest = await reader.to_end()
    assert rest[-1].json["type"] == "RUN_ERROR"
    assert rest[-1].json["code"] == "AGUI_HUB_RUN_CANCELLED"
    # The thread is free again, on either gateway.
    response = await web.http.post(base(other) + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200
    assert events_of(parse_blocks(response.content))[-1]["type"] == "RUN_FINISHED"

    # An agent that has not started yet (nothing stored) holds its thread on its gateway.
    waiting = new_thread()
    async with sse(web.http, base(gateway) + "/agents/hang", method="POST",
                   json=run_input(waiting)) as reader:  # fmt: skip
        await wait_until(lambda: waiting in gateway.bridge.runs, "the hang run to start")
        response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(waiting))
        assert response.status_code == 409, response.text
        assert response.json()["error"]["code"] == "run_active"
        cancelled = await web.http.delete(base(gateway) + f"/threads/{waiting}/run")
        assert cancelled.status_code == 200
        rest = await reader.to_end()
    # Nothing was stored of it but its end: the hub's RUN_STARTED, then the RUN_ERROR.
    assert [b.json["type"] for b in rest] == ["RUN_STARTED", "RUN_ERROR"]
    assert [e["type"] for _, e in await stored(gateway, waiting)] == ["RUN_STARTED", "RUN_ERROR"]


async def test_too_many_runs(mem: Web) -> None:
    gateway = await mem.gateway(max_runs=1)
    busy = new_thread()
    async with sse(mem.http, base(gateway) + "/agents/hang", method="POST",
                   json=run_input(busy)) as reader:  # fmt: skip
        await wait_until(lambda: busy in gateway.bridge.runs, "the hang run to start")
        response = await mem.http.post(base(gateway) + "/agents/ok", json=run_input(new_thread()))
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "too_many_runs"
        assert response.headers["retry-after"] == "5"
        cancelled = await mem.http.delete(base(gateway) + f"/threads/{busy}/run")
        assert cancelled.status_code == 200
        await reader.to_end()
    response = await mem.http.post(base(gateway) + "/agents/ok", json=run_input(new_thread()))
    assert response.status_code == 200


async def test_failed_upstream_is_a_run_error_in_the_response(mem: Web) -> None:
    gateway = await mem.gateway()
    thread = new_thread()
    body = run_input(thread, [user("u1", "boom?")])
    response = await mem.http.post(base(gateway) + "/agents/boom", json=body)
    assert response.status_code == 200
    blocks = parse_blocks(response.content)
    events = events_of(blocks)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert events[0]["runId"] == body["runId"] and events[0]["threadId"] == thread
    assert events[1]["code"] == "AGUI_HUB_UPSTREAM_STATUS"
    assert "HTTP 500" in events[1]["message"] and "agent exploded" in events[1]["message"]
    thread_events = await stored(gateway, thread)
    assert [b.id for b in blocks] == [o for o, _ in thread_events]
    assert thread_events[0][1]["input"]["messages"] == [user("u1", "boom?")]


# -- 6. DELETE /threads/<thread>/run ----------------------------------------------------------


async def test_delete_cancels_the_run(store_factory: Callable[[], ThreadStore]) -> None:
    with serve_agent() as own:
        web = Web(own, store_factory)
        try:
            gateway = await web.gateway()
            thread = new_thread()
            body = run_input(thread)
            async with sse(web.http, base(gateway) + "/agents/slow", method="POST",
                           json=body) as reader:  # fmt: skip
                await reader.until(is_event("TEXT_MESSAGE_CONTENT"))
                response = await web.http.delete(base(gateway) + f"/threads/{thread}/run")
                rest = await reader.to_end()
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/json"
            cancelled = response.json()["cancelled"]
            assert cancelled["thread"] == thread and cancelled["agent"] == "slow"
            assert cancelled["runId"] == body["runId"] and cancelled["status"] == "ended"
            assert rest[-1].json["type"] == "RUN_ERROR"
            assert rest[-1].json["code"] == "AGUI_HUB_RUN_CANCELLED"
            events = [e for _, e in await stored(gateway, thread)]
            assert events[-1]["type"] == "RUN_ERROR"
            assert events[-1]["code"] == "AGUI_HUB_RUN_CANCELLED"
            assert sum(e["type"] == "TEXT_MESSAGE_CONTENT" for e in events) < SLOW_COUNT
            assert own.wait_disconnects(1, WAIT), "the agent's response was not closed"

            response = await web.http.delete(base(gateway) + f"/threads/{thread}/run")
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "no_active_run"
            response = await web.http.delete(
                base(gateway) + f"/threads/{new_thread()}/run?runId=nope"
            )
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "no_active_run"
            await assert_serving(web.http, gateway)
        finally:
            await web.close()


# -- 7. authentication ---------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_jwt_guards_runs_and_streams(mem: Web) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET)
    client = mem.http
    root = base(gateway)
    thread = f"team/{uuid.uuid4().hex[:8]}"

    def token(**grants: Any) -> str:
        return encode_token(SECRET, "alice", **grants)

    response = await client.post(root + "/agents/ok", json=run_input(thread))
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["www-authenticate"].startswith("Bearer")
    response = await client.post(
        root + "/agents/ok", json=run_input(thread), headers=bearer("not.a.token")
    )
    assert response.status_code == 401
    for grants in (
        {"publish": ["team/*"]},  # no run grant
        {"publish": ["team/*"], "run": ["slow"]},  # a run grant for another agent
        {"subscribe": ["*"], "run": ["*"]},  # may run, may not publish into the thread
        {"publish": ["other/*"], "run": ["ok"]},
        # may run and publish, may not read the thread (the answer is its events)
        {"publish": ["team/*"], "run": ["ok"]},
    ):
        response = await client.post(
            root + "/agents/ok", json=run_input(thread), headers=bearer(token(**grants))
        )
        assert response.status_code == 403, grants
        assert response.json()["error"]["code"] == "forbidden"
    assert await stored(gateway, thread) == []

    runner = token(publish=["team/*"], subscribe=["team/*"], run=["ok"])
    response = await client.post(
        root + "/agents/ok", json=run_input(thread), headers=bearer(runner)
    )
    assert response.status_code == 200
    history = await stored(gateway, thread)
    assert [b.id for b in parse_blocks(response.content)] == [o for o, _ in history]

    url = root + f"/threads/{quote(thread, safe='')}/events"
    response = await client.get(url)
    assert response.status_code == 401
    reader_token = token(subscribe=["team/*"])
    async with sse(client, url + f"?access_token={reader_token}") as reader:
        blocks = await reader.until(has_id(history[-1][0]))
    assert sse_event_transcript(blocks) == history
    async with sse(client, url, headers=bearer(reader_token)) as reader:
        blocks = await reader.until(has_id(history[-1][0]))
    assert sse_event_transcript(blocks) == history
    for other in (token(subscribe=["other/*"]), token(publish=["team/*"], run=["*"])):
        response = await client.get(url + f"?access_token={other}")
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"

    response = await client.delete(root + f"/threads/{quote(thread, safe='')}/run")
    assert response.status_code == 401
    response = await client.delete(
        root + f"/threads/{quote(thread, safe='')}/run", headers=bearer(reader_token)
    )
    assert response.status_code == 403
    await assert_serving(client, gateway)


async def test_anonymous_run_setting(mem: Web) -> None:
    # Next to JWT: anonymous clients may run only the agents anonymous_run names.
    gateway = await mem.gateway(
        jwt_secret=SECRET, allow_anonymous=True, anonymous_publish="open/*",
        anonymous_subscribe="open/*", anonymous_run="ok",
    )  # fmt: skip
    root = base(gateway)
    thread = f"open/{uuid.uuid4().hex[:8]}"
    response = await mem.http.post(root + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200
    for name, where in (("slow", thread), ("boom", thread), ("ok", f"closed/{thread}")):
        response = await mem.http.post(root + f"/agents/{name}", json=run_input(where))
        assert response.status_code == 403, (name, where)
    # With JWT but no anonymous_run: no anonymous runs at all.
    strict = await mem.gateway(jwt_secret=SECRET, allow_anonymous=True, anonymous_publish="*")
    response = await mem.http.post(base(strict) + "/agents/ok", json=run_input(new_thread()))
    assert response.status_code == 403
    # Without JWT: every agent by default, only those listed with anonymous_run.
    open_ = await mem.gateway()
    response = await mem.http.post(base(open_) + "/agents/boom", json=run_input(new_thread()))
    assert response.status_code == 200
    listed = await mem.gateway(anonymous_run="ok")
    response = await mem.http.post(base(listed) + "/agents/slow", json=run_input(new_thread()))
    assert response.status_code == 403
    response = await mem.http.post(base(listed) + "/agents/ok", json=run_input(new_thread()))
    assert response.status_code == 200


# -- 8. a reader that stops reading --------------------------------------------------------------


class RawStream:
    """A GET over a raw socket with a small receive buffer: reads only when told to."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = BlockParser()
        self.blocks: list[Block] = []
        self.status: int | None = None
        self._chunked: bool | None = None

    @classmethod
    async def open(cls, port: int, path: str) -> RawStream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=16 * 1024)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        await writer.drain()
        return cls(reader, writer)

    async def read_until(self, done: Callable[[Block], bool], timeout: float = WAIT) -> None:
        async with asyncio.timeout(timeout):
            if self.status is None:
                head = await self.reader.readuntil(b"\r\n\r\n")
                self.status = int(head.split(b" ", 2)[1])
                self._chunked = b"transfer-encoding: chunked" in head.lower()
                assert self._chunked, head
            while not any(done(b) for b in self.blocks):
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                assert size > 0, "the response ended"
                data = await self.reader.readexactly(size + 2)
                self.blocks += self.parser.feed(data[:-2])

    def close(self) -> None:
        self.writer.close()


async def test_slow_sse_reader_is_bounded(web: Web) -> None:
    bound = 64 * 1024
    gateway = await web.gateway(send_queue_bytes=bound, write_timeout=30)
    thread = new_thread()
    delta = "y" * 4000
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "big"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
    ]
    events += [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"{i:05d}{delta}"}
        for i in range(2000)
    ]
    events += [
        {"type": "TEXT_MESSAGE_END", "messageId": "m"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "big"},
    ]
    for start in range(0, len(events), 500):
        await gateway.hub.publish(thread, events[start : start + 500])
    history = await stored(gateway, thread)
    assert len(history) == len(events)
    event_size = len(json.dumps(events[5])) + 64

    raw = await RawStream.open(gateway.config.http_port or 0, f"/threads/{thread}/events")
    try:
        await wait_until(lambda: len(http_app(gateway).streams) == 1, "the stream to open")
        (stream,) = http_app(gateway).streams
        most = 0
        caught_up_from_store = False
        deadline = time.monotonic() + 1.5 * TIMEOUT_SCALE
        others = asyncio.create_task(
            web.http.post(base(gateway) + "/agents/ok", json=run_input(new_thread()))
        )
        while time.monotonic() < deadline:
            most = max(most, stream.queued_bytes)
            caught_up_from_store |= gateway.hub.stats()["catching_up"] >= 1
            await asyncio.sleep(0.005)
        # Meanwhile the gateway served another client's whole run.
        assert others.done(), "the gateway stalled behind a reader that does not read"
        assert (await others).status_code == 200
        await assert_serving(web.http, gateway)
        assert http_app(gateway).streams == {stream} and stream.is_open
        assert caught_up_from_store, "the reader was never behind: the test proves nothing"
        assert most <= bound + 2 * event_size, f"{most} bytes queued for one reader"

        await raw.read_until(has_id(history[-1][0]), timeout=3 * WAIT)
        assert raw.status == 200
        assert raw.blocks[0].retry == 1000 and raw.blocks[1].event == "subscribed"
        assert sse_event_transcript(raw.blocks) == history
    finally:
        raw.close()
    await wait_until(lambda: not http_app(gateway).streams, "the stream to be released")


# -- 9. drain ---------------------------------------------------------------------------------


async def test_drain_closes_streams_and_clients_resume_elsewhere(
    web: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A viewer's frames reach it late (as from Redis, after its reader's next
    # read): the drain still gives it the run's end before its close.
    send = web_module.SseStream.send

    def late_send(stream: web_module.SseStream, frame: bytes | str) -> bool:
        if stream.run is not None:
            return send(stream, frame)
        asyncio.get_running_loop().call_later(0.2, send, stream, frame)
        return True

    monkeypatch.setattr(web_module.SseStream, "send", late_send)
    gateway = await web.gateway()
    other = await web.gateway(store=shared_store(gateway, web))
    thread = new_thread()
    poster = asyncio.create_task(
        web.http.post(base(gateway) + "/agents/slow", json=run_input(thread))
    )
    url = f"/threads/{thread}/events"
    async with sse(web.http, base(gateway) + url) as reader:
        await reader.until(lambda b: len(sse_event_transcript(reader.blocks)) >= 5)
        drain = asyncio.create_task(gateway.drain())
        rest = await reader.to_end()
    closes = [b for b in rest if b.event == "close"]
    assert len(closes) == 1 and rest[-1] is closes[0], "the stream did not end with a close"
    assert closes[0].json["code"] == 1012
    part1 = sse_event_transcript(reader.blocks)
    await asyncio.wait_for(drain, 15)
    response = await asyncio.wait_for(poster, WAIT)
    # The drain ends the runs first: their viewers, and the HttpAgent that started the
    # run, get its end (RUN_ERROR AGUI_HUB_GATEWAY_STOPPING) before their streams close.
    assert part1[-1][1]["type"] == "RUN_ERROR", part1[-1]
    assert part1[-1][1]["code"] == "AGUI_HUB_GATEWAY_STOPPING"
    posted = events_of(parse_blocks(response.content))
    assert posted[-1] == part1[-1][1], posted[-3:]

    # The other gateway has it all, and a resume there from the last id is complete.
    thread_events = await stored(other, thread)
    assert part1 == thread_events
    async with sse(web.http, base(other) + url, headers={"Last-Event-ID": part1[-1][0]}) as reader:
        blocks = await reader.until(lambda b: b.event == "subscribed")
    assert blocks[-1].json["recovered"] is True


async def test_drain_does_not_hold_a_viewer_that_has_the_end(
    mem: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A draining listener keeps a viewer of a stopped run's thread open until the run's
    # end reached it; one that resumed at that end (back from the close, to the same
    # gateway) has it already, and is closed at once, not after the 5 s bound.
    gateway = await mem.gateway()
    thread = new_thread()
    url = base(gateway) + f"/threads/{thread}/events"
    run = await gateway.bridge.start("slow", thread, subject="tester")
    await asyncio.wait_for(run.started, WAIT)
    subscribed = asyncio.Event()
    times: dict[str, float] = {}

    async def follow(last: str) -> list[Block]:
        async with sse(mem.http, url, headers={"Last-Event-ID": last}) as reader:
            await reader.until(lambda b: b.event == "subscribed")
            subscribed.set()
            rest = await reader.to_end()
        times["closed"] = time.monotonic()
        return rest

    close = gateway.bridge.close
    viewer: list[asyncio.Task[list[Block]]] = []

    async def close_then_resume(timeout: float = 10.0) -> dict[str, str]:
        ends = await close(timeout)
        viewer.append(asyncio.create_task(follow(ends[thread])))
        await asyncio.wait_for(subscribed.wait(), WAIT)
        times["stopping"] = time.monotonic()
        return ends

    monkeypatch.setattr(gateway.bridge, "close", close_then_resume)
    await asyncio.wait_for(gateway.drain(), 15)
    rest = await asyncio.wait_for(viewer[0], WAIT)
    assert [b.event for b in rest] == ["close"], rest
    assert rest[0].json["code"] == 1012
    assert times["closed"] - times["stopping"] < 2.5, "held as if it lacked the run's end"


# -- more of the listener: keepalives, stalled readers, limits, credentials, the store ----------


async def test_keepalive_comments(mem: Web, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_module, "KEEPALIVE_SECONDS", 0.1)
    gateway = await mem.gateway()
    thread = new_thread()
    async with sse(mem.http, base(gateway) + f"/threads/{thread}/events") as reader:
        await reader.until(lambda b: b.event == "subscribed")
        await wait_until(lambda: reader.raw.count(b"\n: \n\n") >= 3, "keepalives", 3 * WAIT)
        # The stream still delivers after its keepalives.
        response = await mem.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
        assert response.status_code == 200
        blocks = await reader.until(is_event("RUN_FINISHED"))
    assert sse_event_transcript(blocks) == await stored(gateway, thread)
    # A run whose agent has not started yet: "waiting" comments, then its end.
    waiting = new_thread()
    async with sse(mem.http, base(gateway) + "/agents/hang", method="POST",
                   json=run_input(waiting)) as reader:  # fmt: skip
        await wait_until(lambda: reader.raw.count(b": waiting\n\n") >= 2, "waiting", 3 * WAIT)
        assert b"data:" not in reader.raw and b"id:" not in reader.raw
        response = await mem.http.delete(base(gateway) + f"/threads/{waiting}/run")
        assert response.status_code == 200
        rest = await reader.to_end()
    assert [b.json["type"] for b in rest] == ["RUN_STARTED", "RUN_ERROR"]


async def test_reader_that_stops_reading_is_dropped(
    mem: Web, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await mem.gateway(send_queue_bytes=64 * 1024, write_timeout=0.5)
    thread = new_thread()
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "big"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
    ]
    events += [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "z" * 4000} for _ in range(2000)
    ]
    for start in range(0, len(events), 500):
        await gateway.hub.publish(thread, events[start : start + 500])
    with caplog.at_level("INFO"):
        raw = await RawStream.open(gateway.config.http_port or 0, f"/threads/{thread}/events")
        try:
            await wait_until(lambda: len(http_app(gateway).streams) == 1, "the stream to open")
            # The reader never reads: dropped after write_timeout, and forgotten.
            await wait_until(
                lambda: not http_app(gateway).streams and gateway.hub.stats()["members"] == 0,
                "the stalled reader to be dropped",
            )
            # Its place is given back once its response has ended (the end is
            # itself bounded by write_timeout, for a reader that still reads nothing).
            await wait_until(
                lambda: not http_app(gateway).per_address, "its place to be given back"
            )
            # Its connection was closed: reading it now reaches its end.
            async with asyncio.timeout(WAIT):
                with contextlib.suppress(ConnectionError):
                    while await raw.reader.read(1 << 16):
                        pass
        finally:
            raw.close()
    await assert_serving(mem.http, gateway)
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage() for r in errors]


async def test_streams_per_address_are_limited(mem: Web) -> None:
    gateway = await mem.gateway(max_connections_per_address=2)
    thread = new_thread()
    url = base(gateway) + f"/threads/{thread}/events"
    # Refused requests do not hold a place.
    for _ in range(5):
        response = await mem.http.post(base(gateway) + "/agents/nobody", json=run_input(thread))
        assert response.status_code == 404
        response = await mem.http.get(url, headers={"Last-Event-ID": "nope"})
        assert response.status_code == 400
    async with sse(mem.http, url) as first, sse(mem.http, url) as second:
        for reader in (first, second):
            await reader.until(lambda b: b.event == "subscribed")
        response = await mem.http.get(url)
        assert response.status_code == 429
        assert response.json()["error"]["code"] == "too_many_streams"
        assert response.headers["retry-after"] == "5"
        response = await mem.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
        assert response.status_code == 429
        await assert_serving(mem.http, gateway)
    await wait_until(lambda: not http_app(gateway).per_address, "the places to be released")
    response = await mem.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200


async def test_stream_ends_when_its_token_expires(mem: Web) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET)
    thread = new_thread()
    issued = time.time()
    token = encode_token(SECRET, "bob", subscribe=["*"], ttl=2, now=issued)
    expires = int(issued + 2)  # the token's exp
    url = base(gateway) + f"/threads/{thread}/events"
    async with sse(mem.http, url, headers=bearer(token)) as reader:
        await reader.until(lambda b: b.event == "subscribed")
        rest = await reader.to_end(timeout=WAIT)
    ended = time.time()
    assert [b.event for b in rest] == ["close"]
    assert rest[0].json["code"] == 4401
    assert expires - 0.5 <= ended <= expires + 2


async def revocation_gateway(web: Web, tmp_path: Any) -> tuple[Gateway, Any]:
    revoked = tmp_path / "revoked.txt"
    revoked.write_text("# nobody yet\n")
    gateway = await web.gateway(jwt_secret=SECRET, revocation_file=str(revoked))
    return gateway, revoked


async def test_revoked_token_ends_a_quiet_stream(
    mem: Web, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_module, "KEEPALIVE_SECONDS", 0.2)
    gateway, revoked = await revocation_gateway(mem, tmp_path)
    url = base(gateway) + f"/threads/{new_thread()}/events"
    # Revoked before the request: refused.
    revoked.write_text("eve\n")
    gateway.check_revocations()
    response = await mem.http.get(url, headers=bearer(encode_token(SECRET, "eve", subscribe=["*"])))
    assert response.status_code == 403
    token = encode_token(SECRET, "mallory", subscribe=["*"])
    async with sse(mem.http, url, headers=bearer(token)) as reader:
        await reader.until(lambda b: b.event == "subscribed")
        revoked.write_text("eve\nmallory\n")
        gateway.check_revocations()
        rest = await reader.to_end()
    assert [b.event for b in rest] == ["close"]
    assert rest[0].json["code"] == 4403


async def test_revoked_token_ends_a_busy_stream(mem: Web, tmp_path: Any) -> None:
    gateway, revoked = await revocation_gateway(mem, tmp_path)
    thread = new_thread()
    url = base(gateway) + f"/threads/{thread}/events"
    token = encode_token(SECRET, "mallory", subscribe=["*"])

    async def busy() -> None:
        await gateway.hub.publish(
            thread, [{"type": "RUN_STARTED", "threadId": thread, "runId": "r"}]
        )
        for n in range(1000):
            await gateway.hub.publish(thread, [{"type": "CUSTOM", "name": "tick", "value": n}])
            await asyncio.sleep(0.05)

    ticker = asyncio.create_task(busy())
    try:
        async with sse(mem.http, url, headers=bearer(token)) as reader:
            await reader.until(is_event("CUSTOM"))
            revoked.write_text("mallory\n")
            gateway.check_revocations()  # "call it after changing a file to act at once"
            # A WebSocket of a revoked token is closed (4403) at once; the stream of one
            # must end too, and not only once the thread is quiet for KEEPALIVE_SECONDS.
            after: list[Block] = []
            deadline = time.monotonic() + 3
            with contextlib.suppress(TimeoutError):
                while (
                    block := await reader.next(max(0.01, deadline - time.monotonic()))
                ) is not None:
                    after.append(block)
                    if block.event == "close" or time.monotonic() > deadline:
                        break
        closes = [b for b in after if b.event == "close"]
        delivered = sum(b.event is None and b.data is not None for b in after)
        assert closes, (
            f"the stream of a revoked token went on: {delivered} events in 3 s after "
            "check_revocations()"
        )
        assert closes[0].json["code"] == 4403
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


async def test_store_unavailable(own_redis: RedisServer, agent: UpstreamAgent) -> None:
    prefix = f"test-web-{uuid.uuid4().hex}"
    web = Web(agent, lambda: RedisStore(own_redis.url, prefix=prefix))
    try:
        gateway = await web.gateway()
        thread = new_thread()
        response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
        assert response.status_code == 200
        own_redis.stop()
        response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(new_thread()))
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "store_unavailable"
        assert response.headers["retry-after"] == "5"
        async with sse(web.http, base(gateway) + f"/threads/{new_thread()}/events") as reader:
            rest = [b for b in await reader.to_end() if b.data is not None]
        assert [b.event for b in rest] == ["hub-error"]
        assert rest[0].json["code"] == "store_unavailable"
        await assert_serving(web.http, gateway)
        assert not gateway.bridge.runs and not http_app(gateway).per_address
        own_redis.start()
        again = new_thread()
        response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(again))
        assert response.status_code == 200
        assert events_of(parse_blocks(response.content))[-1]["type"] == "RUN_FINISHED"
    finally:
        await web.close()


# -- a browser: CORS with the token in a cookie -----------------------------------------------


@contextlib.asynccontextmanager
async def page_server() -> AsyncIterator[str]:
    """A loopback server of one blank page: the origin of a browser app; yields its URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            body = b"<!doctype html><title>app</title>"
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


EVENT_SOURCE_JS = """([url, withCredentials]) => new Promise((resolve) => {
  const source = new EventSource(url, {withCredentials});
  const got = [];
  const done = (outcome) => { source.close(); resolve({outcome, got}); };
  source.addEventListener("subscribed", () => got.push("subscribed"));
  source.onmessage = (e) => { got.push(JSON.parse(e.data).type); done("message"); };
  source.onerror = () => done("error");
  setTimeout(() => done("timeout"), 5000);
})"""

FETCH_JS = """async ([url, body]) => {
  try {
    const response = await fetch(url, {method: "POST", credentials: "include",
      headers: {"Content-Type": "application/json", "Accept": "text/event-stream"},
      body: JSON.stringify(body)});
    return {status: response.status, text: await response.text()};
  } catch (error) { return {error: String(error)}; }
}"""


async def test_browser_with_the_token_in_a_cookie(mem: Web) -> None:
    from ..nodejs import CHROMIUM_ARGS, chromium

    executable = chromium()  # skips (fails under CI) without Chromium and playwright
    from playwright.async_api import async_playwright

    async with page_server() as app:
        gateway = await mem.gateway(
            jwt_secret=SECRET, jwt_cookie="agui_token", allowed_origins=app
        )  # fmt: skip
        thread = new_thread()
        token = encode_token(SECRET, "carol", subscribe=["*"], publish=["*"], run=["ok"])
        hub = base(gateway)
        response = await mem.http.post(hub + "/agents/ok", json=run_input(thread),
                                       headers=bearer(token))  # fmt: skip
        assert response.status_code == 200
        url = hub + f"/threads/{thread}/events"
        # The gateway takes the cookie (here sent by hand, from the allowed origin).
        by_hand = {"Origin": app, "Cookie": f"agui_token={token}"}
        async with sse(mem.http, url, headers=by_hand) as reader:
            await reader.until(is_event("RUN_FINISHED"))
            assert reader.response.headers["access-control-allow-origin"] == app
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=executable, args=CHROMIUM_ARGS
            )
            try:
                context = await browser.new_context()
                await context.add_cookies(
                    [{"name": "agui_token", "value": token, "url": hub, "sameSite": "Lax"}]
                )
                page = await context.new_page()
                console: list[str] = []
                page.on("console", lambda message: console.append(message.text))
                await page.goto(app + "/")
                # The token in the query: an EventSource from the allowed origin reads.
                got = await page.evaluate(EVENT_SOURCE_JS, [f"{url}?access_token={token}", False])
                assert got == {"outcome": "message", "got": ["subscribed", "RUN_STARTED"]}
                # The token in the cookie (docs/bridge.md: "or in the --jwt-cookie cookie"):
                # a cross-origin request with credentials is readable only with
                # Access-Control-Allow-Credentials: true.
                got = await page.evaluate(EVENT_SOURCE_JS, [url, True])
                assert got == {"outcome": "message", "got": ["subscribed", "RUN_STARTED"]}, (
                    f"an EventSource withCredentials cannot read the stream: {console}"
                )
                posted = await page.evaluate(FETCH_JS, [hub + "/agents/ok", run_input(thread)])
                assert posted.get("status") == 200, (posted, console)
            finally:
                await browser.close()


# -- 10. regressions: resuming a live join, what a POST costs before its body, addresses ---------


def published(thread: str, run_id: str, ticks: int = 2) -> list[Event]:
    """A small run of another producer: RUN_STARTED, *ticks* CUSTOM events, RUN_FINISHED."""
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
        *({"type": "CUSTOM", "name": "tick", "value": n} for n in range(ticks)),
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id},
    ]


@pytest.mark.parametrize("history", [True, False], ids=["with_history", "empty_thread"])
async def test_get_live_subscribed_carries_the_join_offset(web: Web, history: bool) -> None:
    # An EventSource opened from=live and cut before the first event resumes with the
    # id of the "subscribed" event: it must name where the live join began, so that the
    # events stored meanwhile are delivered, none lost and none repeated.
    gateway = await web.gateway()
    thread = new_thread()
    if history:
        await gateway.hub.publish(thread, published(thread, "run-0"))
    before = await stored(gateway, thread)
    url = base(gateway) + f"/threads/{thread}/events"
    async with sse(web.http, url + "?from=live") as reader:
        (*_, subscribed) = await reader.until(lambda b: b.event == "subscribed")
    assert subscribed.id is not None, f"the live join's subscribed has no id: {subscribed}"
    assert subscribed.id == subscribed.json["offset"]
    if history:
        assert subscribed.id == before[-1][0]  # the head when it joined
    # Cut; the thread goes on; the client comes back with that id.
    more = published(thread, "run-1", ticks=3)
    await gateway.hub.publish(thread, more)
    now = await stored(gateway, thread)
    assert len(now) == len(before) + len(more)
    async with sse(web.http, url, headers={"Last-Event-ID": subscribed.id}) as reader:
        blocks = await reader.until(has_id(now[-1][0]))
    assert blocks[1].event == "subscribed" and blocks[1].json["recovered"] is True
    transcript = sse_event_transcript(blocks)
    assert transcript == now[len(before) :], "lost or repeated events across the resume"
    assert [e for _, e in transcript] == more


async def test_get_subscribed_has_no_id_unless_joined_live(web: Web) -> None:
    # After "start", a snapshot or a resume, the subscribed reply's offset is the head
    # with history (or a snapshot) still to come: an id there would skip that history
    # for a client cut off before it.
    gateway = await web.gateway()
    thread = new_thread()
    await gateway.hub.publish(thread, published(thread, "run-0"))
    history = await stored(gateway, thread)
    url = base(gateway) + f"/threads/{thread}/events"
    for query, headers in (
        ("", {}),
        ("?from=start", {}),
        ("?from=snapshot", {}),
        ("", {"Last-Event-ID": history[0][0]}),
        (f"?lastEventId={history[1][0]}", {}),
    ):
        async with sse(web.http, url + query, headers=headers) as reader:
            blocks = await reader.until(has_id(history[-1][0]))
        (subscribed,) = [b for b in blocks if b.event == "subscribed"]
        assert subscribed.json["offset"] == history[-1][0]
        assert subscribed.id is None, (query, headers, subscribed)


class RawPost:
    """A POST over a raw socket that sends its head and only part of its body."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(
        cls,
        port: int,
        path: str,
        length: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
    ) -> RawPost:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n".encode()
            + body
        )
        await writer.drain()
        return cls(reader, writer)

    async def response(self, timeout: float = WAIT) -> tuple[int, dict[str, str], Any]:
        """The answer: (status, headers with lower-case names, JSON body)."""
        async with asyncio.timeout(timeout):
            head = await self.reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await self.reader.readexactly(int(headers["content-length"]))
        return int(status_line.split(" ")[1]), headers, json.loads(body)

    async def silent(self, wait: float) -> bool:
        """Whether nothing (no byte, no end) comes back within *wait* seconds."""
        try:
            async with asyncio.timeout(wait):
                await self.reader.read(1)
        except TimeoutError:
            return True
        return False

    def close(self) -> None:
        self.writer.close()


async def test_post_bodies_in_flight_are_bounded(mem: Web) -> None:
    limit = 1000
    gateway = await mem.gateway(max_input_bytes=limit, max_connections_per_address=100)
    app = http_app(gateway)
    port = gateway.config.http_port or 0
    part = b"x" * 900
    stalled: list[RawPost] = []
    try:
        # Four bodies of 1000 bytes, 900 of them sent, then nothing: 3600 bytes held.
        for n in range(1, 5):
            stalled.append(await RawPost.open(port, "/agents/ok", limit, part))
            await wait_until(lambda n=n: app.body_bytes == n * len(part), f"body {n} read")
        # A fifth would hold 4500 bytes, over 4 x max_input_bytes: refused at once.
        for _ in range(2):
            extra = await RawPost.open(port, "/agents/ok", limit, part)
            try:
                status, headers, answer = await extra.response()
            finally:
                extra.close()
            assert status == 503, answer
            assert answer["error"]["code"] == "too_busy"
            assert int(headers["retry-after"]) >= 1
            assert app.body_bytes == 4 * len(part)
        # The four stalled ones are still waiting for their bodies, unanswered.
        assert all(await asyncio.gather(*(post.silent(0.2) for post in stalled)))
        await assert_serving(mem.http, gateway)
    finally:
        for post in stalled:
            post.close()
    await wait_until(lambda: app.body_bytes == 0, "the stalled bodies to be released")
    await wait_until(lambda: not app.per_address, "their places to be released")
    thread = new_thread()
    response = await mem.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200, response.text
    assert events_of(parse_blocks(response.content))[-1]["type"] == "RUN_FINISHED"
    assert gateway.bridge.started_total == 1


async def test_post_is_refused_before_its_body_is_read(mem: Web) -> None:
    # A caller that may not run the agent, or an address over its limit, is answered
    # at once: the gateway does not wait for (nor buffer) a body it will refuse.
    quick = 2 * TIMEOUT_SCALE
    guarded = await mem.gateway(jwt_secret=SECRET, max_input_bytes=1 << 20)
    token = encode_token(SECRET, "alice", publish=["*"], subscribe=["*"], run=["slow"])
    post = await RawPost.open(
        guarded.config.http_port or 0, "/agents/ok", 1 << 20, headers=bearer(token)
    )
    try:
        status, _, answer = await post.response(quick)
    finally:
        post.close()
    assert status == 403 and answer["error"]["code"] == "forbidden", answer
    assert "'ok'" in answer["error"]["message"]
    assert http_app(guarded).body_bytes == 0

    limited = await mem.gateway(max_connections_per_address=1)
    url = base(limited) + f"/threads/{new_thread()}/events"
    async with sse(mem.http, url) as reader:
        await reader.until(lambda b: b.event == "subscribed")
        post = await RawPost.open(limited.config.http_port or 0, "/agents/ok", 1 << 20)
        try:
            status, headers, answer = await post.response(quick)
        finally:
            post.close()
    assert status == 429 and answer["error"]["code"] == "too_many_streams", answer
    assert headers["retry-after"] == "5"
    assert http_app(limited).body_bytes == 0


async def test_x_forwarded_for_does_not_choose_the_address(mem: Web) -> None:
    # The per-address limit counts the socket's address: a client cannot pick another
    # by sending X-Forwarded-For (uvicorn's proxy headers are off).
    gateway = await mem.gateway(max_connections_per_address=1)
    app = http_app(gateway)
    url = base(gateway) + f"/threads/{new_thread()}/events"
    async with sse(mem.http, url, headers={"X-Forwarded-For": "203.0.113.7"}) as reader:
        await reader.until(lambda b: b.event == "subscribed")
        assert dict(app.per_address) == {"127.0.0.1": 1}
        for forwarded in ("198.51.100.9", "203.0.113.7", "198.51.100.9, 127.0.0.1"):
            response = await mem.http.get(url, headers={"X-Forwarded-For": forwarded})
            assert response.status_code == 429, (forwarded, response.text)
            assert response.json()["error"]["code"] == "too_many_streams"
        assert dict(app.per_address) == {"127.0.0.1": 1}


async def test_deeply_nested_body_is_a_bad_request(
    mem: Web, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await mem.gateway()
    url = base(gateway) + "/agents/ok"
    depth = 100_000
    with caplog.at_level("INFO"):
        for body in (
            b"[" * depth,
            b"[" * depth + b"]" * depth,
            b'{"a":' * depth + b"1" + b"}" * depth,
        ):
            response = await mem.http.post(
                url, content=body, headers={"Content-Type": "application/json"}
            )
            assert response.status_code == 400, response.text[:200]
            assert response.json()["error"]["code"] == "bad_request"
            assert "not JSON" in response.json()["error"]["message"]
            await assert_serving(mem.http, gateway)
    errors = [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not errors, [r.getMessage()[:200] for r in errors]
    assert gateway.bridge.started_total == 0
    response = await mem.http.post(url, json=run_input(new_thread()))
    assert response.status_code == 200
    assert events_of(parse_blocks(response.content))[-1]["type"] == "RUN_FINISHED"


async def test_the_listener_takes_its_share_of_the_open_file_limit(
    mem: Web, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under an open-file limit of 300 (as the gateway reads it at start), the HTTP
    # listener's connections are fitted with the WebSocket ones, the backlogs and the
    # upstream runs: past its share it answers 503 instead of running out of descriptors.
    limit, max_runs = 300, 4
    monkeypatch.setattr(server_module, "open_file_limit", lambda: limit)
    gateway = await mem.gateway(max_runs=max_runs, max_connections_per_address=1000)
    share = gateway.http_connections
    assert gateway.http is not None and gateway.http.server is not None
    assert gateway.http.server.config.limit_concurrency == share
    assert 1 <= share < gateway.config.max_connections
    # WebSocket and HTTP clients, both backlogs, the runs' upstream sockets and the
    # reserve all fit under the limit together.
    assert (
        gateway.max_connections + HANDSHAKE_HEADROOM + share + FD_RESERVE
        + 3 * gateway.backlog + max_runs + UPSTREAM_KEEPALIVE
    ) <= limit  # fmt: skip
    port = gateway.config.http_port or 0
    streams: list[asyncio.StreamWriter] = []
    refused = None
    try:
        for n in range(share + 10):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            streams.append(writer)
            writer.write(f"GET /threads/fd-{n}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), WAIT)
            if b" 200 " not in status:
                refused = (n, status)
                break
        assert refused is not None, f"{len(streams)} streams taken, over the share {share}"
        served, status = refused
        assert status.startswith(b"HTTP/1.1 503"), status
        # uvicorn counts the refused connection itself against its limit.
        assert share - 1 <= served <= share, (served, share)
    finally:
        for writer in streams:
            writer.close()
    await wait_until(lambda: not http_app(gateway).streams, "the streams to be released")
    await assert_serving(mem.http, gateway)


async def test_a_plain_stream_holds_ag_ui_events_only(web: Web) -> None:
    """?plain=1: every data line is an AG-UI event (for tools that read every
    data: as one); what the named events said is in id: lines and comments,
    so a resume still works."""
    gateway = await web.gateway()
    thread = new_thread()
    response = await web.http.post(base(gateway) + "/agents/ok", json=run_input(thread))
    assert response.status_code == 200
    history = await stored(gateway, thread)
    head = history[-1][0]
    url = base(gateway) + f"/threads/{thread}/events?plain=1"

    async with sse(web.http, url) as reader:
        blocks = await reader.until(has_id(head))
    assert all(b.event is None for b in blocks)
    assert sse_event_transcript(blocks) == history
    assert b": subscribed {" in reader.raw  # what the named event said, as a comment

    async with sse(web.http, url + "&from=snapshot") as reader:
        blocks = await reader.until(lambda b: b.id is not None)
    assert blocks[0].retry == 1000 and blocks[0].data is None
    blocks = blocks[1:]
    assert all(b.event is None and b.data is not None for b in blocks) and blocks[-1].id == head
    want = fold([e for _, e in history])
    got = fold([b.json for b in blocks])
    assert (got.messages, got.state) == (want.messages, want.state)

    async with sse(web.http, url + "&from=live") as reader:
        # The live join's offset comes as an id alone, with no data: a client's
        # last event id, whatever it reads.
        first = await reader.until(lambda b: b.id is not None)
        assert [(b.id, b.data, b.event) for b in first[1:]] == [(head, None, None)]
        more = run_input(thread, [user("u9", "again")])
        response = await web.http.post(base(gateway) + "/agents/ok", json=more)
        assert response.status_code == 200
        live = await reader.until(is_event("RUN_FINISHED"))
    assert all(b.event is None and b.data is not None for b in live)
    assert sse_event_transcript(live) == (await stored(gateway, thread))[len(history) :]

    # Draining: the close is a comment, then the stream ends (EventSource reconnects).
    async with sse(web.http, url + "&from=live") as reader:
        await reader.until(lambda b: b.id is not None)
        await gateway.drain()
        rest = await reader.to_end()
    assert all(b.event is None for b in rest)
    assert b": close {" in reader.raw and b"1012" in reader.raw
