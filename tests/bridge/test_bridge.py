"""Tests of agui_hub/bridge/runs.py: runs of a real upstream AG-UI agent (tests/upstream_agent.py,
over loopback HTTP) through the :class:`~agui_hub.bridge.runs.Bridge` of a real in-process
:class:`~agui_hub.gateway.server.Gateway`, on the memory store and on Redis.

Runs are started with ``gateway.bridge.start(...)`` or :meth:`HubClient.run` over WebSocket;
what they leave in the thread is read back from the store (or a subscription) and compared
with what the agent's script sends (``ok_events``) and with the hub's reducer. Covered: an
ok run relayed exactly; the input of a second run built from the thread; every way an
upstream fails ending the run with one RUN_ERROR of the documented code, the thread still
usable; CRLF/comment framing and chunk events; cancel; a run outliving the client that
started it; the refusals (unknown agent, a run going, max_runs, concurrent starts, bad
inputs); an input given whole; ending an abandoned run; a gateway drained mid-run; Redis
going away mid-run (with and without persistence); connect_timeout against an agent that
never answers its headers. Upstreams written by hand (a raw asyncio server) for what a stock
agent server would not send: a compressed answer (refused; the hub asks for identity), a run
whose first event is RUN_ERROR (stored with the hub's RUN_STARTED in one append, or not at all
when another writer holds the thread), keepalive comments without events (the idle timeout
counts from the last event).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest

from agui_hub.agui.reducer import fold
from agui_hub.agui.runs import RunTree
from agui_hub.bridge.runs import BridgedRun, RunState
from agui_hub.client.hub_client import HubClient, ThreadEvent
from agui_hub.errors import (
    CommandRejected,
    InvalidEvent,
    NoActiveRun,
    RunActive,
    StoreUnavailable,
    TooManyRuns,
    UnknownAgent,
    UnknownRun,
)
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer, free_port
from ..upstream_agent import (
    UpstreamAgent,
    ok_events,
    ok_transcript_text,
    serve_agent,
    tool_arguments,
)

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing (a run's end, a disconnect)."""

Event = dict[str, Any]

USER_1 = {"id": "user-1", "role": "user", "content": "what is six times seven?"}
USER_2 = {"id": "user-2", "role": "user", "content": "and plus one?"}

AGENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ok": ("ok", {}),
    "slow": ("slow", {"count": 1000, "delay": 0.05}),
    "slow40": ("slow", {"count": 40, "delay": 0.02}),
    "slow60": ("slow", {"count": 60, "delay": 0.03}),
    "status500": ("status", {"code": 500}),
    "status503": ("status", {"code": 503}),
    "not_sse": ("not_sse", {}),
    "malformed": ("malformed", {}),
    "bad_sequence": ("bad_sequence", {}),
    "invalid_event": ("invalid_event", {}),
    "unknown_event": ("unknown_event", {}),
    "truncated": ("truncated", {}),
    "huge": ("huge", {}),
    "huge3m": ("huge", {"size": 3_000_000}),
    "crlf": ("crlf", {}),
    "chunks": ("chunks", {}),
    "error_event": ("error_event", {}),
}
"""The agents of every test gateway (``agents``): name -> (behaviour, query)."""

HANG_IDLE_TIMEOUT = 0.5
"""The idle timeout of the ``hang`` agent (in the gateway's ``agents_file``): only the
test of that timeout uses it, as it can expire before a slow machine's next step."""

STILL_IDLE_TIMEOUT = 60
"""The ``still`` agent: ``hang``'s behaviour with a timeout no test reaches (they end
its runs by cancelling them)."""

MUTE_CONNECT_TIMEOUT = 0.3
MUTE_IDLE_TIMEOUT = 2.5
"""The ``mute`` agent (a listener that takes the request and never answers its headers):
docs/bridge.md says ``connect_timeout`` is the time to connect, and that the headers
count against ``idle_timeout``, as the events do."""


def wire(events: list[Any]) -> list[Event]:
    """SDK events as the agent puts them on the wire (what its EventEncoder writes)."""
    return [e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in events]


def of_type(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e["type"] == kind]


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent() -> Iterator[UpstreamAgent]:
    """One upstream agent for the module (tests count its inputs and disconnects relative
    to what they found)."""
    with serve_agent() as served:
        yield served


class Bench:
    """The gateways, stores and clients of one test, all closed at its end."""

    def __init__(
        self,
        agent: UpstreamAgent,
        store_factory: Callable[[], ThreadStore],
        same_store: Callable[[ThreadStore], ThreadStore],
        tmp_path: Path,
    ) -> None:
        self.agent = agent
        self.store_factory = store_factory
        self.same_store = same_store
        self.tmp_path = tmp_path
        self.gateways: list[Gateway] = []
        self.clients: list[HubClient] = []
        self.stores: list[ThreadStore] = []
        self.dead_port = free_port()
        self.mute_port = 0
        """Port of a loopback listener that reads requests and never answers (0: none)."""

    def agents_spec(self) -> str:
        spec = [f"{name}={self.agent.url(b, **q)}" for name, (b, q) in AGENTS.items()]
        spec.append(f"dead=http://127.0.0.1:{self.dead_port}/run")
        return ",".join(spec)

    def agents_file(self) -> str:
        path = self.tmp_path / "agents.toml"
        text = (
            f'[agents.hang]\nurl = "{self.agent.url("hang")}"\n'
            f"idle_timeout = {HANG_IDLE_TIMEOUT}\nconnect_timeout = 5\n"
            f'[agents.still]\nurl = "{self.agent.url("hang")}"\n'
            f"idle_timeout = {STILL_IDLE_TIMEOUT}\nconnect_timeout = 5\n"
        )
        if self.mute_port:
            text += (
                f'[agents.mute]\nurl = "http://127.0.0.1:{self.mute_port}/run"\n'
                f"connect_timeout = {MUTE_CONNECT_TIMEOUT}\nidle_timeout = {MUTE_IDLE_TIMEOUT}\n"
            )
        path.write_text(text)
        return str(path)

    async def gateway(self, store: ThreadStore | None = None, **config: Any) -> Gateway:
        config.setdefault("agents", self.agents_spec())
        config.setdefault("agents_file", self.agents_file())
        config.setdefault("ping_interval", None)
        gateway = Gateway(
            GatewayConfig(host="127.0.0.1", port=0, **config),
            store=store if store is not None else self.store_factory(),
        )
        await gateway.start()
        self.gateways.append(gateway)
        return gateway

    def reader(self, gateway: Gateway) -> ThreadStore:
        """A handle on *gateway*'s data (the same store in memory, a new one on Redis)."""
        store = self.same_store(gateway.store)
        if store is not gateway.store:
            self.stores.append(store)
        return store

    async def events(
        self, gateway: Gateway, thread: str, store: ThreadStore | None = None
    ) -> list[Event]:
        """Every stored event of *thread*, oldest first."""
        entries = await (store or gateway.store).read(thread)
        return [msgpack.unpackb(e.data, raw=False) for e in entries]

    async def client(self, gateway: Gateway) -> HubClient:
        client = HubClient(f"ws://127.0.0.1:{gateway.config.port}/", open_timeout=WAIT)
        await client.connect()
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.close()
        for gateway in self.gateways:
            if not gateway._draining:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(gateway.drain(), 15)
        for store in self.stores:
            with contextlib.suppress(Exception):
                await store.close()


def make_bench(
    kind: str, request: pytest.FixtureRequest, agent: UpstreamAgent, tmp_path: Path
) -> Bench:
    if kind == "memory":
        factory: Callable[[], ThreadStore] = MemoryStore

        def same(store: ThreadStore) -> ThreadStore:
            return store

        return Bench(agent, factory, same, tmp_path)
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-bridge-{uuid.uuid4().hex}"

    def redis_store(_store: ThreadStore | None = None) -> ThreadStore:
        return RedisStore(server.url, prefix=prefix)

    return Bench(agent, redis_store, redis_store, tmp_path)


