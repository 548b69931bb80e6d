"""The ``run`` and ``cancel`` WebSocket commands (docs/bridge.md), through a real gateway.

Every test starts in-process :class:`Gateway` objects on free loopback ports with
upstream agents configured (``GatewayConfig(agents=...)``), pointing at the real
upstream agent of tests/upstream_agent.py served over HTTP in this process. The
commands go over real WebSocket connections: :meth:`HubClient.run` and
:meth:`HubClient.cancel`, and plain ``websockets`` connections speaking the JSON
subprotocol for the exact frames. What the agent received (``agent.inputs``) and
what the threads hold are checked against the agent's own script
(:func:`~tests.upstream_agent.ok_events`), on the memory store and on a real Redis.

Covered: the ``running`` and ``cancelled`` replies (ids echoed, ``parentRunId`` of a
second run); malformed ``run`` commands (``bad_command``, the connection goes on);
messages that are not AG-UI (``invalid_event``, nothing sent upstream); the run grant
of JWT identities (``forbidden`` without it, per agent pattern, publish needed on the
thread, also to cancel; the ``authenticated`` reply lists it); a cancel from another
connection, and from another gateway on the same Redis (``no_active_run``: runs
belong to the gateway that started them); two viewers of one bridged run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from agui_hub.client.hub_client import HubClient, Subscribed, Subscription, ThreadEvent
from agui_hub.errors import CommandRejected, InvalidEvent
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..upstream_agent import UpstreamAgent, ok_events, ok_transcript_text, serve_agent

pytestmark = pytest.mark.timeout(60)

JSON = "agui-hub.v1.json"
WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing to arrive."""
SECRET = "bridge-commands-test-secret-0123456789-abcdef"
"""The HS256 secret of the JWT gateways (32 bytes or more)."""
TERMINAL = ("RUN_FINISHED", "RUN_ERROR")
REPLIES = {"running", "cancelled", "error", "pong", "subscribed", "authenticated", "published"}

Event = dict[str, Any]
Frame = dict[str, Any]


# -- the upstream agent and what it sends ---------------------------------------------------


@pytest.fixture(scope="module")
def agent() -> Iterator[UpstreamAgent]:
    """One upstream agent for the module; tests tell their inputs apart by thread."""
    with serve_agent() as served:
        yield served


def agents_of(agent: UpstreamAgent) -> str:
    """The gateways' ``agents`` setting: every name the tests run."""
    return ",".join(
        [
            f"ok={agent.url('ok')}",
            # Paced: viewers follow it live, event by event.
            f"paced={agent.url('ok', deltas=12, delay=0.01)}",
            # Long enough (40 s) that only a cancel or a drain ends it within a test.
            f"slow={agent.url('slow', count=2000, delay=0.02)}",
            f"team-a={agent.url('ok')}",
        ]
    )


def wire(run_input: dict[str, Any], deltas: int = 5) -> list[Event]:
    """The events the ``ok`` behaviour sends for *run_input*, as wire dicts."""
    return [
        e.model_dump(mode="json", by_alias=True, exclude_none=True)
        for e in ok_events(run_input, deltas)
    ]


def user(text: str, message_id: str | None = None) -> dict[str, Any]:
    return {"id": message_id or f"u-{uuid.uuid4().hex[:8]}", "role": "user", "content": text}


def inputs_of(agent: UpstreamAgent, thread: str) -> list[dict[str, Any]]:
    """The RunAgentInputs the agent received for *thread*, in order."""
    return [i for i in list(agent.inputs) if i.get("threadId") == thread]


