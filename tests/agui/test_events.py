"""Tests of :mod:`agui_hub.agui.events`: conformance with the official SDK, round trips, errors.

The conformance corpus (``tests/corpus/events.json``) holds realistic camelCase
wire examples of every AG-UI 1.0 event type. The official Python SDK
(``ag-ui-protocol``, a test-only dependency) is the reference: for every
example our models, our fast path and the official models must produce the
same wire dict, and that dict must be the example itself.
"""

from __future__ import annotations

import copy
import enum
import inspect
import json
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import ag_ui.core as official
import annotated_types
import pytest
from ag_ui._generated import models as official_models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

from agui_hub.agui import events
from agui_hub.agui.events import (
    FAST_PATH_TYPES,
    MAX_SAFE_INTEGER,
    EventType,
    parse_event,
    to_wire,
    validate_batch,
    validate_wire,
)
from agui_hub.errors import InvalidEvent, ProtocolError

CORPUS_PATH = Path(__file__).parents[1] / "corpus" / "events.json"
CORPUS: list[dict[str, Any]] = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))
CORPUS_IDS = [entry["name"] for entry in CORPUS]

OFFICIAL_EVENT = TypeAdapter(official.Event)


def official_wire(obj: Any) -> dict[str, Any]:
    """The wire dict the official SDK produces for *obj* (a mapping or an SDK model)."""
    model = obj if isinstance(obj, BaseModel) else OFFICIAL_EVENT.validate_python(obj)
    return model.model_dump(mode="json", by_alias=True)


def model_path(obj: Any) -> dict[str, Any]:
    """The slow, model-building path that :func:`validate_wire` must be equivalent to."""
    return to_wire(parse_event(obj))


def corpus_events(event_type: str) -> list[dict[str, Any]]:
    return [entry["event"] for entry in CORPUS if entry["event"]["type"] == event_type]


