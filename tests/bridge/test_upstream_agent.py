"""Tests of tests/upstream_agent.py, the AG-UI agent the HTTP/SSE bridge's tests run against:
each behaviour answers what its documentation says, checked with httpx directly, the
official SDK's models and our own event parser and sequence verifier."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from ag_ui.core import Event as SdkEvent
from pydantic import TypeAdapter, ValidationError

from agui_hub.agui.chunks import expand_chunks
from agui_hub.agui.events import parse_event, to_wire
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.errors import InvalidEvent, SequenceError

from ..conftest import TIMEOUT_SCALE
from ..upstream_agent import UpstreamAgent, ok_transcript_text, serve_agent

SDK_EVENT: TypeAdapter[Any] = TypeAdapter(SdkEvent)
WAIT = 5 * TIMEOUT_SCALE

MESSAGES: list[dict[str, Any]] = [
    {"id": "m1", "role": "user", "content": "hello"},
    {"id": "m2", "role": "assistant", "content": "hi there"},
    {"id": "m3", "role": "user", "content": 'what is "6 x 7"?'},
]

OK_TYPES = [
    "RUN_STARTED",
    "STATE_SNAPSHOT",
    "STEP_STARTED",
    "REASONING_START",
    "REASONING_MESSAGE_START",
    *["REASONING_MESSAGE_CONTENT"] * 3,
    "REASONING_MESSAGE_END",
    "REASONING_END",
    "STEP_FINISHED",
    "TEXT_MESSAGE_START",
    *["TEXT_MESSAGE_CONTENT"] * 4,
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    *["TOOL_CALL_ARGS"] * 3,
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "STATE_DELTA",
    "CUSTOM",
    "RUN_FINISHED",
]
"""The event types of an ``ok`` run with ``deltas=4``, in order."""


def run_input(run_id: str = "run-1", **extra: Any) -> dict[str, Any]:
    """A RunAgentInput (wire form) with every member the bridge sends."""
    return {
        "threadId": "thread-1",
        "runId": run_id,
        "messages": MESSAGES,
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
        **extra,
    }


def sse_data(body: str) -> list[str]:
    """The data of each event of an SSE body, as the WHATWG EventSource parser reads it:
    any line ending, comments, fields other than data ignored, data lines joined with
    "\\n", an event without a terminating blank line dropped."""
    events: list[str] = []
    data: list[str] | None = None
    for line in re.split(r"\r\n|\r|\n", body):
        if not line:
            if data is not None:
                events.append("\n".join(data))
            data = None
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data = [*(data or []), value.removeprefix(" ")]
    return events


def events_of(body: str) -> list[dict[str, Any]]:
    """The events of an SSE body, each checked by the official SDK and by our parser."""
    out = []
    for data in sse_data(body):
        event = json.loads(data)
        SDK_EVENT.validate_python(event)
        out.append(to_wire(parse_event(event)))
    return out


def verify(events: list[dict[str, Any]]) -> None:
    """Raise SequenceError unless *events* are a valid AG-UI sequence (chunks expanded)."""
    verifier = SequenceVerifier()
    for event in expand_chunks(events, flush=False):
        verifier.verify(event)


def post(agent: UpstreamAgent, behaviour: str, body: Any = None, **query: Any) -> httpx.Response:
    """POST *body* (by default :func:`run_input`) to *behaviour* and read the whole answer."""
    return httpx.post(agent.url(behaviour, **query), json=body or run_input(), timeout=WAIT)


@pytest.fixture(scope="module")
def agent() -> Iterator[UpstreamAgent]:
    """One agent for the tests that only make requests; counting tests serve their own."""
    with serve_agent() as served:
        yield served


@pytest.mark.timeout(30)
def test_ok_is_a_valid_run_answering_the_input(agent: UpstreamAgent) -> None:
    before = len(agent.inputs)
    sent = run_input("run-ok", parentRunId="run-parent")
    response = post(agent, "ok", sent, deltas=4)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    assert [event["type"] for event in events] == OK_TYPES
    verify(events)

    started = events[0]
    assert started == {
        "type": "RUN_STARTED",
        "threadId": "thread-1",
        "runId": "run-ok",
        "parentRunId": "run-parent",
    }
    assert events[1]["snapshot"] == {"turn": 2, "items": []}
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == ok_transcript_text(MESSAGES)
    assert text == """You said: 'what is "6 x 7"?'; I saw 3 messages."""
    arguments = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(arguments) == {"q": 'what is "6 x 7"?'}
    by_type = {event["type"]: event for event in events}
    assert (
        by_type["TOOL_CALL_START"]["parentMessageId"] == by_type["TEXT_MESSAGE_START"]["messageId"]
    )
    assert by_type["TOOL_CALL_RESULT"]["content"] == "42"
    assert by_type["STATE_DELTA"]["delta"] == [{"op": "add", "path": "/items/-", "value": "lookup"}]

    # Ids derive from the runId: another run's ids are all different.
    again = events_of(post(agent, "ok", run_input("run-ok-2")).text)
    assert "parentRunId" not in again[0]

    def ids(run: list[dict[str, Any]]) -> set[str]:
        """The message and tool-call ids a run uses."""
        return {e[key] for e in run for key in ("messageId", "toolCallId") if key in e}

    assert ids(events) and not ids(events) & ids(again)
    assert agent.wait_inputs(before + 2, WAIT)
    assert agent.inputs[before:] == [sent, run_input("run-ok-2")]


@pytest.mark.timeout(30)
def test_crlf_carries_the_ok_events_in_unusual_framing(agent: UpstreamAgent) -> None:
    raw = post(agent, "crlf", deltas=4).text
    assert raw.count(": keepalive\r\nevent: message\r\n") == len(OK_TYPES)
    assert "\n" not in raw.replace("\r\n", "")
    assert re.search(r"data: [^\r]*,\r\ndata: ", raw), "no event split over two data lines"
    assert events_of(raw) == events_of(post(agent, "ok", deltas=4).text)


@pytest.mark.timeout(30)
def test_chunks_and_error_event_are_valid_runs(agent: UpstreamAgent) -> None:
    events = events_of(post(agent, "chunks").text)
    verify(events)
    types = [event["type"] for event in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    text = [e for e in events if e["type"] == "TEXT_MESSAGE_CHUNK"]
    calls = [e for e in events if e["type"] == "TOOL_CALL_CHUNK"]
    assert text[0].keys() == {"type", "messageId", "role", "delta"}
    assert all(e.keys() == {"type", "messageId", "delta"} for e in text[1:])
    assert "".join(e["delta"] for e in text) == ok_transcript_text(MESSAGES)
    assert calls[0].keys() == {"type", "toolCallId", "toolCallName", "delta"}
    assert json.loads("".join(e["delta"] for e in calls)) == {"q": 'what is "6 x 7"?'}

    events = events_of(post(agent, "error_event").text)
    verify(events)
    assert events[-1] == {
        "type": "RUN_ERROR",
        "message": "the model refused",
        "code": "MODEL_REFUSED",
    }


@pytest.mark.timeout(30)
def test_http_level_failures(agent: UpstreamAgent) -> None:
    before = len(agent.inputs)
    response = post(agent, "status", code=503)
    assert (response.status_code, response.text) == (503, "agent exploded")
    assert post(agent, "status").status_code == 500
    response = post(agent, "not_sse")
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"hello": "world"}
    assert post(agent, "nope").status_code == 404
    assert httpx.get(agent.url("ok"), timeout=WAIT).status_code == 405
    invalid = httpx.post(agent.url("ok"), json={"threadId": "t"}, timeout=WAIT)
    assert invalid.status_code == 422 and "runId" in invalid.text
    not_json = httpx.post(agent.url("ok"), content=b"{nope", timeout=WAIT)
    assert not_json.status_code == 422
    assert post(agent, "ok", deltas="many").status_code == 400
    # Only the valid inputs are recorded: status, status, not_sse and the bad query.
    assert len(agent.inputs) == before + 4


@pytest.mark.timeout(30)
def test_broken_streams(agent: UpstreamAgent) -> None:
    body = post(agent, "malformed").text
    assert sse_data(body)[1] == "{this is not json" and body.endswith("not json\n\n")
    with pytest.raises(json.JSONDecodeError):
        events_of(body)

    with pytest.raises(SequenceError) as broken:
        verify(events_of(post(agent, "bad_sequence").text))
    assert broken.value.rule == "message_not_open"

    data = sse_data(post(agent, "invalid_event").text)
    assert json.loads(data[1]) == {"type": "TEXT_MESSAGE_START"}
    with pytest.raises(ValidationError):
        SDK_EVENT.validate_python(json.loads(data[1]))
    with pytest.raises(InvalidEvent):
        parse_event(json.loads(data[1]))
    assert json.loads(data[2])["type"] == "RUN_FINISHED"

    data = sse_data(post(agent, "unknown_event").text)
    assert json.loads(data[1]) == {"type": "NOT_AN_AGUI_EVENT", "x": 1}
    with pytest.raises(InvalidEvent):
        parse_event(json.loads(data[1]))

    events = events_of(post(agent, "truncated").text)
    assert [e["type"] for e in events] == ["RUN_STARTED", "TEXT_MESSAGE_START"] + [
        "TEXT_MESSAGE_CONTENT"
    ] * 2

    events = events_of(post(agent, "huge").text)
    verify(events)
    assert len(events[2]["delta"]) == 2_000_000
    assert len(events_of(post(agent, "huge", size=10).text)[2]["delta"]) == 10


@pytest.mark.timeout(30)
def test_client_going_away_is_counted() -> None:
    with serve_agent() as agent, httpx.Client(timeout=WAIT) as client:
        with client.stream("POST", agent.url("slow", delay=0.01), json=run_input()) as response:
            lines = response.iter_lines()
            assert json.loads(next(lines).removeprefix("data: "))["type"] == "RUN_STARTED"
        assert agent.wait_disconnects(1, WAIT)
        with client.stream("POST", agent.url("hang"), json=run_input()) as response:
            assert response.status_code == 200
        assert agent.wait_disconnects(2, WAIT)
        # A stream that runs to its end is no disconnect.
        body = client.post(agent.url("slow", count=3, delay=0), json=run_input()).text
        assert len(events_of(body)) == 7
        assert not agent.wait_disconnects(3, 0.2)
        assert agent.disconnects == 2


@pytest.mark.timeout(30)
def test_stopping_ends_open_streams_promptly() -> None:
    served = serve_agent()
    agent = served.__enter__()
    with httpx.Client(timeout=WAIT) as client:
        request = client.build_request("POST", agent.url("hang"), json=run_input())
        response = client.send(request, stream=True)
        start = time.monotonic()
        served.__exit__(None, None, None)
        assert time.monotonic() - start < 3 * TIMEOUT_SCALE
        assert response.read() == b""  # the response was ended, not cut off
        response.close()
    assert agent.disconnects == 0
