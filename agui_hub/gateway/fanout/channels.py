"""The fan-out core: one channel per live thread, many subscribers each.

A :class:`Hub` owns, per thread that has local subscribers, one
:class:`ThreadChannel`: a single store subscription (so one live reader per
process, whatever the number of sockets), the folded :class:`ThreadState` of
the thread (for late joiners' snapshots), and the thread's subscribers.

For every stored event the channel builds the event frame once per encoding
that has a subscriber and hands the same bytes to each of them. Subscribers
are anything with an ``encoding`` and a non-blocking ``send(frame) -> bool``
(the gateway's connections, :class:`~agui_hub.gateway.fanout.members.Subscriber`);
``False`` means "your queue is full now".

A member joins (``JOINING``), reads the history it lacks (``CATCHING_UP``)
and then gets each event as the channel receives it (``LIVE``); a live
member whose queue fills up goes back to catching up instead of being
closed. The channel hands the work to collaborators, one concern each:

* :mod:`~agui_hub.gateway.fanout.history` folds the stored thread when the channel
  (re)loads, from its checkpoint on;
* :mod:`~agui_hub.gateway.fanout.checkpoints` writes the channel's checkpoints;
* :mod:`~agui_hub.gateway.fanout.recent` keeps the latest entries in memory, so a
  resume storm reads no store;
* :mod:`~agui_hub.gateway.fanout.catchup` replays history to members, paced by
  their sockets;
* :mod:`~agui_hub.gateway.fanout.entries` decodes, folds and encodes entries;
* :mod:`~agui_hub.gateway.fanout.resyncs` sends branch members their branch's
  snapshot after a reload (the channel's state folds every branch).
* :mod:`~agui_hub.gateway.fanout.branch_folds` keeps the last branch folds, so
  that the next joins of a branch read no thread.

Failures stay where they start: an entry that cannot be folded or encoded is
relayed to whoever can take it (or skipped, with a logged reason) and marks
the snapshot incomplete; a channel whose store feed fails closes its members
with a documented code (1013 store unavailable, 1011 anything else) and is
forgotten, so the next subscribe starts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from ...agui.patch import YIELD_WORK, StateLimits, WorkBudget
from ...agui.reducer import ThreadState
from ...agui.runs import RunInfo, RunTree
from ...errors import (
    OffsetExpired,
    StoreUnavailable,
    SubscriptionLagged,
    ThreadReset,
    UnknownRun,
)
from ...store.contract import Entry, FeedSubscription, ThreadStore
from ...wire.codec import Encoding
from ...wire.offsets import START, Offset, offset_key
from ...wire.protocol import (
    CloseCode,
    Position,
    Start,
    StartKind,
    encode_frame,
    error_frame,
    snapshot_frame,
    subscribed_frame,
)
from ..writer import DEFAULT_MAX_EVENT_BYTES, ThreadWriter
from .branch_folds import BranchFolds
from .branches import Branch, JoinView
from .catchup import FIRST_PAGE, RESET_WAIT, CatchUps
from .checkpoints import Checkpointer
from .entries import EntryReader
from .history import LOAD_ATTEMPTS, fold_history
from .members import Member, Phase, Subscriber
from .recent import DEFAULT_RECENT_BUDGET, RecentBounds, RecentBudget, RecentEntries
from .resyncs import BranchResyncs

__all__ = ["Hub", "Phase", "Subscriber", "ThreadChannel"]

log = logging.getLogger("agui_hub.hub")

YIELD_BYTES = 256 * 1024
"""Bytes of events a channel relays before it lets the connections' writers run
(one writer batch: small events still go out in large writes)."""


class _Reload(Exception):
    """The channel was reset or closed while a join waited: start the join again."""


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
        self.members: dict[Subscriber, Member] = {}
        self.closed = False
        self._ready = asyncio.Event()
        self._error: BaseException | None = None
        self._feed: FeedSubscription | None = None
        self._task: asyncio.Task[None] | None = None
        self.generation = 0
        """Bumped on every (re)load, so that a join or catch-up in progress notices a reset."""
        self._reader = EntryReader(thread)
        self._checkpoints = Checkpointer(self, hub.store)
        self._catch_ups = CatchUps(self, hub.store, self._reader)
        self._snapshots: dict[Encoding, bytes | str] = {}
        self._snapshots_at: tuple[Any, ...] | None = None
        self._recent_bounds = RecentBounds.for_store(hub.store)
        self._recent = RecentEntries(START, self._recent_bounds, hub.recent_memory)
        """The latest entries, counted in the hub's budget."""
        self._resyncs = BranchResyncs(self, hub.store)
        self._branch_folds = BranchFolds()
        """The latest branch snapshots' folds, for the next joins of those branches."""

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
            folded = await fold_history(
                store, self.thread, self.hub.limits, self._reader, self._recent_bounds
            )
            feed = store.subscribe(self.thread, after=folded.cursor)
            try:
                await feed.open()
            except BaseException:
                await feed.close()  # it may have subscribed before it failed
                raise
            if folded.epoch is not None and feed.epoch != folded.epoch:
                await feed.close()  # re-created or deleted while we read: read it again
                continue
            self.state, self.epoch = folded.state, folded.epoch
            self.cursor, self.complete = folded.cursor, folded.complete
            self._recent.release()
            self._recent = folded.recent
            self._recent.attach(self.hub.recent_memory)
            self.generation += 1
            self._branch_folds.clear()  # of the old generation: never used again
            self._checkpoints.restart(folded.checkpoint_bytes)
            self._feed = feed
            return
        raise StoreUnavailable(
            f"thread {self.thread!r} was re-created {LOAD_ATTEMPTS} times while being read"
        )

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
                worked = self.state.work
                async for entry in feed:
                    self._deliver(entry)
                    relayed += len(entry.data)
                    work = self.state.work
                    if relayed >= YIELD_BYTES or not 0 <= work - worked < YIELD_WORK:
                        # Let the writers send what was queued: a burst from the
                        # store must not fill every queue before any is written;
                        # and a burst of costly deltas holds the loop for one
                        # delta at a time (between two entries the channel's
                        # state, cursor and members agree). A reload replaced
                        # the state (its work is lower): counted afresh.
                        relayed, worked = 0, work
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
        old_epoch = self.epoch
        await self._load()
        for sub, member in list(self.members.items()):
            if member.phase is Phase.JOINING:
                continue  # its join notices the new generation and replies itself
            self._catch_ups.stop(member)
            if member.branch is not None:
                if self.epoch == old_epoch:
                    # Trimming overtook this channel: the branch is still stored,
                    # its snapshot is a fold of the store (the channel's state
                    # folds every branch), read off the relay's path.
                    member.phase = Phase.JOINING
                    self._resyncs.start(sub, member)
                else:  # a new epoch has none of the old one's runs: the branch is gone
                    self.end_branch(sub, "the thread was re-created and its runs are gone")
                continue
            member.phase = Phase.LIVE
            member.set_last(self.cursor)
            # Both, whatever the queue says: a resync without its snapshot would
            # leave the client with the old epoch's state.
            self._send(sub, subscribed_frame(None, self.thread, self.epoch, self.cursor, False))
            sub.send(self._snapshot_bytes(sub.encoding))
        if not self.members:
            self.hub._forget(self)  # every member followed a branch that is gone

    def end_branch(self, sub: Subscriber, why: str) -> None:
        """End *sub*'s branch subscription with an error frame ``unknown_run``."""
        del self.members[sub]
        sub.ended(self.thread)
        self._send(
            sub,
            error_frame(
                "unknown_run",
                f"subscription to thread {self.thread!r} ended: {why}; subscribe again",
                None,
                self.thread,
            ),
        )

    def request_reset(self, epoch: str | None) -> None:
        """Make the pump reload: the store has another epoch than this channel.

        A thread that expired, or was evicted, announces nothing: whoever
        reads another epoch first tells the channel.
        """
        feed = self._feed
        if feed is not None and not self.closed:
            feed._fail(ThreadReset(self.thread, self.epoch, epoch))

    def backlog(self) -> tuple[int, Offset | None]:
        """Live entries the store delivered that this channel has not relayed yet, and
        the offset of the oldest (see :meth:`FeedSubscription.backlog`)."""
        return self._feed.backlog() if self._feed is not None else (0, None)

    async def close(self) -> None:
        self.closed = True
        self._forget_recent()
        self._branch_folds.clear()
        self._checkpoints.stop()
        for member in self.members.values():
            self._catch_ups.stop(member, cancel=True)
        self._resyncs.cancel()
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._feed is not None:
            await self._feed.close()

    def _holds_after(self, offset: Offset) -> bool:
        """Whether memory holds every entry after *offset* (a catch-up reads no store)."""
        return offset == self.cursor or self._recent.after(offset_key(offset)) is not None

    def recent_after(self, key: tuple[int, int]) -> list[Entry] | None:
        """The entries after *key* up to the cursor, from memory; ``None`` when
        memory does not hold them all (read the store)."""
        return self._recent.after(key)

    def _forget_recent(self) -> None:
        self._recent.release()
        self._recent = RecentEntries(self.cursor, self._recent_bounds, self.hub.recent_memory)

    def _fail(self, code: CloseCode, reason: str) -> None:
        """Close every member with *code* and forget this channel."""
        self.closed = True
        self._forget_recent()
        for sub, member in list(self.members.items()):
            self._catch_ups.stop(member, cancel=True)
            sub.close_soon(code, reason)
        self.members.clear()
        self.hub._forget(self)

    # -- events ----------------------------------------------------------------------------

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
        reader = self._reader
        event = reader.decode(entry)
        if event is None:
            frames = {Encoding.MSGPACK: None, Encoding.JSON: None}
            self.complete = False
        elif not reader.fold(self.state, entry, event):
            self.complete = False
        offset = entry.offset
        key = offset_key(offset)
        self.cursor = offset
        self._recent.add(entry)
        reader.measure(entry)
        self._checkpoints.count(len(entry.data))
        run_id = entry.run_id
        live = Phase.LIVE
        # The run filter and the frame lookup, inlined: this loop runs once per
        # event and member, and now that a send only queues (the gateway flushes
        # once per turn), the calls around it were a good part of its cost.
        for sub, member in list(self.members.items()):
            if member.phase is not live or key <= member.last:
                continue
            member.last, member.last_offset = key, offset
            if member.run is not None and member.run != run_id:
                continue
            if member.branch is not None and not member.branch.admits(entry):
                continue
            encoding = sub.encoding
            frame = (
                frames[encoding] if encoding in frames else reader.frame(entry, encoding, frames)
            )
            if frame is not None and not sub.send(frame):
                # Its queue is full: it catches up from the store at its own
                # pace instead of being closed (nothing is buffered here).
                self._catch_ups.start(sub, member)

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
                    self.thread,
                    self.cursor,
                    self.epoch,
                    self.state.compact(share_messages=True),  # encoded right here
                    self.complete,
                ),
                encoding,
            )
            self._snapshots[encoding] = frame
        return frame

    # -- subscribers ---------------------------------------------------------------------------

    async def add(
        self,
        sub: Subscriber,
        command_id: Any,
        start: Start,
        run: str | None,
        branch: str | None = None,
    ) -> bool:
        """Subscribe *sub*: the reply first, then history or a snapshot, then live events.

        Returns once the reply is queued, with its ``recovered`` flag (``False``: a
        snapshot follows instead of the events after *start*); history follows in
        the background. With *branch* (a run id), only the events of the branch
        that ends with that run, then of the runs that continue it (see
        :class:`~agui_hub.gateway.fanout.branches.Branch`); its snapshots fold that
        branch only. Raises :class:`~agui_hub.errors.UnknownRun` for a *branch*
        that is no run of the thread, :class:`_Reload` when the channel closed
        while the join waited (the hub then joins a fresh channel).
        """
        await self.ready()
        for _attempt in range(LOAD_ATTEMPTS):
            if self.closed:
                raise _Reload()
            generation = self.generation
            tree = None
            if branch is not None:
                tree = RunTree(await self.hub.store.runs(self.thread))
                if branch not in tree.by_id:
                    raise UnknownRun(
                        f"thread {self.thread!r} has no run {branch!r} (the runs command "
                        "lists them)"
                    )
                if self.closed or self.generation != generation:
                    continue
            view = JoinView(run, tree, branch)
            joined: bool | None
            if isinstance(start, Position):
                if start.epoch is not None and start.epoch != self.epoch:
                    # Another epoch: the client's offsets mean nothing here. (No epoch
                    # at all: an offset someone typed, taken in the current epoch.)
                    joined = await self._join_with_snapshot(sub, command_id, view, recovered=False)
                    if joined is not None:
                        return joined
                    continue
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
                        joined = await self._join_with_snapshot(
                            sub, command_id, view, recovered=False
                        )
                        if joined is not None:
                            return joined
                        continue
                    if wanted <= offset_key(self.cursor):
                        # The channel relayed past it while we asked: the events
                        # in between come from the store (the history join).
                        continue
                    # Still ahead, and stored: it has everything up to its offset.
                    return self._join_live(sub, command_id, view, start.offset)
                if wanted == offset_key(self.cursor):
                    return self._join_live(sub, command_id, view, self.cursor)
                joined = await self._join_with_history(
                    sub, command_id, view, start.offset, generation
                )
            elif start is StartKind.LIVE:
                return self._join_live(sub, command_id, view, self.cursor)
            elif start is StartKind.SNAPSHOT:
                joined = await self._join_with_snapshot(sub, command_id, view, recovered=True)
            else:
                joined = await self._join_with_history(sub, command_id, view, START, generation)
            if joined is not None:
                return joined
        raise StoreUnavailable(f"thread {self.thread!r} kept being reset; subscribe again")

    def _join_live(self, sub: Subscriber, command_id: Any, view: JoinView, at: Offset) -> bool:
        branch = view.branch_at(at)
        if branch is not None and at == self.cursor:
            # The index was read before this instant; the channel's own fold
            # knows the run at its cursor for sure.
            current = self.state.current_run
            branch.current = current.run_id if current is not None else None
        self.members[sub] = Member(Phase.LIVE, offset_key(at), at, view.run, branch)
        self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, self.cursor, True))
        return True

    async def _join_with_snapshot(
        self, sub: Subscriber, command_id: Any, view: JoinView, *, recovered: bool
    ) -> bool | None:
        """Join with a snapshot at the cursor; ``None``: start the join again."""
        if view.tree is not None:
            return await self.join_branch_snapshot(sub, command_id, view, recovered)
        self.members[sub] = Member(Phase.LIVE, offset_key(self.cursor), self.cursor, view.run)
        self._send(
            sub, subscribed_frame(command_id, self.thread, self.epoch, self.cursor, recovered)
        )
        # Always queued, however large: a queue takes one frame past its bound
        # when it was at most half full (see Connection.send).
        sub.send(self._snapshot_bytes(sub.encoding))
        return recovered

    async def join_branch_snapshot(
        self,
        sub: Subscriber,
        command_id: Any,
        view: JoinView,
        recovered: bool,
        replacing: Member | None = None,
    ) -> bool | None:
        """A branch's snapshot: its runs folded from the store (the channel's
        state folds every branch), then what the channel relayed past it.
        *replacing*: the member it resyncs (``False``: that one left meanwhile)."""
        generation, run = self.generation, view.branch
        assert run is not None
        folded = self._branch_folds.get(run, generation, self._holds_after)
        if folded is None:
            folded = await fold_history(
                self.hub.store, self.thread, self.hub.limits, EntryReader(self.thread), None,
                view.branch_at(START),
            )  # fmt: skip
            if replacing is not None and self.members.get(sub) is not replacing:
                return False
            if self.closed or self.generation != generation or folded.epoch != self.epoch:
                return None  # reset while it read: join again
            self._branch_folds.put(run, generation, folded)
        at = folded.cursor
        assert folded.branch is not None
        member = Member(Phase.LIVE, offset_key(at), at, None, folded.branch.copy())
        self.members[sub] = member
        self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, at, recovered))
        state, complete = folded.state, folded.complete
        sub.send(self._branch_folds.frame(run, sub.encoding, lambda: encode_frame(
            snapshot_frame(self.thread, at, self.epoch, state.compact(), complete), sub.encoding
        )))  # fmt: skip
        if member.last < offset_key(self.cursor):
            # The channel relayed past the fold (while it read, or since it was
            # kept): memory or the store has the rest.
            member.phase = Phase.CATCHING_UP
            self._catch_ups.start(sub, member)
        return recovered

    async def _join_with_history(
        self, sub: Subscriber, command_id: Any, view: JoinView, after: Offset, generation: int
    ) -> bool | None:
        """Join by replaying the events after *after*; returns the reply's ``recovered``
        flag, or ``None``: start the join again."""
        member = Member(Phase.JOINING, offset_key(after), after, view.run, view.branch_at(after))
        self.members[sub] = member
        joined_at = view.reply_offset(self.cursor)
        recent = self._recent.after(member.last)
        if recent is not None:
            # Everything it lacks is in memory: no read, no await, no reset to mind.
            member.phase = Phase.CATCHING_UP
            self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, joined_at, True))
            if self._catch_ups.replay(sub, member, recent):
                self._catch_ups.start(sub, member)
            return True
        try:
            page = await self.hub.store.read_available(
                self.thread, after=after, limit=self._catch_ups.page_limit(FIRST_PAGE)
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
            self.request_reset(page.epoch)
            await asyncio.sleep(RESET_WAIT)
            return None
        if page.gap and (
            member.branch is None or page.trimmed is None or member.branch.lost(after, page.trimmed)
        ):
            # Trimmed: the client cannot get every event after its position (on a
            # branch: of that branch; other branches' trimmed runs do not count).
            del self.members[sub]
            return await self._join_with_snapshot(sub, command_id, view, recovered=False)
        # The reply, then the history up to the cursor, then live: the epoch and
        # cursor of this instant match the history (no reset since the read).
        member.phase = Phase.CATCHING_UP
        self._send(sub, subscribed_frame(command_id, self.thread, self.epoch, joined_at, True))
        if self._catch_ups.replay(sub, member, page.entries):
            self._catch_ups.start(sub, member)
        return True

    def drop(self, sub: Subscriber, code: CloseCode, reason: str) -> None:
        """Remove *sub* and close it with *code* (it resumes on its own)."""
        member = self.members.pop(sub, None)
        if member is not None:
            self._catch_ups.stop(member, cancel=True)
            sub.close_soon(code, reason)
            if not self.members:
                self.hub._forget(self)

    def remove(self, sub: Subscriber) -> None:
        member = self.members.pop(sub, None)
        if member is not None:
            self._catch_ups.stop(member)
        if not self.members:
            self.hub._forget(self)


def _log_close_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("closing a channel failed: %r", task.exception())


class Hub:
    """All live threads of this process, over one store.

    *limits* bound the folded state of each thread, in the channels (for
    snapshots) and in the writer (which refuses events past them);
    *max_event_bytes* the size of each published event; *recent_budget*
    the bytes of latest entries the channels keep in memory together;
    *strict_patches* makes the writer refuse deltas that do not apply (see
    :class:`ThreadWriter`).
    """

    def __init__(
        self,
        store: ThreadStore,
        *,
        limits: StateLimits | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        recent_budget: int = DEFAULT_RECENT_BUDGET,
        strict_patches: bool = False,
    ) -> None:
        self.store = store
        self.limits = limits or StateLimits()
        self.channels: dict[str, ThreadChannel] = {}
        self.writer = ThreadWriter(
            store,
            limits=self.limits,
            max_event_bytes=max_event_bytes,
            strict_patches=strict_patches,
        )
        self._closing: set[asyncio.Future[None]] = set()
        self.recent_memory = RecentBudget(recent_budget)
        """The latest entries the channels keep in memory, against the budget."""

    @property
    def recent_budget(self) -> int:
        """Bytes of latest entries the channels may keep in memory together."""
        return self.recent_memory.limit

    @property
    def recent_bytes(self) -> int:
        """Bytes of latest entries the channels keep now."""
        return self.recent_memory.used

    async def subscribe(
        self,
        sub: Subscriber,
        thread: str,
        command_id: Any,
        start: Start,
        run: str | None,
        branch: str | None = None,
    ) -> bool:
        """Subscribe *sub* to *thread* (only *branch*'s events, when given: see
        :meth:`ThreadChannel.add`); returns once the ``subscribed`` reply is
        queued, with its ``recovered`` flag (``False``: a snapshot follows)."""
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
                return await channel.add(sub, command_id, start, run, branch)
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
        self,
        thread: str,
        events: Sequence[Any],
        event_ids: Sequence[str] | None = None,
        *,
        work: WorkBudget | None = None,
        values_checked: bool = False,
    ) -> list[Offset]:
        """Validate, check the sequence, store: see :meth:`ThreadWriter.publish`
        (*work*: the publish's budget, to read what it cost)."""
        return await self.writer.publish(
            thread, events, event_ids, work=work, values_checked=values_checked
        )

    async def fold(
        self, thread: str, branch: str | None = None, tree: RunTree | None = None
    ) -> tuple[ThreadState, str | None, Offset]:
        """The thread as stored now, folded: ``(state, epoch, cursor)``; with
        *branch* (a run id), only the runs from the root of its tree to that
        run, up to its end (*tree*: the thread's runs, when the caller has read
        them already).

        Read from its checkpoint on, as a channel loads; nothing is kept (the
        HTTP bridge builds a run's input from it). Raises
        :class:`~agui_hub.errors.UnknownRun` when *branch* is no run of the
        thread, a :class:`~agui_hub.errors.StoreError` when the store fails.
        """
        path = None
        if branch is not None:
            try:
                if tree is None:
                    tree = RunTree(await self.store.runs(thread))
                path = Branch.of(tree, branch, follow=False)
            except KeyError:
                raise UnknownRun(
                    f"thread {thread!r} has no run {branch!r} (the runs command lists them)"
                ) from None
        folded = await fold_history(
            self.store, thread, self.limits, EntryReader(thread), None, path
        )
        return folded.state, folded.epoch, folded.cursor

    async def runs(self, thread: str) -> list[RunInfo]:
        """The thread's index of runs, from the store."""
        return await self.store.runs(thread)

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
