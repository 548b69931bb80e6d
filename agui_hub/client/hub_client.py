"""An asyncio client for the agui-hub gateway: follow threads, publish, resume.

.. code-block:: python

    from agui_hub.client import HubClient, ThreadEvent

    async with HubClient("ws://127.0.0.1:8765") as hub:
        async for item in hub.subscribe("t1", start="start"):
            if isinstance(item, ThreadEvent):
                print(item.offset, item.event)

One :class:`HubClient` holds one WebSocket connection (msgpack or JSON) and
multiplexes any number of :class:`Subscription` objects over it, one per
thread. When the connection drops (network, a gateway restart, a "slow
consumer" close) the client reconnects by itself with exponential backoff and
full jitter, and resubscribes every thread from the last offset and epoch it
received, so a consumer sees every event exactly once and in order. Each
(re)subscription yields a :class:`Subscribed` item whose ``recovered`` says
whether the resume was complete; when it was not (history trimmed, thread
re-created) a :class:`Snapshot` follows: reset what you built and start again
from its events.

A subscription can expand ``*_CHUNK`` events into START / CONTENT / END
(``expand_chunks=True``) and keep a live :class:`~agui_hub.agui.reducer.ThreadState`
of everything it yielded (``state=True``), for a UI that reads messages and
state at any moment.

The client needs ``websockets``, ``msgpack`` and ``pydantic`` only; it never
imports redis.

Authentication: ``token=`` is a JWT, or a callable returning one (a token
provider, sync or async), sent as ``Authorization: Bearer`` on every
(re)connection. With a provider the client renews the credentials on the open
connection before they expire (an ``auth`` command) and reconnects with a new
token when the gateway closes with 4401; see :class:`HubClient`.

Errors: :class:`~agui_hub.errors.HubUnreachable` (cannot connect, or
reconnecting gave up), :class:`~agui_hub.errors.ConnectionRejected` (the
connection ended for good: the gateway refused the token at the handshake
(HTTP 401 / 403), closed it with 1000, 4403, or 4401 without a token provider,
or it cannot work as configured: a gateway frame over ``max_receive_bytes``,
see :data:`CLIENT_FAULTS`), :class:`~agui_hub.errors.CommandRejected`
(an error frame; ``forbidden`` also ends a subscription whose grant a token
refresh took away), :class:`~agui_hub.errors.RateLimited` (a command still
refused for the rate limit when its deadline came; before that it is sent
again by itself), and for :meth:`HubClient.publish` the same
:class:`~agui_hub.errors.InvalidEvent` / :class:`~agui_hub.errors.SequenceError`
a local publish raises.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import enum
import inspect
import itertools
import json
import logging
import math
import random
import secrets
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
    InvalidURI,
)

from ..agui.chunks import ChunkExpander
from ..agui.events import validate_batch
from ..agui.reducer import ThreadState
from ..errors import (
    AguiHubError,
    ClientError,
    CommandRejected,
    ConnectionRejected,
    DecodeError,
    HubUnreachable,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    StoreUnavailable,
    from_error_frame,
)
from ..gateway.auth import Grants, RedactingLogger
from ..wire.codec import Encoding, decode, encode
from ..wire.offsets import START, Offset, check_thread, offset_key
from ..wire.protocol import (
    MAX_EVENTS_PER_PUBLISH,
    SUBPROTOCOL_JSON,
    SUBPROTOCOL_MSGPACK,
    CloseCode,
    Position,
    check_event_ids,
)

__all__ = [
    "Authenticated",
    "ClientState",
    "HubClient",
    "Item",
    "Position",
    "Snapshot",
    "StartFrom",
    "Subscribed",
    "Subscription",
    "ThreadEvent",
    "TokenProvider",
]

log = logging.getLogger("agui_hub.client")

StartFrom = Literal["live", "start", "snapshot"] | Position
"""Where a subscription starts: ``"live"``, ``"start"``, ``"snapshot"`` or after a
:class:`Position` (see docs/protocol.md, subscribe)."""

DEFAULT_MAX_QUEUE = 10_000
DEFAULT_MAX_RECEIVE_BYTES = 256 * 1024 * 1024
"""Largest frame a client accepts by default: a snapshot is one frame, as large as
the thread's folded content (tens of MB for a thread with long messages)."""
_LONGEST_ID = 2**63 - 1
NO_RESUME = {CloseCode.NORMAL, CloseCode.UNAUTHORIZED, CloseCode.FORBIDDEN}
"""Close codes after which the client stops (docs/protocol.md, close codes)."""
CLIENT_FAULTS = {1002: "protocol error", 1007: "invalid data", 1009: "message too big"}
"""Close codes that say one side could not take the other's frame ("fix the client").

Sent by the gateway (a frame of this client was refused), the client fails the
commands in flight, reconnects and resumes once; the same close again before the
gateway answered anything ends the client with
:class:`~agui_hub.errors.ConnectionRejected` rather than a reconnect loop. Sent by
this client (a frame of the gateway was over ``max_receive_bytes``, or invalid),
it ends the client at once: the gateway would send the same frame again."""


TokenProvider = Callable[[], str | Awaitable[str]]
"""A callable that returns a token (a JWT), or an awaitable of one: called for each
connection attempt and each refresh, so it should hand out a fresh token when the
last one is close to expiry."""

REFRESH_SHARE = 0.2
"""The credentials are renewed when this share of their remaining lifetime is left ..."""
REFRESH_LEAD_MAX = 60.0
"""... but not earlier than this many seconds before they expire."""
MAX_RETRY_AFTER = 300.0
"""Longest ``Retry-After`` (seconds) honoured from a gateway that is full or draining."""


def _token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (Unix seconds), read without verifying it; ``None``
    when *token* is not a JWT or has no ``exp``.

    The client only schedules refreshes with it: the gateway verifies the token.
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, int | float) and not isinstance(exp, bool) and math.isfinite(exp):
        return float(exp)
    return None


def _retry_after(frame: Mapping[str, Any]) -> float:
    """A ``rate_limited`` frame's ``retryAfter`` (seconds), sane or 0."""
    value = frame.get("retryAfter")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return min(max(float(value), 0.0), MAX_RETRY_AFTER)
    return 0.0


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(x for x in value if isinstance(x, str)) if isinstance(value, list) else ()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _unreachable(url: str, exc: BaseException) -> str:
    """Why a connection attempt to *url* failed, in words (never an empty reason)."""
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    # A wss:// client meeting a plain hub: the hub reads the TLS hello as a bad
    # HTTP request and drops the connection, so the error says little itself.
    if (
        scheme == "wss"
        and isinstance(exc, ssl.SSLError | ConnectionResetError | ConnectionAbortedError)
        and not isinstance(exc, ssl.SSLCertVerificationError)
    ):
        return (
            f"TLS handshake failed ({_describe(exc)}): is the hub serving TLS? "
            f"For a hub without TLS use ws://{rest}"
        )
    if scheme == "ws" and isinstance(exc, InvalidMessage):
        # A TLS hub (or something else than a gateway) answers a plain request.
        return f"{exc} (is it an agui-hub gateway? If it serves TLS, use wss://{rest})"
    if isinstance(exc, TimeoutError):
        return f"no WebSocket handshake in time ({_describe(exc)})"
    return str(exc) or _describe(exc)