@pytest.fixture(params=["memory", "redis"])
async def bench(
    request: pytest.FixtureRequest, agent: UpstreamAgent, tmp_path: Path
) -> AsyncIterator[Bench]:
    """A bench on each store."""
    b = make_bench(request.param, request, agent, tmp_path)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def mem_bench(
    request: pytest.FixtureRequest, agent: UpstreamAgent, tmp_path: Path
) -> AsyncIterator[Bench]:
    """A bench on the memory store, for what does not depend on the store."""
    b = make_bench("memory", request, agent, tmp_path)
    try:
        yield b
    finally:
        await b.close()


async def ended(run: BridgedRun) -> BridgedRun:
    await asyncio.wait_for(run.done.wait(), WAIT)
    assert run.state is RunState.ENDED
    return run


async def disconnected(agent: UpstreamAgent, count: int) -> bool:
    return await asyncio.to_thread(agent.wait_disconnects, count, WAIT)


async def stored_until(
    bench: Bench, gateway: Gateway, thread: str, done: Callable[[list[Event]], bool]
) -> list[Event]:
    """Poll the store until *done* holds for *thread*'s events (bounded)."""
    deadline = time.monotonic() + WAIT
    while True:
        events = await bench.events(gateway, thread)
        if done(events):
            return events
        assert time.monotonic() < deadline, f"not stored in time: {[e['type'] for e in events]}"
        await asyncio.sleep(0.01)


async def run_ok_after(bench: Bench, gateway: Gateway, thread: str, parent: str) -> None:
    """The thread takes a new run (its sequence was not left poisoned): an ok run whose
    parent is *parent*, stored to its RUN_FINISHED."""
    before = len(await bench.events(gateway, thread))
    run = await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_2])
    await ended(run)
    assert run.parent_run_id == parent
    events = (await bench.events(gateway, thread))[before:]
    assert events[0]["type"] == "RUN_STARTED"
    assert events[0]["parentRunId"] == parent
    assert events[-1] == {"type": "RUN_FINISHED", "threadId": thread, "runId": run.run_id}
    assert not of_type(events, "RUN_ERROR")
    assert not gateway.bridge.runs


def spy_store_failures(gateway: Gateway) -> list[StoreUnavailable]:
    """Record every StoreUnavailable the bridge's appends meet (the hub's publish, passed
    through unchanged): the evidence that a store outage hit a run."""
    seen: list[StoreUnavailable] = []
    publish = gateway.hub.publish

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            return await publish(*args, **kwargs)
        except StoreUnavailable as exc:
            seen.append(exc)
            raise

    gateway.hub.publish = recorded  # type: ignore[method-assign]
    return seen


def expected_ok(run_input: dict[str, Any], new_messages: list[Event]) -> list[Event]:
    """The agent's ok events for *run_input*, with the RUN_STARTED the thread should keep:
    the agent's, plus the input's new messages (the agent echoes no input)."""
    events = wire(ok_events(run_input))
    started = dict(events[0])
    record: Event = {
        "threadId": run_input["threadId"],
        "runId": run_input["runId"],
        "messages": new_messages,
    }
    if "parentRunId" in run_input:
        record["parentRunId"] = run_input["parentRunId"]
    started["input"] = record
    return [started, *events[1:]]


# -- 1. an ok run ----------------------------------------------------------------------------


async def test_ok_run_is_stored_as_the_agent_sent_it(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"ok-{uuid.uuid4().hex[:8]}"
    inputs = len(bench.agent.inputs)
    run = await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_1])
    assert run.thread == thread and run.agent.name == "ok"
    assert thread in gateway.bridge.runs
    first = await asyncio.wait_for(run.started, WAIT)
    await ended(run)

    assert len(bench.agent.inputs) == inputs + 1
    sent = bench.agent.inputs[-1]
    assert sent["threadId"] == thread and sent["runId"] == run.run_id
    assert sent["messages"] == [USER_1]
    assert "parentRunId" not in sent or sent["parentRunId"] is None

    events = await bench.events(gateway, thread)
    agent_sent = wire(ok_events(sent))
    # Everything but the RUN_STARTED exactly as sent; the RUN_STARTED is the agent's with
    # the user's message recorded as its input.
    assert events[1:] == agent_sent[1:]
    assert {k: v for k, v in events[0].items() if k != "input"} == agent_sent[0]
    assert events[0]["input"] == {"threadId": thread, "runId": run.run_id, "messages": [USER_1]}
    assert events[-1]["type"] == "RUN_FINISHED"
    assert len(of_type(events, "RUN_FINISHED")) == 1 and not of_type(events, "RUN_ERROR")

    entries = await gateway.store.read(thread)
    assert first == entries[0].offset
    assert run.first_offset == entries[0].offset and run.last_offset == entries[-1].offset
    assert run.outcome == events[-1]
    assert run.events == len(events)
    assert len({e.event_id for e in entries}) == len(entries)
    assert thread not in gateway.bridge.runs
    assert gateway.bridge.ended.get("finished") == 1

    # The hub's reducer folds it into what the script says.
    folded = fold(events)
    assert folded.state == {"turn": 1, "items": ["lookup"]}
    assert not folded.run_active
    assistant = [m for m in folded.messages if m.get("role") == "assistant"]
    assert [m["content"] for m in assistant] == [ok_transcript_text([USER_1])]


async def test_ok_run_over_websocket_and_a_subscription(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"ws-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    async with client.subscribe(thread, "start") as sub:
        reply = await client.run(thread, "ok", messages=[USER_1])
        assert reply["type"] == "running"
        assert reply["thread"] == thread and reply["agent"] == "ok"
        run_id = reply["runId"]
        seen: list[Event] = []

        async def follow() -> None:
            async for item in sub:
                if isinstance(item, ThreadEvent):
                    seen.append(item.event)
                    if item.event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                        return

        await asyncio.wait_for(follow(), WAIT)
    sent = bench.agent.inputs[-1]
    assert sent["runId"] == run_id and sent["messages"] == [USER_1]
    assert seen == expected_ok(sent, [USER_1])
    assert seen == await bench.events(gateway, thread)


# -- 2. the input of the next run --------------------------------------------------------------


async def test_second_run_input_is_built_from_the_thread(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"turns-{uuid.uuid4().hex[:8]}"
    # Somebody else's run before, holding an activity message (which no input carries).
    client = await bench.client(gateway)
    activity = {
        "type": "ACTIVITY_SNAPSHOT",
        "messageId": "activity-1",
        "activityType": "progress",
        "content": {"percent": 50},
    }
    await client.publish(
        thread,
        [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "run-0"},
            activity,
            {"type": "RUN_FINISHED", "threadId": thread, "runId": "run-0"},
        ],
    )
    stored = await bench.events(gateway, thread)
    assert any(m.get("role") == "activity" for m in fold(stored).messages)

    first = await ended(
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_1])
    )
    input_1 = bench.agent.inputs[-1]
    assert input_1["runId"] == first.run_id
    assert input_1["parentRunId"] == "run-0"
    assert input_1["messages"] == [USER_1]

    second = await ended(
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_2])
    )
    input_2 = bench.agent.inputs[-1]
    assert input_2["runId"] == second.run_id != first.run_id
    assert input_2["threadId"] == thread
    assert input_2["parentRunId"] == first.run_id
    assert input_2["state"] == {"turn": 1, "items": ["lookup"]}
    rid = first.run_id
    # What the ok script of run 1 leaves as messages (tests/upstream_agent.py), in order.
    assert input_2["messages"] == [
        USER_1,
        {
            "id": f"{rid}-reasoning-msg",
            "role": "reasoning",
            "content": "The user wants an answer; look it up.",
        },
        {
            "id": f"{rid}-msg",
            "role": "assistant",
            "content": ok_transcript_text([USER_1]),
            "toolCalls": [
                {
                    "id": f"{rid}-call",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": tool_arguments([USER_1])},
                }
            ],
        },
        {"id": f"{rid}-result", "role": "tool", "toolCallId": f"{rid}-call", "content": "42"},
        USER_2,
    ]
    # The hub's reducer over the script's events agrees (activity left out).
    script = expected_ok(input_1, [USER_1])
    assert input_2["messages"][:-1] == [
        m for m in fold([*stored, *script]).messages if m.get("role") != "activity"
    ]

    events = await bench.events(gateway, thread)
    starts = of_type(events, "RUN_STARTED")
    assert [s["runId"] for s in starts] == ["run-0", first.run_id, second.run_id]
    assert starts[2]["parentRunId"] == first.run_id
    assert starts[2]["input"]["messages"] == [USER_2]
    assert starts[2]["input"]["parentRunId"] == first.run_id
    assert starts[1]["input"]["messages"] == [USER_1]
    # Run 2's agent saw two user messages: its snapshot says turn 2.
    assert fold(events).state == {"turn": 2, "items": ["lookup"]}


