"""One thread followed over a client's connection, and the items it yields.

:class:`Subscription` is what :meth:`HubClient.subscribe
<agui_hub.client.HubClient.subscribe>` returns: iterate it for
:class:`Subscribed`, :class:`Snapshot` and :class:`ThreadEvent` items, in
order (and with ``presence=True``,
:class:`~agui_hub.client.presence.PresenceChanged` items). The consumer side
(iteration, chunk expansion, the folded state, the kept presence, the resume
position) lives here; the frames come from the client's
:class:`~agui_hub.client.router.SubscriptionRouter`, which calls the
receiving side (``_on_event``, ``_on_snapshot``, ``_on_subscribed``,
``_on_presence``) and sends the subscribe commands this object builds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..agui.chunks import ChunkExpander
from ..agui.reducer import ThreadState
from ..errors import AguiHubError, ProtocolError
from ..wire.offsets import START, Offset, offset_key
from ..wire.protocol import Position
from .presence import LivePresence, PresenceChanged

__all__ = [
    "Item",
    "Snapshot",
    "StartFrom",
    "Subscribed",
    "Subscription",
    "SubscriptionHost",
    "ThreadEvent",
]

log = logging.getLogger("agui_hub.client")

StartFrom = Literal["live", "start", "snapshot"] | Position
"""Where a subscription starts: ``"live"``, ``"start"``, ``"snapshot"`` or after a
:class:`Position` (see docs/protocol.md, subscribe)."""


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


Item = Subscribed | Snapshot | ThreadEvent | PresenceChanged
"""What iterating a :class:`Subscription` yields (``PresenceChanged`` only with
``presence=True``)."""


# -- subscriptions ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Queued:
    item: Item
    position: Position | None  # the position once item is consumed (None: unchanged)


class SubscriptionHost(Protocol):
    """What a :class:`Subscription` asks of the client it belongs to (its router)."""

    async def attach(self, sub: Subscription) -> None:
        """Register *sub* and send its subscribe command (raises when the client cannot)."""
        ...

    async def detach(self, sub: Subscription) -> None:
        """Forget *sub* and unsubscribe its thread."""
        ...

    def resubscribe(self, sub: Subscription) -> None:
        """Send *sub*'s subscribe command again, from what it received."""
        ...


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
        client: Any,
        thread: str,
        start: StartFrom,
        *,
        host: SubscriptionHost,
        run: str | None,
        branch: str | None = None,
        expand_chunks: bool,
        state: bool,
        max_queue: int,
        presence: bool = False,
        client_info: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        """The :class:`~agui_hub.client.HubClient` this subscription belongs to (its
        ``close_code``, ``reconnects``, ...). Typed loosely: that module imports this one."""
        self._host = host  # the client's router: it sends this subscription's commands
        self.thread = thread
        self.start = start
        self.run = run
        self.branch = branch
        """The branch followed: its latest run, as far as received (it moves to
        each run that continues it; a resubscription asks for this one)."""
        self.max_queue = max_queue
        self.position: Position | None = start if isinstance(start, Position) else None
        """Resume here to get exactly what was not yielded yet (``None``: not known yet)."""
        self.recovered: bool | None = None
        """The last (re)subscription's ``recovered`` flag, once yielded."""
        self.state: ThreadState | None = ThreadState() if state else None
        """With ``state=True``: the thread folded from every item yielded so far."""
        self.presence: LivePresence | None = LivePresence() if presence else None
        """With ``presence=True``: who watches the thread, from every
        :class:`~agui_hub.client.presence.PresenceChanged` item yielded so far."""
        self.client_info = client_info
        """What this subscription tells the thread's other watchers about this client
        (sent with every subscribe; ``None``: nothing)."""
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
            await self._host.attach(self)
        return self

    async def close(self) -> None:
        """Unsubscribe; iteration ends after what is already queued is discarded."""
        if self._closed:
            return
        self._closed = True
        self._queue.clear()
        self._pieces.clear()
        self._wake.set()
        await self._host.detach(self)

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
                    self._host.resubscribe(self)
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
        elif isinstance(item, PresenceChanged):
            if self.presence is not None:
                item = self.presence.apply(item)
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

    # -- receiving side (called by the client's router) ----------------------------------

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
        if self.branch is not None:
            command["branch"] = self.branch
        if self.presence is not None:
            # Again on every resubscribe: a new connection has a new presence entry,
            # and the gateway then sends the whole list again.
            command["presence"] = True
        if self.client_info is not None:
            command["client"] = self.client_info
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
        self._host.resubscribe(self)
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
        if self.branch is not None and event.get("type") == "RUN_STARTED":
            run_id = event.get("runId")
            if isinstance(run_id, str) and run_id:
                # Sent on a branch, so it continues it: resume with it from now on
                # (its branch holds the one before).
                self.branch = run_id
        self._push(ThreadEvent(self.thread, offset, event), Position(offset, epoch))

    def _on_presence(self, frame: Mapping[str, Any]) -> None:
        if self.presence is None or self._awaiting is not None or self._lagged:
            # Not asked for; or about a subscription this one replaced, or frames are
            # dropped until a resubscribe: the gateway sends the whole list after it.
            return
        change = PresenceChanged.from_frame(self.thread, frame)
        if change is not None:
            self._push(change, None)
