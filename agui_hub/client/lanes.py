"""Publish lanes: concurrent publishes to one thread, sent in call order.

Used by both publishing paths: :class:`~agui_hub.client.publishing.PublishPipeline`
(through a gateway, where a "connection" is the WebSocket) and
:class:`~agui_hub.client.publisher.Publisher` into a store (where it is the
writer). Nothing here does I/O: the caller asks :meth:`PublishLane.may_send`,
waits its turn, sends, and reports back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

__all__ = ["Outgoing", "PublishLane"]


@dataclass(slots=True, eq=False)
class Outgoing:
    """One publish of a :class:`PublishLane` that is not answered yet."""

    sent_on: object | None = None
    """The connection it was last sent on, while its reply is awaited there."""
    turn: asyncio.Future[None] | None = None
    """Pending while it waits for the publishes before it to be sent."""


class PublishLane:
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
        self.entries: deque[Outgoing] = deque()
        self.ws: object | None = None
        """The connection :attr:`next` counts for."""
        self.next = 0
        """Entries before this index are sent on :attr:`ws` and await their replies."""

    def may_send(self, entry: Outgoing, ws: object) -> bool:
        if self.ws is not ws:  # a new connection: everything goes again
            self.ws, self.next = ws, 0
            self._advance()
        return self.next < len(self.entries) and self.entries[self.next] is entry

    async def wait_turn(self, entry: Outgoing, timeout: float | None) -> None:
        """Wait until *entry* may be next (check :meth:`may_send` again); TimeoutError."""
        entry.turn = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(entry.turn, timeout)
        finally:
            entry.turn = None

    def sent(self, entry: Outgoing, ws: object) -> None:
        entry.sent_on = ws
        self._advance()

    def again(self, entry: Outgoing) -> None:
        """*entry* must be sent again (on this connection or the next)."""
        if entry.sent_on is not None and entry.sent_on is self.ws:
            # Not sent after all: the ones behind it wait for it again.
            self.next = min(self.next, self.entries.index(entry))
        entry.sent_on = None

    def lost(self, ws: object) -> None:
        """*ws* closed: nothing sent on it counts (found once, not per publish)."""
        if self.ws is ws:
            self.ws, self.next = None, 0

    def remove(self, entry: Outgoing) -> None:
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
