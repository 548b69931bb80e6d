"""Tests for agui_hub.agui.chunks: expanding *_CHUNK events into START / CONTENT / END."""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_hub.agui import chunks
from agui_hub.agui.chunks import ChunkExpander, expand_chunks
from agui_hub.agui.events import (
    EventType,
    TextMessageChunkEvent,
    ToolCallChunkEvent,
    validate_wire,
)
from agui_hub.agui.reducer import ThreadState
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.errors import ChunkError, SequenceError

Event = dict[str, Any]

# -- helpers -------------------------------------------------------------------


def canonical(events: list[Event]) -> list[Event]:
    """Assert every event is a canonical wire dict (validate_wire returns it unchanged)."""
    for event in events:
        assert validate_wire(event) == event, event
    return events


def run(expander: ChunkExpander, event: Any) -> list[Event]:
    return canonical(expander.expand(event))


def text(mid: str | None = None, delta: str | None = None, **extra: Any) -> Event:
    event: Event = {"type": "TEXT_MESSAGE_CHUNK"}
    if mid is not None:
        event["messageId"] = mid
    if delta is not None:
        event["delta"] = delta
    event.update(extra)
    return validate_wire(event)


def tool(
    tid: str | None = None, name: str | None = None, delta: str | None = None, **extra: Any
) -> Event:
    event: Event = {"type": "TOOL_CALL_CHUNK"}
    if tid is not None:
        event["toolCallId"] = tid
    if name is not None:
        event["toolCallName"] = name
    if delta is not None:
        event["delta"] = delta
    event.update(extra)
    return validate_wire(event)


def reasoning(mid: str | None = None, delta: str | None = None, **extra: Any) -> Event:
    event: Event = {"type": "REASONING_MESSAGE_CHUNK"}
    if mid is not None:
        event["messageId"] = mid
    if delta is not None:
        event["delta"] = delta
    event.update(extra)
    return validate_wire(event)


def entity_id(event: Event) -> str:
    eid: str = event["messageId"] if "messageId" in event else event["toolCallId"]
    return eid


