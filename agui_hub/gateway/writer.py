"""Checked writes into thread streams: validate, verify the sequence, append.

:class:`ThreadWriter` is what stands between a producer and a
:class:`~agui_hub.store.ThreadStore`: the gateway's publish command and the
Python :class:`~agui_hub.client.publisher.Publisher` both write through it, so an
event reaches a stream only when it is a valid AG-UI 1.0 event that may come
next in its thread. A batch is stored whole or not at all, and a batch
retried with the same event ids is answered with the offsets already stored.

The writer keeps one :class:`~agui_hub.agui.sequence.SequenceVerifier` per thread,
judges new events against it and appends them on condition that nothing was
stored after what it has seen (:class:`~agui_hub.store.Expected`): one round
trip when it is the thread's only producer. When another writer (another
process, a plain XADD producer) stored events meanwhile, the append fails
with nothing stored; the writer reads those events, judges again and
retries. So the sequence rules hold across writers too. The one leniency: in
a thread whose beginning was trimmed away, an event that continues something
the kept events never mention may continue what the trimmed part opened, and
is accepted as if it did (once; what follows is judged as usual).

Publishes to one thread are judged and stored in the order the calls were
made (each takes its place in the thread's queue before it first awaits).
Those that queue up while an append for the thread is under way are stored
together by the next one, in one conditional append (a group commit, of at
most :data:`GROUP_EVENTS` events and about :data:`GROUP_BYTES`): the
verdicts are those of publishing them one by one, each caller gets its own
offsets or its own error, and a refused publish leaves the ones after it
judged as if it had never been sent. A store failure answers the group and
everything queued behind it, to be sent again in order.

State events are judged too, before they are stored: the writer keeps each
thread's state document and activity contents
(:class:`~agui_hub.agui.documents.StateDocuments`), so a snapshot or delta
that would take the state past the writer's
:class:`~agui_hub.agui.patch.StateLimits` raises
:class:`~agui_hub.errors.LimitExceeded`, with nothing stored, exactly where
:class:`~agui_hub.agui.reducer.ThreadState` (a gateway's fold) would refuse
it. A STATE_DELTA or ACTIVITY_DELTA whose patch does not apply is stored as
the official client takes it: it changes nothing, and is logged as a warning
and counted (:attr:`ThreadWriter.patches_not_applied`); with
``strict_patches`` it raises :class:`~agui_hub.errors.PatchError` instead.
Events already stored that do not apply (a plain XADD producer's) are
skipped when the writer catches up, as a gateway's fold skips them. In a
trimmed thread without a checkpoint the state document is unknown until the
next STATE_SNAPSHOT, and deltas are taken on trust meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import msgpack

from ..agui.chunks import ChunkExpander
from ..agui.documents import StateDocuments
from ..agui.events import validate_batch
from ..agui.patch import DEFAULT_LIMITS, YIELD_WORK, StateLimits, WorkBudget
from ..agui.sequence import SequenceVerifier
from ..errors import (
    AppendConflict,
    LimitExceeded,
    OffsetExpired,
    PatchError,
    PayloadTooLarge,
    ProtocolError,
    SequenceError,
    StoreError,
    StoreUnavailable,
)
from ..store.contract import Entry, EventInput, Expected, ThreadStore, encode_event_data
from ..wire.offsets import START, Offset, offset_key
from ..wire.protocol import check_event_ids

__all__ = [
    "DEFAULT_MAX_STATE_CACHE_BYTES",
    "DEFAULT_MAX_THREADS",
    "SequenceCheck",
    "ThreadWriter",
]

_MAX_ATTEMPTS = 20
"""Catch-ups one publish may do before giving up (others keep appending)."""

log = logging.getLogger("agui_hub.hub")

_REFUSED = (SequenceError, PatchError, LimitExceeded)
"""What judging a batch may answer; the rules may hold after what others stored."""


class SequenceCheck(enum.StrEnum):
    """How strictly a writer applies the AG-UI sequence rules."""

    STRICT = "strict"
    """Reject an event that may not come next (the default)."""
    OFF = "off"
    """Check each event on its own (shape, fields, size) but not its order, nor
    whether state deltas apply: for producers that replay or repair threads and
    know what they are doing. The writer keeps nothing of the threads then."""


@dataclass(slots=True)
class _Seen:
    """What a writer knows of one thread: its sequence and its state documents."""

    verifier: SequenceVerifier
    after: Offset
    """Everything up to here is folded into :attr:`verifier` and :attr:`docs`."""
    epoch: str | None
    docs: StateDocuments
    window: set[str] | None = None
    """For a trimmed thread: the ids its kept events mention (``None``: not trimmed)."""
    cached: int = 0
    """Bytes of :attr:`docs` counted in the writer's total (while it is cached)."""
    chunks: ChunkExpander = field(default_factory=ChunkExpander)
    """The chunk streams open in the thread, to check the next chunks against."""


