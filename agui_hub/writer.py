"""Checked writes into thread streams: validate, verify the sequence, append.

:class:`ThreadWriter` is what stands between a producer and a
:class:`~agui_hub.store.ThreadStore`: the gateway's publish command and the
Python :class:`~agui_hub.publisher.Publisher` both write through it, so an
event reaches a stream only when it is a valid AG-UI 1.0 event that may come
next in its thread. A batch is stored whole or not at all, and a batch
retried with the same event ids is answered with the offsets already stored.

The writer keeps one :class:`~agui_hub.sequence.SequenceVerifier` per thread
and catches it up with whatever other writers (other processes, plain XADD
producers) stored meanwhile before judging new events. Checks across writers
that publish into one thread at the same instant are best effort; the store
keeps one order either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import enum
import uuid
from collections.abc import Sequence
from typing import Any

import msgpack

from .errors import OffsetExpired, ProtocolError, SequenceError
from .events import validate_wire
from .offsets import START, Offset, offset_key
from .sequence import SequenceVerifier
from .store import Entry, EventInput, ThreadStore

__all__ = ["SequenceCheck", "ThreadWriter"]


class SequenceCheck(enum.StrEnum):
    """How strictly a writer applies the AG-UI sequence rules."""

    STRICT = "strict"
    """Reject an event that may not come next (the default)."""
    OFF = "off"
    """Check each event on its own (shape, fields, size) but not its order: for
    producers that replay or repair threads and know what they are doing."""


class ThreadWriter:
    """Validates, verifies and appends events to the threads of one store."""

    def __init__(self, store: ThreadStore, *, sequence: SequenceCheck = SequenceCheck.STRICT):
        self.store = store
        self.sequence = SequenceCheck(sequence)
        # Per thread: the verifier, the offset it has seen up to, and its epoch.
        self._verifiers: dict[str, tuple[SequenceVerifier, Offset, str | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def publish(
        self, thread: str, events: Sequence[Any], event_ids: Sequence[str] | None = None
    ) -> list[Offset]:
        """Validate, check the sequence, store: all or nothing. Returns one offset per event.

        *events* are wire dicts or event models (ours or the official
        ``ag_ui.core`` ones). *event_ids* (one per event) make the call
        idempotent: a retry with the same ids stores nothing twice and gets
        the same offsets. Raises :class:`~agui_hub.errors.InvalidEvent` or
        :class:`~agui_hub.errors.SequenceError` with nothing stored, or a
        :class:`~agui_hub.errors.StoreError` (after
        :class:`~agui_hub.errors.StoreUnavailable`, retry with the same ids).
        """
        wires = [validate_wire(event) for event in events]
        if event_ids is not None and len(event_ids) != len(wires):
            raise ValueError("event_ids must hold one id per event")
        ids = list(event_ids) if event_ids else [uuid.uuid4().hex for _ in wires]
        if self.sequence is SequenceCheck.OFF:
            return await self.store.append(
                thread, [EventInput.of(w, i) for w, i in zip(wires, ids, strict=True)]
            )
        lock = self._locks.setdefault(thread, asyncio.Lock())
        async with lock:
            # A retry of events already stored is answered with their offsets; only
            # the new ones are checked against the sequence rules.
            known = await self.store.stored_ids(thread, ids) if event_ids else {}
            new = [w for w, i in zip(wires, ids, strict=True) if i not in known]
            if not new:
                return [known[i] for i in ids]
            verifier = await self._verifier(thread)
            trial = copy.deepcopy(verifier) if len(new) > 1 else verifier
            if len(new) == 1:
                trial.check(new[0])
            else:
                for wire in new:
                    trial.verify(wire)
            offsets = await self.store.append(
                thread, [EventInput.of(w, i) for w, i in zip(wires, ids, strict=True)]
            )
            if len(new) == 1:
                verifier.verify(new[0])
            else:
                verifier = trial
            epoch = self._verifiers[thread][2]
            if epoch is None:  # this append created the thread
                epoch = await self.store.epoch(thread)
            newest = max(offsets, key=offset_key)
            self._verifiers[thread] = (verifier, newest, epoch)
            return offsets

    def forget(self, thread: str) -> None:
        """Drop the cached sequence state of *thread* (it is rebuilt from the store)."""
        self._verifiers.pop(thread, None)

    async def _verifier(self, thread: str) -> SequenceVerifier:
        """The thread's verifier, caught up with what others stored meanwhile."""
        known = self._verifiers.get(thread)
        epoch = await self.store.epoch(thread)
        if known is None or known[2] != epoch:
            verifier, after = SequenceVerifier(thread=thread), START
        else:
            verifier, after = known[0], known[1]
        try:
            entries = await self.store.read(thread, after=after)
        except OffsetExpired:
            # History trimmed: judge what follows from what is still stored.
            verifier, entries = SequenceVerifier(thread=thread), []
            info = await self.store.info(thread)
            if info is not None and info.trimmed is not None:
                entries = await self.store.read(thread, after=info.trimmed)
            verifier = _lenient(verifier, entries)
            after = entries[-1].offset if entries else (info.trimmed if info else None) or after
            self._verifiers[thread] = (verifier, after, epoch)
            return verifier
        for entry in entries:
            with contextlib.suppress(ProtocolError, ValueError, msgpack.UnpackException):
                verifier.verify(msgpack.unpackb(entry.data, raw=False))
        if entries:
            after = entries[-1].offset
        self._verifiers[thread] = (verifier, after, epoch)
        return verifier


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


def _lenient(verifier: SequenceVerifier, entries: Sequence[Entry]) -> SequenceVerifier:
    """Replay a stream whose beginning was trimmed: assume what it no longer shows.

    An event that continues something opened before the trimmed part (a run,
    a message, a tool call, a step, a subagent) is preceded by a stand-in for
    its opener, so that what follows is judged by the usual rules.
    """
    for entry in entries:
        try:
            event = msgpack.unpackb(entry.data, raw=False)
        except (ValueError, msgpack.UnpackException):
            continue
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
    return verifier