async def input_of(agent: UpstreamAgent, run_id: str) -> dict[str, Any]:
    """The RunAgentInput of run *run_id* (waiting for it to arrive, without blocking the
    event loop that the gateways run on)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = [i for i in list(agent.inputs) if i.get("runId") == run_id]
        if found:
            assert len(found) == 1, f"run {run_id} was POSTed {len(found)} times"
            return found[0]
        await asyncio.sleep(0.01)
    raise AssertionError(f"the agent never received run {run_id}")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# -- clients ---------------------------------------------------------------------------------


class Raw:
    """A plain ``websockets`` connection speaking the JSON subprotocol: exact frames."""

    def __init__(self, ws: ClientConnection) -> None:
        assert ws.subprotocol == JSON
        self.ws = ws
        self.pending: deque[Frame] = deque()
        """Frames read while waiting for a reply, in arrival order."""
        self._ids = itertools.count(1)

    async def send(self, frame: Any) -> None:
        await self.ws.send(json.dumps(frame))

    async def _read(self, timeout: float) -> Frame:
        data = await asyncio.wait_for(self.ws.recv(), timeout)
        assert isinstance(data, str), "a JSON connection got a binary frame"
        frame = json.loads(data)
        assert isinstance(frame, dict) and isinstance(frame.get("type"), str), frame
        return frame

    async def recv(self, timeout: float = WAIT) -> Frame:
        if self.pending:
            return self.pending.popleft()
        return await self._read(timeout)

    async def request(self, frame: Frame, timeout: float = WAIT) -> Frame:
        """Send a command (an id is added unless it has one); its reply. Other frames
        stay pending, in order."""
        command_id = frame.setdefault("id", f"c{next(self._ids)}")
        await self.send(frame)
        deadline = time.monotonic() + timeout
        while True:
            seen = await self._read(max(0.01, deadline - time.monotonic()))
            if seen.get("id") == command_id and seen["type"] in REPLIES:
                return seen
            self.pending.append(seen)

    async def ping(self) -> None:
        reply = await self.request({"type": "ping"})
        assert reply["type"] == "pong", reply

    async def events_until_end(self, thread: str) -> list[tuple[str, Event]]:
        """(offset, event) of *thread*'s event frames up to its next RUN_FINISHED/RUN_ERROR."""
        deadline = time.monotonic() + WAIT
        got: list[tuple[str, Event]] = []
        while True:
            frame = await self.recv(max(0.01, deadline - time.monotonic()))
            if frame["type"] == "event" and frame["thread"] == thread:
                got.append((frame["offset"], frame["event"]))
                if frame["event"]["type"] in TERMINAL:
                    return got

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 3)


async def until_end(sub: Subscription) -> list[tuple[str, Event]]:
    """(offset, event) of the subscription up to the next RUN_FINISHED or RUN_ERROR."""

    async def read() -> list[tuple[str, Event]]:
        got: list[tuple[str, Event]] = []
        async for item in sub:
            if isinstance(item, ThreadEvent):
                got.append((item.offset, item.event))
                if item.event["type"] in TERMINAL:
                    return got
        raise AssertionError(f"the subscription ended before the run did: {got[-3:]}")

    return await asyncio.wait_for(read(), WAIT)


async def subscribed(sub: Subscription) -> Subscribed:
    """Open *sub* and return its first Subscribed item (the subscription is confirmed)."""

    async def read() -> Subscribed:
        async for item in sub:
            if isinstance(item, Subscribed):
                return item
        raise AssertionError("the subscription ended before it was confirmed")

    await sub.open()
    return await asyncio.wait_for(read(), WAIT)


async def next_event(sub: Subscription) -> Event:
    """The subscription's next event."""

    async def read() -> Event:
        async for item in sub:
            if isinstance(item, ThreadEvent):
                return item.event
        raise AssertionError("the subscription ended")

    return await asyncio.wait_for(read(), WAIT)