@dataclass(slots=True, eq=False)
class _Pending:
    """One publish in its thread's queue: waiting, or being stored with a group."""

    wires: list[dict[str, Any]]
    ids: list[str]
    inputs: list[EventInput]
    retry: bool
    size: int
    """Bytes of its encoded events (a group is bounded by them too)."""
    work: WorkBudget
    """What judging its state events may cost (``StateLimits.max_work``)."""
    turn: asyncio.Future[None] | None = None
    """What it waits on (``None`` for one that led at once): resolved when it is
    settled, or when it is to lead the next group. Cancelled: its caller is gone."""
    settled: bool = False
    offsets: list[Offset] | None = None
    error: BaseException | None = None
    trace: TracebackType | None = None

    @property
    def gone(self) -> bool:
        return self.turn is not None and self.turn.cancelled()

    def settle(
        self, offsets: list[Offset] | None = None, error: BaseException | None = None
    ) -> None:
        if self.settled:
            return
        self.settled, self.offsets, self.error = True, offsets, error
        if error is not None:
            self.trace = error.__traceback__
        if self.turn is not None and not self.turn.done():
            self.turn.set_result(None)

    def outcome(self) -> list[Offset]:
        if self.error is not None:
            # As a future does: one error may be the answer of a whole group.
            raise self.error.with_traceback(self.trace)
        assert self.offsets is not None
        return self.offsets


@dataclass(slots=True)
class _Gate:
    """The publishes to one thread, in arrival order; dropped when none is left.

    Whoever leads stores the publishes at the head of the queue as one group
    (one append); then the next one in the queue leads the publishes that
    arrived meanwhile. So a producer that does not wait for each reply (a
    pipelining connection, several connections on one thread) costs one
    round trip per group instead of one per publish.
    """

    queue: deque[_Pending] = field(default_factory=deque)
    leader: _Pending | None = None
    """The one storing a group now, or told to store the next one (``None``:
    nobody, and the queue is empty)."""


GROUP_EVENTS = 1000
"""Most events one group commit appends (a single publish may have more)."""

GROUP_BYTES = 4 * 1024 * 1024
"""Most bytes of encoded events one group commit appends (a single publish may have more)."""


DEFAULT_MAX_EVENT_BYTES = 1024 * 1024
"""Largest event a writer stores by default (its msgpack encoding)."""

RUN_EVENTS_WITH_THREAD = frozenset({"RUN_STARTED", "RUN_FINISHED"})
"""Events whose ``threadId`` must name the thread they are published into."""

DEFAULT_MAX_THREADS = 10_000
"""Threads whose sequence state a writer keeps by default (the least recently
published to are dropped first, and read again from the store when needed)."""

DEFAULT_MAX_STATE_CACHE_BYTES = 256 * 1024 * 1024
"""Bytes of memory of state documents a writer keeps by default, over all its threads."""


