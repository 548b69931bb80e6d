"""AG-UI 1.0 events and messages as pydantic v2 models.

The models follow the AG-UI 1.0 JSON schema field for field:

* attributes are snake_case, the wire is camelCase (``message_id`` /
  ``messageId``); both spellings are accepted on input;
* unknown fields are kept and written back out, because a relay must not drop
  what a newer producer sent;
* an optional field without a value is omitted on output, never written as
  ``null`` (a ``null`` that carries meaning, such as ``CUSTOM.value`` or a
  ``null`` inside ``metadata``, is kept).

Entry points:

* :func:`parse_event` turns a wire mapping (or a model, including an official
  ``ag_ui.core`` event object) into one of the event models;
* :func:`to_wire` turns a model back into its canonical wire dict;
* :func:`validate_wire` does both in one step on the hot path: it validates a
  wire mapping and returns the canonical wire dict without building models.

Every failure is an :class:`~agui_hub.errors.InvalidEvent`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    TypeAlias,
    Union,
    get_args,
)

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    with_config,
)
from pydantic.alias_generators import to_camel
from typing_extensions import TypedDict

from ..errors import InvalidEvent, ProtocolError

__all__ = [
    "Event",
    "EventType",
    "Message",
    "ValuesExhausted",
    "message_to_wire",
    "parse_event",
    "parse_message",
    "to_wire",
    "validate_batch",
    "validate_wire",
]

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer that survives a JSON round trip (timestamps are bounded by it)."""


class EventType(enum.StrEnum):
    """The ``type`` discriminator of every AG-UI 1.0 event."""

    TEXT_MESSAGE_START = "TEXT_MESSAGE_START"
    TEXT_MESSAGE_CONTENT = "TEXT_MESSAGE_CONTENT"
    TEXT_MESSAGE_END = "TEXT_MESSAGE_END"
    TEXT_MESSAGE_CHUNK = "TEXT_MESSAGE_CHUNK"
    TOOL_CALL_START = "TOOL_CALL_START"
    TOOL_CALL_ARGS = "TOOL_CALL_ARGS"
    TOOL_CALL_END = "TOOL_CALL_END"
    TOOL_CALL_CHUNK = "TOOL_CALL_CHUNK"
    TOOL_CALL_RESULT = "TOOL_CALL_RESULT"
    STATE_SNAPSHOT = "STATE_SNAPSHOT"
    STATE_DELTA = "STATE_DELTA"
    MESSAGES_SNAPSHOT = "MESSAGES_SNAPSHOT"
    ACTIVITY_SNAPSHOT = "ACTIVITY_SNAPSHOT"
    ACTIVITY_DELTA = "ACTIVITY_DELTA"
    RAW = "RAW"
    CUSTOM = "CUSTOM"
    RUN_STARTED = "RUN_STARTED"
    RUN_FINISHED = "RUN_FINISHED"
    RUN_ERROR = "RUN_ERROR"
    STEP_STARTED = "STEP_STARTED"
    STEP_FINISHED = "STEP_FINISHED"
    REASONING_START = "REASONING_START"
    REASONING_MESSAGE_START = "REASONING_MESSAGE_START"
    REASONING_MESSAGE_CONTENT = "REASONING_MESSAGE_CONTENT"
    REASONING_MESSAGE_END = "REASONING_MESSAGE_END"
    REASONING_MESSAGE_CHUNK = "REASONING_MESSAGE_CHUNK"
    REASONING_END = "REASONING_END"
    REASONING_ENCRYPTED_VALUE = "REASONING_ENCRYPTED_VALUE"
    SUBAGENT_STARTED = "SUBAGENT_STARTED"
    SUBAGENT_FINISHED = "SUBAGENT_FINISHED"
    SUBAGENT_ERROR = "SUBAGENT_ERROR"


def _is_none(value: Any) -> bool:
    return value is None


def _omit() -> Any:
    """An optional field: ``None`` by default and left out of the wire when ``None``."""
    return Field(default=None, exclude_if=_is_none)