class Env:
    """Gateways (on one store: memory, or a Redis prefix of this test) and clients of
    one test, all closed at its end."""

    def __init__(self, kind: str, agent: UpstreamAgent, redis: RedisServer | None) -> None:
        self.kind = kind
        self.agent = agent
        self.redis = redis
        self.prefix = unique("bridge-commands")
        self.gateways: list[Gateway] = []
        self.clients: list[HubClient] = []
        self.raws: list[Raw] = []

    def store(self) -> ThreadStore:
        if self.redis is None:
            return MemoryStore()
        return RedisStore(self.redis.url, prefix=self.prefix)

    async def gateway(self, **config: Any) -> Gateway:
        """A started gateway on a free port with the module's agents; another one on the
        same Redis prefix (the same store) when called again on Redis."""
        config.setdefault("ping_interval", None)
        config.setdefault("agents", agents_of(self.agent))
        gateway = Gateway(GatewayConfig(host="127.0.0.1", port=0, **config), store=self.store())
        await gateway.start()
        self.gateways.append(gateway)
        return gateway

    async def client(
        self, gateway: Gateway, *, encoding: str = "msgpack", token: str | None = None
    ) -> HubClient:
        client = HubClient(
            f"ws://127.0.0.1:{gateway.config.port}",
            encoding=encoding,
            token=token,
            open_timeout=WAIT,
        )
        self.clients.append(client)
        await asyncio.wait_for(client.connect(), WAIT)
        return client

    async def raw(self, gateway: Gateway, token: str | None = None) -> Raw:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        ws = await connect(
            f"ws://127.0.0.1:{gateway.config.port}",
            subprotocols=[JSON],  # type: ignore[list-item]
            additional_headers=headers,
            proxy=None,
            open_timeout=WAIT,
            close_timeout=2,
        )
        raw = Raw(ws)
        self.raws.append(raw)
        return raw

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5)
        await asyncio.gather(*(raw.close() for raw in self.raws))
        for gateway in self.gateways:
            if not gateway._draining:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(gateway.drain(), 15)


@pytest.fixture(params=["memory", "redis"])
async def env(request: pytest.FixtureRequest, agent: UpstreamAgent) -> AsyncIterator[Env]:
    """Gateways on the memory store, or on the session Redis under a prefix of this test."""
    redis = request.getfixturevalue("redis_server") if request.param == "redis" else None
    environment = Env(request.param, agent, redis)
    try:
        yield environment
    finally:
        await environment.close()


@pytest.fixture
async def mem(agent: UpstreamAgent) -> AsyncIterator[Env]:
    """Gateways on the memory store only (for what does not depend on the store)."""
    environment = Env("memory", agent, None)
    try:
        yield environment
    finally:
        await environment.close()


@pytest.fixture
async def on_redis(agent: UpstreamAgent, redis_server: RedisServer) -> AsyncIterator[Env]:
    """Gateways sharing the session Redis under a prefix of this test."""
    environment = Env("redis", agent, redis_server)
    try:
        yield environment
    finally:
        await environment.close()


def token(subject: str, **grants: list[str]) -> str:
    return encode_token(SECRET, subject, **grants)  # type: ignore[arg-type]


# -- 1. run replies and the run's events ------------------------------------------------------