class ThreadWriter:
    """Validates, verifies and appends events to the threads of one store.

    *limits* bound each thread's state document and activity contents (as a
    gateway's :class:`~agui_hub.agui.reducer.ThreadState` does: give both the same
    limits). Its memory is bounded: what it knows of at most *max_threads*
    threads, those published to most recently, and at most about
    *max_state_cache_bytes* of their state documents and activity contents
    (what they take in memory, counted as
    :attr:`~agui_hub.agui.documents.StateDocuments.memory` does; least
    recently published threads are dropped first, the one being published to
    is always kept). A dropped thread is
    read again from the store when it is next published to.
    """

    def __init__(
        self,
        store: ThreadStore,
        *,
        sequence: SequenceCheck = SequenceCheck.STRICT,
        max_threads: int = DEFAULT_MAX_THREADS,
        limits: StateLimits = DEFAULT_LIMITS,
        max_state_cache_bytes: int = DEFAULT_MAX_STATE_CACHE_BYTES,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        strict_patches: bool = False,
    ):
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        if max_state_cache_bytes < 0:
            raise ValueError("max_state_cache_bytes must not be negative")
        self.store = store
        self.sequence = SequenceCheck(sequence)
        self.max_threads = max_threads
        self.limits = limits
        self.max_state_cache_bytes = max_state_cache_bytes
        self.max_event_bytes = max_event_bytes
        self.strict_patches = strict_patches
        """Refuse deltas that do not apply (:class:`PatchError`) instead of storing them."""
        self.patches_not_applied = 0
        """Deltas stored that did not apply (without ``strict_patches``), since the start."""
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._state_bytes = 0
        """Sum of ``cached`` over ``_seen``."""
        self._gates: dict[str, _Gate] = {}

    async def publish(
        self,
        thread: str,
        events: Sequence[Any],
        event_ids: Sequence[str] | None = None,
        *,
        work: WorkBudget | None = None,
        values_checked: bool = False,
    ) -> list[Offset]:
        """Validate, check the sequence, store: all or nothing. Returns one offset per event.

        *events* are wire dicts or event models (ours or the official
        ``ag_ui.core`` ones). *event_ids* (one per event, all different) make
        the call idempotent: a retry with the same ids stores nothing twice
        and gets the same offsets. Raises, with nothing stored and ``index``
        set to the position of the event at fault:
        :class:`~agui_hub.errors.InvalidEvent` (also for a value the store
        cannot encode, e.g. an integer beyond 64 bits),
        :class:`~agui_hub.errors.SequenceError` (also ``thread_mismatch``: a
        RUN_STARTED or RUN_FINISHED whose ``threadId`` is another thread),
        :class:`~agui_hub.errors.PayloadTooLarge` (an event over
        *max_event_bytes*),
        :class:`~agui_hub.errors.PatchError` (a STATE_DELTA or ACTIVITY_DELTA
        that does not apply, with ``strict_patches`` only: otherwise it is
        stored, logged and counted, and changes nothing) or
        :class:`~agui_hub.errors.LimitExceeded` (the
        state would exceed :attr:`limits`, or the publish's deltas would cost
        more work than ``limits.max_work``: ``limit="max_work"``); or a
        :class:`~agui_hub.errors.StoreError` (after
        :class:`~agui_hub.errors.StoreUnavailable`, retry with the same ids).

        Calls about one thread are judged and stored in the order they were
        made: the call takes its place before it first awaits. Calls that
        wait for an append under way are stored together in the next one;
        the outcome is each call's own, as if they came one by one. A store
        failure fails the calls stored together with it and those waiting
        behind them (judged without them, these would be refused for what
        they continue), so that their callers retry them in order. A
        cancelled call that was still waiting stores nothing; the others go
        on.

        *work* is the publish's budget (a new one of ``limits.max_work`` by
        default); pass one to read afterwards what the publish cost
        (:attr:`~agui_hub.agui.patch.WorkBudget.spent`, judged again after
        what others stored included), as a connection's work rate does. The
        judgement lets other tasks run every :data:`YIELD_WORK` units.

        *values_checked*: the events' values passed
        :func:`~agui_hub.agui.events.check_json_value` already (a gateway's
        msgpack frame), and are not walked again.
        """
        if work is None:
            work = WorkBudget(self.limits.max_work)
        wires = validate_batch(events, values_checked=values_checked)
        total = 0
        for n, wire in enumerate(wires):
            try:
                size = len(encode_event_data(wire))
                total += size
                if size > self.max_event_bytes:
                    raise PayloadTooLarge(size, self.max_event_bytes)
                if wire["type"] in RUN_EVENTS_WITH_THREAD and wire.get("threadId") != thread:
                    # Viewers take threadId at its word: a run announced in
                    # another thread's name would be misfiled by every one.
                    raise SequenceError(
                        "thread_mismatch",
                        f"{wire['type']} has threadId {wire.get('threadId')!r} but is published "
                        f"into thread {thread!r}: they must be the same",
                        event=wire,
                        thread=thread,
                    )
            except ProtocolError as exc:
                exc.index = n
                raise
        ids = check_event_ids(event_ids, len(wires))
        if ids is None:
            ids = [uuid.uuid4().hex for _ in wires]
        inputs = [EventInput.of(w, i) for w, i in zip(wires, ids, strict=True)]
        if self.sequence is SequenceCheck.OFF:
            return await self.store.append(thread, inputs)
        # Queued before the first await: calls made in this order are judged
        # and stored in this order (the gateway relies on it to pipeline).
        pending = _Pending(wires, ids, inputs, event_ids is not None, total, work)
        gate = self._gates.get(thread)
        if gate is None:
            gate = self._gates[thread] = _Gate()
        gate.queue.append(pending)
        if gate.leader is None:
            gate.leader = pending
        else:
            pending.turn = asyncio.get_running_loop().create_future()
            try:
                await pending.turn
            except asyncio.CancelledError:
                if gate.leader is pending:  # told to lead, and gone before it could
                    with contextlib.suppress(ValueError):
                        gate.queue.remove(pending)
                    self._hand_over(thread, gate)
                raise
            if pending.settled:
                return pending.outcome()
        await self._lead(thread, gate, pending)
        return pending.outcome()

    async def _lead(self, thread: str, gate: _Gate, me: _Pending) -> None:
        """Store the group at the head of *gate*'s queue (*me* first), then hand over.

        Every member of the group is settled, unless the leader is cancelled
        meanwhile (its caller went away): then the members not settled go
        back to the head of the queue for the next leader, and only the
        leader's own publish is given up.
        """
        group: list[_Pending] = []
        try:
            events = size = 0
            queue = gate.queue
            while queue:
                head = queue[0]
                if head.gone:  # cancelled while it waited: as if never sent
                    queue.popleft()
                    continue
                if group and (
                    events + len(head.wires) > GROUP_EVENTS or size + head.size > GROUP_BYTES
                ):
                    break
                group.append(queue.popleft())
                events += len(head.wires)
                size += head.size
            assert group[0] is me  # the leader heads the queue it leads
            failure = await self._commit(thread, group)
            if failure is not None:
                # Judged without the group, what waits behind it would be
                # refused for what it continues: it goes back to its callers
                # too, who send it again after the group, in order.
                while queue:
                    queue.popleft().settle(error=failure)
        finally:
            left = [p for p in group if not p.settled and not p.gone and p is not me]
            gate.queue.extendleft(reversed(left))
            self._hand_over(thread, gate)

    def _hand_over(self, thread: str, gate: _Gate) -> None:
        """Make the first caller still waiting in *gate* the leader, or drop the gate."""
        queue = gate.queue
        while queue and queue[0].gone:
            queue.popleft()
        if not queue:
            gate.leader = None
            if self._gates.get(thread) is gate:
                del self._gates[thread]
            return
        gate.leader = queue[0]
        turn = queue[0].turn
        if turn is not None and not turn.done():
            turn.set_result(None)

    async def _commit(self, thread: str, group: list[_Pending]) -> StoreError | None:
        """Store *group*, settling each member as if they were published one by one.

        Together in one append while the rules accept them. When they refuse
        an event, the members before its publish (which passed) are stored
        together, the refused publish on its own (so that it gets its own
        error with its own ``index``) and the rest as a new group, judged as
        if the refused one had never been sent. One by one when an event id
        recurs across members (a retry queued behind its first try). A store
        failure settles every member not settled yet with it, and is
        returned: their callers retry, in order, with the same ids.
        """
        try:
            rest = group
            while rest:
                rest = [p for p in rest if not p.settled and not p.gone]
                if len(rest) < 2 or not _distinct(rest):
                    await self._one_by_one(thread, rest)
                    return None
                try:
                    await self._together(thread, rest)
                    return None
                except ProtocolError as exc:
                    at = _member_at(rest, exc.index)
                if at is None:  # not one event's fault (e.g. the thread quota)
                    await self._one_by_one(thread, rest)
                    return None
                if at > 0:
                    try:
                        await self._together(thread, rest[:at])  # they passed just now
                    except ProtocolError:
                        await self._one_by_one(thread, rest[:at])
                await self._one_by_one(thread, [rest[at]])
                rest = rest[at + 1 :]
        except StoreError as exc:
            for p in group:
                p.settle(error=exc)
            return exc
        except Exception as exc:  # a bug: nobody may wait for ever
            for p in group:
                p.settle(error=exc)
        return None

    async def _together(self, thread: str, members: list[_Pending]) -> None:
        """Store *members* in one append and settle them, or raise what it raised."""
        wires = [w for p in members for w in p.wires]
        ids = [i for p in members for i in p.ids]
        inputs = [e for p in members for e in p.inputs]
        retry = any(p.retry for p in members)
        budgets = [p.work for p in members for _ in p.wires]
        offsets = await self._publish(thread, wires, ids, inputs, retry, budgets)
        start = 0
        for p in members:
            p.settle(offsets[start : start + len(p.wires)])
            start += len(p.wires)

    async def _one_by_one(self, thread: str, members: list[_Pending]) -> None:
        """Store each of *members* on its own, settling each with its own outcome.

        Raises a store failure (for the caller to settle the rest with it).
        """
        for p in members:
            if p.gone:
                continue  # not stored yet, and its caller is gone
            try:
                budgets = [p.work] * len(p.wires)
                offsets = await self._publish(thread, p.wires, p.ids, p.inputs, p.retry, budgets)
            except StoreError:
                raise  # this one's and the rest's: stored in order or not at all
            except Exception as exc:  # its verdict (or a bug), to its caller alone
                p.settle(error=exc)
            else:
                p.settle(offsets)

    async def _publish(
        self,
        thread: str,
        wires: list[dict[str, Any]],
        ids: list[str],
        inputs: list[EventInput],
        retry: bool,
        budgets: list[WorkBudget],
    ) -> list[Offset]:
        # Judged against what this writer knows, appended on condition that
        # nobody appended since: one round trip when it holds (the common
        # case, one producer per thread); otherwise catch up and judge again.
        seen = self._seen.get(thread)
        fresh = seen is None
        if seen is None:
            seen = await self._caught_up(thread)
        else:
            self._seen.move_to_end(thread)
        for _attempt in range(_MAX_ATTEMPTS):
            unapplied: list[tuple[int, str]] | None = None if self.strict_patches else []
            try:
                judged = await self._judge(thread, seen, wires, ids, retry, budgets, unapplied)
            except _REFUSED:
                if fresh:
                    raise
                # The rules may hold after what others stored meanwhile.
                seen, fresh = await self._caught_up(thread), True
                continue
            if isinstance(judged, list):
                return judged  # every event was stored already
            # seen.docs holds the batch's effect now, to commit or roll back.
            trial, window, first, chunks = judged
            try:
                offsets = await self.store.append(
                    thread, inputs, expect=Expected(seen.epoch, seen.after)
                )
            except AppendConflict:
                seen.docs.rollback()
                # What others stored may include these very events (an
                # append of ours that failed on the way back): look for
                # their ids too if the rules refuse them now.
                seen, fresh, retry = await self._caught_up(thread), True, True
                continue
            except BaseException:
                seen.docs.rollback()  # stored or not: the next append conflicts if it was
                raise
            after = offset_key(seen.after)
            stored = [n for n, offset in enumerate(offsets) if offset_key(offset) > after]
            if len(stored) < len(offsets):
                # Some ids were stored already (events published again that
                # passed the rules): the verifier gets what the stream got.
                seen.docs.rollback()
                for n in stored:
                    _fold(seen, wires[n])
            else:
                seen.docs.commit()
                seen.chunks = chunks
                if trial is None:  # one event, checked without a copy: apply it now
                    seen.verifier.verify(first)
                else:
                    seen.verifier, seen.window = trial, window
            if stored:  # appended now, in order: the newest is the last
                seen.after = offsets[stored[-1]]
            if unapplied:
                self.patches_not_applied += _log_not_applied(thread, unapplied, offsets, after)
            if seen.epoch is None:
                # This append created the thread: the next publish reads its
                # epoch with the stream (the thread may be re-created by then).
                self._drop(thread, seen)
            else:
                self._account(thread, seen)
            return offsets
        raise StoreUnavailable(
            f"thread {thread!r} kept changing under {_MAX_ATTEMPTS} attempts to append; "
            "retry with the same event ids"
        )

    async def _judge(
        self,
        thread: str,
        seen: _Seen,
        wires: list[dict[str, Any]],
        ids: list[str],
        retry: bool,
        budgets: list[WorkBudget],
        unapplied: list[tuple[int, str]] | None,
    ) -> (
        list[Offset]
        | tuple[SequenceVerifier | None, set[str] | None, dict[str, Any], ChunkExpander]
    ):
        """Judge *wires* after *seen*: what :func:`_try` returns plus the first
        event judged, or the offsets of a batch that is stored already
        (*unapplied* as for :func:`_try`).

        Raises :class:`SequenceError`, :class:`PatchError` or
        :class:`LimitExceeded`. When it returns a judgement, ``seen.docs``
        holds the batch's effect, to commit once stored or roll back.
        """
        try:
            trial, window, chunks = await _try(seen, wires, range(len(wires)), budgets, unapplied)
            return trial, window, wires[0], chunks
        except _REFUSED:
            # Perhaps a retry of events that are stored already (a catch-up
            # folded them in): those are answered with their offsets, and only
            # the others are judged. Asked only now, to spare a round trip on
            # every publish; a retry that passes the rules again is harmless,
            # as the append stores an id only once.
            known = await self.store.stored_ids(thread, ids) if retry else {}
            if not known:
                raise
        positions = [n for n, i in enumerate(ids) if i not in known]
        if not positions:
            return [known[i] for i in ids]
        judged = [wires[n] for n in positions]
        if unapplied:
            unapplied.clear()  # judged again: what the first judgement found goes
        trial, window, chunks = await _try(
            seen, judged, positions, [budgets[n] for n in positions], unapplied
        )
        return trial, window, judged[0], chunks

    def forget(self, thread: str) -> None:
        """Drop what the writer knows of *thread* (it is rebuilt from the store)."""
        seen = self._seen.get(thread)
        if seen is not None:
            self._drop(thread, seen)

    def _new_seen(self, thread: str, after: Offset, epoch: str | None) -> _Seen:
        return _Seen(SequenceVerifier(thread=thread), after, epoch, StateDocuments(self.limits))

    async def _caught_up(self, thread: str) -> _Seen:
        """What the writer knows of the thread, caught up with what others stored meanwhile."""
        seen = self._seen.get(thread)
        epoch = await self.store.epoch(thread)
        if seen is None or seen.epoch != epoch:
            seen = self._new_seen(thread, START, epoch)
        try:
            entries = await self.store.read(thread, after=seen.after)
        except OffsetExpired:
            seen = await self._rebuilt(thread, epoch)
            self._remember(thread, seen)
            return seen
        for entry in entries:
            with contextlib.suppress(ValueError, msgpack.UnpackException):
                _fold(seen, msgpack.unpackb(entry.data, raw=False))
        if entries:
            seen.after = entries[-1].offset
        self._remember(thread, seen)
        return seen

    def _remember(self, thread: str, seen: _Seen) -> None:
        old = self._seen.get(thread)
        if old is not None and old is not seen:
            self._drop(thread, old)
        self._seen[thread] = seen
        self._seen.move_to_end(thread)
        self._account(thread, seen)

    def _account(self, thread: str, seen: _Seen) -> None:
        """Count *seen*'s state documents anew, and drop threads while over the bounds."""
        if self._seen.get(thread) is seen:
            size = seen.docs.memory
            self._state_bytes += size - seen.cached
            seen.cached = size
        while len(self._seen) > self.max_threads or (
            self._state_bytes > self.max_state_cache_bytes and len(self._seen) > 1
        ):
            oldest = next((t for t in self._seen if t != thread), None)
            if oldest is None:  # the thread at work stays
                return
            self._drop(oldest, self._seen[oldest])

    def _drop(self, thread: str, seen: _Seen) -> None:
        if self._seen.get(thread) is seen:
            del self._seen[thread]
            self._state_bytes -= seen.cached
            seen.cached = 0

    async def _available(
        self, thread: str, after: Offset
    ) -> tuple[str | None, Offset | None, list[Entry]]:
        """(epoch, trim mark, entries after max(*after*, trim mark)), taken together.

        With the store's ``read_available`` in one call. Without it, the trim
        mark and the entries are read one after the other, and read again
        when trimming overtook the reading in between.
        """
        read_available = getattr(self.store, "read_available", None)
        if read_available is not None:
            page = await read_available(thread, after=after)
            return page.epoch, page.trimmed, list(page.entries)
        for _attempt in range(_MAX_ATTEMPTS):
            info = await self.store.info(thread)
            if info is None:
                return None, None, []
            start = after
            if info.trimmed is not None and offset_key(info.trimmed) > offset_key(after):
                start = info.trimmed
            try:
                entries = await self.store.read(thread, after=start)
            except OffsetExpired:
                continue  # trimmed meanwhile
            return info.epoch, info.trimmed, entries
        raise StoreUnavailable(
            f"thread {thread!r} was trimmed faster than it could be read "
            f"({_MAX_ATTEMPTS} attempts); retry with the same event ids"
        )

    async def _rebuilt(self, thread: str, epoch: str | None) -> _Seen:
        """What the writer knows of a thread whose beginning was trimmed.

        From a checkpoint of the thread's folded state when one reaches the
        stored events (a gateway writes them for the threads it serves): then
        it is exact. Otherwise from the stored events alone, assuming that
        whatever they continue was opened in the trimmed part (and that the
        state document is unknown until a STATE_SNAPSHOT). The trim mark and
        the events are read together, so that a producer trimming the thread
        meanwhile cannot make the read fail.
        """
        checkpoint = await self.store.get_checkpoint(thread)
        if checkpoint is not None and (checkpoint.epoch != epoch or not checkpoint.complete):
            checkpoint = None
        after = checkpoint.offset if checkpoint is not None else START
        epoch, trimmed, entries = await self._available(thread, after)
        gap = trimmed is not None and offset_key(trimmed) > offset_key(after)
        if checkpoint is not None and not gap and checkpoint.epoch == epoch:
            seen = self._new_seen(thread, checkpoint.offset, epoch)
            try:
                for event in msgpack.unpackb(checkpoint.events, raw=False):
                    seen.chunks.expand(event)  # a checkpoint reopens chunk streams
                    seen.verifier.verify(event)
                    seen.docs.fold(event)
            except (ProtocolError, ValueError, TypeError, msgpack.UnpackException):
                pass  # an unreadable checkpoint: do without it
            else:
                for entry in entries:
                    with contextlib.suppress(ValueError, msgpack.UnpackException):
                        _fold(seen, msgpack.unpackb(entry.data, raw=False))
                if entries:
                    seen.after = entries[-1].offset
                return seen
        if checkpoint is not None and not gap:
            # What was read continues a checkpoint that cannot be used (unreadable,
            # or of an epoch gone meanwhile): read what is kept from its start.
            epoch, trimmed, entries = await self._available(thread, START)
        seen = self._new_seen(thread, START, epoch)
        if trimmed is None:  # nothing trimmed (any more): the history is whole
            for entry in entries:
                with contextlib.suppress(ValueError, msgpack.UnpackException):
                    _fold(seen, msgpack.unpackb(entry.data, raw=False))
        else:
            seen.docs.known = False
            seen.verifier, seen.window = _lenient(seen.verifier, seen.docs, entries)
        seen.after = entries[-1].offset if entries else trimmed or START
        return seen