# -- 3. upstream failures ----------------------------------------------------------------------


FAILURES: dict[str, tuple[str, list[str], list[str]]] = {
    # agent: (RUN_ERROR code, message fragments, types stored before the RUN_ERROR)
    "dead": ("AGUI_HUB_UPSTREAM_UNREACHABLE", ["could not be reached"], ["RUN_STARTED"]),
    "status500": ("AGUI_HUB_UPSTREAM_STATUS", ["HTTP 500", "agent exploded"], ["RUN_STARTED"]),
    "status503": ("AGUI_HUB_UPSTREAM_STATUS", ["HTTP 503", "agent exploded"], ["RUN_STARTED"]),
    "not_sse": ("AGUI_HUB_UPSTREAM_MALFORMED", ["application/json"], ["RUN_STARTED"]),
    "malformed": (
        "AGUI_HUB_UPSTREAM_MALFORMED",
        ["not JSON", "{this is not json"],
        ["RUN_STARTED"],
    ),
    "bad_sequence": (
        "AGUI_HUB_UPSTREAM_INVALID_EVENT",
        ["message_not_open", "TEXT_MESSAGE_CONTENT"],
        ["RUN_STARTED"],
    ),
    "invalid_event": (
        "AGUI_HUB_UPSTREAM_INVALID_EVENT",
        ["TEXT_MESSAGE_START", "messageId"],
        ["RUN_STARTED"],
    ),
    "unknown_event": (
        "AGUI_HUB_UPSTREAM_INVALID_EVENT",
        ["NOT_AN_AGUI_EVENT"],
        ["RUN_STARTED"],
    ),
    "truncated": (
        "AGUI_HUB_UPSTREAM_CLOSED",
        ["ended its response", "before the run's RUN_FINISHED"],
        ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_CONTENT"],
    ),
    "hang": ("AGUI_HUB_UPSTREAM_TIMEOUT", [f"{HANG_IDLE_TIMEOUT:g} s"], ["RUN_STARTED"]),
    # Under the SSE parser's bound, over the hub's event limit: the writer refuses it.
    "huge": (
        "AGUI_HUB_UPSTREAM_INVALID_EVENT",
        ["TEXT_MESSAGE_CONTENT", "payload_too_large", "2000"],
        ["RUN_STARTED", "TEXT_MESSAGE_START"],
    ),
    # Over the SSE parser's bound: refused before it is buffered whole.
    "huge3m": (
        "AGUI_HUB_UPSTREAM_MALFORMED",
        ["bytes", "event #3"],
        ["RUN_STARTED", "TEXT_MESSAGE_START"],
    ),
}

HUB_STARTED = {"dead", "status500", "status503", "not_sse", "hang"}
"""Failures before any event of the agent: the RUN_STARTED is the hub's."""


async def test_regenerate_and_edit_run_from_a_branch(bench: Bench) -> None:
    """A run with a parentRunId gets the branch's messages and state as of that
    run's end; the runs form a tree."""
    gateway = await bench.gateway()
    thread = f"branches-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    await client.publish(
        thread,
        [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "run-0"},
            {"type": "STATE_SNAPSHOT", "snapshot": {"before": True}},
            {"type": "RUN_FINISHED", "threadId": thread, "runId": "run-0"},
        ],
    )
    first = await ended(
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_1])
    )
    input_1 = bench.agent.inputs[-1]
    second = await ended(
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_2])
    )
    input_2 = bench.agent.inputs[-1]
    # Regenerate the second answer: the parent of the run that gave it, its question again.
    again = await ended(
        await gateway.bridge.start(
            "ok", thread, subject="tester", messages=[USER_2], parent_run_id=first.run_id
        )
    )
    input_3 = bench.agent.inputs[-1]
    assert input_3["parentRunId"] == first.run_id
    assert input_3["messages"] == input_2["messages"]
    assert input_3["state"] == input_2["state"]
    # Edit the first question: the parent of the run that carried it, the new text.
    edited = {**USER_1, "id": "user-1-edited", "content": "something else"}
    edit = await ended(
        await gateway.bridge.start(
            "ok", thread, subject="tester", messages=[edited], parent_run_id="run-0"
        )
    )
    input_4 = bench.agent.inputs[-1]
    assert input_4["parentRunId"] == "run-0"
    assert input_4["messages"] == [edited]
    assert input_4["state"] == input_1["state"] == {"before": True}
    # Then a run without parentRunId continues the latest run, the edit.
    after = await ended(
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_2])
    )
    assert bench.agent.inputs[-1]["parentRunId"] == edit.run_id
    assert bench.agent.inputs[-1]["messages"][0] == edited

    tree = RunTree(await gateway.store.runs(thread))
    assert [r.run_id for r in tree.children("run-0")] == [first.run_id, edit.run_id]
    assert [r.run_id for r in tree.children(first.run_id)] == [second.run_id, again.run_id]
    assert [r.run_id for r in tree.path(after.run_id)] == ["run-0", edit.run_id, after.run_id]
    assert {r.run_id: r.preview for r in tree.runs}[edit.run_id] == "something else"

    with pytest.raises(UnknownRun):
        await gateway.bridge.start("ok", thread, subject="tester", parent_run_id="nope")


@pytest.mark.parametrize("name", list(FAILURES))
async def test_upstream_failure_ends_the_run_with_one_run_error(bench: Bench, name: str) -> None:
    code, fragments, before = FAILURES[name]
    gateway = await bench.gateway()
    thread = f"fail-{name}-{uuid.uuid4().hex[:8]}"
    run = await gateway.bridge.start(name, thread, subject="tester", messages=[USER_1])
    await ended(run)
    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events] == [*before, "RUN_ERROR"], events
    error = events[-1]
    assert error["code"] == code, error
    message = error["message"]
    assert f"agent {name!r}" in message, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert len(message) < 1000  # readable: a quote of the body, not all of it
    assert run.outcome == error
    assert gateway.bridge.ended.get(code) == 1
    assert thread not in gateway.bridge.runs

    started = events[0]
    assert started["threadId"] == thread and started["runId"] == run.run_id
    assert started["input"]["messages"] == [USER_1]
    if name in HUB_STARTED:
        assert started == {
            "type": "RUN_STARTED",
            "threadId": thread,
            "runId": run.run_id,
            "input": {"threadId": thread, "runId": run.run_id, "messages": [USER_1]},
        }
    if name == "truncated":
        assert [e["delta"] for e in of_type(events, "TEXT_MESSAGE_CONTENT")] == [
            "Half a ",
            "sentence",
        ]
    folded = fold(events)
    assert not folded.run_active and not folded.rejected
    await run_ok_after(bench, gateway, thread, run.run_id)