async def test_run_replies_running_and_the_next_run_names_its_parent(
    env: Env, agent: UpstreamAgent
) -> None:
    gateway = await env.gateway()
    client = await env.client(gateway)
    thread = unique("replies")
    first = user("hello", "m-hello")
    async with client.subscribe(thread, "live") as sub:
        await subscribed(sub)
        reply = await client.run(thread, "ok", messages=[first])
        run_id = reply["runId"]
        assert isinstance(run_id, str) and run_id
        assert reply == {
            "type": "running",
            "id": reply["id"],
            "thread": thread,
            "agent": "ok",
            "runId": run_id,
            "status": "starting",
        }
        events = [e for _, e in await until_end(sub)]

        sent = await input_of(agent, run_id)
        assert sent["threadId"] == thread
        assert sent["messages"] == [first]
        assert "parentRunId" not in sent
        expected = wire(sent)
        # The agent's events as it sent them; its RUN_STARTED (which has no input)
        # stored with the new user message, so that the thread remembers it.
        assert events[1:] == expected[1:]
        assert events[0] == {
            **expected[0],
            "input": {"threadId": thread, "runId": run_id, "messages": [first]},
        }
        assert events[-1]["type"] == "RUN_FINISHED"

        second = user("and again", "m-again")
        second_id = unique("second-run")
        reply2 = await client.run(thread, "ok", messages=[second], run_id=second_id)
        assert reply2 == {
            "type": "running",
            "id": reply2["id"],
            "thread": thread,
            "agent": "ok",
            "runId": second_id,
            "status": "starting",
            "parentRunId": run_id,
        }
        assert reply2["id"] != reply["id"]
        events2 = [e for _, e in await until_end(sub)]

    sent2 = await input_of(agent, second_id)
    assert sent2["parentRunId"] == run_id
    messages = sent2["messages"]
    assert messages[0] == first and messages[-1] == second
    # The thread's history as the hub folded it: the first run's answer is in it.
    answers = [m for m in messages if m["role"] == "assistant"]
    assert [m["content"] for m in answers] == [ok_transcript_text([first])]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["42"]
    assert events2[0]["parentRunId"] == run_id
    assert events2[0]["input"]["messages"] == [second]
    assert events2[1:] == wire(sent2)[1:]
    assert inputs_of(agent, thread) == [sent, sent2]


async def test_raw_json_frames_of_run_echo_the_command_ids(mem: Env, agent: UpstreamAgent) -> None:
    gateway = await mem.gateway()
    raw = await mem.raw(gateway)
    thread = unique("raw")
    reply = await raw.request({"type": "subscribe", "thread": thread, "from": "live"})
    assert reply["type"] == "subscribed", reply
    message = user("raw hello")

    reply = await raw.request(
        {"type": "run", "id": "cmd-7", "thread": thread, "agent": "ok", "messages": [message]}
    )
    run_id = reply.get("runId")
    assert isinstance(run_id, str) and run_id, reply
    assert reply == {
        "type": "running",
        "id": "cmd-7",
        "thread": thread,
        "agent": "ok",
        "runId": run_id,
        "status": "starting",
    }
    got = await raw.events_until_end(thread)
    sent = await input_of(agent, run_id)
    assert [e for _, e in got][1:] == wire(sent)[1:]
    assert len({o for o, _ in got}) == len(got)

    # A number as the id, and the fields a client may add.
    second_id = unique("raw-second")
    reply = await raw.request(
        {
            "type": "run",
            "id": 123456789,
            "thread": thread,
            "agent": "ok",
            "messages": [user("second")],
            "runId": second_id,
            "state": {"turn": 41, "items": ["given"]},
            "tools": [{"name": "lookup", "description": "look it up", "parameters": {}}],
            "context": [{"description": "where", "value": "a test"}],
            "forwardedProps": {"temperature": 0},
        }
    )
    assert reply == {
        "type": "running",
        "id": 123456789,
        "thread": thread,
        "agent": "ok",
        "runId": second_id,
        "status": "starting",
        "parentRunId": run_id,
    }
    assert (await raw.events_until_end(thread))[-1][1]["type"] == "RUN_FINISHED"
    sent = await input_of(agent, second_id)
    assert sent["state"] == {"turn": 41, "items": ["given"]}
    assert sent["tools"] == [{"name": "lookup", "description": "look it up", "parameters": {}}]
    assert sent["context"] == [{"description": "where", "value": "a test"}]
    assert sent["forwardedProps"] == {"temperature": 0}

    # A cancel with nothing going: answered, with its id, and the connection goes on.
    reply = await raw.request({"type": "cancel", "id": 77, "thread": thread})
    assert reply["type"] == "error" and reply["id"] == 77, reply
    assert reply["code"] == "no_active_run" and reply["thread"] == thread, reply
    await raw.ping()


