"""The fan-out core: one channel per live thread, many subscribers each.

A :class:`Hub` owns, per thread that has local subscribers, one
:class:`ThreadChannel`: a single store subscription (so one live reader per
process, whatever the number of sockets), the folded :class:`ThreadState` of
the thread (for late joiners' snapshots), and the thread's subscribers.

For every stored event the channel builds the event frame once per encoding
that has a subscriber and hands the same bytes to each of them. Subscribers
are anything with an ``encoding`` and a non-blocking ``send(frame) -> bool``
(the gateway's connections); ``False`` means "your queue is full now".

Members, in one of three phases (:class:`Phase`):

* ``JOINING``: registered, the ``subscribed`` reply not sent yet. Nothing is
  sent to it: the reply always comes first.
* ``CATCHING_UP``: reading history from the store, paced by its socket
  (:meth:`Subscriber.drained`), until it reaches the channel's cursor. A
  live member whose queue fills up goes back to this phase instead of being
  closed, so a slow viewer costs its own queue and store reads, never a
  buffer in the gateway, and a burst from the store does not close every
  viewer at once.
* ``LIVE``: gets each event as the channel receives it.

Hand-off from history to live has no gap and no duplicate: a member becomes
live when the history it has read reaches the channel's cursor, with no
``await`` between the check and the switch; every later event reaches it
through the channel.

Failures stay where they start: an entry that cannot be folded or encoded is
relayed to whoever can take it (or skipped, with a logged reason) and marks
the snapshot incomplete; a channel whose store feed fails closes its members
with a documented code (1013 store unavailable, 1011 anything else) and is
forgotten, so the next subscribe starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from ..agui.events import check_json_value
from ..agui.reducer import StateLimits, ThreadState
from ..errors import (
    OffsetExpired,
    StoreUnavailable,
    SubscriptionLagged,
    ThreadReset,
)
from ..store.contract import Checkpoint, Entry, FeedSubscription, ThreadStore
from ..wire.codec import Encoding, encode_msgpack
from ..wire.offsets import START, Offset, offset_key
from ..wire.protocol import (
    CloseCode,
    Position,
    Start,
    StartKind,
    encode_frame,
    event_frame,
    snapshot_frame,
    subscribed_frame,
)
from .writer import DEFAULT_MAX_EVENT_BYTES, ThreadWriter

__all__ = ["Hub", "Phase", "Subscriber", "ThreadChannel"]

log = logging.getLogger("agui_hub.hub")

HISTORY_PAGE = 500
"""Most entries read per store round trip while a member catches up."""
HISTORY_PAGE_BYTES = 256 * 1024
"""About the most bytes of events one such read holds: pages shrink for large
events, so that many members catching up at once hold a bounded amount each."""
FIRST_PAGE = 50
"""Entries of a member's first read, before it knows how large they are."""
LOAD_PAGE = 5000
"""Entries read per store round trip while a channel folds its thread."""
CHECKPOINT_EVERY = 1000
"""Events between two checkpoints of a live thread's folded state."""
YIELD_BYTES = 256 * 1024
"""Bytes of events a channel relays before it lets the connections' writers run
(one writer batch: small events still go out in large writes)."""
LOAD_ATTEMPTS = 5
"""Reads of a thread a (re)load tries before it gives up (the thread kept changing)."""
RESET_WAIT = 0.1
"""Seconds a join or catch-up that read another epoch waits for the channel's reset."""
RESET_WAITS = 50
"""Waits for a reset the channel never sees before the member is told to resume."""
LOGGED_SKIPS = 5
"""Entries per channel whose skip is logged as a warning (later ones at debug level)."""
RECENT_ENTRIES = 1024
"""Most of its latest entries a channel keeps in memory, for members that join
from an offset or catch up (a resume storm reads no store)."""
RECENT_BYTES = 512 * 1024
"""About the most bytes of entries a channel keeps in memory for them."""
DEFAULT_RECENT_BUDGET = 64 * 1024 * 1024
"""About the most bytes of recent entries all channels of a hub keep together."""
ENTRY_OVERHEAD = 128
"""Bytes an entry held in memory costs beyond its event data (tuple, strings)."""