_ID_KEYS = ("messageId", "toolCallId", "stepName", "subagentRunId")


def _member_at(members: list[_Pending], index: int | None) -> int | None:
    """Which of *members* holds event *index* of their concatenated events."""
    if index is None or index < 0:
        return None
    for n, p in enumerate(members):
        if index < len(p.wires):
            return n
        index -= len(p.wires)
    return None


def _distinct(group: list[_Pending]) -> bool:
    """Whether no event id occurs in two members of *group* (each one's are distinct)."""
    seen: set[str] = set()
    for p in group:
        if not seen.isdisjoint(p.ids):
            return False
        seen.update(p.ids)
    return True


async def _try(
    seen: _Seen,
    wires: list[dict[str, Any]],
    positions: Sequence[int],
    budgets: list[WorkBudget],
    unapplied: list[tuple[int, str]] | None,
) -> tuple[SequenceVerifier | None, set[str] | None, ChunkExpander]:
    """Judge *wires* (at *positions* of the published batch) after what *seen*
    knows, changing nothing of its sequence state. Each event's state work is
    charged to its publish's budget in *budgets* (one per wire), each
    restarted first: a judgement starts afresh. A delta that does not apply
    changes nothing and is noted in *unapplied* as ``(position, why)``, or
    raises :class:`PatchError` when *unapplied* is ``None`` (strict).

    Returns the verifier and window to keep once they are stored, or
    ``(None, None)`` for a single event that was only checked (apply it to
    ``seen.verifier`` after the append), and the chunk streams to keep.
    ``seen.docs`` holds the effect of the events, to commit or roll back.
    Raises :class:`ChunkError` (a chunk the official client's chunk transform
    refuses: a first chunk without an id, a role that changes),
    :class:`SequenceError`, :class:`PatchError` or :class:`LimitExceeded` with
    the offending event's position as its ``index``, and ``seen.docs`` unchanged.

    Every :data:`YIELD_WORK` units it lets other tasks run, between two
    events. Nothing else judges this thread meanwhile (its publishes wait in
    its gate for the leader, who is here): ``seen`` holds the half-judged
    batch (``seen.docs`` in a transaction, the sequence in ``trial``) until
    it is committed or rolled back, as it does across the append.
    """
    for budget in {id(b): b for b in budgets}.values():
        budget.restart()
    docs = seen.docs
    # In a trimmed thread a chunk may continue a stream opened in the trimmed
    # part: its chunks get the benefit of the doubt, as its other events do.
    chunks = seen.chunks.copy()
    check_chunks = seen.window is None
    docs.begin()
    try:
        if len(wires) == 1 and seen.window is None:
            try:
                chunks.expand(wires[0])
                seen.verifier.check(wires[0])  # no copy needed: check() changes nothing
                _apply(docs, wires[0], budgets[0], positions[0], unapplied)
            except ProtocolError as exc:
                exc.index = positions[0]
                raise
            return None, None, chunks
        trial = seen.verifier.copy()
        window = None if seen.window is None else set(seen.window)
        since_yield = 0
        for wire, position, budget in zip(wires, positions, budgets, strict=True):
            try:
                if check_chunks:
                    chunks.expand(wire)
                _verify(trial, wire, window)
                before = budget.spent
                _apply(docs, wire, budget, position, unapplied)
            except ProtocolError as exc:
                exc.index = position
                raise
            since_yield += budget.spent - before
            if since_yield >= YIELD_WORK:
                since_yield = 0
                await asyncio.sleep(0)
        return trial, window, chunks
    except BaseException:
        docs.rollback()
        raise


