"""Tests of agui_hub.reducer: folding events into a ThreadState and compacting it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_hub.errors import PatchError
from agui_hub.events import validate_wire
from agui_hub.reducer import RunStatus, fold
from agui_hub.sequence import SequenceVerifier

from .streams import valid_streams

RUN = {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}
END = {"type": "RUN_FINISHED", "threadId": "t1", "runId": "r1"}


def text(message_id: str, *deltas: str, **start: Any) -> list[dict[str, Any]]:
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": message_id, **start},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": d} for d in deltas),
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
    ]


def test_text_message_builds_an_assistant_message() -> None:
    state = fold([RUN, *text("m1", "Hel", "lo"), END])
    assert state.messages == [{"id": "m1", "role": "assistant", "content": "Hello"}]
    assert state.runs[0].status is RunStatus.FINISHED
    assert not state.open_messages


def test_interleaved_messages_and_metadata_merge() -> None:
    events = [
        RUN,
        {"type": "TEXT_MESSAGE_START", "messageId": "a", "role": "user", "metadata": {"x": 1}},
        {"type": "TEXT_MESSAGE_START", "messageId": "b"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": "1", "metadata": {"y": 2}},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "b", "delta": "2"},
    ]
    state = fold(events)
    assert state.messages == [
        {"id": "a", "role": "user", "content": "1", "metadata": {"x": 1, "y": 2}},
        {"id": "b", "role": "assistant", "content": "2"},
    ]
    assert set(state.open_messages) == {"a", "b"}


def test_tool_call_and_result_are_placed_after_their_assistant_message() -> None:
    events = [
        RUN,
        *text("m1", "Let me look"),
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "tc1",
            "toolCallName": "search",
            "parentMessageId": "m1",
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": "tc1", "delta": '{"q":'},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "tc1", "delta": '"x"}'},
        {"type": "TOOL_CALL_END", "toolCallId": "tc1"},
        *text("m2", "after"),
        {"type": "TOOL_CALL_RESULT", "messageId": "res1", "toolCallId": "tc1", "content": "ok"},
    ]
    state = fold(events)
    assert [m["id"] for m in state.messages] == ["m1", "res1", "m2"]
    call = state.messages[0]["toolCalls"][0]
    assert call == {
        "id": "tc1",
        "type": "function",
        "function": {"name": "search", "arguments": '{"q":"x"}'},
    }
    assert state.messages[1] == {"id": "res1", "toolCallId": "tc1", "role": "tool", "content": "ok"}


def test_tool_call_without_parent_creates_an_assistant_message() -> None:
    state = fold([RUN, {"type": "TOOL_CALL_START", "toolCallId": "tc1", "toolCallName": "f"}])
    assert state.messages == [
        {
            "id": "tc1",
            "role": "assistant",
            "toolCalls": [
                {"id": "tc1", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        }
    ]


def test_state_snapshot_and_delta() -> None:
    state = fold(
        [
            RUN,
            {"type": "STATE_SNAPSHOT", "snapshot": {"count": 1, "items": []}},
            {
                "type": "STATE_DELTA",
                "delta": [
                    {"op": "replace", "path": "/count", "value": 2},
                    {"op": "add", "path": "/items/-", "value": "a"},
                    {"op": "copy", "from": "/count", "path": "/copy"},
                ],
            },
        ]
    )
    assert state.state == {"count": 2, "items": ["a"], "copy": 2}


def test_failing_patch_raises_and_leaves_state_unchanged() -> None:
    state = fold([RUN, {"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}}])
    bad = {
        "type": "STATE_DELTA",
        "delta": [
            {"op": "replace", "path": "/a", "value": 5},
            {"op": "remove", "path": "/missing"},
        ],
    }
    with pytest.raises(PatchError) as info:
        state.apply(bad)
    assert state.state == {"a": 1}
    assert info.value.patch == bad["delta"]
    # fold() keeps going and records the error
    folded = fold([RUN, {"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}}, bad])
    assert folded.state == {"a": 1} and len(folded.rejected) == 1


def test_patch_on_a_snapshot_does_not_alias_the_event() -> None:
    snapshot = {"type": "STATE_SNAPSHOT", "snapshot": {"a": [1]}}
    original = copy.deepcopy(snapshot)
    fold(
        [
            RUN,
            snapshot,
            {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a/-", "value": 2}]},
        ]
    )
    assert snapshot == original


def test_messages_snapshot_merges_by_id_and_keeps_client_only_reasoning() -> None:
    state = fold(
        [
            RUN,
            {"type": "REASONING_MESSAGE_START", "messageId": "think", "role": "reasoning"},
            {"type": "REASONING_MESSAGE_CONTENT", "messageId": "think", "delta": "hmm"},
            {"type": "REASONING_MESSAGE_END", "messageId": "think"},
            *text("m1", "draft"),
            *text("gone", "dropped"),
            {
                "type": "MESSAGES_SNAPSHOT",
                "messages": [
                    {"id": "m1", "role": "assistant", "content": "final"},
                    {"id": "u9", "role": "user", "content": "hi"},
                ],
            },
        ]
    )
    assert state.messages == [
        {"id": "think", "role": "reasoning", "content": "hmm"},
        {"id": "m1", "role": "assistant", "content": "final"},
        {"id": "u9", "role": "user", "content": "hi"},
    ]


def test_snapshot_message_is_not_mutated_by_later_deltas() -> None:
    snap = {
        "type": "MESSAGES_SNAPSHOT",
        "messages": [{"id": "m1", "role": "assistant", "content": "a"}],
    }
    fold(
        [
            RUN,
            snap,
            {"type": "TEXT_MESSAGE_START", "messageId": "m1"},
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "b"},
        ]
    )
    assert snap["messages"][0]["content"] == "a"


def test_activity_snapshot_and_delta() -> None:
    state = fold(
        [
            RUN,
            {
                "type": "ACTIVITY_SNAPSHOT",
                "messageId": "p",
                "activityType": "PLAN",
                "content": {"steps": ["a"]},
            },
            {
                "type": "ACTIVITY_DELTA",
                "messageId": "p",
                "activityType": "PLAN",
                "patch": [{"op": "add", "path": "/steps/-", "value": "b"}],
            },
            {
                "type": "ACTIVITY_SNAPSHOT",
                "messageId": "p",
                "activityType": "PLAN",
                "content": {"steps": []},
                "replace": False,
            },
        ]
    )
    assert state.messages == [
        {"id": "p", "role": "activity", "activityType": "PLAN", "content": {"steps": ["a", "b"]}}
    ]


def test_run_lineage_and_input_messages() -> None:
    state = fold(
        [
            RUN,
            END,
            {
                "type": "RUN_STARTED",
                "threadId": "t1",
                "runId": "r2",
                "parentRunId": "r1",
                "input": {
                    "threadId": "t1",
                    "runId": "r2",
                    "messages": [{"id": "u1", "role": "user", "content": "again"}],
                },
            },
        ]
    )
    assert [(r.run_id, r.parent_run_id, r.status) for r in state.runs] == [
        ("r1", None, RunStatus.FINISHED),
        ("r2", "r1", RunStatus.RUNNING),
    ]
    assert state.runs[1].started is not None and "input" not in state.runs[1].started
    assert state.messages == [{"id": "u1", "role": "user", "content": "again"}]


def test_chunks_are_expanded_on_the_way_in() -> None:
    state = fold(
        [
            RUN,
            {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "delta": "a"},
            {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "delta": "b"},
        ]
    )
    assert state.messages == [{"id": "c1", "role": "assistant", "content": "ab"}]
    assert "c1" in state.open_messages
    state.flush()
    assert "c1" not in state.open_messages


def test_compact_of_a_long_thread_is_short() -> None:
    deltas = [str(i % 10) for i in range(5000)]
    events = [RUN, *text("m1", *deltas), END]
    state = fold(events)
    compact = state.compact()
    assert [e["type"] for e in compact] == [
        "RUN_STARTED",
        "MESSAGES_SNAPSHOT",
        "STATE_SNAPSHOT",
        "RUN_FINISHED",
    ]
    assert fold(compact) == state


def test_compact_reopens_what_is_still_streaming() -> None:
    events = [
        RUN,
        {"type": "SUBAGENT_STARTED", "subagentRunId": "s1", "name": "helper"},
        {"type": "STEP_STARTED", "stepName": "plan"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "subagentRunId": "s1"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "par", "subagentRunId": "s1"},
        {"type": "TOOL_CALL_START", "toolCallId": "tc", "toolCallName": "f"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": "{"},
    ]
    tail = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "tial", "subagentRunId": "s1"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "tc", "delta": "}"},
    ]
    full = fold(events)
    compact = full.compact()
    assert [e["type"] for e in compact] == [
        "RUN_STARTED",
        "MESSAGES_SNAPSHOT",
        "STATE_SNAPSHOT",
        "SUBAGENT_STARTED",
        "STEP_STARTED",
        "TEXT_MESSAGE_START",
        "TOOL_CALL_START",
    ]
    rebuilt = fold(compact)
    assert rebuilt == full
    continued = fold(tail, rebuilt)
    assert continued == fold(tail, full)
    assert continued.message("m1") == {
        "id": "m1",
        "role": "assistant",
        "content": "partial",
        "subagentRunId": "s1",
    }
    # A verifier rebuilt from the compact sequence accepts the live tail.
    verifier = SequenceVerifier.from_events(compact)
    for event in tail:
        verifier.verify(event)


def test_compact_events_are_valid_wire_events() -> None:
    state = fold([RUN, *text("m1", "x"), {"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}}])
    for event in state.compact():
        assert validate_wire(event) == event


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_streams())
def test_folding_the_compact_sequence_gives_the_same_state(events: list[dict[str, Any]]) -> None:
    full = fold(events)
    assert not full.rejected
    compact = full.compact()
    rebuilt = fold(compact)
    assert rebuilt == full
    assert not rebuilt.rejected
    # The compact sequence is itself a valid stream.
    verifier = SequenceVerifier()
    for event in compact:
        verifier.verify(event)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_streams(), st.data())
def test_compact_then_tail_equals_full_stream(
    events: list[dict[str, Any]], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(events)))
    head, tail = events[:cut], events[cut:]
    expected = fold(events, flush=True)
    resumed = fold(tail, fold(fold(head).compact()), flush=True)
    assert resumed.messages == expected.messages
    assert resumed.state == expected.state
    assert [(r.run_id, r.status) for r in resumed.runs] == [
        (r.run_id, r.status) for r in expected.runs
    ]


@settings(max_examples=60, deadline=None)
@given(valid_streams())
def test_generated_streams_are_valid(events: list[dict[str, Any]]) -> None:
    # Guards the generator itself: every event validates and the order verifies.
    verifier = SequenceVerifier()
    for event in events:
        assert validate_wire(event) is not None
        verifier.verify(event)
