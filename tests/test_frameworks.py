"""Agents built on real frameworks, served by their own AG-UI adapters, through the bridge.

A pydantic-ai agent (``AGUIAdapter`` over a scripted ``FunctionModel``: reasoning with a
signature, a streamed tool call with its result, state, streamed text) and a LangGraph
agent (ag-ui-langgraph's FastAPI endpoint over a scripted chat model: a streamed tool call,
its result, streamed text; RAW events, state and messages snapshots of its own), each served
on a loopback port as its users serve it (tests/framework_agents.py), and run through an
in-process gateway's bridge on the memory store and on Redis, with two WebSocket viewers
and one SSE viewer (``GET /threads/<t>/events?plain=1``) following the thread. Checked:

- what the thread stores is what the endpoint answered, field for field (a recorder in
  front of the endpoint keeps its answer), the RUN_STARTED keeping the new messages as its
  ``input``; the three viewers get exactly the stored events;
- a second run's input is built from the thread: the framework's model is given the first
  run's conversation (for pydantic-ai, the reasoning with its signature too);
- a cancel closes the request and the framework stops its model's stream;
- ``--raw-events strip`` and ``drop`` against ag-ui-langgraph's RAW events (the bytes
  stored per run, quoted in docs/agents.md, are printed with ``-s``);
- the official ``HttpAgent`` on ``POST /agents/<name>`` gets the same events as from the
  agent itself (needs Node.js and ``npm ci --prefix js``).

Without the framework packages the tests are skipped with the command that installs them;
under CI they fail instead (tests/conftest.py, ``unusable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgpack
import pytest

from agui_hub.agui.reducer import fold
from agui_hub.client.hub_client import HubClient, ThreadEvent
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from .conftest import TIMEOUT_SCALE, RedisServer, unusable

if TYPE_CHECKING:
    from .framework_agents import Script, Served

pytestmark = pytest.mark.timeout(60)

WAIT = 15 * TIMEOUT_SCALE
"""Longest wait for any one thing (a run's end, a viewer's events)."""

FRAMEWORKS = ("pydantic_ai", "langgraph", "ag_ui_langgraph", "fastapi")
INSTALL = "pip install -e '.[frameworks]'"

Event = dict[str, Any]

USER_1 = {"id": "user-1", "role": "user", "content": "What is six times seven?"}
USER_2 = {"id": "user-2", "role": "user", "content": "And plus one?"}
SLOW = {"id": "user-slow", "role": "user", "content": "Tell me something slow."}


def frameworks_missing() -> list[str]:
    return [name for name in FRAMEWORKS if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def agents() -> Iterator[dict[str, tuple[Served, Script]]]:
    """Both agents served for the module: name -> (the served endpoint, its script)."""
    missing = frameworks_missing()
    if missing:
        unusable(f"the agent frameworks are not installed ({', '.join(missing)}): {INSTALL}")
    from .framework_agents import Script, Served, langgraph_app, pydantic_ai_app

    scripts = {"pydantic_ai": Script(), "langgraph": Script()}
    with (
        Served(pydantic_ai_app(scripts["pydantic_ai"])) as pai,
        Served(langgraph_app(scripts["langgraph"])) as lg,
    ):
        yield {
            "pydantic_ai": (pai, scripts["pydantic_ai"]),
            "langgraph": (lg, scripts["langgraph"]),
        }


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> Callable[[], ThreadStore]:
    if request.param == "memory":
        return MemoryStore
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-frameworks-{uuid.uuid4().hex}"
    return lambda: RedisStore(server.url, prefix=prefix)


@contextlib.asynccontextmanager
async def started(store: ThreadStore, **config: Any) -> AsyncIterator[Gateway]:
    gateway = Gateway(
        GatewayConfig(host="127.0.0.1", port=0, http_port=0, ping_interval=None, **config),
        store=store,
    )
    await gateway.start()
    try:
        yield gateway
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(gateway.drain(), 15)


@pytest.fixture
async def gateway(
    agents: dict[str, tuple[Served, Script]], store_factory: Callable[[], ThreadStore]
) -> AsyncIterator[Gateway]:
    spec = ",".join(f"{name}={served.url}" for name, (served, _) in agents.items())
    async with started(store_factory(), agents=spec) as hub:
        yield hub


async def stored(gateway: Gateway, thread: str) -> list[Event]:
    return [msgpack.unpackb(e.data, raw=False) for e in await gateway.store.read(thread)]


def is_end(event: Event) -> bool:
    return event["type"] in ("RUN_FINISHED", "RUN_ERROR")


async def ws_viewer(gateway: Gateway, thread: str, runs: int, ready: asyncio.Event) -> list[Event]:
    """A WebSocket viewer subscribed from the start: the events of *runs* runs."""
    seen: list[Event] = []
    url = f"ws://127.0.0.1:{gateway.config.port}/"
    async with HubClient(url, open_timeout=WAIT) as hub, hub.subscribe(thread, "start") as sub:
        ready.set()
        async for item in sub:
            if isinstance(item, ThreadEvent):
                seen.append(item.event)
                if is_end(item.event) and sum(map(is_end, seen)) == runs:
                    return seen
    return seen


async def sse_viewer(gateway: Gateway, thread: str, runs: int, ready: asyncio.Event) -> list[Event]:
    """An SSE viewer (``?plain=1``: every ``data:`` line an AG-UI event)."""
    seen: list[Event] = []
    url = f"http://127.0.0.1:{gateway.config.http_port}/threads/{thread}/events?plain=1"
    async with (
        httpx.AsyncClient(trust_env=False, timeout=WAIT) as client,
        client.stream("GET", url) as response,
    ):
        assert response.status_code == 200
        ready.set()
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                seen.append(json.loads(line[5:]))
                if is_end(seen[-1]) and sum(map(is_end, seen)) == runs:
                    return seen
    return seen


class Viewers:
    """Two WebSocket viewers and one SSE viewer of a thread, started before its runs."""

    def __init__(self, gateway: Gateway, thread: str, runs: int) -> None:
        self.gateway, self.thread, self.runs = gateway, thread, runs
        self.tasks: list[asyncio.Task[list[Event]]] = []

    async def __aenter__(self) -> Viewers:
        readies = [asyncio.Event() for _ in range(3)]
        for ready, follow in zip(readies, [ws_viewer, ws_viewer, sse_viewer], strict=True):
            self.tasks.append(
                asyncio.create_task(follow(self.gateway, self.thread, self.runs, ready))
            )
        await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), WAIT)
        await asyncio.sleep(0.1)  # the SSE subscription is made right after its headers
        return self

    async def seen(self) -> list[list[Event]]:
        return list(await asyncio.wait_for(asyncio.gather(*self.tasks), WAIT))

    async def __aexit__(self, *exc: object) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def run_to_end(gateway: Gateway, agent: str, thread: str, message: Event) -> str:
    run = await gateway.bridge.start(agent, thread, subject="tester", messages=[message])
    await asyncio.wait_for(run.done.wait(), WAIT)
    return run.run_id


def as_recorded(sent: list[Event], run_input: Event, new_messages: list[Event]) -> list[Event]:
    """The agent's events as the thread keeps them: its RUN_STARTED with the new messages of
    the input recorded and its ``parentRunId`` filled in when it has none (docs/bridge.md,
    "What the thread remembers of the input")."""
    started = dict(sent[0])
    record: Event = {
        "threadId": run_input["threadId"],
        "runId": run_input["runId"],
        "messages": new_messages,
    }
    if run_input.get("parentRunId"):
        record["parentRunId"] = run_input["parentRunId"]
        started.setdefault("parentRunId", run_input["parentRunId"])
    return [{**started, "input": record}, *sent[1:]]


# -- a conversation of two runs, three viewers -------------------------------------------------


@pytest.mark.parametrize("framework", ["pydantic_ai", "langgraph"])
async def test_two_runs_stored_and_relayed_as_the_agent_sent_them(
    gateway: Gateway, agents: dict[str, tuple[Served, Script]], framework: str
) -> None:
    served, script = agents[framework]
    thread = f"{framework}-{uuid.uuid4().hex[:8]}"
    calls = len(script.seen)
    async with Viewers(gateway, thread, runs=2) as viewers:
        first = await run_to_end(gateway, framework, thread, USER_1)
        after_first = await stored(gateway, thread)
        second = await run_to_end(gateway, framework, thread, USER_2)
        seen = await viewers.seen()

    events = await stored(gateway, thread)
    exchanges = [served.recorder.by_run(first), served.recorder.by_run(second)]
    for exchange in exchanges:
        assert exchange.done.wait(WAIT)

    # Stored: exactly what the endpoint answered, field for field, run after run.
    one = as_recorded(exchanges[0].events, exchanges[0].input, [USER_1])
    two = as_recorded(exchanges[1].events, exchanges[1].input, [USER_2])
    assert events == one + two
    assert after_first == one
    # The viewers: the same events, in the same order.
    assert seen == [events, events, events]

    # What the agent sent, independently of the recorder: the script's run.
    types = [e["type"] for e in one]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    args = "".join(e["delta"] for e in one if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(args) == {"q": "six times seven"}
    (result,) = [e for e in one if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == "42" and result["toolCallId"] == "call-1"
    folded = fold(after_first)
    assert not folded.run_active
    answers = [m.get("content") for m in folded.messages if m["role"] == "assistant"]
    assert "The answer is 42." in answers

    # The second run's input: the thread's conversation, then the new message.
    sent = exchanges[1].input
    assert sent["threadId"] == thread and sent["parentRunId"] == first
    assert sent["messages"] == [*folded.messages, USER_2]
    assert sent["state"] == folded.state
    # ... which the framework handed its model: the first run is in the history.
    history = script.seen[calls + 2]  # call 1: the tool call, 2: the answer, 3: the new turn
    assert any("What is six times seven?" in line for line in history)
    assert any("The answer is 42." in line for line in history)
    assert history[-1].endswith("And plus one?")

    if framework == "pydantic_ai":
        reasoning = [e for e in one if e["type"].startswith("REASONING")]
        assert [e["type"] for e in reasoning] == [
            "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_END", "REASONING_ENCRYPTED_VALUE",
            "REASONING_END",
        ]  # fmt: skip
        assert "sig-abc" in reasoning[5]["encryptedValue"]
        assert folded.state == {"lookups": ["six times seven"]}
        # The reasoning went back to the model with its signature (round trip through the
        # hub's reducer, REASONING_ENCRYPTED_VALUE kept on the reasoning message).
        assert "thinking:Let me look it up.|sig-abc" in history
    else:
        # ag-ui-langgraph: RAW events and rawEvent copies, messages snapshots, steps.
        assert "RAW" in types and "MESSAGES_SNAPSHOT" in types and "STEP_STARTED" in types
        assert folded.state["turns"] == 2
        assert fold(events).state["turns"] == 4


# -- cancel ------------------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["pydantic_ai", "langgraph"])
async def test_a_cancel_stops_the_framework(
    gateway: Gateway, agents: dict[str, tuple[Served, Script]], framework: str
) -> None:
    served, script = agents[framework]
    script.stopped.clear()
    script.slow_sent = 0
    thread = f"cancel-{framework}-{uuid.uuid4().hex[:8]}"
    url = f"ws://127.0.0.1:{gateway.config.port}/"
    async with HubClient(url, open_timeout=WAIT) as hub, hub.subscribe(thread, "start") as sub:
        reply = await hub.run(thread, framework, messages=[SLOW])
        run_id = reply["runId"]
        async with asyncio.timeout(WAIT):
            async for item in sub:  # wait until the answer streams
                if isinstance(item, ThreadEvent) and item.event["type"] == "TEXT_MESSAGE_CONTENT":
                    break
        cancelled = await hub.cancel(thread, run_id)
        assert cancelled["type"] == "cancelled" and cancelled["status"] == "ended"

    # The agent's server saw its client go away.
    exchange = served.recorder.by_run(run_id)
    assert await asyncio.to_thread(exchange.disconnected.wait, WAIT)
    events = await stored(gateway, thread)
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "AGUI_HUB_RUN_CANCELLED"
    # What the thread holds before the hub's RUN_ERROR is what the agent had sent by then.
    assert exchange.done.wait(WAIT)
    sent = as_recorded(exchange.events, exchange.input, [SLOW])
    assert events[:-1] == sent[: len(events) - 1]
    assert not fold(events).run_active

    # And the framework stopped its model's stream, long before its end. pydantic-ai does;
    # ag-ui-langgraph's endpoint does not: its graph runs on to the end after the client
    # left (the same without the hub: a client that closes the request directly; see
    # docs/agents.md).
    from .framework_agents import SLOW_DELAY, SLOW_PIECES

    stopped = await asyncio.to_thread(script.stopped.wait, 20 * SLOW_DELAY * TIMEOUT_SCALE)
    if framework == "langgraph" and not stopped:
        pytest.xfail("ag-ui-langgraph runs the graph on after its client closed the request")
    assert stopped and script.slow_sent < SLOW_PIECES


# -- RAW events: what they cost, what --raw-events saves -----------------------------------------


def stored_bytes(entries: list[Any]) -> int:
    return sum(len(e.data) for e in entries)


async def test_raw_events_of_ag_ui_langgraph_kept_stripped_dropped(
    agents: dict[str, tuple[Served, Script]], tmp_path: Path
) -> None:
    from .framework_agents import Script, Served, langgraph_app

    served, _ = agents["langgraph"]
    with Served(langgraph_app(Script(), emit_raw_events=False)) as quiet:
        urls = {mode: served.url for mode in ("keep", "strip", "drop")}
        urls |= {"quiet": quiet.url, "pydantic_ai": agents["pydantic_ai"][0].url}
        agents_file = tmp_path / "agents.toml"
        agents_file.write_text(
            "".join(
                f'[agents.{name}]\nurl = "{url}"\n'
                + (f'raw_events = "{name}"\n' if name in ("keep", "strip", "drop") else "")
                for name, url in urls.items()
            )
        )
        sizes: dict[str, int] = {}
        counts: dict[str, int] = {}
        async with started(MemoryStore(), agents_file=str(agents_file)) as gateway:
            for name in urls:
                thread = f"raw-{name}-{uuid.uuid4().hex[:8]}"
                run_id = await run_to_end(gateway, name, thread, USER_1)
                entries = await gateway.store.read(thread)
                events = [msgpack.unpackb(e.data, raw=False) for e in entries]
                sent = (quiet if name == "quiet" else served).recorder.exchanges[-1].events
                sizes[name], counts[name] = stored_bytes(entries), len(events)
                assert events[-1]["type"] == "RUN_FINISHED"
                if name == "pydantic_ai":
                    continue
                assert (quiet if name == "quiet" else served).recorder.exchanges[-1].input[
                    "runId"
                ] == run_id
                raws = [e for e in events if e["type"] == "RAW"]
                others = [e for e in events if e["type"] != "RAW"]
                assert others[1:] == [e for e in sent if e["type"] != "RAW"][1:]
                if name == "keep":
                    assert raws == [e for e in sent if e["type"] == "RAW"]
                    sizes["raw"] = stored_bytes(
                        [e for e, v in zip(entries, events, strict=True) if v["type"] == "RAW"]
                    )
                    sizes["rawEvent"] = sum(
                        len(msgpack.packb(e["rawEvent"])) for e in others if "rawEvent" in e
                    )
                elif name == "strip":
                    assert raws and all(e["event"] is None for e in raws)
                else:
                    assert not raws
                if name == "quiet":
                    assert not any("rawEvent" in e for e in events)
    print(f"\nbytes stored for one run: {sizes}; events: {counts}")
    assert sizes["strip"] < sizes["keep"] / 2 and sizes["drop"] < sizes["strip"]
    assert sizes["quiet"] < sizes["drop"] / 2


# -- the official HttpAgent on POST /agents/<name> ----------------------------------------------


@pytest.mark.parametrize("framework", ["pydantic_ai", "langgraph"])
async def test_http_agent_gets_from_the_hub_what_the_agent_sends(
    gateway: Gateway, agents: dict[str, tuple[Served, Script]], framework: str
) -> None:
    from .nodejs import JS_DIR, node
    from .processes import child_env

    node_binary = node()  # skips (fails under CI) without Node.js and js/node_modules
    served, _ = agents[framework]
    thread = f"httpagent-{framework}-{uuid.uuid4().hex[:8]}"
    given = {"threadId": thread, "runId": f"run-{uuid.uuid4().hex[:8]}", "messages": [USER_1]}

    async def http_agent(url: str) -> dict[str, Any]:
        process = await asyncio.create_subprocess_exec(
            node_binary, str(JS_DIR / "test" / "httpagent-driver.mjs"),
            json.dumps({"url": url, **given}), cwd=JS_DIR, env=child_env(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), 2 * WAIT)
        assert process.returncode == 0, err.decode()
        report: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
        assert report["error"] is None and report["failures"] == [], report
        return report

    hub_url = f"http://127.0.0.1:{gateway.config.http_port}/agents/{framework}"
    through_hub = await http_agent(hub_url)
    # The HttpAgent applied exactly what the agent answered the hub (the recorder's copy).
    exchange = served.recorder.by_run(given["runId"])
    assert exchange.done.wait(WAIT)
    sent = exchange.events
    assert exchange.input["messages"] == [USER_1]
    applied = [e["type"] for e in through_hub["events"]]
    assert applied == [e["type"] for e in sent]
    assert through_hub["events"][-1] == sent[-1]
    assert through_hub["warnings"] == [], through_hub["warnings"]
    # The thread holds the run, and folds to the conversation the client has.
    events = await stored(gateway, thread)
    assert events == as_recorded(sent, exchange.input, [USER_1])
    assert fold(events).messages == through_hub["messages"]
