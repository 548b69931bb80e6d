"""The gateway's wire protocol (v1), sans I/O: commands in, frames out.

``docs/protocol.md`` is the specification; this module is its executable
form. It parses client commands (:func:`parse_command`), builds server frames
(``*_frame`` functions) and encodes them (:func:`encode_frame`,
:func:`event_frame`). It imports no asyncio, no websockets and no redis, so it
is tested by feeding bytes and looking at what comes out.

Event frames are built once per event and encoding and sent as the same bytes
to every subscriber. For msgpack the stored event bytes are spliced into the
envelope without decoding them.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..errors import AguiHubError, DecodeError, PayloadTooLarge, ProtocolError
from .codec import DEFAULT_MAX_SIZE, MAX_VALUES, Encoding, decode, encode, unpack_stored
from .offsets import Offset, check_thread, offset_key

__all__ = [
    "SUBPROTOCOLS",
    "Auth",
    "CloseCode",
    "Command",
    "CommandError",
    "ListRuns",
    "Ping",
    "Position",
    "Publish",
    "Start",
    "Subscribe",
    "Unsubscribe",
    "check_event_ids",
    "encode_frame",
    "encoding_of",
    "event_frame",
    "parse_command",
]

SUBPROTOCOL_JSON = "agui-hub.v1.json"
SUBPROTOCOL_MSGPACK = "agui-hub.v1.msgpack"
SUBPROTOCOLS = (SUBPROTOCOL_MSGPACK, SUBPROTOCOL_JSON)
"""The subprotocols the gateway speaks, in its order of preference."""

MAX_EVENTS_PER_PUBLISH = 1000


def encoding_of(subprotocol: str | None) -> Encoding:
    """The frame encoding of a negotiated subprotocol."""
    if subprotocol == SUBPROTOCOL_MSGPACK:
        return Encoding.MSGPACK
    if subprotocol == SUBPROTOCOL_JSON:
        return Encoding.JSON
    raise ValueError(f"not an agui-hub subprotocol: {subprotocol!r}")


class CloseCode(enum.IntEnum):
    """WebSocket close codes the gateway uses (see docs/protocol.md)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    SERVICE_RESTART = 1012
    """The gateway is draining: reconnect (to any gateway) and resume."""
    TRY_AGAIN_LATER = 1013
    """The store is unavailable: reconnect with backoff and resume."""
    SLOW_CONSUMER = 4000
    """The send queue overflowed: reconnect and resume, nothing is lost."""
    IDLE_TIMEOUT = 4001
    UNAUTHORIZED = 4401
    """The connection's credentials expired or never came: connect again with a new token."""
    FORBIDDEN = 4403
    """The connection's credentials were revoked: do not reconnect with them."""

    @property
    def resumable(self) -> bool:
        """Whether a client should reconnect and resume after this code."""
        return self not in {CloseCode.NORMAL, CloseCode.UNAUTHORIZED, CloseCode.FORBIDDEN}


# -- commands ---------------------------------------------------------------------


class CommandError(ProtocolError):
    """A client frame that is not a valid command; answered with an error frame.

    :attr:`code` is one of the error codes of docs/protocol.md and
    :attr:`command_id` the id of the offending command, when it had one.
    """

    def __init__(self, code: str, message: str, command_id: Any = None) -> None:
        self.code = code
        self.command_id = command_id
        super().__init__(message)


class StartKind(enum.Enum):
    LIVE = "live"
    START = "start"
    SNAPSHOT = "snapshot"
    AFTER = "after"


@dataclass(frozen=True, slots=True)
class Position:
    """A place in a thread: the last offset a client has, in the epoch it saw.

    Subscribing from a position delivers exactly the events after
    :attr:`offset` when :attr:`epoch` is still the thread's epoch (otherwise a
    snapshot). Store it with :meth:`to_json` to resume in another process.
    """

    offset: Offset
    epoch: str | None

    def to_json(self) -> dict[str, Any]:
        """The ``from`` value of a subscribe command: ``{"offset": …, "epoch": …}``."""
        return {"offset": self.offset, "epoch": self.epoch}

    @classmethod
    def from_json(cls, value: Any) -> Position:
        """Parse what :meth:`to_json` wrote. Raises :class:`ValueError` when it is not that."""
        if not isinstance(value, dict) or not isinstance(value.get("offset"), str):
            raise ValueError('a position is {"offset": "<ms>-<seq>", "epoch": ...}')
        epoch = value.get("epoch")
        if epoch is not None and not isinstance(epoch, str):
            raise ValueError("a position's epoch is a string or null")
        try:
            offset_key(value["offset"])
        except AguiHubError as exc:
            raise ValueError(str(exc)) from None
        return cls(value["offset"], epoch)


