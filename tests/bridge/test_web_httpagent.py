"""The real ``HttpAgent`` of npm ``@ag-ui/client`` against ``POST /agents/<name>``.

``js/test/httpagent-driver.mjs`` runs a stock ``HttpAgent`` (from js/node_modules)
once and prints the events its pipeline applied, its final messages and state,
and how the run ended. Each test points it (a) at the upstream agent
(tests/upstream_agent.py) directly and (b) at an in-process gateway's HTTP
listener running that same agent, with the same threadId, runId, messages and
state: an AG-UI client must not be able to tell the hub from the agent, except
that the hub keeps the run in the thread (checked against the store and the
hub's reducer) and says the AG-UI way (RUN_ERROR) when the agent failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import msgpack
import pytest

from agui_hub.agui.reducer import fold
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..nodejs import JS_DIR, node
from ..processes import child_env
from ..upstream_agent import UpstreamAgent, ok_transcript_text, serve_agent

pytestmark = pytest.mark.timeout(60)

DRIVER = JS_DIR / "test" / "httpagent-driver.mjs"
WAIT = 30 * TIMEOUT_SCALE
"""Longest a driver run may take (Node starts in well under a second)."""

Event = dict[str, Any]


async def run_http_agent(url: str, **input: Any) -> dict[str, Any]:
    """Run the official HttpAgent once against *url*; its report (see the driver)."""
    process = await asyncio.create_subprocess_exec(
        node(),
        str(DRIVER),
        json.dumps({"url": url, **input}),
        cwd=JS_DIR,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), WAIT)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"the HttpAgent driver did not finish within {WAIT} s")
    assert process.returncode == 0, f"driver exited {process.returncode}:\n{err.decode()}"
    lines = [line for line in out.decode().splitlines() if line.strip()]
    assert lines, f"the driver printed nothing:\n{err.decode()}"
    report: dict[str, Any] = json.loads(lines[-1])
    report["stderr"] = err.decode()
    return report


@pytest.fixture(scope="module")
def agent() -> Iterator[UpstreamAgent]:
    with serve_agent() as served:
        yield served


@pytest.fixture(params=["memory", "redis"])
def store_factory(request: pytest.FixtureRequest) -> Callable[[], ThreadStore]:
    if request.param == "memory":
        return MemoryStore
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-web-httpagent-{uuid.uuid4().hex}"
    return lambda: RedisStore(server.url, prefix=prefix)


@pytest.fixture
async def gateway(
    agent: UpstreamAgent, store_factory: Callable[[], ThreadStore]
) -> AsyncIterator[Gateway]:
    node()  # skips (fails under CI) when node or js/node_modules is missing
    agents = ",".join(
        [
            f"ok={agent.url('ok')}",
            f"chunks={agent.url('chunks')}",
            f"refuses={agent.url('error_event')}",
            f"boom={agent.url('status')}",
        ]
    )
    hub = Gateway(
        GatewayConfig(host="127.0.0.1", port=0, http_port=0, ping_interval=None, agents=agents),
        store=store_factory(),
    )
    await hub.start()
    try:
        yield hub
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(hub.drain(), 15)


def hub_url(gateway: Gateway, name: str) -> str:
    return f"http://127.0.0.1:{gateway.config.http_port}/agents/{name}"


def conversation(thread: str) -> dict[str, Any]:
    """The input both runs get: the same thread, run, messages, state, tools and context."""
    return {
        "threadId": thread,
        "runId": f"run-{uuid.uuid4().hex[:8]}",
        "messages": [
            {"id": "sys", "role": "system", "content": "Be brief."},
            {"id": "u1", "role": "user", "content": "What is 6 x 7?"},
        ],
        "state": {"turn": 0, "items": ["start"]},
        "tools": [
            {
                "name": "lookup",
                "description": "Look something up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
        "context": [{"description": "locale", "value": "en-GB"}],
        "forwardedProps": {"trace": "abc"},
    }


async def stored(gateway: Gateway, thread: str) -> list[Event]:
    return [msgpack.unpackb(e.data, raw=False) for e in await gateway.store.read(thread)]


def clean(report: dict[str, Any]) -> None:
    """The client neither failed nor warned about anything it was sent."""
    assert report["error"] is None, report["error"]
    assert report["failures"] == [], report["failures"]
    assert report["warnings"] == [], report["warnings"]


@pytest.mark.parametrize("name", ["ok", "chunks"])
async def test_http_agent_cannot_tell_the_hub_from_the_agent(
    gateway: Gateway, agent: UpstreamAgent, name: str
) -> None:
    thread = f"httpagent-{uuid.uuid4().hex[:8]}"
    given = conversation(thread)
    inputs_before = len(agent.inputs)
    direct = await run_http_agent(agent.url(name), **given)
    through_hub = await run_http_agent(hub_url(gateway, name), **given)
    clean(direct)
    clean(through_hub)

    assert through_hub["events"] == direct["events"]
    assert through_hub["messages"] == direct["messages"]
    assert through_hub["state"] == direct["state"]
    assert through_hub["newMessages"] == direct["newMessages"]
    # What the scripted agent answers, independently of both.
    texts = [m.get("content") for m in through_hub["messages"] if m["role"] == "assistant"]
    assert ok_transcript_text(given["messages"]) in texts
    assert [m["id"] for m in through_hub["messages"][:2]] == ["sys", "u1"]
    types = [e["type"] for e in through_hub["events"]]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    if name == "chunks":
        # The client expanded the agent's chunks itself, the same way both times.
        assert "TEXT_MESSAGE_START" in types and "TEXT_MESSAGE_CHUNK" not in types

    # The agent got the HttpAgent's input unchanged through the hub.
    assert agent.wait_inputs(inputs_before + 2, 5 * TIMEOUT_SCALE)
    sent_direct, sent_via_hub = agent.inputs[inputs_before : inputs_before + 2]
    assert sent_via_hub == sent_direct
    assert sent_via_hub["runId"] == given["runId"] and sent_via_hub["threadId"] == thread
    assert sent_via_hub["state"] == given["state"]
    assert sent_via_hub["forwardedProps"] == given["forwardedProps"]

    # The thread holds the run: the agent's events, its RUN_STARTED remembering the
    # messages the thread lacked; folded by the hub, the conversation the client has.
    events = await stored(gateway, thread)
    if name == "ok":
        assert [e["type"] for e in events] == types
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    assert events[0]["input"]["messages"] == given["messages"]
    folded = fold(events)
    assert folded.messages == through_hub["messages"]
    if name == "ok":
        # The agent set the state (STATE_SNAPSHOT, STATE_DELTA): the thread has it too.
        # (The chunks agent sends no state: the client keeps the state it sent, which
        # the thread does not record; docs/bridge.md records only messages.)
        assert folded.state == through_hub["state"] != given["state"]


async def test_http_agent_sees_an_agent_refusal_as_it_was_sent(gateway: Gateway) -> None:
    thread = f"httpagent-{uuid.uuid4().hex[:8]}"
    report = await run_http_agent(hub_url(gateway, "refuses"), **conversation(thread))
    assert report["error"] is None and report["failures"] == []
    assert report["runErrors"] == [
        {"type": "RUN_ERROR", "message": "the model refused", "code": "MODEL_REFUSED"}
    ]
    assert [e["type"] for e in report["events"]][-1] == "RUN_ERROR"
    events = await stored(gateway, thread)
    assert events[-1] == report["runErrors"][0]


async def test_failed_upstream_reaches_the_http_agent_as_run_error(
    gateway: Gateway, agent: UpstreamAgent
) -> None:
    thread = f"httpagent-{uuid.uuid4().hex[:8]}"
    given = conversation(thread)
    # Directly, the HttpAgent sees an HTTP error and runAgent rejects.
    direct = await run_http_agent(agent.url("status"), **given)
    assert direct["error"] is not None and direct["error"]["status"] == 500
    assert "agent exploded" in direct["error"]["message"]
    # Through the hub: a run that started and ended with the hub's RUN_ERROR, which the
    # client hands its onRunErrorEvent; runAgent resolves, the conversation is kept.
    report = await run_http_agent(hub_url(gateway, "boom"), **given)
    assert report["error"] is None and report["failures"] == []
    assert [e["type"] for e in report["events"]] == ["RUN_STARTED", "RUN_ERROR"]
    (run_error,) = report["runErrors"]
    assert run_error["code"] == "AGUI_HUB_UPSTREAM_STATUS"
    assert "HTTP 500" in run_error["message"] and "agent exploded" in run_error["message"]
    assert report["messages"] == given["messages"]
    assert report["state"] == given["state"]
    assert report["newMessages"] == []
    # The thread holds the failed attempt: the hub's RUN_STARTED and the same RUN_ERROR.
    events = await stored(gateway, thread)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert events[1] == run_error
    assert events[0]["input"]["messages"] == given["messages"]
