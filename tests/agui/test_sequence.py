"""Tests of agui_hub.agui.sequence: the per-thread AG-UI 1.0 sequence verifier."""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Iterator, Mapping
from itertools import product
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_hub.agui import sequence
from agui_hub.agui.events import TextMessageStartEvent, validate_wire
from agui_hub.agui.sequence import RULES, SequenceVerifier
from agui_hub.errors import SequenceError

Ev = dict[str, Any]
THREAD = "thread-1"

# -- event builders (canonical wire dicts) --------------------------------------------


def _tagged(event: Ev, sub: str | None) -> Ev:
    if sub is not None:
        event["subagentRunId"] = sub
    return event


def run_started(run: str = "r1", messages: list[Ev] | None = None) -> Ev:
    event: Ev = {"type": "RUN_STARTED", "threadId": "t", "runId": run}
    if messages is not None:
        event["input"] = {"threadId": "t", "runId": run, "messages": messages}
    return event


def run_finished(run: str = "r1") -> Ev:
    return {"type": "RUN_FINISHED", "threadId": "t", "runId": run}


def run_error(message: str = "boom") -> Ev:
    return {"type": "RUN_ERROR", "message": message}


def text_start(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"}, sub)


def text_content(mid: str, sub: str | None = None, delta: str = "hi") -> Ev:
    return _tagged({"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": delta}, sub)


def text_end(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "TEXT_MESSAGE_END", "messageId": mid}, sub)


def tool_start(tid: str, parent: str | None = None, sub: str | None = None) -> Ev:
    event: Ev = {"type": "TOOL_CALL_START", "toolCallId": tid, "toolCallName": "search"}
    if parent is not None:
        event["parentMessageId"] = parent
    return _tagged(event, sub)


def tool_args(tid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "TOOL_CALL_ARGS", "toolCallId": tid, "delta": "{}"}, sub)


def tool_end(tid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "TOOL_CALL_END", "toolCallId": tid}, sub)


def tool_result(mid: str, tid: str, sub: str | None = None) -> Ev:
    event: Ev = {"type": "TOOL_CALL_RESULT", "messageId": mid, "toolCallId": tid, "content": "ok"}
    return _tagged(event, sub)


def reasoning_start(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "REASONING_START", "messageId": mid}, sub)


def reasoning_end(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "REASONING_END", "messageId": mid}, sub)


def rmsg_start(mid: str, sub: str | None = None) -> Ev:
    event: Ev = {"type": "REASONING_MESSAGE_START", "messageId": mid, "role": "reasoning"}
    return _tagged(event, sub)


def rmsg_content(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "REASONING_MESSAGE_CONTENT", "messageId": mid, "delta": "hm"}, sub)


def rmsg_end(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "REASONING_MESSAGE_END", "messageId": mid}, sub)


def encrypted(subtype: str, entity: str, sub: str | None = None) -> Ev:
    event: Ev = {
        "type": "REASONING_ENCRYPTED_VALUE",
        "subtype": subtype,
        "entityId": entity,
        "encryptedValue": "xyz",
    }
    return _tagged(event, sub)


def step_started(name: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "STEP_STARTED", "stepName": name}, sub)


def step_finished(name: str, sub: str | None = None) -> Ev:
    return _tagged({"type": "STEP_FINISHED", "stepName": name}, sub)


def sub_started(sid: str, parent: str | None = None, tool_call: str | None = None) -> Ev:
    event: Ev = {"type": "SUBAGENT_STARTED", "subagentRunId": sid, "name": "helper"}
    if parent is not None:
        event["parentSubagentRunId"] = parent
    if tool_call is not None:
        event["parentToolCallId"] = tool_call
    return event


def sub_finished(sid: str) -> Ev:
    return {"type": "SUBAGENT_FINISHED", "subagentRunId": sid}


def sub_error(sid: str) -> Ev:
    return {"type": "SUBAGENT_ERROR", "subagentRunId": sid, "message": "failed"}


def activity_snapshot(mid: str, sub: str | None = None, replace: bool | None = None) -> Ev:
    event: Ev = {
        "type": "ACTIVITY_SNAPSHOT",
        "messageId": mid,
        "activityType": "plan",
        "content": {"steps": []},
    }
    if replace is not None:
        event["replace"] = replace
    return _tagged(event, sub)


