"""The seam between the bridge and the gateway: :class:`ThreadSink`, what the bridge
needs of whoever stores threads.

The bridge sits below the gateway and does not import it: the gateway hands
its :class:`~agui_hub.gateway.fanout.channels.Hub` (which has these two methods) to
:class:`~agui_hub.bridge.runs.Bridge`, and a test may hand anything else that
has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..agui.reducer import ThreadState
from ..agui.runs import RunInfo, RunTree
from ..wire.offsets import Offset

__all__ = ["ThreadSink"]


class ThreadSink(Protocol):
    """Reads a thread as stored, and stores events into it the way a publish does."""

    async def fold(
        self, thread: str, branch: str | None = None, tree: RunTree | None = None
    ) -> tuple[ThreadState, str | None, Offset]:
        """The thread as stored now, folded: ``(state, epoch, cursor)``; with
        *branch*, only the branch that ends with that run, as of its end
        (*tree*: the thread's runs, when the caller has read them already).

        The bridge builds a run's input from it and checks that no run is open.
        Raises :class:`~agui_hub.errors.UnknownRun` for a *branch* that is no
        run of the thread, a :class:`~agui_hub.errors.StoreError` when the
        store fails.
        """
        ...

    async def runs(self, thread: str) -> list[RunInfo]:
        """The thread's index of runs (see :meth:`ThreadStore.runs
        <agui_hub.store.contract.ThreadStore.runs>`)."""
        ...

    async def publish(
        self, thread: str, events: Sequence[Mapping[str, Any]], event_ids: Sequence[str]
    ) -> list[Offset]:
        """Validate *events*, check them against the thread's sequence and store them, in
        one append; returns their offsets.

        Storing again with the same *event_ids* stores nothing twice (the bridge
        retries with them). Raises a :class:`~agui_hub.errors.ProtocolError`
        (:class:`~agui_hub.errors.InvalidEvent`,
        :class:`~agui_hub.errors.SequenceError`, ...) whose ``index`` names the
        refused event, with nothing stored, or a
        :class:`~agui_hub.errors.StoreError`
        (:class:`~agui_hub.errors.StoreUnavailable`: retry with the same ids).
        """
        ...
