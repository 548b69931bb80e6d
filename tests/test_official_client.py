"""HubAgent: the official ``@ag-ui/client`` 1.0 on top of real gateways.

Each test starts ``agui-hub serve`` processes (memory store, or Redis) and
runs ``js/test/agent-driver.mjs``, which drives a ``HubAgent``
(``js/dist/agent.js``) through the official pipeline: ``connectAgent()`` /
``runAgent()`` with its chunk expansion, ``verifyEvents`` and default reducer,
all from the real npm packages. The verdict is the agent's ``messages`` and
``state`` against the hub's own reducer (:mod:`agui_hub.agui.reducer`, folded by
the Python client from the thread's start): they must be equal, and the
official client must not have warned or failed on anything the hub delivered.

Faults are real too: connections through :class:`tests.proxy.FaultProxy`
(cut, or refused for a while), retention that trims a thread while the
agent is away, a thread deleted from Redis and re-created under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from agui_hub.agui.reducer import fold
from agui_hub.cli.demo import demo_run
from agui_hub.client.hub_client import HubClient, Subscribed
from agui_hub.client.publisher import Publisher
from agui_hub.store import open_store
from agui_hub.wire.offsets import offset_key

from .conftest import TIMEOUT_SCALE, RedisServer
from .nodejs import JS_DIR, node
from .processes import ROOT, Gateways, child_env
from .proxy import FaultProxy

pytestmark = pytest.mark.timeout(60)

DRIVER = JS_DIR / "test" / "agent-driver.mjs"
AGENT_JS: Path | None = None
"""HubAgent built from js/src for this session (the ``built_js`` fixture)."""
WAIT = 25.0 * TIMEOUT_SCALE
"""Longest wait for any one thing; each test stays well under 30 s when all is well."""

Event = dict[str, Any]
Line = dict[str, Any]

# What the official pipeline may apply: AG-UI 1.0 event types, after its chunk
# expansion. Anything else (a hub "subscribed" or "snapshot" item, say) leaking
# into the stream would show up here.
AGUI_TYPES = {
    "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
    "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
    "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END", "REASONING_END", "REASONING_ENCRYPTED_VALUE",
    "STATE_SNAPSHOT", "STATE_DELTA", "MESSAGES_SNAPSHOT", "ACTIVITY_SNAPSHOT", "ACTIVITY_DELTA",
    "RAW", "CUSTOM", "RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "STEP_STARTED", "STEP_FINISHED",
    "SUBAGENT_STARTED", "SUBAGENT_FINISHED", "SUBAGENT_ERROR",
}  # fmt: skip


@pytest.fixture(autouse=True)
def agent_module(built_js: Path) -> None:
    global AGENT_JS
    AGENT_JS = built_js / "js" / "dist" / "agent.js"


def redis_url(redis: RedisServer) -> str:
    return f"{redis.url}?prefix=hubagent-{uuid.uuid4().hex[:12]}"


def new_thread() -> str:
    return f"agent-{uuid.uuid4().hex[:10]}"


# -- the node side ------------------------------------------------------------------------------


class NodeAgent:
    """``agent-driver.mjs`` as a child process: its stdout lines as they come, stdin to
    step it on, and its final report."""

    def __init__(self, url: str, thread: str, steps: list[dict[str, Any]], **config: Any) -> None:
        self.config = {"url": url, "thread": thread, "steps": steps, **config}
        self.config.setdefault("commandCwd", str(ROOT))
        self.lines: list[Line] = []
        self.stderr = b""
        self._changed = asyncio.Condition()
        self._process: asyncio.subprocess.Process | None = None
        self._readers: list[asyncio.Task[None]] = []

    async def start(self) -> NodeAgent:
        self._process = await asyncio.create_subprocess_exec(
            node(),
            str(DRIVER),
            json.dumps(self.config),
            cwd=JS_DIR,
            env={**child_env(), "AGUI_HUB_AGENT_MODULE": str(AGENT_JS)},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._readers = [
            asyncio.create_task(self._read_stdout()),
            asyncio.create_task(self._read_stderr()),
        ]
        return self

    async def _read_stdout(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            if raw.strip():
                line = json.loads(raw)
                async with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()

    async def _read_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        self.stderr = await self._process.stderr.read()

    def applied(self) -> int:
        """Events the official pipeline applied so far."""
        return sum(1 for line in self.lines if "n" in line)

    def said(self, key: str, value: Any = None, since: int = 0) -> bool:
        """Whether a line since line *since* has *key* (equal to *value*, unless None)."""
        return any(
            key in line and (value is None or line[key] == value) for line in self.lines[since:]
        )

    async def wait_for(self, what: Callable[[NodeAgent], bool], timeout: float = WAIT) -> None:
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: what(self))
        except TimeoutError:
            tail = self.lines[-5:]
            pytest.fail(f"node agent: not there in {timeout} s; last lines {tail}\n{self.stderr!r}")

    async def step(self) -> None:
        """Let a ``wait`` or ``detached`` step go on."""
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(b"go\n")
        await self._process.stdin.drain()

    async def result(self, timeout: float = WAIT) -> dict[str, Any]:
        assert self._process is not None
        try:
            async with asyncio.timeout(timeout):
                code = await self._process.wait()
                await asyncio.gather(*self._readers)
        except TimeoutError:
            pytest.fail(f"node agent did not finish in {timeout} s: {self.lines[-5:]}")
        assert code == 0, f"node agent exited {code}:\n{self.stderr.decode(errors='replace')}"
        report = self.lines[-1]
        assert "messages" in report, f"no report: {self.lines[-3:]}"
        return report

    def kill(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.kill()


@contextlib.asynccontextmanager
async def node_agent(
    url: str, thread: str, steps: list[dict[str, Any]], **config: Any
) -> AsyncIterator[NodeAgent]:
    agent = await NodeAgent(url, thread, steps, **config).start()
    try:
        yield agent
    finally:
        agent.kill()


# -- the hub side ------------------------------------------------------------------------------


async def reducer_view(url: str, thread: str) -> dict[str, Any]:
    """The hub's own reducer on the whole thread: messages and state, as JSON."""
    async with (
        HubClient(url, encoding="json") as hub,
        hub.subscribe(thread, "start", state=True) as sub,
    ):
        head: str | None = None
        async with asyncio.timeout(WAIT):
            async for item in sub:
                if isinstance(item, Subscribed):
                    head = head or item.offset
                    if head == "0-0":
                        break
                    continue
                assert head is not None
                if offset_key(item.offset) >= offset_key(head):
                    break
        assert sub.state is not None
        view = {"messages": sub.state.messages, "state": sub.state.state}
    # Nothing is normalised but the JSON round trip (tuples, key order): the
    # official reducer and the hub's build the same messages, field for field.
    return json.loads(json.dumps(view))