MALFORMED_RUNS: list[tuple[str, dict[str, Any]]] = [
    ("no agent", {"agent": None}),
    ("agent not a string", {"agent": 7}),
    ("agent empty", {"agent": ""}),
    ("agent too long", {"agent": "a" * 65}),
    ("messages not a list", {"messages": "hello"}),
    ("messages an object", {"messages": {"id": "m", "role": "user", "content": "hi"}}),
    ("1001 messages", {"messages": [user(f"m{i}", f"m{i}") for i in range(1001)]}),
    ("tools not a list", {"tools": {"name": "x"}}),
    ("context not a list", {"context": "ctx"}),
    ("runId too long", {"runId": "r" * 257}),
    ("runId empty", {"runId": ""}),
    ("runId not a string", {"runId": 5}),
    ("thread missing", {"thread": None}),
    ("thread not a string", {"thread": 42}),
    ("thread empty", {"thread": ""}),
    ("thread with whitespace", {"thread": " padded "}),
    ("thread with a control character", {"thread": "a\nb"}),
    ("thread too long", {"thread": "t" * 257}),
]


async def test_malformed_run_commands_are_bad_command_and_the_connection_goes_on(
    mem: Env, agent: UpstreamAgent
) -> None:
    gateway = await mem.gateway()
    raw = await mem.raw(gateway)
    thread = unique("malformed")
    before = len(agent.inputs)
    for index, (case, fields) in enumerate(MALFORMED_RUNS):
        frame: Frame = {"type": "run", "id": f"bad-{index}", "thread": thread, "agent": "ok"}
        frame.update(fields)
        for key in [k for k, v in frame.items() if v is None]:
            del frame[key]
        reply = await raw.request(frame)
        assert reply["type"] == "error", (case, reply)
        assert reply["id"] == f"bad-{index}", (case, reply)
        assert reply["code"] == "bad_command", (case, reply)
        assert isinstance(reply["message"], str) and reply["message"], (case, reply)
        await raw.ping()
    cancels: list[dict[str, Any]] = [{}, {"thread": 3}, {"runId": "x" * 257}]
    for index, fields in enumerate(cancels):
        frame = {"type": "cancel", "id": f"bad-cancel-{index}", "thread": thread, **fields}
        if not fields:
            del frame["thread"]
        reply = await raw.request(frame)
        assert (reply["type"], reply["code"], reply["id"]) == (
            "error",
            "bad_command",
            f"bad-cancel-{index}",
        ), reply
    assert len(agent.inputs) == before, "a malformed run reached the agent"
    assert gateway.bridge.runs == {}

    # 1000 messages is the limit, not past it; and the connection still runs agents.
    many = [user(f"m{i}", f"many-{i}") for i in range(1000)]
    reply = await raw.request({"type": "run", "thread": thread, "agent": "ok", "messages": many})
    assert reply["type"] == "running", reply
    assert len((await input_of(agent, reply["runId"]))["messages"]) == 1000


INVALID_MESSAGES: list[tuple[str, Any]] = [
    ("user without content", {"id": "m1", "role": "user"}),
    ("no id", {"role": "user", "content": "hi"}),
    ("unknown role", {"id": "m1", "role": "wizard", "content": "abracadabra"}),
    ("not an object", "hello"),
    ("tool message without toolCallId", {"id": "m1", "role": "tool", "content": "42"}),
]