class _Recent:
    """A channel's latest entries, contiguous: every entry after :attr:`start`
    up to the channel's cursor, oldest first (a deque that can be bisected)."""

    __slots__ = ("entries", "head", "keys", "size", "start", "start_key")

    def __init__(self, start: Offset) -> None:
        self.keys: list[tuple[int, int]] = []
        self.entries: list[Entry] = []
        self.head = 0
        """Index of the oldest entry kept (those before it are dropped)."""
        self.size = 0
        self.start = start
        """The offset right before the oldest entry kept (the cursor when empty)."""
        self.start_key = offset_key(start)

    def __len__(self) -> int:
        return len(self.keys) - self.head

    def add(self, key: tuple[int, int], entry: Entry, size: int) -> None:
        self.keys.append(key)
        self.entries.append(entry)
        self.size += size

    def drop_oldest(self) -> int:
        """Forget the oldest entry; the bytes it was counted for."""
        entry = self.entries[self.head]
        self.start, self.start_key = entry.offset, self.keys[self.head]
        self.head += 1
        if self.head > 64 and self.head * 2 > len(self.keys):
            del self.keys[: self.head], self.entries[: self.head]
            self.head = 0
        size = len(entry.data) + ENTRY_OVERHEAD
        self.size -= size
        return size

    def after(self, key: tuple[int, int]) -> list[Entry] | None:
        """Every entry after *key* up to the cursor, or ``None`` when some are not kept."""
        if key < self.start_key:
            return None
        return self.entries[bisect_right(self.keys, key, self.head) :]


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


class Phase(enum.Enum):
    JOINING = "joining"
    CATCHING_UP = "catching_up"
    LIVE = "live"


class _Reload(Exception):
    """The channel was reset or closed while a join waited: start the join again."""


@dataclass(slots=True, eq=False)
class _Member:
    """One subscriber's view of a channel."""

    phase: Phase
    last: tuple[int, int]
    """Sort key of the last offset this subscriber has (sent or known)."""
    last_offset: Offset
    run: str | None
    task: asyncio.Task[None] | None = None
    """The catch-up task, while there is one."""
    waiting: bool = False
    """Whether the catch-up task waits for the socket (and may be cancelled)."""