def nested_lists(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nested_dicts(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


# =============================================================================
# 1. Conformance with the official SDK, over the corpus
# =============================================================================


def test_corpus_is_well_formed_and_covers_every_event_type() -> None:
    assert len(CORPUS_IDS) == len(set(CORPUS_IDS)), "corpus names must be unique"
    for entry in CORPUS:
        assert set(entry) == {"name", "event"}
    covered = {entry["event"]["type"] for entry in CORPUS}
    assert covered == {member.value for member in EventType}
    assert len(EventType) == 31


def test_corpus_covers_the_complex_shapes() -> None:
    def walk(value: Any) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        if isinstance(value, dict):
            found.append(value)
            for item in value.values():
                found.extend(walk(item))
        elif isinstance(value, list):
            for item in value:
                found.extend(walk(item))
        return found

    snapshot_roles = {
        message["role"]
        for event in corpus_events("MESSAGES_SNAPSHOT")
        for message in event["messages"]
    }
    assert snapshot_roles == {
        "developer",
        "system",
        "assistant",
        "user",
        "tool",
        "activity",
        "reasoning",
    }
    ops = {op["op"] for event in corpus_events("STATE_DELTA") for op in event["delta"]}
    assert ops == {"add", "remove", "replace", "move", "copy", "test"}
    outcomes = {e["outcome"]["type"] for e in corpus_events("RUN_FINISHED") if "outcome" in e}
    assert outcomes == {"success", "interrupt", "cancelled"}
    sub_outcomes = {
        e["outcome"]["type"] for e in corpus_events("SUBAGENT_FINISHED") if "outcome" in e
    }
    assert sub_outcomes == {"success", "suspended"}
    subtypes = {e["subtype"] for e in corpus_events("REASONING_ENCRYPTED_VALUE")}
    assert subtypes == {"message", "tool-call"}
    result_parts = [
        part
        for event in corpus_events("TOOL_CALL_RESULT")
        if isinstance(event["content"], list)
        for part in event["content"]
    ]
    assert {p["source"]["type"] for p in result_parts if p["type"] == "image"} == {
        "data",
        "url",
        "file",
    }
    assert any(isinstance(e["content"], str) for e in corpus_events("TOOL_CALL_RESULT"))
    full_inputs = [e["input"] for e in corpus_events("RUN_STARTED") if "input" in e]
    assert any(
        {"tools", "context", "forwardedProps", "resume", "parentRunId"} <= set(run_input)
        and {m["role"] for m in run_input["messages"]} >= {"developer", "tool", "reasoning"}
        for run_input in full_inputs
    )
    everything = [d for entry in CORPUS for d in walk(entry["event"])]
    for common in ("timestamp", "metadata", "rawEvent", "subagentRunId"):
        assert any(common in entry["event"] for entry in CORPUS), common
    assert any(d.get("encryptedValue") for d in everything if d.get("role") == "reasoning")
    assert any("error" in d for d in everything if d.get("role") == "tool")


@pytest.mark.parametrize("example", [entry["event"] for entry in CORPUS], ids=CORPUS_IDS)
def test_corpus_example_matches_the_official_sdk(example: dict[str, Any]) -> None:
    original = copy.deepcopy(example)
    ours = parse_event(example)
    theirs = OFFICIAL_EVENT.validate_python(example)

    assert isinstance(ours, events.MODEL_BY_TYPE[example["type"]])
    assert type(ours).__name__ == type(theirs).__name__
    ours_wire = to_wire(ours)
    assert ours_wire == theirs.model_dump(mode="json", by_alias=True) == original
    # The wire dict is plain JSON, and parsing did not touch the input.
    assert json.loads(json.dumps(ours_wire, allow_nan=False)) == original
    assert example == original


# =============================================================================
# 2. The fast path and the model path agree
# =============================================================================


@pytest.mark.parametrize("example", [entry["event"] for entry in CORPUS], ids=CORPUS_IDS)
def test_validate_wire_agrees_with_the_model_path(example: dict[str, Any]) -> None:
    original = copy.deepcopy(example)
    wire = validate_wire(example)
    assert wire == model_path(example) == original
    assert example == original


def test_fast_path_serves_the_hot_events() -> None:
    hot = {
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TEXT_MESSAGE_CHUNK",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_CHUNK",
        "REASONING_MESSAGE_CONTENT",
        "STEP_STARTED",
        "STEP_FINISHED",
        "CUSTOM",
        "RAW",
    }
    assert hot <= FAST_PATH_TYPES
    # Nested models (messages, patches, outcomes, content parts) need the model path.
    assert not {"MESSAGES_SNAPSHOT", "STATE_DELTA", "RUN_STARTED", "RUN_FINISHED"} & (
        FAST_PATH_TYPES
    )


@pytest.mark.parametrize(
    "type_value", [EventType.TEXT_MESSAGE_END, official.EventType.TEXT_MESSAGE_END]
)
def test_enum_type_values_give_a_plain_string_on_the_wire(type_value: str) -> None:
    event = {"type": type_value, "messageId": "m1"}
    for wire in (validate_wire(event), model_path(event)):
        assert wire == {"type": "TEXT_MESSAGE_END", "messageId": "m1"}
        assert type(wire["type"]) is str


# =============================================================================
# 3. Objects built with the official SDK
# =============================================================================


def official_objects() -> list[BaseModel]:
    run_input = official.RunAgentInput(
        thread_id="t1",
        run_id="r2",
        parent_run_id="r1",
        state={"count": 1},
        messages=[
            official.DeveloperMessage(id="d1", content="Be brief."),
            official.SystemMessage(id="s1", content="You are terse."),
            official.UserMessage(id="u1", content="hi", name="alice"),
            official.UserMessage(
                id="u2",
                content=[
                    official.TextPart(text="look"),
                    official.ImagePart(source=official.UrlSource(value="https://x/y.png")),
                ],
            ),
            official.AssistantMessage(
                id="a1",
                tool_calls=[
                    official.ToolCall(
                        id="c1",
                        function=official.FunctionCall(name="lookup", arguments="{}"),
                    )
                ],
            ),
            official.ToolMessage(id="tm1", tool_call_id="c1", content="42", error="partial"),
            official.ActivityMessage(id="act1", activity_type="PLAN", content={"steps": []}),
            official.ReasoningMessage(id="re1", content="hmm", encrypted_value="enc"),
        ],
        tools=[official.Tool(name="lookup", description="Look up", parameters={"type": "object"})],
        context=[official.Context(description="tz", value="UTC")],
        forwarded_props={"model": "m"},
        resume=[official.ResumeEntry(interrupt_id="i1", status="resolved", payload=None)],
    )
    return [
        official.TextMessageStartEvent(message_id="m1"),
        official.TextMessageStartEvent(message_id="m1", role="user", timestamp=1700000000000),
        official.TextMessageContentEvent(
            message_id="m1", delta="hi", subagent_run_id="sr1", metadata={"k": None}
        ),
        official.ToolCallStartEvent(
            tool_call_id="c1", tool_call_name="lookup", parent_message_id="m1"
        ),
        official.ToolCallChunkEvent(delta="{}"),
        official.ReasoningMessageStartEvent(message_id="r1"),
        official.CustomEvent(name="ping", value=None),
        official.RawEvent(event={"x": 1}, raw_event=[1, 2]),
        official.RunStartedEvent(thread_id="t1", run_id="r2", parent_run_id="r1", input=run_input),
        official.RunFinishedEvent(
            thread_id="t1",
            run_id="r2",
            outcome=official.RunFinishedInterruptOutcome(
                interrupts=[official.Interrupt(id="i1", reason="confirm", tool_call_id="c1")]
            ),
            usage=[official.TokenUsage(provider="openai", input_tokens=3, output_tokens=4)],
        ),
        official.RunErrorEvent(message="boom", code="E1"),
        official.StateDeltaEvent(
            delta=[
                official_models.AddOperation(path="/a", value=1),
                official_models.MoveOperation(from_="/a", path="/b"),
                official_models.CopyOperation(from_="/b", path="/c"),
                official_models.TestOperation(path="/c", value=1),
                official_models.ReplaceOperation(path="/c", value=None),
                official_models.RemoveOperation(path="/b"),
            ]
        ),
        official.StateDeltaEvent(delta=[{"op": "add", "path": "/x", "value": [1]}]),
        official.ToolCallResultEvent(
            message_id="m2",
            tool_call_id="c1",
            content=[
                official.ImagePart(source=official.DataSource(value="AAAA", mime_type="image/png")),
                official.DocumentPart(source=official.FileSource(value="f1", provider="openai")),
            ],
        ),
        official.MessagesSnapshotEvent(messages=list(run_input.messages)),
        official.ActivitySnapshotEvent(
            message_id="act1", activity_type="PLAN", content={"a": 1}, replace=False
        ),
        official.ReasoningEncryptedValueEvent(
            subtype="tool-call", entity_id="c1", encrypted_value="xyz"
        ),
        official.SubagentStartedEvent(
            subagent_run_id="sr1", name="helper", parent_tool_call_id="c1"
        ),
        official.SubagentFinishedEvent(
            subagent_run_id="sr1",
            outcome=official.SubagentFinishedSuspendedOutcome(interrupt_ids=["i1"]),
        ),
        official.TextMessageEndEvent(message_id="m1", vendorField="kept"),
    ]


@pytest.mark.parametrize("obj", official_objects(), ids=lambda obj: type(obj).__name__)
def test_official_sdk_objects_are_accepted_as_they_are(obj: BaseModel) -> None:
    expected = obj.model_dump(mode="json", by_alias=True)
    ours = parse_event(obj)
    assert isinstance(ours, events.BaseEvent)
    assert type(ours).__name__ == type(obj).__name__
    assert to_wire(ours) == expected
    assert validate_wire(obj) == expected


def test_official_sdk_objects_give_camel_case_wire_dicts() -> None:
    started = official.RunStartedEvent(
        thread_id="t1",
        run_id="r1",
        parent_run_id="r0",
        input=official.RunAgentInput(thread_id="t1", run_id="r1", messages=[]),
    )
    assert validate_wire(started) == {
        "type": "RUN_STARTED",
        "threadId": "t1",
        "runId": "r1",
        "parentRunId": "r0",
        "input": {"threadId": "t1", "runId": "r1", "messages": []},
    }
    start = parse_event(official.TextMessageStartEvent(message_id="m1"))
    assert isinstance(start, events.TextMessageStartEvent)
    assert start.message_id == "m1"
    assert start.effective_role == "assistant"


def test_our_own_models_pass_through() -> None:
    event = parse_event({"type": "STEP_STARTED", "stepName": "plan"})
    assert parse_event(event) is event
    assert validate_wire(event) == {"type": "STEP_STARTED", "stepName": "plan"}


# =============================================================================
# 4. Unknown fields, nulls, snake_case, defaults
# =============================================================================

UNKNOWN_FIELD_EVENTS: list[dict[str, Any]] = [
    # top level, fast path
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x", "vendor": {"a": [1]}},
    # top level, model path
    {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "billing": {"usd": 0.01}},
    # inside a message, a content part, a source, a tool call and its function
    {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [
            {
                "id": "u",
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "url", "value": "https://i", "w": 1},
                        "detail": "low",
                    }
                ],
                "clientId": "c-1",
            },
            {
                "id": "a",
                "role": "assistant",
                "toolCalls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}", "strict": True},
                        "index": 0,
                    }
                ],
                "citations": [{"url": "https://e"}],
            },
        ],
    },
    # inside a patch operation, an outcome, an interrupt, a usage entry
    {
        "type": "RUN_FINISHED",
        "threadId": "t",
        "runId": "r",
        "outcome": {
            "type": "interrupt",
            "interrupts": [{"id": "i", "reason": "r", "ui": "modal"}],
            "resumeUrl": "https://r",
        },
        "usage": [{"inputTokens": 1, "costUsd": 0.5}],
    },
    {"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/a", "why": "stale"}]},
    # inside the run input
    {
        "type": "RUN_STARTED",
        "threadId": "t",
        "runId": "r",
        "input": {
            "threadId": "t",
            "runId": "r",
            "messages": [],
            "tools": [{"name": "n", "description": "d", "strict": False}],
            "clientVersion": "2.1",
        },
    },
]