async def cli(url: str, *args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agui_hub.cli", *args, "--url", url,
        cwd=ROOT, env=child_env(), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    async with asyncio.timeout(WAIT):
        _, err = await process.communicate()
    assert process.returncode == 0, err.decode(errors="replace")


def demo_events(thread: str, run_id: str) -> list[Event]:
    return [event for _delay, event in demo_run(thread, run_id)]


async def publish(url: str, thread: str, events: list[Event], batch: int = 500) -> None:
    async with HubClient(url) as hub:
        for at in range(0, len(events), batch):
            await asyncio.wait_for(hub.publish(thread, events[at : at + batch]), WAIT)


def assert_clean(report: dict[str, Any]) -> None:
    """The official client applied only AG-UI events, and warned and failed about nothing."""
    assert report["warnings"] == []
    assert set(report["eventTypes"]) <= AGUI_TYPES
    for step in report["steps"]:
        assert step.get("error") is None, step


async def assert_equal_to_reducer(report: dict[str, Any], url: str, thread: str) -> None:
    expected = await reducer_view(url, thread)
    assert report["state"] == expected["state"]
    assert [m["id"] for m in report["messages"]] == [m["id"] for m in expected["messages"]]
    assert report["messages"] == expected["messages"]


# -- tests -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("store", "start", "encoding", "shared"),
    [
        ("memory", "start", "msgpack", False),
        ("memory", "snapshot", "json", True),
        ("redis", "start", "json", True),
        ("redis", "snapshot", "msgpack", False),
    ],
)
async def test_connect_agent_ends_with_the_hubs_reducer_state(
    gateways: Gateways,
    redis_server: RedisServer,
    store: str,
    start: str,
    encoding: str,
    shared: bool,
) -> None:
    gateway = gateways.start(redis_url(redis_server) if store == "redis" else None)
    thread = new_thread()
    await cli(gateway.url, "demo", thread, "--speed", "0", "--runs", "2")

    config = {"from": start, "encoding": encoding, "shared": shared}
    steps = [{"op": "connect"}, {"op": "connect"}]
    async with node_agent(gateway.url, thread, steps, **config) as agent:
        report = await agent.result()

    assert_clean(report)
    # A client given to the agent stays open after its streams; its own are closed.
    statuses = [line["status"] for line in agent.lines if "status" in line]
    if shared:
        assert report["sharedStatus"] == "open" and statuses == []
    else:
        # One client per stream, closed when the stream ends (the last close may come
        # after the report).
        assert statuses.count("open") == 2 and "closed" in statuses
    assert report["steps"][1]["newMessages"] == []
    await assert_equal_to_reducer(report, gateway.url, thread)
    assert len(report["messages"]) == 12  # two runs of six messages
    first = report["steps"][0]
    assert len(first["newMessages"]) == 12
    assert first["result"] == {"cities": ["Paris", "Berlin"], "warmest": "Paris"}
    assert report["stats"]["snapshots"] == (1 if start == "snapshot" else 0)
    assert report["stats"]["resyncs"] == 0
    if start == "snapshot":
        # A late joiner gets the compact form, not every token delta.
        assert report["eventTypes"].count("TEXT_MESSAGE_CONTENT") == 0
        assert "MESSAGES_SNAPSHOT" in report["eventTypes"]


