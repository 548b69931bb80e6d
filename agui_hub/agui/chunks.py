"""Expansion of AG-UI 1.0 chunk events into explicit START / CONTENT / END events.

A producer may send a text message, a tool call or a reasoning message in the
short ``*_CHUNK`` form: the first chunk names the message (or tool call), later
chunks only add deltas, and nothing marks the end. :class:`ChunkExpander`
rewrites such a stream into the long form every consumer understands:

* ``TEXT_MESSAGE_CHUNK`` -> ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END``
* ``TOOL_CALL_CHUNK`` -> ``TOOL_CALL_START`` / ``_ARGS`` / ``_END``
* ``REASONING_MESSAGE_CHUNK`` -> ``REASONING_MESSAGE_START`` / ``_CONTENT`` / ``_END``

The rules are those of the official AG-UI 1.0 client:

* A *lane* is the subagent the work belongs to (the ``subagentRunId``; ``None``
  is the parent agent). Each lane assembles at most one chunk stream at a time.
* The first chunk of a stream carries its id (``messageId``; ``toolCallId`` and
  ``toolCallName`` for a tool call). The synthesized TEXT_MESSAGE_START always
  states its role (``"assistant"`` unless the chunk names another).
* A chunk with the open stream's id, or with no id at all, continues that
  stream. It may repeat a field the opener set (``role``, ``name``,
  ``toolCallName``, ``parentMessageId``, ``subagentRunId``) but only with the
  same value.
* A chunk with another id first ends the lane's open stream, then starts a new
  one.
* An explicit message, tool-call, reasoning, step, state or custom event ends
  the open stream of its own lane; SUBAGENT_FINISHED / SUBAGENT_ERROR end the
  stream of the subagent they finish; RUN_STARTED, RUN_FINISHED, RUN_ERROR and
  MESSAGES_SNAPSHOT end every lane's stream. The END comes first, then the
  event itself, unchanged (the same dict object).
* :meth:`ChunkExpander.flush` ends every open stream, for a stream of events
  that simply stops.

Emitted events are canonical wire dicts (what :func:`agui_hub.agui.events.validate_wire`
returns for them). The chunk's ``metadata`` and ``timestamp`` ride on the events
synthesized from it, its ``rawEvent`` and any field the chunk schema does not
describe on the CONTENT / ARGS event (on the START when there is none). The
synthesized END events carry only the id and the lane's ``subagentRunId``.

A chunk that cannot be expanded raises :class:`~agui_hub.errors.ChunkError`;
the expander's state is then unchanged. Its ``rule`` is one of:

===========================  ===================================================================
rule                         meaning
===========================  ===================================================================
``chunk_missing_id``         a chunk opens a stream (nothing of its kind to continue in its
                             lane, or a new id) without ``messageId`` / ``toolCallId``
``chunk_missing_tool_name``  the first TOOL_CALL_CHUNK of a tool call has no ``toolCallName``
``chunk_invalid_id``         an id or ``subagentRunId`` that is not a string (only an entry
                             written to the store without validation can carry one)
``chunk_field_mismatch``     a continuation repeats ``role``, ``name``, ``toolCallName`` or
                             ``parentMessageId`` with a value other than the opener's
``chunk_lane_mismatch``      the chunk's ``subagentRunId`` is not the lane its id is open in
``chunk_ambiguous_lane``     a chunk with neither id nor ``subagentRunId`` could continue the
                             open streams of several subagents
===========================  ===================================================================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel

from ..errors import ChunkError
from .events import (
    BaseEvent,
    ReasoningMessageChunkEvent,
    TextMessageChunkEvent,
    ToolCallChunkEvent,
    validate_wire,
)

__all__ = ["CHUNK_EVENT_TYPES", "CLOSING_EVENT_TYPES", "ChunkExpander", "expand_chunks"]

WireEvent = dict[str, Any]


def _wire_names(model: type[BaseEvent]) -> frozenset[str]:
    """The wire names of the fields *model* declares (unknown fields are the rest)."""
    return frozenset(info.alias or name for name, info in model.model_fields.items())


@dataclass(frozen=True, slots=True)
class _Kind:
    """What differs between the three kinds of chunk stream."""

    name: str
    """``"text"``, ``"tool"`` or ``"reasoning"``, as reported by ``open_streams``."""
    label: str
    """How messages name the entity, e.g. ``"text message"``."""
    chunk_type: str
    id_field: str
    start_type: str
    content_type: str
    end_type: str
    declared: frozenset[str]
    """Wire names the chunk schema declares; anything else is carried through."""


_TEXT: Final = _Kind(
    name="text",
    label="text message",
    chunk_type="TEXT_MESSAGE_CHUNK",
    id_field="messageId",
    start_type="TEXT_MESSAGE_START",
    content_type="TEXT_MESSAGE_CONTENT",
    end_type="TEXT_MESSAGE_END",
    declared=_wire_names(TextMessageChunkEvent),
)
_TOOL: Final = _Kind(
    name="tool",
    label="tool call",
    chunk_type="TOOL_CALL_CHUNK",
    id_field="toolCallId",
    start_type="TOOL_CALL_START",
    content_type="TOOL_CALL_ARGS",
    end_type="TOOL_CALL_END",
    declared=_wire_names(ToolCallChunkEvent),
)
_REASONING: Final = _Kind(
    name="reasoning",
    label="reasoning message",
    chunk_type="REASONING_MESSAGE_CHUNK",
    id_field="messageId",
    start_type="REASONING_MESSAGE_START",
    content_type="REASONING_MESSAGE_CONTENT",
    end_type="REASONING_MESSAGE_END",
    declared=_wire_names(ReasoningMessageChunkEvent),
)


@dataclass(frozen=True, slots=True)
class _Stream:
    """A stream one lane is assembling from chunks."""

    kind: _Kind
    id: str
    lane: str | None
    established: tuple[tuple[str, str | None], ...]
    """Fields a continuation may repeat, with the value the opener gave them."""


# What a non-chunk event does to pending streams. Types not listed (RAW,
# ACTIVITY_*, REASONING_ENCRYPTED_VALUE, SUBAGENT_STARTED, and any type this
# module does not know) leave them alone.
_CLOSE_OWN_LANE: Final = 0
_CLOSE_ALL_LANES: Final = 1
_CLOSE_SUBAGENT_LANE: Final = 2

_ACTIONS: Final[dict[str, int | _Kind]] = {
    **dict.fromkeys(
        (
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "STATE_SNAPSHOT",
            "STATE_DELTA",
            "CUSTOM",
            "STEP_STARTED",
            "STEP_FINISHED",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END",
        ),
        _CLOSE_OWN_LANE,
    ),
    **dict.fromkeys(
        ("RUN_STARTED", "RUN_FINISHED", "RUN_ERROR", "MESSAGES_SNAPSHOT"), _CLOSE_ALL_LANES
    ),
    **dict.fromkeys(("SUBAGENT_FINISHED", "SUBAGENT_ERROR"), _CLOSE_SUBAGENT_LANE),
    _TEXT.chunk_type: _TEXT,
    _TOOL.chunk_type: _TOOL,
    _REASONING.chunk_type: _REASONING,
}

CLOSING_EVENT_TYPES: Final = frozenset(
    event_type for event_type, action in _ACTIONS.items() if not isinstance(action, _Kind)
)
"""Non-chunk event types that end a pending chunk stream (of their lane, or all)."""

CHUNK_EVENT_TYPES: Final = frozenset(
    event_type for event_type, action in _ACTIONS.items() if isinstance(action, _Kind)
)
"""The event types :class:`ChunkExpander` rewrites."""


def _as_wire(event: object) -> WireEvent:
    """A wire dict for an event that is not a plain dict."""
    if isinstance(event, Mapping) and not isinstance(event, BaseModel):
        return dict(event)
    # A model (ours or e.g. an official ``ag_ui.core`` event) is re-validated,
    # which gives its canonical wire dict; anything else is an InvalidEvent.
    return validate_wire(event)


def _lane_name(lane: str | None) -> str:
    return "the parent agent" if lane is None else f"subagent {lane!r}"


class ChunkExpander:
    """Rewrites the chunk events of one event stream into START / CONTENT / END.

    Feed every event of the stream, in order, to :meth:`expand` and publish
    what it returns instead; call :meth:`flush` when the stream stops without
    a run-ending event. *thread* only labels errors.
    """

    __slots__ = ("_lanes", "thread")

    def __init__(self, thread: str | None = None) -> None:
        self.thread = thread
        self._lanes: dict[str | None, _Stream] = {}

    def copy(self) -> ChunkExpander:
        """An independent copy, to try events on (the streams themselves are immutable)."""
        twin = ChunkExpander(self.thread)
        twin._lanes = dict(self._lanes)
        return twin

    @property
    def open_streams(self) -> dict[str | None, tuple[str, str]]:
        """The stream each lane is assembling: lane -> (kind, id), in opening order.

        *kind* is ``"text"``, ``"tool"`` or ``"reasoning"``; the lane is the
        ``subagentRunId`` (``None`` for the parent agent). A copy, for diagnostics.
        """
        return {lane: (stream.kind.name, stream.id) for lane, stream in self._lanes.items()}

    def expand(self, event: Mapping[str, Any] | BaseModel) -> list[WireEvent]:
        """Return the events that replace *event*, in order.

        A non-chunk event comes back as itself (the same object), preceded by
        the END of any stream it closes. A chunk becomes, as needed, the END of
        the lane's previous stream, a START and a CONTENT / ARGS event; a chunk
        that adds nothing yields no event. Raises
        :class:`~agui_hub.errors.ChunkError`, leaving the state unchanged.
        """
        if type(event) is not dict:
            event = _as_wire(event)
        action = _ACTIONS.get(event.get("type"))  # type: ignore[arg-type]
        if action is None:
            return [event]
        if isinstance(action, _Kind):
            return self._expand_chunk(action, event)
        if not self._lanes:
            return [event]
        if action == _CLOSE_ALL_LANES:
            ends = self.flush()
        else:
            lane = event.get("subagentRunId")
            if lane is None and action == _CLOSE_SUBAGENT_LANE:
                return [event]  # a subagent terminal without its id never closes the parent
            ends = self._close(lane)
        ends.append(event)
        return ends

    def flush(self) -> list[WireEvent]:
        """END every open stream (every lane, in opening order) and return the END events."""
        ends = [_end_event(stream) for stream in self._lanes.values()]
        self._lanes.clear()
        return ends

    # -- internals -------------------------------------------------------------

    def _close(self, lane: str | None) -> list[WireEvent]:
        stream = self._lanes.pop(lane, None)
        return [] if stream is None else [_end_event(stream)]

    def _error(self, rule: str, message: str, event: WireEvent) -> ChunkError:
        return ChunkError(rule, message, event=event, thread=self.thread)

    def _resolve_lane(
        self, kind: _Kind, entity_id: str | None, tag: str | None, event: WireEvent
    ) -> str | None:
        """The lane a chunk belongs to; continuations may leave out both id and tag."""
        if entity_id is not None:
            # An id that is open somewhere continues there, whoever sends it.
            for lane, stream in self._lanes.items():
                if stream.kind is kind and stream.id == entity_id:
                    if tag is not None and tag != lane:
                        raise self._error(
                            "chunk_lane_mismatch",
                            f"{kind.label} {entity_id!r} is open for {_lane_name(lane)}, but the "
                            f"chunk says subagentRunId {tag!r}; send the chunk with the stream's "
                            "subagentRunId or without one",
                            event,
                        )
                    return lane
            return tag  # a new stream opens in the lane the chunk names
        if tag is not None:
            return tag
        parent = self._lanes.get(None)
        if parent is not None and parent.kind is kind:
            return None
        # A producer may tag only the opening chunk: then the sole open stream
        # of this kind is the only thing an untagged, id-less chunk can continue.
        candidates = [lane for lane, stream in self._lanes.items() if stream.kind is kind]
        if len(candidates) > 1:
            lanes = ", ".join(repr(lane) for lane in candidates)
            raise self._error(
                "chunk_ambiguous_lane",
                f"the chunk has neither {kind.id_field} nor subagentRunId, and the subagents "
                f"{lanes} each have an open {kind.label}; add the {kind.id_field} or the "
                "subagentRunId of the stream it continues",
                event,
            )
        return candidates[0] if candidates else None

    def _expand_chunk(self, kind: _Kind, chunk: WireEvent) -> list[WireEvent]:
        entity_id: str | None = chunk.get(kind.id_field)
        # Validated events always have string ids; an entry a producer wrote to the
        # store directly may not, and an id that is not a string would be kept as a
        # lane's key or stream id and break every later snapshot (compact()).
        for field in (kind.id_field, "subagentRunId"):
            value = chunk.get(field)
            if value is not None and not isinstance(value, str):
                raise self._error(
                    "chunk_invalid_id",
                    f"{kind.chunk_type} {field} must be a string, got {type(value).__name__}",
                    chunk,
                )
        lane = self._resolve_lane(kind, entity_id, chunk.get("subagentRunId"), chunk)
        current = self._lanes.get(lane)
        out: list[WireEvent] = []

        if current is not None and current.kind is kind and entity_id in (None, current.id):
            for field, value in current.established:
                repeated = chunk.get(field)
                if repeated is not None and repeated != value:
                    was = "absent" if value is None else repr(value)
                    raise self._error(
                        "chunk_field_mismatch",
                        f"{kind.label} {current.id!r} was opened with {field} {was}, this "
                        f"chunk says {repeated!r}; a continuation chunk may repeat {field} "
                        "only with the same value (or start a new stream with a new "
                        f"{kind.id_field})",
                        chunk,
                    )
            stream = current
        else:
            # Everything that can fail is checked before any state changes.
            if entity_id is None:
                raise self._error(
                    "chunk_missing_id",
                    f"the first {kind.chunk_type} of a {kind.label} must carry {kind.id_field} "
                    f"({_lane_name(lane)} has no open {kind.label} to continue); add "
                    f"{kind.id_field} to the opening chunk",
                    chunk,
                )
            if kind is _TOOL and chunk.get("toolCallName") is None:
                raise self._error(
                    "chunk_missing_tool_name",
                    f"the first TOOL_CALL_CHUNK of tool call {entity_id!r} must carry "
                    "toolCallName; add the name of the tool to the opening chunk",
                    chunk,
                )
            if current is not None:
                del self._lanes[lane]
                out.append(_end_event(current))
            stream, start = _open(kind, entity_id, lane, chunk)
            self._lanes[lane] = stream
            out.append(start)

        extra = {key: value for key, value in chunk.items() if key not in kind.declared}
        delta = chunk.get("delta")
        raw_event = chunk.get("rawEvent")
        metadata = chunk.get("metadata")
        if (
            delta is not None
            or raw_event is not None
            or (not out and (metadata is not None or extra))
        ):
            # A continuation that carries only metadata or unknown fields still
            # yields an (empty) CONTENT event, so that nothing it says is lost.
            content: WireEvent = {
                **extra,
                "type": kind.content_type,
                kind.id_field: stream.id,
                "delta": "" if delta is None else delta,
            }
            _carry(content, chunk, stream.lane)
            if raw_event is not None:
                content["rawEvent"] = raw_event
            out.append(content)
        elif extra and out:
            # An opening chunk without content: the START carries the unknown
            # fields (its own fields win over a same-named unknown one).
            out[-1] = {**extra, **out[-1]}
        return out


def _carry(event: WireEvent, chunk: WireEvent, lane: str | None) -> None:
    """Add the lane and the chunk's timestamp and metadata to an event built from it."""
    if lane is not None:
        event["subagentRunId"] = lane
    timestamp = chunk.get("timestamp")
    if timestamp is not None:
        event["timestamp"] = timestamp
    metadata = chunk.get("metadata")
    if metadata is not None:
        event["metadata"] = metadata


