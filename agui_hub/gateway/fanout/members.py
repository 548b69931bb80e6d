"""Who a channel serves: a :class:`Subscriber` (a connection), and its :class:`Member`.

A member is in one of three phases (:class:`Phase`):

* ``JOINING``: registered, the ``subscribed`` reply not sent yet. Nothing is
  sent to it: the reply always comes first.
* ``CATCHING_UP``: reading history from the store, paced by its socket
  (:meth:`Subscriber.drained`), until it reaches the channel's cursor
  (:mod:`~agui_hub.gateway.fanout.catchup`).
* ``LIVE``: gets each event as the channel receives it.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Protocol

from ...wire.codec import Encoding
from ...wire.offsets import Offset, offset_key
from ...wire.protocol import CloseCode
from .branches import Branch

__all__ = ["Member", "Phase", "Subscriber"]


class Subscriber(Protocol):
    """What the hub needs of a connection."""

    encoding: Encoding

    @property
    def is_open(self) -> bool:
        """Whether frames sent now can still reach the client."""
        ...

    def send(self, frame: bytes | str) -> bool:
        """Queue *frame*; ``False`` when the queue is over its bound (pace or stop)."""
        ...

    async def drained(self) -> None:
        """Wait until the send queue is at most half full, or the connection is gone."""
        ...

    def has_room(self) -> bool:
        """Whether the send queue is within its bound now."""
        ...

    def close_soon(self, code: CloseCode, reason: str) -> None:
        """Close the connection with *code* (does not wait)."""
        ...

    def ended(self, thread: str) -> None:
        """The hub ended the subscription to *thread* (after telling the client why)."""
        ...


class Phase(enum.Enum):
    JOINING = "joining"
    CATCHING_UP = "catching_up"
    LIVE = "live"


@dataclass(slots=True, eq=False)
class Member:
    """One subscriber's view of a channel."""

    phase: Phase
    last: tuple[int, int]
    """Sort key of the last offset this subscriber has (sent or known)."""
    last_offset: Offset
    run: str | None
    branch: Branch | None = None
    """Only this branch's entries (judged in order: it follows the runs that
    continue it); ``None``: every entry (or *run*'s)."""
    task: asyncio.Task[None] | None = None
    """The catch-up task, while there is one."""
    waiting: bool = False
    """Whether the catch-up task waits for the socket (and may be cancelled)."""

    def set_last(self, offset: Offset) -> None:
        """Record that this subscriber has everything up to *offset*."""
        self.last, self.last_offset = offset_key(offset), offset
