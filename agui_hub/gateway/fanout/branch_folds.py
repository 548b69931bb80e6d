"""The latest folds of branches of one channel's thread, kept for the next branch joins.

A snapshot of the whole thread is the channel's own state; a snapshot of one
branch (docs/protocol.md, ``subscribe`` with ``branch``) is folded from the
store, a read of the thread. Viewers of one branch tend to come together (a
shared link, a reconnect storm): the fold of the first serves the next ones,
who catch up from its cursor like any joiner, as long as the channel has not
reloaded and still keeps in memory every entry after that cursor (so the
catch-up costs no store read either). At most :data:`KEPT` folds per channel,
each no larger than the channel's own state (a branch is part of the thread),
with the snapshot frames built from it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from ...wire.codec import Encoding
from ...wire.offsets import Offset
from .history import FoldedHistory

__all__ = ["KEPT", "BranchFolds"]

KEPT = 2
"""Branch folds one channel keeps (the latest used)."""


@dataclass(slots=True)
class _Kept:
    generation: int
    folded: FoldedHistory
    frames: dict[Encoding, bytes | str] = field(default_factory=dict)
    """The snapshot frame of the fold, by encoding, built once."""


class BranchFolds:
    """Folds by the run a join asked for, valid for one generation of the channel."""

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Kept] = OrderedDict()

    def get(
        self, run: str, generation: int, in_memory: Callable[[Offset], bool]
    ) -> FoldedHistory | None:
        """The fold of the branch asked for at *run*, when it is of this
        *generation* and *in_memory* says the entries after its cursor are
        still in the channel's memory; ``None``: fold it from the store."""
        kept = self._kept.get(run)
        if kept is None:
            return None
        if kept.generation != generation or not in_memory(kept.folded.cursor):
            del self._kept[run]
            return None
        self._kept.move_to_end(run)
        return kept.folded

    def put(self, run: str, generation: int, folded: FoldedHistory) -> None:
        self._kept[run] = _Kept(generation, folded)
        self._kept.move_to_end(run)
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)

    def frame(self, run: str, encoding: Encoding, build: Callable[[], bytes | str]) -> bytes | str:
        """The snapshot frame of the fold kept for *run*, built by *build* once
        per encoding (every joiner of it gets the same bytes)."""
        kept = self._kept.get(run)
        if kept is None:
            return build()
        frame = kept.frames.get(encoding)
        if frame is None:
            frame = kept.frames[encoding] = build()
        return frame

    def clear(self) -> None:
        self._kept.clear()