@pytest.mark.parametrize("case", [c for c, _ in INVALID_MESSAGES])
async def test_a_message_that_is_not_agui_is_invalid_event_and_nothing_goes_upstream(
    env: Env, agent: UpstreamAgent, case: str
) -> None:
    bad = dict(INVALID_MESSAGES)[case]
    gateway = await env.gateway()
    raw = await env.raw(gateway)
    thread = unique("invalid")
    before = len(agent.inputs)
    reply = await raw.request(
        {
            "type": "run",
            "id": "r",
            "thread": thread,
            "agent": "ok",
            "messages": [user("fine"), bad],
        }
    )
    assert (reply["type"], reply["code"], reply["id"]) == ("error", "invalid_event", "r"), reply
    assert reply["thread"] == thread
    await raw.ping()
    assert len(agent.inputs) == before, "an invalid message was sent upstream"
    assert gateway.bridge.runs == {}

    # Nothing was stored, and the thread is not left reserved: a valid run goes.
    client = await env.client(gateway)
    async with client.subscribe(thread, "start") as sub:
        first = await subscribed(sub)
        assert (first.offset, first.epoch) == ("0-0", None)
        with pytest.raises(InvalidEvent):
            await client.run(thread, "ok", messages=[bad])
        reply = await client.run(thread, "ok", messages=[user("fine")])
        events = [e for _, e in await until_end(sub)]
    assert events[0]["type"] == "RUN_STARTED" and events[0]["runId"] == reply["runId"]
    assert events[-1]["type"] == "RUN_FINISHED"
    assert len(agent.inputs) == before + 1


# -- 2. grants -----------------------------------------------------------------------------------


async def test_run_needs_a_run_grant_for_the_agent_and_publish_on_the_thread(
    mem: Env, agent: UpstreamAgent
) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET)
    before = len(agent.inputs)

    async def refused(tok: str, thread: str, name: str) -> str:
        client = await mem.client(gateway, token=tok)
        with pytest.raises(CommandRejected) as caught:
            await client.run(thread, name, messages=[user("may I?")])
        assert caught.value.code == "forbidden", caught.value
        return str(caught.value)

    async def accepted(tok: str, thread: str, name: str) -> dict[str, Any]:
        client = await mem.client(gateway, token=tok)
        async with client.subscribe(thread, "live") as sub:
            await subscribed(sub)
            reply = await client.run(thread, name, messages=[user("please")])
            assert reply["type"] == "running" and reply["agent"] == name, reply
            events = [e for _, e in await until_end(sub)]
        assert events[-1]["type"] == "RUN_FINISHED", events[-1]
        return reply

    everything = {"subscribe": ["*"], "publish": ["*"]}
    # No run grant at all: may publish, may not run.
    message = await refused(token("alice", **everything), "alice-1", "ok")
    assert "ok" in message and "run" in message
    # A run grant for "ok" only.
    bob = token("bob", **everything, run=["ok"])
    message = await refused(bob, "bob-1", "slow")
    assert "slow" in message
    await accepted(bob, "bob-2", "ok")
    # A run grant for every agent, but publish only into mine-*.
    carol = token("carol", subscribe=["*"], publish=["mine-*"], run=["*"])
    message = await refused(carol, "theirs-1", "ok")
    assert "publish" in message and "theirs-1" in message
    await accepted(carol, "mine-1", "ok")
    # A prefix pattern.
    dave = token("dave", **everything, run=["team-*"])
    await accepted(dave, "dave-1", "team-a")
    await refused(dave, "dave-2", "ok")
    # The grant covers team-b, which is not configured: unknown_agent, naming the agents.
    client = await mem.client(gateway, token=dave)
    with pytest.raises(CommandRejected) as caught:
        await client.run("dave-3", "team-b")
    assert caught.value.code == "unknown_agent", caught.value
    assert "ok, paced, slow, team-a" in str(caught.value)

    # Only the accepted runs reached the agent.
    threads = [i["threadId"] for i in agent.inputs[before:]]
    assert sorted(threads) == ["bob-2", "dave-1", "mine-1"]