@pytest.mark.parametrize("start", ["start", "snapshot"])
async def test_attached_to_a_running_run_it_ends_with_the_run(
    gateways: Gateways, start: str
) -> None:
    gateway = gateways.start()
    thread = new_thread()
    # --speed 2 rather than 4: the run lasts about three seconds, so the agent (a Node
    # process to start) surely attaches while it runs, however loaded the machine.
    demo = asyncio.create_task(cli(gateway.url, "demo", thread, "--speed", "2"))
    try:
        # Attach once the run is well under way: text streaming, tool calls to come.
        async with HubClient(gateway.url) as hub, hub.subscribe(thread, "start") as sub:
            seen = 0
            async with asyncio.timeout(WAIT):
                async for item in sub:
                    seen += not isinstance(item, Subscribed)
                    if seen >= 30:
                        break
        assert not demo.done()
        async with node_agent(gateway.url, thread, [{"op": "connect"}], **{"from": start}) as agent:
            report = await agent.result()
            # follow "run": it ended with the run, so the demo has finished by now.
            await asyncio.wait_for(demo, WAIT)
    finally:
        demo.cancel()
        with contextlib.suppress(BaseException):
            await demo

    assert_clean(report)
    assert report["eventTypes"][-1] == "RUN_FINISHED"
    assert report["eventTypes"].count("RUN_STARTED") == 1
    await assert_equal_to_reducer(report, gateway.url, thread)
    if start == "snapshot":
        # The snapshot reopened what was streaming, and the live deltas continued it.
        at = report["eventTypes"].index("MESSAGES_SNAPSHOT")
        assert "TEXT_MESSAGE_CONTENT" in report["eventTypes"][at:]