Start = StartKind | Position


@dataclass(frozen=True, slots=True)
class Subscribe:
    id: Any
    thread: str
    start: Start
    run: str | None = None
    branch: str | None = None
    """Only the branch whose latest run is this one (docs/protocol.md, subscribe)."""
    presence: bool = False
    """Also send who else watches the thread: ``presence``, ``joined``, ``left`` frames."""
    client: dict[str, Any] | None = None
    """What the connection tells others about itself on this thread (presence)."""


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    id: Any
    thread: str


@dataclass(frozen=True, slots=True)
class Publish:
    id: Any
    thread: str
    events: list[Any]
    event_ids: list[str] | None
    values_checked: bool = field(default=False, compare=False)
    """Whether the events' values passed ``check_json_value`` already (a
    msgpack frame's do, as it is decoded): validate them with
    ``values_checked``, which does not walk them again."""


@dataclass(frozen=True, slots=True)
class Ping:
    id: Any


@dataclass(frozen=True, slots=True)
class ListRuns:
    """List a thread's runs (the index of runs: docs/protocol.md, ``runs``): the
    newest *limit* of them."""

    id: Any
    thread: str
    limit: int = 1000


MAX_RUNS_LISTED = 4096
"""The most runs one ``runs`` reply lists (what a store's index keeps)."""


@dataclass(frozen=True, slots=True)
class Auth:
    """Authenticate an open connection, or refresh its credentials before they expire."""

    id: Any
    token: str = field(repr=False)
    client: dict[str, Any] | None = None
    """What the connection tells others about itself (presence): a small flat map."""


@dataclass(frozen=True, slots=True)
class Presence:
    """Who watches a thread now, on every gateway (docs/protocol.md, ``presence``)."""

    id: Any
    thread: str
    limit: int = 100


MAX_PRESENCE_LISTED = 1000
"""The most entries one ``presence`` reply lists."""
MAX_CLIENT_BYTES = 256
"""Largest ``client`` map (JSON-encoded) a connection may announce."""
MAX_CLIENT_KEY_CHARS = 32