@pytest.mark.parametrize("event", UNKNOWN_FIELD_EVENTS)
def test_unknown_fields_survive_a_round_trip(event: dict[str, Any]) -> None:
    assert model_path(event) == event
    assert validate_wire(event) == event
    assert official_wire(event) == event


def test_unknown_fields_are_reachable_on_the_model() -> None:
    event = parse_event(UNKNOWN_FIELD_EVENTS[2])
    assert isinstance(event, events.MessagesSnapshotEvent)
    user = event.messages[0]
    assert user.model_extra == {"clientId": "c-1"}
    assistant = event.messages[1]
    assert isinstance(assistant, events.AssistantMessage)
    assert assistant.tool_calls is not None
    assert assistant.tool_calls[0].function.model_extra == {"strict": True}


NULL_OPTIONAL_EVENTS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "m",
            "role": None,
            "name": None,
            "timestamp": None,
            "rawEvent": None,
            "metadata": None,
            "subagentRunId": None,
        },
        {"type": "TEXT_MESSAGE_START", "messageId": "m"},
    ),
    (
        {"type": "TOOL_CALL_CHUNK", "toolCallId": None, "delta": None, "parentMessageId": None},
        {"type": "TOOL_CALL_CHUNK"},
    ),
    (
        {
            "type": "RUN_FINISHED",
            "threadId": "t",
            "runId": "r",
            "result": None,
            "outcome": None,
            "usage": None,
        },
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ),
    (
        {
            "type": "MESSAGES_SNAPSHOT",
            "messages": [
                {"id": "a", "role": "assistant", "content": None, "toolCalls": None, "name": None},
                {"id": "t", "role": "tool", "toolCallId": "c", "content": "x", "error": None},
            ],
        },
        {
            "type": "MESSAGES_SNAPSHOT",
            "messages": [
                {"id": "a", "role": "assistant"},
                {"id": "t", "role": "tool", "toolCallId": "c", "content": "x"},
            ],
        },
    ),
    (
        {
            "type": "RUN_STARTED",
            "threadId": "t",
            "runId": "r",
            "parentRunId": None,
            "input": {"threadId": "t", "runId": "r", "messages": [], "state": None, "tools": None},
        },
        {
            "type": "RUN_STARTED",
            "threadId": "t",
            "runId": "r",
            "input": {"threadId": "t", "runId": "r", "messages": []},
        },
    ),
]