def _open(
    kind: _Kind, entity_id: str, lane: str | None, chunk: WireEvent
) -> tuple[_Stream, WireEvent]:
    """The stream an opening chunk starts and its synthesized START event."""
    start: WireEvent = {"type": kind.start_type, kind.id_field: entity_id}
    established: tuple[tuple[str, str | None], ...]
    if kind is _TEXT:
        role: str | None = chunk.get("role")
        if role is None:
            role = "assistant"  # absent means assistant; the START says so explicitly
        name: str | None = chunk.get("name")
        start["role"] = role
        if name is not None:
            start["name"] = name
        established = (("role", role), ("name", name))
    elif kind is _TOOL:
        tool_name: str = chunk["toolCallName"]
        parent_message_id: str | None = chunk.get("parentMessageId")
        start["toolCallName"] = tool_name
        if parent_message_id is not None:
            start["parentMessageId"] = parent_message_id
        established = (("toolCallName", tool_name), ("parentMessageId", parent_message_id))
    else:
        start["role"] = "reasoning"
        established = ()
    _carry(start, chunk, lane)
    return _Stream(kind, entity_id, lane, established), start


def _end_event(stream: _Stream) -> WireEvent:
    end: WireEvent = {"type": stream.kind.end_type, stream.kind.id_field: stream.id}
    if stream.lane is not None:
        end["subagentRunId"] = stream.lane
    return end


def expand_chunks(
    events: Iterable[Mapping[str, Any] | BaseModel], *, flush: bool = True
) -> list[WireEvent]:
    """Expand a whole sequence of events; END open streams at the end unless *flush* is false."""
    expander = ChunkExpander()
    out: list[WireEvent] = []
    for event in events:
        out.extend(expander.expand(event))
    if flush:
        out.extend(expander.flush())
    return out
