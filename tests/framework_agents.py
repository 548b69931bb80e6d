"""Agents built on real frameworks, served by their own AG-UI adapters on loopback ports,
for tests/test_frameworks.py.

- :func:`pydantic_ai_app`: a pydantic-ai ``Agent`` on a scripted ``FunctionModel``, served by
  ``AGUIAdapter.dispatch_request`` in a Starlette app (the adapter pydantic-ai documents).
- :func:`langgraph_app`: a LangGraph graph (a model node, ``ToolNode``, a ``MemorySaver``
  checkpointer) on a scripted chat model, served by ag-ui-langgraph's
  ``add_langgraph_fastapi_endpoint``.

Both models answer the same conversation: asked anything, they (reason, for pydantic-ai and)
call the tool ``lookup`` with streamed arguments; given its result, they stream the answer
:data:`ANSWER`. A user message holding ``slow`` makes them stream :data:`SLOW_PIECES`
pieces of text, one every :data:`SLOW_DELAY` seconds (a run to cancel). What each model saw
and whether its stream was cut off is kept in a :class:`Script`.

This module imports the frameworks: import it only where they are installed.
:class:`Served` wraps either app in a recorder (every request body and every byte the
endpoint answered) and serves it with uvicorn in a thread of its own.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from ag_ui.core import EventType, StateSnapshotEvent
from fastapi import FastAPI
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import MemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext, ToolReturn
from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaThinkingPart, DeltaToolCall, FunctionModel
from pydantic_ai.ui import StateDeps
from pydantic_ai.ui.ag_ui import AGUIAdapter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .conftest import TIMEOUT_SCALE, free_port

ANSWER = ["The answer ", "is ", "42."]
"""The pieces of text both models stream once the tool answered."""
TOOL_ARGS = ['{"q": ', '"six times seven"}']
"""The tool call's arguments, streamed in these pieces."""
THINKING = ["Let me ", "look it up."]
SIGNATURE = "sig-abc"
"""pydantic-ai's thinking and its signature (sent as REASONING_ENCRYPTED_VALUE)."""
SLOW_PIECES = 100
SLOW_DELAY = 0.05


@dataclass
class Script:
    """What a scripted model was asked and did, shared with the test (thread-safe enough:
    appends and flags)."""

    seen: list[list[str]] = field(default_factory=list)
    """Per model call, the conversation it was given, as ``"<kind>:<text>"`` lines."""
    slow_sent: int = 0
    """Pieces of the slow answer streamed so far."""
    stopped: threading.Event = field(default_factory=threading.Event)
    """Set when a slow stream was cut off (cancelled or closed) before its end."""


# -- pydantic-ai ---------------------------------------------------------------------------


class Lookups(BaseModel):
    """The pydantic-ai agent's AG-UI state (``StateDeps``)."""

    lookups: list[str] = []


def _pydantic_ai_seen(messages: list[ModelMessage]) -> list[str]:
    seen = []
    for message in messages:
        for part in message.parts:
            kind = part.part_kind
            text = getattr(part, "content", None)
            if kind == "thinking":
                text = f"{part.content}|{part.signature}"  # type: ignore[union-attr]
            elif kind == "tool-call":
                text = f"{part.tool_name}({part.args_as_json_str()})"  # type: ignore[union-attr]
            seen.append(f"{kind}:{text}")
    return seen


def pydantic_ai_app(script: Script) -> Starlette:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        script.seen.append(_pydantic_ai_seen(messages))
        last = messages[-1]
        if any(isinstance(p, ToolReturnPart) for p in last.parts):
            for piece in ANSWER:
                yield piece
            return
        prompt = [p for p in last.parts if isinstance(p, UserPromptPart)]
        if isinstance(last, ModelRequest) and prompt and "slow" in str(prompt[-1].content):
            try:
                for n in range(SLOW_PIECES):
                    yield f"word{n} "
                    script.slow_sent += 1
                    await asyncio.sleep(SLOW_DELAY)
            finally:
                if script.slow_sent < SLOW_PIECES:
                    script.stopped.set()
            return
        yield {0: DeltaThinkingPart(content=THINKING[0])}
        yield {0: DeltaThinkingPart(content=THINKING[1], signature=SIGNATURE)}
        yield {1: DeltaToolCall(name="lookup", json_args=TOOL_ARGS[0], tool_call_id="call-1")}
        yield {1: DeltaToolCall(json_args=TOOL_ARGS[1])}

    agent = Agent(FunctionModel(stream_function=stream), deps_type=StateDeps[Lookups])

    @agent.tool
    async def lookup(ctx: RunContext[StateDeps[Lookups]], q: str) -> ToolReturn:
        """Look something up."""
        ctx.deps.state.lookups.append(q)
        snapshot = StateSnapshotEvent(
            type=EventType.STATE_SNAPSHOT, snapshot=ctx.deps.state.model_dump()
        )
        return ToolReturn(return_value="42", metadata=[snapshot])

    async def run(request: Request) -> Response:
        return await AGUIAdapter.dispatch_request(request, agent=agent, deps=StateDeps(Lookups()))

    return Starlette(routes=[Route("/", run, methods=["POST"])])