def types_of(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


RUN_STARTED: Event = {"type": "RUN_STARTED", "threadId": "th", "runId": "r1"}
RUN_FINISHED: Event = {"type": "RUN_FINISHED", "threadId": "th", "runId": "r1"}

# A valid example of every non-chunk event that ends the pending stream of its own lane.
OWN_LANE_CLOSERS: dict[str, Event] = {
    "TEXT_MESSAGE_START": {"type": "TEXT_MESSAGE_START", "messageId": "x", "role": "assistant"},
    "TEXT_MESSAGE_CONTENT": {"type": "TEXT_MESSAGE_CONTENT", "messageId": "x", "delta": "d"},
    "TEXT_MESSAGE_END": {"type": "TEXT_MESSAGE_END", "messageId": "x"},
    "TOOL_CALL_START": {"type": "TOOL_CALL_START", "toolCallId": "x", "toolCallName": "f"},
    "TOOL_CALL_ARGS": {"type": "TOOL_CALL_ARGS", "toolCallId": "x", "delta": "{"},
    "TOOL_CALL_END": {"type": "TOOL_CALL_END", "toolCallId": "x"},
    "TOOL_CALL_RESULT": {
        "type": "TOOL_CALL_RESULT",
        "messageId": "x",
        "toolCallId": "y",
        "content": "ok",
    },
    "STATE_SNAPSHOT": {"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}},
    "STATE_DELTA": {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": 1}]},
    "CUSTOM": {"type": "CUSTOM", "name": "n", "value": None},
    "STEP_STARTED": {"type": "STEP_STARTED", "stepName": "s"},
    "STEP_FINISHED": {"type": "STEP_FINISHED", "stepName": "s"},
    "REASONING_START": {"type": "REASONING_START", "messageId": "x"},
    "REASONING_MESSAGE_START": {
        "type": "REASONING_MESSAGE_START",
        "messageId": "x",
        "role": "reasoning",
    },
    "REASONING_MESSAGE_CONTENT": {
        "type": "REASONING_MESSAGE_CONTENT",
        "messageId": "x",
        "delta": "d",
    },
    "REASONING_MESSAGE_END": {"type": "REASONING_MESSAGE_END", "messageId": "x"},
    "REASONING_END": {"type": "REASONING_END", "messageId": "x"},
}

# Every non-chunk event that ends the pending streams of all lanes.
ALL_LANE_CLOSERS: dict[str, Event] = {
    "RUN_STARTED": {"type": "RUN_STARTED", "threadId": "th", "runId": "r2"},
    "RUN_FINISHED": RUN_FINISHED,
    "RUN_ERROR": {"type": "RUN_ERROR", "message": "boom"},
    "MESSAGES_SNAPSHOT": {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [{"id": "u1", "role": "user", "content": "hi"}],
    },
}

# Non-chunk events that leave pending streams open.
NON_CLOSERS: dict[str, Event] = {
    "RAW": {"type": "RAW", "event": {"any": "thing"}},
    "ACTIVITY_SNAPSHOT": {
        "type": "ACTIVITY_SNAPSHOT",
        "messageId": "a1",
        "activityType": "plan",
        "content": {},
    },
    "ACTIVITY_DELTA": {
        "type": "ACTIVITY_DELTA",
        "messageId": "a1",
        "activityType": "plan",
        "patch": [{"op": "add", "path": "/x", "value": 1}],
    },
    "REASONING_ENCRYPTED_VALUE": {
        "type": "REASONING_ENCRYPTED_VALUE",
        "subtype": "message",
        "entityId": "m1",
        "encryptedValue": "zzz",
    },
    "SUBAGENT_STARTED": {"type": "SUBAGENT_STARTED", "subagentRunId": "sa", "name": "helper"},
}


def with_lane(event: Event, lane: str | None) -> Event:
    return event if lane is None else {**event, "subagentRunId": lane}


# -- the module ----------------------------------------------------------------


def test_module_imports_no_io_libraries() -> None:
    source = Path(chunks.__file__).read_text()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "websockets", "redis"}


def test_event_type_tables_cover_every_event_type() -> None:
    subagent_terminals = {"SUBAGENT_FINISHED", "SUBAGENT_ERROR"}
    closing = set(OWN_LANE_CLOSERS) | set(ALL_LANE_CLOSERS) | subagent_terminals
    chunk_types = {"TEXT_MESSAGE_CHUNK", "TOOL_CALL_CHUNK", "REASONING_MESSAGE_CHUNK"}
    assert set(chunks.CLOSING_EVENT_TYPES) == closing
    assert set(chunks.CHUNK_EVENT_TYPES) == chunk_types
    assert closing | chunk_types | set(NON_CLOSERS) == {t.value for t in EventType}


# -- opening a stream ----------------------------------------------------------


def test_first_text_chunk_opens_with_explicit_assistant_role() -> None:
    x = ChunkExpander()
    out = run(x, text("m1", "Hel"))
    assert out == [
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hel"},
    ]
    assert x.open_streams == {None: ("text", "m1")}


def test_first_text_chunk_keeps_its_role_and_name() -> None:
    out = run(ChunkExpander(), text("m1", "hi", role="user", name="ann"))
    assert out[0] == {
        "type": "TEXT_MESSAGE_START",
        "messageId": "m1",
        "role": "user",
        "name": "ann",
    }


def test_opening_chunk_without_delta_emits_only_start() -> None:
    x = ChunkExpander()
    assert run(x, text("m1")) == [
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}
    ]
    assert x.open_streams == {None: ("text", "m1")}


@pytest.mark.parametrize(
    ("chunk", "rule"),
    [
        (text(delta="x"), "chunk_missing_id"),
        (reasoning(delta="x"), "chunk_missing_id"),
        (tool(name="f", delta="{}"), "chunk_missing_id"),
        (tool("t1", delta="{}"), "chunk_missing_tool_name"),
    ],
)
def test_first_chunk_must_carry_its_id(chunk: Event, rule: str) -> None:
    x = ChunkExpander(thread="th-1")
    with pytest.raises(ChunkError) as info:
        x.expand(chunk)
    err = info.value
    assert isinstance(err, SequenceError)
    assert err.rule == rule
    assert err.event == chunk
    assert err.thread == "th-1"
    assert err.code == "chunk_error"
    assert chunk["type"] in str(err) and "th-1" in str(err)
    assert x.open_streams == {}


# -- continuing a stream -------------------------------------------------------


def test_continuation_without_id_and_with_same_id() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    assert run(x, text(delta="b")) == [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "b"}
    ]
    assert run(x, text("m1", "c")) == [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "c"}
    ]
    assert x.open_streams == {None: ("text", "m1")}