async def test_a_dropped_connection_mid_run_is_one_uninterrupted_stream(
    gateways: Gateways,
) -> None:
    gateway = gateways.start()
    thread = new_thread()
    async with FaultProxy("127.0.0.1", gateway.port) as proxy:
        demo = asyncio.create_task(cli(gateway.url, "demo", thread, "--speed", "2"))
        try:
            async with HubClient(gateway.url) as hub, hub.subscribe(thread, "start") as sub:
                async with asyncio.timeout(WAIT):
                    async for item in sub:
                        if not isinstance(item, Subscribed):
                            break  # the run has started: follow "run" will wait for its end
            async with node_agent(
                f"ws://127.0.0.1:{proxy.port}", thread, [{"op": "connect"}]
            ) as agent:
                for cut_at in (10, 40, 70):
                    await agent.wait_for(lambda a, n=cut_at: a.applied() >= n)  # type: ignore[misc]
                    assert proxy.cut_all() >= 1
                report = await agent.result()
            await asyncio.wait_for(demo, WAIT)
        finally:
            demo.cancel()
            with contextlib.suppress(BaseException):
                await demo

    assert_clean(report)
    assert report["stats"]["resumes"] >= 3
    # Nothing was lost: no snapshot had to replace anything.
    assert report["stats"]["resyncs"] == 0 and report["stats"]["snapshots"] == 0
    assert report["eventTypes"].count("RUN_STARTED") == 1
    assert report["eventTypes"][-1] == "RUN_FINISHED"
    assert any(line.get("status") == "reconnecting" for line in agent.lines)
    await assert_equal_to_reducer(report, gateway.url, thread)


def chunked_run(thread: str, run_id: str) -> tuple[list[Event], list[Event]]:
    """A run streamed with *_CHUNK events, cut where a tool call's arguments stream."""
    first: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": f"{run_id}-q", "role": "user",
         "delta": "Weather in Oslo?"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": f"{run_id}-a1", "delta": "Let me "},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": "check."},
        {"type": "TOOL_CALL_CHUNK", "toolCallId": f"{run_id}-tc", "toolCallName": "get_weather",
         "parentMessageId": f"{run_id}-a1", "delta": '{"city": '},
        {"type": "TOOL_CALL_CHUNK", "delta": '"Os'},
    ]  # fmt: skip
    second: list[Event] = [
        {"type": "TOOL_CALL_CHUNK", "delta": 'lo"}'},
        {"type": "TOOL_CALL_RESULT", "messageId": f"{run_id}-res", "toolCallId": f"{run_id}-tc",
         "content": '{"temperature": 3}', "role": "tool"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"city": "Oslo", "temperature": 3}},
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": f"{run_id}-th", "delta": "Cold: "},
        {"type": "REASONING_MESSAGE_CHUNK", "delta": "suggest a coat."},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": f"{run_id}-a2", "delta": "It is 3 °C"},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": " in Oslo: take a coat."},
        {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/advice", "value": "coat"}]},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id},
    ]  # fmt: skip
    return first, second


