"""A real upstream AG-UI agent for the HTTP/SSE bridge's tests.

The bridge POSTs a RunAgentInput to an agent's HTTP endpoint and reads the SSE
response. The tests point it at this agent: a small raw ASGI app served by
uvicorn on a loopback port, encoding its events with the official SDK
(``ag_ui.encoder.EventEncoder`` and the ``ag_ui.core`` models), as a typical
AG-UI agent server does. Each path is a *behaviour*, a scripted answer that is
either a well-formed run or one particular way for an upstream to go wrong::

    with serve_agent() as agent:
        httpx.post(agent.url("ok", deltas=3), json=run_input)
        agent.wait_inputs(1, timeout=5)

``POST /<behaviour>`` takes a RunAgentInput (camelCase JSON), validated with
``ag_ui.core.RunAgentInput`` (422 with a text body when it is not one); query
parameters tune the behaviour (400 when one is not a number). Unknown path:
404; another method than POST: 405.

=================  ============================================================================
behaviour          answer
=================  ============================================================================
``ok``             a scripted run exercising many event kinds (see :func:`ok_events`);
                   ``delay`` s between events (default 0), ``deltas`` text deltas (default 5)
``slow``           RUN_STARTED, TEXT_MESSAGE_START, ``count`` deltas (default 1000) every
                   ``delay`` s (default 0.05), TEXT_MESSAGE_END, RUN_FINISHED
``status``         HTTP status ``code`` (default 500), text body "agent exploded"
``not_sse``        200 ``application/json`` ``{"hello": "world"}``
``malformed``      RUN_STARTED, then ``data: {this is not json`` and the end of the response
``bad_sequence``   RUN_STARTED, TEXT_MESSAGE_CONTENT of a message never started, RUN_FINISHED
``invalid_event``  RUN_STARTED, ``{"type": "TEXT_MESSAGE_START"}`` (no messageId), RUN_FINISHED
``unknown_event``  RUN_STARTED, ``{"type": "NOT_AN_AGUI_EVENT", "x": 1}``, RUN_FINISHED
``truncated``      RUN_STARTED, TEXT_MESSAGE_START, 2 deltas, then the end of the response
``hang``           200 headers, then nothing until the client goes away (at most 120 s)
``huge``           one text message whose single delta is ``size`` characters (default 2_000_000)
``crlf``           the events of ``ok``, written by hand: CRLF line endings, a ``: keepalive``
                   comment and an ``event: message`` line before each event, and the
                   STATE_SNAPSHOT's JSON split over two ``data:`` lines
``chunks``         RUN_STARTED, TEXT_MESSAGE_CHUNK events, TOOL_CALL_CHUNK events, RUN_FINISHED
``error_event``    RUN_STARTED, TEXT_MESSAGE_START and CONTENT, then RUN_ERROR
                   ("the model refused", code MODEL_REFUSED)
=================  ============================================================================

Every stream notices a client that goes away (ASGI ``http.disconnect``, or ``send``
raising ``OSError``), stops and counts it in :attr:`UpstreamAgent.disconnects`: the
cancel tests' evidence that the hub closed the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode

import uvicorn
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageChunkEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallChunkEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError

from .conftest import TIMEOUT_SCALE, free_port

Scope = dict[str, Any]
"""An ASGI connection scope."""
AsgiMessage = dict[str, Any]
"""An ASGI message, received or sent."""
Receive = Callable[[], Awaitable[AsgiMessage]]
"""The ASGI ``receive`` callable."""
Send = Callable[[AsgiMessage], Awaitable[None]]
"""The ASGI ``send`` callable."""

BEHAVIOURS = frozenset(
    {
        "ok",
        "slow",
        "status",
        "not_sse",
        "malformed",
        "bad_sequence",
        "invalid_event",
        "unknown_event",
        "truncated",
        "hang",
        "huge",
        "crlf",
        "chunks",
        "error_event",
    }
)
"""The paths the agent answers (``POST /<behaviour>``)."""

HANG_CAP = 120.0
"""How long ``hang`` keeps a response open at most, so a forgotten client cannot pin it."""

_ENCODER = EventEncoder()
_SSE_CONTENT_TYPE = _ENCODER.get_content_type().encode()


# -- what the scripted run says ---------------------------------------------------------


def _text_of(content: Any) -> str:
    """The text of a message's content: the string itself, or the text parts of a
    multimodal content joined (a user message's content may be a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The content of the last message with role "user" ("" when there is none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def ok_transcript_text(messages: list[dict[str, Any]]) -> str:
    """The assistant text the ``ok`` (and ``crlf``, ``chunks``) behaviour answers to a
    RunAgentInput whose ``messages`` are *messages* (wire dicts)."""
    return f"You said: {last_user_text(messages)!r}; I saw {len(messages)} messages."


def tool_arguments(messages: list[dict[str, Any]]) -> str:
    """The arguments of the ``lookup`` tool call the scripted runs make: ``{"q": <text>}``."""
    return json.dumps({"q": last_user_text(messages)})


def _split(text: str, parts: int) -> list[str]:
    """*text* cut into *parts* consecutive non-empty pieces (fewer when it is shorter):
    the pieces concatenate to *text*, and no delta is empty, which some consumers reject."""
    parts = max(1, min(parts, len(text)))
    bounds = [len(text) * i // parts for i in range(parts + 1)]
    return [text[bounds[i] : bounds[i + 1]] for i in range(parts)]


def _ids(run_id: str) -> dict[str, str]:
    """The ids of one scripted run: derived from its runId, so that they are unique per run."""
    return {
        "message": f"{run_id}-msg",
        "reasoning_span": f"{run_id}-reasoning",
        "reasoning_message": f"{run_id}-reasoning-msg",
        "tool_call": f"{run_id}-call",
        "tool_result": f"{run_id}-result",
    }


def _run_started(run_input: dict[str, Any]) -> RunStartedEvent:
    # No `input` echo: many agents leave it out, and the bridge must not need it.
    return RunStartedEvent(
        thread_id=run_input["threadId"],
        run_id=run_input["runId"],
        parent_run_id=run_input.get("parentRunId"),
    )


def _run_finished(run_input: dict[str, Any]) -> RunFinishedEvent:
    return RunFinishedEvent(thread_id=run_input["threadId"], run_id=run_input["runId"])


def ok_events(run_input: dict[str, Any], deltas: int = 5) -> list[BaseEvent]:
    """The events of the ``ok`` behaviour for *run_input* (a wire RunAgentInput):
    RUN_STARTED; STATE_SNAPSHOT; a "think" step holding a reasoning span; an assistant
    text message in *deltas* deltas (:func:`ok_transcript_text`); a ``lookup`` tool call
    of that message with its result "42"; STATE_DELTA; CUSTOM; RUN_FINISHED."""
    messages: list[dict[str, Any]] = run_input["messages"]
    ids = _ids(run_input["runId"])
    turn = sum(1 for message in messages if message.get("role") == "user")
    events: list[BaseEvent] = [
        _run_started(run_input),
        StateSnapshotEvent(snapshot={"turn": turn, "items": []}),
        StepStartedEvent(step_name="think"),
        ReasoningStartEvent(message_id=ids["reasoning_span"]),
        ReasoningMessageStartEvent(message_id=ids["reasoning_message"], role="reasoning"),
    ]
    events += [
        ReasoningMessageContentEvent(message_id=ids["reasoning_message"], delta=piece)
        for piece in ("The user wants ", "an answer; ", "look it up.")
    ]
    events += [
        ReasoningMessageEndEvent(message_id=ids["reasoning_message"]),
        ReasoningEndEvent(message_id=ids["reasoning_span"]),
        StepFinishedEvent(step_name="think"),
        TextMessageStartEvent(message_id=ids["message"], role="assistant"),
    ]
    events += [
        TextMessageContentEvent(message_id=ids["message"], delta=piece)
        for piece in _split(ok_transcript_text(messages), deltas)
    ]
    events += [
        TextMessageEndEvent(message_id=ids["message"]),
        ToolCallStartEvent(
            tool_call_id=ids["tool_call"],
            tool_call_name="lookup",
            parent_message_id=ids["message"],
        ),
    ]
    events += [
        ToolCallArgsEvent(tool_call_id=ids["tool_call"], delta=piece)
        for piece in _split(tool_arguments(messages), 3)
    ]
    events += [
        ToolCallEndEvent(tool_call_id=ids["tool_call"]),
        ToolCallResultEvent(
            message_id=ids["tool_result"], tool_call_id=ids["tool_call"], content="42", role="tool"
        ),
        StateDeltaEvent(delta=[{"op": "add", "path": "/items/-", "value": "lookup"}]),
        CustomEvent(name="upstream.note", value={"runId": run_input["runId"]}),
        _run_finished(run_input),
    ]
    return events


def _crlf_frame(event: BaseEvent, split: bool) -> str:
    """One event as a browser-tolerated but unusual SSE frame: a comment, an
    ``event: message`` line, CRLF endings; with *split*, the JSON over two ``data:`` lines.

    The split falls after the first member, a token boundary: SSE joins the lines with
    "\\n", which JSON allows between tokens, so the joined data is the same JSON value.
    """
    wire = event.model_dump(mode="json", by_alias=True)
    if split:
        (key, value), *rest = wire.items()
        first = "{" + json.dumps(key) + ":" + json.dumps(value) + ","
        data = ["data: " + first, "data: " + json.dumps(dict(rest))[1:]]
    else:
        data = ["data: " + json.dumps(wire)]
    return "\r\n".join([": keepalive", "event: message", *data]) + "\r\n\r\n"


# -- the ASGI app -------------------------------------------------------------------------


class _BadQuery(Exception):
    """A query parameter is not of the behaviour's form (answered 400)."""


class _ClientGone(Exception):
    """The client went away while a response was streaming."""


class _Closing(Exception):
    """The agent is shutting down: the stream ends its response now."""


class _Query:
    """A behaviour's query parameters, read with a default and a type."""

    def __init__(self, scope: Scope) -> None:
        raw = scope.get("query_string", b"").decode("latin-1")
        self._values = {name: values[-1] for name, values in parse_qs(raw).items()}

    def number(self, name: str, default: float) -> float:
        """Parameter *name* as a float, *default* when absent."""
        try:
            return float(self._values.get(name, default))
        except ValueError:
            raise _BadQuery(f"{name} must be a number") from None

    def integer(self, name: str, default: int) -> int:
        """Parameter *name* as an int, *default* when absent."""
        try:
            return int(self._values.get(name, default))
        except ValueError:
            raise _BadQuery(f"{name} must be an integer") from None


class _Stream:
    """One streamed response: writes frames, notices the client going away and the
    agent closing, and waits between events without missing either."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.wake = asyncio.Event()
        self.gone = False
        self.closing = False
        self.started = False

    def check(self) -> None:
        """Raise if the stream must stop: :class:`_ClientGone` before :class:`_Closing`."""
        if self.gone:
            raise _ClientGone
        if self.closing:
            raise _Closing

    async def start(self, content_type: bytes = _SSE_CONTENT_TYPE, status: int = 200) -> None:
        """Send the response head (also while closing: the response must still be ended)."""
        headers = [(b"content-type", content_type), (b"cache-control", b"no-cache")]
        await self._checked_send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        self.started = True

    async def write(self, data: str | bytes) -> None:
        """Send *data* as a part of the body."""
        self.check()
        body = data.encode() if isinstance(data, str) else data
        await self._checked_send({"type": "http.response.body", "body": body, "more_body": True})

    async def event(self, event: BaseEvent) -> None:
        """Send *event* encoded by the official SDK's encoder."""
        await self.write(_ENCODER.encode(event))

    async def end(self) -> None:
        """End the body."""
        await self._checked_send({"type": "http.response.body", "body": b"", "more_body": False})

    async def pause(self, seconds: float) -> None:
        """Wait *seconds* (also 0: yield once, so the disconnect watcher gets to run), then
        raise if the client went away or the agent is closing meanwhile."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), seconds)
        else:
            await asyncio.sleep(0)
        self.check()

    async def _checked_send(self, message: AsgiMessage) -> None:
        # uvicorn's send returns silently once the client is gone (the watcher sees that);
        # other servers raise OSError from send instead.
        try:
            await self._send(message)
        except OSError:
            self.gone = True
            raise _ClientGone from None


class _App:
    """The raw ASGI application; records what it receives on its :class:`UpstreamAgent`."""

    def __init__(self, agent: UpstreamAgent) -> None:
        self._agent = agent
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: set[_Stream] = set()
        self._closing = False
        self._loop_lock = threading.Lock()

    def close_streams(self) -> None:
        """From any thread: make every open stream (and any that starts later) end its
        response, so that the server's graceful shutdown does not wait for them."""
        with self._loop_lock:
            loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nothing open
                loop.call_soon_threadsafe(self._close_streams)

    def _close_streams(self) -> None:
        self._closing = True
        for stream in self._streams:
            stream.closing = True
            stream.wake.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are not spoken here
        with self._loop_lock:
            self._loop = asyncio.get_running_loop()
        behaviour = scope["path"].strip("/")
        if behaviour not in BEHAVIOURS:
            await _plain(send, 404, f"no behaviour {behaviour!r}")
            return
        if scope["method"] != "POST":
            await _plain(send, 405, "POST a RunAgentInput", [(b"allow", b"POST")])
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before sending its request
        try:
            run_input = json.loads(body)
            RunAgentInput.model_validate(run_input)
        except (ValueError, ValidationError) as exc:
            await _plain(send, 422, f"not a RunAgentInput: {exc}")
            return
        self._agent._record_input(run_input)
        try:
            await self._answer(behaviour, _Query(scope), run_input, receive, send)
        except _BadQuery as exc:
            await _plain(send, 400, str(exc))

    async def _answer(
        self,
        behaviour: str,
        query: _Query,
        run_input: dict[str, Any],
        receive: Receive,
        send: Send,
    ) -> None:
        if behaviour == "status":
            await _plain(send, query.integer("code", 500), "agent exploded")
            return
        if behaviour == "not_sse":
            await _send_all(send, 200, b"application/json", b'{"hello": "world"}')
            return
        script = getattr(self, "_" + behaviour)
        stream = _Stream(send)
        stream.closing = self._closing
        self._streams.add(stream)
        watcher = asyncio.create_task(_watch_disconnect(receive, stream))
        try:
            await script(stream, query, run_input)
            await stream.end()
        except _ClientGone:
            self._agent._record_disconnect()
        except _Closing:
            with contextlib.suppress(_ClientGone):
                if not stream.started:
                    await stream.start()
                await stream.end()
        finally:
            self._streams.discard(stream)
            watcher.cancel()

    # Each script below sends the head and the frames of one behaviour; _answer ends the
    # response (the body's last, empty part) unless the client went away.

    async def _ok(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        delay = query.number("delay", 0)
        events = ok_events(run_input, query.integer("deltas", 5))
        await stream.start()
        for index, event in enumerate(events):
            if index:
                await stream.pause(delay)
            await stream.event(event)

    async def _crlf(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        delay = query.number("delay", 0)
        events = ok_events(run_input, query.integer("deltas", 5))
        await stream.start()
        for index, event in enumerate(events):
            if index:
                await stream.pause(delay)
            await stream.write(_crlf_frame(event, split=isinstance(event, StateSnapshotEvent)))

    async def _slow(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        count = query.integer("count", 1000)
        delay = query.number("delay", 0.05)
        message_id = _ids(run_input["runId"])["message"]
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.event(TextMessageStartEvent(message_id=message_id, role="assistant"))
        for index in range(count):
            await stream.pause(delay)
            await stream.event(TextMessageContentEvent(message_id=message_id, delta=f"{index} "))
        await stream.event(TextMessageEndEvent(message_id=message_id))
        await stream.event(_run_finished(run_input))

    async def _malformed(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.write("data: {this is not json\n\n")

    async def _bad_sequence(
        self, stream: _Stream, query: _Query, run_input: dict[str, Any]
    ) -> None:
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.event(TextMessageContentEvent(message_id="never-started", delta="orphan"))
        await stream.event(_run_finished(run_input))

    async def _invalid_event(
        self, stream: _Stream, query: _Query, run_input: dict[str, Any]
    ) -> None:
        await stream.start()
        await stream.event(_run_started(run_input))
        # Written by hand: the SDK's models cannot build an event without its messageId.
        await stream.write('data: {"type": "TEXT_MESSAGE_START"}\n\n')
        await stream.event(_run_finished(run_input))

    async def _unknown_event(
        self, stream: _Stream, query: _Query, run_input: dict[str, Any]
    ) -> None:
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.write('data: {"type": "NOT_AN_AGUI_EVENT", "x": 1}\n\n')
        # The run then finishes normally, so a test tells "rejected the unknown event"
        # apart from "the stream ended without RUN_FINISHED".
        await stream.event(_run_finished(run_input))

    async def _truncated(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        message_id = _ids(run_input["runId"])["message"]
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.event(TextMessageStartEvent(message_id=message_id, role="assistant"))
        for piece in ("Half a ", "sentence"):
            await stream.event(TextMessageContentEvent(message_id=message_id, delta=piece))

    async def _hang(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        await stream.start()
        await stream.pause(HANG_CAP)

    async def _huge(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        size = query.integer("size", 2_000_000)
        message_id = _ids(run_input["runId"])["message"]
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.event(TextMessageStartEvent(message_id=message_id, role="assistant"))
        delta = ("0123456789" * (size // 10 + 1))[:size]
        await stream.event(TextMessageContentEvent(message_id=message_id, delta=delta))
        await stream.event(TextMessageEndEvent(message_id=message_id))
        await stream.event(_run_finished(run_input))

    async def _chunks(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        messages: list[dict[str, Any]] = run_input["messages"]
        ids = _ids(run_input["runId"])
        text = _split(ok_transcript_text(messages), 3)
        arguments = _split(tool_arguments(messages), 2)
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.event(
            TextMessageChunkEvent(message_id=ids["message"], role="assistant", delta=text[0])
        )
        for piece in text[1:]:
            await stream.event(TextMessageChunkEvent(message_id=ids["message"], delta=piece))
        await stream.event(
            ToolCallChunkEvent(
                tool_call_id=ids["tool_call"], tool_call_name="lookup", delta=arguments[0]
            )
        )
        for piece in arguments[1:]:
            await stream.event(ToolCallChunkEvent(tool_call_id=ids["tool_call"], delta=piece))
        await stream.event(_run_finished(run_input))

    async def _error_event(self, stream: _Stream, query: _Query, run_input: dict[str, Any]) -> None:
        message_id = _ids(run_input["runId"])["message"]
        await stream.start()
        await stream.event(_run_started(run_input))
        await stream.event(TextMessageStartEvent(message_id=message_id, role="assistant"))
        await stream.event(TextMessageContentEvent(message_id=message_id, delta="I will not"))
        await stream.event(RunErrorEvent(message="the model refused", code="MODEL_REFUSED"))


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; ``None`` when the client went away first."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return bytes(body)


async def _watch_disconnect(receive: Receive, stream: _Stream) -> None:
    """Wait for ``http.disconnect`` (the body was read already, so nothing else comes) and
    wake the stream; cancelled when the response ends first."""
    while (await receive())["type"] != "http.disconnect":
        pass
    stream.gone = True
    stream.wake.set()


async def _send_all(
    send: Send,
    status: int,
    content_type: bytes,
    body: bytes,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Send a whole, non-streamed response."""
    head = [(b"content-type", content_type), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _plain(
    send: Send, status: int, text: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """Send a text/plain response."""
    await _send_all(send, status, b"text/plain; charset=utf-8", text.encode(), headers)


# -- the server ---------------------------------------------------------------------------


class UpstreamAgent:
    """The agent server; ``with serve_agent() as agent:`` starts it on a free loopback port.

    uvicorn runs it on an event loop of its own in a daemon thread, so sync and async
    tests alike can talk to it. What it received and how its streams ended are recorded
    here, thread-safely, for the tests to check.
    """

    def __init__(self) -> None:
        self.port = 0
        self.inputs: list[dict[str, Any]] = []
        """Every valid RunAgentInput received (parsed JSON, camelCase), in order."""
        self._disconnects = 0
        self._changed = threading.Condition()
        self._app = _App(self)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base(self) -> str:
        """The server's root URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def url(self, behaviour: str = "ok", **query: str | int | float) -> str:
        """The URL of *behaviour* with *query* as its query string."""
        url = f"{self.base}/{behaviour}"
        return f"{url}?{urlencode(query)}" if query else url

    @property
    def disconnects(self) -> int:
        """How many streams ended because the client went away."""
        with self._changed:
            return self._disconnects

    def wait_disconnects(self, n: int, timeout: float) -> bool:
        """Wait up to *timeout* s until at least *n* streams ended because the client went
        away; whether they did."""
        with self._changed:
            return self._changed.wait_for(lambda: self._disconnects >= n, timeout)

    def wait_inputs(self, n: int, timeout: float) -> bool:
        """Wait up to *timeout* s until at least *n* RunAgentInputs were received; whether
        they were."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.inputs) >= n, timeout)

    def _record_input(self, run_input: dict[str, Any]) -> None:
        with self._changed:
            self.inputs.append(run_input)
            self._changed.notify_all()

    def _record_disconnect(self) -> None:
        with self._changed:
            self._disconnects += 1
            self._changed.notify_all()

    def start(self, timeout: float = 10 * TIMEOUT_SCALE) -> None:
        """Start serving on a free loopback port; raise when it is not up within *timeout* s.

        Tries a few ports: another process may take the one :func:`free_port` found before
        uvicorn binds it (uvicorn then ends its thread with SystemExit).
        """
        self._app = _App(self)  # a fresh one: a stopped agent's app ends every stream
        for _attempt in range(3):
            self.port = free_port()
            config = uvicorn.Config(
                self._app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="off",
                # A backstop only: stop() ends every stream before the server shuts down.
                timeout_graceful_shutdown=5,
            )
            # uvicorn 0.55 installs no signal handlers off the main thread
            # (Server.capture_signals), so nothing needs overriding here.
            server = uvicorn.Server(config)
            thread = threading.Thread(target=server.run, name="upstream-agent", daemon=True)
            thread.start()
            deadline = time.monotonic() + timeout
            while not server.started and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            if server.started:
                self._server, self._thread = server, thread
                return
            server.should_exit = True
            thread.join(timeout)
        raise RuntimeError("the upstream agent did not start")

    def stop(self, timeout: float = 10 * TIMEOUT_SCALE) -> None:
        """End every open stream, stop the server and wait (at most about 2 * *timeout* s)
        for its thread."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._app.close_streams()
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)
        self._server = self._thread = None


@contextlib.contextmanager
def serve_agent() -> Iterator[UpstreamAgent]:
    """Serve an :class:`UpstreamAgent` on a free loopback port for the ``with`` block."""
    agent = UpstreamAgent()
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