def _log_not_applied(
    thread: str, unapplied: list[tuple[int, str]], offsets: list[Offset], after: tuple[int, int]
) -> int:
    """Log the deltas just stored (after *after*) that did not apply; how many."""
    count = 0
    for position, why in unapplied:
        offset = offsets[position]
        if offset_key(offset) <= after:
            continue  # stored before, by an earlier try of the same publish
        count += 1
        log.warning(
            "thread %r offset %s: %s; stored, and the state stays as it was, as the "
            "official client takes it (the gateway's --strict-patches refuses it)",
            thread,
            offset,
            why,
        )
    return count


def _apply(
    docs: StateDocuments,
    wire: dict[str, Any],
    budget: WorkBudget,
    position: int,
    unapplied: list[tuple[int, str]] | None,
) -> None:
    """Fold *wire* into *docs*; a patch that does not apply is noted in
    *unapplied* (the documents unchanged), or raised when it is ``None``."""
    try:
        docs.apply(wire, budget)
    except PatchError as exc:
        if unapplied is None:
            raise
        unapplied.append((position, f"{wire.get('type')}: {exc}"))


_CONTINUATIONS = {
    "message_not_open": "messageId",
    "tool_call_not_open": "toolCallId",
    "reasoning_not_open": "messageId",
    "reasoning_span_not_open": "messageId",
    "step_not_active": "stepName",
}
"""Rules an event breaks when what it continues was opened in a trimmed part,
with the field that names what it continues."""


