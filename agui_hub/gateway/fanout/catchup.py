"""Members catching up: history replayed from memory or the store, paced by each socket.

A member that joins from an offset, or a live member whose queue filled up,
reads the events it lacks until it reaches its channel's cursor, then turns
live. So a slow viewer costs its own queue and store reads, never a buffer
in the gateway, and a burst from the store does not close every viewer at
once.

Hand-off from history to live has no gap and no duplicate: a member becomes
live when the history it has read reaches the channel's cursor, with no
``await`` between the check and the switch; every later event reaches it
through the channel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from ...errors import StoreUnavailable
from ...store.contract import Entry, ThreadStore
from ...wire.offsets import Offset, offset_key
from ...wire.protocol import CloseCode
from .entries import EntryReader
from .members import Member, Phase, Subscriber

__all__ = [
    "FIRST_PAGE",
    "HISTORY_PAGE",
    "HISTORY_PAGE_BYTES",
    "RESET_WAIT",
    "RESET_WAITS",
    "CatchUpChannel",
    "CatchUps",
]

log = logging.getLogger("agui_hub.hub")

HISTORY_PAGE = 500
"""Most entries read per store round trip while a member catches up."""
HISTORY_PAGE_BYTES = 256 * 1024
"""About the most bytes of events one such read holds: pages shrink for large
events, so that many members catching up at once hold a bounded amount each."""
FIRST_PAGE = 50
"""Entries of a member's first read, before it knows how large they are."""
RESET_WAIT = 0.1
"""Seconds a join or catch-up that read another epoch waits for the channel's reset."""
RESET_WAITS = 50
"""Waits for a reset the channel never sees before the member is told to resume."""