class ThreadChannel:
    """One live thread in this process."""

    def __init__(self, hub: Hub, thread: str) -> None:
        self.hub = hub
        self.thread = thread
        self.state = ThreadState(limits=hub.limits)
        self.epoch: str | None = None
        self.cursor: Offset = START
        self.complete = True
        """Whether ``state`` folds the thread's whole history (nothing trimmed or skipped)."""
        self.members: dict[Subscriber, _Member] = {}
        self.closed = False
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._feed: FeedSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self.generation = 0
        """Bumped on every (re)load, so that a join or catch-up in progress notices a reset."""
        self._since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        self._checkpointing: asyncio.Future[None] | None = None
        self._checkpoint_due = False
        self._skipped = 0
        self._snapshots: dict[Encoding, bytes | str] = {}
        self._snapshots_at: tuple[Any, ...] | None = None
        self.entry_size = 1024
        """A running average of the thread's entry size (sizes history pages)."""
        self._recent = _Recent(START)
        """The latest entries, counted in the hub's ``recent_bytes``."""
        retention = getattr(hub.store, "retention", None)
        self._recent_entries = min(
            RECENT_ENTRIES, getattr(retention, "max_len", 0) or RECENT_ENTRIES
        )
        self._recent_bytes = min(RECENT_BYTES, getattr(retention, "max_bytes", 0) or RECENT_BYTES)
        """Never more than the store keeps: a resume from a trimmed offset gets
        the same answer (a snapshot) whether memory or the store serves it."""

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Fold the stored history, then follow the thread live."""
        try:
            await self._load()
            if self.closed:
                # Forgotten while it loaded (its subscribers all left): close
                # what the load opened, start nothing.
                self._forget_recent()
                if self._feed is not None:
                    await self._feed.close()
                raise _Reload()
            self._task = asyncio.create_task(self._pump(), name=f"agui-hub channel {self.thread}")
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._ready.set()  # every waiter wakes, on success and on failure

    async def ready(self) -> None:
        await self._ready.wait()
        if isinstance(self._error, asyncio.CancelledError):
            # The subscribe that started it was cancelled, not this one: join afresh.
            raise _Reload()
        if self._error is not None:
            raise self._error

    async def _load(self) -> None:
        """Fold the thread into a new state, then follow it from there.

        The new state, cursor and epoch replace the old ones together, once
        the feed is open: a checkpoint or a snapshot taken meanwhile sees the
        old, consistent triple, never a state of one epoch with the cursor of
        another.
        """
        store = self.hub.store
        for _attempt in range(LOAD_ATTEMPTS):
            state, epoch, cursor, complete, recent = await self._fold_stored()
            feed = store.subscribe(self.thread, after=cursor)
            try:
                await feed.open()
            except BaseException:
                await feed.close()  # it may have subscribed before it failed
                raise
            if epoch is not None and feed.epoch != epoch:
                await feed.close()  # re-created or deleted while we read: read it again
                continue
            self.state, self.epoch, self.cursor, self.complete = state, epoch, cursor, complete
            self._forget_recent()
            self._recent = recent
            self.hub.recent_bytes += recent.size
            self._trim_recent()
            self.generation += 1
            self._since_checkpoint = 0
            self._bytes_since_checkpoint = 0
            self._feed = feed
            return
        raise StoreUnavailable(
            f"thread {self.thread!r} was re-created {LOAD_ATTEMPTS} times while being read"
        )

    async def _fold_stored(
        self, *, keep_recent: bool = True
    ) -> tuple[ThreadState, str | None, Offset, bool, _Recent]:
        """(state, epoch, cursor, complete, latest entries) of the thread as stored now.

        From the thread's checkpoint when it has one of the same epoch, then
        page by page; every page carries the epoch it was read in, so a thread
        re-created between two pages is read again rather than mixed. The
        last entries read are kept (within the channel's bounds): viewers that
        resume right after a restart are served from them.
        """
        store = self.hub.store
        checkpoint = await store.get_checkpoint(self.thread)
        for _attempt in range(LOAD_ATTEMPTS):
            state = ThreadState(limits=self.hub.limits)
            complete, after = True, START
            if checkpoint is not None:
                if self._fold_checkpoint(state, checkpoint):
                    complete, after = checkpoint.complete, checkpoint.offset
                else:
                    state, checkpoint = ThreadState(limits=self.hub.limits), None
            epoch: str | None = None
            first, restart, folded = True, False, 0
            recent = _Recent(after)
            while True:
                page = await store.read_available(self.thread, after=after, limit=LOAD_PAGE)
                if first:
                    first, epoch = False, page.epoch
                    if checkpoint is not None and checkpoint.epoch != epoch:
                        checkpoint, restart = None, True  # of another epoch: fold it all
                        break
                elif page.epoch != epoch:
                    restart = True  # re-created between two reads
                    break
                if page.gap:
                    complete = False  # trimmed before it could be folded
                    if page.trimmed is not None:
                        recent = _Recent(page.trimmed)  # what follows is contiguous
                for entry in page.entries:
                    self.entry_size += (len(entry.data) - self.entry_size) // 16
                    if not self._fold_into(state, entry):
                        complete = False
                    if keep_recent:
                        recent.add(
                            offset_key(entry.offset), entry, len(entry.data) + ENTRY_OVERHEAD
                        )
                        while (
                            len(recent) > self._recent_entries or recent.size > self._recent_bytes
                        ):
                            recent.drop_oldest()
                    folded += 1
                    if folded % LOAD_PAGE == 0:
                        await asyncio.sleep(0)  # a long fold lets everything else run
                if page.entries:
                    after = page.entries[-1].offset
                elif page.trimmed is not None and offset_key(page.trimmed) > offset_key(after):
                    after = page.trimmed  # everything after `after` was trimmed
                if len(page.entries) < LOAD_PAGE:
                    break
            if not restart:
                return state, epoch, after, complete, recent
        raise StoreUnavailable(
            f"thread {self.thread!r} was re-created {LOAD_ATTEMPTS} times while being read"
        )

    def _fold_checkpoint(self, state: ThreadState, checkpoint: Checkpoint) -> bool:
        try:
            events = msgpack.unpackb(checkpoint.events, raw=False)
            if not isinstance(events, list):
                raise TypeError("a checkpoint is a list of events")
            for event in events:
                state.apply(event)
        except Exception as exc:  # an unreadable checkpoint is only a lost shortcut
            log.warning("thread %s: checkpoint not used: %r", self.thread, exc)
            return False
        return True

    def _maybe_checkpoint(self, size: int) -> None:
        self._since_checkpoint += 1
        self._bytes_since_checkpoint += size
        # Often enough that retention (by length or by bytes) never trims past
        # the last checkpoint.
        interval = CHECKPOINT_EVERY
        retention = self.hub.store.retention
        if retention.max_len:
            interval = min(interval, max(1, retention.max_len // 2))
        due = self._since_checkpoint >= interval or (
            retention.max_bytes > 0 and self._bytes_since_checkpoint >= retention.max_bytes // 2
        )
        if not due or self.epoch is None:
            return
        self._since_checkpoint = 0
        self._bytes_since_checkpoint = 0
        if self._checkpointing is not None and not self._checkpointing.done():
            self._checkpoint_due = True  # written as soon as the one in flight is done
            return
        checkpoint = self._checkpoint()
        if checkpoint is not None:
            self._checkpointing = asyncio.ensure_future(self._put_checkpoints(checkpoint))

    def _checkpoint(self) -> Checkpoint | None:
        # Encoded now, in one step: the state, cursor and epoch of one instant.
        if self.epoch is None:
            return None
        try:
            events = encode_msgpack(self.state.compact())
        except ValueError as exc:
            log.warning("thread %s: checkpoint not encoded: %s", self.thread, exc)
            return None
        return Checkpoint(self.cursor, self.epoch, events, self.complete)

    async def _put_checkpoints(self, checkpoint: Checkpoint) -> None:
        while True:
            try:
                await self.hub.store.put_checkpoint(self.thread, checkpoint)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost checkpoint is only a lost shortcut
                log.warning("thread %s: checkpoint not stored: %r", self.thread, exc)
            if not self._checkpoint_due or self.closed:
                return
            self._checkpoint_due = False
            next_one = self._checkpoint()
            if next_one is None:
                return
            checkpoint = next_one

    async def _pump(self) -> None:
        try:
            await self._follow()
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            log.warning("thread %s: store unavailable: %s", self.thread, exc)
            self._fail(CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
        except Exception:
            # Last resort: whatever went wrong, the members are told and the
            # channel is forgotten, so that the next subscribe starts afresh.
            log.exception("thread %s: channel failed", self.thread)
            self._fail(CloseCode.INTERNAL_ERROR, "internal error, resume")
        else:
            if not self.closed:  # the feed ended (the store was closed)
                self._fail(CloseCode.SERVICE_RESTART, "server restart: reconnect and resume")

    async def _follow(self) -> None:
        while True:
            feed = self._feed
            assert feed is not None
            try:
                relayed = 0
                async for entry in feed:
                    self._deliver(entry)
                    relayed += len(entry.data)
                    if relayed >= YIELD_BYTES:
                        # Let the writers send what was queued: a burst from the
                        # store must not fill every queue before any is written.
                        relayed = 0
                        await asyncio.sleep(0)
                return
            except SubscriptionLagged as exc:
                # This channel fell behind: follow again from where it stopped.
                await feed.close()
                self._feed = self.hub.store.subscribe(self.thread, after=exc.last)
                try:
                    await self._feed.open()
                except BaseException:
                    await self._feed.close()
                    raise
                if self._feed.epoch != self.epoch:
                    await self._reset()  # re-created meanwhile: not the same offsets
            except OffsetExpired:
                # Trimmed under us, or the thread was re-created: start over and
                # tell every subscriber to resync.
                await self._reset()

    async def _reset(self) -> None:
        # The old epoch's entries must not answer the joins that come while
        # it reloads: they read the store, and find the new epoch.
        self._forget_recent()
        if self._feed is not None:
            await self._feed.close()
            self._feed = None
        await self._load()
        for sub, member in list(self.members.items()):
            if member.phase is Phase.JOINING:
                continue  # its join notices the new generation and replies itself
            self._stop_catching_up(member)
            member.phase = Phase.LIVE
            self._set_last(member, self.cursor)
            # Both, whatever the queue says: a resync without its snapshot would
            # leave the client with the old epoch's state.
            self._send(sub, subscribed_frame(None, self.thread, self.epoch, self.cursor, False))
            sub.send(self._snapshot_bytes(sub.encoding))

    def backlog(self) -> tuple[int, Offset | None]:
        """Live entries the store delivered that this channel has not relayed yet, and
        the offset of the oldest (see :meth:`FeedSubscription.backlog`)."""
        return self._feed.backlog() if self._feed is not None else (0, None)

    async def close(self) -> None:
        self.closed = True
        self._forget_recent()
        if self._checkpointing is not None and not self._checkpointing.done():
            self._checkpoint_due = False  # the one in flight finishes; no more
        for member in self.members.values():
            self._stop_catching_up(member, cancel=True)
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._feed is not None:
            await self._feed.close()

    def _trim_recent(self) -> None:
        """Keep the latest entries within the channel's bounds and the hub's budget."""
        recent, hub = self._recent, self.hub
        while len(recent) and (
            len(recent) > self._recent_entries
            or recent.size > self._recent_bytes
            or hub.recent_bytes > hub.recent_budget
        ):
            hub.recent_bytes -= recent.drop_oldest()

    def _forget_recent(self) -> None:
        self.hub.recent_bytes -= self._recent.size
        self._recent = _Recent(self.cursor)

    def _fail(self, code: CloseCode, reason: str) -> None:
        """Close every member with *code* and forget this channel."""
        self.closed = True
        self._forget_recent()
        for sub, member in list(self.members.items()):
            self._stop_catching_up(member, cancel=True)
            sub.close_soon(code, reason)
        self.members.clear()
        self.hub._forget(self)

    # -- events ----------------------------------------------------------------------------

    def _skip(self, entry: Entry, why: str) -> None:
        self._skipped += 1
        level = logging.WARNING if self._skipped <= LOGGED_SKIPS else logging.DEBUG
        log.log(level, "thread %s: entry %s %s", self.thread, entry.offset, why)

    def _decode(self, entry: Entry) -> dict[str, Any] | None:
        """The event of *entry*; ``None`` (and logged) when it is not a msgpack map."""
        try:
            event = msgpack.unpackb(entry.data, raw=False)
        except Exception as exc:  # one entry never ends a channel
            self._skip(entry, f"is not msgpack, not relayed: {exc!r:.200}")
            return None
        if not isinstance(event, dict):
            self._skip(entry, "is not an event (a map), not relayed")
            return None
        return event

    def _fold_into(self, state: ThreadState, entry: Entry, event: Any = None) -> bool:
        """Fold *entry* into *state*; ``False`` (and logged) when it cannot be."""
        if event is None:
            event = self._decode(entry)
            if event is None:
                return False
        try:
            for value in event.values():
                if type(value) in (dict, list, bytes, float):
                    # Binary values (a plain-XADD producer's msgpack) would make
                    # every JSON snapshot unencodable: not folded.
                    check_json_value(value)
            state.apply(event)
        except Exception as exc:  # one entry never ends a channel
            # A stored event the reducer cannot apply (a plain-XADD producer's
            # bad patch, a missing field, a state past the limits): it is still
            # relayed; the snapshot says it is incomplete.
            self._skip(entry, f"not folded: {exc!r:.200}")
            return False
        return True

    def _deliver(self, entry: Entry) -> None:
        feed = self._feed
        if self.epoch is None and feed is not None and feed.epoch is not None:
            # The thread's first event created its epoch: subscribers need it to resume.
            self.epoch = feed.epoch
            for sub, member in list(self.members.items()):
                if member.phase is not Phase.JOINING:
                    self._send(
                        sub, subscribed_frame(None, self.thread, self.epoch, self.cursor, True)
                    )
        # One frame per encoding, built lazily, the same bytes for everyone.
        frames: dict[Encoding, bytes | str | None] = {}
        event = self._decode(entry)
        if event is None:
            frames = {Encoding.MSGPACK: None, Encoding.JSON: None}
            self.complete = False
        elif not self._fold_into(self.state, entry, event):
            self.complete = False
        offset = entry.offset
        key = offset_key(offset)
        self.cursor = offset
        size = len(entry.data)
        self._recent.add(key, entry, size + ENTRY_OVERHEAD)
        self.hub.recent_bytes += size + ENTRY_OVERHEAD
        self._trim_recent()
        self.entry_size += (size - self.entry_size) // 16
        self._maybe_checkpoint(size)
        run_id = entry.run_id
        live = Phase.LIVE
        # _send_entry and _frame, inlined: this loop runs once per event and
        # member, and now that a send only queues (the gateway flushes once
        # per turn), the calls around it were a good part of its cost.
        for sub, member in list(self.members.items()):
            if member.phase is not live or key <= member.last:
                continue
            member.last, member.last_offset = key, offset
            if member.run is not None and member.run != run_id:
                continue
            encoding = sub.encoding
            frame = frames[encoding] if encoding in frames else self._frame(entry, encoding, frames)
            if frame is not None and not sub.send(frame):
                # Its queue is full: it catches up from the store at its own
                # pace instead of being closed (nothing is buffered here).
                self._catch_up(sub, member)

    def _frame(
        self, entry: Entry, encoding: Encoding, frames: dict[Encoding, bytes | str | None] | None
    ) -> bytes | str | None:
        """The frame of *entry* in *encoding*; ``None`` when it cannot be encoded (logged)."""
        if frames is not None and encoding in frames:
            return frames[encoding]
        frame: bytes | str | None = None
        if frames is not None or self._decode(entry) is not None:  # live entries: decoded
            try:
                frame = event_frame(self.thread, entry.offset, entry.data, encoding)
            except Exception as exc:  # one entry never ends a channel
                self._skip(entry, f"not relayed as {encoding.value}: {exc!r:.200}")
        if frames is not None:
            frames[encoding] = frame
        return frame

    def _send(self, sub: Subscriber, frame: dict[str, Any]) -> bool:
        """Send a frame of our own; ``False`` when the queue is full now."""
        return sub.send(encode_frame(frame, sub.encoding))

    def _snapshot_bytes(self, encoding: Encoding) -> bytes | str:
        """The snapshot frame at the cursor, built once per encoding and shared.

        Many members may need it at once (a reset, a resume storm): they get
        the same bytes, not a copy each.
        """
        key = (self.generation, self.cursor, self.complete, self.epoch)
        if self._snapshots_at != key:
            self._snapshots_at, self._snapshots = key, {}
        frame = self._snapshots.get(encoding)
        if frame is None:
            frame = encode_frame(
                snapshot_frame(
                    self.thread, self.cursor, self.epoch, self.state.compact(), self.complete
                ),
                encoding,
            )
            self._snapshots[encoding] = frame
        return frame

    def _drop(self, sub: Subscriber, code: CloseCode, reason: str) -> None:
        member = self.members.pop(sub, None)
        if member is not None:
            self._stop_catching_up(member, cancel=True)
            sub.close_soon(code, reason)
            if not self.members:
                self.hub._forget(self)

    def _send_entry(
        self,
        sub: Subscriber,
        member: _Member,
        entry: Entry,
        frames: dict[Encoding, bytes | str | None] | None,
    ) -> bool:
        """Send *entry* to *sub* (if its run filter wants it); ``False``: the queue is full."""
        if member.run is not None and entry.run_id != member.run:
            return True
        frame = self._frame(entry, sub.encoding, frames)
        return True if frame is None else sub.send(frame)

    @staticmethod
    def _set_last(member: _Member, offset: Offset) -> None:
        member.last, member.last_offset = offset_key(offset), offset

    # -- subscribers ---------------------------------------------------------------------------

    async def add(self, sub: Subscriber, command_id: Any, start: Start, run: str | None) -> bool:
        """Subscribe *sub*: the reply first, then history or a snapshot, then live events.

        Returns once the reply is queued, with its ``recovered`` flag (``False``: a
        snapshot follows instead of the events after *start*); history follows in
        the background.
        Raises :class:`_Reload` when the channel closed while the join waited
        (the hub then joins a fresh channel).
        """
        await self.ready()
        for _attempt in range(LOAD_ATTEMPTS):
            if self.closed:
                raise _Reload()
            generation = self.generation
            if isinstance(start, Position):
                if start.epoch is not None and start.epoch != self.epoch:
                    # Another epoch: the client's offsets mean nothing here. (No epoch
                    # at all: an offset someone typed, taken in the current epoch.)
                    return self._join_with_snapshot(sub, command_id, run, recovered=False)
                wanted = offset_key(start.offset)
                if wanted > offset_key(self.cursor):
                    # Ahead of this process: perhaps another gateway saw more. The
                    # store says whether that offset exists at all.
                    head = await self.hub.store.last_offset(self.thread)
                    if self.closed or self.generation != generation:
                        continue
                    if wanted > offset_key(head) or self.epoch is None:
                        # Not an offset of this stream: answered like another epoch,
                        # never with a subscription that would wait for it for ever.
                        return self._join_with_snapshot(sub, command_id, run, recovered=False)
                    if wanted <= offset_key(self.cursor):
                        # The channel relayed past it while we asked: the events
                        # in between come from the store (the history join).
                        continue
                    # Still ahead, and stored: it has everything up to its offset.
                    return self._join_live(sub, command_id, run, start.offset)
                if wanted == offset_key(self.cursor):
                    return self._join_live(sub, command_id, run, self.cursor)
                recovered = await self._join_with_history(
                    sub, command_id, run, start.offset, generation
                )
            elif start is StartKind.LIVE:
                return self._join_live(sub, command_id, run, self.cursor)
            elif start is StartKind.SNAPSHOT:
                return self._join_with_snapshot(sub, command_id, run, recovered=True)
            else:
                recovered = await self._join_with_history(sub, command_id, run, START, generation)
            if recovered is not None:
                return recovered
        raise StoreUnavailable(f"thread {self.thread!r} kept being reset; subscribe again")

    def _join_live(self, sub: Subscriber, command_id: Any, run: str | None, at: Offset) -> bool:
        self.members[sub] = _Member(Phase.LIVE, offset_key(at), at, run)
        self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, self.cursor, True))
        return True

    def _join_with_snapshot(
        self, sub: Subscriber, command_id: Any, run: str | None, *, recovered: bool
    ) -> bool:
        self.members[sub] = _Member(Phase.LIVE, offset_key(self.cursor), self.cursor, run)
        self._send(
            sub, subscribed_frame(command_id, self.thread, self.epoch, self.cursor, recovered)
        )
        # Always queued, however large: a queue takes one frame past its bound
        # when it was at most half full (see Connection.send).
        sub.send(self._snapshot_bytes(sub.encoding))
        return recovered

    async def _join_with_history(
        self, sub: Subscriber, command_id: Any, run: str | None, after: Offset, generation: int
    ) -> bool | None:
        """Join by replaying the events after *after*; returns the reply's ``recovered``
        flag, or ``None``: start the join again."""
        member = _Member(Phase.JOINING, offset_key(after), after, run)
        self.members[sub] = member
        joined_at = self.cursor
        recent = self._recent.after(member.last)
        if recent is not None:
            # Everything it lacks is in memory: no read, no await, no reset to mind.
            member.phase = Phase.CATCHING_UP
            self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, joined_at, True))
            if self._replay(sub, member, recent):
                self._catch_up(sub, member)
            return True
        try:
            page = await self.hub.store.read_available(
                self.thread, after=after, limit=self._page_limit(FIRST_PAGE)
            )
        except BaseException:
            if self.members.get(sub) is member:
                del self.members[sub]
            raise
        if self.members.get(sub) is not member:
            return False  # unsubscribed or dropped meanwhile: nothing answered
        if self.closed or self.generation != generation:
            del self.members[sub]  # reset while we read: the history read may be stale
            return None
        if self.epoch is not None and page.epoch != self.epoch:
            # Re-created (or expired) and the channel has not seen it yet:
            # make it reload, and join again after that rather than reply for
            # a dead epoch.
            del self.members[sub]
            self._request_reset(page.epoch)
            await asyncio.sleep(RESET_WAIT)
            return None
        if page.gap:
            # Trimmed: the client cannot get every event after its position.
            del self.members[sub]
            return self._join_with_snapshot(sub, command_id, run, recovered=False)
        # The reply, then the history up to the cursor, then live: the epoch and
        # cursor of this instant match the history (no reset since the read).
        member.phase = Phase.CATCHING_UP
        self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, joined_at, True))
        if self._replay(sub, member, page.entries):
            self._catch_up(sub, member)
        return True

    def _replay(self, sub: Subscriber, member: _Member, page: Sequence[Entry]) -> bool:
        """Send *page* up to the cursor; ``True`` if *member* must read more (it is not live)."""
        limit = offset_key(self.cursor)
        if not sub.has_room():
            return True  # others filled the queue meanwhile: wait for it first
        for entry in page:
            key = offset_key(entry.offset)
            if key > limit:
                break  # the channel relays it when it gets there
            if key <= member.last:
                continue
            member.last, member.last_offset = key, entry.offset
            if not self._send_entry(sub, member, entry, None):
                return True  # its queue is full: wait, then read on
        if member.last >= limit:
            member.phase = Phase.LIVE  # no await since the check: no gap, no repeat
            return False
        return True

    def _page_limit(self, most: int) -> int:
        """Entries per history read: at most *most*, and about HISTORY_PAGE_BYTES."""
        return max(1, min(most, HISTORY_PAGE_BYTES // max(1, self.entry_size)))

    def _request_reset(self, epoch: str | None) -> None:
        """Make the pump reload: the store has another epoch than this channel.

        A thread that expired, or was evicted, announces nothing: whoever
        reads another epoch first tells the channel.
        """
        feed = self._feed
        if feed is not None and not self.closed:
            feed._fail(ThreadReset(self.thread, self.epoch, epoch))

    def _catch_up(self, sub: Subscriber, member: _Member) -> None:
        """Start the background task that brings *member* up to the cursor."""
        member.phase = Phase.CATCHING_UP
        if member.task is None or member.task.done():
            member.task = asyncio.create_task(
                self._catch_up_loop(sub, member), name=f"agui-hub catch-up {self.thread}"
            )

    def _stop_catching_up(self, member: _Member, *, cancel: bool = False) -> None:
        task, member.task = member.task, None
        if task is not None and not task.done() and (cancel or member.waiting):
            # Only while it waits for the socket, or when the channel goes:
            # cancelling a store read in flight would cost a Redis connection.
            task.cancel()

    async def _catch_up_loop(self, sub: Subscriber, member: _Member) -> None:
        generation = self.generation
        mismatches = 0
        limit = self._page_limit(FIRST_PAGE)
        try:
            while True:
                member.waiting = True
                try:
                    await sub.drained()
                finally:
                    member.waiting = False
                if not self._current(sub, member, generation):
                    return
                recent = self._recent.after(member.last)
                if recent is not None:
                    if not self._replay(sub, member, recent):
                        return
                    continue
                page = await self.hub.store.read_available(
                    self.thread, after=member.last_offset, limit=limit
                )
                if not self._current(sub, member, generation):
                    return
                if page.epoch != self.epoch:
                    # Re-created (or expired), and the channel has not seen it
                    # yet: its reset resyncs this member (subscribed, snapshot).
                    self._request_reset(page.epoch)
                    mismatches += 1
                    if mismatches > RESET_WAITS:
                        self._drop(sub, CloseCode.SLOW_CONSUMER, "thread reset, resume")
                        return
                    member.waiting = True
                    try:
                        await asyncio.sleep(RESET_WAIT)
                    finally:
                        member.waiting = False
                    continue
                if page.gap:
                    # Trimmed while it caught up: it resumes and gets a snapshot.
                    self._drop(
                        sub, CloseCode.SLOW_CONSUMER, "history trimmed during replay, resume"
                    )
                    return
                if not page.entries and member.last < offset_key(self.cursor):
                    # The store no longer has what the channel relayed: the
                    # client resumes and is told what it can get.
                    self._drop(sub, CloseCode.SLOW_CONSUMER, "history changed, resume")
                    return
                if page.entries:
                    size = sum(len(e.data) for e in page.entries) // len(page.entries)
                    limit = max(1, min(HISTORY_PAGE, HISTORY_PAGE_BYTES // max(1, size)))
                if not self._replay(sub, member, page.entries):
                    return
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            log.warning("thread %s: catch-up failed: %s", self.thread, exc)
            if self._current(sub, member, generation):
                self._drop(sub, CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
        except Exception:
            log.exception("thread %s: catch-up failed", self.thread)
            if self._current(sub, member, generation):
                self._drop(sub, CloseCode.INTERNAL_ERROR, "internal error, resume")
        finally:
            if member.task is asyncio.current_task():
                member.task = None

    def _current(self, sub: Subscriber, member: _Member, generation: int) -> bool:
        """Whether a catch-up of *member* started in *generation* should go on."""
        return (
            not self.closed
            and self.generation == generation
            and self.members.get(sub) is member
            and member.phase is Phase.CATCHING_UP
            and sub.is_open
        )

    def remove(self, sub: Subscriber) -> None:
        member = self.members.pop(sub, None)
        if member is not None:
            self._stop_catching_up(member)
        if not self.members:
            self.hub._forget(self)


def _log_close_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("closing a channel failed: %r", task.exception())


class Hub:
    """All live threads of this process, over one store.

    *limits* bound the folded state of each thread, in the channels (for
    snapshots) and in the writer (which refuses events past them);
    *max_event_bytes* the size of each published event.
    """

    def __init__(
        self,
        store: ThreadStore,
        *,
        limits: StateLimits | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        recent_budget: int = DEFAULT_RECENT_BUDGET,
    ) -> None:
        self.store = store
        self.limits = limits or StateLimits()
        self.channels: dict[str, ThreadChannel] = {}
        self.writer = ThreadWriter(store, limits=self.limits, max_event_bytes=max_event_bytes)
        self._closing: set[asyncio.Future[None]] = set()
        self.recent_budget = recent_budget
        """Bytes of latest entries the channels may keep in memory together."""
        self.recent_bytes = 0
        """Bytes of latest entries the channels keep now."""

    async def subscribe(
        self, sub: Subscriber, thread: str, command_id: Any, start: Start, run: str | None
    ) -> bool:
        """Subscribe *sub* to *thread*; returns once the ``subscribed`` reply is queued,
        with its ``recovered`` flag (``False``: a snapshot follows)."""
        for _attempt in range(LOAD_ATTEMPTS):
            channel = self.channels.get(thread)
            if channel is None:
                channel = self.channels[thread] = ThreadChannel(self, thread)
                try:
                    await channel.start()
                except _Reload:
                    # Forgotten while it started: a fresh one.
                    if self.channels.get(thread) is channel:
                        del self.channels[thread]
                    continue
                except BaseException:
                    if self.channels.get(thread) is channel:
                        del self.channels[thread]
                    await channel.close()
                    raise
            try:
                return await channel.add(sub, command_id, start, run)
            except _Reload:
                continue  # that channel failed while we joined: a fresh one
            except BaseException:
                if not channel.members and self.channels.get(thread) is channel:
                    self._forget(channel)
                raise
        raise StoreUnavailable(f"thread {thread!r}: no channel stayed up; subscribe again")

    def unsubscribe(self, sub: Subscriber, thread: str) -> bool:
        channel = self.channels.get(thread)
        if channel is None or sub not in channel.members:
            return False
        channel.remove(sub)
        return True

    def _forget(self, channel: ThreadChannel) -> None:
        if self.channels.get(channel.thread) is channel and not channel.members:
            del self.channels[channel.thread]
        if channel.members:
            return
        channel.closed = True
        task = asyncio.ensure_future(channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(_log_close_failure)

    async def publish(
        self, thread: str, events: Sequence[Any], event_ids: Sequence[str] | None = None
    ) -> list[Offset]:
        """Validate, check the sequence, store: see :meth:`ThreadWriter.publish`."""
        return await self.writer.publish(thread, events, event_ids)

    async def fold(self, thread: str) -> tuple[ThreadState, str | None, Offset]:
        """The thread as stored now, folded: ``(state, epoch, cursor)``.

        Read from its checkpoint on, as a channel loads; nothing is kept (the
        HTTP bridge builds a run's input from it). Raises a
        :class:`~agui_hub.errors.StoreError` when the store fails.
        """
        channel = ThreadChannel(self, thread)
        state, epoch, cursor, _complete, _recent = await channel._fold_stored(keep_recent=False)
        return state, epoch, cursor

    def stats(self) -> dict[str, int]:
        """Counts an operator (and the leak tests) look at."""
        members = [m for c in self.channels.values() for m in c.members.values()]
        return {
            "channels": len(self.channels),
            "members": len(members),
            "catching_up": sum(m.phase is Phase.CATCHING_UP for m in members),
            "recent_bytes": self.recent_bytes,
        }

    async def close(self) -> None:
        for channel in list(self.channels.values()):
            await channel.close()
        self.channels.clear()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=5)