def test_continuation_without_delta_emits_nothing() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    assert run(x, text()) == []
    assert run(x, text("m1")) == []
    assert run(x, text(role="assistant", timestamp=7)) == []
    assert x.open_streams == {None: ("text", "m1")}


def test_continuation_may_repeat_opener_fields_with_the_same_value() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a", name="bob"))
    out = run(x, text("m1", "b", role="assistant", name="bob"))
    assert out == [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "b"}]
    run(x, tool("t1", "f", parentMessageId="m1"))
    out = run(x, tool("t1", "f", "{}", parentMessageId="m1"))
    assert out == [{"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": "{}"}]


@pytest.mark.parametrize(
    ("opener", "continuation", "field"),
    [
        (text("m1", "a"), text(delta="b", role="user"), "role"),
        (text("m1", "a", role="user"), text("m1", "b", role="assistant"), "role"),
        (text("m1", "a", name="bob"), text(delta="b", name="eve"), "name"),
        (text("m1", "a"), text(delta="b", name="eve"), "name"),
        (tool("t1", "f"), tool(delta="{}", toolCallName="g"), "toolCallName"),
        (
            tool("t1", "f", parentMessageId="m1"),
            tool("t1", delta="{", parentMessageId="m2"),
            "parentMessageId",
        ),
        (tool("t1", "f"), tool(delta="{", parentMessageId="m2"), "parentMessageId"),
    ],
)
def test_continuation_contradicting_the_opener_is_rejected(
    opener: Event, continuation: Event, field: str
) -> None:
    x = ChunkExpander()
    run(x, opener)
    before = x.open_streams
    with pytest.raises(ChunkError) as info:
        x.expand(continuation)
    assert info.value.rule == "chunk_field_mismatch"
    assert field in str(info.value)
    assert x.open_streams == before
    # The stream is still usable.
    plain = {"type": continuation["type"], "delta": "z"}
    assert types_of(run(x, plain)) == [
        {"TEXT_MESSAGE_CHUNK": "TEXT_MESSAGE_CONTENT"}.get(plain["type"], "TOOL_CALL_ARGS")
    ]


# -- switching streams ---------------------------------------------------------


def test_chunk_with_another_id_ends_the_pending_stream_first() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    assert run(x, text("m2", "b")) == [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "b"},
    ]
    assert x.open_streams == {None: ("text", "m2")}


def test_chunk_of_another_kind_ends_the_pending_stream_first() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    assert types_of(run(x, tool("t1", "search", '{"q"'))) == [
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
    ]
    assert types_of(run(x, reasoning("r1", "hmm"))) == [
        "TOOL_CALL_END",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
    ]
    assert x.open_streams == {None: ("reasoning", "r1")}


def test_idless_chunk_of_another_kind_is_rejected_and_ends_nothing() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    with pytest.raises(ChunkError) as info:
        x.expand(tool(delta="{}"))
    assert info.value.rule == "chunk_missing_id"
    assert "toolCallId" in str(info.value)
    # Nothing was ended: the text message still continues.
    assert x.open_streams == {None: ("text", "m1")}
    assert types_of(run(x, text(delta="b"))) == ["TEXT_MESSAGE_CONTENT"]


def test_tool_chunk_without_name_on_a_new_id_leaves_the_open_stream() -> None:
    x = ChunkExpander()
    run(x, tool("t1", "f", "{"))
    with pytest.raises(ChunkError) as info:
        x.expand(tool("t2", delta="{"))
    assert info.value.rule == "chunk_missing_tool_name"
    assert x.open_streams == {None: ("tool", "t1")}
    assert run(x, tool(delta="}")) == [{"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": "}"}]


# -- closing events ------------------------------------------------------------


@pytest.mark.parametrize("event_type", sorted(OWN_LANE_CLOSERS))
def test_own_lane_event_ends_the_pending_stream_of_its_lane(event_type: str) -> None:
    event = OWN_LANE_CLOSERS[event_type]
    x = ChunkExpander()
    run(x, text("m1", "a"))
    run(x, reasoning("r1", "b", subagentRunId="sa"))
    out = run(x, event)
    assert out == [{"type": "TEXT_MESSAGE_END", "messageId": "m1"}, event]
    assert out[-1] is event
    assert x.open_streams == {"sa": ("reasoning", "r1")}

    tagged = with_lane(event, "sa")
    out = run(x, tagged)
    assert out == [
        {"type": "REASONING_MESSAGE_END", "messageId": "r1", "subagentRunId": "sa"},
        tagged,
    ]
    assert out[-1] is tagged
    assert x.open_streams == {}