def activity_delta(mid: str, sub: str | None = None) -> Ev:
    event: Ev = {
        "type": "ACTIVITY_DELTA",
        "messageId": mid,
        "activityType": "plan",
        "patch": [{"op": "add", "path": "/steps/0", "value": "a"}],
    }
    return _tagged(event, sub)


def messages_snapshot(messages: list[Ev]) -> Ev:
    return {"type": "MESSAGES_SNAPSHOT", "messages": messages}


def assistant(mid: str, sub: str | None = None, calls: tuple[str, ...] = ()) -> Ev:
    msg: Ev = {"id": mid, "role": "assistant", "content": "text"}
    if sub is not None:
        msg["subagentRunId"] = sub
    if calls:
        msg["toolCalls"] = [
            {"id": c, "type": "function", "function": {"name": "search", "arguments": "{}"}}
            for c in calls
        ]
    return msg


def user(mid: str, sub: str | None = None) -> Ev:
    return _tagged({"id": mid, "role": "user", "content": "hello"}, sub)


GENERIC: list[Ev] = [
    {"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}},
    {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/a", "value": 2}]},
    {"type": "CUSTOM", "name": "note", "value": None},
    {"type": "RAW", "event": {"x": 1}},
    {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "delta": "x"},
    {"type": "TOOL_CALL_CHUNK", "toolCallId": "c2", "toolCallName": "f", "delta": "{"},
    {"type": "REASONING_MESSAGE_CHUNK", "messageId": "c3", "delta": "y"},
]


# -- helpers -----------------------------------------------------------------------------


def state_of(verifier: SequenceVerifier) -> dict[str, Any]:
    """A copy of every piece of the verifier's state, for exact before/after comparison.

    The state holds only flat containers of immutable values, so a shallow copy
    of each container is a full copy.
    """
    return {name: copy.copy(getattr(verifier, name)) for name in SequenceVerifier.__slots__}


def outcome(verifier: SequenceVerifier, event: Ev) -> str | None:
    """The rule `check` reports for `event`, or None when it is accepted."""
    try:
        verifier.check(event)
    except SequenceError as exc:
        return exc.rule
    return None


def build(events: list[Ev]) -> SequenceVerifier:
    verifier = SequenceVerifier(THREAD)
    for event in events:
        verifier.verify(event)
    return verifier


# -- valid streams --------------------------------------------------------------------------

VALID_STREAMS: dict[str, list[Ev]] = {
    "interleaved_messages_and_tool_calls": [
        run_started(),
        text_start("m1"),
        text_start("m2"),
        text_content("m1"),
        text_content("m2"),
        tool_start("t1", parent="m1"),
        tool_start("t2"),
        tool_args("t1"),
        text_content("m1"),
        tool_args("t2"),
        tool_end("t1"),
        text_end("m1"),
        tool_args("t2"),
        tool_end("t2"),
        text_end("m2"),
        tool_result("res1", "t1"),
        text_start("m1"),  # an id may be reopened once closed
        text_end("m1"),
        run_finished(),
    ],
    "reasoning_spans_with_messages": [
        run_started(),
        reasoning_start("x"),
        rmsg_start("x"),  # the span and the message inside may share an id
        rmsg_content("x"),
        rmsg_end("x"),
        rmsg_start("x2"),
        rmsg_content("x2"),
        encrypted("message", "x2"),
        rmsg_end("x2"),
        reasoning_end("x"),
        reasoning_start("y"),
        reasoning_end("y"),
        run_finished(),
    ],
    "steps": [
        run_started(),
        step_started("plan"),
        step_started("act"),
        step_finished("act"),
        step_finished("plan"),
        step_started("plan"),
        step_started("plan", sub="s1"),  # same name, other owner
        step_finished("plan", sub="s1"),
        step_finished("plan"),
        run_finished(),
    ],
    "nested_subagents": [
        run_started(),
        text_start("m1"),
        tool_start("t1", parent="m1"),
        tool_end("t1"),
        text_end("m1"),
        sub_started("s1", tool_call="t1"),
        text_start("m2", sub="s1"),
        text_content("m2", sub="s1"),
        text_content("m2"),  # an untagged continuation always agrees
        text_end("m2", sub="s1"),
        tool_start("t2", parent="m2"),  # inherits s1 from its message
        tool_args("t2", sub="s1"),
        tool_end("t2"),
        sub_started("s2", parent="s1"),
        step_started("tools", sub="s2"),
        step_started("tools"),
        step_finished("tools", sub="s2"),
        step_finished("tools"),
        tool_start("t3", sub="s2"),
        tool_args("t3", sub="s2"),
        tool_end("t3"),
        sub_error("s2"),
        sub_started("s3", parent="s2"),  # a parent that already ended is known
        sub_finished("s3"),
        sub_finished("s1"),
        encrypted("tool-call", "t3", sub="s2"),  # after the close, still owned by s2
        activity_snapshot("a1", sub="s1"),
        activity_delta("a1", sub="s1"),
        activity_snapshot("a1", sub="s3"),  # a replacing snapshot re-owns
        activity_delta("a1", sub="s3"),
        run_finished(),
    ],
    "attribution_without_subagent_lifecycle": [
        run_started(),
        text_start("m1", sub="ghost"),
        text_content("m1", sub="ghost"),
        text_end("m1", sub="ghost"),
        step_started("s", sub="ghost"),
        step_finished("s", sub="ghost"),
        run_finished(),
    ],
    "several_runs_in_a_thread": [
        run_started("r1"),
        text_start("m1"),
        text_end("m1"),
        sub_started("s1"),
        sub_finished("s1"),
        run_finished("r1"),
        run_started("r2"),
        text_start("m1", sub="s9"),  # owners are per run
        text_end("m1"),
        sub_started("s1"),  # subagent ids are per run
        sub_finished("s1"),
        run_finished("r2"),
        run_started("r3"),
        text_start("m1"),
        run_error(),
        run_started("r4"),
        text_start("m1"),
        text_end("m1"),
        run_finished("r4"),
    ],
    "run_error_as_first_event": [run_error(), run_started(), run_finished()],
    "run_error_after_run_finished": [
        run_started("r1"),
        run_finished("r1"),
        run_error(),
        run_started("r2"),
        run_finished("r2"),
    ],
    "run_error_with_everything_open": [
        run_started(),
        text_start("m1"),
        tool_start("t1"),
        reasoning_start("x"),
        rmsg_start("x"),
        step_started("plan"),
        sub_started("s1"),
        run_error(),
    ],
    "generic_and_chunk_events": [
        run_started(),
        *GENERIC,
        messages_snapshot([assistant("m1", calls=("t1",)), user("u1")]),
        run_finished(),
    ],
    "history_seeded_owners": [
        run_started(messages=[user("u1"), assistant("m1", sub="s1", calls=("t1",))]),
        text_start("m1", sub="s1"),
        text_end("m1"),
        tool_start("t1", sub="s1"),
        tool_end("t1"),
        messages_snapshot([assistant("m1", sub="s2")]),  # a snapshot replaces owners
        text_start("m1", sub="s2"),
        text_end("m1"),
        run_finished(),
    ],
}


def test_builders_make_canonical_wire_dicts() -> None:
    events = [e for stream in VALID_STREAMS.values() for e in stream]
    events += [case.bad for case in RULE_CASES] + [case.good for case in RULE_CASES]
    events += ALPHABET
    malformed = [case.bad for case in RULE_CASES if case.rule == "malformed_event"]
    checked = 0
    for event in events:
        if any(event is bad for bad in malformed):
            continue
        assert validate_wire(event) == event
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("name", list(VALID_STREAMS))
def test_valid_stream_is_accepted(name: str) -> None:
    verifier = SequenceVerifier(THREAD)
    for event in VALID_STREAMS[name]:
        before = state_of(verifier)
        verifier.check(event)
        assert state_of(verifier) == before, "check() changed the state"
        verifier.verify(event)
    assert not verifier.run_active
    assert all(items == [] for items in verifier.open_items().values())


# -- one case per rule ------------------------------------------------------------------


class Case:
    """Events `prefix` are accepted, then `bad` breaks `rule`, then `good` is accepted."""

    def __init__(self, rule: str, prefix: list[Ev], bad: Ev, good: Ev, variant: str = "") -> None:
        self.rule = rule
        self.prefix = prefix
        self.bad = bad
        self.good = good
        self.id = f"{rule}-{variant}" if variant else rule


RS = run_started()
RULE_CASES: list[Case] = [
    Case("malformed_event", [RS], {"type": "TEXT_MESSAGE_CONTENT", "delta": "x"}, text_start("m")),
    Case("malformed_event", [RS], {"delta": "x"}, text_start("m"), "no_type"),
    Case("run_not_started", [], text_start("m1"), RS),
    Case("run_not_started", [], run_finished(), RS, "run_finished_first"),
    Case("run_already_active", [RS], run_started("r2"), run_finished()),
    Case("run_already_finished", [RS, run_finished()], text_start("m1"), run_started("r2")),
    Case("run_already_finished", [RS, run_finished()], run_finished(), run_error(), "twice"),
    Case("run_already_errored", [RS, run_error()], run_error(), run_started("r2")),
    Case("run_already_errored", [run_error()], text_start("m1"), RS, "first_event"),
    Case("run_already_errored", [RS, run_error()], run_finished(), RS, "run_finished"),
    Case("run_finished_with_open_items", [RS, text_start("m1")], run_finished(), text_end("m1")),
    Case(
        "run_finished_with_open_items", [RS, tool_start("t1")], run_finished(), tool_end("t1"), "tc"
    ),
    Case(
        "run_finished_with_open_items",
        [RS, reasoning_start("x")],
        run_finished(),
        reasoning_end("x"),
        "span",
    ),
    Case(
        "run_finished_with_open_items",
        [RS, rmsg_start("x")],
        run_finished(),
        rmsg_end("x"),
        "reasoning",
    ),
    Case(
        "run_finished_with_open_items",
        [RS, step_started("p", sub="s1")],
        run_finished(),
        step_finished("p", sub="s1"),
        "step",
    ),
    Case(
        "run_finished_with_open_items",
        [RS, sub_started("s1")],
        run_finished(),
        sub_finished("s1"),
        "subagent",
    ),
    Case("message_already_open", [RS, text_start("m1")], text_start("m1"), text_content("m1")),
    Case("message_not_open", [RS], text_content("m1"), text_start("m1")),
    Case(
        "message_not_open",
        [RS, text_start("m1"), text_end("m1")],
        text_end("m1"),
        text_start("m1"),
        "end_twice",
    ),
    Case("tool_call_already_open", [RS, tool_start("t1")], tool_start("t1"), tool_args("t1")),
    Case("tool_call_not_open", [RS], tool_args("t1"), tool_start("t1")),
    Case("tool_call_not_open", [RS, tool_start("t1")], tool_end("t2"), tool_end("t1"), "end"),
    Case("reasoning_already_open", [RS, rmsg_start("x")], rmsg_start("x"), rmsg_content("x")),
    Case("reasoning_not_open", [RS], rmsg_content("x"), rmsg_start("x")),
    Case(
        "reasoning_not_open",
        [RS, reasoning_start("x")],
        rmsg_end("x"),
        rmsg_start("x"),
        "span_is_not_a_message",
    ),
    Case(
        "reasoning_span_already_open",
        [RS, reasoning_start("x")],
        reasoning_start("x"),
        reasoning_end("x"),
    ),
    Case("reasoning_span_not_open", [RS], reasoning_end("x"), reasoning_start("x")),
    Case(
        "reasoning_span_not_open",
        [RS, rmsg_start("x")],
        reasoning_end("x"),
        rmsg_end("x"),
        "message_is_not_a_span",
    ),
    Case("step_already_active", [RS, step_started("a")], step_started("a"), step_finished("a")),
    Case("step_not_active", [RS], step_finished("a"), step_started("a")),
    Case("subagent_duplicate", [RS, sub_started("s1")], sub_started("s1"), sub_finished("s1")),
    Case(
        "subagent_duplicate",
        [RS, sub_started("s1"), sub_finished("s1")],
        sub_started("s1"),
        sub_started("s2"),
        "after_finish",
    ),
    Case("subagent_not_active", [RS], sub_finished("s1"), sub_started("s1")),
    Case(
        "subagent_not_active",
        [RS, sub_started("s1"), sub_finished("s1")],
        sub_error("s1"),
        run_finished(),
        "after_finish",
    ),
    Case("subagent_parent_unknown", [RS], sub_started("s2", parent="s1"), sub_started("s1")),
    Case(
        "attribution_mismatch",
        [RS, text_start("m1")],
        text_content("m1", sub="s1"),
        text_content("m1"),
        "parent_owned_message",
    ),
    Case(
        "attribution_mismatch",
        [RS, text_start("m1", sub="s1")],
        text_end("m1", sub="s2"),
        text_end("m1", sub="s1"),
        "text_end",
    ),
    Case(
        "attribution_mismatch",
        [RS, text_start("m1", sub="s1"), text_end("m1")],
        text_start("m1", sub="s2"),
        text_start("m1"),
        "reopen_keeps_owner",
    ),
    Case(
        "attribution_mismatch",
        [RS, text_start("m1", sub="s1")],
        tool_start("t1", parent="m1", sub="s2"),
        tool_start("t1", parent="m1"),
        "tool_call_vs_parent_message",
    ),
    Case(
        "attribution_mismatch",
        [
            RS,
            text_start("m1", sub="s1"),
            text_start("m2"),
            tool_start("t1", parent="m1"),
            tool_end("t1"),
        ],
        tool_start("t1", parent="m2"),
        tool_start("t1", parent="m1"),
        "untagged_tool_reopen_other_parent",
    ),
    Case(
        "attribution_mismatch",
        [RS, tool_start("t1", sub="s1")],
        tool_args("t1", sub="s2"),
        tool_args("t1", sub="s1"),
        "tool_args",
    ),
    Case(
        "attribution_mismatch",
        [RS, rmsg_start("r1", sub="s1")],
        rmsg_content("r1", sub="s2"),
        rmsg_content("r1", sub="s1"),
        "reasoning_content",
    ),
    Case(
        "attribution_mismatch",
        [RS, reasoning_start("x", sub="s1")],
        rmsg_start("x", sub="s2"),
        rmsg_start("x"),
        "span_and_message_share_owner",
    ),
    Case(
        "attribution_mismatch",
        [RS, tool_start("t1", sub="s1"), tool_end("t1")],
        encrypted("tool-call", "t1", sub="s2"),
        encrypted("tool-call", "t1", sub="s1"),
        "encrypted_tool_call",
    ),
    Case(
        "attribution_mismatch",
        [RS, rmsg_start("r1", sub="s1")],
        encrypted("message", "r1", sub="s2"),
        encrypted("message", "r1", sub="s1"),
        "encrypted_reasoning_message",
    ),
    Case(
        "attribution_mismatch",
        [RS, text_start("m1")],
        encrypted("message", "m1", sub="s2"),
        encrypted("message", "m1"),
        "encrypted_text_message",
    ),
    Case(
        "attribution_mismatch",
        [RS, activity_snapshot("a1", sub="s1")],
        activity_delta("a1", sub="s2"),
        activity_delta("a1", sub="s1"),
        "activity_delta",
    ),
    Case(
        "attribution_mismatch",
        [RS, activity_snapshot("a1", sub="s1"), activity_snapshot("a1", sub="s2", replace=False)],
        activity_delta("a1", sub="s2"),
        activity_delta("a1", sub="s1"),
        "non_replacing_snapshot_keeps_owner",
    ),
    Case(
        "attribution_mismatch",
        [RS, step_started("tools")],
        step_finished("tools", sub="s1"),
        step_finished("tools"),
        "step_closed_by_other_owner",
    ),
    Case(
        "attribution_mismatch",
        [RS, messages_snapshot([assistant("m1", sub="s1", calls=("t1",))])],
        tool_start("t1", sub="s2"),
        tool_start("t1", sub="s1"),
        "snapshot_seeds_tool_calls",
    ),
    Case(
        "attribution_mismatch",
        [RS, messages_snapshot([{"id": "r1", "role": "reasoning", "content": "x"}])],
        rmsg_start("r1", sub="s1"),
        rmsg_start("r1"),
        "snapshot_seeds_reasoning",
    ),
    Case(
        "attribution_mismatch",
        [run_started(messages=[user("u1", sub="s1")])],
        text_start("u1", sub="s2"),
        text_start("u1", sub="s1"),
        "run_input_seeds_owners",
    ),
    Case(
        "attribution_mismatch",
        [RS, text_start("m1", sub="s1"), text_end("m1"), tool_result("m1", "t1")],
        text_start("m1", sub="s1"),
        text_start("m1"),
        "tool_result_reowns_message",
    ),
]


def test_every_rule_has_a_case() -> None:
    assert {case.rule for case in RULE_CASES} == RULES


@pytest.mark.parametrize("case", RULE_CASES, ids=[c.id for c in RULE_CASES])
def test_rule(case: Case) -> None:
    verifier = build(case.prefix)
    before = state_of(verifier)
    items = verifier.open_items()
    active, run_id = verifier.run_active, verifier.run_id

    with pytest.raises(SequenceError) as checked:
        verifier.check(case.bad)
    assert checked.value.rule == case.rule
    with pytest.raises(SequenceError) as info:
        verifier.verify(case.bad)

    err = info.value
    assert err.rule == case.rule
    assert err.thread == THREAD
    assert err.event == case.bad
    assert f"[{case.rule}]" in str(err) and repr(THREAD) in str(err)
    # Nothing was recorded: same state, and the correct event is accepted next.
    assert state_of(verifier) == before
    assert verifier.open_items() == items
    assert (verifier.run_active, verifier.run_id) == (active, run_id)
    verifier.verify(case.good)


def test_rules_table_in_docstring_matches_rules() -> None:
    doc = sequence.__doc__ or ""
    table = set(re.findall(r"^``([a-z_]+)``\s+\S", doc, flags=re.MULTILINE))
    assert table == RULES


def test_messages_are_actionable() -> None:
    verifier = SequenceVerifier(THREAD)
    verifier.verify(run_started())
    with pytest.raises(SequenceError) as info:
        verifier.verify(text_content("m1"))
    assert "'m1'" in str(info.value) and "send TEXT_MESSAGE_START first" in str(info.value)

    verifier.verify(text_start("m1"))
    verifier.verify(step_started("plan", sub="s1"))
    with pytest.raises(SequenceError) as info:
        verifier.verify(run_finished())
    message = str(info.value)
    assert "'m1'" in message and "TEXT_MESSAGE_END" in message
    assert "'plan' (subagent 's1')" in message and "STEP_FINISHED" in message


# -- state, from_events and input forms -----------------------------------------------------


def test_open_items_and_run_id() -> None:
    verifier = SequenceVerifier()
    assert verifier.run_id is None and not verifier.run_active
    for event in [
        run_started("r7"),
        text_start("m1"),
        tool_start("t1"),
        reasoning_start("x"),
        rmsg_start("y"),
        step_started("plan"),
        step_started("plan", sub="s1"),
        sub_started("s1"),
        text_start("m2"),
    ]:
        verifier.verify(event)
    assert verifier.run_active and verifier.run_id == "r7"
    assert verifier.open_items() == {
        "messages": ["m1", "m2"],
        "toolCalls": ["t1"],
        "reasoningSpans": ["x"],
        "reasoningMessages": ["y"],
        "steps": ["plan", "plan (subagent 's1')"],
        "subagents": ["s1"],
    }
    verifier.verify(run_error())
    assert not verifier.run_active and verifier.run_id == "r7"
    assert all(v == [] for v in verifier.open_items().values())


def _probes() -> Iterator[Ev]:
    for stream in VALID_STREAMS.values():
        yield from stream
    for case in RULE_CASES:
        yield case.bad
        yield case.good


PROBES = list(_probes())


@pytest.mark.parametrize("name", list(VALID_STREAMS))
def test_from_events_matches_incremental(name: str) -> None:
    stream = VALID_STREAMS[name]
    incremental = SequenceVerifier(THREAD)
    for n in range(len(stream) + 1):
        rebuilt = SequenceVerifier.from_events(stream[:n], thread=THREAD)
        assert rebuilt.thread == THREAD
        assert state_of(rebuilt) == state_of(incremental)
        assert rebuilt.open_items() == incremental.open_items()
        assert (rebuilt.run_active, rebuilt.run_id) == (incremental.run_active, incremental.run_id)
        assert [outcome(rebuilt, p) for p in PROBES] == [outcome(incremental, p) for p in PROBES]
        if n < len(stream):
            incremental.verify(stream[n])


def test_from_events_raises_on_a_broken_stream() -> None:
    with pytest.raises(SequenceError) as info:
        SequenceVerifier.from_events([text_content("m1")], thread=THREAD)
    assert info.value.rule == "run_not_started"


def test_accepts_models_and_mappings() -> None:
    verifier = SequenceVerifier()
    verifier.verify(run_started())
    verifier.verify(TextMessageStartEvent(message_id="m1"))
    assert verifier.open_items()["messages"] == ["m1"]

    class ReadOnly(Mapping[str, Any]):
        def __init__(self, data: Ev) -> None:
            self._data = data

        def __getitem__(self, key: str) -> Any:
            return self._data[key]

        def __iter__(self) -> Iterator[str]:
            return iter(self._data)

        def __len__(self) -> int:
            return len(self._data)

    with pytest.raises(SequenceError) as info:
        verifier.verify(ReadOnly(text_start("m1")))
    assert info.value.rule == "message_already_open"
    assert info.value.event == text_start("m1")
    with pytest.raises(TypeError):
        verifier.verify(["TEXT_MESSAGE_END"])


def test_official_sdk_models_are_accepted() -> None:
    core = pytest.importorskip("ag_ui.core")
    verifier = SequenceVerifier()
    verifier.verify(core.RunStartedEvent(thread_id="t", run_id="r1"))
    verifier.verify(core.TextMessageStartEvent(message_id="m1", role="assistant"))
    verifier.verify(core.TextMessageEndEvent(message_id="m1"))
    verifier.verify(core.RunFinishedEvent(thread_id="t", run_id="r1"))
    assert not verifier.run_active and verifier.run_id == "r1"


def test_null_tag_counts_as_absent() -> None:
    verifier = build([run_started(), text_start("m1", sub="s1")])
    verifier.verify({**text_content("m1"), "subagentRunId": None})


def test_module_imports_no_io_libraries() -> None:
    tree = ast.parse(Path(sequence.__file__).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported
    assert not imported & {"asyncio", "websockets", "redis"}


# -- random sequences -----------------------------------------------------------------------


def _alphabet() -> list[Ev]:
    """Every event over a small alphabet of ids ("a", "b"), tags and subagents."""
    ids, tags, subs = ("a", "b"), (None, "s1", "s2"), ("s1", "s2")
    out: list[Ev] = [run_started("r1"), run_started("r2"), run_finished(), run_error()]
    out.append(run_started("r1", [user("a", "s1"), assistant("b", None, ("a",))]))
    out.append(messages_snapshot([assistant("a", "s2", ("b",))]))
    out += GENERIC
    for i, tag in product(ids, tags):
        for make in (text_start, text_content, text_end, tool_args, tool_end):
            out.append(make(i, tag))
        for make in (reasoning_start, reasoning_end, rmsg_start, rmsg_content, rmsg_end):
            out.append(make(i, tag))
        out += [step_started(i, tag), step_finished(i, tag), activity_delta(i, tag)]
        out += [encrypted("tool-call", i, tag), encrypted("message", i, tag)]
        out += [activity_snapshot(i, tag), activity_snapshot(i, tag, replace=False)]
        for parent in (None, *ids):
            out.append(tool_start(i, parent, tag))
        for call in ids:
            out.append(tool_result(i, call, tag))
    for sid in subs:
        out += [sub_finished(sid), sub_error(sid)]
        out += [sub_started(sid, parent) for parent in (None, *subs)]
    return out


ALPHABET = _alphabet()


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.lists(st.sampled_from(ALPHABET), max_size=30))
def test_random_sequences_accept_or_raise_sequence_error(start: bool, events: list[Ev]) -> None:
    if start:
        events = [run_started(), *events]
    verifier = SequenceVerifier(THREAD)
    accepted: list[Ev] = []
    for event in events:
        before = state_of(verifier)
        checked = outcome(verifier, event)
        assert state_of(verifier) == before
        try:
            verifier.verify(event)
        except SequenceError as exc:
            assert exc.rule in RULES
            assert exc.rule == checked
            assert exc.thread == THREAD and exc.event is event
            assert state_of(verifier) == before
        else:
            assert checked is None
            accepted.append(event)
    assert state_of(SequenceVerifier.from_events(accepted, thread=THREAD)) == state_of(verifier)


def test_copy_is_independent_and_equivalent() -> None:
    """copy() (used to try a batch) judges like the original and shares no state."""
    head = [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
        {"type": "STEP_STARTED", "stepName": "s"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "f"},
        {"type": "SUBAGENT_STARTED", "subagentRunId": "sub1", "name": "helper"},
    ]
    original = SequenceVerifier.from_events(head, thread="t")
    twin = original.copy()
    assert repr(twin) == repr(original) and twin.open_items() == original.open_items()
    twin.verify({"type": "TEXT_MESSAGE_END", "messageId": "m1"})
    twin.verify({"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "assistant"})
    # The original still has m1 open and knows nothing of m2.
    original.verify({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x"})
    with pytest.raises(SequenceError) as info:
        original.verify({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "x"})
    assert info.value.rule == "message_not_open"
    assert original.open_items() != twin.open_items()
