"""Branch members resynced after their channel reloaded its thread in the same epoch.

When retention trims entries before a channel relayed them, the channel
reloads the thread and sends every whole-thread member a snapshot of its
state. That state folds every branch, so a member on a branch
(docs/protocol.md, ``subscribe`` with ``branch``) gets its own: its
branch's runs folded from the store, off the relay's path. Until then the
member is ``JOINING``: nothing is relayed to it, and the snapshot's reply
comes first.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from ...agui.runs import RunTree
from ...errors import StoreUnavailable
from ...store.contract import ThreadStore
from ...wire.protocol import CloseCode
from .branches import JoinView
from .catchup import CatchUpChannel
from .history import LOAD_ATTEMPTS
from .members import Member, Subscriber

__all__ = ["BranchResyncs", "ResyncChannel"]

log = logging.getLogger("agui_hub.hub")


class ResyncChannel(CatchUpChannel, Protocol):
    """What a resync reads of, and asks of, the channel the member belongs to."""

    async def join_branch_snapshot(
        self,
        sub: Subscriber,
        command_id: Any,
        view: JoinView,
        recovered: bool,
        replacing: Member | None = None,
    ) -> bool | None:
        """Send *sub* a reply and its branch's snapshot, then its branch's events
        (``None``: reset meanwhile, start again; ``False``: *replacing* left)."""
        ...

    def end_branch(self, sub: Subscriber, why: str) -> None:
        """End *sub*'s branch subscription with an error frame ``unknown_run``."""
        ...


class BranchResyncs:
    """The resyncs under way in one channel, each a task."""

    def __init__(self, channel: ResyncChannel, store: ThreadStore) -> None:
        self.channel = channel
        self.store = store
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, sub: Subscriber, member: Member) -> None:
        """Resync *member* (made ``JOINING`` by the caller) in the background."""
        task = asyncio.create_task(
            self._resync(sub, member), name=f"agui-hub resync {self.channel.thread}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        """The channel closes: stop every resync."""
        for task in self._tasks:
            task.cancel()

    async def _resync(self, sub: Subscriber, member: Member) -> None:
        channel = self.channel
        assert member.branch is not None
        try:
            for _attempt in range(LOAD_ATTEMPTS):
                if channel.closed or channel.members.get(sub) is not member:
                    return
                generation, epoch = channel.generation, channel.epoch
                tree = RunTree(await self.store.runs(channel.thread))
                if channel.closed or channel.members.get(sub) is not member:
                    return
                if channel.generation != generation:
                    continue
                # Its latest run as relayed: the runs that continue it come along.
                tip = member.branch.tip
                if channel.epoch != epoch or tip not in tree.by_id:
                    channel.end_branch(sub, f"its run {tip!r} is gone from the thread")
                    return
                view = JoinView(None, tree, tip)
                if await channel.join_branch_snapshot(sub, None, view, False, member) is not None:
                    return
            raise StoreUnavailable(f"thread {channel.thread!r} kept being reset")
        except asyncio.CancelledError:
            raise
        except StoreUnavailable as exc:
            log.warning("thread %s: branch resync: %s", channel.thread, exc)
            if channel.members.get(sub) is member:
                channel.drop(sub, CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
        except Exception:
            log.exception("thread %s: branch resync failed", channel.thread)
            if channel.members.get(sub) is member:
                channel.drop(sub, CloseCode.INTERNAL_ERROR, "internal error, resume")