@pytest.mark.parametrize("event_type", sorted(OWN_LANE_CLOSERS))
def test_own_lane_event_of_another_lane_leaves_the_stream_open(event_type: str) -> None:
    x = ChunkExpander()
    run(x, tool("t1", "f", "{", subagentRunId="sa"))
    event = with_lane(OWN_LANE_CLOSERS[event_type], "sb")
    out = run(x, event)
    assert out == [event] and out[0] is event
    event = OWN_LANE_CLOSERS[event_type]  # the parent lane
    assert run(x, event) == [event]
    assert x.open_streams == {"sa": ("tool", "t1")}


@pytest.mark.parametrize("event_type", sorted(ALL_LANE_CLOSERS))
def test_run_level_event_ends_every_lane_in_opening_order(event_type: str) -> None:
    event = ALL_LANE_CLOSERS[event_type]
    x = ChunkExpander()
    run(x, tool("t1", "f", "{", subagentRunId="sb"))
    run(x, text("m1", "a"))
    run(x, reasoning("r1", "b", subagentRunId="sa"))
    out = run(x, event)
    assert out == [
        {"type": "TOOL_CALL_END", "toolCallId": "t1", "subagentRunId": "sb"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "REASONING_MESSAGE_END", "messageId": "r1", "subagentRunId": "sa"},
        event,
    ]
    assert out[-1] is event
    assert x.open_streams == {}


@pytest.mark.parametrize("event_type", sorted(NON_CLOSERS))
def test_other_events_leave_pending_streams_open(event_type: str) -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    run(x, text("m2", "b", subagentRunId="sa"))
    for event in (NON_CLOSERS[event_type], with_lane(NON_CLOSERS[event_type], "sa")):
        out = run(x, event)
        assert out == [event] and out[0] is event
    assert x.open_streams == {None: ("text", "m1"), "sa": ("text", "m2")}


@pytest.mark.parametrize("event_type", ["SUBAGENT_FINISHED", "SUBAGENT_ERROR"])
def test_subagent_terminal_ends_only_its_own_lane(event_type: str) -> None:
    event: Event = {"type": event_type, "subagentRunId": "sa"}
    if event_type == "SUBAGENT_ERROR":
        event["message"] = "failed"
    x = ChunkExpander()
    run(x, text("m1", "a"))
    run(x, tool("t1", "f", subagentRunId="sa"))
    run(x, tool("t2", "f", subagentRunId="sb"))
    out = run(x, event)
    assert out == [{"type": "TOOL_CALL_END", "toolCallId": "t1", "subagentRunId": "sa"}, event]
    assert out[-1] is event
    assert x.open_streams == {None: ("text", "m1"), "sb": ("tool", "t2")}


def test_non_chunk_event_with_nothing_pending_is_returned_as_is() -> None:
    x = ChunkExpander()
    for event in [RUN_STARTED, *OWN_LANE_CLOSERS.values(), *NON_CLOSERS.values(), RUN_FINISHED]:
        out = x.expand(event)
        assert out == [event]
        assert out[0] is event


def test_unknown_event_type_passes_through_and_ends_nothing() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    event = {"type": "FUTURE_EVENT", "x": 1}
    assert x.expand(event)[0] is event
    assert x.open_streams == {None: ("text", "m1")}


# -- flush -----------------------------------------------------------------------


def test_flush_ends_every_lane_once() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    run(x, tool("t1", "f", subagentRunId="sa"))
    assert canonical(x.flush()) == [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "TOOL_CALL_END", "toolCallId": "t1", "subagentRunId": "sa"},
    ]
    assert x.open_streams == {}
    assert x.flush() == []
    # After a flush an id-less chunk has nothing to continue.
    with pytest.raises(ChunkError, match="chunk_missing_id"):
        x.expand(text(delta="b"))


def test_expand_chunks_flushes_unless_told_not_to() -> None:
    stream = [RUN_STARTED, text("m1", "a"), text(delta="b")]
    expanded = canonical(expand_chunks(stream))
    assert types_of(expanded) == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
    ]
    assert expanded[0] is RUN_STARTED
    assert types_of(expand_chunks(stream, flush=False))[-1] == "TEXT_MESSAGE_CONTENT"
    assert expand_chunks([]) == []