@pytest.mark.parametrize(("event", "expected"), NULL_OPTIONAL_EVENTS)
def test_null_optional_fields_are_omitted(event: dict[str, Any], expected: dict[str, Any]) -> None:
    assert model_path(event) == expected
    assert validate_wire(event) == expected
    assert official_wire(event) == expected


MEANINGFUL_NULL_EVENTS: list[dict[str, Any]] = [
    {"type": "CUSTOM", "name": "n", "value": None},
    {"type": "RAW", "event": None},
    {"type": "STATE_SNAPSHOT", "snapshot": None},
    {"type": "TEXT_MESSAGE_END", "messageId": "m", "metadata": {"k": None}},
    {"type": "TEXT_MESSAGE_END", "messageId": "m", "futureField": None},
    {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": None}]},
    {"type": "STATE_DELTA", "delta": [{"op": "test", "path": "/a", "value": None}]},
    {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "futureField": None},
    {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [{"id": "u", "role": "user", "content": "x", "metadata": {"n": None}}],
    },
    {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [{"id": "u", "role": "user", "content": "x", "annotations": None}],
    },
]


@pytest.mark.parametrize("event", MEANINGFUL_NULL_EVENTS)
def test_meaningful_nulls_are_kept(event: dict[str, Any]) -> None:
    assert model_path(event) == event
    assert validate_wire(event) == event
    assert official_wire(event) == event


SNAKE_CASE_EVENTS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    (
        {"type": "TEXT_MESSAGE_CONTENT", "message_id": "m", "delta": "x"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"},
    ),
    (
        {
            "type": "TOOL_CALL_START",
            "tool_call_id": "c",
            "tool_call_name": "f",
            "parent_message_id": "m",
            "subagent_run_id": "s",
            "raw_event": {"k": 1},
        },
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "c",
            "toolCallName": "f",
            "parentMessageId": "m",
            "subagentRunId": "s",
            "rawEvent": {"k": 1},
        },
    ),
    (
        {
            "type": "RUN_STARTED",
            "thread_id": "t",
            "run_id": "r",
            "parent_run_id": "p",
            "input": {
                "thread_id": "t",
                "run_id": "r",
                "messages": [
                    {"id": "x", "role": "tool", "tool_call_id": "c", "content": "ok"},
                    {"id": "y", "role": "activity", "activity_type": "PLAN", "content": {}},
                ],
                "forwarded_props": {"snake_inside_any": 1},
            },
        },
        {
            "type": "RUN_STARTED",
            "threadId": "t",
            "runId": "r",
            "parentRunId": "p",
            "input": {
                "threadId": "t",
                "runId": "r",
                "messages": [
                    {"id": "x", "role": "tool", "toolCallId": "c", "content": "ok"},
                    {"id": "y", "role": "activity", "activityType": "PLAN", "content": {}},
                ],
                "forwardedProps": {"snake_inside_any": 1},
            },
        },
    ),
    (
        {
            "type": "STATE_DELTA",
            "delta": [{"op": "move", "from_": "/a", "path": "/b"}],
        },
        {"type": "STATE_DELTA", "delta": [{"op": "move", "from": "/a", "path": "/b"}]},
    ),
    (
        {
            "type": "RUN_FINISHED",
            "thread_id": "t",
            "run_id": "r",
            "usage": [{"input_tokens": 1, "cache_write_input_tokens": 2}],
            "outcome": {"type": "success", "pending_tool_call_ids": ["c"]},
        },
        {
            "type": "RUN_FINISHED",
            "threadId": "t",
            "runId": "r",
            "usage": [{"inputTokens": 1, "cacheWriteInputTokens": 2}],
            "outcome": {"type": "success", "pendingToolCallIds": ["c"]},
        },
    ),
]


@pytest.mark.parametrize(("event", "expected"), SNAKE_CASE_EVENTS)
def test_snake_case_keys_are_accepted(event: dict[str, Any], expected: dict[str, Any]) -> None:
    assert model_path(event) == expected
    assert validate_wire(event) == expected
    assert official_wire(event) == expected


def test_text_message_start_without_role_is_an_assistant_message() -> None:
    event = parse_event({"type": "TEXT_MESSAGE_START", "messageId": "m"})
    assert isinstance(event, events.TextMessageStartEvent)
    assert event.role is None
    assert event.effective_role == "assistant"
    assert "role" not in to_wire(event)
    assert "role" not in validate_wire({"type": "TEXT_MESSAGE_START", "messageId": "m"})