Metadata: TypeAlias = dict[str, Any]
JsonPointer = Annotated[str, Field(pattern=r"^(/([^/~]|~[01])*)*$")]
Timestamp = Annotated[int, Field(ge=-MAX_SAFE_INTEGER, le=MAX_SAFE_INTEGER)]
TokenCount = Annotated[int, Field(ge=0, le=MAX_SAFE_INTEGER)]


class WireModel(BaseModel):
    """Base of every model: camelCase wire names, unknown fields kept."""

    model_config = ConfigDict(
        extra="allow",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


# -- content parts -----------------------------------------------------------


class DataSource(WireModel):
    type: Literal["data"] = "data"
    value: str
    mime_type: str


class UrlSource(WireModel):
    type: Literal["url"] = "url"
    value: str
    mime_type: str | None = _omit()


class FileSource(WireModel):
    type: Literal["file"] = "file"
    value: str
    provider: str | None = _omit()
    mime_type: str | None = _omit()


PartSource = Annotated[Union[DataSource, UrlSource, FileSource], Field(discriminator="type")]


class TextPart(WireModel):
    type: Literal["text"] = "text"
    id: str | None = _omit()
    text: str
    metadata: Any | None = _omit()


class _MediaPart(WireModel):
    id: str | None = _omit()
    source: PartSource
    metadata: Any | None = _omit()


class ImagePart(_MediaPart):
    type: Literal["image"] = "image"


class AudioPart(_MediaPart):
    type: Literal["audio"] = "audio"


class VideoPart(_MediaPart):
    type: Literal["video"] = "video"


class DocumentPart(_MediaPart):
    type: Literal["document"] = "document"


ContentPart = Annotated[
    Union[TextPart, ImagePart, AudioPart, VideoPart, DocumentPart], Field(discriminator="type")
]


# -- JSON Patch (RFC 6902) ---------------------------------------------------


class AddOperation(WireModel):
    op: Literal["add"] = "add"
    path: JsonPointer
    value: Any


class RemoveOperation(WireModel):
    op: Literal["remove"] = "remove"
    path: JsonPointer


class ReplaceOperation(WireModel):
    op: Literal["replace"] = "replace"
    path: JsonPointer
    value: Any


class MoveOperation(WireModel):
    op: Literal["move"] = "move"
    from_: JsonPointer = Field(alias="from")
    path: JsonPointer


class CopyOperation(WireModel):
    op: Literal["copy"] = "copy"
    from_: JsonPointer = Field(alias="from")
    path: JsonPointer


class TestOperation(WireModel):
    __test__ = False  # not a pytest test class
    op: Literal["test"] = "test"
    path: JsonPointer
    value: Any


JsonPatchOperation = Annotated[
    Union[
        AddOperation, RemoveOperation, ReplaceOperation, MoveOperation, CopyOperation, TestOperation
    ],
    Field(discriminator="op"),
]
JsonPatch = list[JsonPatchOperation]


# -- messages ----------------------------------------------------------------


class FunctionCall(WireModel):
    name: str
    arguments: str


class ToolCall(WireModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
    encrypted_value: str | None = _omit()
    metadata: Metadata | None = _omit()


class _NamedMessage(WireModel):
    subagent_run_id: str | None = _omit()
    id: str
    name: str | None = _omit()
    encrypted_value: str | None = _omit()
    metadata: Metadata | None = _omit()


class DeveloperMessage(_NamedMessage):
    role: Literal["developer"] = "developer"
    content: str


class SystemMessage(_NamedMessage):
    role: Literal["system"] = "system"
    content: str


class AssistantMessage(_NamedMessage):
    role: Literal["assistant"] = "assistant"
    content: str | None = _omit()
    tool_calls: list[ToolCall] | None = _omit()


class UserMessage(_NamedMessage):
    role: Literal["user"] = "user"
    content: str | list[ContentPart]


class ToolMessage(WireModel):
    subagent_run_id: str | None = _omit()
    id: str
    role: Literal["tool"] = "tool"
    content: str | list[ContentPart]
    tool_call_id: str
    error: str | None = _omit()
    encrypted_value: str | None = _omit()
    metadata: Metadata | None = _omit()


class ActivityMessage(WireModel):
    subagent_run_id: str | None = _omit()
    id: str
    role: Literal["activity"] = "activity"
    activity_type: str
    content: dict[str, Any]
    metadata: Metadata | None = _omit()


class ReasoningMessage(WireModel):
    subagent_run_id: str | None = _omit()
    id: str
    role: Literal["reasoning"] = "reasoning"
    content: str
    encrypted_value: str | None = _omit()
    metadata: Metadata | None = _omit()


Message = Annotated[
    Union[
        DeveloperMessage,
        SystemMessage,
        AssistantMessage,
        UserMessage,
        ToolMessage,
        ActivityMessage,
        ReasoningMessage,
    ],
    Field(discriminator="role"),
]
Role = Literal["developer", "system", "assistant", "user", "tool", "activity", "reasoning"]
TextMessageRole = Literal["developer", "system", "assistant", "user"]


# -- run input ---------------------------------------------------------------


class Tool(WireModel):
    name: str
    description: str
    parameters: Any | None = _omit()
    metadata: Metadata | None = _omit()


class Context(WireModel):
    description: str
    value: str


class ResumeEntry(WireModel):
    interrupt_id: str
    status: Literal["resolved", "cancelled"]
    payload: Any | None = _omit()
    metadata: Metadata | None = _omit()


class RunAgentInput(WireModel):
    thread_id: str
    run_id: str
    protocol_version: str | None = _omit()
    parent_run_id: str | None = _omit()
    state: Any | None = _omit()
    messages: list[Message]
    tools: list[Tool] | None = _omit()
    context: list[Context] | None = _omit()
    forwarded_props: Any | None = _omit()
    resume: list[ResumeEntry] | None = _omit()


class Interrupt(WireModel):
    subagent_run_id: str | None = _omit()
    id: str
    reason: str
    message: str | None = _omit()
    tool_call_id: str | None = _omit()
    response_schema: dict[str, Any] | None = _omit()
    expires_at: str | None = _omit()
    metadata: Metadata | None = _omit()


class TokenUsage(WireModel):
    provider: str | None = _omit()
    model: str | None = _omit()
    input_tokens: TokenCount | None = _omit()
    output_tokens: TokenCount | None = _omit()
    total_tokens: TokenCount | None = _omit()
    reasoning_tokens: TokenCount | None = _omit()
    cached_input_tokens: TokenCount | None = _omit()
    cache_write_input_tokens: TokenCount | None = _omit()


class RunFinishedSuccessOutcome(WireModel):
    type: Literal["success"] = "success"
    pending_tool_call_ids: list[str] | None = _omit()


class RunFinishedInterruptOutcome(WireModel):
    type: Literal["interrupt"] = "interrupt"
    interrupts: Annotated[list[Interrupt], Field(min_length=1)]


class RunFinishedCancelledOutcome(WireModel):
    type: Literal["cancelled"] = "cancelled"


RunFinishedOutcome = Annotated[
    Union[RunFinishedSuccessOutcome, RunFinishedInterruptOutcome, RunFinishedCancelledOutcome],
    Field(discriminator="type"),
]


class SubagentFinishedSuccessOutcome(WireModel):
    type: Literal["success"] = "success"


class SubagentFinishedSuspendedOutcome(WireModel):
    type: Literal["suspended"] = "suspended"
    interrupt_ids: list[str] | None = _omit()


SubagentFinishedOutcome = Annotated[
    Union[SubagentFinishedSuccessOutcome, SubagentFinishedSuspendedOutcome],
    Field(discriminator="type"),
]


# -- events ------------------------------------------------------------------


class BaseEvent(WireModel):
    """Fields every event carries."""

    type: EventType
    timestamp: Timestamp | None = _omit()
    raw_event: Any | None = _omit()
    metadata: Metadata | None = _omit()


class AttributableEvent(BaseEvent):
    """An event that may belong to a subagent's work (``subagentRunId``)."""

    subagent_run_id: str | None = _omit()


class TextMessageStartEvent(AttributableEvent):
    type: Literal[EventType.TEXT_MESSAGE_START] = EventType.TEXT_MESSAGE_START
    message_id: str
    role: TextMessageRole | None = _omit()
    """Absent means ``"assistant"`` (normative); see :attr:`effective_role`."""
    name: str | None = _omit()

    @property
    def effective_role(self) -> TextMessageRole:
        """The role, with the protocol's default ``"assistant"`` applied."""
        return self.role or "assistant"


class TextMessageContentEvent(AttributableEvent):
    type: Literal[EventType.TEXT_MESSAGE_CONTENT] = EventType.TEXT_MESSAGE_CONTENT
    message_id: str
    delta: str


class TextMessageEndEvent(AttributableEvent):
    type: Literal[EventType.TEXT_MESSAGE_END] = EventType.TEXT_MESSAGE_END
    message_id: str


class TextMessageChunkEvent(AttributableEvent):
    type: Literal[EventType.TEXT_MESSAGE_CHUNK] = EventType.TEXT_MESSAGE_CHUNK
    message_id: str | None = _omit()
    role: TextMessageRole | None = _omit()
    delta: str | None = _omit()
    name: str | None = _omit()


class ToolCallStartEvent(AttributableEvent):
    type: Literal[EventType.TOOL_CALL_START] = EventType.TOOL_CALL_START
    tool_call_id: str
    tool_call_name: str
    parent_message_id: str | None = _omit()


class ToolCallArgsEvent(AttributableEvent):
    type: Literal[EventType.TOOL_CALL_ARGS] = EventType.TOOL_CALL_ARGS
    tool_call_id: str
    delta: str


class ToolCallEndEvent(AttributableEvent):
    type: Literal[EventType.TOOL_CALL_END] = EventType.TOOL_CALL_END
    tool_call_id: str


class ToolCallChunkEvent(AttributableEvent):
    type: Literal[EventType.TOOL_CALL_CHUNK] = EventType.TOOL_CALL_CHUNK
    tool_call_id: str | None = _omit()
    tool_call_name: str | None = _omit()
    parent_message_id: str | None = _omit()
    delta: str | None = _omit()


class ToolCallResultEvent(AttributableEvent):
    type: Literal[EventType.TOOL_CALL_RESULT] = EventType.TOOL_CALL_RESULT
    message_id: str
    tool_call_id: str
    content: str | list[ContentPart]
    role: Literal["tool"] | None = _omit()


class StateSnapshotEvent(AttributableEvent):
    type: Literal[EventType.STATE_SNAPSHOT] = EventType.STATE_SNAPSHOT
    snapshot: Any


class StateDeltaEvent(AttributableEvent):
    type: Literal[EventType.STATE_DELTA] = EventType.STATE_DELTA
    delta: JsonPatch


class MessagesSnapshotEvent(BaseEvent):
    type: Literal[EventType.MESSAGES_SNAPSHOT] = EventType.MESSAGES_SNAPSHOT
    messages: list[Message]


class ActivitySnapshotEvent(AttributableEvent):
    type: Literal[EventType.ACTIVITY_SNAPSHOT] = EventType.ACTIVITY_SNAPSHOT
    message_id: str
    activity_type: str
    content: dict[str, Any]
    replace: bool | None = _omit()
    """Absent means ``True``: an existing activity message is replaced."""


class ActivityDeltaEvent(AttributableEvent):
    type: Literal[EventType.ACTIVITY_DELTA] = EventType.ACTIVITY_DELTA
    message_id: str
    activity_type: str
    patch: JsonPatch


class RawEvent(AttributableEvent):
    type: Literal[EventType.RAW] = EventType.RAW
    event: Any
    source: str | None = _omit()


class CustomEvent(AttributableEvent):
    type: Literal[EventType.CUSTOM] = EventType.CUSTOM
    name: str
    value: Any


class RunStartedEvent(BaseEvent):
    type: Literal[EventType.RUN_STARTED] = EventType.RUN_STARTED
    thread_id: str
    run_id: str
    protocol_version: str | None = _omit()
    parent_run_id: str | None = _omit()
    """The run this one branches from (time travel / regeneration lineage)."""
    input: RunAgentInput | None = _omit()


class RunFinishedEvent(BaseEvent):
    type: Literal[EventType.RUN_FINISHED] = EventType.RUN_FINISHED
    thread_id: str
    run_id: str
    result: Any | None = _omit()
    outcome: RunFinishedOutcome | None = _omit()
    usage: list[TokenUsage] | None = _omit()


class RunErrorEvent(BaseEvent):
    type: Literal[EventType.RUN_ERROR] = EventType.RUN_ERROR
    message: str
    code: str | None = _omit()
    usage: list[TokenUsage] | None = _omit()


class StepStartedEvent(AttributableEvent):
    type: Literal[EventType.STEP_STARTED] = EventType.STEP_STARTED
    step_name: str


class StepFinishedEvent(AttributableEvent):
    type: Literal[EventType.STEP_FINISHED] = EventType.STEP_FINISHED
    step_name: str


class ReasoningStartEvent(AttributableEvent):
    type: Literal[EventType.REASONING_START] = EventType.REASONING_START
    message_id: str


class ReasoningMessageStartEvent(AttributableEvent):
    type: Literal[EventType.REASONING_MESSAGE_START] = EventType.REASONING_MESSAGE_START
    message_id: str
    role: Literal["reasoning"] = "reasoning"


class ReasoningMessageContentEvent(AttributableEvent):
    type: Literal[EventType.REASONING_MESSAGE_CONTENT] = EventType.REASONING_MESSAGE_CONTENT
    message_id: str
    delta: str


class ReasoningMessageEndEvent(AttributableEvent):
    type: Literal[EventType.REASONING_MESSAGE_END] = EventType.REASONING_MESSAGE_END
    message_id: str


class ReasoningMessageChunkEvent(AttributableEvent):
    type: Literal[EventType.REASONING_MESSAGE_CHUNK] = EventType.REASONING_MESSAGE_CHUNK
    message_id: str | None = _omit()
    delta: str | None = _omit()


class ReasoningEndEvent(AttributableEvent):
    type: Literal[EventType.REASONING_END] = EventType.REASONING_END
    message_id: str


class ReasoningEncryptedValueEvent(AttributableEvent):
    type: Literal[EventType.REASONING_ENCRYPTED_VALUE] = EventType.REASONING_ENCRYPTED_VALUE
    subtype: Literal["tool-call", "message"]
    entity_id: str
    encrypted_value: str


class SubagentStartedEvent(BaseEvent):
    type: Literal[EventType.SUBAGENT_STARTED] = EventType.SUBAGENT_STARTED
    subagent_run_id: str
    name: str
    description: str | None = _omit()
    parent_subagent_run_id: str | None = _omit()
    parent_tool_call_id: str | None = _omit()
    parent_message_id: str | None = _omit()


class SubagentFinishedEvent(BaseEvent):
    type: Literal[EventType.SUBAGENT_FINISHED] = EventType.SUBAGENT_FINISHED
    subagent_run_id: str
    result: Any | None = _omit()
    outcome: SubagentFinishedOutcome | None = _omit()


class SubagentErrorEvent(BaseEvent):
    type: Literal[EventType.SUBAGENT_ERROR] = EventType.SUBAGENT_ERROR
    subagent_run_id: str
    message: str
    code: str | None = _omit()


Event = Annotated[
    Union[
        TextMessageStartEvent,
        TextMessageContentEvent,
        TextMessageEndEvent,
        TextMessageChunkEvent,
        ToolCallStartEvent,
        ToolCallArgsEvent,
        ToolCallEndEvent,
        ToolCallChunkEvent,
        ToolCallResultEvent,
        StateSnapshotEvent,
        StateDeltaEvent,
        MessagesSnapshotEvent,
        ActivitySnapshotEvent,
        ActivityDeltaEvent,
        RawEvent,
        CustomEvent,
        RunStartedEvent,
        RunFinishedEvent,
        RunErrorEvent,
        StepStartedEvent,
        StepFinishedEvent,
        ReasoningStartEvent,
        ReasoningMessageStartEvent,
        ReasoningMessageContentEvent,
        ReasoningMessageEndEvent,
        ReasoningMessageChunkEvent,
        ReasoningEndEvent,
        ReasoningEncryptedValueEvent,
        SubagentStartedEvent,
        SubagentFinishedEvent,
        SubagentErrorEvent,
    ],
    Field(discriminator="type"),
]
"""Any AG-UI 1.0 event, discriminated by ``type``."""

EVENT_MODELS: tuple[type[BaseEvent], ...] = get_args(get_args(Event)[0])
"""One model per event type, in the order of :class:`EventType`."""

MODEL_BY_TYPE: dict[str, type[BaseEvent]] = {
    model.model_fields["type"].default.value: model for model in EVENT_MODELS
}


_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
_MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


# -- entry points --------------------------------------------------------------


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in err["loc"])
        out.append((loc, err["msg"]))
    return out


def _invalid(exc: ValidationError, obj: Any, what: str) -> InvalidEvent:
    event_type = obj.get("type") if isinstance(obj, dict) else None
    problems = _problems(exc)
    if what == "event" and isinstance(obj, dict) and "type" not in obj:
        summary = "missing 'type': every AG-UI event names its type"
    elif what == "event" and isinstance(obj, dict) and str(event_type) not in MODEL_BY_TYPE:
        summary = f"unknown event type {event_type!r}; expected one of the AG-UI 1.0 types"
    else:
        # Tagged unions prefix each location with the tag; drop it for readability.
        summary = "; ".join(
            f"{loc.removeprefix(f'{event_type}.') or '(root)'}: {msg}" for loc, msg in problems
        )
    label = f"invalid {event_type} event" if event_type else f"invalid {what}"
    return InvalidEvent(f"{label}: {summary}", event_type=event_type, problems=problems)


def _as_mapping(obj: Any, what: str) -> Any:
    if isinstance(obj, BaseModel):
        # Models of other libraries (e.g. the official ``ag_ui.core`` events)
        # are taken through their own wire form.
        return obj.model_dump(mode="json", by_alias=True, exclude_none=False)
    if not isinstance(obj, dict):
        raise InvalidEvent(
            f"an AG-UI {what} must be a mapping (JSON object), got {type(obj).__name__}"
        )
    return obj


def parse_event(obj: Any) -> Event:
    """Validate *obj* as an AG-UI 1.0 event and return its model.

    *obj* is a wire mapping (camelCase or snake_case keys), one of our
    models, or any pydantic model with the same wire form (for example an
    official ``ag_ui.core`` event). Raises :class:`InvalidEvent`.
    """
    if isinstance(obj, BaseEvent):
        return obj  # type: ignore[return-value]
    data = _as_mapping(obj, "event")
    try:
        return _EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise _invalid(exc, data, "event") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidEvent(f"invalid event: {exc}") from None


def to_wire(event: BaseModel) -> dict[str, Any]:
    """Return the canonical wire dict of an event or message model.

    camelCase keys, JSON-compatible values, unknown fields kept, optional
    fields without a value left out.
    """
    return event.model_dump(mode="json", by_alias=True)


def parse_message(obj: Any) -> Message:
    """Validate *obj* as an AG-UI 1.0 message (any role). Raises :class:`InvalidEvent`."""
    data = _as_mapping(obj, "message")
    try:
        return _MESSAGE_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise _invalid(exc, data, "message") from None


def message_to_wire(message: BaseModel) -> dict[str, Any]:
    """Return the canonical wire dict of a message model."""
    return message.model_dump(mode="json", by_alias=True)


# -- the hot path ----------------------------------------------------------------
#
# Most events of a run are flat (token deltas, tool-call argument deltas, step
# markers): every field is a string, a number or an opaque JSON value. For
# those, validating into a TypedDict whose keys are the wire names gives the
# canonical wire dict directly, without building and dumping a model (about
# three times faster). The TypedDicts are derived from the models above, so the
# two paths cannot drift apart; tests check that they agree.


def _is_flat(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return False
    return all(_is_flat(arg) for arg in get_args(annotation) if not isinstance(arg, str | int))


@dataclass(frozen=True)
class _FastPath:
    adapter: TypeAdapter[Any]
    omittable: frozenset[str]
    """Wire keys of optional fields that are left out when ``None``."""
    defaults: tuple[tuple[str, Any], ...]
    """Wire keys with a non-``None`` default the model writes out (e.g. a reasoning role)."""
    snake_names: frozenset[str]
    """Attribute names that differ from their wire names: input using them takes the model path."""


def _fast_path_for(model: type[BaseEvent]) -> _FastPath | None:
    fields: dict[str, Any] = {}
    omittable: set[str] = set()
    defaults: list[tuple[str, Any]] = []
    snake: set[str] = set()
    for name, info in model.model_fields.items():
        annotation: Any = info.annotation
        if not _is_flat(annotation):
            return None
        key = info.alias or name
        if key != name:
            snake.add(name)
        if name == "type":
            annotation = Literal[info.default.value]  # plain str, not the enum member
        elif info.metadata:
            annotation = Annotated[(annotation, *info.metadata)]
        if info.is_required() or name == "type":
            fields[key] = Required[annotation]
            continue
        fields[key] = NotRequired[annotation]
        if info.default is None:
            omittable.add(key)
        else:
            defaults.append((key, info.default))
    typed = TypedDict(f"{model.__name__}Wire", fields)  # type: ignore[misc]
    with_config(ConfigDict(extra="allow"))(typed)
    return _FastPath(TypeAdapter(typed), frozenset(omittable), tuple(defaults), frozenset(snake))


def _build_fast_path() -> dict[str, _FastPath]:
    fast: dict[str, _FastPath] = {}
    for event_type, model in MODEL_BY_TYPE.items():
        path = _fast_path_for(model)
        if path is not None:
            fast[event_type] = path
    return fast


_FAST_PATH = _build_fast_path()
FAST_PATH_TYPES = frozenset(_FAST_PATH)
"""Event types that :func:`validate_wire` validates without building a model."""

MAX_DEPTH = 256
"""Deepest nesting of arrays and objects accepted inside an event."""

FORBIDDEN_KEY = "__proto__"
"""The one object key refused anywhere in an event: JavaScript's msgpack
decoder refuses a frame that holds it, and in a plain JavaScript object it
names the prototype, not a property."""

_FORBIDDEN_KEY_MESSAGE = (
    f"the key {FORBIDDEN_KEY!r} is not allowed: JavaScript subscribers cannot take it; rename it"
)


class ValuesExhausted(Exception):
    """Raised by :func:`check_json_value` when *values* ran out: the value holds
    more than its caller allows. Not a ProtocolError: the caller says what it
    means (a codec: a payload too large)."""


def check_json_value(
    value: Any,
    error: type[ProtocolError] = InvalidEvent,
    depth: int = 0,
    values: list[int] | None = None,
) -> None:
    """Raise *error* unless *value* is made of JSON values only.

    JSON values: dicts with string keys, lists, strings, integers, finite
    floats, booleans and ``None``, nested at most :data:`MAX_DEPTH` deep.
    Anything else could not be sent to a JSON subscriber unchanged. The key
    :data:`FORBIDDEN_KEY` is refused too: JavaScript subscribers could not
    take it.

    With *values* (``[n]``), the same walk counts the values (array items and
    object entries, nested) down from ``n`` and raises
    :class:`ValuesExhausted` as soon as there are more than ``n``, before it
    walks them.
    """
    if depth > MAX_DEPTH:
        raise error(f"value nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return
    if kind is float:
        if not math.isfinite(value):
            raise error("NaN and infinity are not allowed: JSON cannot express them")
        return
    if kind is dict:
        if values is not None:
            values[0] -= len(value)
            if values[0] < 0:
                raise ValuesExhausted
        for key, item in value.items():
            if type(key) is not str:
                raise error(f"map key {key!r} is not a string: JSON objects need string keys")
            if key == FORBIDDEN_KEY:
                raise error(_FORBIDDEN_KEY_MESSAGE)
            check_json_value(item, error, depth + 1, values)
        return
    if kind is list:
        if values is not None:
            values[0] -= len(value)
            if values[0] < 0:
                raise ValuesExhausted
        for item in value:
            check_json_value(item, error, depth + 1, values)
        return
    if kind is bytes:
        raise error("binary strings are not allowed: send text (e.g. base64)")
    if isinstance(value, str | int) and not isinstance(value, enum.Flag):
        return  # str and int subclasses (e.g. EventType) serialize as their value
    raise error(f"unsupported value of type {kind.__name__}: send JSON values only")


def _check_event_values(wire: dict[str, Any]) -> None:
    if FORBIDDEN_KEY in wire:
        raise InvalidEvent(
            f"invalid {wire.get('type')} event: {_FORBIDDEN_KEY_MESSAGE}",
            event_type=str(wire.get("type")) or None,
        )
    for key, value in wire.items():
        kind = type(value)
        if kind is str or kind is int or kind is bool or value is None:
            continue  # the common case (ids, deltas, timestamps): nothing to walk
        else:
            try:
                check_json_value(value, InvalidEvent, 1)
            except InvalidEvent as exc:
                label = f"invalid {wire.get('type')} event" if wire.get("type") else "invalid event"
                raise InvalidEvent(
                    f"{label}: {key}: {exc}", event_type=str(wire.get("type")) or None
                ) from None


def validate_wire(obj: Any, *, values_checked: bool = False) -> dict[str, Any]:
    """Validate *obj* as an AG-UI event and return its canonical wire dict.

    Equivalent to ``to_wire(parse_event(obj))`` and faster for the common
    flat events; also rejects values JSON cannot express (NaN, infinity,
    bytes, non-string keys, nesting deeper than :data:`MAX_DEPTH`), so that
    every valid event can go to msgpack and JSON subscribers alike
    (*values_checked*: :func:`check_json_value` passed on *obj* already, as
    it does on every frame a msgpack decoder of the codec returns; its values
    are not walked again). Raises :class:`InvalidEvent`.
    """
    if type(obj) is dict:
        event_type = obj.get("type")
        path = _FAST_PATH.get(event_type) if type(event_type) is str else None
        if path is not None and path.snake_names.isdisjoint(obj):
            try:
                wire: dict[str, Any] = path.adapter.validate_python(obj)
            except ValidationError:
                pass  # a real error: the model path words it
            else:
                if None in wire.values():
                    omit = path.omittable
                    wire = {k: v for k, v in wire.items() if v is not None or k not in omit}
                for key, default in path.defaults:
                    if key not in wire:
                        wire[key] = default
                if not values_checked:
                    _check_event_values(wire)
                return wire
    event = parse_event(obj)  # structural problems first: they are the clearer message
    if type(obj) is dict and not values_checked:
        _check_event_values(obj)
    try:
        return to_wire(event)
    except (ValueError, RecursionError) as exc:
        raise InvalidEvent(f"invalid {event.type.value} event: {exc}") from None


def validate_batch(events: Iterable[Any], *, values_checked: bool = False) -> list[dict[str, Any]]:
    """:func:`validate_wire` for each of *events*, in order (*values_checked*
    as for :func:`validate_wire`).

    The :class:`InvalidEvent` raised for a bad event carries that event's
    position in *events* as its ``index``.
    """
    wires = []
    for index, event in enumerate(events):
        try:
            wires.append(validate_wire(event, values_checked=values_checked))
        except InvalidEvent as exc:
            exc.index = index
            raise
    return wires
