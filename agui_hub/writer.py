"""Checked writes into thread streams: validate, verify the sequence, append.

:class:`ThreadWriter` is what stands between a producer and a
:class:`~agui_hub.store.ThreadStore`: the gateway's publish command and the
Python :class:`~agui_hub.publisher.Publisher` both write through it, so an
event reaches a stream only when it is a valid AG-UI 1.0 event that may come
next in its thread. A batch is stored whole or not at all, and a batch
retried with the same event ids is answered with the offsets already stored.

The writer keeps one :class:`~agui_hub.sequence.SequenceVerifier` per thread,
judges new events against it and appends them on condition that nothing was
stored after what it has seen (:class:`~agui_hub.store.Expected`): one round
trip when it is the thread's only producer. When another writer (another
process, a plain XADD producer) stored events meanwhile, the append fails
with nothing stored; the writer reads those events, judges again and
retries. So the sequence rules hold across writers too. The one leniency: in
a thread whose beginning was trimmed away, an event that continues something
the kept events never mention may continue what the trimmed part opened, and
is accepted as if it did (once; what follows is judged as usual).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .errors import AppendConflict, OffsetExpired, ProtocolError, SequenceError, StoreUnavailable
from .events import validate_batch
from .offsets import START, Offset, offset_key
from .protocol import check_event_ids
from .sequence import SequenceVerifier
from .store import Entry, EventInput, Expected, ThreadStore

__all__ = ["SequenceCheck", "ThreadWriter"]

_MAX_ATTEMPTS = 20
"""Catch-ups one publish may do before giving up (others keep appending)."""


class SequenceCheck(enum.StrEnum):
    """How strictly a writer applies the AG-UI sequence rules."""

    STRICT = "strict"
    """Reject an event that may not come next (the default)."""
    OFF = "off"
    """Check each event on its own (shape, fields, size) but not its order: for
    producers that replay or repair threads and know what they are doing."""


@dataclass(slots=True)
class _Seen:
    """What a writer knows of one thread's sequence."""

    verifier: SequenceVerifier
    after: Offset
    """Everything up to here is folded into :attr:`verifier`."""
    epoch: str | None
    window: set[str] | None = None
    """For a trimmed thread: the ids its kept events mention (``None``: not trimmed)."""


