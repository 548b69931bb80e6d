"""The fan-out core: one channel per live thread, many subscribers each.

A :class:`Hub` owns, per thread that has local subscribers, one
:class:`ThreadChannel`: a single store subscription (so one live reader per
process, whatever the number of sockets), the folded :class:`ThreadState` of
the thread (for late joiners' snapshots), and the thread's subscribers.

For every stored event the channel builds the event frame once per encoding
that has a subscriber and hands the same bytes to each of them. Subscribers
are anything with an ``encoding`` and a non-blocking ``send(frame) -> bool``
(the gateway's connections); a subscriber whose bounded queue overflows says
so by returning ``False`` and is dropped from the channel (the gateway then
closes it with the "slow consumer, resume" code).

Hand-off from history to live has no gap and no duplicate: a subscriber is
registered at the channel's cursor ``C`` with no await in between, so every
event after ``C`` reaches it through the channel (buffered while it catches
up); its history is read from the store and cut at ``C``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from .codec import Encoding, encode_msgpack
from .errors import (
    AguiHubError,
    OffsetExpired,
    ProtocolError,
    StoreUnavailable,
    SubscriptionLagged,
)
from .offsets import START, Offset, offset_key
from .protocol import (
    CloseCode,
    Position,
    Start,
    StartKind,
    encode_frame,
    event_frame,
    snapshot_frame,
    subscribed_frame,
)
from .reducer import ThreadState
from .store import Checkpoint, Entry, FeedSubscription, ThreadStore
from .writer import ThreadWriter

__all__ = ["Hub", "Subscriber", "ThreadChannel"]

log = logging.getLogger(__name__)

HISTORY_PAGE = 500
CHECKPOINT_EVERY = 1000
"""Events between two checkpoints of a live thread's folded state."""


class Subscriber(Protocol):
    """What the hub needs of a connection."""

    encoding: Encoding

    def send(self, frame: bytes | str) -> bool:
        """Queue *frame*; ``False`` if the queue overflowed (the hub then drops it)."""
        ...

    async def drained(self) -> None:
        """Wait until the send queue is at most half full (pacing history)."""
        ...

    def close_soon(self, code: CloseCode, reason: str) -> None:
        """Close the connection with *code* (does not wait)."""
        ...


class Phase(enum.Enum):
    CATCHING_UP = "catching_up"
    LIVE = "live"


@dataclass
class _Member:
    """One subscriber's view of a channel."""

    phase: Phase
    last: tuple[int, int]
    """Sort key of the last offset this subscriber has (sent or known)."""
    run: str | None
    buffer: list[tuple[Entry, dict[Encoding, bytes | str]]] = field(default_factory=list)