# -- subagent lanes --------------------------------------------------------------


def test_two_subagent_lanes_interleaved() -> None:
    x = ChunkExpander()
    stream = [
        text("a1", "A", subagentRunId="sa"),
        text("b1", "B", subagentRunId="sb"),
        text(delta="a", subagentRunId="sa"),  # continuation by tag
        text("b1", "b"),  # continuation by id, untagged
        text(delta="!", subagentRunId="sb"),
        text("p1", "parent"),  # the parent lane is a third, independent lane
    ]
    out: list[Event] = []
    for chunk in stream:
        out.extend(run(x, chunk))
    assert out == [
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "a1",
            "role": "assistant",
            "subagentRunId": "sa",
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "A", "subagentRunId": "sa"},
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "b1",
            "role": "assistant",
            "subagentRunId": "sb",
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b1", "delta": "B", "subagentRunId": "sb"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "a", "subagentRunId": "sa"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b1", "delta": "b", "subagentRunId": "sb"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b1", "delta": "!", "subagentRunId": "sb"},
        {"type": "TEXT_MESSAGE_START", "messageId": "p1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "p1", "delta": "parent"},
    ]
    assert x.open_streams == {"sa": ("text", "a1"), "sb": ("text", "b1"), None: ("text", "p1")}
    # A new id in lane sa ends only sa's stream.
    assert types_of(run(x, text("a2", "x", subagentRunId="sa"))) == [
        "TEXT_MESSAGE_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
    ]
    assert set(x.open_streams) == {"sa", "sb", None}


def test_untagged_idless_chunk_prefers_the_parent_lane() -> None:
    x = ChunkExpander()
    run(x, text("a1", "A", subagentRunId="sa"))
    run(x, text("p1", "P"))
    assert run(x, text(delta="p")) == [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "p1", "delta": "p"}
    ]


def test_untagged_idless_chunk_continues_the_sole_open_stream_of_its_kind() -> None:
    x = ChunkExpander()
    run(x, text("p1", "P"))  # the parent has a stream of another kind open
    run(x, tool("t1", "f", subagentRunId="sa"))
    assert run(x, tool(delta="{}")) == [
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": "{}", "subagentRunId": "sa"}
    ]
    assert x.open_streams == {None: ("text", "p1"), "sa": ("tool", "t1")}


def test_untagged_idless_chunk_with_two_candidate_lanes_is_ambiguous() -> None:
    x = ChunkExpander()
    run(x, tool("t1", "f", subagentRunId="sa"))
    run(x, tool("t2", "g", subagentRunId="sb"))
    before = x.open_streams
    with pytest.raises(ChunkError) as info:
        x.expand(tool(delta="{}"))
    assert info.value.rule == "chunk_ambiguous_lane"
    assert "'sa'" in str(info.value) and "'sb'" in str(info.value)
    assert x.open_streams == before


def test_chunk_tag_contradicting_the_lane_of_its_id_is_rejected() -> None:
    x = ChunkExpander()
    run(x, text("a1", "A", subagentRunId="sa"))
    run(x, text("p1", "P"))
    before = x.open_streams
    with pytest.raises(ChunkError) as info:
        x.expand(text("a1", "x", subagentRunId="sb"))
    assert info.value.rule == "chunk_lane_mismatch"
    assert x.open_streams == before
    with pytest.raises(ChunkError) as info:
        x.expand(text("p1", "x", subagentRunId="sa"))
    assert info.value.rule == "chunk_lane_mismatch"
    assert x.open_streams == before


def test_tagged_idless_chunk_for_a_lane_without_stream_is_missing_its_id() -> None:
    x = ChunkExpander()
    run(x, text("p1", "P"))
    with pytest.raises(ChunkError) as info:
        x.expand(text(delta="x", subagentRunId="sa"))
    assert info.value.rule == "chunk_missing_id"
    assert "subagent 'sa'" in str(info.value)
    assert x.open_streams == {None: ("text", "p1")}


# -- tool calls and reasoning ----------------------------------------------------


def test_tool_chunks_with_parent_message_id() -> None:
    x = ChunkExpander()
    out = run(x, tool("t1", "search", '{"q":', parentMessageId="m1", subagentRunId="sa"))
    assert out == [
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "t1",
            "toolCallName": "search",
            "parentMessageId": "m1",
            "subagentRunId": "sa",
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": '{"q":', "subagentRunId": "sa"},
    ]
    assert run(x, tool(delta='"x"}', subagentRunId="sa")) == [
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": '"x"}', "subagentRunId": "sa"}
    ]
    assert canonical(x.flush()) == [
        {"type": "TOOL_CALL_END", "toolCallId": "t1", "subagentRunId": "sa"}
    ]