@pytest.mark.parametrize("start", ["start", "snapshot"])
async def test_chunk_events_pass_the_official_transform_chunks(
    gateways: Gateways, start: str
) -> None:
    gateway = gateways.start()
    thread = new_thread()
    await cli(gateway.url, "demo", thread, "--speed", "0")
    first, second = chunked_run(thread, "chunky")
    await publish(gateway.url, thread, first)

    async with node_agent(gateway.url, thread, [{"op": "connect"}], **{"from": start}) as agent:
        # Caught up inside the chunked run (its tool call's arguments half streamed).
        await agent.wait_for(lambda a: a.said("type", "TOOL_CALL_START"))
        await publish(gateway.url, thread, second)
        report = await agent.result()

    assert_clean(report)
    types = report["eventTypes"]
    assert not any(t.endswith("_CHUNK") for t in types)  # expanded by transformChunks
    await assert_equal_to_reducer(report, gateway.url, thread)
    by_id = {m["id"]: m for m in report["messages"]}
    assert by_id["chunky-a1"]["content"] == "Let me check."
    assert by_id["chunky-a1"]["toolCalls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert by_id["chunky-a2"]["content"] == "It is 3 °C in Oslo: take a coat."
    assert by_id["chunky-th"]["content"] == "Cold: suggest a coat."


@pytest.mark.parametrize("later", ["same run", "next run"])
async def test_events_trimmed_while_away_resync_into_a_valid_stream(
    gateways: Gateways, later: str
) -> None:
    # A retention of 20 events: while the agent is cut off, its position is trimmed away
    # and the hub can only answer with a snapshot (recovered: false).
    gateway = gateways.start("memory://?max_len=20")
    thread = new_thread()
    run2 = demo_events(thread, "run-2")
    # A viewer keeps the thread's channel folding every event as it is stored (batches
    # smaller than the retention), so the hub's snapshots know every run.
    async with HubClient(gateway.url) as viewer, viewer.subscribe(thread, "live"):
        await publish(gateway.url, thread, demo_events(thread, "run-1") + run2[:76], batch=5)
        async with (
            FaultProxy("127.0.0.1", gateway.port) as proxy,
            node_agent(f"ws://127.0.0.1:{proxy.port}", thread, [{"op": "connect"}]) as agent,
        ):
            # Caught up inside run-2, where the answer is streaming.
            await agent.wait_for(lambda a: a.said("snapshot"))
            await agent.wait_for(lambda a: a.said("type", "TEXT_MESSAGE_START"))
            mark, seen = len(agent.lines), agent.applied()
            proxy.refusing = True
            proxy.cut_all()
            away = run2[76:100] if later == "same run" else run2[76:] + demo_events(thread, "run-3")
            await publish(gateway.url, thread, away, batch=5)  # trims past the agent's position
            proxy.refusing = False
            await agent.wait_for(lambda a: a.said("snapshot", since=mark))
            if later == "same run":
                await publish(gateway.url, thread, run2[100:])
            report = await agent.result()

    assert_clean(report)
    assert report["stats"]["resyncs"] == 1
    types = report["eventTypes"]
    assert types[-1] == "RUN_FINISHED"
    at = types.index("MESSAGES_SNAPSHOT", seen)
    if later == "same run":
        # run-2 went on, and so did its answer, streaming on both sides: no end and no
        # second start for it, no second RUN_STARTED.
        assert "RUN_STARTED" not in types[seen:]
        assert "TEXT_MESSAGE_START" not in types[seen:]
        assert types[seen:].count("TEXT_MESSAGE_END") == 1
    else:
        # run-2 ended with its own RUN_FINISHED (the snapshot has it), then run-3.
        assert types[seen:at].count("RUN_FINISHED") == 1
        assert types[at - 1] == "RUN_STARTED"
    await assert_equal_to_reducer(report, gateway.url, thread)


async def test_a_run_whose_start_was_trimmed_before_the_hub_folded_it(gateways: Gateways) -> None:
    # Stored in one batch past the retention before any gateway folded the thread: its
    # RUN_STARTED is gone, and the hub's snapshot has no run to put its state in.
    gateway = gateways.start("memory://?max_len=20")
    thread = new_thread()
    ticks = [{"type": "CUSTOM", "name": "tick", "value": n} for n in range(13)]
    head: list[Event] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "long"},
        {"type": "STEP_STARTED", "stepName": "write"},
        *ticks,
        {"type": "STATE_SNAPSHOT", "snapshot": {"progress": 0}},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *(
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"w{n} "}
            for n in range(13)
        ),
    ]
    tail: list[Event] = [
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"x{n} "} for n in range(5)),
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/progress", "value": 1}]},
        {"type": "STEP_FINISHED", "stepName": "write"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "long"},
    ]
    await publish(gateway.url, thread, head)

    # The viewer keeps the channel that folded the trimmed thread: the hub's reducer, read
    # at the end, is the one the agent's snapshot came from (a channel made later would
    # fold only the 20 events left by then).
    async with HubClient(gateway.url) as viewer, viewer.subscribe(thread, "live"):
        async with node_agent(gateway.url, thread, [{"op": "connect"}]) as agent:
            await agent.wait_for(lambda a: a.said("snapshot"))
            await publish(gateway.url, thread, tail)
            report = await agent.result()
        expected = await reducer_view(gateway.url, thread)

    assert_clean(report)
    types = report["eventTypes"]
    # A made-up RUN_STARTED around the snapshot; m1 reopened before its live deltas; the
    # end of the step opened before the snapshot dropped, as the hub's reducer drops it.
    assert types[:4] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT", "TEXT_MESSAGE_START"]
    assert "STEP_FINISHED" not in types
    assert types[-1] == "RUN_FINISHED"
    assert (report["messages"], report["state"]) == (expected["messages"], expected["state"])
    assert report["messages"][0]["content"].endswith("w12 x0 x1 x2 x3 x4 ")


