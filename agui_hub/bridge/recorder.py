"""Storing one bridged run in its thread: :class:`RunRecorder`.

Every event of an agent goes into the thread through a
:class:`~agui_hub.bridge.sink.ThreadSink` (validated, sequence checked,
idempotent by the run's event ids), so every viewer of the thread follows the
run live and can resume it. The recorder decides what the thread remembers:

* Messages that the input holds and the thread does not (the user's new
  message) are recorded in the stored RUN_STARTED's ``input`` when the agent's
  RUN_STARTED has none, and ``parentRunId`` is filled in the same way, so the
  thread's history, and the input of its next run, include them. An HTTP
  client that started the run gets the agent's RUN_STARTED as the agent sent
  it (:attr:`~agui_hub.bridge.bridged_run.BridgedRun.first_event`).
* An event the hub refuses ends the run: the events before it are stored, the
  refused one is not, and the :class:`~agui_hub.errors.UpstreamError` names it.
* When the run failed before its RUN_STARTED was stored, a RUN_STARTED of the
  hub's own goes with the RUN_ERROR, in one append: the failed attempt is a
  run like any other, and the append is refused whole if another run took the
  thread meanwhile (a RUN_ERROR alone would end that other run).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ..errors import (
    InvalidEvent,
    ProtocolError,
    RunActive,
    SequenceError,
    StoreUnavailable,
    UpstreamError,
)
from ..wire.offsets import Offset
from .bridged_run import TERMINAL, BridgedRun, RunState
from .sink import ThreadSink

__all__ = ["STORE_RETRY_SECONDS", "RunRecorder"]

log = logging.getLogger("agui_hub.bridge")

STORE_RETRY_SECONDS = 30.0
"""How long the bridge retries an append the store could not take (the upstream
response is not read meanwhile) before the run ends."""

_THREAD_CHANGED = frozenset({"run_not_started", "run_already_finished", "run_already_errored"})
"""Sequence rules an agent's event breaks when its run is no longer the thread's."""


class RunRecorder:
    """Stores the events of bridged runs through *sink*, and their RUN_ERROR when they fail.

    *on_end* is called with a run as soon as the append that stores the agent's
    own RUN_FINISHED or RUN_ERROR returns, so that the run's thread is free
    before its upstream response is closed. It is not called for a run already
    ending (``_ending`` set, as it is before :meth:`fail`): whoever ends it
    counts it, with the RUN_ERROR's code.
    """

    def __init__(self, sink: ThreadSink, on_end: Callable[[BridgedRun], None]) -> None:
        self.sink = sink
        self._on_end = on_end

    async def store(self, run: BridgedRun, events: list[dict[str, Any]]) -> None:
        """Store *events* of the agent; on a refusal store those before it and raise.

        Raises :class:`~agui_hub.errors.RunActive` when another run took the
        thread before this one's first event was stored (nothing is stored: end
        the run without a RUN_ERROR), :class:`~agui_hub.errors.UpstreamError`
        for an event the hub refused (end the run with its code), or a
        :class:`~agui_hub.errors.StoreError`. The append runs in a task of its
        own, shielded: a cancel that arrives meanwhile waits for its outcome (in
        :meth:`fail`) instead of leaving the run not knowing what was stored.
        """
        if not events:
            return
        if run.first_offset is None:
            first = events[0]
            if first.get("type") not in ("RUN_STARTED", "RUN_ERROR"):
                raise UpstreamError(
                    "upstream_invalid_event",
                    f"agent {run.agent.name!r} began with {first.get('type')!r}: "
                    "an AG-UI run begins with RUN_STARTED",
                )
            if first.get("type") == "RUN_ERROR":
                # A RUN_ERROR alone would end whatever run another writer has going,
                # and the input's messages would not be kept: the hub's RUN_STARTED
                # goes with it, in the same append (refused whole if a run is going).
                events = [self._hub_started(run), *events]
            else:
                events = [self._amended(run, first), *events[1:]]
        ids = run.event_ids(len(events))
        try:
            await self._append(run, events, ids)
        except (SequenceError, InvalidEvent, ProtocolError) as exc:
            index = exc.index or 0
            if (
                isinstance(exc, SequenceError)
                and exc.rule == "run_already_active"
                and (run.first_offset is None)
            ):
                raise RunActive(f"another run took thread {run.thread!r} first") from None
            if (
                isinstance(exc, SequenceError)
                and run.first_offset is not None
                and exc.rule in _THREAD_CHANGED
                and index == 0
            ):
                # Not the agent's doing: the thread lost its events (a store without
                # persistence restarted) or another writer ended the run.
                raise UpstreamError(
                    "thread_changed",
                    f"thread {run.thread!r} changed under run {run.run_id!r} ({exc.rule}): "
                    "it was reset, or another writer ended the run; the agent's response "
                    "was closed",
                ) from None
            if index > 0:
                await self._append(run, events[:index], ids[:index])
            number = run.events + 1
            kind = events[index].get("type") if index < len(events) else None
            raise UpstreamError(
                "upstream_invalid_event",
                f"agent {run.agent.name!r} sent event #{number} ({kind}) that the hub refused: "
                f"[{exc.code}] {exc}",
            ) from None

    async def fail(self, run: BridgedRun, code: str, message: str) -> None:
        """End the run with a RUN_ERROR, unless it has already ended.

        Waits for an append of the agent's events still under way first (what
        it stored decides what follows). Raises a
        :class:`~agui_hub.errors.StoreError` when the store does not take the
        RUN_ERROR; a RUN_ERROR the thread's sequence refuses (another run holds
        the thread, or another writer ended this one) is only logged.
        """
        inflight = run._inflight
        if inflight is not None and not inflight.done():
            await asyncio.wait([inflight])  # what it stored decides what follows
        if inflight is not None and inflight.done() and not inflight.cancelled():
            inflight.exception()  # retrieved: its failure is reported by the RUN_ERROR
        if run.outcome is not None:
            return  # the agent ended it (RUN_FINISHED or its own RUN_ERROR)
        error = {"type": "RUN_ERROR", "message": message, "code": code}
        # Nothing stored yet: a RUN_STARTED of the hub's own goes with it, in one
        # append, refused whole if another run holds the thread.
        events = [self._hub_started(run), error] if run.first_offset is None else [error]
        try:
            await self._append_retrying(run, events, run.event_ids(len(events)))
        except SequenceError as exc:
            # Another run holds the thread (this one never started), or another
            # writer ended the run: the thread's run has its end, or is not this one.
            log.warning(
                "run %s in thread %s: its RUN_ERROR (%s) was not stored: %s",
                run.run_id, run.thread, message, exc,
            )  # fmt: skip

    @staticmethod
    def _hub_started(run: BridgedRun) -> dict[str, Any]:
        """A RUN_STARTED of the hub's own for *run* (its agent sent none): the input's
        run id, ``parentRunId`` and new messages, as an agent's would be amended."""
        started: dict[str, Any] = {
            "type": "RUN_STARTED",
            "threadId": run.thread,
            "runId": run.run_id,
        }
        if run.parent_run_id is not None:
            started["parentRunId"] = run.parent_run_id
        if run.new_messages:
            started["input"] = {
                "threadId": run.thread,
                "runId": run.run_id,
                "messages": run.new_messages,
                **({"parentRunId": run.parent_run_id} if run.parent_run_id else {}),
            }
        return started

    @staticmethod
    def _amended(run: BridgedRun, first: dict[str, Any]) -> dict[str, Any]:
        """The agent's RUN_STARTED with what the thread should remember of the input."""
        if first.get("type") != "RUN_STARTED":
            return first
        amended = dict(first)
        if "input" not in first and run.new_messages:
            record: dict[str, Any] = {
                "threadId": run.thread,
                "runId": first.get("runId", run.run_id),
                "messages": run.new_messages,
            }
            if run.parent_run_id is not None:
                record["parentRunId"] = run.parent_run_id
            amended["input"] = record
        if "parentRunId" not in first and run.parent_run_id is not None:
            amended["parentRunId"] = run.parent_run_id
        if amended != first:
            run.first_event = first
        return amended

    async def _append(self, run: BridgedRun, events: list[dict[str, Any]], ids: list[str]) -> None:
        task = asyncio.ensure_future(self._append_retrying(run, events, ids))
        run._inflight = task
        offsets = await asyncio.shield(task)
        del offsets

    async def _append_retrying(
        self, run: BridgedRun, events: list[dict[str, Any]], ids: list[str]
    ) -> list[Offset]:
        deadline = time.monotonic() + STORE_RETRY_SECONDS
        pause = 0.05
        while True:
            try:
                offsets = await self.sink.publish(run.thread, events, ids)
                break
            except StoreUnavailable:
                if time.monotonic() + pause > deadline:
                    raise
                await asyncio.sleep(pause)  # the same ids: a lost reply stores nothing twice
                pause = min(pause * 2, 2.0)
        if run.first_offset is None:
            run.first_offset = offsets[0]
            run.state = RunState.STREAMING
            if not run.started.done():
                run.started.set_result(offsets[0])
        run.last_offset = offsets[-1]
        run.events += len(events)
        if events[-1].get("type") in TERMINAL:
            run.outcome = events[-1]
            if not run._ending:
                # The agent's end: the run is over now, not when its task next runs
                # (a RUN_ERROR of the hub's is counted by Bridge._drive, with its code).
                self._on_end(run)
        return offsets