async def test_the_agents_own_run_error_ends_the_run_alone(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"refused-{uuid.uuid4().hex[:8]}"
    run = await ended(
        await gateway.bridge.start("error_event", thread, subject="tester", messages=[USER_1])
    )
    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "RUN_ERROR",
    ]
    assert events[-1] == {
        "type": "RUN_ERROR",
        "message": "the model refused",
        "code": "MODEL_REFUSED",
    }
    assert run.outcome == events[-1]
    assert gateway.bridge.ended == {"error": 1}
    await run_ok_after(bench, gateway, thread, run.run_id)


async def test_a_run_whose_thread_was_taken_meanwhile_stores_nothing(bench: Bench) -> None:
    # The agent sends nothing; meanwhile another producer starts a run in the thread. The
    # bridge's RUN_STARTED + RUN_ERROR (cancelled) are refused whole: a RUN_ERROR alone
    # would end the other producer's run.
    gateway = await bench.gateway()
    thread = f"taken-{uuid.uuid4().hex[:8]}"
    run = await gateway.bridge.start("still", thread, subject="tester", messages=[USER_1])
    client = await bench.client(gateway)
    other = {"type": "RUN_STARTED", "threadId": thread, "runId": "someone-else"}
    await client.publish(thread, [other])
    assert run.state is RunState.STARTING, "the still agent sent something"
    gateway.bridge.cancel(thread, by="tester")
    await ended(run)
    assert await bench.events(gateway, thread) == [other]
    with pytest.raises(StoreUnavailable):
        run.started.result()
    assert fold(await bench.events(gateway, thread)).run_active


async def test_an_agent_that_never_answers_its_headers_times_out(mem_bench: Bench) -> None:
    bench = mem_bench

    # An agent that accepts the connection and never answers: connected at once (so
    # connect_timeout is met), then silent: the run fails after idle_timeout, with
    # AGUI_HUB_UPSTREAM_TIMEOUT, not before and not much after.
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while await reader.read(65536):
                pass
        writer.close()

    listener = await asyncio.start_server(mute, "127.0.0.1", 0)
    try:
        bench.mute_port = listener.sockets[0].getsockname()[1]
        gateway = await bench.gateway()
        thread = f"mute-{uuid.uuid4().hex[:8]}"
        began = time.monotonic()
        run = await gateway.bridge.start("mute", thread, subject="tester", messages=[USER_1])
        await asyncio.wait_for(run.done.wait(), MUTE_IDLE_TIMEOUT + WAIT)
        took = time.monotonic() - began
        events = await bench.events(gateway, thread)
        assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
        assert events[-1]["code"] == "AGUI_HUB_UPSTREAM_TIMEOUT", events[-1]
        assert "'mute'" in events[-1]["message"]
        assert f"{MUTE_IDLE_TIMEOUT:g} s" in events[-1]["message"], events[-1]["message"]
        assert MUTE_IDLE_TIMEOUT - 0.1 <= took < MUTE_IDLE_TIMEOUT + 1.5 * TIMEOUT_SCALE, took
    finally:
        listener.close()


# -- 4. framings the agent may use ---------------------------------------------------------


async def test_crlf_framing_relays_the_same_events_as_ok(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"crlf-{uuid.uuid4().hex[:8]}"
    run = await ended(
        await gateway.bridge.start("crlf", thread, subject="tester", messages=[USER_1])
    )
    sent = bench.agent.inputs[-1]
    assert sent["runId"] == run.run_id
    events = await bench.events(gateway, thread)
    assert events == expected_ok(sent, [USER_1])
    # The STATE_SNAPSHOT came split over two data lines.
    assert of_type(events, "STATE_SNAPSHOT") == [
        {"type": "STATE_SNAPSHOT", "snapshot": {"turn": 1, "items": []}}
    ]


async def test_chunk_events_are_stored_as_sent(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"chunks-{uuid.uuid4().hex[:8]}"
    run = await ended(
        await gateway.bridge.start("chunks", thread, subject="tester", messages=[USER_1])
    )
    rid = run.run_id
    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        *["TEXT_MESSAGE_CHUNK"] * 3,
        *["TOOL_CALL_CHUNK"] * 2,
        "RUN_FINISHED",
    ]
    text = of_type(events, "TEXT_MESSAGE_CHUNK")
    assert text[0]["role"] == "assistant"
    assert {c["messageId"] for c in text} == {f"{rid}-msg"}
    assert "".join(c["delta"] for c in text) == ok_transcript_text([USER_1])
    calls = of_type(events, "TOOL_CALL_CHUNK")
    assert calls[0]["toolCallName"] == "lookup"
    assert {c["toolCallId"] for c in calls} == {f"{rid}-call"}
    assert "".join(c["delta"] for c in calls) == tool_arguments([USER_1])
    # Stored as sent: no expansion into START / CONTENT / END.
    assert not of_type(events, "TEXT_MESSAGE_START")
    folded = fold(events, flush=True)
    assistant = [m for m in folded.messages if m["role"] == "assistant"]
    assert assistant[0]["content"] == ok_transcript_text([USER_1])
    calls_folded = [c for m in assistant for c in m.get("toolCalls", [])]
    assert [c["function"] for c in calls_folded] == [
        {"name": "lookup", "arguments": tool_arguments([USER_1])}
    ]


# -- 5. cancel ---------------------------------------------------------------------------------


async def test_cancel_a_streaming_run(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"cancel-{uuid.uuid4().hex[:8]}"
    gone = bench.agent.disconnects
    run = await gateway.bridge.start("slow", thread, subject="tester", messages=[USER_1])
    await stored_until(bench, gateway, thread, lambda ev: len(ev) >= 5)
    assert run.state is RunState.STREAMING
    assert gateway.bridge.cancel(thread, by="operator-7") is run
    await ended(run)
    assert await disconnected(bench.agent, gone + 1)
    assert thread not in gateway.bridge.runs

    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events[:2]] == ["RUN_STARTED", "TEXT_MESSAGE_START"]
    deltas = [e["delta"] for e in of_type(events, "TEXT_MESSAGE_CONTENT")]
    assert deltas == [f"{i} " for i in range(len(deltas))]
    assert len(deltas) < 1000
    assert len(of_type(events, "RUN_ERROR")) == 1
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "AGUI_HUB_RUN_CANCELLED"
    assert "operator-7" in events[-1]["message"]
    assert gateway.bridge.ended.get("AGUI_HUB_RUN_CANCELLED") == 1
    # Cancelling again: there is nothing going any more.
    with pytest.raises(NoActiveRun):
        gateway.bridge.cancel(thread, by="operator-7")
    await run_ok_after(bench, gateway, thread, run.run_id)


async def test_cancel_before_the_agent_sent_anything(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"cancel-early-{uuid.uuid4().hex[:8]}"
    gone, inputs = bench.agent.disconnects, len(bench.agent.inputs)
    run = await gateway.bridge.start("still", thread, subject="tester", messages=[USER_1])
    # The agent has the request (and answered its headers, then nothing).
    assert await asyncio.to_thread(bench.agent.wait_inputs, inputs + 1, WAIT)
    await asyncio.sleep(0.05)
    assert run.state is RunState.STARTING
    gateway.bridge.cancel(thread, by="impatient", run_id=run.run_id)
    await ended(run)
    assert await disconnected(bench.agent, gone + 1)
    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert events[0]["runId"] == run.run_id
    assert events[1]["code"] == "AGUI_HUB_RUN_CANCELLED"
    assert "impatient" in events[1]["message"]


async def test_cancel_right_after_start_still_ends_the_run(mem_bench: Bench) -> None:
    bench = mem_bench
    # start() returns with the run's task created but not yet run; a cancel before its
    # first turn (no await in between, as a caller that starts and at once cancels) must
    # still end the run: done set, the thread free again on this gateway.
    gateway = await bench.gateway()
    thread = f"cancel-at-once-{uuid.uuid4().hex[:8]}"
    run = await gateway.bridge.start("slow", thread, subject="tester", messages=[USER_1])
    gateway.bridge.cancel(thread, by="quick")
    try:
        await asyncio.wait_for(run.done.wait(), 3 * TIMEOUT_SCALE)  # a cancel takes ms
    except TimeoutError:
        pytest.fail(
            f"the run never ended: state {run.state.value}, task {run._task!r}, "
            f"bridge.runs {list(gateway.bridge.runs)}"
        )
    assert thread not in gateway.bridge.runs
    events = await bench.events(gateway, thread)
    # The agent was never called: the run is the hub's RUN_STARTED (with the user's
    # message) and its RUN_ERROR, cancelled, naming who.
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert events[0]["input"]["messages"] == [USER_1]
    assert events[-1]["code"] == "AGUI_HUB_RUN_CANCELLED"
    assert "quick" in events[-1]["message"]
    later = await ended(
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_2])
    )
    assert later.outcome is not None and later.outcome["type"] == "RUN_FINISHED"