# -- LangGraph -----------------------------------------------------------------------------


class ScriptedChatModel(BaseChatModel):
    """A chat model that streams the script's chunks: a tool call, then the answer."""

    script: Any = None

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:  # type: ignore[override]
        return self

    def _chunks(self, messages: list[BaseMessage]) -> list[AIMessageChunk]:
        if isinstance(messages[-1], ToolMessage):
            return [AIMessageChunk(content=piece) for piece in ANSWER]
        first = {"name": "lookup", "args": "", "id": "call-1", "index": 0}
        more = [{"name": None, "args": a, "id": None, "index": 0} for a in TOOL_ARGS]
        return [AIMessageChunk(content="", tool_call_chunks=[c]) for c in [first, *more]]  # type: ignore[list-item]

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        total = AIMessageChunk(content="")
        for chunk in self._chunks(messages):
            total += chunk
        message = AIMessage(content=total.content, tool_calls=total.tool_calls)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _astream(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.script.seen.append([f"{m.type}:{m.content}" for m in messages])
        if "slow" in str(messages[-1].content) and messages[-1].type == "human":
            try:
                for n in range(SLOW_PIECES):
                    yield ChatGenerationChunk(message=AIMessageChunk(content=f"word{n} "))
                    self.script.slow_sent += 1
                    await asyncio.sleep(SLOW_DELAY)
            finally:
                if self.script.slow_sent < SLOW_PIECES:
                    self.script.stopped.set()
            return
        for chunk in self._chunks(messages):
            yield ChatGenerationChunk(message=chunk)


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return "42"


class Turns(MessagesState):
    turns: int


def langgraph_app(script: Script, **agent_options: Any) -> FastAPI:
    from ag_ui_langgraph import LangGraphAgent, add_langgraph_fastapi_endpoint

    model = ScriptedChatModel(script=script)

    async def call_model(state: Turns) -> dict[str, Any]:
        answer = await model.ainvoke(state["messages"])
        return {"messages": [answer], "turns": state.get("turns", 0) + 1}

    graph = StateGraph(Turns)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    compiled = graph.compile(checkpointer=MemorySaver())

    app = FastAPI()
    agent = LangGraphAgent(name="assistant", graph=compiled, **agent_options)
    add_langgraph_fastapi_endpoint(app, agent, "/")
    return app


# -- serving and recording -----------------------------------------------------------------


@dataclass
class Exchange:
    """One request to the endpoint and what it answered."""

    input: dict[str, Any]
    body: bytearray = field(default_factory=bytearray)
    done: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)
    """Set when the server told the endpoint that its client went away."""

    @property
    def events(self) -> list[dict[str, Any]]:
        """The events of the answer, as the endpoint wrote them (``data:`` lines)."""
        text = self.body.decode()
        return [
            json.loads(line[5:].strip())
            for line in text.replace("\r\n", "\n").split("\n")
            if line.startswith("data:")
        ]


class Recorder:
    """ASGI middleware: keeps every POST body and every byte answered to it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        exchange = Exchange(json.loads(b"".join(chunks)))
        self.exchanges.append(exchange)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            message = await receive()
            if message["type"] == "http.disconnect":
                exchange.disconnected.set()
            return message

        async def record(message: Any) -> None:
            if message["type"] == "http.response.body":
                exchange.body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, replay, record)
        finally:
            exchange.done.set()

    def by_run(self, run_id: str) -> Exchange:
        (found,) = [e for e in self.exchanges if e.input.get("runId") == run_id]
        return found


class Served:
    """An ASGI app behind a :class:`Recorder`, served by uvicorn on a loopback port in a
    thread of its own (its own event loop, as a separate agent process would have)."""

    def __init__(self, app: Any) -> None:
        self.recorder = Recorder(app)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        config = uvicorn.Config(
            self.recorder, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = 10 * TIMEOUT_SCALE
        waited = 0.0
        while not self.server.started:
            if not self.thread.is_alive() or waited > deadline:
                raise RuntimeError(f"the agent did not start on {self.url}")
            threading.Event().wait(0.02)
            waited += 0.02
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10 * TIMEOUT_SCALE)
