"""Tests of agui_hub.client.transcript: the chat-transcript rendering behind ``agui-hub tail``."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import tempfile
import time
import unicodedata
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_hub.agui.events import EventType
from agui_hub.cli.demo import demo_run
from agui_hub.cli.follow import OffsetFile
from agui_hub.client.transcript import LIMIT, TranscriptView
from agui_hub.wire.protocol import Position

from ..conftest import TIMEOUT_SCALE
from ..processes import CLI, ROOT, child_env, start_gateway
from ..streams import valid_streams

CORPUS = [
    item["event"]
    for item in json.loads((Path(__file__).parents[1] / "corpus" / "events.json").read_text())
]
DEMO = [event for _, event in demo_run("t1", "r1")]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

Event = dict[str, Any]


def render(events: Sequence[Mapping[str, Any]], **options: Any) -> str:
    view = TranscriptView(**options)
    return "".join(view.render(e) for e in events) + view.close()


def one(event: Event) -> str:
    """The output for a single event in a fresh view."""
    return TranscriptView().render(event)


def text(message_id: str, *deltas: str, **start: Any) -> list[Event]:
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": message_id, **start},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": d} for d in deltas),
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
    ]


def tool(call_id: str, name: str, *deltas: str) -> list[Event]:
    return [
        {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name},
        *({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": d} for d in deltas),
        {"type": "TOOL_CALL_END", "toolCallId": call_id},
    ]


def split_render(events: Sequence[Mapping[str, Any]], k: int, **options: Any) -> str:
    """Render events[:k], save the state through JSON, render the rest in a new view."""
    first = TranscriptView(**options)
    a = "".join(first.render(e) for e in events[:k])
    saved = json.loads(json.dumps(first.state()))
    second = TranscriptView(state=saved, **options)
    b = "".join(second.render(e) for e in events[k:])
    return a + b


def whole_render(events: Sequence[Mapping[str, Any]], **options: Any) -> str:
    view = TranscriptView(**options)
    return "".join(view.render(e) for e in events)


def resumed_render(
    events: Sequence[Mapping[str, Any]], cuts: list[int], path: Path, *, close: bool, **options: Any
) -> str:
    """What ``tail --offset-file`` prints over the lives that *cuts* make.

    Each life renders its events, saving the position and the view's state in
    the offset file after each one (:class:`agui_hub.cli.follow.OffsetFile`, the
    code ``tail`` uses), and is stopped without writing anything more, as
    ``tail`` is on Ctrl-C or SIGKILL; the next life restores the view from the
    file. With *close*, the last life ends with :meth:`TranscriptView.close`
    as ``replay`` does. *path* must not exist yet.
    """
    out = ""
    view = TranscriptView(**options)
    bounds = [0, *sorted(cuts), len(events)]
    for life, (begin, end) in enumerate(itertools.pairwise(bounds)):
        offset_file = OffsetFile(path)
        try:
            if life:
                saved = offset_file.load("t")
                view = TranscriptView(state=saved[1] if saved else None, **options)
            for index in range(begin, end):
                out += view.render(events[index])
                offset_file.save("t", Position(f"1-{index}", "e"), view.state())
        finally:
            offset_file.close()
    return out + (view.close() if close else "")


# -- golden output of each kind ------------------------------------------------------


def test_runs_and_steps() -> None:
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"},
        {"type": "STEP_STARTED", "stepName": "plan"},
        {"type": "STEP_FINISHED", "stepName": "plan"},
        {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1", "outcome": {"type": "success"}},
        {"type": "RUN_STARTED", "threadId": "t1", "runId": "r2", "parentRunId": "r1"},
        {
            "type": "RUN_FINISHED",
            "threadId": "t1",
            "runId": "r2",
            "outcome": {"type": "interrupt", "interrupts": [{"id": "i1", "reason": "approve"}]},
        },
        {"type": "RUN_ERROR", "message": "Upstream model unavailable"},
        {"type": "RUN_ERROR", "message": "Rate limited", "code": "rate_limited"},
    ]
    assert render(events) == (
        "── run r1 started\n"
        "▸ step plan\n"
        "▸ step plan done\n"
        "── run r1 finished\n"
        "── run r2 started (from r1)\n"
        "── run r2 finished (interrupt)\n"
        "── run error: Upstream model unavailable\n"
        "── run error: Rate limited [rate_limited]\n"
    )


def test_text_message_streams_inline() -> None:
    assert render(text("m1", "Hel", "lo", " world")) == "assistant: Hello world\n"
    assert render(text("m2", "Hi", role="user")) == "user: Hi\n"
    assert render(text("m3", "Hi", role="user", name="alice")) == "user (alice): Hi\n"
    assert render(text("m4")) == "assistant: \n"


def test_a_delta_that_ends_with_a_newline_gets_no_blank_line() -> None:
    assert render(text("m1", "One.\n", "Two.\n")) == "assistant: One.\nTwo.\n"


def test_tool_call_and_result() -> None:
    events = [
        *tool("c1", "get_weather", '{"city": ', '"Paris"}'),
        {"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c1", "content": "18 °C"},
    ]
    assert render(events) == 'tool get_weather({"city": "Paris"})\n  ↳ 18 °C\n'
    assert render(tool("c2", "noop")) == "tool noop()\n"


def test_tool_result_is_one_line_and_shortened() -> None:
    long = "x" * 1000
    event = {"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c1", "content": long}
    line = one(event)
    assert line == "  ↳ " + "x" * (LIMIT - 1) + "…\n"
    multi = {**event, "content": "line 1\nline 2\tend"}
    assert one(multi) == "  ↳ line 1↵line 2 end\n"
    parts = {
        **event,
        "content": [
            {"type": "text", "text": "Chart:"},
            {"type": "image", "source": {"type": "url", "value": "https://x/y.png"}},
        ],
    }
    assert one(parts) == "  ↳ Chart: [image]\n"


def test_reasoning() -> None:
    events: list[Event] = [
        {"type": "REASONING_START", "messageId": "span"},
        {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "Compare "},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "them."},
        {"type": "REASONING_MESSAGE_END", "messageId": "r1"},
        {"type": "REASONING_END", "messageId": "span"},
        {
            "type": "REASONING_ENCRYPTED_VALUE",
            "subtype": "message",
            "entityId": "r1",
            "encryptedValue": "gAAA==",
        },
    ]
    assert render(events) == "thinking: Compare them.\nthinking: [encrypted]\n"
    assert one(events[0]) == ""
    assert one(events[5]) == ""


def test_state_events() -> None:
    snapshot = {"type": "STATE_SNAPSHOT", "snapshot": {"progress": 0, "cities": []}}
    assert one(snapshot) == 'state: {"progress":0,"cities":[]}\n'
    delta = {
        "type": "STATE_DELTA",
        "delta": [
            {"op": "replace", "path": "/progress", "value": 0.5},
            {"op": "add", "path": "/cities/-", "value": "Paris"},
            {"op": "remove", "path": "/old"},
            {"op": "move", "from": "/a", "path": "/b"},
        ],
    }
    assert one(delta) == (
        'state: replace /progress = 0.5; add /cities/- = "Paris"; remove /old; move /a -> /b\n'
    )
    huge = {"type": "STATE_SNAPSHOT", "snapshot": {"items": list(range(100_000))}}
    line = one(huge)
    assert line.startswith('state: {"items":[0,1,2,') and line.endswith("…\n")
    assert len(line) == len("state: ") + LIMIT + 1


def test_messages_snapshot_one_line_per_message() -> None:
    event = {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [
            {"id": "u1", "role": "user", "content": "Weather in Paris?"},
            {
                "id": "a1",
                "role": "assistant",
                "content": "Checking.",
                "toolCalls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "18 °C"},
            {"id": "a2", "role": "assistant", "content": "It is 18 °C.\nEnjoy!"},
            {"id": "r1", "role": "reasoning", "content": "easy"},
            {"id": "x1", "role": "activity", "activityType": "PLAN", "content": {"n": 1}},
        ],
    }
    assert one(event) == (
        "user: Weather in Paris?\n"
        "assistant: Checking.\n"
        'tool get_weather({"city":"Paris"})\n'
        "  ↳ 18 °C\n"
        "assistant: It is 18 °C.↵Enjoy!\n"
        "thinking: easy\n"
        'activity PLAN: {"n":1}\n'
    )
    assert one({"type": "MESSAGES_SNAPSHOT", "messages": []}) == ""


def test_other_kinds_get_one_line_each() -> None:
    expected = {
        "ACTIVITY_SNAPSHOT": 'activity PLAN: {"steps":[]}\n',
        "ACTIVITY_DELTA": 'activity PLAN: replace /steps/0/status = "done"\n',
        "CUSTOM": 'custom ui.toast: {"text":"Saved"}\n',
        "SUBAGENT_STARTED": "── subagent researcher started (s1)\n",
        "SUBAGENT_FINISHED": "── subagent s1 finished (suspended)\n",
        "SUBAGENT_ERROR": "── subagent s1 error: Flight API returned 503 [http_503]\n",
    }
    events: dict[str, Event] = {
        "ACTIVITY_SNAPSHOT": {
            "type": "ACTIVITY_SNAPSHOT",
            "messageId": "a1",
            "activityType": "PLAN",
            "content": {"steps": []},
        },
        "ACTIVITY_DELTA": {
            "type": "ACTIVITY_DELTA",
            "messageId": "a1",
            "activityType": "PLAN",
            "patch": [{"op": "replace", "path": "/steps/0/status", "value": "done"}],
        },
        "CUSTOM": {"type": "CUSTOM", "name": "ui.toast", "value": {"text": "Saved"}},
        "SUBAGENT_STARTED": {
            "type": "SUBAGENT_STARTED",
            "subagentRunId": "s1",
            "name": "researcher",
        },
        "SUBAGENT_FINISHED": {
            "type": "SUBAGENT_FINISHED",
            "subagentRunId": "s1",
            "outcome": {"type": "suspended"},
        },
        "SUBAGENT_ERROR": {
            "type": "SUBAGENT_ERROR",
            "subagentRunId": "s1",
            "message": "Flight API returned 503",
            "code": "http_503",
        },
    }
    for kind, event in events.items():
        assert one(event) == expected[kind], kind
    raw = {"type": "RAW", "event": {"id": "x"}, "source": "openai"}
    assert TranscriptView(raw="full").render(raw) == 'raw openai: {"id":"x"}\n'


def test_every_corpus_event_renders_without_the_fallback() -> None:
    # In corpus order, as a continuation chunk needs the chunk before it.
    view = TranscriptView()
    for event in CORPUS:
        out = view.render(event)
        assert "unrenderable" not in out and "malformed" not in out and "unknown" not in out
    assert {event["type"] for event in CORPUS} == {t.value for t in EventType}


def test_subagent_work_is_prefixed() -> None:
    events = [
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "subagentRunId": "s1"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Found"},
        {"type": "STEP_STARTED", "stepName": "search", "subagentRunId": "s1"},
        # A continuation may leave the tag out; the line still names its owner.
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": " 3 flights"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    ]
    assert render(events) == (
        "[s1] assistant: Found\n[s1] ▸ step search\n[s1] assistant (cont.):  3 flights\n"
    )


# -- interleaving ----------------------------------------------------------------------


def test_interleaved_messages_and_tool_call() -> None:
    events: list[Event] = [
        {"type": "TEXT_MESSAGE_START", "messageId": "a", "role": "user"},
        {"type": "TEXT_MESSAGE_START", "messageId": "b"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": "Hi"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b", "delta": "Hel"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b", "delta": "lo"},
        {"type": "TOOL_CALL_START", "toolCallId": "c", "toolCallName": "f"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": '{"x":'},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": " there"},
        {"type": "TEXT_MESSAGE_END", "messageId": "a"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c", "delta": "1}"},
        {"type": "TOOL_CALL_END", "toolCallId": "c"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b", "delta": "!"},
        {"type": "TEXT_MESSAGE_END", "messageId": "b"},
    ]
    assert render(events) == (
        "user: \n"
        "assistant: \n"
        "user (cont.): Hi\n"
        "assistant (cont.): Hello\n"
        'tool f({"x":\n'
        "user (cont.):  there\n"
        "tool f(…1})\n"
        "assistant (cont.): !\n"
    )


def test_an_end_of_an_interrupted_item_prints_nothing() -> None:
    events = [
        *text("a", "one")[:2],
        {"type": "STEP_STARTED", "stepName": "s"},
        {"type": "TEXT_MESSAGE_END", "messageId": "a"},
        {"type": "STEP_FINISHED", "stepName": "s"},
    ]
    assert render(events) == "assistant: one\n▸ step s\n▸ step s done\n"


def test_a_tool_call_interrupted_by_a_message_still_gets_its_paren() -> None:
    events = [
        *tool("c1", "f", '{"a":1}')[:2],
        *text("m1", "hi"),
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},
    ]
    assert render(events) == 'tool f({"a":1}\nassistant: hi\ntool f(…)\n'
    # The message still open when the call ends: its line goes on as "(cont.)".
    events = [
        *tool("c1", "f", "{}")[:2],
        *text("m1", "hi")[:2],
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},
        *text("m1", "!")[1:],
    ]
    assert render(events) == "tool f({}\nassistant: hi\ntool f(…)\nassistant (cont.): !\n"


def test_an_interrupted_tool_call_gets_its_paren_once() -> None:
    events: list[Event] = [
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f"},
        {"type": "STEP_STARTED", "stepName": "s"},
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},  # a duplicate end shows nothing
        {"type": "TOOL_CALL_START", "toolCallId": "c2", "toolCallName": "g", "subagentRunId": "s"},
        {"type": "STATE_SNAPSHOT", "snapshot": {}},
        {"type": "TOOL_CALL_END", "toolCallId": "c2"},
    ]
    assert render(events) == (
        "tool f(\n▸ step s\ntool f(…)\n[s] tool g(\nstate: {}\n[s] tool g(…)\n"
    )


def test_an_interrupted_chunk_tool_call_gets_its_paren_when_its_stream_ends() -> None:
    events: list[Event] = [
        {"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "f", "delta": "{"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "subagentRunId": "s1", "delta": "x"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ]
    assert render(events) == "tool f({\n[s1] assistant: x\ntool f(…)\n── run r finished\n"


def test_an_unknown_or_aborted_tool_call_end_prints_nothing() -> None:
    # Its start was never seen (a tail joining mid-call, after a snapshot).
    assert render([{"type": "TOOL_CALL_END", "toolCallId": "c1"}]) == ""
    # A run error ends the run: the call never ended, so no parenthesis.
    events: list[Event] = [
        *tool("c1", "f", "{")[:2],
        {"type": "RUN_ERROR", "message": "boom"},
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},
    ]
    assert render(events) == "tool f({\n── run error: boom\n"


@st.composite
def interleaved_items(draw: st.DrawFn) -> list[Event]:
    """Tool calls f0.. and messages interleaved at random, with steps between; no
    delta holds a parenthesis, nor a tool call's a newline."""
    items: list[list[Event]] = []
    for number in range(draw(st.integers(1, 3))):
        deltas = draw(st.lists(st.sampled_from(["x", '{"a": 1}']), max_size=3))
        items.append(tool(f"c{number}", f"f{number}", *deltas))
    for number in range(draw(st.integers(0, 3))):
        deltas = draw(st.lists(st.sampled_from(["y", "y\n"]), max_size=3))
        items.append(text(f"m{number}", *deltas, role=draw(st.sampled_from(["user", "assistant"]))))
    steps = draw(st.integers(0, 2))
    events: list[Event] = []
    while any(items) or steps:
        choices = [index for index, item in enumerate(items) if item]
        pick = draw(st.sampled_from([*choices, *([-1] if steps else [])]))  # -1: a step
        if pick < 0:
            events.append({"type": "STEP_STARTED", "stepName": f"s{steps}"})
            steps -= 1
        else:
            events.append(items[pick].pop(0))
    return events