@pytest.mark.parametrize("role", ["developer", "system", "assistant", "user"])
def test_text_message_start_with_role_keeps_it(role: str) -> None:
    event = parse_event({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": role})
    assert isinstance(event, events.TextMessageStartEvent)
    assert event.effective_role == role
    assert to_wire(event)["role"] == role


def test_model_attributes_are_snake_case() -> None:
    event = parse_event(
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "c",
            "toolCallName": "f",
            "subagentRunId": "s",
            "timestamp": 5,
        }
    )
    assert isinstance(event, events.ToolCallStartEvent)
    assert (event.tool_call_id, event.tool_call_name, event.subagent_run_id) == ("c", "f", "s")
    assert event.timestamp == 5
    assert event.parent_message_id is None


# =============================================================================
# 5. Bad input
# =============================================================================

BAD_INPUTS: list[tuple[str, Any, list[str]]] = [
    ("string", "TEXT_MESSAGE_START", ["mapping", "str"]),
    ("int", 42, ["mapping", "int"]),
    ("none", None, ["mapping", "NoneType"]),
    ("list", [{"type": "TEXT_MESSAGE_END", "messageId": "m"}], ["mapping", "list"]),
    ("unknown type", {"type": "TEXT_MESSAGE_BEGIN", "messageId": "m"}, ["TEXT_MESSAGE_BEGIN"]),
    ("lower-case type", {"type": "text_message_end", "messageId": "m"}, ["text_message_end"]),
    ("removed 0.x type", {"type": "THINKING_START"}, ["unknown event type", "THINKING_START"]),
    ("null type", {"type": None, "messageId": "m"}, ["unknown event type"]),
    ("missing type", {"messageId": "m", "delta": "x"}, ["missing 'type'"]),
    (
        "missing field",
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m"},
        ["TEXT_MESSAGE_CONTENT", "delta", "Field required"],
    ),
    (
        "missing camelCase field",
        {"type": "TOOL_CALL_START", "toolCallId": "c"},
        ["toolCallName", "Field required"],
    ),
    (
        "missing field, model path",
        {"type": "RUN_STARTED", "threadId": "t"},
        ["RUN_STARTED", "runId", "Field required"],
    ),
    (
        "mistyped field",
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": 5},
        ["delta", "valid string"],
    ),
    (
        "mistyped metadata",
        {"type": "TEXT_MESSAGE_END", "messageId": "m", "metadata": ["not", "a", "dict"]},
        ["metadata", "dictionary"],
    ),
    (
        "bad role",
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "tool"},
        ["role", "'assistant'"],
    ),
    (
        "bad replace flag",
        {
            "type": "ACTIVITY_SNAPSHOT",
            "messageId": "m",
            "activityType": "PLAN",
            "content": {},
            "replace": "maybe",
        },
        ["replace", "boolean"],
    ),
    (
        "bad encrypted value subtype",
        {"type": "REASONING_ENCRYPTED_VALUE", "subtype": "thought", "entityId": "e"},
        ["subtype", "encryptedValue"],
    ),
    (
        "pointer without leading slash",
        {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "a/b", "value": 1}]},
        ["delta.0", "path", "pattern"],
    ),
    (
        "pointer with a bad escape in from",
        {"type": "STATE_DELTA", "delta": [{"op": "move", "from": "/a~2", "path": "/b"}]},
        ["delta.0", "from", "pattern"],
    ),
    (
        "bad pointer in activity patch",
        {
            "type": "ACTIVITY_DELTA",
            "messageId": "m",
            "activityType": "PLAN",
            "patch": [{"op": "replace", "path": "steps/0", "value": 1}],
        },
        ["patch.0", "path"],
    ),
    (
        "unknown patch op",
        {"type": "STATE_DELTA", "delta": [{"op": "frobnicate", "path": "/a"}]},
        ["delta.0", "frobnicate"],
    ),
    (
        "move without from",
        {"type": "STATE_DELTA", "delta": [{"op": "move", "path": "/a"}]},
        ["delta.0", "from", "Field required"],
    ),
    (
        "timestamp too large",
        {"type": "TEXT_MESSAGE_END", "messageId": "m", "timestamp": MAX_SAFE_INTEGER + 1},
        ["timestamp", str(MAX_SAFE_INTEGER)],
    ),
    (
        "timestamp too small, model path",
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r", "timestamp": -(2**53)},
        ["timestamp", str(MAX_SAFE_INTEGER)],
    ),
    (
        "fractional timestamp",
        {"type": "STEP_STARTED", "stepName": "s", "timestamp": 1.5},
        ["timestamp"],
    ),
    (
        "negative token count",
        {"type": "RUN_ERROR", "message": "x", "usage": [{"outputTokens": -1}]},
        ["usage.0", "outputTokens"],
    ),
    (
        "message without content",
        {"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "u", "role": "user"}]},
        ["messages.0", "content", "Field required"],
    ),
    (
        "message with unknown role",
        {"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "u", "role": "robot", "content": "x"}]},
        ["messages.0", "robot"],
    ),
    (
        "unknown outcome",
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "outcome": {"type": "paused"}},
        ["outcome", "paused"],
    ),
    (
        "unknown content part",
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "m",
            "toolCallId": "c",
            "content": [{"type": "binary", "data": "AAAA"}],
        },
        ["content", "binary"],
    ),
    (
        "data source without mime type",
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "m",
            "toolCallId": "c",
            "content": [{"type": "image", "source": {"type": "data", "value": "AAAA"}}],
        },
        ["content", "mimeType", "Field required"],
    ),
    ("deeply nested list", nested_lists(5000), ["mapping", "list"]),
    (
        "deeply nested garbage as messages",
        {"type": "MESSAGES_SNAPSHOT", "messages": nested_lists(5000)},
        ["MESSAGES_SNAPSHOT", "messages.0"],
    ),
    (
        "deeply nested garbage as a patch",
        {"type": "STATE_DELTA", "delta": nested_dicts(5000)},
        ["STATE_DELTA", "delta", "list"],
    ),
    (
        "deeply nested garbage as content",
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "m",
            "toolCallId": "c",
            "content": [nested_lists(3000)],
        },
        ["TOOL_CALL_RESULT", "content"],
    ),
    (
        "deeply nested garbage as run input",
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r", "input": nested_dicts(3000)},
        ["RUN_STARTED", "input"],
    ),
]