class ThreadChannel:
    """One live thread in this process."""

    def __init__(self, hub: Hub, thread: str) -> None:
        self.hub = hub
        self.thread = thread
        self.state = ThreadState()
        self.epoch: str | None = None
        self.cursor: Offset = START
        self.complete = True
        """Whether ``state`` folds the thread's whole history (nothing was trimmed first)."""
        self.members: dict[Subscriber, _Member] = {}
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._feed: FeedSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self.generation = 0
        """Bumped on every (re)load, so that a replay in progress notices a reset."""
        self._since_checkpoint = 0
        self._checkpointing: asyncio.Future[None] | None = None
        self._checkpoint_due = False

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Fold the stored history, then follow the thread live."""
        try:
            await self._load()
            self._task = asyncio.create_task(self._pump(), name=f"agui-hub channel {self.thread}")
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._ready.set()

    async def ready(self) -> None:
        await self._ready.wait()
        if self._error is not None:
            raise self._error

    async def _load(self) -> None:
        store = self.hub.store
        self.state = ThreadState()
        self.complete = True
        self.generation += 1
        self._since_checkpoint = 0
        self.epoch = await store.epoch(self.thread)
        after = START
        checkpoint = await store.get_checkpoint(self.thread) if self.epoch else None
        if checkpoint is not None and checkpoint.epoch == self.epoch:
            # Fold the checkpoint instead of the history it stands for.
            for event in msgpack.unpackb(checkpoint.events, raw=False):
                with contextlib.suppress(ProtocolError):
                    self.state.apply(event)
            self.complete = checkpoint.complete
            after = checkpoint.offset
        try:
            entries = await store.read(self.thread, after=after)
        except OffsetExpired:
            # Events after `after` were trimmed: fold what is left, and say so.
            self.complete = False
            info = await store.info(self.thread)
            if info is not None and info.trimmed is not None:
                after = info.trimmed
            entries = await store.read(self.thread, after=after)
        for entry in entries:
            self._fold(entry)
        # Not last_offset(): an event stored after the read would be skipped.
        self.cursor = entries[-1].offset if entries else after
        self._feed = store.subscribe(self.thread, after=self.cursor)
        await self._feed.open()

    def _maybe_checkpoint(self) -> None:
        self._since_checkpoint += 1
        # Often enough that retention never trims past the last checkpoint.
        interval = CHECKPOINT_EVERY
        max_len = self.hub.store.retention.max_len
        if max_len:
            interval = min(interval, max(1, max_len // 2))
        if self._since_checkpoint < interval or self.epoch is None:
            return
        self._since_checkpoint = 0
        if self._checkpointing is not None and not self._checkpointing.done():
            self._checkpoint_due = True  # written as soon as the one in flight is done
            return
        self._checkpointing = asyncio.ensure_future(self._put_checkpoints(self._checkpoint()))

    def _checkpoint(self) -> Checkpoint:
        # Encoded now, so the checkpoint is exactly the state at this cursor.
        assert self.epoch is not None
        return Checkpoint(
            self.cursor, self.epoch, encode_msgpack(self.state.compact()), self.complete
        )

    async def _put_checkpoints(self, checkpoint: Checkpoint) -> None:
        while True:
            try:
                await self.hub.store.put_checkpoint(self.thread, checkpoint)
            except AguiHubError as exc:
                log.warning("thread %s: checkpoint not stored: %s", self.thread, exc)
            if not self._checkpoint_due or self.epoch is None:
                return
            self._checkpoint_due = False
            checkpoint = self._checkpoint()

    async def _pump(self) -> None:
        assert self._feed is not None
        while True:
            try:
                async for entry in self._feed:
                    self._deliver(entry)
                return
            except asyncio.CancelledError:
                raise
            except SubscriptionLagged as exc:
                # This channel fell behind: follow again from where it stopped.
                await self._feed.close()
                self._feed = self.hub.store.subscribe(self.thread, after=exc.last)
            except OffsetExpired:
                # Trimmed under us, or the thread was re-created: start over and
                # tell every subscriber to resync.
                await self._reset()
            except StoreUnavailable as exc:
                log.warning("thread %s: store unavailable: %s", self.thread, exc)
                self._close_all(CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
                return
            except AguiHubError as exc:
                log.warning("thread %s: %s", self.thread, exc)
                self._close_all(CloseCode.INTERNAL_ERROR, "internal error, resume")
                return

    async def _reset(self) -> None:
        if self._feed is not None:
            await self._feed.close()
        await self._load()
        for sub, member in list(self.members.items()):
            member.phase = Phase.LIVE
            member.buffer.clear()
            member.last = offset_key(self.cursor)
            self._send(sub, subscribed_frame(None, self.thread, self.epoch, self.cursor, False))
            self._send_snapshot(sub)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._feed is not None:
            await self._feed.close()

    def _close_all(self, code: CloseCode, reason: str) -> None:
        for sub in list(self.members):
            sub.close_soon(code, reason)
        self.members.clear()
        self.hub._forget(self)

    # -- events ----------------------------------------------------------------------------

    def _fold(self, entry: Entry) -> dict[str, Any] | None:
        try:
            event = msgpack.unpackb(entry.data, raw=False)
            self.state.apply(event)
        except (ProtocolError, ValueError, TypeError, msgpack.UnpackException) as exc:
            # A stored event the reducer cannot apply (e.g. a plain-XADD producer's
            # bad patch): it is still relayed; the snapshot just skips it.
            log.debug("thread %s: not folded at %s: %s", self.thread, entry.offset, exc)
            return None
        return event  # type: ignore[no-any-return]

    def _deliver(self, entry: Entry) -> None:
        if self.epoch is None and self._feed is not None and self._feed.epoch is not None:
            # The thread's first event created its epoch: subscribers need it to resume.
            self.epoch = self._feed.epoch
            for sub in list(self.members):
                self._send(sub, subscribed_frame(None, self.thread, self.epoch, self.cursor, True))
        self._fold(entry)
        self.cursor = entry.offset
        self._maybe_checkpoint()
        key = offset_key(entry.offset)
        frames: dict[Encoding, bytes | str] = {}  # one frame per encoding, for everyone
        for sub, member in list(self.members.items()):
            if key <= member.last:
                continue
            if member.phase is Phase.CATCHING_UP:
                member.buffer.append((entry, frames))
            else:
                member.last = key
                self._send_entry(sub, member, entry, frames)

    def _send(self, sub: Subscriber, frame: dict[str, Any]) -> bool:
        if not sub.send(encode_frame(frame, sub.encoding)):
            self._drop_slow(sub)
            return False
        return True

    def _send_snapshot(self, sub: Subscriber) -> bool:
        frame = snapshot_frame(
            self.thread, self.cursor, self.epoch, self.state.compact(), self.complete
        )
        return self._send(sub, frame)

    def _drop_slow(self, sub: Subscriber) -> None:
        self._drop(sub, CloseCode.SLOW_CONSUMER, "slow consumer: reconnect and resume")

    def _drop(self, sub: Subscriber, code: CloseCode, reason: str) -> None:
        if self.members.pop(sub, None) is not None:
            sub.close_soon(code, reason)
            if not self.members:
                self.hub._forget(self)

    # -- subscribers ---------------------------------------------------------------------------

    async def add(self, sub: Subscriber, command_id: Any, start: Start, run: str | None) -> None:
        """Subscribe *sub*: reply, then history or snapshot, then live events."""
        await self.ready()
        cursor, key = self.cursor, offset_key(self.cursor)
        if isinstance(start, Position):
            if start.epoch is not None and start.epoch != self.epoch:
                # Another epoch: the client's offsets mean nothing here. (No epoch
                # at all: an offset someone typed, taken in the current epoch.)
                self._join_with_snapshot(sub, command_id, run, recovered=False)
                return
            if offset_key(start.offset) >= key:
                # Nothing missed (or the client is ahead of this process: skip
                # what it already has).
                self.members[sub] = _Member(Phase.LIVE, max(key, offset_key(start.offset)), run)
                self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, cursor, True))
                return
            await self._join_with_history(sub, command_id, run, start.offset)
        elif start is StartKind.LIVE:
            self.members[sub] = _Member(Phase.LIVE, key, run)
            self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, cursor, True))
        elif start is StartKind.SNAPSHOT:
            self._join_with_snapshot(sub, command_id, run, recovered=True)
        else:
            await self._join_with_history(sub, command_id, run, START)

    def _join_with_snapshot(
        self, sub: Subscriber, command_id: Any, run: str | None, *, recovered: bool
    ) -> None:
        self.members[sub] = _Member(Phase.LIVE, offset_key(self.cursor), run)
        frame = subscribed_frame(command_id, self.thread, self.epoch, self.cursor, recovered)
        if self._send(sub, frame):
            self._send_snapshot(sub)

    async def _join_with_history(
        self, sub: Subscriber, command_id: Any, run: str | None, after: Offset
    ) -> None:
        # Registered at the cursor with no await before: every later event
        # reaches this member through _deliver (buffered until it is live).
        cursor, generation = self.cursor, self.generation
        limit = offset_key(cursor)
        member = self.members[sub] = _Member(Phase.CATCHING_UP, limit, run)
        store = self.hub.store
        try:
            page = await store.read(self.thread, after=after, limit=HISTORY_PAGE)
        except OffsetExpired:
            self.members.pop(sub, None)
            self._join_with_snapshot(sub, command_id, run, recovered=False)
            return
        if not self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, cursor, True)):
            return
        while page:
            for entry in page:
                if offset_key(entry.offset) > limit:
                    page = []
                    break
                if not self._send_entry(sub, member, entry, None):
                    return
                # Paced by the socket: never more than half the send queue ahead.
                await sub.drained()
                if self.members.get(sub) is not member or self.generation != generation:
                    return  # dropped, or the thread was reset (which resynced it)
            if not page or page[-1].offset == cursor or len(page) < HISTORY_PAGE:
                break
            try:
                page = await store.read(self.thread, after=page[-1].offset, limit=HISTORY_PAGE)
            except OffsetExpired:
                # Trimmed while we replayed: the client resumes and gets a snapshot.
                self._drop(sub, CloseCode.SLOW_CONSUMER, "history trimmed during replay, resume")
                return
        if self.members.get(sub) is not member or self.generation != generation:
            return
        # History up to the join cursor is out: what arrived since follows, then live.
        buffered, member.buffer = member.buffer, []
        member.phase = Phase.LIVE
        for entry, frames in buffered:
            if offset_key(entry.offset) > member.last and not self._send_entry(
                sub, member, entry, frames, live=True
            ):
                return

    def _send_entry(
        self,
        sub: Subscriber,
        member: _Member,
        entry: Entry,
        frames: dict[Encoding, bytes | str] | None,
        *,
        live: bool = False,
    ) -> bool:
        if live:
            member.last = offset_key(entry.offset)
        if member.run is not None and entry.run_id != member.run:
            return True
        frame = frames.get(sub.encoding) if frames is not None else None
        if frame is None:
            frame = event_frame(self.thread, entry.offset, entry.data, sub.encoding)
            if frames is not None:
                frames[sub.encoding] = frame
        if not sub.send(frame):
            self._drop_slow(sub)
            return False
        return True

    def remove(self, sub: Subscriber) -> None:
        self.members.pop(sub, None)
        if not self.members:
            self.hub._forget(self)


class Hub:
    """All live threads of this process, over one store."""

    def __init__(self, store: ThreadStore) -> None:
        self.store = store
        self.channels: dict[str, ThreadChannel] = {}
        self.writer = ThreadWriter(store)

    async def subscribe(
        self, sub: Subscriber, thread: str, command_id: Any, start: Start, run: str | None
    ) -> None:
        channel = self.channels.get(thread)
        if channel is None:
            channel = self.channels[thread] = ThreadChannel(self, thread)
            try:
                await channel.start()
            except BaseException:
                self.channels.pop(thread, None)
                raise
        await channel.add(sub, command_id, start, run)

    def unsubscribe(self, sub: Subscriber, thread: str) -> bool:
        channel = self.channels.get(thread)
        if channel is None or sub not in channel.members:
            return False
        channel.remove(sub)
        return True

    def _forget(self, channel: ThreadChannel) -> None:
        if self.channels.get(channel.thread) is channel and not channel.members:
            del self.channels[channel.thread]
            task = asyncio.ensure_future(channel.close())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def publish(
        self, thread: str, events: Sequence[Any], event_ids: Sequence[str] | None = None
    ) -> list[Offset]:
        """Validate, check the sequence, store: see :meth:`ThreadWriter.publish`."""
        return await self.writer.publish(thread, events, event_ids)

    async def close(self) -> None:
        for channel in list(self.channels.values()):
            await channel.close()
        self.channels.clear()