class CatchUpChannel(Protocol):
    """What catching up reads of, and asks of, the channel the members belong to."""

    @property
    def thread(self) -> str: ...

    @property
    def cursor(self) -> Offset:
        """The offset of the last entry the channel relayed: where history ends."""
        ...

    @property
    def epoch(self) -> str | None: ...

    @property
    def generation(self) -> int:
        """Bumped on every (re)load: a catch-up of another generation stops."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def members(self) -> Mapping[Subscriber, Member]: ...

    def recent_after(self, key: tuple[int, int]) -> list[Entry] | None:
        """The entries after *key* up to the cursor, from memory; ``None`` when
        memory does not hold them all."""
        ...

    def request_reset(self, epoch: str | None) -> None:
        """Make the channel reload: the store has another *epoch* than the channel."""
        ...

    def drop(self, sub: Subscriber, code: CloseCode, reason: str) -> None:
        """Remove *sub* and close it with *code*."""
        ...


class CatchUps:
    """The catch-up tasks of one channel's members, one per member at most."""

    __slots__ = ("_channel", "_reader", "_store")

    def __init__(self, channel: CatchUpChannel, store: ThreadStore, reader: EntryReader) -> None:
        self._channel = channel
        self._store = store
        self._reader = reader

    def start(self, sub: Subscriber, member: Member) -> None:
        """Start the background task that brings *member* up to the cursor."""
        member.phase = Phase.CATCHING_UP
        if member.task is None or member.task.done():
            member.task = asyncio.create_task(
                self._catch_up(sub, member), name=f"agui-hub catch-up {self._channel.thread}"
            )

    def stop(self, member: Member, *, cancel: bool = False) -> None:
        """Forget *member*'s task; cancel it while it waits for the socket, or
        whatever it does with *cancel* (the member or the channel goes)."""
        task, member.task = member.task, None
        if task is not None and not task.done() and (cancel or member.waiting):
            # Only while it waits for the socket, or when the channel goes:
            # cancelling a store read in flight would cost a Redis connection.
            task.cancel()

    def page_limit(self, most: int) -> int:
        """Entries per history read: at most *most*, and about HISTORY_PAGE_BYTES."""
        return max(1, min(most, HISTORY_PAGE_BYTES // max(1, self._reader.entry_size)))

    def replay(self, sub: Subscriber, member: Member, page: Sequence[Entry]) -> bool:
        """Send *page* up to the cursor; ``True`` if *member* must read more (it is not live)."""
        limit = offset_key(self._channel.cursor)
        if not sub.has_room():
            return True  # others filled the queue meanwhile: wait for it first
        for entry in page:
            key = offset_key(entry.offset)
            if key > limit:
                break  # the channel relays it when it gets there
            if key <= member.last:
                continue
            member.last, member.last_offset = key, entry.offset
            if not self._send(sub, member, entry):
                return True  # its queue is full: wait, then read on
        if member.last >= limit:
            member.phase = Phase.LIVE  # no await since the check: no gap, no repeat
            return False
        return True

    def _send(self, sub: Subscriber, member: Member, entry: Entry) -> bool:
        """Send *entry* to *sub* (if its run filter wants it); ``False``: the queue is full."""
        if member.run is not None and entry.run_id != member.run:
            return True
        if member.branch is not None and not member.branch.admits(entry):
            return True
        frame = self._reader.frame(entry, sub.encoding, None)
        return True if frame is None else sub.send(frame)

    async def _catch_up(self, sub: Subscriber, member: Member) -> None:
        channel = self._channel
        generation = channel.generation
        mismatches = 0
        limit = self.page_limit(FIRST_PAGE)
        try:
            while True:
                member.waiting = True
                try:
                    await sub.drained()
                finally:
                    member.waiting = False
                if not self._current(sub, member, generation):
                    return
                recent = channel.recent_after(member.last)
                if recent is not None:
                    if not self.replay(sub, member, recent):
                        return
                    continue
                page = await self._store.read_available(
                    channel.thread, after=member.last_offset, limit=limit
                )
                if not self._current(sub, member, generation):
                    return
                if page.epoch != channel.epoch:
                    # Re-created (or expired), and the channel has not seen it
                    # yet: its reset resyncs this member (subscribed, snapshot).
                    channel.request_reset(page.epoch)
                    mismatches += 1
                    if mismatches > RESET_WAITS:
                        channel.drop(sub, CloseCode.SLOW_CONSUMER, "thread reset, resume")
                        return
                    member.waiting = True
                    try:
                        await asyncio.sleep(RESET_WAIT)
                    finally:
                        member.waiting = False
                    continue
                if page.gap:
                    # Trimmed while it caught up: it resumes and gets a snapshot.
                    channel.drop(
                        sub, CloseCode.SLOW_CONSUMER, "history trimmed during replay, resume"
                    )
                    return
                if not page.entries and member.last < offset_key(channel.cursor):
                    # The store no longer has what the channel relayed: the
                    # client resumes and is told what it can get.
                    channel.drop(sub, CloseCode.SLOW_CONSUMER, "history changed, resume")
                    return
                if page.entries:
                    size = sum(len(e.data) for e in page.entries) // len(page.entries)
                    limit = max(1, min(HISTORY_PAGE, HISTORY_PAGE_BYTES // max(1, size)))
                if not self.replay(sub, member, page.entries):
                    return
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            log.warning("thread %s: catch-up failed: %s", channel.thread, exc)
            if self._current(sub, member, generation):
                channel.drop(sub, CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
        except Exception:
            log.exception("thread %s: catch-up failed", channel.thread)
            if self._current(sub, member, generation):
                channel.drop(sub, CloseCode.INTERNAL_ERROR, "internal error, resume")
        finally:
            if member.task is asyncio.current_task():
                member.task = None

    def _current(self, sub: Subscriber, member: Member, generation: int) -> bool:
        """Whether a catch-up of *member* started in *generation* should go on."""
        channel = self._channel
        return (
            not channel.closed
            and channel.generation == generation
            and channel.members.get(sub) is member
            and member.phase is Phase.CATCHING_UP
            and sub.is_open
        )