@pytest.mark.parametrize(
    ("bad", "fragments"),
    [(bad, fragments) for _, bad, fragments in BAD_INPUTS],
    ids=[name for name, _, _ in BAD_INPUTS],
)
@pytest.mark.parametrize("entry_point", [parse_event, validate_wire])
def test_bad_input_raises_invalid_event_naming_the_problem(
    entry_point: Callable[[Any], Any], bad: Any, fragments: list[str]
) -> None:
    with pytest.raises(InvalidEvent) as info:
        entry_point(bad)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert len(message) < 2000, "the message must stay readable"
    assert "\n" not in message
    assert info.value.code == "invalid_event"
    assert isinstance(info.value, ProtocolError)
    if isinstance(bad, dict) and isinstance(bad.get("type"), str):
        assert info.value.event_type == bad["type"]


def test_invalid_event_lists_every_problem() -> None:
    bad = {"type": "TOOL_CALL_START", "toolCallId": 1, "timestamp": "soon"}
    with pytest.raises(InvalidEvent) as info:
        parse_event(bad)
    locations = {loc for loc, _ in info.value.problems}
    assert locations == {
        "TOOL_CALL_START.toolCallId",
        "TOOL_CALL_START.toolCallName",
        "TOOL_CALL_START.timestamp",
    }
    message = str(info.value)
    assert message.startswith("invalid TOOL_CALL_START event: ")
    for field in ("toolCallId", "toolCallName", "timestamp"):
        assert field in message


def test_official_sdk_rejects_what_we_reject() -> None:
    for name, bad, _ in BAD_INPUTS:
        if name.startswith("deeply nested"):
            continue
        with pytest.raises(ValueError):
            OFFICIAL_EVENT.validate_python(bad)


@pytest.mark.parametrize("timestamp", [MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER, 0])
def test_timestamp_bounds_are_inclusive(timestamp: int) -> None:
    event = {"type": "STEP_FINISHED", "stepName": "s", "timestamp": timestamp}
    assert validate_wire(event) == event
    assert model_path(event) == event


# =============================================================================
# Regressions: bugs found by these tests, fixed
# =============================================================================


def test_interrupt_outcome_needs_at_least_one_interrupt() -> None:
    bad = {
        "type": "RUN_FINISHED",
        "threadId": "t",
        "runId": "r",
        "outcome": {"type": "interrupt", "interrupts": []},
    }
    with pytest.raises(ValueError):
        OFFICIAL_EVENT.validate_python(bad)
    with pytest.raises(InvalidEvent, match="interrupts"):
        parse_event(bad)


@pytest.mark.parametrize("type_value", [[], {}, ["TEXT_MESSAGE_END"]])
def test_validate_wire_rejects_an_unhashable_type(type_value: Any) -> None:
    with pytest.raises(InvalidEvent, match="unknown event type"):
        validate_wire({"type": type_value, "messageId": "m"})


def test_parse_event_rejects_an_unhashable_type() -> None:
    with pytest.raises(InvalidEvent, match="unknown event type"):
        parse_event({"type": ["TEXT_MESSAGE_END"], "messageId": "m"})


@pytest.mark.parametrize(
    "event",
    [
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "subagent_run_id": "s"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "c",
            "toolCallName": "f",
            "parent_message_id": "m",
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x", "raw_event": {"k": 1}},
    ],
)
def test_fast_path_renames_snake_case_optional_fields(event: dict[str, Any]) -> None:
    assert validate_wire(event) == model_path(event) == official_wire(event)


def test_fast_path_validates_snake_case_optional_fields() -> None:
    bad = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x", "subagent_run_id": 5}
    with pytest.raises(InvalidEvent):
        parse_event(bad)
    with pytest.raises(InvalidEvent, match="subagent_run_id"):
        validate_wire(bad)