def test_tool_chunk_without_parent_message_id_omits_it() -> None:
    out = run(ChunkExpander(), tool("t1", "f"))
    assert out == [{"type": "TOOL_CALL_START", "toolCallId": "t1", "toolCallName": "f"}]


def test_reasoning_chunks() -> None:
    x = ChunkExpander()
    assert run(x, reasoning("r1", "Let me")) == [
        {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": "Let me"},
    ]
    assert run(x, reasoning(delta=" think")) == [
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "r1", "delta": " think"}
    ]
    assert run(x, {"type": "REASONING_END", "messageId": "span"}) == [
        {"type": "REASONING_MESSAGE_END", "messageId": "r1"},
        {"type": "REASONING_END", "messageId": "span"},
    ]


def test_same_id_of_another_kind_is_a_new_stream() -> None:
    x = ChunkExpander()
    run(x, reasoning("m1", "r"))
    assert types_of(run(x, text("m1", "t"))) == [
        "REASONING_MESSAGE_END",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
    ]


# -- what rides on the synthesized events ---------------------------------------


def test_metadata_and_timestamp_ride_on_start_and_content_raw_event_on_content() -> None:
    x = ChunkExpander()
    chunk = text("m1", "a", timestamp=1700, metadata={"k": 1}, rawEvent={"p": True})
    assert run(x, chunk) == [
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "m1",
            "role": "assistant",
            "timestamp": 1700,
            "metadata": {"k": 1},
        },
        {
            "type": "TEXT_MESSAGE_CONTENT",
            "messageId": "m1",
            "delta": "a",
            "timestamp": 1700,
            "metadata": {"k": 1},
            "rawEvent": {"p": True},
        },
    ]
    # The END of a stream carries nothing of the chunk or event that ended it.
    out = run(x, text("m2", "b", timestamp=1800, metadata={"k": 2}))
    assert out[0] == {"type": "TEXT_MESSAGE_END", "messageId": "m1"}


def test_metadata_only_continuation_emits_an_empty_content_event() -> None:
    x = ChunkExpander()
    run(x, tool("t1", "f", "{}"))
    assert run(x, tool(metadata={"finish": "stop"})) == [
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": "", "metadata": {"finish": "stop"}}
    ]


def test_raw_event_only_chunk_emits_an_empty_content_event() -> None:
    x = ChunkExpander()
    assert run(x, reasoning("r1", rawEvent={"provider": 1})) == [
        {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"},
        {
            "type": "REASONING_MESSAGE_CONTENT",
            "messageId": "r1",
            "delta": "",
            "rawEvent": {"provider": 1},
        },
    ]


def test_unknown_fields_ride_on_content_or_on_the_start() -> None:
    x = ChunkExpander()
    out = run(x, text("m1", "a", futureField=[1]))
    assert out[0] == {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"}
    assert out[1]["futureField"] == [1]
    # An opening chunk without content: the START carries them.
    out = run(x, text("m2", futureField=2))
    assert out[1] == {
        "type": "TEXT_MESSAGE_START",
        "messageId": "m2",
        "role": "assistant",
        "futureField": 2,
    }
    # A continuation with only unknown fields still delivers them.
    assert run(x, text(futureField=3)) == [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "", "futureField": 3}
    ]
    # An unknown field never overrides what the START itself says.
    out = run(x, reasoning("r1", role="wizard"))
    assert out[-1] == {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"}


# -- input forms -----------------------------------------------------------------


def test_accepts_pydantic_models_and_other_mappings() -> None:
    x = ChunkExpander()
    out = run(x, TextMessageChunkEvent(message_id="m1", delta="a"))
    assert types_of(out) == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT"]
    out = run(x, ToolCallChunkEvent(tool_call_id="t1", tool_call_name="f", delta="{"))
    assert types_of(out) == ["TEXT_MESSAGE_END", "TOOL_CALL_START", "TOOL_CALL_ARGS"]
    out = run(x, types.MappingProxyType({"type": "TOOL_CALL_CHUNK", "delta": "}"}))
    assert out == [{"type": "TOOL_CALL_ARGS", "toolCallId": "t1", "delta": "}"}]


def test_accepts_official_sdk_models() -> None:
    core = pytest.importorskip("ag_ui.core")
    x = ChunkExpander()
    out = run(x, core.TextMessageChunkEvent(message_id="m1", delta="hi"))
    assert out == [
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "hi"},
    ]
    out = run(x, core.RunErrorEvent(message="x"))
    assert out == [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "RUN_ERROR", "message": "x"},
    ]


