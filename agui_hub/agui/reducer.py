"""Fold AG-UI events into the state of a thread, and render it back compactly.

:class:`ThreadState` is what a front end shows: the shared state document,
the message list (text, tool calls and results, reasoning, activity), the
runs of the thread with their lineage, and what is still streaming. It is
built the way the official TypeScript client's default reducer builds it
(``defaultApplyEvents`` in ``@ag-ui/client`` 1.0), on canonical wire dicts:

* STATE_SNAPSHOT replaces the state; STATE_DELTA applies an RFC 6902 JSON
  Patch (add, remove, replace, move, copy, test; RFC 6901 pointers). A patch
  that fails raises :class:`~agui_hub.errors.PatchError` and leaves the state
  unchanged.
* TEXT_MESSAGE_*, TOOL_CALL_*, TOOL_CALL_RESULT and REASONING_* build
  messages; event metadata is merged into the message (or tool call) it
  targets; MESSAGES_SNAPSHOT merges by id; ACTIVITY_SNAPSHOT / ACTIVITY_DELTA
  update activity messages.
* ``*_CHUNK`` events are expanded on the way in (:mod:`agui_hub.agui.chunks`).

:meth:`ThreadState.compact` renders the state as a short event sequence (run
markers, MESSAGES_SNAPSHOT, STATE_SNAPSHOT, and a re-opening event for each
item still streaming). Folding that sequence into a fresh state gives an equal
state, so a late viewer can be handed the compact sequence instead of every
token delta, and then continue with the live events.

Bounded cost
------------
A relay folds every thread it serves in one process, so no event may cost
more than its share:

* :class:`~agui_hub.agui.patch.StateLimits` bound the state document and
  each activity message's content (nesting depth, approximate encoded bytes).
  A STATE_SNAPSHOT, STATE_DELTA, ACTIVITY_SNAPSHOT or ACTIVITY_DELTA that
  would exceed them raises :class:`~agui_hub.errors.LimitExceeded` and
  changes nothing.
* A JSON Patch is applied in place, with an undo log for a patch that fails
  half-way (:mod:`agui_hub.agui.patch`): its cost is that of its operations,
  not of the document, and the work it does on values the state holds
  already is bounded per event (``FOLD_WORK_FACTOR`` times
  :attr:`~agui_hub.agui.patch.StateLimits.max_work`): past it the event is
  refused with :class:`~agui_hub.errors.LimitExceeded`, so that a fold never
  stalls on one event (:attr:`ThreadState.work` counts what was spent).
  Values are shared, not copied (copy-on-write), so ``copy`` costs nothing
  until the copy changes, and
  :meth:`~ThreadState.compact` hands out the documents without copying them.
* Messages and tool calls are found through indexes by id; token deltas are
  collected and joined when the message is read, not concatenated one by one
  (:class:`~agui_hub.agui.messages.MessageList`).

So folding costs about the same per event in a thread of a hundred events
and in one of a hundred thousand (``bench/bench_fold.py``).

Events are expected to be valid (see :func:`agui_hub.agui.events.validate_wire`);
like the official client, the reducer ignores a continuation whose target
does not exist rather than failing (the sequence verifier rejects those
before they are stored). A malformed event (from a producer that wrote to the
store directly) raises :class:`~agui_hub.errors.InvalidEvent` and changes
nothing, never KeyError or TypeError.

:class:`~agui_hub.agui.documents.StateDocuments` is the part of the fold that
judges STATE_* and ACTIVITY_* events, on its own: what a writer keeps per
thread to refuse, before storing, a delta that does not apply or that would
exceed the limits.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..errors import InvalidEvent, ProtocolError
from .chunks import ChunkExpander
from .events import EventType, to_wire
from .messages import (
    INDEXED_IDS,
    MessageList,
    Msg,
    WireEvent,
    input_messages,
    own_message,
    snapshot_keeps,
)
from .patch import (
    DEFAULT_LIMITS,
    FOLD_WORK_FACTOR,
    Document,
    StateLimits,
    UndoLog,
    WorkBudget,
    adopted_document,
    apply_patch,
    snapshot_document,
)

__all__ = [
    "DEFAULT_LIMITS",
    "IGNORED_TYPES",
    "MALFORMED_EVENT_ERRORS",
    "RunRecord",
    "RunStatus",
    "StateLimits",
    "ThreadState",
    "fold",
    "malformed_event",
]
# StateLimits and DEFAULT_LIMITS live in .patch, which enforces them; they are
# exported here too, as what ThreadState(limits=...) takes.

MALFORMED_EVENT_ERRORS = (KeyError, TypeError, AttributeError, ValueError, IndexError)
"""What folding an event that is not a valid AG-UI event may raise (a missing
field, a field of the wrong type): the fold turns them into InvalidEvent."""
_CHUNKS = frozenset({"TEXT_MESSAGE_CHUNK", "TOOL_CALL_CHUNK", "REASONING_MESSAGE_CHUNK"})


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    ERROR = "error"


@dataclass
class RunRecord:
    """One run of the thread.

    ``started`` is the RUN_STARTED event as published for the thread's latest
    run, its ``input`` included (for snapshots) but for the input's messages,
    which are folded into the message list; without ``input`` for earlier runs; ``ended`` is
    the RUN_FINISHED or RUN_ERROR event as published (outcome, interrupts,
    usage, result).
    """

    run_id: str | None
    parent_run_id: str | None
    status: RunStatus
    started: dict[str, Any] | None = None
    ended: dict[str, Any] | None = None


# -- the thread state ------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class ThreadState:
    """The folded state of one thread. Feed events with :meth:`apply`.

    ``state`` and ``messages`` are the live state: read them, do not change
    them in place (assign ``messages`` a new list to replace it). What
    :meth:`compact` returns does not change as more events are applied.
    *limits* bound the state document and activity contents (see
    :class:`~agui_hub.agui.patch.StateLimits`). Two states are equal when
    their state documents, messages, runs and open items are.
    """

    state: Any = field(default_factory=dict)
    """The shared state document (STATE_SNAPSHOT / STATE_DELTA)."""
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
    rejected: list[ProtocolError] = field(default_factory=list)
    """Errors met by :func:`fold` (e.g. patches that did not apply)."""
    limits: StateLimits = field(default=DEFAULT_LIMITS, compare=False, repr=False)
    """Bounds on the state document and on each activity message's content."""
    _chunks: ChunkExpander = field(default_factory=ChunkExpander, init=False)
    _messages: MessageList = field(default_factory=MessageList, init=False)
    _doc: Document | None = field(default=None, init=False)
    """The state document with its running size (``None`` until it is patched)."""
    _activity: dict[Any, Document] = field(default_factory=dict, init=False)
    """The documents of activity messages' contents, by message id."""
    _exposed: int = field(default=0, init=False)
    """Bumped by compact(): documents handed out are shared from then on."""
    work: int = field(default=0, init=False)
    """Work units spent on the documents so far (see
    :class:`~agui_hub.agui.patch.WorkBudget`): a caller folding many events
    lets other tasks run when it has grown by enough."""
    _work: WorkBudget | None = field(default=None, init=False)
    """The budget of the event being folded."""

    # -- queries ------------------------------------------------------------------

    @property
    def messages(self) -> list[Msg]:
        """Messages as canonical wire dicts, in conversation order."""
        return self._messages.items

    @messages.setter
    def messages(self, messages: list[Msg]) -> None:
        self._messages.replace_all(messages)
        self._forget_orphan_activity()

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
        return self._messages.get(message_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ThreadState):
            return NotImplemented
        return self._compared() == other._compared()

    __hash__ = None  # type: ignore[assignment]

    def _compared(self) -> tuple[Any, ...]:
        return (
            self.state,
            self.messages,
            self.runs,
            self.open_messages,
            self.open_tool_calls,
            self.open_reasoning_messages,
            self.open_reasoning_spans,
            self.open_steps,
            self.active_subagents,
        )

    def __getstate__(self) -> dict[str, Any]:
        # For copy.deepcopy and pickle: ownership is by id(), so a copy starts
        # with none (the message list drops its own id()-keyed hints).
        self._exposed += 1
        return self.__dict__.copy()

    def __repr__(self) -> str:
        return (
            f"ThreadState(state={self.state!r}, messages={self.messages!r}, runs={self.runs!r}, "
            f"open_messages={self.open_messages!r}, open_tool_calls={self.open_tool_calls!r}, "
            f"open_reasoning_messages={self.open_reasoning_messages!r}, "
            f"open_reasoning_spans={self.open_reasoning_spans!r}, "
            f"open_steps={self.open_steps!r}, active_subagents={self.active_subagents!r}, "
            f"rejected={self.rejected!r})"
        )

    # -- folding ------------------------------------------------------------------

    def apply(self, event: WireEvent | BaseModel) -> None:
        """Fold one event into the state.

        Raises, leaving the state unchanged:
        :class:`~agui_hub.errors.PatchError` when a STATE_DELTA or
        ACTIVITY_DELTA does not apply; :class:`~agui_hub.errors.LimitExceeded`
        when a STATE_SNAPSHOT, STATE_DELTA, ACTIVITY_SNAPSHOT or ACTIVITY_DELTA
        would exceed :attr:`limits` (a delta also when it costs more than
        ``FOLD_WORK_FACTOR * limits.max_work``); :class:`~agui_hub.errors.ChunkError` for
        a chunk that cannot be expanded; :class:`~agui_hub.errors.InvalidEvent`
        for an event that is not a valid AG-UI event (e.g. without a field its
        type requires; a chunk stream such an event ends is ended all the
        same). Nothing else, whatever the event.
        """
        if isinstance(event, BaseModel):
            event = to_wire(event)
        elif not isinstance(event, Mapping):
            raise InvalidEvent(f"an event is an object, not {type(event).__name__}")
        if "metadata" in event and not isinstance(event["metadata"], dict):
            # Checked first: handlers merge metadata last, after their changes.
            raise malformed_event(event, TypeError("metadata is not an object"))
        chunk = isinstance(event.get("type"), str) and event["type"] in _CHUNKS
        if chunk and not isinstance(event.get("delta", ""), str):
            raise malformed_event(event, TypeError("delta is not a string"))
        try:
            expanded_events = self._chunks.expand(event)
        except ProtocolError:
            raise
        except MALFORMED_EVENT_ERRORS as exc:
            raise malformed_event(event, exc) from None
        work = self._work = WorkBudget(FOLD_WORK_FACTOR * self.limits.max_work)
        try:
            for expanded in expanded_events:
                handler = _HANDLERS.get(expanded.get("type"))  # type: ignore[arg-type]
                if handler is None:
                    continue
                try:
                    handler(self, expanded)
                except ProtocolError:
                    raise
                except MALFORMED_EVENT_ERRORS as exc:
                    raise malformed_event(expanded, exc) from None
        finally:
            self.work += work.spent
            self._work = None

    def flush(self) -> None:
        """End every chunk stream left open (the producer stopped mid-stream)."""
        for expanded in self._chunks.flush():
            _HANDLERS[expanded["type"]](self, expanded)

    # -- rendering ----------------------------------------------------------------

    def compact(self, *, share_messages: bool = False) -> list[dict[str, Any]]:
        """Render the state as a short event sequence that folds to an equal state.

        Layout: for every run, its RUN_STARTED and (when it ended) its
        RUN_FINISHED / RUN_ERROR; inside the latest started run, a
        MESSAGES_SNAPSHOT and a STATE_SNAPSHOT, then one opening event for
        each subagent, step, reasoning span, message and tool call still open,
        so the live events that follow continue them.

        The sequence shares the state document and activity contents with
        this state (nothing is copied); later events change copies of what
        they touch, never what was returned. The messages are copies, since
        later events change messages in place; pass *share_messages* to get
        this state's own message dicts instead, when the sequence is encoded
        before another event is applied (a checkpoint, a snapshot frame): its
        encoding is the same for a state built by folding events, without a
        copy of every message.
        """
        self._exposed += 1
        snapshot_at = max(
            (i for i, run in enumerate(self.runs) if run.started is not None), default=-1
        )
        out: list[dict[str, Any]] = []
        if snapshot_at < 0:
            out.extend(self._snapshots(share_messages))
        for i, run in enumerate(self.runs):
            if run.started is not None:
                out.append(dict(run.started))
            if i == snapshot_at:
                out.extend(self._snapshots(share_messages))
                out.extend(self._reopen())
            if run.ended is not None:
                out.append(dict(run.ended))
        return out

    def _snapshots(self, share_messages: bool) -> list[dict[str, Any]]:
        # A folded message went through own_message (or was built in its
        # shape), so its copy encodes exactly as it does: sharing it changes
        # nothing on the wire. (A list assigned to ``messages`` is taken as is.)
        messages = self.messages
        return [
            {
                "type": "MESSAGES_SNAPSHOT",
                "messages": list(messages)
                if share_messages
                else [own_message(m) for m in messages],
            },
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
                if (kind, attrs.get(key)) in chunked:
                    # A chunk has exactly the fields of its type in AG-UI 1.0
                    # (REASONING_MESSAGE_CHUNK has no role): nothing extra.
                    event["type"] = chunk
                    chunks.append(event)
                else:
                    if kind == "reasoning":
                        event["role"] = "reasoning"
                    out.append(event)
        return out + chunks

    # -- internals ----------------------------------------------------------------

    def _close_everything(self) -> None:
        self.open_messages.clear()
        self.open_tool_calls.clear()
        self.open_reasoning_messages.clear()
        self.open_reasoning_spans.clear()
        self.open_steps.clear()
        self.active_subagents.clear()

    def _messages_replaced(self) -> None:
        """Follow a snapshot that replaced messages: forget what they took along."""
        self._forget_orphan_activity()
        self._forget_removed()

    def _forget_orphan_activity(self) -> None:
        """Drop the documents of activity messages that are no longer in the list."""
        by_id = self._messages.by_id
        for message_id in [k for k in self._activity if k not in by_id]:
            del self._activity[message_id]

    def _forget_removed(self) -> None:
        """Stop tracking streams whose message a snapshot removed.

        Their further deltas have nothing to apply to, in this state as in
        one rebuilt from :meth:`compact`.
        """
        ids = self._messages.ids()
        for tracked in (self.open_messages, self.open_reasoning_messages):
            for message_id in [k for k in tracked if k not in ids]:
                del tracked[message_id]
        calls = self._messages.calls
        for call_id, opened in list(self.open_tool_calls.items()):
            found = calls.get(call_id)
            if found is None:
                del self.open_tool_calls[call_id]
            else:
                # The snapshot may hold the call under another message than the one
                # it was started in: further args go there, and a reopener says so.
                opened["parentMessageId"] = found[0]["id"]

    def _state_doc(self) -> Document:
        doc = self._doc
        if doc is None or doc.root is not self.state:
            doc = self._doc = adopted_document(self.state)  # the state was assigned from outside
        if doc.gen != self._exposed:
            doc.owned.clear()
            doc.gen = self._exposed
        return doc

    def _activity_doc(self, message: Msg) -> Document:
        message_id = message.get("id")
        content = message.get("content") or {}
        doc = self._activity.get(message_id)
        if doc is None or doc.root is not content:
            doc = self._activity[message_id] = adopted_document(content)
        if doc.gen != self._exposed:
            doc.owned.clear()
            doc.gen = self._exposed
        return doc


def fold(
    events: Iterable[WireEvent | BaseModel],
    state: ThreadState | None = None,
    *,
    flush: bool = False,
    limits: StateLimits | None = None,
) -> ThreadState:
    """Fold *events* into *state* (a new one by default, with *limits*) and return it.

    Protocol errors (a patch that does not apply, a limit exceeded, a broken
    chunk) do not stop the fold: the event is skipped and the error kept in
    ``state.rejected``. With ``flush=True``, chunk streams still open at the
    end are ended, as if the producer had stopped; leave it off when more
    events may follow.
    """
    if state is None:
        state = ThreadState(limits=limits) if limits is not None else ThreadState()
    for event in events:
        try:
            state.apply(event)
        except ProtocolError as exc:
            state.rejected.append(exc)
    if flush:
        state.flush()
    return state


# -- helpers ------------------------------------------------------------------------


def malformed_event(event: WireEvent, exc: BaseException) -> InvalidEvent:
    """The InvalidEvent to raise for *event*, whose fold failed with *exc* (one of
    :data:`MALFORMED_EVENT_ERRORS`): it names the event type and what is wrong."""
    event_type = event.get("type")
    detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
    return InvalidEvent(
        f"{event_type or 'event'} cannot be folded: {detail or type(exc).__name__}",
        event_type=event_type if isinstance(event_type, str) else None,
    )


def _attrs(event: WireEvent, *keys: str) -> Msg:
    """The given keys of *event* that are present, in that order."""
    return {key: event[key] for key in keys if key in event}


def _merge_metadata(target: Msg | None, event: WireEvent) -> None:
    if target is None or "metadata" not in event:
        return
    existing = target.get("metadata")
    incoming = event["metadata"]
    if isinstance(existing, dict) and existing:
        target["metadata"] = {**existing, **incoming}
    else:
        target["metadata"] = dict(incoming)


# -- handlers, one per event type ---------------------------------------------------------


def _text_start(ts: ThreadState, e: WireEvent, role_default: str) -> None:
    message_id = e["messageId"]
    message = ts._messages.by_id.get(message_id)
    if message is not None and message.get("role") == "activity":
        return  # ids are unique across activity and streamed messages; ignore the reuse
    if message is None:
        message = {"id": message_id, "role": e.get("role", role_default), "content": ""}
        message.update(_attrs(e, "name", "subagentRunId"))
        ts._messages.append(message)
    _merge_metadata(message, e)


def _text_content(ts: ThreadState, e: WireEvent) -> None:
    message = ts._messages.by_id.get(e["messageId"])
    delta = e["delta"]
    if message is None or message.get("role") == "activity":
        return
    if not isinstance(delta, str):
        raise TypeError("delta is not a string")
    ts._messages.append_text(message, "content", delta)
    _merge_metadata(message, e)


def _text_end(ts: ThreadState, e: WireEvent) -> None:
    message = ts._messages.by_id.get(e["messageId"])
    if message is not None and message.get("role") != "activity":
        _merge_metadata(message, e)


def on_text_message_start(ts: ThreadState, e: WireEvent) -> None:
    _text_start(ts, e, "assistant")
    message = ts._messages.by_id.get(e["messageId"])
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
        existing = ts._messages.by_id.get(parent_id)
        if existing is not None and existing.get("role") == "assistant":
            return existing, False
        new_id = tool_call_id if existing is not None else parent_id
    else:
        new_id = tool_call_id
    parent: Msg = {"id": new_id, "role": "assistant", "toolCalls": []}
    ts._messages.append(parent)
    return parent, True


def on_tool_call_start(ts: ThreadState, e: WireEvent) -> None:
    tool_call_id, name = e["toolCallId"], e["toolCallName"]
    found = ts._messages.calls.get(tool_call_id)
    if found is not None:
        owner, call = found
        call["function"]["name"] = name
        _merge_metadata(call, e)
    else:
        owner, is_new = _tool_parent(ts, e.get("parentMessageId"), tool_call_id)
        if is_new and e.get("subagentRunId") is not None and "subagentRunId" not in owner:
            owner["subagentRunId"] = e["subagentRunId"]
        call = {"id": tool_call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        ts._messages.add_tool_call(owner, call)
        _merge_metadata(call, e)
    ts.open_tool_calls[tool_call_id] = {
        "toolCallId": tool_call_id,
        "toolCallName": name,
        "parentMessageId": owner["id"],
        **_attrs(e, "subagentRunId"),
    }


def on_tool_call_args(ts: ThreadState, e: WireEvent) -> None:
    found = ts._messages.calls.get(e["toolCallId"])
    delta = e["delta"]
    if found is not None:
        call = found[1]
        if not isinstance(delta, str):
            raise TypeError("delta is not a string")
        ts._messages.append_text(call["function"], "arguments", delta)
        _merge_metadata(call, e)


def on_tool_call_end(ts: ThreadState, e: WireEvent) -> None:
    found = ts._messages.calls.get(e["toolCallId"])
    if found is not None:
        _merge_metadata(found[1], e)
    ts.open_tool_calls.pop(e["toolCallId"], None)


def on_tool_call_result(ts: ThreadState, e: WireEvent) -> None:
    tool_call_id = e["toolCallId"]
    if not isinstance(e["messageId"], INDEXED_IDS):
        raise TypeError("messageId is not a string")
    message: Msg = {
        "id": e["messageId"],
        "toolCallId": tool_call_id,
        "role": e.get("role") or "tool",
        "content": e["content"],
        **_attrs(e, "subagentRunId"),
    }
    _merge_metadata(message, e)
    found = ts._messages.assistant_calls.get(tool_call_id)
    if found is None:
        ts._messages.append(message)
    else:
        ts._messages.insert_after_results(found[0], message)


def on_state_snapshot(ts: ThreadState, e: WireEvent) -> None:
    doc = snapshot_document(e["snapshot"], ts.limits, "STATE_SNAPSHOT", "the state")
    doc.gen = ts._exposed
    ts.state = doc.root
    ts._doc = doc


def on_state_delta(ts: ThreadState, e: WireEvent) -> None:
    delta = e["delta"]
    doc = ts._state_doc()
    undo = UndoLog()
    try:
        apply_patch(doc, delta, ts.limits, undo, "STATE_DELTA", "the state", ts._work)
    except BaseException:
        undo.rollback()
        raise
    ts.state = doc.root


def on_messages_snapshot(ts: ThreadState, e: WireEvent) -> None:
    incoming = [own_message(m) for m in e["messages"]]
    by_id = {m["id"]: m for m in incoming}
    preserved = snapshot_keeps(e, incoming)
    current = ts._messages.items
    kept = [by_id.get(m.get("id"), m) for m in current if m.get("id") in by_id or preserved(m)]
    kept_ids = {m.get("id") for m in kept}
    kept += [m for m in incoming if m["id"] not in kept_ids]
    ts._messages.replace_all(kept)
    ts._messages_replaced()


def on_activity_snapshot(ts: ThreadState, e: WireEvent) -> None:
    message_id = e["messageId"]
    activity_type, content = e["activityType"], e["content"]
    existing = ts._messages.by_id.get(message_id)
    replace = e.get("replace", True)
    doc = None
    if existing is None or replace:  # the content goes into the state
        doc = snapshot_document(content, ts.limits, "ACTIVITY_SNAPSHOT", "the activity content")
        doc.gen = ts._exposed
    fresh: Msg = {
        "id": message_id,
        "role": "activity",
        "activityType": activity_type,
        "content": content,
        **_attrs(e, "subagentRunId"),
    }
    target: Msg | None
    if existing is None:
        ts._messages.append(fresh)
        target = fresh
    elif existing.get("role") == "activity":
        target = existing
        if replace:
            target["activityType"] = activity_type
            target["content"] = content
            target.pop("subagentRunId", None)
            target.update(_attrs(e, "subagentRunId"))
    elif replace:
        ts._messages.replace(existing, fresh)
        ts._messages_replaced()
        target = fresh
    else:
        target = None
    if doc is not None and target is not None:
        ts._activity[message_id] = doc
    _merge_metadata(target, e)


def on_activity_delta(ts: ThreadState, e: WireEvent) -> None:
    patch, activity_type = e["patch"], e["activityType"]
    current = ts._messages.by_id.get(e["messageId"])
    if current is None or current.get("role") != "activity":
        return
    doc = ts._activity_doc(current)
    undo = UndoLog()
    try:
        apply_patch(doc, patch, ts.limits, undo, "ACTIVITY_DELTA", "the activity content", ts._work)
    except BaseException:
        undo.rollback()
        raise
    current["content"] = doc.root
    current["activityType"] = activity_type
    _merge_metadata(current, e)


def on_run_started(ts: ThreadState, e: WireEvent) -> None:
    new_messages = input_messages(e)  # first: a malformed input changes nothing
    ts._close_everything()
    # The latest run keeps its input (tools, context, forwarded props: what a
    # late joiner's snapshot must carry); earlier runs drop theirs, so that a
    # long thread does not hold every run's input.
    for earlier in ts.runs:
        if earlier.started is not None and "input" in earlier.started:
            earlier.started = {k: v for k, v in earlier.started.items() if k != "input"}
    started = dict(e)
    run_input = started.get("input")
    if isinstance(run_input, dict) and run_input.get("messages"):
        # Its messages are kept once, in the message list (and in a snapshot's
        # MESSAGES_SNAPSHOT, in the thread's order): not twice.
        started["input"] = {**run_input, "messages": []}
    ts.runs.append(
        RunRecord(
            run_id=e.get("runId"),
            parent_run_id=e.get("parentRunId"),
            status=RunStatus.RUNNING,
            started=started,
        )
    )
    for message in new_messages:
        if message.get("id") not in ts._messages.by_id:
            ts._messages.append(message)


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
    message = ts._messages.by_id.get(e["messageId"])
    if message is not None and message.get("role") != "activity":
        ts.open_reasoning_messages[e["messageId"]] = _attrs(e, "messageId", "subagentRunId")


def on_reasoning_message_end(ts: ThreadState, e: WireEvent) -> None:
    _text_end(ts, e)
    ts.open_reasoning_messages.pop(e["messageId"], None)


def on_reasoning_encrypted_value(ts: ThreadState, e: WireEvent) -> None:
    entity_id, value = e["entityId"], e["encryptedValue"]
    if e["subtype"] == "tool-call":
        found = ts._messages.assistant_calls.get(entity_id)
        if found is not None:
            found[1]["encryptedValue"] = value
        return
    target = ts._messages.by_id.get(entity_id)
    if target is not None and target.get("role") != "activity":
        target["encryptedValue"] = value


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

IGNORED_TYPES = frozenset(kind for kind, handler in _HANDLERS.items() if handler is _ignore)
"""Event types the fold leaves the state unchanged for (RAW, CUSTOM): their
values never reach a snapshot."""