async def test_cancel_needs_publish_on_the_thread(mem: Env, agent: UpstreamAgent) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET)
    thread = unique("guarded")
    owner = await mem.client(
        gateway, token=token("eve", subscribe=["*"], publish=[thread], run=["slow"])
    )
    reader = await mem.client(gateway, token=token("mallory", subscribe=["*"], run=["*"]))
    helper = await mem.client(gateway, token=token("trent", publish=["guarded-*"]))
    disconnects = agent.disconnects
    async with owner.subscribe(thread, "live") as sub:
        await subscribed(sub)
        started = await owner.run(thread, "slow")
        assert (await next_event(sub))["type"] == "RUN_STARTED"

        with pytest.raises(CommandRejected) as caught:
            await reader.cancel(thread)
        assert caught.value.code == "forbidden", caught.value
        assert thread in str(caught.value)
        # Still going: more of the agent's events arrive.
        assert thread in gateway.bridge.runs
        for _ in range(3):
            assert (await next_event(sub))["type"].startswith("TEXT_MESSAGE")

        reply = await helper.cancel(thread)
        assert reply == {
            "type": "cancelled",
            "id": reply["id"],
            "thread": thread,
            "agent": "slow",
            "runId": started["runId"],
            "status": "ended",
        }
        events = [e for _, e in await until_end(sub)]
    end = events[-1]
    assert end["type"] == "RUN_ERROR" and end["code"] == "AGUI_HUB_RUN_CANCELLED", end
    assert "trent" in end["message"], end
    assert await asyncio.to_thread(agent.wait_disconnects, disconnects + 1, WAIT)
    assert gateway.bridge.runs == {}


async def test_the_authenticated_reply_lists_the_run_grant(mem: Env) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET)
    raw = await mem.raw(gateway, token("frank", subscribe=["*"], publish=["*"]))
    reply = await raw.request(
        {
            "type": "auth",
            "token": token("frank", subscribe=["*"], publish=["*"], run=["ok", "team-*"]),
        }
    )
    assert reply["type"] == "authenticated", reply
    assert reply["subject"] == "frank"
    assert reply["grants"] == {"subscribe": ["*"], "publish": ["*"], "run": ["ok", "team-*"]}
    thread = unique("auth")
    reply = await raw.request({"type": "subscribe", "thread": thread, "from": "live"})
    assert reply["type"] == "subscribed", reply
    reply = await raw.request({"type": "run", "thread": thread, "agent": "team-a"})
    assert reply["type"] == "running", reply
    assert (await raw.events_until_end(thread))[-1][1]["type"] == "RUN_FINISHED"

    # A token without the run grant: none listed, and runs are refused again.
    reply = await raw.request(
        {"type": "auth", "token": token("frank", subscribe=["*"], publish=["*"])}
    )
    assert reply["type"] == "authenticated", reply
    assert reply["grants"] == {"subscribe": ["*"], "publish": ["*"]}
    reply = await raw.request({"type": "run", "thread": unique("auth"), "agent": "ok"})
    assert (reply["type"], reply["code"]) == ("error", "forbidden"), reply


# -- 3. cancel ------------------------------------------------------------------------------------


async def test_cancel_from_another_connection_on_the_same_gateway(
    env: Env, agent: UpstreamAgent
) -> None:
    gateway = await env.gateway()
    starter = await env.client(gateway)
    canceller = await env.client(gateway, encoding="json")
    viewer = await env.client(gateway)
    thread = unique("cancel")
    disconnects = agent.disconnects
    async with viewer.subscribe(thread, "live") as sub:
        await subscribed(sub)
        run_id = unique("slow-run")
        started = await starter.run(thread, "slow", run_id=run_id)
        seen = [await next_event(sub) for _ in range(5)]
        assert [e["type"] for e in seen[:2]] == ["RUN_STARTED", "TEXT_MESSAGE_START"]

        # Another run id than the one going: not that run.
        with pytest.raises(CommandRejected) as caught:
            await canceller.cancel(thread, "some-other-run")
        assert caught.value.code == "no_active_run", caught.value
        assert thread in gateway.bridge.runs

        reply = await canceller.cancel(thread, run_id)
        assert reply == {
            "type": "cancelled",
            "id": reply["id"],
            "thread": thread,
            "agent": "slow",
            "runId": started["runId"],
            "status": "ended",
        }
        # The reply comes once the run has ended: nothing is going any more.
        assert gateway.bridge.runs == {}
        events = seen + [e for _, e in await until_end(sub)]
    assert await asyncio.to_thread(agent.wait_disconnects, disconnects + 1, WAIT), (
        "the upstream request stayed open"
    )
    deltas = [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]
    # Every delta the agent sent before the cancel, once, in order.
    assert deltas == [f"{i} " for i in range(len(deltas))]
    assert [e["type"] for e in events[:2]] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
    assert [e["type"] for e in events[2:-1]] == ["TEXT_MESSAGE_CONTENT"] * len(deltas)
    end = events[-1]
    assert end["type"] == "RUN_ERROR" and end["code"] == "AGUI_HUB_RUN_CANCELLED", end
    # A second cancel: there is nothing left to cancel.
    with pytest.raises(CommandRejected) as caught:
        await canceller.cancel(thread)
    assert caught.value.code == "no_active_run"


