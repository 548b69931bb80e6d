"""One branch of a thread's tree of runs, as the entries of the thread go by.

A branch is the runs from the root of a thread's tree (docs/protocol.md,
``runs``) to one run, its *tip*. Its entries are those of its runs and those
stored before any run. :class:`Branch` judges the entries of the thread in
stream order: a run's input for a regenerate folds a branch up to the tip's
end (``follow=False``); a subscriber on a branch also gets the runs that
continue it as they start (``follow=True``), each new one becoming the tip.
A RUN_STARTED names its parent in ``parentRunId``, or else continues the run
before it in the thread: the rules of the stores' index of runs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ...agui.runs import RunState, RunTree
from ...store.contract import Checkpoint, Entry
from ...wire.offsets import START, Offset, offset_key

__all__ = ["Branch", "JoinView", "branch_head"]


@dataclass(slots=True)
class Branch:
    """The runs of one branch, and the run of the thread at the last entry judged.

    Make it with :meth:`of`; feed it every entry of the thread after the
    offset it was made at, in order, through :meth:`admits`.
    """

    runs: set[str]
    tip: str
    follow: bool
    """Whether runs that continue the tip join the branch as they start."""
    until: tuple[int, int] | None
    """Where the branch stops (the tip's end; ``None``: it does not)."""
    current: str | None
    """The thread's run as of the last entry judged (a RUN_STARTED without
    ``parentRunId`` continues it)."""
    _starts: list[tuple[tuple[int, int], str]] = field(default_factory=list, repr=False)
    _others_from: tuple[int, int] | None = None
    _ends: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    _parents: dict[str, str | None] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, tree: RunTree, run_id: str, *, follow: bool, at: Offset = START) -> Branch:
        """The branch whose tip is *run_id* (``KeyError``: no such run), to be
        fed the entries after *at*. Without *follow* it ends where its tip
        ended (or goes on while the tip runs)."""
        path = tree.path(run_id)
        runs = {r.run_id for r in path}
        last = path[-1]
        until = None
        if not follow and last.last is not None and last.status is not RunState.RUNNING:
            until = offset_key(last.last)
        tip = run_id
        if follow:
            # The runs that already continue it, as the index knows them: their
            # RUN_STARTED may be trimmed, or come before *at*.
            for run in tree.runs:  # in the order they started
                if run.run_id not in runs and run.parent_run_id == tip:
                    runs.add(run.run_id)
                    tip = run.run_id
        others = [offset_key(r.first) for r in tree.runs if r.run_id not in runs]
        branch = cls(
            runs,
            tip,
            follow,
            until,
            None,
            sorted((offset_key(r.first), r.run_id) for r in tree.runs),
            min(others) if others else None,
            {
                r.run_id: offset_key(r.last)
                for r in tree.runs
                if r.last is not None and r.status is not RunState.RUNNING
            },
            {r.run_id: r.parent_run_id for r in tree.runs},
        )
        branch.current = branch.run_at(at)
        return branch

    def copy(self) -> Branch:
        return Branch(
            set(self.runs),
            self.tip,
            self.follow,
            self.until,
            self.current,
            self._starts,
            self._others_from,
            self._ends,
            self._parents,
        )

    def run_at(self, offset: Offset) -> str | None:
        """The thread's run at *offset*: the last one started at or before it."""
        i = bisect.bisect_right(self._starts, (offset_key(offset), "\U0010ffff"))
        return self._starts[i - 1][1] if i else None

    def ended_before(self, entry: Entry) -> bool:
        """Whether *entry* comes after the branch's end (nothing after it belongs)."""
        return self.until is not None and offset_key(entry.offset) > self.until

    def admits(self, entry: Entry) -> bool:
        """Whether *entry* belongs to the branch; a RUN_STARTED that continues
        the tip of a followed branch joins it (and becomes the tip)."""
        run = entry.run_id
        if entry.type == "RUN_STARTED" and run:
            before, self.current = self.current, run
            if run in self.runs:
                return True
            if self.follow and _parent(entry, before) == self.tip:
                self.runs.add(run)
                self.tip = run
                return True
            return False
        return not run or run in self.runs

    def lost(self, after: Offset, trimmed: Offset) -> bool:
        """Whether entries of this branch were among those trimmed after *after* up
        to *trimmed* (those of other branches' runs do not matter to it). Either
        way, the judging goes on from *trimmed*."""
        low, high = offset_key(after), offset_key(trimmed)
        current = self.run_at(after)
        self.current = self.run_at(trimmed)
        if current is None or current in self.runs:
            end = self._ends.get(current) if current is not None else None
            if end is None or end > low:
                return True  # the run going at `after` (or events of no run) went on
        return any(
            low < key <= high
            and (run in self.runs or (self.follow and self._parents.get(run) == self.tip))
            for key, run in self._starts
        )  # a run of the branch, or one that would have joined it

    def covers(self, checkpoint: Checkpoint) -> bool:
        """Whether *checkpoint* folds this branch's events only (no run of
        another branch started before it)."""
        return self._others_from is None or offset_key(checkpoint.offset) < self._others_from


def _parent(entry: Entry, before: str | None) -> str | None:
    """The run a RUN_STARTED continues: its ``parentRunId``, else *before*."""
    try:
        event: Any = msgpack.unpackb(entry.data)
    except Exception:
        return before
    parent = event.get("parentRunId") if isinstance(event, dict) else None
    return parent if isinstance(parent, str) and parent else before


def branch_head(tree: RunTree, run_id: str) -> Offset:
    """The offset of the newest event of the branch a subscriber on *run_id*
    gets (its path, then the runs that continue it, as :class:`Branch`
    follows them), as far as *tree* knows: where its history ends.

    A branch subscriber's ``subscribed`` reply carries it instead of the
    thread's newest offset, so that a client knows when it has caught up.
    """
    runs = Branch.of(tree, run_id, follow=True).runs
    lasts = [r.last for r in tree.runs if r.run_id in runs and r.last is not None]
    firsts = [r.first for r in tree.runs if r.run_id in runs]
    return max([*lasts, *firsts], key=offset_key, default=START)


@dataclass(frozen=True, slots=True)
class JoinView:
    """What a joining subscriber asked to see: one run, one branch (*tree* is the
    thread's runs then), or everything."""

    run: str | None
    tree: RunTree | None
    branch: str | None

    def reply_offset(self, cursor: Offset) -> Offset:
        """The ``offset`` of a history join's reply: the thread's (the cursor), or
        on a branch, the branch's newest event (see :func:`branch_head`)."""
        if self.tree is None or self.branch is None:
            return cursor
        return branch_head(self.tree, self.branch)

    def branch_at(self, at: Offset) -> Branch | None:
        """The branch to judge the entries after *at* with (``None``: no branch)."""
        if self.tree is None or self.branch is None:
            return None
        return Branch.of(self.tree, self.branch, follow=True, at=at)
