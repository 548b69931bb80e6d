"""Fold AG-UI events into the state of a thread, and render it back compactly.

:class:`ThreadState` is what a front end shows: the shared state document,
the message list (text, tool calls and results, reasoning, activity), the
runs of the thread with their lineage, and what is still streaming. It is
built the way the official TypeScript client's default reducer builds it
(``defaultApplyEvents`` in ``@ag-ui/client`` 1.0), on canonical wire dicts:

* STATE_SNAPSHOT replaces the state; STATE_DELTA applies an RFC 6902 JSON
  Patch (the ``jsonpatch`` library). A patch that fails raises
  :class:`~agui_hub.errors.PatchError` and leaves the state unchanged.
* TEXT_MESSAGE_*, TOOL_CALL_*, TOOL_CALL_RESULT and REASONING_* build
  messages; event metadata is merged into the message (or tool call) it
  targets; MESSAGES_SNAPSHOT merges by id; ACTIVITY_SNAPSHOT / ACTIVITY_DELTA
  update activity messages.
* ``*_CHUNK`` events are expanded on the way in (:mod:`agui_hub.chunks`).

:meth:`ThreadState.compact` renders the state as a short event sequence (run
markers, MESSAGES_SNAPSHOT, STATE_SNAPSHOT, and a re-opening event for each
item still streaming). Folding that sequence into a fresh state gives an equal
state, so a late viewer can be handed the compact sequence instead of every
token delta, and then continue with the live events.

Events are expected to be valid (see :func:`agui_hub.events.validate_wire`);
like the official client, the reducer ignores a continuation whose target
does not exist rather than failing (the sequence verifier rejects those
before they are stored).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import jsonpointer
from pydantic import BaseModel

from .chunks import ChunkExpander
from .errors import PatchError, ProtocolError
from .events import EventType, to_wire

__all__ = ["RunRecord", "RunStatus", "ThreadState", "fold"]

WireEvent = Mapping[str, Any]
Msg = dict[str, Any]

_CLIENT_METADATA_KEY = "@ag-ui/client"
_UNDECLARED = object()


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    ERROR = "error"


@dataclass
class RunRecord:
    """One run of the thread.

    ``started`` is the RUN_STARTED event without its ``input`` (the input's
    messages are folded into the message list); ``ended`` is the RUN_FINISHED
    or RUN_ERROR event as published (outcome, interrupts, usage, result).
    """

    run_id: str | None
    parent_run_id: str | None
    status: RunStatus
    started: dict[str, Any] | None = None
    ended: dict[str, Any] | None = None


@dataclass
class ThreadState:
    """The folded state of one thread. Feed events with :meth:`apply`."""

    state: Any = field(default_factory=dict)
    """The shared state document (STATE_SNAPSHOT / STATE_DELTA)."""
    messages: list[Msg] = field(default_factory=list)
    """Messages as canonical wire dicts, in conversation order."""
    runs: list[RunRecord] = field(default_factory=list)
    """Every run of the thread, oldest first; the lineage is in ``parent_run_id``."""
    open_messages: dict[str, Msg] = field(default_factory=dict)
    """Text messages still streaming: id -> their (START) attributes."""
    open_tool_calls: dict[str, Msg] = field(default_factory=dict)
    """Tool calls whose arguments are still streaming: id -> START attributes."""
    open_reasoning_messages: dict[str, Msg] = field(default_factory=dict)
    open_reasoning_spans: dict[str, Msg] = field(default_factory=dict)
    open_steps: dict[tuple[str | None, str], Msg] = field(default_factory=dict)
    """Steps still running, keyed by (subagentRunId, stepName)."""
    active_subagents: dict[str, Msg] = field(default_factory=dict)
    """Subagents started and not yet finished: id -> SUBAGENT_STARTED event."""
    rejected: list[ProtocolError] = field(default_factory=list, compare=False)
    """Errors met by :func:`fold` (e.g. patches that did not apply)."""
    _chunks: ChunkExpander = field(default_factory=ChunkExpander, compare=False, repr=False)
    # The message found by the last lookup: token deltas stream into one message
    # at a time, so this turns the O(n) scan into O(1) on the hot path. Reset
    # whenever a message object is replaced in the list.
    _recent: Msg | None = field(default=None, compare=False, repr=False)

    # -- queries ------------------------------------------------------------------

    @property
    def current_run(self) -> RunRecord | None:
        """The latest run, or ``None`` before the first one."""
        return self.runs[-1] if self.runs else None

    @property
    def run_active(self) -> bool:
        run = self.current_run
        return run is not None and run.status is RunStatus.RUNNING

    def message(self, message_id: str) -> Msg | None:
        """The first message with this id, or ``None``."""
        recent = self._recent
        if recent is not None and recent.get("id") == message_id:
            return recent
        for message in self.messages:
            if message.get("id") == message_id:
                self._recent = message
                return message
        return None

    # -- folding ------------------------------------------------------------------

    def apply(self, event: WireEvent | BaseModel) -> None:
        """Fold one event into the state.

        Raises :class:`~agui_hub.errors.PatchError` when a STATE_DELTA or
        ACTIVITY_DELTA does not apply (nothing changes), and
        :class:`~agui_hub.errors.ChunkError` for a chunk that cannot be expanded.
        """
        if isinstance(event, BaseModel):
            event = to_wire(event)
        for expanded in self._chunks.expand(event):
            handler = _HANDLERS.get(expanded.get("type"))  # type: ignore[arg-type]
            if handler is not None:
                handler(self, expanded)

    def flush(self) -> None:
        """End every chunk stream left open (the producer stopped mid-stream)."""
        for expanded in self._chunks.flush():
            _HANDLERS[expanded["type"]](self, expanded)

    # -- rendering ----------------------------------------------------------------

    def compact(self) -> list[dict[str, Any]]:
        """Render the state as a short event sequence that folds to an equal state.

        Layout: for every run, its RUN_STARTED and (when it ended) its
        RUN_FINISHED / RUN_ERROR; inside the latest started run, a
        MESSAGES_SNAPSHOT and a STATE_SNAPSHOT, then one opening event for
        each subagent, step, reasoning span, message and tool call still open,
        so the live events that follow continue them.
        """
        snapshot_at = max(
            (i for i, run in enumerate(self.runs) if run.started is not None), default=-1
        )
        out: list[dict[str, Any]] = []
        if snapshot_at < 0:
            out.extend(self._snapshots())
        for i, run in enumerate(self.runs):
            if run.started is not None:
                out.append(dict(run.started))
            if i == snapshot_at:
                out.extend(self._snapshots())
                out.extend(self._reopen())
            if run.ended is not None:
                out.append(dict(run.ended))
        return out

    def _snapshots(self) -> list[dict[str, Any]]:
        return [
            {"type": "MESSAGES_SNAPSHOT", "messages": [_own_message(m) for m in self.messages]},
            {"type": "STATE_SNAPSHOT", "snapshot": self.state},
        ]

    def _reopen(self) -> list[dict[str, Any]]:
        # A stream that chunks opened is reopened by a chunk (without content),
        # so that the chunks that continue it, which may leave out its id, still
        # find it. Last, since other events may end a chunk stream.
        chunked = set(self._chunks.open_streams.values())
        out: list[dict[str, Any]] = [dict(started) for started in self.active_subagents.values()]
        chunks: list[dict[str, Any]] = []
        out += [{"type": "STEP_STARTED", **attrs} for attrs in self.open_steps.values()]
        out += [{"type": "REASONING_START", **a} for a in self.open_reasoning_spans.values()]
        for kind, opener, chunk, key, open_now in (
            ("text", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CHUNK", "messageId", self.open_messages),
            ("tool", "TOOL_CALL_START", "TOOL_CALL_CHUNK", "toolCallId", self.open_tool_calls),
            ("reasoning", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CHUNK", "messageId",
             self.open_reasoning_messages),
        ):  # fmt: skip
            for attrs in open_now.values():
                event = {"type": opener, **attrs}
                if kind == "reasoning":
                    event["role"] = "reasoning"
                if (kind, attrs.get(key)) in chunked:
                    event["type"] = chunk
                    chunks.append(event)
                else:
                    out.append(event)
        return out + chunks

    def _close_everything(self) -> None:
        self.open_messages.clear()
        self.open_tool_calls.clear()
        self.open_reasoning_messages.clear()
        self.open_reasoning_spans.clear()
        self.open_steps.clear()
        self.active_subagents.clear()

    def _forget_removed(self) -> None:
        """Stop tracking streams whose message a snapshot removed.

        Their further deltas have nothing to apply to, in this state as in
        one rebuilt from :meth:`compact`.
        """
        ids = {m.get("id") for m in self.messages if m.get("role") != "activity"}
        for tracked in (self.open_messages, self.open_reasoning_messages):
            for message_id in [k for k in tracked if k not in ids]:
                del tracked[message_id]
        for call_id in [k for k in self.open_tool_calls if self._find_tool_call(k) is None]:
            del self.open_tool_calls[call_id]

    def _find_tool_call(self, tool_call_id: str) -> tuple[Msg, Msg] | None:
        for message in self.messages:
            for call in message.get("toolCalls") or ():
                if call.get("id") == tool_call_id:
                    return message, call
        return None


def fold(
    events: Iterable[WireEvent | BaseModel],
    state: ThreadState | None = None,
    *,
    flush: bool = False,
) -> ThreadState:
    """Fold *events* into *state* (a new one by default) and return it.

    Protocol errors (a patch that does not apply, a broken chunk) do not stop
    the fold: the event is skipped and the error kept in ``state.rejected``.
    With ``flush=True``, chunk streams still open at the end are ended, as if
    the producer had stopped; leave it off when more events may follow.
    """
    state = state if state is not None else ThreadState()
    for event in events:
        try:
            state.apply(event)
        except ProtocolError as exc:
            state.rejected.append(exc)
    if flush:
        state.flush()
    return state


# -- helpers ------------------------------------------------------------------------


def _attrs(event: WireEvent, *keys: str) -> Msg:
    """The given keys of *event* that are present, in that order."""
    return {key: event[key] for key in keys if key in event}


def _merge_metadata(target: Msg | None, event: WireEvent) -> None:
    if target is None or "metadata" not in event:
        return
    existing = target.get("metadata")
    incoming = event["metadata"]
    target["metadata"] = {**existing, **incoming} if existing else dict(incoming)


def _own_message(message: Mapping[str, Any]) -> Msg:
    """A copy of *message* that can be mutated without touching the original."""
    owned = dict(message)
    calls = owned.get("toolCalls")
    if calls is not None:
        owned["toolCalls"] = [{**c, "function": dict(c.get("function") or {})} for c in calls]
    return owned


def _apply_patch(document: Any, patch: Any) -> Any:
    try:
        return jsonpatch.apply_patch(document, patch, in_place=False)
    except (
        jsonpatch.JsonPatchException,
        jsonpointer.JsonPointerException,
        TypeError,
        KeyError,
        IndexError,
        ValueError,
        AttributeError,
    ) as exc:
        raise PatchError(f"JSON Patch does not apply: {exc}", patch=patch) from None


# -- handlers, one per event type ---------------------------------------------------------


def _text_start(ts: ThreadState, e: WireEvent, role_default: str) -> None:
    message_id = e["messageId"]
    message = ts.message(message_id)
    if message is not None and message.get("role") == "activity":
        return  # ids are unique across activity and streamed messages; ignore the reuse
    if message is None:
        message = {"id": message_id, "role": e.get("role", role_default), "content": ""}
        message.update(_attrs(e, "name", "subagentRunId"))
        ts.messages.append(message)
    _merge_metadata(message, e)


def _text_content(ts: ThreadState, e: WireEvent) -> None:
    message = ts.message(e["messageId"])
    if message is None or message.get("role") == "activity":
        return
    content = message.get("content")
    message["content"] = (content if isinstance(content, str) else "") + e["delta"]
    _merge_metadata(message, e)


def _text_end(ts: ThreadState, e: WireEvent) -> None:
    message = ts.message(e["messageId"])
    if message is not None and message.get("role") != "activity":
        _merge_metadata(message, e)


def on_text_message_start(ts: ThreadState, e: WireEvent) -> None:
    _text_start(ts, e, "assistant")
    message = ts.message(e["messageId"])
    if message is not None and message.get("role") != "activity":
        ts.open_messages[e["messageId"]] = {
            "messageId": e["messageId"],
            "role": message.get("role", "assistant"),
            **_attrs(e, "subagentRunId"),
        }


def on_text_message_end(ts: ThreadState, e: WireEvent) -> None:
    _text_end(ts, e)
    ts.open_messages.pop(e["messageId"], None)


def _tool_parent(ts: ThreadState, parent_id: str | None, tool_call_id: str) -> tuple[Msg, bool]:
    """The assistant message a new tool call attaches to, and whether it is new."""
    if parent_id is not None:
        existing = ts.message(parent_id)
        if existing is not None and existing.get("role") == "assistant":
            return existing, False
        new_id = tool_call_id if existing is not None else parent_id
    else:
        new_id = tool_call_id
    parent: Msg = {"id": new_id, "role": "assistant", "toolCalls": []}
    ts.messages.append(parent)
    return parent, True


def on_tool_call_start(ts: ThreadState, e: WireEvent) -> None:
    tool_call_id, name = e["toolCallId"], e["toolCallName"]
    found = ts._find_tool_call(tool_call_id)
    if found is not None:
        owner, call = found
        call["function"]["name"] = name
        _merge_metadata(call, e)
    else:
        owner, is_new = _tool_parent(ts, e.get("parentMessageId"), tool_call_id)
        if is_new and e.get("subagentRunId") is not None and "subagentRunId" not in owner:
            owner["subagentRunId"] = e["subagentRunId"]
        if owner.get("toolCalls") is None:
            owner["toolCalls"] = []
        call = {"id": tool_call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        owner["toolCalls"].append(call)
        _merge_metadata(call, e)
    ts.open_tool_calls[tool_call_id] = {
        "toolCallId": tool_call_id,
        "toolCallName": name,
        "parentMessageId": owner["id"],
        **_attrs(e, "subagentRunId"),
    }


def on_tool_call_args(ts: ThreadState, e: WireEvent) -> None:
    found = ts._find_tool_call(e["toolCallId"])
    if found is not None:
        call = found[1]
        call["function"]["arguments"] += e["delta"]
        _merge_metadata(call, e)


def on_tool_call_end(ts: ThreadState, e: WireEvent) -> None:
    found = ts._find_tool_call(e["toolCallId"])
    if found is not None:
        _merge_metadata(found[1], e)
    ts.open_tool_calls.pop(e["toolCallId"], None)


def on_tool_call_result(ts: ThreadState, e: WireEvent) -> None:
    tool_call_id = e["toolCallId"]
    message: Msg = {
        "id": e["messageId"],
        "toolCallId": tool_call_id,
        "role": e.get("role") or "tool",
        "content": e["content"],
        **_attrs(e, "subagentRunId"),
    }
    _merge_metadata(message, e)
    owner_index = next(
        (
            i
            for i, m in enumerate(ts.messages)
            if m.get("role") == "assistant"
            and any(c.get("id") == tool_call_id for c in m.get("toolCalls") or ())
        ),
        -1,
    )
    if owner_index < 0:
        ts.messages.append(message)
        return
    at = owner_index + 1
    while at < len(ts.messages) and ts.messages[at].get("role") == "tool":
        at += 1
    ts.messages.insert(at, message)


def on_state_snapshot(ts: ThreadState, e: WireEvent) -> None:
    ts.state = e["snapshot"]


def on_state_delta(ts: ThreadState, e: WireEvent) -> None:
    ts.state = _apply_patch(ts.state, e["delta"])


def _authoritative_activity_types(e: WireEvent) -> Any:
    """The activity types a MESSAGES_SNAPSHOT declares it owns (client metadata).

    ``_UNDECLARED`` when not declared, ``None`` for "all types", else a list.
    """
    metadata = e.get("metadata")
    if not isinstance(metadata, dict) or _CLIENT_METADATA_KEY not in metadata:
        return _UNDECLARED
    declared = metadata[_CLIENT_METADATA_KEY]
    if not isinstance(declared, dict):
        return []
    if "authoritativeActivityTypes" not in declared:
        return _UNDECLARED
    types = declared["authoritativeActivityTypes"]
    if types is None:
        return None
    if isinstance(types, list) and all(isinstance(t, str) for t in types):
        return types
    return []


def on_messages_snapshot(ts: ThreadState, e: WireEvent) -> None:
    incoming = [_own_message(m) for m in e["messages"]]
    by_id = {m["id"]: m for m in incoming}
    owned = _authoritative_activity_types(e)
    has_activity = any(m.get("role") == "activity" for m in incoming)
    has_reasoning = any(m.get("role") == "reasoning" for m in incoming)

    def preserved(m: Msg) -> bool:
        # Client-only messages the producer may not know about survive a snapshot
        # unless the snapshot declares itself authoritative for their kind.
        if m.get("role") == "activity":
            if isinstance(owned, list):
                return m.get("activityType") not in owned
            return owned is _UNDECLARED and not has_activity
        return m.get("role") == "reasoning" and not has_reasoning

    kept = [by_id.get(m.get("id"), m) for m in ts.messages if m.get("id") in by_id or preserved(m)]
    kept_ids = {m.get("id") for m in kept}
    kept += [m for m in incoming if m["id"] not in kept_ids]
    ts.messages = kept
    ts._recent = None
    ts._forget_removed()


def on_activity_snapshot(ts: ThreadState, e: WireEvent) -> None:
    message_id = e["messageId"]
    index = next((i for i, m in enumerate(ts.messages) if m.get("id") == message_id), -1)
    fresh: Msg = {
        "id": message_id,
        "role": "activity",
        "activityType": e["activityType"],
        "content": e["content"],
        **_attrs(e, "subagentRunId"),
    }
    replace = e.get("replace", True)
    target: Msg | None
    if index < 0:
        ts.messages.append(fresh)
        target = fresh
    elif ts.messages[index].get("role") == "activity":
        target = ts.messages[index]
        if replace:
            target = {**target, "activityType": e["activityType"], "content": e["content"]}
            target.pop("subagentRunId", None)
            target.update(_attrs(e, "subagentRunId"))
            ts.messages[index] = target
    elif replace:
        ts.messages[index] = target = fresh
        ts._forget_removed()
    else:
        target = None
    _merge_metadata(target, e)
    ts._recent = None


def on_activity_delta(ts: ThreadState, e: WireEvent) -> None:
    index = next((i for i, m in enumerate(ts.messages) if m.get("id") == e["messageId"]), -1)
    if index < 0 or ts.messages[index].get("role") != "activity":
        return
    current = ts.messages[index]
    content = _apply_patch(current.get("content") or {}, e["patch"])
    updated = {**current, "content": content, "activityType": e["activityType"]}
    _merge_metadata(updated, e)
    ts.messages[index] = updated
    ts._recent = None


def on_run_started(ts: ThreadState, e: WireEvent) -> None:
    ts._close_everything()
    started = {k: v for k, v in e.items() if k != "input"}
    ts.runs.append(
        RunRecord(
            run_id=e.get("runId"),
            parent_run_id=e.get("parentRunId"),
            status=RunStatus.RUNNING,
            started=started,
        )
    )
    run_input = e.get("input")
    if isinstance(run_input, dict):
        known = {m.get("id") for m in ts.messages}
        for message in run_input.get("messages") or ():
            if message.get("id") not in known:
                ts.messages.append(_own_message(message))
                known.add(message.get("id"))


def _end_run(ts: ThreadState, e: WireEvent, status: RunStatus) -> None:
    ts._close_everything()
    run = ts.current_run
    if run is not None and run.status is RunStatus.RUNNING:
        run.status = status
        run.ended = dict(e)
    else:
        ts.runs.append(
            RunRecord(run_id=e.get("runId"), parent_run_id=None, status=status, ended=dict(e))
        )


def on_run_finished(ts: ThreadState, e: WireEvent) -> None:
    _end_run(ts, e, RunStatus.FINISHED)


def on_run_error(ts: ThreadState, e: WireEvent) -> None:
    _end_run(ts, e, RunStatus.ERROR)


def on_step_started(ts: ThreadState, e: WireEvent) -> None:
    key = (e.get("subagentRunId"), e["stepName"])
    ts.open_steps[key] = _attrs(e, "stepName", "subagentRunId")


def on_step_finished(ts: ThreadState, e: WireEvent) -> None:
    ts.open_steps.pop((e.get("subagentRunId"), e["stepName"]), None)


def on_reasoning_start(ts: ThreadState, e: WireEvent) -> None:
    ts.open_reasoning_spans[e["messageId"]] = _attrs(e, "messageId", "subagentRunId")


def on_reasoning_end(ts: ThreadState, e: WireEvent) -> None:
    ts.open_reasoning_spans.pop(e["messageId"], None)


def on_reasoning_message_start(ts: ThreadState, e: WireEvent) -> None:
    _text_start(ts, {**e, "role": "reasoning"}, "reasoning")
    message = ts.message(e["messageId"])
    if message is not None and message.get("role") != "activity":
        ts.open_reasoning_messages[e["messageId"]] = _attrs(e, "messageId", "subagentRunId")


def on_reasoning_message_end(ts: ThreadState, e: WireEvent) -> None:
    _text_end(ts, e)
    ts.open_reasoning_messages.pop(e["messageId"], None)


def on_reasoning_encrypted_value(ts: ThreadState, e: WireEvent) -> None:
    if e["subtype"] == "tool-call":
        for message in ts.messages:
            if message.get("role") != "assistant":
                continue
            for call in message.get("toolCalls") or ():
                if call.get("id") == e["entityId"]:
                    call["encryptedValue"] = e["encryptedValue"]
                    return
        return
    target = ts.message(e["entityId"])
    if target is not None and target.get("role") != "activity":
        target["encryptedValue"] = e["encryptedValue"]


def on_subagent_started(ts: ThreadState, e: WireEvent) -> None:
    ts.active_subagents[e["subagentRunId"]] = dict(e)


def on_subagent_ended(ts: ThreadState, e: WireEvent) -> None:
    ts.active_subagents.pop(e["subagentRunId"], None)


def _ignore(ts: ThreadState, e: WireEvent) -> None:
    """RAW and CUSTOM events do not change the thread state."""


_HANDLERS: dict[str, Callable[[ThreadState, WireEvent], None]] = {
    EventType.TEXT_MESSAGE_START: on_text_message_start,
    EventType.TEXT_MESSAGE_CONTENT: _text_content,
    EventType.TEXT_MESSAGE_END: on_text_message_end,
    EventType.TOOL_CALL_START: on_tool_call_start,
    EventType.TOOL_CALL_ARGS: on_tool_call_args,
    EventType.TOOL_CALL_END: on_tool_call_end,
    EventType.TOOL_CALL_RESULT: on_tool_call_result,
    EventType.STATE_SNAPSHOT: on_state_snapshot,
    EventType.STATE_DELTA: on_state_delta,
    EventType.MESSAGES_SNAPSHOT: on_messages_snapshot,
    EventType.ACTIVITY_SNAPSHOT: on_activity_snapshot,
    EventType.ACTIVITY_DELTA: on_activity_delta,
    EventType.RAW: _ignore,
    EventType.CUSTOM: _ignore,
    EventType.RUN_STARTED: on_run_started,
    EventType.RUN_FINISHED: on_run_finished,
    EventType.RUN_ERROR: on_run_error,
    EventType.STEP_STARTED: on_step_started,
    EventType.STEP_FINISHED: on_step_finished,
    EventType.REASONING_START: on_reasoning_start,
    EventType.REASONING_MESSAGE_START: on_reasoning_message_start,
    EventType.REASONING_MESSAGE_CONTENT: _text_content,
    EventType.REASONING_MESSAGE_END: on_reasoning_message_end,
    EventType.REASONING_END: on_reasoning_end,
    EventType.REASONING_ENCRYPTED_VALUE: on_reasoning_encrypted_value,
    EventType.SUBAGENT_STARTED: on_subagent_started,
    EventType.SUBAGENT_FINISHED: on_subagent_ended,
    EventType.SUBAGENT_ERROR: on_subagent_ended,
}