class _GatewayBusy(HubUnreachable):
    """HTTP 429 / 503 at the handshake: transient; retry after :attr:`retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(message)


_WEBSOCKETS_LOG = RedactingLogger(logging.getLogger("websockets.client"), {})


# -- what a subscription yields ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribed:
    """The gateway (re)subscribed the thread.

    ``recovered`` is ``False`` when events after the client's position could
    not all be delivered (trimmed, or the thread was re-created): a
    :class:`Snapshot` follows. (A gateway reply claiming ``recovered: true``
    in another epoch than the one resumed from is not trusted: the client
    resubscribes from a snapshot and yields ``recovered=False``.) ``resumed`` is ``True`` for every
    resubscription after the first (after a reconnect, or after the consumer
    fell behind its queue); ``offset`` is the thread's newest offset
    at that moment and ``epoch`` its epoch (``None`` while it has no events).
    """

    thread: str
    epoch: str | None
    offset: Offset
    recovered: bool
    resumed: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A compact AG-UI sequence whose folding gives the thread at ``offset``.

    Throw away what you built from earlier events and apply ``events``; the
    events that follow continue from ``offset``. ``complete`` is ``False``
    when part of the history was trimmed before the gateway folded it.
    """

    thread: str
    offset: Offset
    epoch: str | None
    complete: bool
    events: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ThreadEvent:
    """One stored event of the thread (as published) and its offset.

    With ``expand_chunks`` a chunk event becomes several ThreadEvents with the
    same offset.
    """

    thread: str
    offset: Offset
    event: dict[str, Any]


Item = Subscribed | Snapshot | ThreadEvent


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The gateway's answer to :meth:`HubClient.authenticate`: who the connection is now.

    ``expires`` is when these credentials end (Unix seconds; ``None``: never);
    ``grants`` which threads the connection may subscribe to and publish into
    (``grants.allows(Action.SUBSCRIBE, thread)``, see :mod:`agui_hub.gateway.auth`).
    """

    subject: str
    expires: float | None
    grants: Grants


class ClientState(enum.Enum):
    """Where a :class:`HubClient` is in its life."""

    NEW = "new"
    OPEN = "open"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


class _ConnectionLost(Exception):
    """A command's connection closed before its reply; send it again after reconnecting."""


# -- subscriptions ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Queued:
    item: Item
    position: Position | None  # the position once item is consumed (None: unchanged)


class Subscription:
    """The items of one thread, in order: an async iterator and an async context manager.

    Use it as ``async with hub.subscribe(...) as sub: async for item in sub``,
    so that leaving the block unsubscribes; a plain ``async for`` works too and
    stays subscribed until :meth:`close` or the client closes.

    :attr:`position` is where a new subscription would resume to get exactly
    what this one has not yielded yet: store it (``position.to_json()``) to
    continue in another process.
    """

    def __init__(
        self,
        client: HubClient,
        thread: str,
        start: StartFrom,
        *,
        run: str | None,
        expand_chunks: bool,
        state: bool,
        max_queue: int,
    ) -> None:
        self.client = client
        self.thread = thread
        self.start = start
        self.run = run
        self.max_queue = max_queue
        self.position: Position | None = start if isinstance(start, Position) else None
        """Resume here to get exactly what was not yielded yet (``None``: not known yet)."""
        self.recovered: bool | None = None
        """The last (re)subscription's ``recovered`` flag, once yielded."""
        self.state: ThreadState | None = ThreadState() if state else None
        """With ``state=True``: the thread folded from every item yielded so far."""
        self._expander = ChunkExpander(thread) if expand_chunks else None
        self._queue: deque[_Queued] = deque()
        self._pieces: deque[tuple[ThreadEvent, Position | None]] = deque()
        self._wake = asyncio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self._opened = False
        # Receiving side: the position after the last queued item, the id of the
        # subscribe command whose reply is awaited (frames before it are stale),
        # and whether frames were dropped because the queue was full.
        self._received: Position | None = self.position
        # offset_key() of _received, cached: it is compared with every event.
        self._received_of: Position | None = None
        self._received_key = (0, 0)
        self._awaiting: int | None = None
        self._sent_on: object | None = None  # the connection the last subscribe went to
        self._subscribed_once = False
        self._lagged = False
        # Resubscribe from "snapshot": the gateway claimed a recovery it cannot
        # have made (another epoch); cleared by the reply to that subscribe.
        self._resync = False
        self._retries = 0  # subscribes answered store_unavailable in a row

    # -- consumer side -------------------------------------------------------------------

    async def open(self) -> Subscription:
        """Send the subscribe command (done by ``async with`` / the first ``async for``)."""
        if not self._opened:
            self._opened = True
            await self.client._add(self)
        return self

    async def close(self) -> None:
        """Unsubscribe; iteration ends after what is already queued is discarded."""
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._pieces.clear()
        self._wake.set()
        await self.client._remove(self)

    async def __aenter__(self) -> Subscription:
        return await self.open()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Item:
        if not self._opened:
            await self.open()
        while True:
            if self._pieces:
                piece, position = self._pieces.popleft()
                if not self._pieces:
                    self._advance(position)
                return piece
            if self._queue:
                queued = self._queue.popleft()
                if self._lagged and len(self._queue) <= self.max_queue // 2:
                    self.client._resubscribe(self)
                item = self._consume(queued)
                if item is not None:
                    return item
                continue
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()

    def _consume(self, queued: _Queued) -> Item | None:
        item = queued.item
        if isinstance(item, Subscribed):
            self.recovered = item.recovered
        elif isinstance(item, Snapshot):
            if self.state is not None:
                self.state = ThreadState()
                self._fold(item.events)
            if self._expander is not None:
                # The snapshot reopens chunk streams with chunks: expanding them
                # gives the consumer START events and the expander its lanes.
                self._expander = ChunkExpander(self.thread)
                events: list[dict[str, Any]] = []
                for event in item.events:
                    try:
                        events += self._expander.expand(event)
                    except ProtocolError:
                        events.append(event)
                item = dataclasses.replace(item, events=events)
        elif isinstance(item, ThreadEvent):
            if self.state is not None:
                self._fold((item.event,))
            if self._expander is not None:
                try:
                    events = self._expander.expand(item.event)
                except ProtocolError as exc:
                    # Relayed as stored: a chunk the expander cannot place passes unchanged.
                    log.debug("thread %s: chunk at %s not expanded: %s", self.thread, item.offset,
                              exc)  # fmt: skip
                    events = [item.event]
                if not events:
                    self._advance(queued.position)
                    return None
                if len(events) > 1 or events[0] is not item.event:
                    for event in events[1:]:
                        self._pieces.append((ThreadEvent(item.thread, item.offset, event),
                                             queued.position))  # fmt: skip
                    item = ThreadEvent(item.thread, item.offset, events[0])
                    if self._pieces:
                        return item  # the position moves with the last piece
        self._advance(queued.position)
        return item

    def _advance(self, position: Position | None) -> None:
        if position is not None:
            self.position = position

    def _fold(self, events: Iterable[dict[str, Any]]) -> None:
        assert self.state is not None
        for event in events:
            try:
                self.state.apply(event)
            except (ProtocolError, ValueError, TypeError) as exc:
                # The gateway relays what was stored; a patch that does not apply
                # leaves the state as it was, as the gateway's own fold does.
                log.debug("thread %s: not folded: %s", self.thread, exc)

    # -- receiving side (called by the client's reader) ----------------------------------

    def _push(self, item: Item, position: Position | None) -> None:
        if position is not None:
            self._received = position
        self._queue.append(_Queued(item, position))
        self._wake.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake.set()

    def _subscribe_command(self, command_id: int) -> dict[str, Any]:
        self._awaiting = command_id
        self._lagged = False
        received = self._received
        start: Any
        if self._resync:
            start = "snapshot"
        elif received is None:
            start = self.start.to_json() if isinstance(self.start, Position) else self.start
        elif received.epoch is None and received.offset == START:
            start = "start"  # the thread had no events: all of them are new to us
        else:
            start = received.to_json()
        command: dict[str, Any] = {
            "type": "subscribe",
            "id": command_id,
            "thread": self.thread,
            "from": start,
        }
        if self.run is not None:
            command["run"] = self.run
        return command

    def _untrusted(self, epoch: Any, recovered: bool) -> bool:
        """Whether a ``recovered: true`` claims a resume across epochs (a gateway bug, a race).

        Offsets of one epoch mean nothing in another: continuing would yield
        events that do not follow what the consumer has. Resubscribe from a
        snapshot instead.
        """
        received = self._received
        if not recovered or self._resync or received is None or received.epoch is None:
            return False  # no epoch to hold the gateway to (an offset typed without one)
        if epoch == received.epoch:
            return False
        log.warning(
            "thread %s: the gateway answered recovered=true in epoch %s to a resume from "
            "epoch %s; not trusted: resubscribing from a snapshot",
            self.thread, epoch, received.epoch,
        )  # fmt: skip
        self._resync = True
        self._awaiting = 0  # no reply has this id: frames are dropped until the resubscribe's
        self.client._resubscribe(self)
        return True

    def _on_subscribed(self, frame: Mapping[str, Any]) -> None:
        command_id = frame.get("id")
        epoch, offset = frame.get("epoch"), frame.get("offset", START)
        recovered = bool(frame.get("recovered"))
        received = self._received
        if command_id is not None:
            if command_id != self._awaiting:
                return  # the reply to a subscribe this one replaced
            self._awaiting = None
            self._retries = 0
            if self._untrusted(epoch, recovered):
                return
            resumed, self._subscribed_once = self._subscribed_once, True
            if self._resync:
                # The reply to the "snapshot" resubscribe: a snapshot follows and
                # replaces what the consumer built, which recovered nothing.
                self._resync, recovered = False, False
            if not recovered:
                position = None  # a snapshot follows and sets it
            elif received is not None:
                position = Position(received.offset, epoch)
            elif self.start == "live":
                position = Position(offset, epoch)
            elif self.start == "start":
                position = Position(START, epoch)
            else:
                position = None
        elif self._awaiting is not None:
            return  # about a subscription this one replaced
        elif self._untrusted(epoch, recovered):
            return
        else:
            # An announcement: the thread's first event created its epoch, or the
            # thread was re-created (recovered false, a snapshot follows).
            resumed = False
            position = Position(received.offset if received else offset, epoch)
            if not recovered:
                position = None
        self._push(Subscribed(self.thread, epoch, offset, recovered, resumed), position)

    def _on_snapshot(self, frame: Mapping[str, Any]) -> None:
        if self._awaiting is not None or self._lagged:
            return
        offset, epoch = frame.get("offset", START), frame.get("epoch")
        events = frame.get("events")
        snapshot = Snapshot(
            self.thread,
            offset,
            epoch,
            bool(frame.get("complete", True)),
            list(events) if isinstance(events, list) else [],
        )
        self._push(snapshot, Position(offset, epoch))

    def _on_event(self, frame: Mapping[str, Any]) -> None:
        if self._awaiting is not None or self._lagged:
            return
        offset, event = frame.get("offset"), frame.get("event")
        if not isinstance(offset, str) or not isinstance(event, dict):
            log.warning("thread %s: malformed event frame ignored", self.thread)
            return
        received = self._received
        try:
            key = offset_key(offset)
        except AguiHubError:
            log.warning("thread %s: event frame with a bad offset ignored", self.thread)
            return
        if received is not None:
            if received is not self._received_of:
                self._received_of, self._received_key = received, offset_key(received.offset)
            if key <= self._received_key:
                return  # already delivered (a resume overlapping what we have)
        if len(self._queue) >= self.max_queue:
            # Not read fast enough: drop frames from here on and resubscribe from
            # the last queued one once the consumer has caught up.
            self._lagged = True
            return
        epoch = received.epoch if received is not None else None
        self._push(ThreadEvent(self.thread, offset, event), Position(offset, epoch))