async def test_cancel_on_another_gateway_is_no_active_run(
    on_redis: Env, agent: UpstreamAgent
) -> None:
    first = await on_redis.gateway()
    second = await on_redis.gateway()
    starter = await on_redis.client(first)
    elsewhere = await on_redis.client(second)
    thread = unique("two-gateways")
    before = len(agent.inputs)
    async with elsewhere.subscribe(thread, "live") as sub:
        await subscribed(sub)
        started = await starter.run(thread, "slow")
        assert (await next_event(sub))["runId"] == started["runId"]

        with pytest.raises(CommandRejected) as caught:
            await elsewhere.cancel(thread)
        assert caught.value.code == "no_active_run", caught.value
        assert "gateway that started" in str(caught.value)
        # The run goes on, seen through the other gateway.
        for _ in range(3):
            assert (await next_event(sub))["type"].startswith("TEXT_MESSAGE")
        assert thread in first.bridge.runs
        # The other gateway knows from the thread's stored events that a run is going.
        with pytest.raises(CommandRejected) as caught:
            await elsewhere.run(thread, "ok", messages=[user("me too")])
        assert caught.value.code == "run_active", caught.value
        assert len(agent.inputs) == before + 1

        reply = await starter.cancel(thread)
        assert reply["type"] == "cancelled" and reply["runId"] == started["runId"]
        events = [e for _, e in await until_end(sub)]
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "AGUI_HUB_RUN_CANCELLED"
    assert first.bridge.runs == {} and second.bridge.runs == {}


# -- 4. viewers ------------------------------------------------------------------------------------


async def test_two_viewers_of_a_bridged_run_see_the_agents_script(
    env: Env, agent: UpstreamAgent
) -> None:
    gateway = await env.gateway()
    thread = unique("viewers")
    raw = await env.raw(gateway)
    reply = await raw.request({"type": "subscribe", "thread": thread, "from": "live"})
    assert reply["type"] == "subscribed", reply
    viewer = await env.client(gateway)
    runner = await env.client(gateway, encoding="json")
    message = user("what is the answer?")
    async with viewer.subscribe(thread, "live") as sub:
        await subscribed(sub)
        reply = await runner.run(thread, "paced", messages=[message])
        seen_by_client, seen_raw = await asyncio.gather(
            until_end(sub), raw.events_until_end(thread)
        )
    assert seen_by_client == seen_raw
    offsets = [o for o, _ in seen_raw]
    assert len(set(offsets)) == len(offsets)
    events = [e for _, e in seen_raw]
    sent = await input_of(agent, reply["runId"])
    expected = wire(sent, deltas=12)
    assert events[1:] == expected[1:]
    assert events[0] == {
        **expected[0],
        "input": {"threadId": thread, "runId": reply["runId"], "messages": [message]},
    }
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == ok_transcript_text([message])