def test_fast_path_writes_the_default_reasoning_role() -> None:
    event = {"type": "REASONING_MESSAGE_START", "messageId": "r1"}
    expected = {"type": "REASONING_MESSAGE_START", "messageId": "r1", "role": "reasoning"}
    assert model_path(event) == expected == official_wire(event)
    assert validate_wire(event) == expected


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            {
                "type": "STATE_DELTA",
                "delta": [{"op": "add", "path": "/a", "value": nested_lists(300)}],
            },
            {
                "type": "STATE_DELTA",
                "delta": [{"op": "add", "path": "/a", "value": nested_lists(300)}],
            },
        ),
        (
            {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "result": nested_dicts(300)},
            {"type": "RUN_FINISHED", "threadId": "t", "runId": "r", "result": nested_dicts(300)},
        ),
        (
            {"type": "TEXT_MESSAGE_END", "message_id": "m", "metadata": {"k": nested_lists(300)}},
            {"type": "TEXT_MESSAGE_END", "messageId": "m", "metadata": {"k": nested_lists(300)}},
        ),
    ],
    ids=["state-delta", "run-finished", "snake-case-fast-path-fallback"],
)
def test_deep_json_values_are_accepted_or_rejected_cleanly(
    event: dict[str, Any], expected: dict[str, Any]
) -> None:
    try:
        wire = validate_wire(event)
    except InvalidEvent:
        return
    assert wire == expected


@pytest.mark.parametrize(
    "event",
    [
        {"type": "CUSTOM", "name": "n", "value": nested_lists(300)},
        {"type": "STATE_SNAPSHOT", "snapshot": nested_dicts(300)},
        {"type": "TEXT_MESSAGE_END", "messageId": "m", "metadata": {"k": nested_lists(300)}},
    ],
    ids=["custom", "state-snapshot", "metadata"],
)
def test_deep_json_values_on_the_fast_path_are_accepted_or_rejected_cleanly(
    event: dict[str, Any],
) -> None:
    try:
        wire = validate_wire(event)
    except InvalidEvent:
        return
    assert wire == event


def test_non_finite_floats_are_rejected() -> None:
    # JSON cannot express them, so a JSON subscriber could not be sent the event.
    for value in (math.inf, -math.inf, math.nan):
        with pytest.raises(InvalidEvent, match="NaN and infinity"):
            validate_wire({"type": "CUSTOM", "name": "n", "value": value})
        with pytest.raises(InvalidEvent, match="NaN and infinity"):
            validate_wire(
                {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": [value]}]}
            )


@pytest.mark.parametrize(
    "event",
    [
        {"type": "STATE_SNAPSHOT", "snapshot": {"a": [{"__proto__": {"polluted": True}}]}},
        {"type": "CUSTOM", "name": "n", "value": {"__proto__": 1}},
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r", "__proto__": {}},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x", "__proto__": 1},
    ],
    ids=["nested-state", "custom-value", "extra-field-model-path", "extra-field-fast-path"],
)
def test_a_proto_key_is_rejected_at_any_depth(event: dict[str, Any]) -> None:
    # A JavaScript msgpack decoder refuses a frame holding it: the event would be
    # undeliverable to browser subscribers.
    with pytest.raises(InvalidEvent, match="'__proto__' is not allowed") as caught:
        validate_wire(event)
    assert caught.value.event_type == event["type"]
    # Only the exact key: similar names are ordinary data.
    event = json.loads(json.dumps(event).replace('"__proto__"', '"proto"'))
    assert validate_wire(event)["type"] == event["type"]


def test_validate_wire_rejects_undecodable_bytes_cleanly() -> None:
    event = {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": b"\xff"}]}
    with pytest.raises(InvalidEvent, match="binary strings"):
        validate_wire(event)


# =============================================================================
# 6. Hypothesis
# =============================================================================

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
FINITE_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)


def _all_known_keys() -> list[str]:
    keys: set[str] = {"type", "op", "role", "from", "path", "value", "source", "function"}
    for _, cls in inspect.getmembers(events, inspect.isclass):
        if issubclass(cls, BaseModel) and cls.__module__ == events.__name__:
            for name, info in cls.model_fields.items():
                keys.add(name)
                keys.add(info.alias or name)
    return sorted(keys)


KNOWN_KEYS = _all_known_keys()
FUZZ_KEYS = st.sampled_from(KNOWN_KEYS) | st.text(max_size=8)
FUZZ_VALUES = st.recursive(
    SCALARS
    | st.sampled_from([member.value for member in EventType])
    | st.sampled_from(["user", "assistant", "add", "move", "image", "url", "/a", "a/b"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(FUZZ_KEYS, children, max_size=4)
    ),
    max_leaves=12,
)
FUZZ_EVENTS = st.builds(
    lambda event_type, fields: {**fields, "type": event_type},
    st.sampled_from([member.value for member in EventType]) | FUZZ_VALUES,
    st.dictionaries(FUZZ_KEYS, FUZZ_VALUES, max_size=6),
)
FUZZ_INPUTS = FUZZ_VALUES | FUZZ_EVENTS


def only_invalid_event(entry_point: Callable[[Any], Any], obj: Any) -> None:
    """Call *entry_point*; an error other than InvalidEvent propagates and fails the test."""
    try:
        entry_point(obj)
    except InvalidEvent as exc:
        assert str(exc)
        assert exc.code == "invalid_event"


def has_unhashable_type(obj: Any) -> bool:
    """The known validate_wire bug (see test_validate_wire_rejects_an_unhashable_type)."""
    if not isinstance(obj, dict):
        return False
    try:
        hash(obj.get("type"))
    except TypeError:
        return True
    return False


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obj=FUZZ_INPUTS)
def test_fuzz_entry_points_raise_only_invalid_event(obj: Any) -> None:
    only_invalid_event(parse_event, obj)
    if not has_unhashable_type(obj):
        only_invalid_event(validate_wire, obj)


