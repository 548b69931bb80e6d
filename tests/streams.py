"""Hypothesis strategies for valid AG-UI event streams (wire dicts).

``valid_streams()`` draws a sequence of actions and turns them into events
that obey the AG-UI 1.0 sequence rules: runs with lineage, interleaved text
messages, tool calls with results, reasoning spans and messages, steps,
subagents, state snapshots and JSON Patch deltas that apply, message and
activity snapshots, chunk streams. The stream may stop anywhere, so items
can still be open at the end (as when a viewer joins mid-run).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Event = dict[str, Any]

TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=8
)
KEYS = st.sampled_from(["a", "b", "c", "n", "items"])
JSON_SCALARS = st.none() | st.booleans() | st.integers(-1000, 1000) | TEXT


class _StreamBuilder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.counter = 0
        self.run_active = False
        self.runs: list[str] = []
        self.open_text: list[str] = []
        self.open_tools: list[str] = []
        self.closed_tools: list[str] = []
        self.open_reasoning_msgs: list[str] = []
        self.open_spans: list[str] = []
        self.open_steps: list[str] = []
        self.active_subagents: list[str] = []
        self.chunk_text: str | None = None  # id of the open TEXT_MESSAGE_CHUNK stream
        self.state: dict[str, Any] = {}
        self.activities: list[str] = []
        self.message_ids: list[str] = []

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def anything_open(self) -> bool:
        return bool(
            self.open_text
            or self.open_tools
            or self.open_reasoning_msgs
            or self.open_spans
            or self.open_steps
            or self.active_subagents
            or self.chunk_text
        )


ACTIONS = [
    "run_start",
    "run_finish",
    "run_error",
    "text_start",
    "text_content",
    "text_end",
    "tool_start",
    "tool_args",
    "tool_end",
    "tool_result",
    "reasoning_start",
    "reasoning_msg_start",
    "reasoning_content",
    "reasoning_msg_end",
    "reasoning_end",
    "step_start",
    "step_end",
    "subagent_start",
    "subagent_end",
    "state_snapshot",
    "state_delta",
    "messages_snapshot",
    "activity_snapshot",
    "activity_delta",
    "custom",
    "text_chunk",
    "encrypted",
]


def _close_chunk(b: _StreamBuilder) -> None:
    # Any non-chunk event closes an open chunk stream implicitly; track it.
    if b.chunk_text is not None:
        b.chunk_text = None


def _step(draw: st.DrawFn, b: _StreamBuilder, action: str) -> None:
    if action == "run_start" and not b.run_active:
        _close_chunk(b)
        run_id = b.new_id("run")
        event: Event = {"type": "RUN_STARTED", "threadId": "t1", "runId": run_id}
        if b.runs and draw(st.booleans()):
            event["parentRunId"] = draw(st.sampled_from(b.runs))
        if draw(st.booleans()):
            msg_id = b.new_id("u")
            b.message_ids.append(msg_id)
            event["input"] = {
                "threadId": "t1",
                "runId": run_id,
                "messages": [{"id": msg_id, "role": "user", "content": draw(TEXT)}],
            }
        b.emit(event)
        b.runs.append(run_id)
        b.run_active = True
        return
    if not b.run_active:
        return
    if action == "run_finish" and not b.anything_open():
        event = {"type": "RUN_FINISHED", "threadId": "t1", "runId": b.runs[-1]}
        if draw(st.booleans()):
            event["result"] = draw(JSON_SCALARS)
        b.emit(event)
        b.run_active = False
        return
    if action == "run_error":
        b.emit({"type": "RUN_ERROR", "message": draw(TEXT)})
        for name in ("open_text", "open_tools", "open_reasoning_msgs", "open_spans"):
            getattr(b, name).clear()
        b.open_steps.clear()
        b.active_subagents.clear()
        b.chunk_text = None
        b.run_active = False
        return
    if action == "text_chunk":
        if b.chunk_text is None:
            msg_id = b.new_id("c")
            b.chunk_text = msg_id
            b.message_ids.append(msg_id)
            b.emit({"type": "TEXT_MESSAGE_CHUNK", "messageId": msg_id, "delta": draw(TEXT)})
        else:
            b.emit({"type": "TEXT_MESSAGE_CHUNK", "messageId": b.chunk_text, "delta": draw(TEXT)})
        return
    _close_chunk(b)
    if action == "text_start":
        msg_id = b.new_id("m")
        event = {"type": "TEXT_MESSAGE_START", "messageId": msg_id}
        if draw(st.booleans()):
            event["role"] = draw(st.sampled_from(["assistant", "user", "system", "developer"]))
        if draw(st.booleans()):
            event["metadata"] = {"k": draw(JSON_SCALARS)}
        b.emit(event)
        b.open_text.append(msg_id)
        b.message_ids.append(msg_id)
    elif action == "text_content" and b.open_text:
        msg_id = draw(st.sampled_from(b.open_text))
        b.emit({"type": "TEXT_MESSAGE_CONTENT", "messageId": msg_id, "delta": draw(TEXT)})
    elif action == "text_end" and b.open_text:
        msg_id = draw(st.sampled_from(b.open_text))
        b.open_text.remove(msg_id)
        b.emit({"type": "TEXT_MESSAGE_END", "messageId": msg_id})
    elif action == "tool_start":
        call_id = b.new_id("tc")
        event = {"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": "search"}
        if b.message_ids and draw(st.booleans()):
            event["parentMessageId"] = draw(st.sampled_from(b.message_ids))
        b.emit(event)
        b.open_tools.append(call_id)
    elif action == "tool_args" and b.open_tools:
        call_id = draw(st.sampled_from(b.open_tools))
        b.emit({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": draw(TEXT)})
    elif action == "tool_end" and b.open_tools:
        call_id = draw(st.sampled_from(b.open_tools))
        b.open_tools.remove(call_id)
        b.closed_tools.append(call_id)
        b.emit({"type": "TOOL_CALL_END", "toolCallId": call_id})
    elif action == "tool_result" and b.closed_tools:
        call_id = draw(st.sampled_from(b.closed_tools))
        msg_id = b.new_id("r")
        b.message_ids.append(msg_id)
        b.emit(
            {
                "type": "TOOL_CALL_RESULT",
                "messageId": msg_id,
                "toolCallId": call_id,
                "content": draw(TEXT),
            }
        )
    elif action == "reasoning_start":
        span = b.new_id("rs")
        b.open_spans.append(span)
        b.emit({"type": "REASONING_START", "messageId": span})
    elif action == "reasoning_msg_start":
        msg_id = b.new_id("rm")
        b.open_reasoning_msgs.append(msg_id)
        b.message_ids.append(msg_id)
        b.emit({"type": "REASONING_MESSAGE_START", "messageId": msg_id, "role": "reasoning"})
    elif action == "reasoning_content" and b.open_reasoning_msgs:
        msg_id = draw(st.sampled_from(b.open_reasoning_msgs))
        b.emit({"type": "REASONING_MESSAGE_CONTENT", "messageId": msg_id, "delta": draw(TEXT)})
    elif action == "reasoning_msg_end" and b.open_reasoning_msgs:
        msg_id = draw(st.sampled_from(b.open_reasoning_msgs))
        b.open_reasoning_msgs.remove(msg_id)
        b.emit({"type": "REASONING_MESSAGE_END", "messageId": msg_id})
    elif action == "reasoning_end" and b.open_spans:
        span = draw(st.sampled_from(b.open_spans))
        b.open_spans.remove(span)
        b.emit({"type": "REASONING_END", "messageId": span})
    elif action == "step_start":
        name = b.new_id("step")
        b.open_steps.append(name)
        b.emit({"type": "STEP_STARTED", "stepName": name})
    elif action == "step_end" and b.open_steps:
        name = draw(st.sampled_from(b.open_steps))
        b.open_steps.remove(name)
        b.emit({"type": "STEP_FINISHED", "stepName": name})
    elif action == "subagent_start":
        sub = b.new_id("sa")
        b.active_subagents.append(sub)
        b.emit({"type": "SUBAGENT_STARTED", "subagentRunId": sub, "name": "researcher"})
    elif action == "subagent_end" and b.active_subagents:
        sub = draw(st.sampled_from(b.active_subagents))
        b.active_subagents.remove(sub)
        if draw(st.booleans()):
            b.emit({"type": "SUBAGENT_FINISHED", "subagentRunId": sub})
        else:
            b.emit({"type": "SUBAGENT_ERROR", "subagentRunId": sub, "message": "failed"})
    elif action == "state_snapshot":
        b.state = {draw(KEYS): draw(JSON_SCALARS)}
        b.emit({"type": "STATE_SNAPSHOT", "snapshot": dict(b.state)})
    elif action == "state_delta":
        key = draw(KEYS)
        value = draw(JSON_SCALARS)
        if key in b.state and draw(st.booleans()):
            op: Event = {"op": "remove", "path": f"/{key}"}
            del b.state[key]
        else:
            op = {"op": "add", "path": f"/{key}", "value": value}
            b.state[key] = value
        b.emit({"type": "STATE_DELTA", "delta": [op]})
    elif action == "messages_snapshot":
        msg_id = b.new_id("s")
        b.message_ids.append(msg_id)
        b.emit(
            {
                "type": "MESSAGES_SNAPSHOT",
                "messages": [{"id": msg_id, "role": "assistant", "content": draw(TEXT)}],
            }
        )
    elif action == "activity_snapshot":
        msg_id = b.new_id("act")
        b.activities.append(msg_id)
        b.emit(
            {
                "type": "ACTIVITY_SNAPSHOT",
                "messageId": msg_id,
                "activityType": "PLAN",
                "content": {"steps": []},
            }
        )
    elif action == "activity_delta" and b.activities:
        msg_id = draw(st.sampled_from(b.activities))
        b.emit(
            {
                "type": "ACTIVITY_DELTA",
                "messageId": msg_id,
                "activityType": "PLAN",
                "patch": [{"op": "add", "path": "/steps/-", "value": draw(TEXT)}],
            }
        )
    elif action == "custom":
        b.emit({"type": "CUSTOM", "name": "note", "value": draw(JSON_SCALARS)})
    elif action == "encrypted" and b.message_ids:
        b.emit(
            {
                "type": "REASONING_ENCRYPTED_VALUE",
                "subtype": "message",
                "entityId": draw(st.sampled_from(b.message_ids)),
                "encryptedValue": "opaque",
            }
        )


@st.composite
def valid_streams(draw: st.DrawFn, max_actions: int = 60) -> list[Event]:
    """A valid AG-UI event stream that may stop mid-run."""
    builder = _StreamBuilder()
    actions = draw(st.lists(st.sampled_from(ACTIONS), max_size=max_actions))
    for action in ["run_start", *actions]:
        _step(draw, builder, action)
    return builder.events


async def collect(feed: Any, count: int) -> list[Any]:
    """The first *count* entries of a live feed."""
    got = []
    async for entry in feed:
        got.append(entry)
        if len(got) == count:
            break
    return got