async def test_a_thread_deleted_and_recreated_under_the_agent(
    gateways: Gateways, redis_server: RedisServer
) -> None:
    store_url = redis_url(redis_server)
    gateway = gateways.start(store_url)
    thread = new_thread()
    old = demo_events(thread, "old-1") + demo_events(thread, "old-2")[:50]
    await publish(gateway.url, thread, old)

    async with node_agent(gateway.url, thread, [{"op": "detached"}]) as agent:
        await agent.wait_for(lambda a: a.applied() >= len(old))  # inside old-2
        store = open_store(store_url)
        try:
            await store.delete(thread)
        finally:
            await store.close()
        # Straight into Redis, as another producer would: a new stream, a new epoch.
        async with Publisher(store_url) as publisher:
            new = demo_events(thread, "new-1")
            await asyncio.wait_for(publisher.publish_batch(thread, new), WAIT)
        await agent.wait_for(lambda a: a.said("finished", "new-1"))
        await agent.step()  # detach
        report = await agent.result()

    assert_clean(report)
    assert report["stats"]["resyncs"] == 1
    # old-2's end is gone with the old thread: the agent ended it with a RUN_ERROR of its
    # own, then took the new thread (as a snapshot, or as an empty one and its events).
    assert report["eventTypes"].count("RUN_ERROR") == 1
    expected = await reducer_view(gateway.url, thread)
    assert report["state"] == expected["state"]
    # The official reducer keeps reasoning messages that a MESSAGES_SNAPSHOT without any
    # reasoning message leaves out (it takes them for client-side ones): after a reset to
    # an empty thread, the old thread's survive. That is the only difference allowed.
    ids = {m["id"] for m in expected["messages"]}
    kept = [m for m in report["messages"] if m["id"] in ids or m["role"] != "reasoning"]
    assert kept == expected["messages"]
    assert {m["id"].split("-")[0] for m in expected["messages"]} == {"new"}


async def test_run_agent_with_start_run_resolves_with_the_new_messages(
    gateways: Gateways,
) -> None:
    gateway = gateways.start()
    thread = new_thread()
    await cli(gateway.url, "demo", thread, "--speed", "0", "--run-id", "before")
    demo = [sys.executable, "-m", "agui_hub.cli", "demo", thread, "--run-id", "RUN_ID",
            "--speed", "4", "--url", gateway.url]  # fmt: skip
    steps = [{"op": "connect"}, {"op": "run", "command": demo}, {"op": "connect"},
             {"op": "runWithoutStartRun"}]  # fmt: skip

    async with node_agent(gateway.url, thread, steps) as agent:
        report = await agent.result()

    connect, run, again, bare = report["steps"]
    assert connect.get("error") is None and run.get("error") is None
    assert len(connect["newMessages"]) == 6
    run_id = run["newMessages"][0].rsplit("-", 1)[0]
    assert run["newMessages"] == [f"{run_id}-{name}" for name in
                                  ("question", "thought", "intro", "result-paris",
                                   "result-berlin", "answer")]  # fmt: skip
    assert run["result"] == {"cities": ["Paris", "Berlin"], "warmest": "Paris"}
    # The run was followed from where connect() stopped: nothing to catch up after it.
    assert again["newMessages"] == [] and again["position"] == run["position"]
    assert "connectAgent()" in bare["error"] and "startRun" in bare["error"]
    await assert_equal_to_reducer(report, gateway.url, thread)