@settings(max_examples=200, deadline=None)
@given(interleaved_items(), st.data())
def test_every_tool_call_line_is_closed_exactly_once(
    events: list[Event], data: st.DataObject
) -> None:
    calls = {e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"}
    cuts = data.draw(st.lists(st.integers(0, len(events)), max_size=2), label="cuts")
    whole = render(events)
    with tempfile.TemporaryDirectory() as tmp:
        assert resumed_render(events, cuts, Path(tmp) / "pos", close=True) == whole
    closed = [line for line in whole.splitlines() if line.endswith(")")]
    assert len(closed) == len(calls) and all(line.startswith("tool ") for line in closed)
    for name in calls:
        lines = [line for line in whole.splitlines() if line.startswith(f"tool {name}(")]
        # Continuations may follow ("tool f(…"); the last one, only, is closed.
        assert lines[-1].endswith(")"), (name, whole)
        assert not any(line.endswith(")") for line in lines[:-1]), (name, whole)


def test_empty_delta_does_not_reopen_a_line() -> None:
    events = [
        *text("a", "one")[:2],
        {"type": "STEP_STARTED", "stepName": "s"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": ""},
    ]
    assert render(events) == "assistant: one\n▸ step s\n"


# -- chunks ----------------------------------------------------------------------------


def test_text_chunks_open_and_continue_a_line() -> None:
    events: list[Event] = [
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "assistant", "delta": "Let me"},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": " check"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "."},
        # A chunk with another id ends the stream and opens a new one.
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m2", "role": "user", "delta": "ok"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ]
    assert render(events) == "assistant: Let me check.\nuser: ok\n── run r finished\n"


def test_tool_chunks_close_with_a_paren_when_their_stream_ends() -> None:
    events: list[Event] = [
        {"type": "TOOL_CALL_CHUNK", "toolCallId": "c1", "toolCallName": "f", "delta": '{"a":'},
        {"type": "TOOL_CALL_CHUNK", "delta": "1}"},
        {"type": "STEP_STARTED", "stepName": "s"},  # ends the parent's chunk stream
        {"type": "TOOL_CALL_CHUNK", "delta": "lost"},  # nothing to continue
    ]
    out = render(events)
    assert out.startswith('tool f({"a":1})\n▸ step s\n── malformed TOOL_CALL_CHUNK')
    assert out.count("\n") == 3


def test_chunk_after_interruption_reopens_with_a_continuation_header() -> None:
    events: list[Event] = [
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": "r1", "delta": "Think"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "t9",
            "toolCallId": "c9",
            "content": "x",
            "subagentRunId": "s1",
        },
        {"type": "REASONING_MESSAGE_CHUNK", "delta": "ing"},
        {"type": "REASONING_MESSAGE_CHUNK"},
    ]
    assert render(events) == "thinking: Think\n[s1]   ↳ x\nthinking (cont.): ing\n"


def test_subagent_chunk_lanes_are_separate() -> None:
    events: list[Event] = [
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "p", "delta": "parent"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "s", "subagentRunId": "s1", "delta": "sub"},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": " again"},  # the parent's stream
        {"type": "SUBAGENT_FINISHED", "subagentRunId": "s1"},
    ]
    assert render(events) == (
        "assistant: parent\n[s1] assistant: sub\nassistant (cont.):  again\n"
        "── subagent s1 finished\n"
    )