# -- valid flat events, derived from the official SDK's models ---------------------

JSON_VALUES = st.recursive(
    FINITE_SCALARS,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


def value_strategy(annotation: Any, metadata: list[Any]) -> st.SearchStrategy[Any] | None:
    """A strategy for one official field type, or None if the type is not flat."""
    origin = get_origin(annotation)
    if annotation is Any:
        return JSON_VALUES
    if annotation is str:
        return st.text(max_size=12)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        low = next((m.ge for m in metadata if isinstance(m, annotated_types.Ge)), None)
        high = next((m.le for m in metadata if isinstance(m, annotated_types.Le)), None)
        return st.integers(min_value=low, max_value=high)
    if origin is Literal:
        return st.sampled_from(
            [arg.value if isinstance(arg, enum.Enum) else arg for arg in get_args(annotation)]
        )
    if origin is dict and get_args(annotation) == (str, Any):
        return st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        inner = [arg for arg in args if arg is not type(None)]
        strategies = [value_strategy(arg, metadata) for arg in inner]
        if any(s is None for s in strategies):
            return None
        combined = st.one_of(*[s for s in strategies if s is not None])
        return st.none() | combined if len(inner) < len(args) else combined
    return None


def flat_event_strategy(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]] | None:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    known: set[str] = set()
    for name, info in model.model_fields.items():
        key = info.alias or name
        known |= {name, key}
        strategy = value_strategy(info.annotation, info.metadata)
        if strategy is None:
            return None
        if name == "type" or info.is_required():
            required[key] = strategy
        else:
            optional[key] = strategy
    extras = st.dictionaries(
        # "__proto__" is refused on purpose (docs/protocol-core.md): not a valid event here.
        st.text(min_size=1, max_size=10).filter(lambda key: key not in known | {"__proto__"}),
        JSON_VALUES,
        max_size=2,
    )
    return st.builds(
        lambda fields, extra: {**extra, **fields},
        st.fixed_dictionaries(required, optional=optional),
        extras,
    )


OFFICIAL_MODELS: dict[str, type[BaseModel]] = {
    model.model_fields["type"].default.value: model
    for model in get_args(get_args(official.Event)[0])
}
FLAT_EVENT_STRATEGIES = {
    event_type: strategy
    for event_type, model in OFFICIAL_MODELS.items()
    if (strategy := flat_event_strategy(model)) is not None
}
FLAT_EVENTS = st.one_of(*[FLAT_EVENT_STRATEGIES[t] for t in sorted(FLAT_EVENT_STRATEGIES)])


def test_fast_path_covers_exactly_the_flat_official_event_types() -> None:
    assert len(OFFICIAL_MODELS) == 31
    assert set(FLAT_EVENT_STRATEGIES) == FAST_PATH_TYPES


@settings(max_examples=350, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=FLAT_EVENTS)
def test_fast_path_agrees_with_the_model_path_on_valid_flat_events(
    event: dict[str, Any],
) -> None:
    original = copy.deepcopy(event)
    fast = validate_wire(event)
    assert fast == model_path(event) == official_wire(event)
    assert event == original
    # Unknown fields (nulls included) are kept; optional fields given as null are not.
    model = OFFICIAL_MODELS[event["type"]]
    omittable = {
        info.alias or name
        for name, info in model.model_fields.items()
        if not info.is_required() and info.default is None
    }
    for key, value in event.items():
        if value is None and key in omittable:
            assert key not in fast
        else:
            assert fast[key] == value


def test_validate_batch_names_the_position_of_the_bad_event() -> None:
    good = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x"}
    assert validate_batch([good, good]) == [validate_wire(good)] * 2
    assert validate_batch(iter([])) == []
    for bad, index in (
        ([{"type": "NOPE"}, good], 0),
        ([good, good, {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1"}], 2),
        ([good, "not an object"], 1),
    ):
        with pytest.raises(InvalidEvent) as caught:
            validate_batch(bad)
        assert caught.value.index == index
    # validate_wire on its own has no batch to point into.
    with pytest.raises(InvalidEvent) as single:
        validate_wire({"type": "NOPE"})
    assert single.value.index is None


def test_values_checked_leaves_the_values_unwalked() -> None:
    """A caller that checked the values (a msgpack frame's decoder) says so,
    and validate_wire does not walk them again; by default it does."""
    bad = {"type": "CUSTOM", "name": "n", "value": {"__proto__": 1}}
    with pytest.raises(InvalidEvent, match="__proto__"):
        validate_wire(bad)
    assert validate_wire(bad, values_checked=True)["value"] == {"__proto__": 1}
    with pytest.raises(InvalidEvent, match="NaN"):
        validate_batch([{"type": "STATE_SNAPSHOT", "snapshot": {"x": math.nan}}])
    assert validate_batch(
        [{"type": "STATE_SNAPSHOT", "snapshot": {"x": 1.5}}], values_checked=True
    ) == [{"type": "STATE_SNAPSHOT", "snapshot": {"x": 1.5}}]