def _verify(verifier: SequenceVerifier, event: dict[str, Any], window: set[str] | None) -> None:
    """Verify *event*; in a trimmed thread, give the benefit of the doubt where due.

    An event that continues an entity the kept events never mention may
    continue one opened in the trimmed part: it is accepted as if the stand-in
    of its opener came first, so that what follows is judged by the usual
    rules (an end closes it; content after the end is refused). On a
    :class:`SequenceError`, *verifier* may hold the stand-in: judge on a copy.
    """
    try:
        verifier.verify(event)
    except SequenceError as exc:
        key = _CONTINUATIONS.get(exc.rule)
        if window is None or key is None or event.get(key) in window:
            raise
        opener = _opener(exc.rule, event)
        assert opener is not None  # every rule in _CONTINUATIONS has one
        try:
            verifier.verify(opener)
            verifier.verify(event)
        except SequenceError:
            raise exc from None
    if window is not None:
        window.update(_mentions(event))


def _fold(seen: _Seen, event: Any) -> None:
    """Apply an event that is stored already to *seen*, whatever the rules say of it
    (state events that do not apply are skipped, as a gateway's fold skips them)."""
    with contextlib.suppress(ProtocolError, ValueError, TypeError):
        seen.chunks.expand(event)
    with contextlib.suppress(ProtocolError, ValueError, TypeError):
        _verify(seen.verifier, event, seen.window)
    seen.docs.fold(event)


