"""A thread's stored history, folded: what a channel loads, and what ``Hub.fold`` returns.

The fold starts from the thread's checkpoint when it has one of the same
epoch, then reads page by page; every page carries the epoch it was read in,
so a thread re-created between two pages is read again rather than mixed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ...agui.patch import YIELD_WORK, StateLimits
from ...agui.reducer import ThreadState
from ...errors import StoreUnavailable
from ...store.contract import ThreadStore
from ...wire.offsets import START, Offset, offset_key
from .branches import Branch
from .checkpoints import fold_checkpoint
from .entries import EntryReader
from .recent import RecentBounds, RecentEntries

__all__ = ["LOAD_ATTEMPTS", "LOAD_PAGE", "FoldedHistory", "fold_history"]

LOAD_PAGE = 5000
"""Entries read per store round trip while a channel folds its thread."""
LOAD_ATTEMPTS = 5
"""Reads of a thread a (re)load tries before it gives up (the thread kept changing)."""


@dataclass(slots=True)
class FoldedHistory:
    """A thread as stored at one instant, folded."""

    state: ThreadState
    epoch: str | None
    """The epoch the history was read in (``None``: the thread does not exist)."""
    cursor: Offset
    """The offset of the last entry folded (or trimmed): follow the thread from there."""
    complete: bool
    """Whether ``state`` folds the whole history (nothing trimmed or skipped)."""
    recent: RecentEntries
    """The last entries read, within the bounds asked for (not counted in any
    budget yet); empty when none were asked for."""
    checkpoint_bytes: int = 0
    """The size of the checkpoint the fold started from (0: it started from none)."""
    branch: Branch | None = None
    """The branch folded, as of ``cursor`` (a followed one may have grown)."""


async def fold_history(
    store: ThreadStore,
    thread: str,
    limits: StateLimits,
    reader: EntryReader,
    recent: RecentBounds | None,
    branch: Branch | None = None,
) -> FoldedHistory:
    """Fold *thread* as stored now into a new state under *limits*.

    *reader* folds the entries (and logs those it skips); with *recent*
    bounds, the last entries read are kept, so that viewers that resume right
    after a restart are served from memory. With *branch*, only its events
    are folded, up to its end (a checkpoint serves only when it holds no
    other branch's events). Raises
    :class:`~agui_hub.errors.StoreUnavailable` when the thread was re-created
    :data:`LOAD_ATTEMPTS` times while being read, or whatever
    :class:`~agui_hub.errors.StoreError` the store raises.
    """
    checkpoint = await store.get_checkpoint(thread)
    if checkpoint is not None and branch is not None and not branch.covers(checkpoint):
        checkpoint = None
    bounds = recent or RecentBounds()
    for _attempt in range(LOAD_ATTEMPTS):
        state = ThreadState(limits=limits)
        complete, after = True, START
        judge = branch.copy() if branch is not None else None
        if checkpoint is not None:
            if fold_checkpoint(state, checkpoint, thread):
                complete, after = checkpoint.complete, checkpoint.offset
            else:
                state, checkpoint = ThreadState(limits=limits), None
        if judge is not None:
            judge.current = judge.run_at(after)
        epoch: str | None = None
        first, restart, folded = True, False, 0
        worked = state.work  # work units spent when it last let others run
        kept = RecentEntries(after, bounds)
        while True:
            page = await store.read_available(thread, after=after, limit=LOAD_PAGE)
            if first:
                first, epoch = False, page.epoch
                if checkpoint is not None and checkpoint.epoch != epoch:
                    checkpoint, restart = None, True  # of another epoch: fold it all
                    break
            elif page.epoch != epoch:
                restart = True  # re-created between two reads
                break
            if page.gap and (
                judge is None or page.trimmed is None or judge.lost(after, page.trimmed)
            ):
                complete = False  # trimmed before it could be folded
                if page.trimmed is not None:
                    kept = RecentEntries(page.trimmed, bounds)  # what follows is contiguous
            ended = False
            for entry in page.entries:
                if judge is not None:
                    if judge.ended_before(entry):
                        ended = True  # the branch's last run ended before it
                        break
                    after = entry.offset
                    if not judge.admits(entry):
                        continue
                reader.measure(entry)
                if not reader.fold(state, entry):
                    complete = False
                if recent is not None:
                    kept.add(entry)
                folded += 1
                if folded % LOAD_PAGE == 0 or state.work - worked >= YIELD_WORK:
                    worked = state.work
                    await asyncio.sleep(0)  # a long fold lets everything else run
            if ended:
                break
            if page.entries:
                after = page.entries[-1].offset
            elif page.trimmed is not None and offset_key(page.trimmed) > offset_key(after):
                after = page.trimmed  # everything after `after` was trimmed
            if len(page.entries) < LOAD_PAGE:
                break
        if not restart:
            size = len(checkpoint.events) if checkpoint is not None else 0
            return FoldedHistory(state, epoch, after, complete, kept, size, judge)
    raise StoreUnavailable(
        f"thread {thread!r} was re-created {LOAD_ATTEMPTS} times while being read"
    )