async def test_a_run_from_run_agent_is_not_replayed_by_connect_agent(
    gateways: Gateways,
) -> None:
    gateway = gateways.start()
    thread = new_thread()
    await cli(gateway.url, "demo", thread, "--speed", "0", "--run-id", "before")
    demo = [sys.executable, "-m", "agui_hub.cli", "demo", thread, "--run-id", "RUN_ID",
            "--speed", "0", "--url", gateway.url]  # fmt: skip

    async with node_agent(
        gateway.url, thread, [{"op": "run", "command": demo}, {"op": "connect"}]
    ) as agent:
        report = await agent.result()

    assert_clean(report)
    run, connect = report["steps"]
    # connect() replays the thread from its start: the earlier run is new to the agent,
    # the one runAgent() streamed is not applied a second time.
    assert [m.split("-")[0] for m in connect["newMessages"]] == ["before"] * 6
    expected = await reducer_view(gateway.url, thread)
    ids = [m["id"] for m in report["messages"]]
    assert sorted(ids) == sorted(m["id"] for m in expected["messages"])  # no duplicates
    by_id = {m["id"]: m for m in expected["messages"]}
    for message in report["messages"]:  # in the order the agent learned them
        assert message == by_id[message["id"]]
    assert report["state"] == expected["state"]
    assert len(run["newMessages"]) == 6


async def test_a_second_connect_agent_adds_no_duplicates(gateways: Gateways) -> None:
    gateway = gateways.start()
    thread = new_thread()
    await cli(gateway.url, "demo", thread, "--speed", "0", "--run-id", "one")
    steps = [{"op": "connect"}, {"op": "wait", "label": "published"}, {"op": "connect"},
             {"op": "detached"}, {"op": "connect"}]  # fmt: skip

    async with node_agent(gateway.url, thread, steps) as agent:
        await agent.wait_for(lambda a: a.said("waiting", "published"))
        await cli(gateway.url, "demo", thread, "--speed", "0", "--run-id", "two")
        await agent.step()
        # Followed for ever, then detached in the middle of run three (inside its step,
        # reasoning span and reasoning message): the next connect() continues the run from
        # there, in a new pipeline.
        await agent.wait_for(lambda a: a.said("waiting", "detach"))
        before = agent.applied()
        demo = asyncio.create_task(
            cli(gateway.url, "demo", thread, "--speed", "2", "--run-id", "three")
        )
        try:
            await agent.wait_for(lambda a: a.applied() >= before + 20)
            await agent.step()
            report = await agent.result()
            await asyncio.wait_for(demo, WAIT)
        finally:
            demo.cancel()
            with contextlib.suppress(BaseException):
                await demo

    assert_clean(report)
    first, _wait, second, detached, third = report["steps"]
    assert [m.split("-")[0] for m in first["newMessages"]] == ["one"] * 6
    assert [m.split("-")[0] for m in second["newMessages"]] == ["two"] * 6
    assert [m.split("-")[0] for m in detached["newMessages"] + third["newMessages"]] == [
        "three"
    ] * 6
    assert detached["newMessages"], "detached before run three had a message"
    await assert_equal_to_reducer(report, gateway.url, thread)
    ids = [m["id"] for m in report["messages"]]
    assert len(ids) == len(set(ids)) == 18


# -- branches ------------------------------------------------------------------------------------


