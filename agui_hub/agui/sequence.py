"""Per-thread verification of the AG-UI 1.0 event order, on the server side.

A :class:`SequenceVerifier` holds the protocol state of one thread (is a run
active, which messages, tool calls, reasoning spans and messages, steps and
subagents are open, and who owns each entity) and decides for every event
whether it may come next. The rules are those of ``verifyEvents`` in the
official TypeScript client 1.0, so a stream this verifier accepts is one that
client accepts too.

* :meth:`SequenceVerifier.check` answers "may this event come next?" without
  changing anything;
* :meth:`SequenceVerifier.verify` checks and then records the event; a
  rejected event records nothing, so the producer may send a corrected one;
* :meth:`SequenceVerifier.from_events` rebuilds the state from a stored stream.

Input is the canonical wire dict of an event (camelCase keys, as returned by
:func:`agui_hub.agui.events.validate_wire`); any pydantic event model is converted
first. The verifier trusts the event's shape (that is the job of
:mod:`agui_hub.agui.events`), except that an id it keys on must be a string.

Ownership (subagent attribution)
--------------------------------

An entity (text message, tool call, reasoning span or message, activity) is
owned by the ``subagentRunId`` of the event that first opened it, or by the
parent agent when that event had none. An owner is kept for the rest of the
run, also after the entity closed. A later event that names the entity and
carries a ``subagentRunId`` must agree with the owner; an event without the
tag always agrees. Tags are not required to name a subagent started with
SUBAGENT_STARTED, so attribution-only producers stay valid. A tool call with
``parentMessageId`` belongs to that message's owner. MESSAGES_SNAPSHOT (which
replaces owners) and the messages echoed in RUN_STARTED's ``input`` (which
only fill in unknown ids) record owners as well. Steps are keyed by owner and
name, so a subagent may run a step named like one of its parent's.

``subagentRunId: null`` counts as absent, as :func:`~agui_hub.agui.events.validate_wire`
drops it.

Chunk events
------------

The TypeScript client expands TEXT_MESSAGE_CHUNK, TOOL_CALL_CHUNK and
REASONING_MESSAGE_CHUNK into start / content / end events before it verifies,
so raw chunks never reach its verifier. This verifier accepts a raw chunk event
whenever a run is active and does no pairing or ownership check on it. For
full checking, expand chunks with :mod:`agui_hub.agui.chunks` first and verify the
expanded events.

Rules
-----

Every rejection raises :class:`~agui_hub.errors.SequenceError` whose ``rule``
is one of these names (also in :data:`RULES`):

================================  ================================================================
rule                              meaning
================================  ================================================================
``malformed_event``               the event has no string ``type`` or lacks an id it is keyed by
``run_not_started``               the first event of the thread is not RUN_STARTED or RUN_ERROR
``run_already_active``            RUN_STARTED while a run is still active
``run_already_finished``          after RUN_FINISHED, an event other than RUN_STARTED / RUN_ERROR
``run_already_errored``           after RUN_ERROR, an event other than RUN_STARTED
``run_finished_with_open_items``  RUN_FINISHED while something is still open
``message_already_open``          TEXT_MESSAGE_START for a text message that is open
``message_not_open``              TEXT_MESSAGE_CONTENT / END for a text message that is not open
``tool_call_already_open``        TOOL_CALL_START for a tool call that is open
``tool_call_not_open``            TOOL_CALL_ARGS / END for a tool call that is not open
``reasoning_already_open``        REASONING_MESSAGE_START for a reasoning message that is open
``reasoning_not_open``            REASONING_MESSAGE_CONTENT / END for one that is not open
``reasoning_span_already_open``   REASONING_START for a reasoning span that is open
``reasoning_span_not_open``       REASONING_END for a reasoning span that is not open
``step_already_active``           STEP_STARTED for a step this owner has open
``step_not_active``               STEP_FINISHED for a step no owner has open
``subagent_duplicate``            SUBAGENT_STARTED for an id already started in this run
``subagent_not_active``           SUBAGENT_FINISHED / ERROR for a subagent that is not active
``subagent_parent_unknown``       SUBAGENT_STARTED whose parentSubagentRunId was never started
``attribution_mismatch``          the event's subagentRunId disagrees with the entity's owner
================================  ================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from pydantic import BaseModel

from ..errors import SequenceError
from .events import parse_event, to_wire

__all__ = ["RULES", "SequenceVerifier"]

RULES: Final[frozenset[str]] = frozenset(
    {
        "malformed_event",
        "run_not_started",
        "run_already_active",
        "run_already_finished",
        "run_already_errored",
        "run_finished_with_open_items",
        "message_already_open",
        "message_not_open",
        "tool_call_already_open",
        "tool_call_not_open",
        "reasoning_already_open",
        "reasoning_not_open",
        "reasoning_span_already_open",
        "reasoning_span_not_open",
        "step_already_active",
        "step_not_active",
        "subagent_duplicate",
        "subagent_not_active",
        "subagent_parent_unknown",
        "attribution_mismatch",
    }
)
"""The name of every rule :class:`SequenceVerifier` enforces."""

Wire = dict[str, Any]
Owner = str | None
"""Who owns an entity: a subagentRunId, or ``None`` for the parent agent."""

# Run states.
_IDLE: Final = 0  # nothing seen yet
_ACTIVE: Final = 1  # between RUN_STARTED and RUN_FINISHED / RUN_ERROR
_FINISHED: Final = 2  # the last run ended with RUN_FINISHED
_ERRORED: Final = 3  # the last run ended with RUN_ERROR


@dataclass(frozen=True, slots=True)
class _Kind:
    """Names used in the checks and messages of one start / end paired entity."""

    label: str
    id_key: str
    start: str
    end: str
    already_rule: str
    not_open_rule: str


_TEXT = _Kind(
    "text message",
    "messageId",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_END",
    "message_already_open",
    "message_not_open",
)
_TOOL = _Kind(
    "tool call",
    "toolCallId",
    "TOOL_CALL_START",
    "TOOL_CALL_END",
    "tool_call_already_open",
    "tool_call_not_open",
)
_REASONING = _Kind(
    "reasoning message",
    "messageId",
    "REASONING_MESSAGE_START",
    "REASONING_MESSAGE_END",
    "reasoning_already_open",
    "reasoning_not_open",
)
_SPAN = _Kind(
    "reasoning span",
    "messageId",
    "REASONING_START",
    "REASONING_END",
    "reasoning_span_already_open",
    "reasoning_span_not_open",
)


def _who(owner: Owner) -> str:
    return "the parent agent" if owner is None else f"subagent {owner!r}"


def _quoted(ids: Iterable[str]) -> str:
    return ", ".join(repr(i) for i in ids)


def _as_wire(event: Any) -> Wire:
    if type(event) is dict:
        return event
    if isinstance(event, BaseModel):
        # parse_event leaves our own models as they are and re-validates others
        # (e.g. ag_ui.core events), so to_wire gives the canonical form.
        return to_wire(parse_event(event))
    if isinstance(event, Mapping):
        return dict(event)
    raise TypeError(
        f"an AG-UI event must be a wire dict or a pydantic model, got {type(event).__name__}"
    )


class SequenceVerifier:
    """The AG-UI 1.0 sequence state of one thread.

    Not thread-safe; use one verifier per thread and feed it the thread's
    events in order.
    """

    __slots__ = (
        "_activity_owners",
        "_closed_subagents",
        "_message_owners",
        "_messages",
        "_reasoning_messages",
        "_reasoning_owners",
        "_reasoning_spans",
        "_run_id",
        "_state",
        "_steps",
        "_subagents",
        "_tool_call_owners",
        "_tool_calls",
        "thread",
    )

    def __init__(self, thread: str | None = None) -> None:
        self.thread = thread
        """The thread name put on every :class:`SequenceError`."""
        self._state: int = _IDLE
        self._run_id: str | None = None
        # Open entities; dicts used as insertion-ordered sets.
        self._messages: dict[str, None] = {}
        self._tool_calls: dict[str, None] = {}
        self._reasoning_spans: dict[str, None] = {}
        self._reasoning_messages: dict[str, None] = {}
        self._steps: dict[tuple[Owner, str], None] = {}
        self._subagents: dict[str, None] = {}
        # Per run, kept after the entity closed.
        self._closed_subagents: set[str] = set()
        self._message_owners: dict[str, Owner] = {}
        self._tool_call_owners: dict[str, Owner] = {}
        self._activity_owners: dict[str, Owner] = {}
        # Shared by reasoning spans and reasoning messages.
        self._reasoning_owners: dict[str, Owner] = {}

    # -- public API ------------------------------------------------------------

    def check(self, event: Any) -> None:
        """Raise :class:`SequenceError` if *event* may not come next; never changes state."""
        self._step(_as_wire(event), False)

    def verify(self, event: Any) -> None:
        """Check *event*, then record it.

        On a :class:`SequenceError` nothing is recorded, so the producer may
        send a corrected event next.
        """
        self._step(_as_wire(event), True)

    def copy(self) -> SequenceVerifier:
        """An independent copy, to try events on without touching this verifier.

        Much cheaper than :func:`copy.deepcopy`: every field is a flat container
        of immutable values, so copying the containers is enough.
        """
        twin = SequenceVerifier.__new__(SequenceVerifier)
        for name in self.__slots__:
            value = getattr(self, name)
            setattr(twin, name, value.copy() if isinstance(value, dict | set) else value)
        return twin

    @classmethod
    def from_events(cls, events: Iterable[Any], thread: str | None = None) -> SequenceVerifier:
        """Rebuild the state by replaying a stored stream of accepted events.

        A stream that was verified event by event replays without error. A
        stream that breaks the rules (for example one cut at the front)
        raises :class:`SequenceError` for its first offending event.
        """
        verifier = cls(thread)
        for event in events:
            verifier.verify(event)
        return verifier

    @property
    def run_active(self) -> bool:
        """Whether a run has started and not yet finished or errored."""
        return self._state == _ACTIVE

    @property
    def run_id(self) -> str | None:
        """The ``runId`` of the latest RUN_STARTED, kept after its run ended; else ``None``."""
        return self._run_id

    def open_items(self) -> dict[str, list[str]]:
        """What is open in the current run, for diagnostics and error messages.

        Keys: ``messages``, ``toolCalls``, ``reasoningSpans``,
        ``reasoningMessages``, ``steps`` (``"name"`` for the parent agent's,
        ``"name (subagent 's1')"`` for a subagent's) and ``subagents``. Each
        list is in opening order; everything is empty outside a run.
        """
        return {
            "messages": list(self._messages),
            "toolCalls": list(self._tool_calls),
            "reasoningSpans": list(self._reasoning_spans),
            "reasoningMessages": list(self._reasoning_messages),
            "steps": [_step_label(owner, name) for owner, name in self._steps],
            "subagents": list(self._subagents),
        }

    def __repr__(self) -> str:
        state = ("idle", "active", "finished", "errored")[self._state]
        return f"<SequenceVerifier thread={self.thread!r} run={self._run_id!r} {state}>"

    # -- dispatch --------------------------------------------------------------

    def _step(self, ev: Wire, apply: bool) -> None:
        etype = ev.get("type")
        if not isinstance(etype, str):
            self._fail(
                "malformed_event",
                "the event has no string 'type': validate it with "
                "agui_hub.agui.events.validate_wire first",
                ev,
            )
        if self._state == _ACTIVE:
            handler = _HANDLERS.get(etype)
            if handler is not None:
                handler(self, ev, apply)
            return  # any other event is free within a run
        if etype == "RUN_STARTED":
            self._on_run_started(ev, apply)
            return
        if etype == "RUN_ERROR" and self._state != _ERRORED:
            if apply:
                self._end_run(_ERRORED)
            return
        if self._state == _IDLE:
            self._fail(
                "run_not_started",
                "no run has started in this thread: send RUN_STARTED first",
                ev,
            )
        if self._state == _FINISHED:
            self._fail(
                "run_already_finished",
                f"run {self._run_id!r} has finished with RUN_FINISHED: send RUN_STARTED "
                "to begin a new run first",
                ev,
            )
        self._fail(
            "run_already_errored",
            f"run {self._run_id!r} has ended with RUN_ERROR; only RUN_STARTED may follow: "
            "begin a new run first",
            ev,
        )

    # -- helpers ---------------------------------------------------------------

    def _fail(self, rule: str, message: str, ev: Wire) -> NoReturn:
        raise SequenceError(rule, message, event=ev, thread=self.thread)

    def _id(self, ev: Wire, key: str) -> str:
        value = ev.get(key)
        if not isinstance(value, str):
            self._fail(
                "malformed_event",
                f"the event has no string {key!r}: validate it with "
                "agui_hub.agui.events.validate_wire first",
                ev,
            )
        return value

    def _mismatch(self, ev: Wire, tag: str, owner: Owner, label: str, entity: str) -> NoReturn:
        self._fail(
            "attribution_mismatch",
            f"subagentRunId {tag!r} disagrees with {label} {entity!r}, which belongs to "
            f"{_who(owner)}: tag it with the owner's subagentRunId or leave subagentRunId out",
            ev,
        )

    def _reset(self) -> None:
        self._messages.clear()
        self._tool_calls.clear()
        self._reasoning_spans.clear()
        self._reasoning_messages.clear()
        self._steps.clear()
        self._subagents.clear()
        self._closed_subagents.clear()
        self._message_owners.clear()
        self._tool_call_owners.clear()
        self._activity_owners.clear()
        self._reasoning_owners.clear()

    def _end_run(self, state: int) -> None:
        # After a run ends only RUN_STARTED (which starts afresh) or RUN_ERROR
        # (which checks nothing) can follow, so the run's state can go now.
        self._state = state
        self._reset()

    def _seed(self, messages: Any, authoritative: bool) -> None:
        """Record the owners of messages put on the wire by a snapshot or an input echo."""
        if not isinstance(messages, list):
            return
        tool_owners = self._tool_call_owners
        for msg in messages:
            if not isinstance(msg, dict):
                continue
            mid = msg.get("id")
            if not isinstance(mid, str):
                continue
            tag = msg.get("subagentRunId")
            owner = tag if isinstance(tag, str) else None
            role = msg.get("role")
            if role == "reasoning":
                bucket = self._reasoning_owners
            elif role == "activity":
                bucket = self._activity_owners
            else:
                bucket = self._message_owners
            if authoritative or mid not in bucket:
                bucket[mid] = owner
            tool_calls = msg.get("toolCalls")
            if isinstance(tool_calls, list):
                for call in tool_calls:
                    cid = call.get("id") if isinstance(call, dict) else None
                    if isinstance(cid, str) and (authoritative or cid not in tool_owners):
                        tool_owners[cid] = owner

    # -- paired entities -------------------------------------------------------

    def _open(
        self, kind: _Kind, opened: dict[str, None], owners: dict[str, Owner], ev: Wire, apply: bool
    ) -> None:
        eid = self._id(ev, kind.id_key)
        if eid in opened:
            self._fail(
                kind.already_rule,
                f"{kind.label} {eid!r} is already open: send {kind.end} for it first, "
                f"or use a new {kind.id_key}",
                ev,
            )
        tag = ev.get("subagentRunId")
        known = eid in owners
        if known and tag is not None and owners[eid] != tag:
            self._mismatch(ev, tag, owners[eid], kind.label, eid)
        if apply:
            opened[eid] = None
            if not known:
                owners[eid] = tag

    def _continue(
        self,
        kind: _Kind,
        opened: dict[str, None],
        owners: dict[str, Owner],
        ev: Wire,
        apply: bool,
        close: bool,
    ) -> None:
        eid = self._id(ev, kind.id_key)
        if eid not in opened:
            self._fail(
                kind.not_open_rule,
                f"{kind.label} {eid!r} is not open: send {kind.start} first",
                ev,
            )
        tag = ev.get("subagentRunId")
        if tag is not None and eid in owners and owners[eid] != tag:
            self._mismatch(ev, tag, owners[eid], kind.label, eid)
        if close and apply:
            del opened[eid]

    def _on_text_start(self, ev: Wire, apply: bool) -> None:
        self._open(_TEXT, self._messages, self._message_owners, ev, apply)

    def _on_text_content(self, ev: Wire, apply: bool) -> None:
        self._continue(_TEXT, self._messages, self._message_owners, ev, apply, False)

    def _on_text_end(self, ev: Wire, apply: bool) -> None:
        self._continue(_TEXT, self._messages, self._message_owners, ev, apply, True)

    def _on_tool_start(self, ev: Wire, apply: bool) -> None:
        cid = self._id(ev, "toolCallId")
        if cid in self._tool_calls:
            self._fail(
                "tool_call_already_open",
                f"tool call {cid!r} is already open: send TOOL_CALL_END for it first, "
                "or use a new toolCallId",
                ev,
            )
        tag = ev.get("subagentRunId")
        # A tool call lives in its parent message and has no owner of its own.
        parent = ev.get("parentMessageId")
        inherits = False
        inherited: Owner = None
        if isinstance(parent, str) and parent in self._message_owners:
            inherits = True
            inherited = self._message_owners[parent]
            if tag is not None and tag != inherited:
                self._fail(
                    "attribution_mismatch",
                    f"subagentRunId {tag!r} disagrees with parent message {parent!r}, which "
                    f"belongs to {_who(inherited)}: a tool call belongs to the message that "
                    "carries it, so tag it like that message or leave subagentRunId out",
                    ev,
                )
        owners = self._tool_call_owners
        known = cid in owners
        if known:
            existing = owners[cid]
            if tag is not None and tag != existing:
                self._mismatch(ev, tag, existing, "tool call", cid)
            if tag is None and inherits and inherited != existing:
                self._fail(
                    "attribution_mismatch",
                    f"tool call {cid!r} belongs to {_who(existing)} but its parent message "
                    f"{parent!r} belongs to {_who(inherited)}: reopen the tool call under a "
                    "message of the same owner, or use a new toolCallId",
                    ev,
                )
        if apply:
            self._tool_calls[cid] = None
            if not known:
                owners[cid] = tag if tag is not None else inherited

    def _on_tool_args(self, ev: Wire, apply: bool) -> None:
        self._continue(_TOOL, self._tool_calls, self._tool_call_owners, ev, apply, False)

    def _on_tool_end(self, ev: Wire, apply: bool) -> None:
        self._continue(_TOOL, self._tool_calls, self._tool_call_owners, ev, apply, True)

    def _on_tool_result(self, ev: Wire, apply: bool) -> None:
        # Mints a tool message: the newest minting event owns the id.
        mid = self._id(ev, "messageId")
        if apply:
            self._message_owners[mid] = ev.get("subagentRunId")

    def _on_reasoning_start(self, ev: Wire, apply: bool) -> None:
        self._open(_SPAN, self._reasoning_spans, self._reasoning_owners, ev, apply)

    def _on_reasoning_end(self, ev: Wire, apply: bool) -> None:
        self._continue(_SPAN, self._reasoning_spans, self._reasoning_owners, ev, apply, True)

    def _on_reasoning_message_start(self, ev: Wire, apply: bool) -> None:
        self._open(_REASONING, self._reasoning_messages, self._reasoning_owners, ev, apply)

    def _on_reasoning_message_content(self, ev: Wire, apply: bool) -> None:
        self._continue(
            _REASONING, self._reasoning_messages, self._reasoning_owners, ev, apply, False
        )

    def _on_reasoning_message_end(self, ev: Wire, apply: bool) -> None:
        self._continue(
            _REASONING, self._reasoning_messages, self._reasoning_owners, ev, apply, True
        )

    def _on_reasoning_encrypted_value(self, ev: Wire, apply: bool) -> None:
        eid = self._id(ev, "entityId")
        tag = ev.get("subagentRunId")
        if tag is None:
            return
        subtype = ev.get("subtype")
        owners: dict[str, Owner]
        if subtype == "tool-call":
            owners, label = self._tool_call_owners, "tool call"
        elif subtype == "message" and eid in self._message_owners:
            owners, label = self._message_owners, "message"
        else:
            owners, label = self._reasoning_owners, "reasoning message"
        if eid in owners and owners[eid] != tag:
            self._mismatch(ev, tag, owners[eid], label, eid)

    # -- activities ------------------------------------------------------------

    def _on_activity_snapshot(self, ev: Wire, apply: bool) -> None:
        mid = self._id(ev, "messageId")
        # Only a replacing snapshot (the default) re-mints, and so re-owns, an activity.
        if apply and (mid not in self._activity_owners or ev.get("replace") is not False):
            self._activity_owners[mid] = ev.get("subagentRunId")

    def _on_activity_delta(self, ev: Wire, apply: bool) -> None:
        mid = self._id(ev, "messageId")
        tag = ev.get("subagentRunId")
        owners = self._activity_owners
        if tag is not None and mid in owners and owners[mid] != tag:
            self._mismatch(ev, tag, owners[mid], "activity", mid)

    def _on_messages_snapshot(self, ev: Wire, apply: bool) -> None:
        if apply:
            self._seed(ev.get("messages"), True)

    # -- steps -----------------------------------------------------------------

    def _on_step_started(self, ev: Wire, apply: bool) -> None:
        name = self._id(ev, "stepName")
        key = (ev.get("subagentRunId"), name)
        if key in self._steps:
            self._fail(
                "step_already_active",
                f"step {name!r} of {_who(key[0])} is already active: send STEP_FINISHED "
                "for it first",
                ev,
            )
        if apply:
            self._steps[key] = None

    def _on_step_finished(self, ev: Wire, apply: bool) -> None:
        name = self._id(ev, "stepName")
        owner = ev.get("subagentRunId")
        key = (owner, name)
        if key not in self._steps:
            for other, other_name in self._steps:
                if other_name == name:
                    self._fail(
                        "attribution_mismatch",
                        f"step {name!r} is open under {_who(other)}, not under {_who(owner)}: "
                        "finish a step with the subagentRunId it was started with",
                        ev,
                    )
            self._fail(
                "step_not_active",
                f"step {name!r} of {_who(owner)} is not active: send STEP_STARTED first",
                ev,
            )
        if apply:
            del self._steps[key]

    # -- subagents -------------------------------------------------------------

    def _on_subagent_started(self, ev: Wire, apply: bool) -> None:
        sid = self._id(ev, "subagentRunId")
        if sid in self._subagents:
            self._fail(
                "subagent_duplicate",
                f"subagent {sid!r} is already active: send SUBAGENT_FINISHED or "
                "SUBAGENT_ERROR for it first; a new invocation needs a new subagentRunId",
                ev,
            )
        if sid in self._closed_subagents:
            self._fail(
                "subagent_duplicate",
                f"subagent {sid!r} already ran in this run: a subagentRunId names one "
                "invocation, so give the new invocation a new subagentRunId",
                ev,
            )
        parent = ev.get("parentSubagentRunId")
        if (
            parent is not None
            and parent not in self._subagents
            and parent not in self._closed_subagents
        ):
            self._fail(
                "subagent_parent_unknown",
                f"parentSubagentRunId {parent!r} names no subagent started in this run: "
                f"send SUBAGENT_STARTED for {parent!r} first",
                ev,
            )
        if apply:
            self._subagents[sid] = None

    def _on_subagent_ended(self, ev: Wire, apply: bool) -> None:
        sid = self._id(ev, "subagentRunId")
        if sid not in self._subagents:
            if sid in self._closed_subagents:
                why = "has already ended: a subagent ends once, with SUBAGENT_FINISHED or "
                why += "SUBAGENT_ERROR"
            else:
                why = "was not started in this run: send SUBAGENT_STARTED first"
            self._fail("subagent_not_active", f"subagent {sid!r} {why}", ev)
        if apply:
            del self._subagents[sid]
            self._closed_subagents.add(sid)

    # -- runs ------------------------------------------------------------------

    def _on_run_started(self, ev: Wire, apply: bool) -> None:
        if self._state == _ACTIVE:
            self._fail(
                "run_already_active",
                f"run {self._run_id!r} is still active: end it with RUN_FINISHED or "
                "RUN_ERROR before starting another",
                ev,
            )
        if apply:
            # Nothing to reset: the state is empty before the first run and is
            # cleared by _end_run when a run ends.
            self._state = _ACTIVE
            run_id = ev.get("runId")
            self._run_id = run_id if isinstance(run_id, str) else None
            run_input = ev.get("input")
            if isinstance(run_input, dict):
                self._seed(run_input.get("messages"), False)

    def _on_run_finished(self, ev: Wire, apply: bool) -> None:
        if (
            self._messages
            or self._tool_calls
            or self._reasoning_spans
            or self._reasoning_messages
            or self._steps
            or self._subagents
        ):
            parts = []
            for label, items, closer in (
                ("text messages", self._messages, "TEXT_MESSAGE_END"),
                ("tool calls", self._tool_calls, "TOOL_CALL_END"),
                ("reasoning messages", self._reasoning_messages, "REASONING_MESSAGE_END"),
                ("reasoning spans", self._reasoning_spans, "REASONING_END"),
                ("subagents", self._subagents, "SUBAGENT_FINISHED"),
            ):
                if items:
                    parts.append(f"{label} {_quoted(items)} (send {closer})")
            if self._steps:
                steps = ", ".join(_step_label(owner, name, True) for owner, name in self._steps)
                parts.append(f"steps {steps} (send STEP_FINISHED)")
            self._fail(
                "run_finished_with_open_items",
                f"run {self._run_id!r} still has open {'; '.join(parts)}: close them first, "
                "or end the run with RUN_ERROR",
                ev,
            )
        if apply:
            self._end_run(_FINISHED)

    def _on_run_error(self, ev: Wire, apply: bool) -> None:
        if apply:
            self._end_run(_ERRORED)


def _step_label(owner: Owner, name: str, quote: bool = False) -> str:
    shown = repr(name) if quote else name
    return shown if owner is None else f"{shown} (subagent {owner!r})"


_Handler = Callable[[SequenceVerifier, Wire, bool], None]

_HANDLERS: Final[dict[str, _Handler]] = {
    "TEXT_MESSAGE_START": SequenceVerifier._on_text_start,
    "TEXT_MESSAGE_CONTENT": SequenceVerifier._on_text_content,
    "TEXT_MESSAGE_END": SequenceVerifier._on_text_end,
    "TOOL_CALL_START": SequenceVerifier._on_tool_start,
    "TOOL_CALL_ARGS": SequenceVerifier._on_tool_args,
    "TOOL_CALL_END": SequenceVerifier._on_tool_end,
    "TOOL_CALL_RESULT": SequenceVerifier._on_tool_result,
    "REASONING_START": SequenceVerifier._on_reasoning_start,
    "REASONING_END": SequenceVerifier._on_reasoning_end,
    "REASONING_MESSAGE_START": SequenceVerifier._on_reasoning_message_start,
    "REASONING_MESSAGE_CONTENT": SequenceVerifier._on_reasoning_message_content,
    "REASONING_MESSAGE_END": SequenceVerifier._on_reasoning_message_end,
    "REASONING_ENCRYPTED_VALUE": SequenceVerifier._on_reasoning_encrypted_value,
    "ACTIVITY_SNAPSHOT": SequenceVerifier._on_activity_snapshot,
    "ACTIVITY_DELTA": SequenceVerifier._on_activity_delta,
    "MESSAGES_SNAPSHOT": SequenceVerifier._on_messages_snapshot,
    "STEP_STARTED": SequenceVerifier._on_step_started,
    "STEP_FINISHED": SequenceVerifier._on_step_finished,
    "SUBAGENT_STARTED": SequenceVerifier._on_subagent_started,
    "SUBAGENT_FINISHED": SequenceVerifier._on_subagent_ended,
    "SUBAGENT_ERROR": SequenceVerifier._on_subagent_ended,
    "RUN_STARTED": SequenceVerifier._on_run_started,
    "RUN_FINISHED": SequenceVerifier._on_run_finished,
    "RUN_ERROR": SequenceVerifier._on_run_error,
}
"""What each event type checks within an active run; other types are always accepted there."""