@dataclass(frozen=True, slots=True)
class Run:
    """Start a run of an upstream agent in a thread (the HTTP bridge, docs/bridge.md).

    The input is built from the thread (its messages and state, ``parentRunId``
    its latest run) with :attr:`messages` appended; :attr:`state`, when given,
    replaces the thread's state. With :attr:`parent_run_id`, from the branch
    that ends with that run instead (a regenerate, an edit: docs/protocol.md).
    """

    id: Any
    thread: str
    agent: str
    messages: list[Any] = field(default_factory=list)
    state: Any = None
    tools: list[Any] = field(default_factory=list)
    context: list[Any] = field(default_factory=list)
    forwarded_props: Any = None
    run_id: str | None = None
    parent_run_id: str | None = None


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel the bridged run going in a thread (only *run_id*, when given)."""

    id: Any
    thread: str
    run_id: str | None = None
    abandoned: bool = False
    """End a run the thread holds open that no gateway relays (a crashed gateway's)."""


Command = Subscribe | Unsubscribe | Publish | Ping | Auth | Run | Cancel | ListRuns | Presence

MAX_TOKEN_CHARS = 8192


def _command_id(frame: dict[str, Any]) -> Any:
    value = frame.get("id")
    if value is None or (type(value) in (str, int) and len(str(value)) <= 128):
        return value
    raise CommandError("bad_command", "id must be a string or an integer (at most 128 chars)")


def _thread(frame: dict[str, Any], command_id: Any) -> str:
    thread = frame.get("thread")
    if not isinstance(thread, str):
        raise CommandError("bad_command", "thread must be a string", command_id)
    try:
        return check_thread(thread)
    except ProtocolError as exc:
        raise CommandError("bad_command", str(exc), command_id) from None


def _start(value: Any, command_id: Any) -> Start:
    if value is None or value == "live":
        return StartKind.LIVE
    if value == "start":
        return StartKind.START
    if value == "snapshot":
        return StartKind.SNAPSHOT
    if isinstance(value, dict) and "offset" in value:
        offset, epoch = value.get("offset"), value.get("epoch")
        if not isinstance(offset, str):
            raise CommandError("invalid_offset", "from.offset must be a string", command_id)
        try:
            offset_key(offset)
        except AguiHubError as exc:
            raise CommandError("invalid_offset", str(exc), command_id) from None
        if epoch is not None and not isinstance(epoch, str):
            raise CommandError("bad_command", "from.epoch must be a string", command_id)
        return Position(offset, epoch)
    raise CommandError(
        "bad_command",
        'from must be "live", "start", "snapshot" or {"offset": ..., "epoch": ...}',
        command_id,
    )


def check_event_ids(event_ids: Sequence[str] | None, count: int) -> list[str] | None:
    """*event_ids* as a list, after checking there is one per event and no repeat.

    Raises :class:`ValueError`: a repeated id would make the store take the
    second event for a retry of the first and silently drop it.
    """
    if event_ids is None:
        return None
    ids = list(event_ids)
    if len(ids) != count:
        raise ValueError("event_ids must hold one id per event")
    if len(set(ids)) != len(ids):
        raise ValueError("event_ids must all be different (each event needs its own id)")
    if not all(isinstance(i, str) and i for i in ids):
        raise ValueError("event ids are non-empty strings")
    return ids


def parse_command(
    data: bytes | str,
    encoding: Encoding,
    *,
    max_size: int | None = DEFAULT_MAX_SIZE,
    max_values: int | None = MAX_VALUES,
) -> Command:
    """Parse one client frame of at most *max_size* bytes and *max_values* JSON
    values. Raises :class:`CommandError` (never anything else)."""
    if encoding is Encoding.MSGPACK and isinstance(data, str):
        raise CommandError("bad_frame", "this connection speaks msgpack: send binary frames")
    if encoding is Encoding.JSON and not isinstance(data, str):
        raise CommandError("bad_frame", "this connection speaks JSON: send text frames")
    try:
        frame = decode(data, encoding, max_size=max_size, max_values=max_values)
    except PayloadTooLarge as exc:
        raise CommandError("payload_too_large", str(exc)) from None
    except DecodeError as exc:
        raise CommandError("bad_frame", str(exc)) from None
    if not isinstance(frame, dict):
        raise CommandError("bad_frame", "a command is a map (JSON object)")
    command_id = _command_id(frame)
    kind = frame.get("type")
    if kind == "subscribe":
        run = frame.get("run")
        if run is not None and not isinstance(run, str):
            raise CommandError("bad_command", "run must be a string", command_id)
        branch = _run_id(frame, command_id, "branch")
        if run is not None and branch is not None:
            raise CommandError("bad_command", "run and branch do not go together", command_id)
        presence = frame.get("presence", False)
        if not isinstance(presence, bool):
            raise CommandError("bad_command", "presence must be true or false", command_id)
        return Subscribe(
            command_id,
            _thread(frame, command_id),
            _start(frame.get("from"), command_id),
            run,
            branch,
            presence,
            _client(frame, command_id),
        )
    if kind == "unsubscribe":
        return Unsubscribe(command_id, _thread(frame, command_id))
    if kind == "publish":
        thread = _thread(frame, command_id)
        events = frame.get("events")
        if events is None and "event" in frame:
            events = [frame["event"]]
        if not isinstance(events, list) or not events:
            raise CommandError("bad_command", "events must be a non-empty list", command_id)
        if len(events) > MAX_EVENTS_PER_PUBLISH:
            raise CommandError(
                "bad_command", f"at most {MAX_EVENTS_PER_PUBLISH} events per publish", command_id
            )
        ids = frame.get("eventIds")
        if ids is not None and (
            not isinstance(ids, list)
            or len(ids) != len(events)
            or not all(isinstance(i, str) and 0 < len(i) <= 256 for i in ids)
            or len(set(ids)) != len(ids)
        ):
            raise CommandError(
                "bad_command",
                "eventIds must be a list of different non-empty strings, one per event",
                command_id,
            )
        return Publish(command_id, thread, events, ids, encoding is Encoding.MSGPACK)
    if kind == "ping":
        return Ping(command_id)
    if kind == "runs":
        limit = frame.get("limit", 1000)
        if (
            not isinstance(limit, int)
            or isinstance(limit, bool)
            or not 0 < limit <= MAX_RUNS_LISTED
        ):
            raise CommandError(
                "bad_command", f"limit must be an integer from 1 to {MAX_RUNS_LISTED}", command_id
            )
        return ListRuns(command_id, _thread(frame, command_id), limit)
    if kind == "presence":
        limit = frame.get("limit", 100)
        if (
            not isinstance(limit, int)
            or isinstance(limit, bool)
            or not 0 < limit <= MAX_PRESENCE_LISTED
        ):
            raise CommandError(
                "bad_command",
                f"limit must be an integer from 1 to {MAX_PRESENCE_LISTED}",
                command_id,
            )
        return Presence(command_id, _thread(frame, command_id), limit)
    if kind == "auth":
        token = frame.get("token")
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise CommandError(
                "bad_command",
                f"token must be a non-empty string of at most {MAX_TOKEN_CHARS} characters",
                command_id,
            )
        return Auth(command_id, token, _client(frame, command_id))
    if kind == "run":
        return _run_command(frame, command_id)
    if kind == "cancel":
        abandoned = frame.get("abandoned", False)
        if not isinstance(abandoned, bool):
            raise CommandError("bad_command", "abandoned must be true or false", command_id)
        return Cancel(command_id, _thread(frame, command_id), _run_id(frame, command_id), abandoned)
    if kind is None:
        raise CommandError("bad_command", "a command needs a type", command_id)
    raise CommandError(
        "unknown_command",
        f"unknown command {kind!r}: expected subscribe, unsubscribe, publish, ping, auth, "
        "run, cancel, runs or presence",
        command_id,
    )


def _client(frame: dict[str, Any], command_id: Any) -> dict[str, Any] | None:
    """A command's ``client`` map: flat, short keys, at most :data:`MAX_CLIENT_BYTES`."""
    client = frame.get("client")
    if client is None:
        return None
    problem = None
    if not isinstance(client, dict):
        problem = "a map"
    elif not all(isinstance(k, str) and 0 < len(k) <= MAX_CLIENT_KEY_CHARS for k in client):
        problem = f"a map of keys of 1 to {MAX_CLIENT_KEY_CHARS} characters"
    elif not all(v is None or isinstance(v, str | int | float | bool) for v in client.values()):
        problem = "a flat map: its values strings, numbers, booleans or null"
    elif not all(
        -(2**63) <= v < 2**64 for v in client.values() if isinstance(v, int)
    ):  # what msgpack (and so the store) carries
        problem = "a map whose integers fit in 64 bits"
    else:
        try:
            size = len(json.dumps(client, ensure_ascii=False, allow_nan=False).encode())
        except ValueError:
            size = None
        if size is None or size > MAX_CLIENT_BYTES:
            problem = f"at most {MAX_CLIENT_BYTES} bytes of JSON (finite numbers)"
    if problem is not None:
        raise CommandError(
            "bad_command",
            f"client must be {problem} (what others see of this connection: name, device)",
            command_id,
        )
    checked: dict[str, Any] = client
    return checked


def _run_id(frame: dict[str, Any], command_id: Any, key: str = "runId") -> str | None:
    run_id = frame.get(key)
    if run_id is not None and (not isinstance(run_id, str) or not 0 < len(run_id) <= 256):
        raise CommandError("bad_command", f"{key} must be a string of 1 to 256 chars", command_id)
    return run_id


def _run_command(frame: dict[str, Any], command_id: Any) -> Run:
    thread = _thread(frame, command_id)
    agent = frame.get("agent")
    if not isinstance(agent, str) or not 0 < len(agent) <= 64:
        raise CommandError("bad_command", "agent must be the name of an upstream agent", command_id)
    lists = {}
    for key in ("messages", "tools", "context"):
        value = frame.get(key, [])
        if not isinstance(value, list):
            raise CommandError("bad_command", f"{key} must be a list", command_id)
        if len(value) > MAX_EVENTS_PER_PUBLISH:
            raise CommandError(
                "bad_command", f"at most {MAX_EVENTS_PER_PUBLISH} {key} per run", command_id
            )
        lists[key] = value
    return Run(
        command_id,
        thread,
        agent,
        lists["messages"],
        frame.get("state"),
        lists["tools"],
        lists["context"],
        frame.get("forwardedProps"),
        _run_id(frame, command_id),
        _run_id(frame, command_id, "parentRunId"),
    )


# -- server frames ----------------------------------------------------------------------


def _with_id(frame: dict[str, Any], command_id: Any) -> dict[str, Any]:
    if command_id is not None:
        frame["id"] = command_id
    return frame


def subscribed_frame(
    command_id: Any, thread: str, epoch: str | None, offset: Offset, recovered: bool
) -> dict[str, Any]:
    return _with_id(
        {
            "type": "subscribed",
            "thread": thread,
            "epoch": epoch,
            "offset": offset,
            "recovered": recovered,
        },
        command_id,
    )


def snapshot_frame(
    thread: str, offset: Offset, epoch: str | None, events: list[dict[str, Any]], complete: bool
) -> dict[str, Any]:
    return {
        "type": "snapshot",
        "thread": thread,
        "offset": offset,
        "epoch": epoch,
        "complete": complete,
        "events": events,
    }


def unsubscribed_frame(command_id: Any, thread: str) -> dict[str, Any]:
    return _with_id({"type": "unsubscribed", "thread": thread}, command_id)


def published_frame(command_id: Any, thread: str, offsets: list[Offset]) -> dict[str, Any]:
    return _with_id({"type": "published", "thread": thread, "offsets": offsets}, command_id)


def running_frame(command_id: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The reply to ``run``: the run is going (its events follow in the thread)."""
    return _with_id({"type": "running", **run}, command_id)


def cancelled_frame(command_id: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The reply to ``cancel``: the run has ended (its RUN_ERROR is stored)."""
    return _with_id({"type": "cancelled", **run}, command_id)


def runs_frame(
    command_id: Any, thread: str, runs: list[dict[str, Any]], more: bool, agents: list[str]
) -> dict[str, Any]:
    """The reply to ``runs``: the thread's runs, in the order they started;
    *more*: older runs were left out (the command's ``limit``); *agents*: the
    upstream agents this connection may ``run`` in the thread."""
    frame = {"type": "runs", "thread": thread, "runs": runs, "more": more, "agents": agents}
    return _with_id(frame, command_id)


def presence_frame(
    command_id: Any,
    thread: str,
    count: int,
    entries: list[dict[str, Any]],
    *,
    hidden: bool = False,
) -> dict[str, Any]:
    """Who watches *thread*: the reply to ``presence``, or (without id) the first
    frame of a ``presence: true`` subscription. *hidden*: the gateway shows the
    count only."""
    frame: dict[str, Any] = {
        "type": "presence",
        "thread": thread,
        "count": count,
        "more": not hidden and count > len(entries),
        "entries": entries,
    }
    if hidden:
        frame["hidden"] = True
    return _with_id(frame, command_id)


def pong_frame(command_id: Any) -> dict[str, Any]:
    return _with_id({"type": "pong"}, command_id)


def authenticated_frame(
    command_id: Any, subject: str, expires: float | None, grants: dict[str, list[str]]
) -> dict[str, Any]:
    """The reply to ``auth``: who the connection now is, until when, and what it may do."""
    return _with_id(
        {
            "type": "authenticated",
            "subject": subject,
            "expires": None if expires is None else int(expires),
            "grants": grants,
        },
        command_id,
    )


def error_frame(
    code: str,
    message: str,
    command_id: Any = None,
    thread: str | None = None,
    index: int | None = None,
    *,
    retry_after: float | None = None,
) -> dict[str, Any]:
    """An error frame; *index* is the position, in a publish, of the event at fault;
    *retry_after* (``rate_limited``) the seconds to wait before sending it again."""
    frame: dict[str, Any] = {"type": "error", "code": code, "message": message}
    if thread is not None:
        frame["thread"] = thread
    if index is not None:
        frame["index"] = index
    if retry_after is not None:
        frame["retryAfter"] = round(retry_after, 3)
    return _with_id(frame, command_id)


def encode_frame(frame: dict[str, Any], encoding: Encoding) -> bytes | str:
    """Encode a server frame: bytes for msgpack (binary frame), str for JSON (text frame)."""
    data = encode(frame, encoding)
    return data if encoding is Encoding.MSGPACK else data.decode()


_MSGPACK_EVENT_HEAD = msgpack.packb("type") + msgpack.packb("event")


def event_frame(thread: str, offset: Offset, event_data: bytes, encoding: Encoding) -> bytes | str:
    """The frame of one stored event, built from its msgpack bytes.

    msgpack: the stored bytes are spliced in unchanged. JSON: they are decoded
    once and re-encoded. Either way, call it once per event and encoding and
    send the result to every subscriber.
    """
    if encoding is Encoding.MSGPACK:
        return b"".join(
            (
                b"\x84",  # a map of four entries
                _MSGPACK_EVENT_HEAD,
                msgpack.packb("thread"),
                msgpack.packb(thread),
                msgpack.packb("offset"),
                msgpack.packb(offset),
                msgpack.packb("event"),
                event_data,
            )
        )
    event = unpack_stored(event_data)
    return "".join(
        (
            '{"type":"event","thread":',
            json.dumps(thread, ensure_ascii=False),
            ',"offset":"',
            offset,
            '","event":',
            json.dumps(event, ensure_ascii=False, separators=(",", ":")),
            "}",
        )
    )