def test_errors_leave_the_state_unchanged_across_a_mixed_stream() -> None:
    x = ChunkExpander()
    run(x, text("m1", "a"))
    run(x, tool("t1", "f", subagentRunId="sa"))
    run(x, tool("t2", "g", subagentRunId="sb"))
    before = x.open_streams
    bad = [
        text(delta="x", subagentRunId="sc"),  # nothing open in sc
        tool(delta="{}"),  # ambiguous between sa and sb
        tool("t1", delta="{}", subagentRunId="sb"),  # t1 lives in sa
        tool("t3", delta="{}", subagentRunId="sa"),  # no toolCallName
        text(delta="x", role="user"),  # m1 is an assistant message
        reasoning(delta="x"),  # no reasoning message open
    ]
    for chunk in bad:
        with pytest.raises(ChunkError):
            x.expand(chunk)
        assert x.open_streams == before
    assert canonical(x.flush()) == [
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "TOOL_CALL_END", "toolCallId": "t1", "subagentRunId": "sa"},
        {"type": "TOOL_CALL_END", "toolCallId": "t2", "subagentRunId": "sb"},
    ]


# -- property: random well-formed chunk streams ------------------------------------

LANES: list[str | None] = [None, "sa", "sb"]
CHUNK_TYPES = {
    "text": "TEXT_MESSAGE_CHUNK",
    "tool": "TOOL_CALL_CHUNK",
    "reasoning": "REASONING_MESSAGE_CHUNK",
}
STARTS = {"TEXT_MESSAGE_START", "TOOL_CALL_START", "REASONING_MESSAGE_START"}
ENDS = {"TEXT_MESSAGE_END", "TOOL_CALL_END", "REASONING_MESSAGE_END"}
CONTENTS = {"TEXT_MESSAGE_CONTENT", "TOOL_CALL_ARGS", "REASONING_MESSAGE_CONTENT"}
DELTAS = st.none() | st.text(max_size=4)


@dataclass
class Drawn:
    events: list[Event]
    stops: bool  # the stream stops mid-run: only the flush ends its open streams
    deltas: dict[str, str]  # id -> every delta sent for it, joined
    opened: list[str]  # every id opened, in order


@st.composite
def chunk_streams(draw: st.DrawFn) -> Drawn:
    """One run of chunk streams interleaved over three lanes, with events that end them."""
    events: list[Event] = [RUN_STARTED]
    events += [{"type": "SUBAGENT_STARTED", "subagentRunId": s, "name": "h"} for s in ("sa", "sb")]
    open_: dict[str | None, tuple[str, str]] = {}  # lane -> (kind, id)
    messages: dict[str | None, list[str]] = {lane: [] for lane in LANES}
    finished: set[str | None] = set()
    deltas: dict[str, str] = {}
    opened: list[str] = []
    for n in range(draw(st.integers(0, 25))):
        lane = draw(st.sampled_from([lane for lane in LANES if lane not in finished]))
        action = draw(st.sampled_from(["chunk", "chunk", "chunk", "close", "raw"]))
        if action == "chunk" and lane in open_ and draw(st.booleans()):
            kind, eid = open_[lane]
            chunk: Event = {"type": CHUNK_TYPES[kind]}
            # The parent may leave out its id; a subagent names its id, its lane or both.
            how = draw(st.sampled_from(["id", "tag", "both"] if lane else ["id", "none"]))
            if how in ("id", "both"):
                chunk["toolCallId" if kind == "tool" else "messageId"] = eid
            if how in ("tag", "both"):
                chunk["subagentRunId"] = lane
        elif action == "chunk":
            kind = draw(st.sampled_from(sorted(CHUNK_TYPES)))
            eid = f"{kind}-{n}"
            if kind == "tool":
                chunk = {"type": CHUNK_TYPES[kind], "toolCallId": eid, "toolCallName": "f"}
                in_message: bool = draw(st.booleans())
                if messages[lane] and in_message:
                    chunk["parentMessageId"] = draw(st.sampled_from(messages[lane]))
            else:
                chunk = {"type": CHUNK_TYPES[kind], "messageId": eid}
                if kind == "text":
                    messages[lane].append(eid)
                    role = draw(st.sampled_from([None, "assistant", "user"]))
                    if role is not None:
                        chunk["role"] = role
            if lane is not None:
                chunk["subagentRunId"] = lane
            open_[lane] = (kind, eid)
            opened.append(eid)
        elif action == "close":
            if lane is None:
                events.append({"type": "STEP_STARTED", "stepName": f"s{n}"})
                events.append({"type": "STEP_FINISHED", "stepName": f"s{n}"})
            else:
                events.append({"type": "SUBAGENT_FINISHED", "subagentRunId": lane})
                finished.add(lane)
            open_.pop(lane, None)
            continue
        else:
            events.append(with_lane({"type": "RAW", "event": n}, lane))
            continue
        delta = draw(DELTAS)
        if delta is not None:
            chunk["delta"] = delta
            deltas[eid] = deltas.get(eid, "") + delta
        events.append(chunk)
    stops = draw(st.booleans())
    if not stops:
        for sub in ("sa", "sb"):
            if sub not in finished:
                events.append({"type": "SUBAGENT_FINISHED", "subagentRunId": sub})
        events.append(draw(st.sampled_from([RUN_FINISHED, ALL_LANE_CLOSERS["RUN_ERROR"]])))
    return Drawn([validate_wire(e) for e in events], stops, deltas, opened)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk_streams())