async def branch_view(url: str, thread: str, branch: str) -> dict[str, Any]:
    """The hub's snapshot of one branch (a branch subscription from a snapshot), as JSON."""
    async with (
        HubClient(url, encoding="json") as hub,
        hub.subscribe(thread, "snapshot", branch=branch, state=True) as sub,
    ):
        async with asyncio.timeout(WAIT):
            async for item in sub:
                if not isinstance(item, Subscribed):
                    break  # the snapshot
        assert sub.state is not None
        view = {"messages": sub.state.messages, "state": sub.state.state}
    return json.loads(json.dumps(view))


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_official_client_on_a_branch_ends_with_the_hubs_branch_snapshot(
    gateways: Gateways, seed: int
) -> None:
    """Random trees of runs: HubAgent on one branch (from the start, and from a
    snapshot) ends with the same messages and state as the hub's snapshot of that
    branch, which is the fold of the runs on the branch's path."""
    rng = random.Random(seed)
    gateway = gateways.start(None)
    thread = new_thread()
    parents: dict[str, str | None] = {}
    events: dict[str, list[Event]] = {}
    previous: str | None = None
    for i in range(6):
        run_id = f"{thread}-r{i}"
        run = demo_events(thread, run_id)
        named = rng.choice([None, *parents]) if parents else None
        if named is not None:
            run[0] = {**run[0], "parentRunId": named}
        parents[run_id] = named if named is not None else previous
        events[run_id] = run
        previous = run_id
        await publish(gateway.url, thread, run)
    children = {p for p in parents.values() if p is not None}
    leaves = [r for r in parents if r not in children]
    assert len(leaves) >= 2, parents  # a tree with branches (the seeds make sure)
    for leaf, start in zip(leaves[-2:], ["start", "snapshot"], strict=False):
        path: list[str] = []
        at: str | None = leaf
        while at is not None:
            path.append(at)
            at = parents[at]
        expected = fold([e for run in reversed(path) for e in events[run]])
        hub = await branch_view(gateway.url, thread, leaf)
        assert hub == json.loads(
            json.dumps({"messages": expected.messages, "state": expected.state})
        )
        config = {"from": start, "encoding": "json", "branch": leaf}
        async with node_agent(gateway.url, thread, [{"op": "connect"}], **config) as agent:
            report = await agent.result()
        assert_clean(report)
        assert report["state"] == hub["state"]
        assert report["messages"] == hub["messages"], (leaf, path)


async def test_run_agent_on_a_branch_starts_a_new_version_there(gateways: Gateways) -> None:
    """HubAgent on a branch: runAgent() hands startRun an input whose parentRunId is
    the branch's latest run, the agent publishes its run there, and HubAgent ends
    with that branch (never the other one)."""
    gateway = gateways.start(None)
    thread = new_thread()
    for run_id, parent in [("r1", None), ("r2", None), ("r3", "r1")]:  # r3 regenerates r2
        run = demo_events(thread, run_id)
        if parent is not None:
            run[0] = {**run[0], "parentRunId": parent}
        await publish(gateway.url, thread, run)
    demo = [sys.executable, "-m", "agui_hub.cli", "demo", thread, "--run-id", "RUN_ID",
            "--parent-run-id", "PARENT_RUN_ID", "--speed", "0", "--url", gateway.url]  # fmt: skip
    steps = [{"op": "connect"}, {"op": "run", "command": demo}]
    async with node_agent(gateway.url, thread, steps, encoding="json", branch="r2") as agent:
        report = await agent.result()
    assert_clean(report)
    connect, run = report["steps"]
    assert connect.get("error") is None and run.get("error") is None, report["steps"]
    run_id = run["newMessages"][0].rsplit("-", 1)[0]
    async with HubClient(gateway.url) as hub:
        tree = await hub.runs(thread)
    assert tree.by_id[run_id].parent_run_id == "r2"  # a new version after r2, not after r3
    hub_view = await branch_view(gateway.url, thread, run_id)
    assert report["messages"] == hub_view["messages"]
    assert not [m for m in report["messages"] if m["id"].startswith("r3-")]
