"""One run of an upstream agent in one thread: :class:`BridgedRun`, the record the
:class:`~agui_hub.bridge.runs.Bridge` keeps of it while it goes, and
:class:`RunState`, where it is in its life.

The bridge's parts share the record: the :class:`~agui_hub.bridge.runs.Bridge`
starts, cancels and releases runs, the
:class:`~agui_hub.bridge.recorder.RunRecorder` notes what it stored (offsets,
outcome), the :class:`~agui_hub.bridge.upstream.UpstreamRelay` reads the agent
for it. Callers get one from ``Bridge.start`` and await :attr:`BridgedRun.started`
and :attr:`BridgedRun.done`; they do not change it.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..wire.offsets import Offset
from .agents import AgentEndpoint

__all__ = ["TERMINAL", "BridgedRun", "RunState"]

TERMINAL = frozenset({"RUN_FINISHED", "RUN_ERROR"})
"""The event types that end an AG-UI run."""


class RunState(enum.Enum):
    """Where a :class:`BridgedRun` is in its life (its ``status`` in a ``run`` reply)."""

    STARTING = "starting"
    """Accepted; the thread is being read and the agent called."""
    STREAMING = "streaming"
    """The run's first event is stored; the agent's events follow."""
    ENDED = "ended"
    """Its RUN_FINISHED or RUN_ERROR is stored (or nothing could be stored)."""


@dataclass(eq=False)
class BridgedRun:
    """One run of an upstream agent in one thread, owned by a
    :class:`~agui_hub.bridge.runs.Bridge`."""

    thread: str
    agent: AgentEndpoint
    run_id: str
    """The runId the input asked for (the agent's RUN_STARTED may name another)."""
    parent_run_id: str | None
    input: dict[str, Any] = field(repr=False)
    new_messages: list[dict[str, Any]] = field(repr=False)
    """The input's messages that the thread did not hold when the run started."""
    subject: str
    epoch: str | None = None
    """The thread's epoch when the run started."""
    state: RunState = RunState.STARTING
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Makes the run's event ids (``bridge:<key>:<n>``): a retried append stores nothing twice."""
    first_offset: Offset | None = None
    """Offset of the run's first stored event (its RUN_STARTED)."""
    first_event: dict[str, Any] | None = field(default=None, repr=False)
    """The agent's first event as it sent it, when the stored one was amended."""
    last_offset: Offset | None = None
    outcome: dict[str, Any] | None = field(default=None, repr=False)
    """The stored RUN_FINISHED or RUN_ERROR."""
    events: int = 0
    """Events of the agent stored so far."""
    cancel_reason: tuple[str, str] | None = None
    """(RUN_ERROR code, message) once somebody asked to stop it."""
    started: asyncio.Future[Offset] = field(init=False, repr=False)
    """Resolves to :attr:`first_offset`; fails when nothing could be stored."""
    done: asyncio.Event = field(init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    """The task that drives it (see Bridge._drive)."""
    _inflight: asyncio.Task[list[Offset]] | None = field(default=None, init=False, repr=False)
    """Its latest append of the agent's events (see RunRecorder.fail: a cancel waits for it)."""
    _next_id: int = field(default=0, init=False, repr=False)
    _driving: bool = field(default=False, init=False, repr=False)
    """Its task has begun (a cancel before that is only recorded: see Bridge._drive)."""
    _ending: bool = field(default=False, init=False, repr=False)
    """Its end is being stored: a cancel now would only interrupt that."""
    _released: bool = field(default=False, init=False, repr=False)
    """Counted as ended and its thread free (see Bridge._release)."""

    def __post_init__(self) -> None:
        self.started = asyncio.get_running_loop().create_future()
        self.done = asyncio.Event()

    def as_json(self) -> dict[str, Any]:
        """What a ``run`` reply and ``agui-hub run`` report about it."""
        record: dict[str, Any] = {
            "thread": self.thread,
            "agent": self.agent.name,
            "runId": self.run_id,
            "status": self.state.value,
        }
        if self.parent_run_id is not None:
            record["parentRunId"] = self.parent_run_id
        return record

    def event_ids(self, count: int) -> list[str]:
        """The ids of its next *count* stored events: pass them to the append that stores
        those events, and again to its retries (a lost reply then stores nothing twice)."""
        first = self._next_id
        self._next_id += count
        return [f"bridge:{self.key}:{n}" for n in range(first, first + count)]