def test_random_chunk_streams_expand_to_a_sequence_the_verifier_accepts(drawn: Drawn) -> None:
    expanded = canonical(expand_chunks(drawn.events))

    verifier = SequenceVerifier(thread="th")
    for event in expanded:
        verifier.verify(event)
    assert verifier.run_active == drawn.stops

    # No chunk is left; every other event comes through as the same object, in order.
    assert not any(e["type"] in chunks.CHUNK_EVENT_TYPES for e in expanded)
    originals = {id(e) for e in drawn.events}
    assert [e for e in expanded if id(e) in originals] == [
        e for e in drawn.events if e["type"] not in chunks.CHUNK_EVENT_TYPES
    ]
    # Each stream opens once and ends once, and its deltas arrive intact.
    assert [entity_id(e) for e in expanded if e["type"] in STARTS] == drawn.opened
    assert sorted(entity_id(e) for e in expanded if e["type"] in ENDS) == sorted(drawn.opened)
    # Each event that ends streams finds them ended before it.
    open_ids: dict[str | None, set[str]] = {}
    for e in expanded:
        lane = e.get("subagentRunId")
        if e["type"] in STARTS:
            open_ids.setdefault(lane, set()).add(entity_id(e))
        elif e["type"] in ENDS:
            open_ids[lane].discard(entity_id(e))
        elif id(e) not in originals:
            continue
        elif e["type"] in ALL_LANE_CLOSERS:
            assert not any(open_ids.values()), e
        elif e["type"] in OWN_LANE_CLOSERS or e["type"] == "SUBAGENT_FINISHED":
            assert not open_ids.get(lane), e
    assert not any(open_ids.values())
    joined: dict[str, str] = {}
    for e in expanded:
        if e["type"] in CONTENTS:
            eid = entity_id(e)
            joined[eid] = joined.get(eid, "") + e["delta"]
    assert joined == drawn.deltas


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": ["m1"], "delta": "x"},
        {"type": "TOOL_CALL_CHUNK", "toolCallId": {"id": 1}, "toolCallName": "f"},
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": 7, "delta": "x"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "subagentRunId": ["s"]},
    ],
)
def test_an_id_that_is_not_a_string_is_refused_and_leaves_no_stream(chunk: Event) -> None:
    """Such a chunk can only come from an entry stored without validation; kept as a
    lane or stream id it broke every later snapshot of the thread."""
    x = ChunkExpander(thread="th-1")
    with pytest.raises(ChunkError) as info:
        x.expand(chunk)
    assert info.value.rule == "chunk_invalid_id"
    assert x.open_streams == {}
    state = ThreadState()
    state.apply({"type": "RUN_STARTED", "threadId": "th-1", "runId": "r1"})
    with pytest.raises(ChunkError):
        state.apply(chunk)
    assert "MESSAGES_SNAPSHOT" in [e["type"] for e in state.compact()]