async def test_cancel_over_websocket(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"cancel-ws-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    gone = bench.agent.disconnects

    with pytest.raises(CommandRejected) as nothing:
        await client.cancel(thread)
    assert nothing.value.code == "no_active_run"

    reply = await client.run(thread, "slow", messages=[USER_1])
    run_id = reply["runId"]
    run = gateway.bridge.runs[thread]
    await stored_until(bench, gateway, thread, lambda ev: len(ev) >= 3)

    with pytest.raises(CommandRejected) as wrong:
        await client.cancel(thread, "not-this-run")
    assert wrong.value.code == "no_active_run"
    with pytest.raises(NoActiveRun):
        gateway.bridge.cancel(thread, by="x", run_id="not-this-run")
    assert gateway.bridge.runs.get(thread) is run  # still going

    cancelled = await client.cancel(thread, run_id)
    assert cancelled["type"] == "cancelled"
    assert cancelled["runId"] == run_id and cancelled["status"] == "ended"
    assert run.done.is_set()
    assert await disconnected(bench.agent, gone + 1)
    events = await bench.events(gateway, thread)
    assert events[-1]["code"] == "AGUI_HUB_RUN_CANCELLED"
    assert "anonymous" in events[-1]["message"]
    assert len(of_type(events, "RUN_ERROR")) == 1
    assert thread not in gateway.bridge.runs


# -- 6. detached runs ------------------------------------------------------------------------


async def test_a_run_outlives_the_client_that_started_it(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"detached-{uuid.uuid4().hex[:8]}"
    starter = await bench.client(gateway)
    reply = await starter.run(thread, "slow40", messages=[USER_1])
    run = gateway.bridge.runs[thread]
    await starter.close()
    deadline = time.monotonic() + WAIT
    while gateway.connections:  # the gateway saw the client go
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert not run.done.is_set()  # 40 deltas 0.02 s apart: still going without it
    await ended(run)
    assert run.outcome is not None and run.outcome["type"] == "RUN_FINISHED"

    expected_types = [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        *["TEXT_MESSAGE_CONTENT"] * 40,
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events] == expected_types
    assert [e["delta"] for e in of_type(events, "TEXT_MESSAGE_CONTENT")] == [
        f"{i} " for i in range(40)
    ]
    assert events[-1]["runId"] == reply["runId"]

    late = await bench.client(gateway)
    seen: list[Event] = []
    async with late.subscribe(thread, "start") as sub:

        async def follow() -> None:
            async for item in sub:
                if isinstance(item, ThreadEvent):
                    seen.append(item.event)
                    if item.event["type"] == "RUN_FINISHED":
                        return

        await asyncio.wait_for(follow(), WAIT)
    assert seen == events


# -- 7. refusals -------------------------------------------------------------------------------


async def test_unknown_agent_is_refused_naming_the_known_ones(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"unknown-{uuid.uuid4().hex[:8]}"
    inputs = len(bench.agent.inputs)
    with pytest.raises(UnknownAgent) as caught:
        await gateway.bridge.start("nope", thread, subject="tester")
    message = str(caught.value)
    assert "'nope'" in message
    assert ", ".join(sorted([*AGENTS, "dead", "hang", "still"])) in message
    client = await bench.client(gateway)
    with pytest.raises(CommandRejected) as refused:
        await client.run(thread, "nope")
    assert refused.value.code == "unknown_agent"
    assert "ok" in str(refused.value)
    assert len(bench.agent.inputs) == inputs
    assert await bench.events(gateway, thread) == []


async def test_a_second_run_in_a_thread_with_one_going_is_refused(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"busy-{uuid.uuid4().hex[:8]}"
    run = await gateway.bridge.start("slow", thread, subject="tester", messages=[USER_1])
    await asyncio.wait_for(run.started, WAIT)  # its own POST is in
    inputs = len(bench.agent.inputs)
    with pytest.raises(RunActive):
        await gateway.bridge.start("ok", thread, subject="tester")
    client = await bench.client(gateway)
    with pytest.raises(CommandRejected) as refused:
        await client.run(thread, "ok")
    assert refused.value.code == "run_active"
    await asyncio.sleep(0.05)
    assert len(bench.agent.inputs) == inputs  # nothing more POSTed upstream
    assert [r.run_id for r in gateway.bridge.runs.values()] == [run.run_id]
    gateway.bridge.cancel(thread, by="tester")
    await ended(run)


async def test_a_run_published_by_someone_else_blocks_a_bridged_run(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"foreign-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    started = {"type": "RUN_STARTED", "threadId": thread, "runId": "foreign-run"}
    await client.publish(thread, [started])
    inputs = len(bench.agent.inputs)
    with pytest.raises(RunActive) as caught:
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_1])
    assert "foreign-run" in str(caught.value)
    with pytest.raises(CommandRejected) as refused:
        await client.run(thread, "ok", messages=[USER_1])
    assert refused.value.code == "run_active"
    await asyncio.sleep(0.1)
    assert len(bench.agent.inputs) == inputs  # nothing POSTed upstream
    assert not gateway.bridge.runs
    assert await bench.events(gateway, thread) == [started]
    # Once it ended, the thread takes a bridged run, whose parent it is.
    await client.publish(
        thread, [{"type": "RUN_FINISHED", "threadId": thread, "runId": "foreign-run"}]
    )
    await run_ok_after(bench, gateway, thread, "foreign-run")


async def test_a_given_input_goes_to_the_agent_as_it_is(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"given-{uuid.uuid4().hex[:8]}"
    given = {
        "threadId": thread,
        "runId": "given-run",
        "state": {"from": "client"},
        "messages": [USER_1],
        "tools": [],
        "context": [{"description": "locale", "value": "fr"}],
        "forwardedProps": {"k": "v"},
    }
    run = await ended(await gateway.bridge.start("ok", thread, subject="tester", input=given))
    assert run.run_id == "given-run"
    assert bench.agent.inputs[-1] == given
    events = await bench.events(gateway, thread)
    assert events == expected_ok(given, [USER_1])

    inputs = len(bench.agent.inputs)
    for bad in (
        {**given, "threadId": "another-thread", "runId": "r2"},
        {k: v for k, v in given.items() if k != "runId"},
        {**given, "runId": "r3", "messages": [{"id": "m", "role": "nobody", "content": "x"}]},
    ):
        with pytest.raises(InvalidEvent):
            await gateway.bridge.start("ok", thread, subject="tester", input=bad)
    with pytest.raises(InvalidEvent):
        await gateway.bridge.start(
            "ok",
            thread,
            subject="tester",
            messages=[{"role": "user"}],  # no id, no content
        )
    assert len(bench.agent.inputs) == inputs
    assert not gateway.bridge.runs and not gateway.bridge._reserved
    # Nothing is left reserved: the thread takes the next run.
    await run_ok_after(bench, gateway, thread, "given-run")


async def test_end_abandoned_closes_a_run_nobody_relays(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"abandoned-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    with pytest.raises(NoActiveRun):
        await gateway.bridge.end_abandoned(thread, by="ops")
    # What a gateway killed in the middle of a run leaves: a RUN_STARTED without an end.
    crashed = {"type": "RUN_STARTED", "threadId": thread, "runId": "crashed-run"}
    await client.publish(thread, [crashed, {"type": "TEXT_MESSAGE_START", "messageId": "m1"}])
    with pytest.raises(RunActive):
        await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_1])
    with pytest.raises(NoActiveRun):
        await gateway.bridge.end_abandoned(thread, by="ops", run_id="another-run")
    assert await gateway.bridge.end_abandoned(thread, by="ops", run_id="crashed-run") == (
        "crashed-run"
    )
    events = await bench.events(gateway, thread)
    assert len(events) == 3 and events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "AGUI_HUB_RUN_ABANDONED"
    assert "ops" in events[-1]["message"] and "crashed-run" in events[-1]["message"]
    with pytest.raises(NoActiveRun):
        await gateway.bridge.end_abandoned(thread, by="ops")
    await run_ok_after(bench, gateway, thread, "crashed-run")

    # A run this gateway relays is cancelled, not abandoned.
    run = await gateway.bridge.start("slow", thread, subject="tester", messages=[USER_1])
    await asyncio.wait_for(run.started, WAIT)  # (a cancel before the run's first turn is
    # another matter: test_stopping_a_run_right_after_start_still_ends_it)
    with pytest.raises(RunActive):
        await gateway.bridge.end_abandoned(thread, by="ops")
    gateway.bridge.cancel(thread, by="tester")
    await ended(run)

    # Over the WebSocket.
    other = f"{thread}-ws"
    await client.publish(other, [{"type": "RUN_STARTED", "threadId": other, "runId": "lost"}])
    reply = await client.cancel(other, abandoned=True)
    assert reply["type"] == "cancelled" and reply["runId"] == "lost"
    assert (await bench.events(gateway, other))[-1]["code"] == "AGUI_HUB_RUN_ABANDONED"
    with pytest.raises(CommandRejected) as refused:
        await client.cancel(other, abandoned=True)
    assert refused.value.code == "no_active_run"


async def test_end_abandoned_twice_for_a_run_id_used_again(bench: Bench) -> None:
    # Run ids are the producers' (an HTTP client or a `run` command may choose them) and
    # the hub stores a second run with an id seen before. Each abandoned run must be
    # ended, not only the first of that id.
    gateway = await bench.gateway()
    thread = f"reused-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    started = {"type": "RUN_STARTED", "threadId": thread, "runId": "run-1"}
    await client.publish(thread, [started])
    assert await gateway.bridge.end_abandoned(thread, by="ops") == "run-1"
    await client.publish(thread, [started])  # the same id again, crashed again
    assert fold(await bench.events(gateway, thread)).run_active
    assert await gateway.bridge.end_abandoned(thread, by="ops") == "run-1"
    events = await bench.events(gateway, thread)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"] * 2, (
        "end_abandoned answered run-1 but stored no RUN_ERROR for the second run "
        f"(its event id was already used): {[e['type'] for e in events]}"
    )
    assert not fold(events).run_active


async def test_max_runs_counts_runs_in_every_thread(bench: Bench) -> None:
    gateway = await bench.gateway(max_runs=1)
    first = await gateway.bridge.start("slow", "max-a", subject="tester", messages=[USER_1])
    with pytest.raises(TooManyRuns):
        await gateway.bridge.start("ok", "max-b", subject="tester", messages=[USER_1])
    client = await bench.client(gateway)
    with pytest.raises(CommandRejected) as refused:
        await client.run("max-b", "ok", messages=[USER_1])
    assert refused.value.code == "too_many_runs"
    assert await bench.events(gateway, "max-b") == []
    gateway.bridge.cancel("max-a", by="tester")
    await ended(first)
    second = await ended(
        await gateway.bridge.start("ok", "max-b", subject="tester", messages=[USER_1])
    )
    assert second.outcome is not None and second.outcome["type"] == "RUN_FINISHED"


async def test_concurrent_starts_for_one_thread_let_exactly_one_through(bench: Bench) -> None:
    gateway = await bench.gateway()
    thread = f"race-{uuid.uuid4().hex[:8]}"
    results = await asyncio.gather(
        *(gateway.bridge.start("ok", thread, subject=f"s{i}", messages=[USER_1]) for i in range(3)),
        return_exceptions=True,
    )
    runs = [r for r in results if isinstance(r, BridgedRun)]
    refused = [r for r in results if isinstance(r, RunActive)]
    assert len(runs) == 1 and len(refused) == 2, results
    await ended(runs[0])
    events = await bench.events(gateway, thread)
    assert len(of_type(events, "RUN_STARTED")) == 1
    assert events[-1]["type"] == "RUN_FINISHED"

    # Two threads, max_runs=1: one of them starts.
    limited = await bench.gateway(max_runs=1)
    results = list(
        await asyncio.gather(
            limited.bridge.start("ok", f"{thread}-x", subject="s", messages=[USER_1]),
            limited.bridge.start("ok", f"{thread}-y", subject="s", messages=[USER_1]),
            return_exceptions=True,
        )
    )
    runs = [r for r in results if isinstance(r, BridgedRun)]
    assert len(runs) == 1 and sum(isinstance(r, TooManyRuns) for r in results) == 1, results
    await ended(runs[0])


CLOSE_DELAY = 1.0
"""How long closing an agent's response takes in the test below (a slow proxy, TLS)."""


async def test_the_next_run_starts_as_soon_as_the_last_ones_end_is_seen(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run is over once its end is stored, not once the hub has closed the agent's
    # response: a client that sees RUN_FINISHED and at once starts the next run is not
    # refused run_active, and the run is counted as ended already.
    original = httpx.Response.aclose

    async def slow_aclose(self: httpx.Response) -> None:
        await asyncio.sleep(CLOSE_DELAY)
        await original(self)

    monkeypatch.setattr(httpx.Response, "aclose", slow_aclose)
    gateway = await bench.gateway()
    thread = f"next-{uuid.uuid4().hex[:8]}"
    client = await bench.client(gateway)
    ends: list[Event] = []
    async with client.subscribe(thread, "start") as sub:
        for n, message in enumerate([USER_1, USER_2, USER_1]):
            began = time.monotonic()
            reply = await client.run(thread, "ok", messages=[message])
            assert reply["type"] == "running"

            async def end_of_run() -> Event:
                async for item in sub:
                    if isinstance(item, ThreadEvent) and item.event["type"] in TERMINAL_TYPES:
                        return item.event
                raise AssertionError("the subscription ended")

            ends.append(await asyncio.wait_for(end_of_run(), WAIT))
            assert gateway.bridge.ended.get("finished") == n + 1
            assert thread not in gateway.bridge.runs
            assert time.monotonic() - began < WAIT
    assert [e["type"] for e in ends] == ["RUN_FINISHED"] * 3
    assert len(of_type(await bench.events(gateway, thread), "RUN_STARTED")) == 3
    # The responses are still being closed; a drain waits for them before closing the client.
    await asyncio.wait_for(gateway.drain(), 15)
    assert not gateway.bridge._tasks


TERMINAL_TYPES = ("RUN_FINISHED", "RUN_ERROR")


# -- 8. drain ----------------------------------------------------------------------------------


async def test_drain_ends_a_run_going_with_gateway_stopping(bench: Bench) -> None:
    gateway = await bench.gateway()
    reader = bench.reader(gateway)
    thread = f"drain-{uuid.uuid4().hex[:8]}"
    gone = bench.agent.disconnects
    run = await gateway.bridge.start("slow", thread, subject="tester", messages=[USER_1])
    await stored_until(bench, gateway, thread, lambda ev: len(ev) >= 3)
    await asyncio.wait_for(gateway.drain(), 15)
    assert run.done.is_set()
    assert await disconnected(bench.agent, gone + 1)
    events = await bench.events(gateway, thread, reader)
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "AGUI_HUB_GATEWAY_STOPPING"
    assert len(of_type(events, "RUN_ERROR")) == 1
    assert gateway.bridge.ended.get("AGUI_HUB_GATEWAY_STOPPING") == 1
    with pytest.raises(TooManyRuns):
        await gateway.bridge.start("ok", "after-drain", subject="tester")


# -- 9. the store goes away mid-run -------------------------------------------------------------


async def test_redis_restart_mid_run_stores_every_event_once(
    agent: UpstreamAgent, own_redis_aof: RedisServer, tmp_path: Path
) -> None:
    prefix = f"test-bridge-{uuid.uuid4().hex}"
    bench = Bench(
        agent,
        lambda: RedisStore(own_redis_aof.url, prefix=prefix, op_timeout=1),
        lambda _store: RedisStore(own_redis_aof.url, prefix=prefix),
        tmp_path,
    )
    try:
        gateway = await bench.gateway()
        refusals = spy_store_failures(gateway)
        thread = f"restart-{uuid.uuid4().hex[:8]}"
        run = await gateway.bridge.start("slow60", thread, subject="tester", messages=[USER_1])
        before = await stored_until(bench, gateway, thread, lambda ev: len(ev) >= 5)
        await asyncio.to_thread(own_redis_aof.stop)
        await asyncio.sleep(1.0)
        assert not run.done.is_set()
        await asyncio.to_thread(own_redis_aof.start)
        await asyncio.wait_for(run.done.wait(), 30 * TIMEOUT_SCALE)
        entries = await gateway.store.read(thread)
        events = [msgpack.unpackb(e.data, raw=False) for e in entries]
        assert len(before) < len(events)
        assert [e["type"] for e in events] == [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            *["TEXT_MESSAGE_CONTENT"] * 60,
            "TEXT_MESSAGE_END",
            "RUN_FINISHED",
        ], [e["type"] for e in events]
        assert [e["delta"] for e in of_type(events, "TEXT_MESSAGE_CONTENT")] == [
            f"{i} " for i in range(60)
        ]
        assert len({e.event_id for e in entries}) == len(entries)
        assert run.outcome == events[-1]
        assert refusals, "no append failed while Redis was down: the outage missed the run"
    finally:
        await bench.close()


async def test_redis_restart_losing_the_thread_still_ends_the_run(
    agent: UpstreamAgent, own_redis: RedisServer, tmp_path: Path
) -> None:
    # Without persistence the restart loses the thread (a new epoch): the rest of the run
    # cannot follow its RUN_STARTED. The run must still end, once, and the thread (now
    # empty of it) take the next run.
    prefix = f"test-bridge-{uuid.uuid4().hex}"
    bench = Bench(
        agent,
        lambda: RedisStore(own_redis.url, prefix=prefix, op_timeout=1),
        lambda _store: RedisStore(own_redis.url, prefix=prefix),
        tmp_path,
    )
    try:
        gateway = await bench.gateway()
        thread = f"lost-{uuid.uuid4().hex[:8]}"
        run = await gateway.bridge.start("slow60", thread, subject="tester", messages=[USER_1])
        await stored_until(bench, gateway, thread, lambda ev: len(ev) >= 5)
        await asyncio.to_thread(own_redis.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(own_redis.start)
        await asyncio.wait_for(run.done.wait(), 30 * TIMEOUT_SCALE)
        assert thread not in gateway.bridge.runs
        events = await bench.events(gateway, thread)
        assert len(of_type(events, "RUN_ERROR")) == 1, events
        assert not fold(events).run_active
        assert run.outcome is None or run.outcome["type"] != "RUN_FINISHED"
        later = await ended(
            await gateway.bridge.start("ok", thread, subject="tester", messages=[USER_2])
        )
        assert later.outcome is not None and later.outcome["type"] == "RUN_FINISHED"
    finally:
        await bench.close()


# -- 10. upstreams written by hand: what a stock agent server would not send ------------------

RawScript = Callable[[dict[str, Any], asyncio.StreamWriter], Awaitable[None]]

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\nConnection: close\r\n\r\n"
)
"""A streamed SSE answer's head: the body runs until the connection closes."""

AGENT_ERROR = {"type": "RUN_ERROR", "message": "no quota left", "code": "QUOTA_EXCEEDED"}
"""The RUN_ERROR the ``first_error`` scripts send as their first (and only) event."""

PING_EVERY = 0.2
"""Seconds between the ``pinger`` script's keepalive comments."""

PINGER_IDLE_TIMEOUT = 1
"""The idle timeout of the ``pinger`` agent (in its agents_file)."""


def sse_data(event: Event) -> bytes:
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class RawAgent:
    """An upstream agent written by hand on a raw asyncio server, on loopback.

    ``POST /<script>`` runs *scripts[script]* (given the request's JSON body and the
    connection's writer), which writes the answer byte for byte; the connection is
    closed when it returns. Every request is recorded as (path, headers with
    lower-case names, body); a script stopped because the hub closed the connection
    counts in :attr:`hung_up`.
    """

    def __init__(self, scripts: dict[str, RawScript]) -> None:
        self.scripts = scripts
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.hung_up = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawAgent:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()

    def url(self, script: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/{script}"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            path = request_line.split(" ")[1]
            headers: dict[str, str] = {}
            for line in lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))))
            self.requests.append((path, headers, body))
            await self.scripts[path.lstrip("/")](body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.hung_up += 1
        finally:
            writer.close()


async def gzipped(body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    """The ok run, compressed although the request asked for identity."""
    payload = gzip.compress(b"".join(sse_data(e) for e in wire(ok_events(body))))
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()


def first_error(delay: float) -> RawScript:
    """A run whose first event is the agent's RUN_ERROR, *delay* s after the head."""

    async def script(body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        await writer.drain()
        await asyncio.sleep(delay)
        writer.write(sse_data(AGENT_ERROR))
        await writer.drain()

    return script


async def pinger(body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    """RUN_STARTED, then only keepalive comments (until the hub hangs up, or WAIT s)."""
    started = {"type": "RUN_STARTED", "threadId": body["threadId"], "runId": body["runId"]}
    writer.write(SSE_HEAD + sse_data(started))
    await writer.drain()
    for _ in range(int(WAIT / PING_EVERY)):
        await asyncio.sleep(PING_EVERY)
        writer.write(b": ping\n\n")
        await writer.drain()


@pytest.fixture
async def raw_agent() -> AsyncIterator[RawAgent]:
    scripts: dict[str, RawScript] = {
        "gzip": gzipped,
        "first_error": first_error(0.0),
        "late_error": first_error(0.5),
        "pinger": pinger,
    }
    async with RawAgent(scripts) as raw:
        yield raw


async def raw_gateway(bench: Bench, raw: RawAgent) -> Gateway:
    """A gateway of *bench* whose agents are *raw*'s scripts (the ``pinger`` in a file,
    with its idle timeout)."""
    path = bench.tmp_path / "raw-agents.toml"
    path.write_text(
        f'[agents.pinger]\nurl = "{raw.url("pinger")}"\n'
        f"idle_timeout = {PINGER_IDLE_TIMEOUT}\nconnect_timeout = 5\n"
    )
    spec = ",".join(f"{name}={raw.url(name)}" for name in ("gzip", "first_error", "late_error"))
    return await bench.gateway(agents=f"{bench.agents_spec()},{spec}", agents_file=str(path))


def spy_appends(gateway: Gateway) -> list[list[Event]]:
    """Record the events of every append the bridge makes (the hub's publish, passed
    through unchanged, with ids ``bridge:...``): which events went together."""
    calls: list[list[Event]] = []
    publish = gateway.hub.publish

    async def recorded(thread: str, events: Any, event_ids: Any = None) -> Any:
        if event_ids and str(event_ids[0]).startswith("bridge:"):
            calls.append([dict(e) for e in events])
        return await publish(thread, events, event_ids)

    gateway.hub.publish = recorded  # type: ignore[method-assign]
    return calls


async def test_a_compressed_answer_is_refused_and_none_was_asked_for(
    mem_bench: Bench, raw_agent: RawAgent
) -> None:
    gateway = await raw_gateway(mem_bench, raw_agent)
    thread = f"gzip-{uuid.uuid4().hex[:8]}"
    run = await ended(
        await gateway.bridge.start("gzip", thread, subject="tester", messages=[USER_1])
    )
    # The request asked for no compression.
    (path, headers, sent), *_ = raw_agent.requests
    assert path == "/gzip" and sent["runId"] == run.run_id
    assert headers.get("accept-encoding") == "identity", headers
    # The compressed answer is refused by name, not fed to the SSE parser as garbage.
    events = await mem_bench.events(gateway, thread)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"], events
    assert events[0] == {
        "type": "RUN_STARTED",
        "threadId": thread,
        "runId": run.run_id,
        "input": {"threadId": thread, "runId": run.run_id, "messages": [USER_1]},
    }
    error = events[1]
    assert error["code"] == "AGUI_HUB_UPSTREAM_MALFORMED", error
    assert "Content-Encoding" in error["message"] and "'gzip'" in error["message"], error
    assert run.outcome == error
    assert not fold(events).run_active


async def test_an_agent_whose_first_event_is_run_error(bench: Bench, raw_agent: RawAgent) -> None:
    gateway = await raw_gateway(bench, raw_agent)
    thread = f"first-error-{uuid.uuid4().hex[:8]}"
    before = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "run-0"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "run-0"},
    ]
    await gateway.hub.publish(thread, before)
    appends = spy_appends(gateway)
    run = await ended(
        await gateway.bridge.start("first_error", thread, subject="tester", messages=[USER_1])
    )
    assert run.parent_run_id == "run-0"
    # The hub's RUN_STARTED (the input's run id, parent and new message) and the
    # agent's RUN_ERROR as it sent it, in one append.
    hub_started = {
        "type": "RUN_STARTED",
        "threadId": thread,
        "runId": run.run_id,
        "parentRunId": "run-0",
        "input": {
            "threadId": thread,
            "runId": run.run_id,
            "parentRunId": "run-0",
            "messages": [USER_1],
        },
    }
    assert appends == [[hub_started, AGENT_ERROR]], appends
    events = await bench.events(gateway, thread)
    assert events == [*before, hub_started, AGENT_ERROR]
    assert run.outcome == AGENT_ERROR
    assert gateway.bridge.ended == {"error": 1}
    folded = fold(events)
    assert not folded.run_active and not folded.rejected
    assert [m for m in folded.messages if m.get("role") == "user"] == [USER_1]
    await run_ok_after(bench, gateway, thread, run.run_id)


async def test_a_first_run_error_while_another_writer_runs_stores_nothing(
    bench: Bench, raw_agent: RawAgent
) -> None:
    # The agent sends its RUN_ERROR 0.5 s late; meanwhile another writer starts a run
    # in the thread. The RUN_ERROR must not end that run: nothing of ours is stored.
    gateway = await raw_gateway(bench, raw_agent)
    thread = f"first-error-taken-{uuid.uuid4().hex[:8]}"
    run = await gateway.bridge.start("late_error", thread, subject="tester", messages=[USER_1])
    other = {"type": "RUN_STARTED", "threadId": thread, "runId": "someone-else"}
    await gateway.hub.publish(thread, [other])
    began = time.monotonic()
    await ended(run)
    assert raw_agent.requests and raw_agent.requests[-1][2]["runId"] == run.run_id
    assert time.monotonic() - began > 0.2, "the run ended before its agent's RUN_ERROR came"
    events = await bench.events(gateway, thread)
    assert events == [other], events
    folded = fold(events)
    assert folded.run_active
    assert folded.current_run is not None and folded.current_run.run_id == "someone-else"
    with pytest.raises(RunActive):
        run.started.result()
    assert run.outcome is None
    assert gateway.bridge.ended == {"refused": 1}
    assert thread not in gateway.bridge.runs


async def test_keepalives_do_not_reset_the_idle_timeout(
    mem_bench: Bench, raw_agent: RawAgent
) -> None:
    # RUN_STARTED, then ": ping" every 0.2 s and no event: the idle timeout (1 s) counts
    # from the last event, not the last byte.
    gateway = await raw_gateway(mem_bench, raw_agent)
    thread = f"pinger-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    run = await gateway.bridge.start("pinger", thread, subject="tester", messages=[USER_1])
    await asyncio.wait_for(run.done.wait(), WAIT)
    took = time.monotonic() - began
    events = await mem_bench.events(gateway, thread)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"], events
    assert events[0]["runId"] == run.run_id
    assert events[0]["input"]["messages"] == [USER_1]
    error = events[1]
    assert error["code"] == "AGUI_HUB_UPSTREAM_TIMEOUT", error
    assert "keepalive" in error["message"], error
    assert f"{PINGER_IDLE_TIMEOUT:g} s" in error["message"], error
    assert PINGER_IDLE_TIMEOUT - 0.1 <= took < 2.5 * TIMEOUT_SCALE, took
    # The agent's response was closed (its next keepalive found the connection gone).
    deadline = time.monotonic() + WAIT
    while raw_agent.hung_up < 1:
        assert time.monotonic() < deadline, "the hub did not close the agent's response"
        await asyncio.sleep(0.05)


BIG_RAW = {"type": "RAW", "source": "langchain", "timestamp": 5, "event": {"data": "x" * 3000}}
"""A RAW event past the ``max_event_bytes`` of the test below."""


async def raw_heavy(body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
    """A short answer with a large RAW event after each of its events, as LangGraph's adapter."""
    thread, run = body["threadId"], body["runId"]
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run},
    ]
    sent = [e for event in events[:-1] for e in (event, BIG_RAW)] + events[-1:]
    writer.write(SSE_HEAD + b"".join(sse_data(e) for e in sent))
    await writer.drain()


async def test_raw_events_are_kept_stripped_or_dropped(mem_bench: Bench) -> None:
    """raw_events: the gateway's setting for every agent, an agent's own in
    agents_file; past max_event_bytes a kept RAW event ends the run."""
    async with RawAgent({"raw": raw_heavy}) as raw:
        path = mem_bench.tmp_path / "raw-events.toml"
        path.write_text(
            f'[agents.dropping]\nurl = "{raw.url("raw")}"\nraw_events = "drop"\n'
            f'[agents.keeping]\nurl = "{raw.url("raw")}"\nraw_events = "keep"\n'
        )
        gateway = await mem_bench.gateway(
            agents=f"stripping={raw.url('raw')}",
            agents_file=str(path),
            raw_events="strip",
            max_event_bytes=2000,
        )
        stored: dict[str, list[Event]] = {}
        for agent in ("stripping", "dropping", "keeping"):
            thread = f"raw-{agent}-{uuid.uuid4().hex[:6]}"
            await ended(await gateway.bridge.start(agent, thread, subject="tester"))
            stored[agent] = await mem_bench.events(gateway, thread)
    stripped = {"type": "RAW", "event": None, "source": "langchain", "timestamp": 5}
    assert [e["type"] for e in stored["stripping"]].count("RAW") == 4
    assert [e for e in stored["stripping"] if e["type"] == "RAW"] == [stripped] * 4
    assert stored["stripping"][-1]["type"] == "RUN_FINISHED"
    assert [e["type"] for e in stored["dropping"]] == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]  # fmt: skip
    kept = stored["keeping"]
    assert [e["type"] for e in kept] == ["RUN_STARTED", "RUN_ERROR"]
    assert kept[-1]["code"] == "AGUI_HUB_UPSTREAM_INVALID_EVENT"
    assert "payload_too_large" in kept[-1]["message"]
    with pytest.raises(ValueError, match="raw_events"):
        GatewayConfig(raw_events="some")
