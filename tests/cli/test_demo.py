"""Tests of agui_hub.cli.demo: the run ``agui-hub demo`` publishes."""

from __future__ import annotations

import copy
import json
from typing import Any

from agui_hub.agui.events import validate_wire
from agui_hub.agui.reducer import RunStatus, ThreadState, fold
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.cli.demo import demo_run
from agui_hub.client.transcript import TranscriptView

Event = dict[str, Any]


def events_of(thread: str = "t1", run_id: str = "r1") -> list[Event]:
    return [event for _, event in demo_run(thread, run_id)]


def test_every_event_is_canonical_and_the_sequence_verifies() -> None:
    events = events_of()
    assert 80 <= len(events) <= 200
    verifier = SequenceVerifier(thread="t1")
    for event in events:
        # Canonical: validation neither rejects nor rewrites it.
        assert validate_wire(event) == event
        verifier.verify(event)
    assert not verifier.run_active
    assert all(not items for items in verifier.open_items().values())
    # Explicit START / CONTENT / END only: chunks would escape the pairing checks.
    assert not [e for e in events if e["type"].endswith("_CHUNK")]


def test_the_run_has_every_part() -> None:
    events = events_of()
    types = [e["type"] for e in events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert events[0] == {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}
    assert events[-1]["result"] == {"cities": ["Paris", "Berlin"], "warmest": "Paris"}
    assert types[1:4] == ["TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END"]
    assert events[1]["role"] == "user"
    plan = types.index("STEP_STARTED")
    assert events[plan]["stepName"] == "plan"
    assert types[plan + 1 : plan + 3] == ["REASONING_START", "REASONING_MESSAGE_START"]
    assert types.count("REASONING_MESSAGE_CONTENT") >= 10
    assert types.count("TOOL_CALL_START") == 2
    assert types.count("TOOL_CALL_ARGS") >= 6
    assert types.count("TOOL_CALL_RESULT") == 2
    assert types.index("STATE_SNAPSHOT") < types.index("STATE_DELTA")
    assert types.count("STATE_DELTA") == 3
    assert types[-2] == "STATE_DELTA"
    # Each tool call's result follows its END.
    for call_id in {e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_START"}:
        end = events.index({"type": "TOOL_CALL_END", "toolCallId": call_id})
        assert events[end + 1]["type"] == "TOOL_CALL_RESULT"
        assert events[end + 1]["toolCallId"] == call_id


def test_it_folds_to_the_expected_thread() -> None:
    thread = fold(events_of(), ThreadState())
    assert thread.rejected == []
    assert thread.state == {
        "status": "done",
        "progress": 1,
        "cities": ["Paris", "Berlin"],
        "forecasts": {
            "Paris": {"temperature": 18, "conditions": "sunny"},
            "Berlin": {"temperature": 12, "conditions": "cloudy", "chanceOfRain": 0.6},
        },
    }
    roles = [(m["id"], m["role"]) for m in thread.messages]
    assert roles == [
        ("r1-question", "user"),
        ("r1-thought", "reasoning"),
        ("r1-intro", "assistant"),
        ("r1-result-paris", "tool"),
        ("r1-result-berlin", "tool"),
        ("r1-answer", "assistant"),
    ]
    by_id = {m["id"]: m for m in thread.messages}
    assert by_id["r1-question"]["content"] == (
        "What's the weather like in Paris and Berlin today? I'm packing for a trip."
    )
    assert by_id["r1-answer"]["content"].startswith("Paris is sunny and 18 °C, while Berlin")
    calls = by_id["r1-intro"]["toolCalls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("get_weather", {"city": "Berlin", "unit": "celsius"}),
    ]
    assert json.loads(by_id["r1-result-berlin"]["content"])["temperature"] == 12
    assert [(r.run_id, r.status) for r in thread.runs] == [("r1", RunStatus.FINISHED)]
    assert not thread.open_messages and not thread.open_tool_calls and not thread.open_steps


def test_two_runs_in_one_thread_do_not_collide() -> None:
    first, second = events_of("t1", "r1"), events_of("t1", "r2")
    id_keys = ("messageId", "toolCallId")

    def ids(events: list[Event]) -> set[str]:
        return {e[k] for e in events for k in id_keys if k in e}

    assert len(ids(first)) >= 7
    assert ids(first).isdisjoint(ids(second))
    # Back to back in one thread they verify, and fold into both conversations.
    verifier = SequenceVerifier(thread="t1")
    for event in first + second:
        verifier.verify(event)
    thread = fold(first + second)
    assert thread.rejected == [] and len(thread.messages) == 12
    assert [r.run_id for r in thread.runs] == ["r1", "r2"]


def test_deterministic_and_fresh() -> None:
    a, b = demo_run("t1", "r1"), demo_run("t1", "r1")
    assert a == b
    b[0][1]["runId"] = "changed"
    assert demo_run("t1", "r1")[0][1]["runId"] == "r1"
    assert demo_run("other", "r1")[0][1]["threadId"] == "other"


def test_delays_are_sane() -> None:
    pairs = demo_run("t1", "r1")
    delays = [delay for delay, _ in pairs]
    assert delays[0] == 0.0
    assert all(isinstance(d, float) and 0.0 <= d <= 1.0 for d in delays)
    assert 5.0 <= sum(delays) <= 8.0
    token_delays = [
        d for d, e in pairs if e["type"] in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT")
    ][1:]  # the user's question arrives whole, at once
    assert token_delays and all(0.02 <= d <= 0.04 for d in token_delays)
    result_delays = [d for d, e in pairs if e["type"] == "TOOL_CALL_RESULT"]
    assert len(result_delays) == 2 and all(0.3 <= d <= 0.5 for d in result_delays)


def test_streams_word_by_word() -> None:
    events = events_of()
    answer = [
        e["delta"]
        for e in events
        if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"] == "r1-answer"
    ]
    assert len(answer) >= 20
    assert all(len(d.split()) == 1 for d in answer)
    args = [e["delta"] for e in events if e.get("toolCallId") == "r1-call-paris" and "delta" in e]
    assert len(args) >= 3 and json.loads("".join(args)) == {"city": "Paris", "unit": "celsius"}


def test_transcript_of_the_demo() -> None:
    view = TranscriptView()
    out = "".join(view.render(event) for event in events_of()) + view.close()
    lines = out.splitlines()
    assert lines[0] == "── run r1 started"
    assert lines[1] == (
        "user: What's the weather like in Paris and Berlin today? I'm packing for a trip."
    )
    assert lines[2] == "▸ step plan"
    assert lines[3].startswith("thinking: The user wants today's weather in two cities.")
    assert "assistant: Let me check the current weather in Paris and Berlin for you." in lines
    assert 'tool get_weather({"city": "Paris", "unit": "celsius"})' in lines
    assert 'tool get_weather({"city": "Berlin", "unit": "celsius"})' in lines
    assert (
        '  ↳ {"city": "Paris", "unit": "celsius", "temperature": 18, "conditions": "sunny"}'
        in lines
    )
    assert 'state: {"status":"fetching weather","progress":0,"cities":[],"forecasts":{}}' in lines
    assert lines[-3].startswith("assistant: Paris is sunny and 18 °C")
    assert lines[-2] == 'state: replace /status = "done"'
    assert lines[-1] == "── run r1 finished"
    assert not [line for line in lines if "(cont.)" in line or "malformed" in line]


def test_a_late_viewer_of_the_compacted_demo_sees_the_conversation() -> None:
    events = events_of()
    half = fold(copy.deepcopy(events[: len(events) // 2]))
    out = "".join(TranscriptView().render(e) for e in half.compact())
    assert "user: What's the weather like in Paris and Berlin today?" in out
    assert out.startswith("── run r1 started\n")