def _mentions(event: dict[str, Any]) -> set[str]:
    return {value for key in _ID_KEYS if isinstance(value := event.get(key), str)}


def _opener(rule: str, event: dict[str, Any]) -> dict[str, Any] | None:
    """The event that would have opened what *event* continues (for trimmed streams)."""
    sub = {"subagentRunId": event["subagentRunId"]} if "subagentRunId" in event else {}
    if rule in ("run_not_started", "run_already_finished", "run_already_errored"):
        return {"type": "RUN_STARTED", "threadId": "", "runId": ""}
    if rule == "message_not_open":
        return {"type": "TEXT_MESSAGE_START", "messageId": event.get("messageId", ""), **sub}
    if rule == "tool_call_not_open":
        return {
            "type": "TOOL_CALL_START",
            "toolCallId": event.get("toolCallId", ""),
            "toolCallName": "",
            **sub,
        }
    if rule == "reasoning_not_open":
        return {"type": "REASONING_MESSAGE_START", "messageId": event.get("messageId", ""), **sub}
    if rule == "reasoning_span_not_open":
        return {"type": "REASONING_START", "messageId": event.get("messageId", ""), **sub}
    if rule == "step_not_active":
        return {"type": "STEP_STARTED", "stepName": event.get("stepName", ""), **sub}
    if rule == "subagent_not_active":
        return {"type": "SUBAGENT_STARTED", "subagentRunId": event.get("subagentRunId", ""),
                "name": ""}  # fmt: skip
    return None


def _lenient(
    verifier: SequenceVerifier, docs: StateDocuments, entries: Sequence[Entry]
) -> tuple[SequenceVerifier, set[str]]:
    """Replay a stream whose beginning was trimmed: assume what it no longer shows.

    An event that continues something opened before the trimmed part (a run,
    a message, a tool call, a step, a subagent) is preceded by a stand-in for
    its opener, so that what follows is judged by the usual rules. Also
    returns the ids the kept events mention: an entity they never mention may
    still be open from the trimmed part, and gets the same benefit of the
    doubt when it next shows up.
    """
    window: set[str] = set()
    for entry in entries:
        try:
            event = msgpack.unpackb(entry.data, raw=False)
        except (ValueError, msgpack.UnpackException):
            continue
        if isinstance(event, dict):
            window.update(_mentions(event))
        docs.fold(event)
        for _ in range(3):  # a content event may need a run and a message
            try:
                verifier.verify(event)
                break
            except SequenceError as exc:
                opener = _opener(exc.rule, event)
                if opener is None:
                    break
                with contextlib.suppress(ProtocolError):
                    verifier.verify(opener)
            except ProtocolError:
                break
    return verifier, window