@dataclass(slots=True)
class _Gate:
    """Serialises the publishes to one thread; dropped when nobody waits."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


DEFAULT_MAX_THREADS = 10_000
"""Threads whose sequence state a writer keeps by default (the least recently
published to are dropped first, and read again from the store when needed)."""


class ThreadWriter:
    """Validates, verifies and appends events to the threads of one store.

    Its memory is bounded: the sequence state of at most *max_threads*
    threads, those published to most recently.
    """

    def __init__(
        self,
        store: ThreadStore,
        *,
        sequence: SequenceCheck = SequenceCheck.STRICT,
        max_threads: int = DEFAULT_MAX_THREADS,
    ):
        if max_threads < 1:
            raise ValueError("max_threads must be at least 1")
        self.store = store
        self.sequence = SequenceCheck(sequence)
        self.max_threads = max_threads
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._gates: dict[str, _Gate] = {}

    async def publish(
        self, thread: str, events: Sequence[Any], event_ids: Sequence[str] | None = None
    ) -> list[Offset]:
        """Validate, check the sequence, store: all or nothing. Returns one offset per event.

        *events* are wire dicts or event models (ours or the official
        ``ag_ui.core`` ones). *event_ids* (one per event, all different) make
        the call idempotent: a retry with the same ids stores nothing twice
        and gets the same offsets. Raises :class:`~agui_hub.errors.InvalidEvent`
        or :class:`~agui_hub.errors.SequenceError` with nothing stored, or a
        :class:`~agui_hub.errors.StoreError` (after
        :class:`~agui_hub.errors.StoreUnavailable`, retry with the same ids).
        """
        wires = validate_batch(events)
        ids = check_event_ids(event_ids, len(wires))
        if ids is None:
            ids = [uuid.uuid4().hex for _ in wires]
        inputs = [EventInput.of(w, i) for w, i in zip(wires, ids, strict=True)]
        if self.sequence is SequenceCheck.OFF:
            return await self.store.append(thread, inputs)
        gate = self._gates.get(thread)
        if gate is None:
            gate = self._gates[thread] = _Gate()
        gate.users += 1
        try:
            async with gate.lock:
                return await self._publish(thread, wires, ids, inputs, event_ids is not None)
        finally:
            gate.users -= 1
            if gate.users == 0:
                del self._gates[thread]

    async def _publish(
        self,
        thread: str,
        wires: list[dict[str, Any]],
        ids: list[str],
        inputs: list[EventInput],
        retry: bool,
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
            try:
                judged = await self._judge(thread, seen, wires, ids, retry)
            except SequenceError:
                if fresh:
                    raise
                # The rules may hold after what others stored meanwhile.
                seen, fresh = await self._caught_up(thread), True
                continue
            if isinstance(judged, list):
                return judged  # every event was stored already
            trial, window, first = judged
            try:
                offsets = await self.store.append(
                    thread, inputs, expect=Expected(seen.epoch, seen.after)
                )
            except AppendConflict:
                # What others stored may include these very events (an
                # append of ours that failed on the way back): look for
                # their ids too if the rules refuse them now.
                seen, fresh, retry = await self._caught_up(thread), True, True
                continue
            after = offset_key(seen.after)
            stored = [n for n, offset in enumerate(offsets) if offset_key(offset) > after]
            if len(stored) < len(offsets):
                # Some ids were stored already (events published again that
                # passed the rules): the verifier gets what the stream got.
                for n in stored:
                    _fold(seen, wires[n])
            elif trial is None:  # one event, checked without a copy: apply it now
                seen.verifier.verify(first)
            else:
                seen.verifier, seen.window = trial, window
            if stored:  # appended now, in order: the newest is the last
                seen.after = offsets[stored[-1]]
            if seen.epoch is None:
                # This append created the thread: the next publish reads its
                # epoch with the stream (the thread may be re-created by then).
                self._seen.pop(thread, None)
            return offsets
        raise StoreUnavailable(
            f"thread {thread!r} kept changing under {_MAX_ATTEMPTS} attempts to append; "
            "retry with the same event ids"
        )

    async def _judge(
        self, thread: str, seen: _Seen, wires: list[dict[str, Any]], ids: list[str], retry: bool
    ) -> list[Offset] | tuple[SequenceVerifier | None, set[str] | None, dict[str, Any]]:
        """Judge *wires* after *seen*: what :func:`_try` returns plus the first
        event judged, or the offsets of a batch that is stored already.

        Raises :class:`SequenceError`.
        """
        try:
            trial, window = _try(seen, wires, range(len(wires)))
            return trial, window, wires[0]
        except SequenceError:
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
        trial, window = _try(seen, judged, positions)
        return trial, window, judged[0]

    def forget(self, thread: str) -> None:
        """Drop the cached sequence state of *thread* (it is rebuilt from the store)."""
        self._seen.pop(thread, None)

    async def _caught_up(self, thread: str) -> _Seen:
        """The thread's sequence state, caught up with what others stored meanwhile."""
        seen = self._seen.get(thread)
        epoch = await self.store.epoch(thread)
        if seen is None or seen.epoch != epoch:
            seen = _Seen(SequenceVerifier(thread=thread), START, epoch)
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
        self._seen[thread] = seen
        self._seen.move_to_end(thread)
        while len(self._seen) > self.max_threads:
            self._seen.popitem(last=False)

    async def _rebuilt(self, thread: str, epoch: str | None) -> _Seen:
        """The sequence state of a thread whose beginning was trimmed.

        From a checkpoint of the thread's folded state when one reaches the
        stored events (a gateway writes them for the threads it serves): then
        the state is exact. Otherwise from the stored events alone, assuming
        that whatever they continue was opened in the trimmed part.
        """
        checkpoint = await self.store.get_checkpoint(thread)
        if checkpoint is not None and checkpoint.epoch == epoch and checkpoint.complete:
            try:
                entries = await self.store.read(thread, after=checkpoint.offset)
            except OffsetExpired:
                pass  # the checkpoint is older than what is kept
            else:
                verifier = SequenceVerifier(thread=thread)
                try:
                    for event in msgpack.unpackb(checkpoint.events, raw=False):
                        verifier.verify(event)
                except (ProtocolError, ValueError, TypeError, msgpack.UnpackException):
                    pass  # an unreadable checkpoint: do without it
                else:
                    for entry in entries:
                        with contextlib.suppress(
                            ProtocolError, ValueError, msgpack.UnpackException
                        ):
                            verifier.verify(msgpack.unpackb(entry.data, raw=False))
                    after = entries[-1].offset if entries else checkpoint.offset
                    return _Seen(verifier, after, epoch)
        info = await self.store.info(thread)
        entries = []
        if info is not None and info.trimmed is not None:
            entries = await self.store.read(thread, after=info.trimmed)
        verifier, window = _lenient(SequenceVerifier(thread=thread), entries)
        after = entries[-1].offset if entries else (info.trimmed if info else None) or START
        return _Seen(verifier, after, epoch, window=window)


_ID_KEYS = ("messageId", "toolCallId", "stepName", "subagentRunId")


def _try(
    seen: _Seen, wires: list[dict[str, Any]], positions: Sequence[int]
) -> tuple[SequenceVerifier | None, set[str] | None]:
    """Judge *wires* (at *positions* of the published batch) after what *seen*
    knows, changing nothing of it.

    Returns the verifier and window to keep once they are stored, or
    ``(None, None)`` for a single event that was only checked (apply it to
    ``seen.verifier`` after the append). Raises :class:`SequenceError` with
    the offending event's position as its ``index``.
    """
    if len(wires) == 1 and seen.window is None:
        try:
            seen.verifier.check(wires[0])  # no copy needed: check() changes nothing
        except SequenceError as exc:
            exc.index = positions[0]
            raise
        return None, None
    trial = seen.verifier.copy()
    window = None if seen.window is None else set(seen.window)
    for wire, position in zip(wires, positions, strict=True):
        try:
            _verify(trial, wire, window)
        except SequenceError as exc:
            exc.index = position
            raise
    return trial, window


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
    """Apply an event that is stored already to *seen*, whatever the rules say of it."""
    with contextlib.suppress(ProtocolError, ValueError, TypeError):
        _verify(seen.verifier, event, seen.window)


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
    verifier: SequenceVerifier, entries: Sequence[Entry]
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