# -- the client ------------------------------------------------------------------------------


def _rate_limited_pause(exc: RateLimited, deadline: float | None) -> float:
    """Seconds to wait before sending a command answered ``rate_limited`` again;
    raises *exc* when that would pass *deadline* (a loop time).

    Nothing of the command was carried out: the same command (the same event
    ids) again is safe. The jitter spreads the clients it paused.
    """
    wait = max(exc.retry_after, 0.01)
    delay = wait + random.uniform(0, 0.05 + 0.2 * wait)
    if deadline is not None and asyncio.get_running_loop().time() + delay > deadline:
        raise exc
    return delay


@dataclass
class _Backoff:
    minimum: float
    maximum: float
    attempt: int = field(default=0)

    def next_delay(self) -> float:
        """Full jitter: uniform in [0, min(maximum, minimum * 2**attempt)]."""
        cap = min(self.maximum, self.minimum * 2 ** min(self.attempt, 30))
        self.attempt += 1
        return random.uniform(0, cap)

    def reset(self) -> None:
        self.attempt = 0


@dataclass(slots=True, eq=False)
class _Outgoing:
    """One publish of a :class:`_PublishLane` that is not answered yet."""

    sent_on: object | None = None
    """The connection it was last sent on, while its reply is awaited there."""
    turn: asyncio.Future[None] | None = None
    """Pending while it waits for the publishes before it to be sent."""


class _PublishLane:
    """The unanswered publishes to one thread, in call order, and whose turn it is.

    A publish is sent (and sent again, after a reconnect, a ``rate_limited``
    or a ``store_unavailable``) only once every publish before it is sent on
    the same connection: so the gateway receives them in call order, and a
    drop never lets a later publish overtake an earlier one that must go
    again. (A connection is any object compared by identity: the
    :class:`~agui_hub.client.publisher.Publisher` uses its writer.)
    """

    __slots__ = ("entries", "next", "ws")

    def __init__(self) -> None:
        self.entries: deque[_Outgoing] = deque()
        self.ws: object | None = None
        """The connection :attr:`next` counts for."""
        self.next = 0
        """Entries before this index are sent on :attr:`ws` and await their replies."""

    def may_send(self, entry: _Outgoing, ws: object) -> bool:
        if self.ws is not ws:  # a new connection: everything goes again
            self.ws, self.next = ws, 0
            self._advance()
        return self.next < len(self.entries) and self.entries[self.next] is entry

    async def wait_turn(self, entry: _Outgoing, timeout: float | None) -> None:
        """Wait until *entry* may be next (check :meth:`may_send` again); TimeoutError."""
        entry.turn = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(entry.turn, timeout)
        finally:
            entry.turn = None

    def sent(self, entry: _Outgoing, ws: object) -> None:
        entry.sent_on = ws
        self._advance()

    def again(self, entry: _Outgoing) -> None:
        """*entry* must be sent again (on this connection or the next)."""
        if entry.sent_on is not None and entry.sent_on is self.ws:
            # Not sent after all: the ones behind it wait for it again.
            self.next = min(self.next, self.entries.index(entry))
        entry.sent_on = None

    def lost(self, ws: object) -> None:
        """*ws* closed: nothing sent on it counts (found once, not per publish)."""
        if self.ws is ws:
            self.ws, self.next = None, 0

    def remove(self, entry: _Outgoing) -> None:
        index = self.entries.index(entry)  # answered in order: mostly the first
        del self.entries[index]
        if index < self.next:
            self.next -= 1
        self._wake()

    def _advance(self) -> None:
        entries, ws = self.entries, self.ws
        while ws is not None and self.next < len(entries) and entries[self.next].sent_on is ws:
            self.next += 1
        self._wake()

    def _wake(self) -> None:
        if self.next < len(self.entries):
            turn = self.entries[self.next].turn
            if turn is not None and not turn.done():
                turn.set_result(None)