# -- notices, reset, close -------------------------------------------------------------


def test_notice_reset_and_close_end_an_open_line() -> None:
    view = TranscriptView()
    out = view.render(text("m1", "Hi")[0]) + view.render(text("m1", "Hi")[1])
    out += view.notice("reconnected")
    out += view.render({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "!"})
    out += view.reset()
    assert view.state()["items"] == {}
    out += view.render({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "?"})
    out += view.close()
    assert view.close() == ""
    assert out == ("assistant: Hi\n── reconnected\nassistant (cont.): !\nmessage (cont.): ?\n")


# -- the resume property ---------------------------------------------------------------


@pytest.mark.parametrize("color", [False, True])
def test_split_anywhere_in_the_demo_gives_the_same_output(color: bool) -> None:
    whole = whole_render(DEMO, color=color)
    for k in range(len(DEMO) + 1):
        assert split_render(DEMO, k, color=color) == whole, k


def test_split_in_an_interleaved_stream() -> None:
    events = [
        {"type": "TEXT_MESSAGE_START", "messageId": "a", "role": "user", "subagentRunId": "s"},
        {"type": "TOOL_CALL_CHUNK", "toolCallId": "c", "toolCallName": "f", "delta": "{"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": "x\n"},
        {"type": "TOOL_CALL_CHUNK", "delta": "}"},
        {"type": "TEXT_MESSAGE_END", "messageId": "a"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ]
    whole = whole_render(events)
    assert "[s] user (cont.): x\n" in whole
    for k in range(len(events) + 1):
        assert split_render(events, k) == whole, k


def test_a_viewer_stopped_mid_line_continues_the_line_without_a_header() -> None:
    events = [
        *text("m1", "Hel", "lo"),
        *tool("c1", "f", '{"a":', "1}"),
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ]
    whole = render(events)
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(len(events) + 1):
            path = Path(tmp) / f"{k}.pos"
            assert resumed_render(events, [k], path, close=True) == whole, k
        # Stopped after "Hel": the first life printed a partial line, and the
        # second goes on from there.
        first = resumed_render(events[:2], [], Path(tmp) / "first.pos", close=False)
        assert first == "assistant: Hel"
    assert "(cont.)" not in whole and whole.count(")") == 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_streams(), st.data(), st.booleans(), st.booleans())
def test_a_viewer_stopped_and_restarted_prints_the_uninterrupted_transcript(
    events: list[Event], data: st.DataObject, color: bool, close: bool
) -> None:
    """Through the offset file, as `tail --offset-file`: stopped after any event (once
    or a few times, Ctrl-C or kill -9 alike) and restarted, the lives' outputs
    concatenated are the transcript of one view, with and without the final close."""
    cuts = data.draw(st.lists(st.integers(0, len(events)), min_size=1, max_size=3), label="cuts")
    view = TranscriptView(color=color)
    whole = "".join(view.render(e) for e in events) + (view.close() if close else "")
    with tempfile.TemporaryDirectory() as tmp:
        resumed = resumed_render(events, cuts, Path(tmp) / "pos", close=close, color=color)
    assert resumed == whole


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ODD = st.sampled_from([b"\x1b[2J", float("nan"), float("inf"), (1, 2), object(), 10**5000, {1: 2}])
FIELDS = st.sampled_from(
    [
        "messageId",
        "toolCallId",
        "toolCallName",
        "delta",
        "role",
        "name",
        "subagentRunId",
        "stepName",
        "runId",
        "content",
        "messages",
        "snapshot",
        "outcome",
        "message",
        "code",
        "patch",
        "event",
        "value",
    ]
)
TYPES = st.sampled_from([t.value for t in EventType]) | st.text(max_size=12) | JSON
ID = st.sampled_from(["m1", "m2", "c1", "s1"])


@st.composite
def garbage(draw: st.DrawFn) -> dict[Any, Any]:
    """A dict a broken producer might have stored: known type, wrong or missing fields."""
    event: dict[Any, Any] = {}
    if draw(st.booleans()):
        event["type"] = draw(TYPES)
    for key in draw(st.lists(FIELDS | st.text(max_size=6), max_size=5)):
        event[key] = draw(ID | JSON | ODD)
    return event


EVENTS = st.lists(st.sampled_from(CORPUS) | garbage(), max_size=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS, st.booleans())
def test_split_anywhere_in_corpus_and_garbage(events: list[Event], color: bool) -> None:
    whole = whole_render(events, color=color)  # never raises
    for k in range(len(events) + 1):
        assert split_render(events, k, color=color) == whole


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_streams())
def test_split_anywhere_in_valid_streams(events: list[Event]) -> None:
    whole = whole_render(events)
    assert "unrenderable" not in whole and "malformed" not in whole
    for k in range(0, len(events) + 1, max(1, len(events) // 10)):
        assert split_render(events, k) == whole


@settings(max_examples=200, deadline=None)
@given(garbage())
def test_any_garbage_gives_at_most_one_line(event: dict[Any, Any]) -> None:
    out = TranscriptView().render(event)
    assert out.count("\n") <= 1 or event.get("type") == "MESSAGES_SNAPSHOT"
    assert "\x1b" not in out


class Hostile(Mapping[str, Any]):
    """A mapping whose every access fails."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("no")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("no")

    def __len__(self) -> int:
        return 1


def test_a_hostile_mapping_gives_a_line_and_the_view_stays_usable() -> None:
    view = TranscriptView()
    out = view.render(text("m1", "Hi")[0]) + view.render(Hostile())
    out += view.render({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "!"})
    assert out == "assistant: \n── unrenderable event\nassistant (cont.): !"


def test_a_value_that_breaks_on_repr_is_survived() -> None:
    class Bad:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    out = one({"type": "CUSTOM", "name": "x", "value": [Bad()]})
    assert out == "custom x: [<Bad>]\n"


# -- state size ------------------------------------------------------------------------


def test_state_stays_small_over_a_long_message() -> None:
    view = TranscriptView()
    view.render({"type": "RUN_STARTED", "threadId": "t", "runId": "r"})
    view.render({"type": "TEXT_MESSAGE_START", "messageId": "m1"})
    sizes = []
    for i in range(10_000):
        view.render({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"w{i} "})
        if i % 1000 == 0:
            sizes.append(len(json.dumps(view.state())))
    assert len(set(sizes)) == 1 and sizes[0] < 200
    view.render({"type": "TEXT_MESSAGE_END", "messageId": "m1"})
    assert view.state()["items"] == {} and view.state()["line"] is None


def test_state_forgets_ended_items_and_runs() -> None:
    view = TranscriptView()
    for i in range(500):
        for event in [*text(f"m{i}", "x"), *tool(f"c{i}", "f", "{}")]:
            view.render(event)
    assert view.state()["items"] == {}
    # Items a run left open are forgotten when the run ends.
    view.render({"type": "TEXT_MESSAGE_START", "messageId": "open"})
    view.render({"type": "TEXT_MESSAGE_CHUNK", "messageId": "chunk", "subagentRunId": "s"})
    assert len(view.state()["items"]) == 2
    view.render({"type": "RUN_ERROR", "message": "boom"})
    assert view.state()["items"] == {} and view.state()["lanes"] == {}


# -- colour and control characters -----------------------------------------------------


def test_colour_off_has_no_escape_codes_and_on_only_adds_them() -> None:
    events = [*CORPUS, *DEMO]
    plain = render(events)
    coloured = render(events, color=True)
    assert "\x1b" not in plain
    assert "\x1b[1;32massistant\x1b[0m: " in coloured  # role
    assert "\x1b[1;35mget_weather\x1b[0m(" in coloured  # tool name
    assert "\x1b[2m── run r1 started\x1b[0m" in coloured  # marker
    assert "\x1b[31m── run error: Upstream model unavailable\x1b[0m" in coloured  # error
    assert ANSI.sub("", coloured) == plain


CONTROL_CATEGORIES = {"Cc", "Cs"}
OUR_STYLES = {
    f"\x1b[{style}m" for style in ("0", "1", "2", "31", "34", "1;32", "1;33", "1;35", "1;36", "2;3")
}
EVIL = "a\x1b[2Jb\x9b31mc\rd\x07e\x00f\u202eg\ud800h\x7f"


def visible_controls(out: str) -> set[str]:
    """Characters a terminal could act on, other than newline and tab."""
    return {
        c
        for c in out
        if c not in "\n\t"
        and (unicodedata.category(c) in CONTROL_CATEGORIES or c in "\u202e\u2028\u2029")
    }


def test_control_characters_in_content_are_escaped() -> None:
    events: list[Event] = [
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "user", "name": EVIL},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": EVIL + "\tok\n"},
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": EVIL},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": EVIL},
        {"type": "TOOL_CALL_RESULT", "messageId": "t", "toolCallId": "c1", "content": EVIL},
        {"type": "STATE_SNAPSHOT", "snapshot": {EVIL: EVIL}, "subagentRunId": EVIL},
        {"type": "STATE_DELTA", "delta": [{"op": "add", "path": EVIL, "value": EVIL}]},
        {"type": "RUN_ERROR", "message": EVIL, "code": EVIL},
        {"type": EVIL},
        {"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "x", "role": EVIL, "content": EVIL}]},
        {"type": "CUSTOM", "name": EVIL, "value": EVIL},
    ]
    for color in (False, True):
        out = render(events, color=color)
        stripped = ANSI.sub("", out)
        assert visible_controls(stripped) == set()
        assert set(ANSI.findall(out)) <= OUR_STYLES
        assert "\t" in stripped  # tabs in streamed text are kept
    out = render(events)
    assert "a\\x1b[2Jb\\x9b31mc\\x0dd\\x07e\\x00f\\u202eg\\ud800h\\x7f" in out
    assert TranscriptView().notice("x\x1by") == "── x\\x1by\n"


# -- bad state ----------------------------------------------------------------------------


GOOD = TranscriptView().state()


@pytest.mark.parametrize(
    "state",
    [
        [],
        {},
        {**GOOD, "extra": 1},
        {**GOOD, "version": 3},
        {**GOOD, "version": True},
        {**GOOD, "version": 1},  # version 1 had no "raw"
        {**GOOD, "raw": [1]},
        {**GOOD, "raw": [-1, 0]},
        {**GOOD, "raw": [1, "2"]},
        {**GOOD, "line": 5},
        {**GOOD, "line": "message:m1"},
        {**GOOD, "nl": "no"},
        {**GOOD, "items": []},
        {**GOOD, "items": {"text:m1": "assistant"}},
        {**GOOD, "items": {"m1": {"role": "assistant"}}},
        {**GOOD, "items": {"text:m1": {"role": 1}}},
        {**GOOD, "items": {"text:m1": {"colour": "red"}}},
        {**GOOD, "items": {"text:m1": {"chunk": False}}},
        {**GOOD, "lanes": {"": 3}},
    ],
)
def test_a_garbled_state_is_refused(state: Any) -> None:
    with pytest.raises(ValueError, match="not a saved TranscriptView state"):
        TranscriptView(state=state)


def test_a_saved_state_is_not_shared_with_the_view() -> None:
    view = TranscriptView()
    view.render(text("m1")[0])
    saved = view.state()
    restored = TranscriptView(state=saved)
    saved["items"].clear()
    assert restored.render({"type": "TEXT_MESSAGE_END", "messageId": "m1"}) == "\n"
    assert restored.state()["items"] == {}
    assert view.state()["items"] == {"text:m1": {"role": "assistant"}}


# -- a real tail stopped with Ctrl-C and started again -------------------------------------

WAIT = 10 * TIMEOUT_SCALE


def wait_until(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT:.0f} s waiting for {what}")
        time.sleep(0.02)


def run_cli(*args: str) -> bytes:
    """The stdout of a command that must succeed."""
    proc = subprocess.run(
        [*CLI, *args], stdin=subprocess.DEVNULL, capture_output=True, cwd=ROOT, env=child_env(),
        timeout=WAIT,
    )  # fmt: skip
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0 and "Traceback" not in err, (args, proc.returncode, err)
    return proc.stdout


def saved_offset(path: Path) -> str | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8").strip() or "null")
    except (OSError, ValueError):
        return None  # not written yet
    return record.get("offset") if isinstance(record, dict) else None


def with_an_aside(events: list[Event], run_id: str) -> list[Event]:
    """The demo run with a message streamed while its first tool call is still open."""
    at = next(i for i, e in enumerate(events) if e["type"] == "TOOL_CALL_END")
    aside = text(f"{run_id}-aside", "One moment", ".")
    return [*events[:at], *aside, *events[at:]]


def test_tail_stopped_with_ctrl_c_and_restarted_prints_the_uninterrupted_transcript(
    tmp_path: Path,
) -> None:
    """`tail --offset-file` gets SIGINT in the middle of a line five times (reasoning,
    tool arguments, a message interleaved with a tool call, tool arguments again, the
    answer), and is started again each time, with events published both while it runs
    and while it is stopped: its six outputs concatenated are byte for byte an
    uninterrupted tail's transcript, and a replay's."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    thread = f"ctrl-c-{run_id}"
    events = with_an_aside([event for _, event in demo_run(thread, run_id)], run_id)
    types = [e["type"] for e in events]
    first_call = types.index("TOOL_CALL_START")
    cuts = [
        types.index("REASONING_MESSAGE_START") + 6,  # mid reasoning
        first_call + 3,  # mid tool arguments
        types.index("TEXT_MESSAGE_START", first_call) + 2,  # mid message, the call open
        types.index("TOOL_CALL_START", first_call + 1) + 3,  # mid tool arguments
        len(events) - 12,  # mid answer
    ]
    for cut in cuts:
        assert types[cut - 1].endswith("_CONTENT") or types[cut - 1] == "TOOL_CALL_ARGS"
    bounds = [0, *cuts, len(events)]
    pieces = [events[a:b] for a, b in itertools.pairwise(bounds)]

    gateway = start_gateway(tmp_path, "memory://")
    tails: list[subprocess.Popen[bytes]] = []
    try:
        url = gateway.url
        pos = tmp_path / "viewer.pos"
        tail_argv = [*CLI, "tail", thread, "--url", url, "--offset-file", str(pos),
                     "--until-finished"]  # fmt: skip
        stored: list[str] = []
        outputs: list[Path] = []
        for life, piece in enumerate(pieces):

            def publish(piece: list[Event] = piece) -> None:
                lines = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in piece)
                path = tmp_path / "piece.ndjson"
                path.write_text(lines, encoding="utf-8")
                offsets = run_cli("publish", thread, str(path), "--url", url).split()
                assert len(offsets) == len(piece)
                stored.extend(o.decode() for o in offsets)

            if life % 2:
                publish()  # while no tail runs
            outputs.append(tmp_path / f"tail-{life}.out")
            with outputs[-1].open("wb") as out, (tmp_path / f"tail-{life}.err").open("wb") as err:
                tails.append(
                    subprocess.Popen(
                        tail_argv,
                        cwd=ROOT,
                        env=child_env(),
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=err,
                    )
                )
            if not life % 2:
                publish()  # live
            tail = tails[-1]
            if life < len(pieces) - 1:
                wait_until(lambda: saved_offset(pos) == stored[-1], f"life {life} to print")
                tail.send_signal(signal.SIGINT)
                assert tail.wait(timeout=WAIT) == 130
            else:
                assert tail.wait(timeout=WAIT) == 0  # --until-finished
            err_text = (tmp_path / f"tail-{life}.err").read_text(errors="replace")
            assert "Traceback" not in err_text, err_text
        full = run_cli("replay", thread, "--url", url)
        uninterrupted = run_cli("tail", thread, "--url", url, "--until-finished")
    finally:
        for tail in tails:
            if tail.poll() is None:
                tail.kill()
                tail.wait(timeout=WAIT)
        gateway.kill()
    assert not gateway.logged_errors(), gateway.log()[-4000:]

    outs = [path.read_bytes() for path in outputs]
    assert b"".join(outs) == full
    assert uninterrupted == full
    # Each life stopped mid-line, and the next went on with that line: no header.
    for number, cut in enumerate(cuts):
        assert outs[number].endswith(events[cut - 1]["delta"].encode()), number
        assert outs[number + 1].startswith(events[cut]["delta"].encode()), number
    lines = full.decode().splitlines()
    assert "(cont.)" not in full.decode()
    assert 'tool get_weather({"city": "Paris", "unit": "celsius"}' in lines
    assert "assistant: One moment." in lines and "tool get_weather(…)" in lines
    closed = [line for line in lines if line.startswith("tool ") and line.endswith(")")]
    assert len(closed) == 2  # each tool call closed once


def langgraph_like_run() -> list[Event]:
    """A streamed answer with a RAW event (1 to 3 kB in real runs) after each event."""
    raw = {"type": "RAW", "source": "langchain", "event": {"event": "on_chat_model_stream",
           "data": {"chunk": "x" * 1500}}}  # fmt: skip
    events: list[Event] = [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r1"},
        *text("m1", "The answer ", "is 42."),
        {"type": "CUSTOM", "name": "state", "value": {"rows": ["y" * 100] * 5}},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r1"},
    ]
    return [e for event in events for e in (event, raw)]


def test_raw_events_never_split_a_streamed_answer() -> None:
    """By default RAW and bulky CUSTOM events are counted into one short line,
    written when the next line starts; "hide" drops them, "full" writes them."""
    events = langgraph_like_run()
    short = render(events)
    assert "assistant: The answer is 42.\n" in short and "(cont.)" not in short
    lines = short.splitlines()
    assert lines[0] == "── run r1 started"
    assert lines[1].startswith("raw: 1 event (") and "kB" in lines[1]
    assert lines[3].startswith("raw: 6 events (")  # 5 RAW and the bulky CUSTOM
    assert lines[-1].startswith("raw: 1 event (")  # written by close()
    assert len(lines) == 6
    hidden = render(events, raw="hide")
    assert hidden == "── run r1 started\nassistant: The answer is 42.\n── run r1 finished\n"
    full = render(events, raw="full")
    assert full.count("raw langchain: ") == len(events) // 2
    assert "x" * 1500 in full and "y" * 100 in full
    assert "assistant (cont.): " in full  # as before: each one its own line
    with pytest.raises(ValueError, match="raw must be one of"):
        TranscriptView(raw="some")


def test_raw_events_not_shown_yet_survive_a_restart() -> None:
    events = langgraph_like_run()
    whole = render(events)
    first = TranscriptView()
    out = "".join(first.render(e) for e in events[:5])  # ... a RAW counted, not written
    saved = json.loads(json.dumps(first.state()))
    assert saved["raw"][0] == 1
    second = TranscriptView(state=saved)
    out += "".join(second.render(e) for e in events[5:]) + second.close()
    assert out == whole
    old = {key: value for key, value in saved.items() if key != "raw"}
    TranscriptView(state={**old, "version": 1})  # a state saved by the previous version