class HubClient:
    """One connection to a gateway, shared by subscriptions and publishes.

    *url* is the gateway's ``ws://`` or ``wss://`` URL. *encoding* picks the
    subprotocol (``"msgpack"``, the default, or ``"json"``). After a lost
    connection the client retries with backoff between *backoff_min* and
    *backoff_max* seconds (full jitter) and gives up after *give_up_after*
    seconds without a connection (``None``: never). The backoff keeps growing
    over connections that fail early; it starts again from *backoff_min* only
    once a connection proved healthy: a subscription was confirmed
    (``subscribed``), a command was answered, or the connection lasted
    *backoff_max* seconds. So a gateway that accepts connections and then
    fails them is not hammered. *headers* go into the opening handshake.

    *max_frame_bytes* is the largest frame this client sends (match the
    gateway's limit) and *max_receive_bytes* the largest it accepts
    (``None``: no limit). The latter must hold a whole snapshot, which is one
    frame as large as the thread's folded content; a larger frame ends the
    client with :class:`~agui_hub.errors.ConnectionRejected` (close code
    1009) instead of reconnecting into the same frame.

    *token* authenticates the client: a JWT (``str``), or a
    :data:`TokenProvider` (a callable returning a token or an awaitable of
    one), sent as ``Authorization: Bearer <token>`` on every connection
    attempt; a provider is asked for each attempt. With a provider and
    *refresh* (the default) the client renews the credentials before the
    token's ``exp``: when a fifth of its remaining lifetime is left (at most
    60 s before), it asks the provider for a new token and sends it in an
    ``auth`` command on the open connection, so the gateway never has to
    close it. A refresh that fails is logged and tried again shortly; should
    the token expire anyway, the gateway closes with 4401 and the client
    reconnects with a new token and resumes. Without a provider a 4401 is
    final (:class:`~agui_hub.errors.ConnectionRejected`): give a provider to
    a client that lives longer than its token. The token is never logged nor
    put in a repr or an exception message.

    What the gateway's refusals become: HTTP 401 / 403 at the handshake,
    :class:`~agui_hub.errors.ConnectionRejected` (``close_code`` 4401 /
    4403; while reconnecting, a provider gets one more try after a 401);
    HTTP 429 / 503 (too many connections, gateway full or draining),
    :class:`~agui_hub.errors.HubUnreachable` from :meth:`connect`, and while
    reconnecting a retry no earlier than their ``Retry-After``. A
    ``rate_limited`` answer to a command is sent again by itself after the
    gateway's ``retryAfter``, within the call's timeout.
    """

    def __init__(
        self,
        url: str,
        *,
        encoding: Encoding | str = Encoding.MSGPACK,
        headers: Mapping[str, str] | None = None,
        open_timeout: float = 10.0,
        backoff_min: float = 0.05,
        backoff_max: float = 5.0,
        give_up_after: float | None = None,
        max_frame_bytes: int = 1024 * 1024,
        max_receive_bytes: int | None = DEFAULT_MAX_RECEIVE_BYTES,
        token: str | TokenProvider | None = None,
        refresh: bool = True,
    ) -> None:
        self.url = url
        self.encoding = Encoding(encoding)
        self.headers = dict(headers or {})
        if token is not None:
            if any(name.lower() == "authorization" for name in self.headers):
                raise ValueError("pass the token either as token= or in an Authorization "
                                 "header, not both")  # fmt: skip
            if not callable(token) and not (isinstance(token, str) and token):
                raise TypeError("token is a non-empty string or a callable that returns one")
        # The token the next connection attempt sends, or the provider to ask for it.
        # Private, and never formatted into a message: it is a credential.
        self._token: str | None = token if isinstance(token, str) else None
        self._provider: TokenProvider | None = None if isinstance(token, str) else token
        self.refresh = refresh
        """Renew the credentials before they expire (with a token provider only)."""
        self.open_timeout = open_timeout
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.give_up_after = give_up_after
        self.max_frame_bytes = max_frame_bytes
        """Largest frame this client sends (the gateway's limit, 1 MiB by default)."""
        self.max_receive_bytes = max_receive_bytes
        """Largest frame this client accepts (a snapshot is one frame; ``None``: no limit)."""
        self.state = ClientState.NEW
        self.reconnects = 0
        """How many times the connection was re-established."""
        self.close_code: int | None = None
        """The close code of the last lost connection (``None`` before any): the gateway's,
        the one this client sent when it failed the connection (see
        :data:`CLIENT_FAULTS`), or 1006 when it ended without a close frame."""
        self._close_reason = ""
        self._closed_here = False  # the last connection was failed by this client
        self._backoff = _Backoff(backoff_min, backoff_max)
        self._faulted = False  # a CLIENT_FAULTS close since the gateway last answered
        self._ws: ClientConnection | None = None
        self._connected = asyncio.Event()
        self._stopped = asyncio.Event()  # set when the client closed or gave up
        self._kick = asyncio.Event()  # set to reconnect now rather than after the backoff
        self._task: asyncio.Task[None] | None = None
        self._subs: dict[str, Subscription] = {}
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._publishing: dict[str, _PublishLane] = {}
        """Per thread, its unanswered publishes (sent in call order)."""
        self._ids = itertools.count(1)
        self._event_ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(8)
        self._failure: AguiHubError | None = None
        self._chores: set[asyncio.Task[Any]] = set()
        # When the connection's credentials expire, and when to renew them (Unix
        # seconds: token expiries are wall-clock times); the refresher wakes on
        # _rescheduled whenever they change.
        self._expires: float | None = None
        self._refresh_at: float | None = None
        self._rescheduled = asyncio.Event()
        self._refresher: asyncio.Task[None] | None = None

    # -- life cycle -----------------------------------------------------------------------

    async def __aenter__(self) -> HubClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the connection. Raises :class:`~agui_hub.errors.HubUnreachable` at once
        when the gateway cannot be reached (check the URL and that it runs) or is
        busy (HTTP 429 / 503: try again later), or
        :class:`~agui_hub.errors.ConnectionRejected` when it refuses the client
        (HTTP 401: no token, or one it does not accept: the message says why;
        403: the credentials were revoked or the Origin is not allowed). What a
        token provider raises propagates unchanged."""
        if self.state is not ClientState.NEW:
            raise ClientError(f"this client is already {self.state.value}")
        self._ws = await self._open(await self._token_now())
        self.state = ClientState.OPEN
        self._connected.set()
        self._task = asyncio.create_task(self._manage(self._ws))
        if self._provider is not None and self.refresh:
            self._refresher = asyncio.create_task(self._refresh_loop())

    async def close(self) -> None:
        """Close the connection and end every subscription (their iteration stops)."""
        if self.state is ClientState.CLOSED:
            return
        self.state = ClientState.CLOSED
        self._connected.clear()
        self._stopped.set()
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        for task in (self._task, self._refresher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for task in list(self._chores):
            task.cancel()
        for sub in list(self._subs.values()):
            sub._closed = True
            sub._wake.set()
        self._subs.clear()
        self._fail_pending(ClientError("the client was closed"))

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    # -- commands ---------------------------------------------------------------------------

    def subscribe(
        self,
        thread: str,
        start: StartFrom = "live",
        *,
        run: str | None = None,
        expand_chunks: bool = False,
        state: bool = False,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> Subscription:
        """Follow *thread* from *start*; iterate the result for its items.

        *run* keeps only that run's events. *expand_chunks* turns chunk events
        into START / CONTENT / END; *state* keeps :attr:`Subscription.state`
        folded. At most *max_queue* items wait for the consumer; past that the
        subscription stops taking frames and resubscribes from where it
        stopped once the consumer caught up (nothing is lost). One
        subscription per thread and client.
        """
        check_thread(thread)
        if start not in ("live", "start", "snapshot") and not isinstance(start, Position):
            raise ValueError('start is "live", "start", "snapshot" or a Position')
        if thread in self._subs:
            raise ValueError(f"already subscribed to thread {thread!r} on this client")
        if max_queue < 2:
            raise ValueError("max_queue must be at least 2")
        return Subscription(
            self, thread, start, run=run, expand_chunks=expand_chunks, state=state,
            max_queue=max_queue,
        )  # fmt: skip

    async def publish(
        self,
        thread: str,
        events: Iterable[Any],
        event_ids: Iterable[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[Offset]:
        """Publish events through the gateway; returns one offset per event.

        Events are wire dicts or event models (ours or ``ag_ui.core``'s),
        checked locally first (:class:`~agui_hub.errors.InvalidEvent`). At most
        1000 per call, stored all or nothing. Without *event_ids* the client
        makes some up, so that when the connection drops before the reply the
        retry (after reconnecting, with the same ids) never stores twice. The
        gateway's verdicts raise as locally: :class:`~agui_hub.errors.SequenceError`,
        :class:`~agui_hub.errors.InvalidEvent`. Gives up after *timeout* seconds
        (default: the client's *give_up_after*) with
        :class:`~agui_hub.errors.HubUnreachable`.

        Publishes may be pipelined: calls about one thread that run
        concurrently (tasks, ``asyncio.gather``) are sent without waiting for
        each other's replies, in the order the calls were made (the order
        their coroutines start), and the gateway stores and answers them in
        that order. Those not answered when the connection drops are sent
        again after the reconnect, with the same event ids, in the same
        order and before any later one: a drop never reorders a thread's
        events. A publish the gateway refuses raises in its own call; the
        ones after it are judged as if it had never been sent. One caveat: a
        publish answered ``rate_limited`` or ``store_unavailable`` is sent
        again before the later ones not sent yet, but later ones already
        sent may be stored before it (or refused, when they continue it);
        await each publish (or send one batch) where even that must not
        happen.
        """
        check_thread(thread)
        return await self._publish(validate_batch(events), thread,
                                   event_ids, timeout)  # fmt: skip

    async def _publish(
        self,
        wires: list[dict[str, Any]],
        thread: str,
        event_ids: Iterable[str] | None,
        timeout: float | None,
    ) -> list[Offset]:
        """:meth:`publish` of events already validated (the Publisher's path)."""
        if not wires:
            return []
        if len(wires) > MAX_EVENTS_PER_PUBLISH:
            raise ValueError(f"at most {MAX_EVENTS_PER_PUBLISH} events per publish")
        ids = check_event_ids(None if event_ids is None else list(event_ids), len(wires))
        if ids is None:
            ids = self.new_event_ids(len(wires))
        command = {"type": "publish", "thread": thread, "events": wires, "eventIds": ids}
        # Measured with the longest id this client could send: the gateway closes
        # the whole connection (1009) for a frame over its limit.
        size = len(encode({**command, "id": _LONGEST_ID}, self.encoding))
        if size > self.max_frame_bytes:
            raise PayloadTooLarge(size, self.max_frame_bytes)
        loop = asyncio.get_running_loop()
        limit = timeout if timeout is not None else self.give_up_after
        deadline = None if limit is None else loop.time() + limit
        backoff = _Backoff(self.backoff_min, self.backoff_max)
        # In line before the first await: calls made in this order are sent in it.
        lane = self._publishing.get(thread)
        if lane is None:
            lane = self._publishing[thread] = _PublishLane()
        entry = _Outgoing()
        lane.entries.append(entry)
        try:
            while True:
                try:
                    reply = await self._publish_once(lane, entry, command, deadline)
                except (_ConnectionLost, StoreUnavailable) as exc:
                    # The batch may or may not be stored: the same ids make the retry safe.
                    delay = backoff.next_delay()
                    if deadline is not None and loop.time() + delay > deadline:
                        if isinstance(exc, StoreUnavailable):
                            raise
                        raise HubUnreachable(f"publish to {self.url} gave up: {exc}") from None
                    await asyncio.sleep(delay)
                    continue
                except RateLimited as exc:
                    await asyncio.sleep(_rate_limited_pause(exc, deadline))
                    continue
                offsets = reply.get("offsets")
                if not isinstance(offsets, list) or len(offsets) != len(wires):
                    raise ClientError(f"the gateway answered a publish with {reply!r}")
                return offsets
        finally:
            lane.remove(entry)
            if not lane.entries and self._publishing.get(thread) is lane:
                del self._publishing[thread]

    async def _publish_once(
        self,
        lane: _PublishLane,
        entry: _Outgoing,
        command: dict[str, Any],
        deadline: float | None,
    ) -> dict[str, Any]:
        """Send a publish once the ones before it in *lane* are sent; await its reply."""
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_connected(deadline)
            ws = self._ws
            assert ws is not None
            if lane.may_send(entry, ws):
                break
            try:
                await lane.wait_turn(entry, None if deadline is None else deadline - loop.time())
            except TimeoutError:
                raise HubUnreachable(
                    f"publish to {self.url} gave up: the publishes before it to the same "
                    "thread were not sent in time"
                ) from None
        command_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[command_id] = future
        # Marked before the send: the next publish in the lane may send as soon
        # as this one yields, and by then this frame is in the socket's buffer.
        lane.sent(entry, ws)
        try:
            try:
                await self._send(ws, {**command, "id": command_id})
            except ConnectionClosed:
                raise _ConnectionLost("connection closed while sending") from None
            remaining = None if deadline is None else deadline - loop.time()
            try:
                return await asyncio.wait_for(asyncio.shield(future), remaining)
            except TimeoutError:
                raise HubUnreachable(f"no reply from {self.url} in time") from None
        except _ConnectionLost:
            lane.lost(ws)
            lane.again(entry)
            raise
        except (RateLimited, StoreUnavailable):
            lane.again(entry)
            raise
        finally:
            self._pending.pop(command_id, None)

    async def ping(self, *, timeout: float | None = None) -> float:
        """Round trip of a protocol ping, in seconds."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + (timeout if timeout is not None else self.open_timeout)
        await self._request({"type": "ping"}, deadline)
        return loop.time() - began

    async def authenticate(self, token: str, *, timeout: float | None = None) -> Authenticated:
        """Send *token* in an ``auth`` command: authenticate a connection opened
        without a token, or renew its credentials before they expire.

        Returns who the connection is now, until when, and its grants; a
        subscription the new grants no longer cover ends with
        :class:`~agui_hub.errors.CommandRejected` (``forbidden``). Raises
        :class:`~agui_hub.errors.CommandRejected` with ``code``
        ``unauthorized`` (the token is invalid or expired: the connection keeps
        its previous credentials; get another token) or ``forbidden`` (a token
        for another subject than the connection's: use another client for it),
        and :class:`~agui_hub.errors.HubUnreachable` without an answer within
        *timeout* seconds (default: *open_timeout*). A client without a token
        provider sends *token* on its later reconnections too. (With a
        provider the client does this by itself, see :class:`HubClient`.)
        """
        if not isinstance(token, str) or not token:
            raise ValueError("the token is a non-empty string")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if timeout is not None else self.open_timeout)
        reply = await self._request({"type": "auth", "token": token}, deadline)
        if reply.get("type") != "authenticated":
            raise ClientError(f"the gateway answered auth with a {reply.get('type')!r} frame")
        expires = reply.get("expires")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            expires = None
        grants = reply.get("grants")
        grants = grants if isinstance(grants, dict) else {}
        result = Authenticated(
            str(reply.get("subject", "")),
            None if expires is None else float(expires),
            Grants(_strings(grants.get("subscribe")), _strings(grants.get("publish"))),
        )
        if self._provider is None:
            self._token = token  # what proved the connection proves the next one
        self._adopt(token, result.expires)
        return result

    async def run(
        self,
        thread: str,
        agent: str,
        *,
        messages: Iterable[Any] = (),
        state: Any = None,
        tools: Iterable[Any] = (),
        context: Iterable[Any] = (),
        forwarded_props: Any = None,
        run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Ask the gateway to run upstream agent *agent* in *thread* (docs/bridge.md).

        The gateway builds the run's input from the thread (its messages, then
        *messages*; its state, unless *state* is given; ``parentRunId`` its
        latest run) and relays the agent's events into the thread: subscribe
        to follow them. Returns the ``running`` reply (``thread``, ``agent``,
        ``runId``, ``parentRunId``) once the run is going. Raises
        :class:`~agui_hub.errors.CommandRejected` with ``code``
        ``unknown_agent``, ``run_active``, ``too_many_runs``, ``forbidden`` or
        ``invalid_event`` (a message that is not AG-UI). Not sent again after a
        dropped connection (pass *run_id* and check the thread before retrying).
        """
        check_thread(thread)
        command: dict[str, Any] = {
            "type": "run",
            "thread": thread,
            "agent": agent,
            "messages": [_wire_message(m) for m in messages],
            "tools": list(tools),
            "context": list(context),
        }
        if state is not None:
            command["state"] = state
        if forwarded_props is not None:
            command["forwardedProps"] = forwarded_props
        if run_id is not None:
            command["runId"] = run_id
        deadline = asyncio.get_running_loop().time() + (
            timeout if timeout is not None else self.open_timeout
        )
        return await self._request(command, deadline)

    async def cancel(
        self,
        thread: str,
        run_id: str | None = None,
        *,
        abandoned: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Cancel the bridged run going in *thread* (only *run_id*, when given).

        Returns the ``cancelled`` reply once the run has ended (its RUN_ERROR
        ``AGUI_HUB_RUN_CANCELLED`` is stored). Raises
        :class:`~agui_hub.errors.CommandRejected` ``no_active_run`` when the
        gateway runs none there (runs are cancelled on the gateway that started
        them) or ``forbidden``.

        With *abandoned*: end a run that the thread holds open and that no
        gateway relays any more (its gateway crashed): a RUN_ERROR
        ``AGUI_HUB_RUN_ABANDONED`` is appended (docs/bridge.md).
        """
        check_thread(thread)
        command: dict[str, Any] = {"type": "cancel", "thread": thread}
        if abandoned:
            command["abandoned"] = True
        if run_id is not None:
            command["runId"] = run_id
        deadline = asyncio.get_running_loop().time() + (
            timeout if timeout is not None else max(self.open_timeout, 30.0)
        )
        return await self._request(command, deadline)

    def new_event_ids(self, count: int) -> list[str]:
        """Fresh event ids, unique to this client: ``<random prefix>-<counter>``."""
        return [f"{self._id_prefix}-{next(self._event_ids)}" for _ in range(count)]

    # -- internals: requests ------------------------------------------------------------

    async def _request(self, command: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        """Send *command* and await its reply; sent again while the gateway answers
        ``rate_limited``, until *deadline* (then :class:`~agui_hub.errors.RateLimited`)."""
        while True:
            try:
                return await self._request_once(command, deadline)
            except RateLimited as exc:
                await asyncio.sleep(_rate_limited_pause(exc, deadline))

    async def _request_once(
        self, command: dict[str, Any], deadline: float | None
    ) -> dict[str, Any]:
        """Send *command* with a fresh id and await its reply (or error frame)."""
        await self._wait_connected(deadline)
        ws = self._ws
        assert ws is not None
        command_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        try:
            try:
                await self._send(ws, {**command, "id": command_id})
            except ConnectionClosed:
                raise _ConnectionLost("connection closed while sending") from None
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            try:
                return await asyncio.wait_for(asyncio.shield(future), remaining)
            except TimeoutError:
                raise HubUnreachable(f"no reply from {self.url} in time") from None
        finally:
            self._pending.pop(command_id, None)

    async def _wait_connected(self, deadline: float | None) -> None:
        while not self._connected.is_set():
            if self._failure is not None:
                raise self._failure
            if self.state is ClientState.CLOSED:
                raise ClientError("the client is closed")
            if self.state is ClientState.NEW:
                raise ClientError("connect the client first (async with HubClient(...))")
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                raise HubUnreachable(f"no connection to {self.url} in time")
            self._kick.set()
            # Woken by a connection, or by the client closing or giving up.
            waiters = [
                asyncio.ensure_future(self._connected.wait()),
                asyncio.ensure_future(self._stopped.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

    async def _send(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        data = encode(frame, self.encoding)
        await ws.send(data if self.encoding is Encoding.MSGPACK else data.decode())

    def _fail_pending(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that gave up must not warn
        self._pending.clear()

    # -- internals: subscriptions ---------------------------------------------------------

    async def _add(self, sub: Subscription) -> None:
        if self._failure is not None:
            raise self._failure
        if self.state in (ClientState.NEW, ClientState.CLOSED):
            raise ClientError("connect the client first (async with HubClient(...))")
        if self._subs.get(sub.thread) not in (None, sub):
            raise ValueError(f"already subscribed to thread {sub.thread!r} on this client")
        self._subs[sub.thread] = sub
        ws = self._ws
        if self._connected.is_set() and ws is not None and sub._sent_on is not ws:
            sub._sent_on = ws  # before the await: the connection task must not send it too
            with contextlib.suppress(ConnectionClosed):  # resubscribed after reconnecting
                await self._send(ws, sub._subscribe_command(next(self._ids)))

    async def _remove(self, sub: Subscription) -> None:
        if self._subs.get(sub.thread) is not sub:
            return
        del self._subs[sub.thread]
        if self._connected.is_set() and self._ws is not None:
            command = {"type": "unsubscribe", "id": next(self._ids), "thread": sub.thread}
            with contextlib.suppress(ConnectionClosed):
                await self._send(self._ws, command)

    def _resubscribe(self, sub: Subscription) -> None:
        """Subscribe *sub* again from what it received (after it lagged)."""
        if self._connected.is_set() and self._ws is not None and self._subs.get(sub.thread) is sub:
            self._spawn(self._send(self._ws, sub._subscribe_command(next(self._ids))))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[Any]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("client chore failed: %s", task.exception())

    # -- internals: the connection --------------------------------------------------------

    async def _token_now(self) -> str | None:
        """The token for the next connection attempt or refresh: the provider's, or the
        one given (``None``: none)."""
        if self._provider is None:
            return self._token
        answer = self._provider()
        token = await answer if inspect.isawaitable(answer) else answer
        if not isinstance(token, str) or not token:
            raise TypeError(
                f"the token provider returned {type(token).__name__}, not a non-empty string"
            )
        return token

    def _adopt(self, token: str | None, expires: float | None = None) -> None:
        """The connection's credentials are now *token* (valid until *expires*, else
        the token's ``exp``): schedule their renewal."""
        if expires is None and token is not None:
            expires = _token_expiry(token)
        self._expires = expires
        if expires is None or self._provider is None or not self.refresh:
            self._refresh_at = None
        else:
            left = max(0.0, expires - time.time())
            self._refresh_at = expires - min(left * REFRESH_SHARE, REFRESH_LEAD_MAX)
        self._rescheduled.set()

    async def _refresh_loop(self) -> None:
        """Renew the credentials before they expire, while the client is open."""
        while self.state is not ClientState.CLOSED and self._failure is None:
            self._rescheduled.clear()
            due = self._refresh_at
            if due is None:
                await self._rescheduled.wait()
                continue
            if not self._connected.is_set():
                # A reconnect is under way: it brings a new token and a new schedule.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._rescheduled.wait(), 1.0)
                continue
            delay = due - time.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._rescheduled.wait(), delay)
                continue
            expires = self._expires
            try:
                token = await self._token_now()
                assert token is not None  # only runs with a provider
                await self.authenticate(token)  # adopts the new expiry: a new schedule
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agui-hub client: renewing the credentials failed (%s); "
                            "trying again shortly", _describe(exc))  # fmt: skip
                if self._refresh_at == due:  # not replaced meanwhile (by a reconnect)
                    now = time.time()
                    left = 0.0 if expires is None else expires - now
                    # Often enough to renew before the expiry; past it, until the
                    # gateway closes (4401) and the reconnect brings a new token.
                    pause = min(10.0, max(0.25, left / 4)) if left > 0 else 2.0
                    self._refresh_at = now + pause

    async def _open(self, token: str | None) -> ClientConnection:
        subprotocol = SUBPROTOCOL_MSGPACK if self.encoding is Encoding.MSGPACK else SUBPROTOCOL_JSON
        headers = dict(self.headers)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        try:
            ws = await connect(
                self.url,
                subprotocols=[subprotocol],  # type: ignore[list-item]
                additional_headers=headers or None,
                open_timeout=self.open_timeout,
                max_size=self.max_receive_bytes,
                logger=_WEBSOCKETS_LOG,
            )
        except InvalidStatus as exc:
            raise self._refusal(exc, token) from None
        except InvalidURI as exc:
            raise HubUnreachable(f"not a WebSocket URL: {exc}") from None
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            raise HubUnreachable(
                f"cannot connect to {self.url}: {_unreachable(self.url, exc)}"
            ) from None
        if ws.subprotocol != subprotocol:
            await ws.close()
            raise HubUnreachable(f"{self.url} did not accept the {subprotocol} subprotocol")
        self._adopt(token)
        return ws

    def _refusal(self, exc: InvalidStatus, token: str | None) -> AguiHubError:
        """What a handshake answered with another HTTP status than 101 raises."""
        response = exc.response
        status = response.status_code
        body = bytes(response.body or b"").decode("utf-8", "replace").strip()
        if token is not None:
            body = body.replace(token, "[token]")  # a gateway that echoes it: not in messages
        why = " ".join(body.split())[:300] or response.reason_phrase
        if status in (429, 503):
            retry_after = 0.0
            with contextlib.suppress(TypeError, ValueError):
                retry_after = float(response.headers.get("Retry-After", "0"))
            if not math.isfinite(retry_after) or retry_after < 0:
                retry_after = 0.0
            what = "has too many connections from this address" if status == 429 else (
                "is full or draining")  # fmt: skip
            return _GatewayBusy(
                f"{self.url} {what} (HTTP {status}: {why}); try again "
                f"{f'in {retry_after:g} s' if retry_after else 'later'}",
                min(retry_after, MAX_RETRY_AFTER),
            )
        if status in (401, 403):
            code = CloseCode.UNAUTHORIZED if status == 401 else CloseCode.FORBIDDEN
            error = ConnectionRejected(code, why)
            if status == 403:
                message = (
                    f"the gateway refused the connection (HTTP 403: {why}): the credentials "
                    "were revoked or this Origin is not allowed; do not retry with them"
                )
            elif token is None:
                message = (
                    f"the gateway requires a token (HTTP 401: {why}); pass token= to the "
                    "client (a JWT, or a callable that returns one)"
                )
            else:
                message = (
                    f"the gateway refused the token (HTTP 401: {why}); get a new token, or "
                    "pass token= a callable that returns a fresh one"
                )
            error.args = (message,)
            return error
        return HubUnreachable(f"{self.url} is not an agui-hub gateway: {exc}")

    async def _manage(self, ws: ClientConnection) -> None:
        """Serve the connection; when it drops, reconnect and resubscribe, until closed."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                opened = loop.time()
                await self._serve(ws)
                code = self.close_code or 0
                self._connected.clear()
                if loop.time() - opened >= self.backoff_max:
                    # Lasted as long as the longest pause: reconnecting at once
                    # costs no more than waiting backoff_max would.
                    self._healthy()
                fault = None if self._closed_here else CLIENT_FAULTS.get(code)
                if fault is not None:
                    # Sending the same command again would be refused again.
                    self._fail_pending(self._refused_frame(code, fault))
                self._fail_pending(_ConnectionLost(f"connection closed ({code})"))
                if self.state is ClientState.CLOSED:
                    return
                if code in NO_RESUME and not (
                    code == CloseCode.UNAUTHORIZED and self._provider is not None
                ):
                    # (With a provider, 4401 means: connect again with a new token.)
                    self._fail_all(self._rejected(code))
                    return
                if self._closed_here:
                    self._fail_all(self._unreadable_frame(code))
                    return
                if fault is not None:
                    if self._faulted:
                        self._fail_all(self._refused_again(code, fault))
                        return
                    self._faulted = True
                self.state = ClientState.RECONNECTING
                ws = await self._reconnect()
                self._ws = ws
                self.reconnects += 1
                self.state = ClientState.OPEN
                self._connected.set()
        except AguiHubError as exc:
            self._fail_all(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: do not leave consumers waiting forever
            log.exception("agui-hub client: connection manager failed")
            self._fail_all(ClientError(f"the client failed: {exc!r}"))

    def _rejected(self, code: int) -> ConnectionRejected:
        """The gateway closed the connection with a code that forbids reconnecting."""
        error = ConnectionRejected(code, self._close_reason)
        reason = f" ({self._close_reason})" if self._close_reason else ""
        if code == CloseCode.UNAUTHORIZED:
            error.args = (
                f"the gateway closed the connection with 4401{reason}: its credentials "
                "expired (or never came); pass token= a callable that returns fresh "
                "tokens, so that the client renews them and reconnects by itself",
            )
        elif code == CloseCode.FORBIDDEN:
            error.args = (
                f"the gateway closed the connection with 4403{reason}: its credentials "
                "were revoked; do not reconnect with them",
            )
        return error

    def _refused_frame(self, code: int, name: str) -> CommandRejected:
        """What a command in flight gets when the gateway closed with a CLIENT_FAULTS code."""
        if code == CloseCode.MESSAGE_TOO_BIG:
            return CommandRejected(
                "payload_too_large",
                "the gateway closed the connection (1009): a frame was over its "
                "size limit; lower the client's max_frame_bytes to match it",
            )
        return CommandRejected(
            "bad_frame",
            f"the gateway closed the connection ({code} {name}: "
            f"{self._close_reason or 'no reason given'}): it could not read a frame of "
            "this client",
        )

    def _refused_again(self, code: int, name: str) -> ConnectionRejected:
        error = ConnectionRejected(code, self._close_reason)
        error.args = (
            f"the gateway closed the connection with {code} ({name}"
            f"{': ' + self._close_reason if self._close_reason else ''}) twice without "
            "answering anything in between: it refuses this client's frames; fix the "
            "client (e.g. max_frame_bytes) rather than reconnect",
        )
        return error

    def _unreadable_frame(self, code: int) -> ConnectionRejected:
        """This client failed the connection (CLIENT_FAULTS): the gateway's frame was unreadable."""
        if code == CloseCode.MESSAGE_TOO_BIG:
            what = (
                f"a frame from the gateway was over this client's max_receive_bytes "
                f"({self.max_receive_bytes} bytes), e.g. the snapshot of a large thread; "
                "raise max_receive_bytes (None: no limit)"
            )
        else:
            what = (
                f"a frame from the gateway was unreadable ({code} "
                f"{CLIENT_FAULTS.get(code, '')}: {self._close_reason})"
            )
        error = ConnectionRejected(code, self._close_reason)
        error.args = (f"{what}; not reconnecting: the gateway would send it again",)
        return error

    async def _reconnect(self) -> ClientConnection:
        loop = asyncio.get_running_loop()
        lost_at = loop.time()
        backoff = self._backoff  # grows over connections until one proves healthy
        not_before = 0.0  # a busy gateway's Retry-After: not even a command cuts it short
        refused = False  # a 401 to the provider's last token
        while True:
            delay = backoff.next_delay()
            if self.give_up_after is not None:
                left = lost_at + self.give_up_after - loop.time()
                if left <= 0:
                    raise HubUnreachable(
                        f"no connection to {self.url} for {self.give_up_after:g} s; gave up"
                    )
                delay = min(delay, left)
                not_before = min(not_before, lost_at + self.give_up_after)
            if not_before > loop.time():
                await asyncio.sleep(not_before - loop.time())
            # A command waiting for the connection cuts the pause short: backoff
            # spares a gateway that nobody needs right now, not one that is wanted.
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), delay)
            try:
                token = await self._token_now()
            except Exception as exc:  # the provider's: it may work next time
                log.warning("agui-hub client: the token provider failed: %s", _describe(exc))
                continue
            try:
                return await self._open(token)
            except _GatewayBusy as exc:
                # The gateway named the earliest retry that can succeed.
                pause = exc.retry_after
                not_before = loop.time() + pause + random.uniform(0, 0.1 + 0.1 * pause)
                log.info("agui-hub client: reconnecting to %s: %s", self.url, exc)
            except HubUnreachable as exc:
                log.info("agui-hub client: reconnecting to %s: %s", self.url, exc)
            except ConnectionRejected as exc:
                # A provider's token may have expired on its way here: one more, fresh
                # one. A second 401 in a row is the provider's problem, not a race.
                if exc.close_code != CloseCode.UNAUTHORIZED or self._provider is None or refused:
                    raise
                refused = True
                log.warning("agui-hub client: reconnecting to %s: %s; asking the token "
                            "provider for another token", self.url, exc)  # fmt: skip

    async def _serve(self, ws: ClientConnection) -> None:
        """Resubscribe every thread, then dispatch frames until the connection closes."""
        try:
            for sub in list(self._subs.values()):
                if sub._sent_on is not ws and self._subs.get(sub.thread) is sub:
                    sub._sent_on = ws
                    await self._send(ws, sub._subscribe_command(next(self._ids)))
            async for data in ws:
                try:
                    frame = decode(data, self.encoding, max_size=None)
                except DecodeError as exc:
                    log.warning("agui-hub client: undecodable frame ignored: %s", exc)
                    continue
                if isinstance(frame, dict):
                    self._dispatch(frame)
        except ConnectionClosed:
            pass
        protocol = ws.protocol
        received, sent = protocol.close_rcvd, protocol.close_sent
        self._closed_here = (
            sent is not None
            and sent.code in CLIENT_FAULTS
            and (received is None or protocol.close_rcvd_then_sent is False)
        )
        if self._closed_here:
            # websockets failed the connection: a frame of the gateway over
            # max_receive_bytes (1009), not UTF-8 (1007) or malformed (1002).
            assert sent is not None
            self.close_code, self._close_reason = sent.code, sent.reason
        elif received is not None:
            self.close_code, self._close_reason = received.code, received.reason
        else:
            # 1006 when the connection ended without a close frame (the network).
            self.close_code, self._close_reason = 1006, ""

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        thread = frame.get("thread")
        sub = self._subs.get(thread) if isinstance(thread, str) else None
        if kind == "event":
            if sub is not None:
                sub._on_event(frame)
        elif kind == "snapshot":
            if sub is not None:
                sub._on_snapshot(frame)
        elif kind == "subscribed":
            if sub is not None:
                if frame.get("id") is not None and frame.get("id") == sub._awaiting:
                    self._healthy()  # the gateway serves the thread
                sub._on_subscribed(frame)
        elif kind == "error":
            self._on_error(frame, sub)
        else:  # published, pong, unsubscribed
            future = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
            if future is not None and not future.done():
                self._healthy()
                future.set_result(frame)

    def _healthy(self) -> None:
        """The connection works: the next reconnect starts from the shortest pause."""
        self._backoff.reset()
        self._faulted = False

    def _on_error(self, frame: dict[str, Any], sub: Subscription | None) -> None:
        code, message = str(frame.get("code")), str(frame.get("message"))
        command_id = frame.get("id")
        thread = frame.get("thread") if isinstance(frame.get("thread"), str) else None
        future = self._pending.get(command_id)  # type: ignore[arg-type]
        if future is not None and not future.done():
            index = frame.get("index")
            error = from_error_frame(code, message, thread, index if type(index) is int else None)
            if isinstance(error, RateLimited):
                error.retry_after = _retry_after(frame)
            future.set_exception(error)
            return
        if sub is not None and command_id is not None and command_id == sub._awaiting:
            if code == "store_unavailable":
                # Not the subscription's fault: ask again after a pause.
                self._spawn(self._retry_subscribe(sub))
                return
            if code == "rate_limited":
                # Not carried out: the same subscribe again once the gateway allows it.
                wait = _retry_after(frame)
                self._spawn(self._retry_subscribe(sub, wait + random.uniform(0, 0.05 + 0.2 * wait)))
                return
            sub._fail(CommandRejected(code, message, thread))
            self._subs.pop(sub.thread, None)
            return
        if sub is None and thread is not None and command_id is not None:
            if code == "rate_limited":
                # An unsubscribe the gateway did not carry out: the gateway would keep
                # sending the thread's frames (dropped here), so send it again.
                self._spawn(self._retry_unsubscribe(thread, _retry_after(frame)))
                return
            if code == "not_subscribed":
                return  # an unsubscribe the gateway had done already (a retried one)
        if command_id is None and code == "forbidden" and sub is not None:
            # The gateway ended the subscription: the connection's grants (after a
            # refresh) no longer cover the thread. Not resubscribed on reconnect.
            sub._fail(CommandRejected(code, message, thread))
            self._subs.pop(sub.thread, None)
            return
        log.warning("agui-hub client: error from the gateway: %s %s", code, message)

    async def _retry_subscribe(self, sub: Subscription, delay: float | None = None) -> None:
        if delay is None:
            # Doubling pauses from ~1 s up to backoff_max while the store stays away.
            low = self.backoff_min
            cap = max(low, min(self.backoff_max, max(low, 1.0) * 2 ** min(sub._retries, 30)))
            sub._retries += 1
            delay = random.uniform(low, cap)
        await asyncio.sleep(delay)
        self._resubscribe(sub)

    async def _retry_unsubscribe(self, thread: str, wait: float) -> None:
        await asyncio.sleep(wait + random.uniform(0, 0.05 + 0.2 * wait))
        ws = self._ws
        if thread not in self._subs and self._connected.is_set() and ws is not None:
            command = {"type": "unsubscribe", "id": next(self._ids), "thread": thread}
            await self._send(ws, command)

    def _fail_all(self, error: AguiHubError) -> None:
        self._failure = error
        if self._refresher is not None:
            self._refresher.cancel()
        self._connected.clear()
        self._stopped.set()
        self._fail_pending(error)
        for sub in self._subs.values():
            sub._fail(error)


def _wire_message(message: Any) -> Any:
    """A message model (ours or ``ag_ui.core``'s) as its wire dict; a dict as it is."""
    dump = getattr(message, "model_dump", None)
    if dump is not None:
        return dump(mode="json", by_alias=True, exclude_none=True)
    return message
