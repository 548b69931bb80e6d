"""A channel's latest entries in memory, for members that join from an offset or catch up.

A resume storm (every viewer of a thread reconnecting after a gateway
restart or a network blip) then reads no store: what each viewer lacks is
usually among the thread's last entries. Memory is bounded twice: per channel
(:class:`RecentBounds`, never more than the store itself keeps) and per hub
(:class:`RecentBudget`, shared by every channel of the process). Both count
what an entry really costs in memory
(:func:`~agui_hub.store.contract.entry_cost`: its data, its ids and about
320 bytes of objects around them), and an entry that leaves is released at
once.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from itertools import islice

from ...store.contract import Entry, ThreadStore, entry_cost
from ...wire.offsets import Offset, offset_key

__all__ = [
    "DEFAULT_RECENT_BUDGET",
    "RECENT_BYTES",
    "RECENT_ENTRIES",
    "RecentBounds",
    "RecentBudget",
    "RecentEntries",
]

RECENT_ENTRIES = 1024
"""Most of its latest entries a channel keeps in memory, for members that join
from an offset or catch up (a resume storm reads no store)."""
RECENT_BYTES = 512 * 1024
"""About the most bytes of memory a channel's latest entries take
(:func:`~agui_hub.store.contract.entry_cost` each)."""
DEFAULT_RECENT_BUDGET = 64 * 1024 * 1024
"""About the most bytes of memory the latest entries of all channels of a hub take together."""


def _entry_key(entry: Entry) -> tuple[int, int]:
    return offset_key(entry.offset)


@dataclass(frozen=True, slots=True)
class RecentBounds:
    """How many of its latest entries, and about how many bytes of memory, one channel keeps."""

    max_entries: int = RECENT_ENTRIES
    max_bytes: int = RECENT_BYTES

    @classmethod
    def for_store(cls, store: ThreadStore) -> RecentBounds:
        """The default bounds, but never more than *store* keeps: a resume from a
        trimmed offset gets the same answer (a snapshot) whether memory or the
        store serves it. (The store's ``max_bytes`` counts event data, which is
        less than what the same entries cost here: memory never keeps more.)"""
        retention = getattr(store, "retention", None)
        return cls(
            min(RECENT_ENTRIES, getattr(retention, "max_len", 0) or RECENT_ENTRIES),
            min(RECENT_BYTES, getattr(retention, "max_bytes", 0) or RECENT_BYTES),
        )


class RecentBudget:
    """The bytes of memory the latest entries of all channels of a hub take, against their limit."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = DEFAULT_RECENT_BUDGET) -> None:
        self.limit = limit
        """About the most bytes the channels may keep together."""
        self.used = 0
        """Bytes they keep now (:func:`~agui_hub.store.contract.entry_cost` each)."""


class RecentEntries:
    """A channel's latest entries, contiguous: every entry after :attr:`start`
    up to the channel's cursor, oldest first.

    A window being built (a channel's load) counts against its own bounds
    only; :meth:`attach` it to the hub's budget when the channel adopts it,
    and :meth:`release` it when the channel drops it, so that the budget
    counts what the channels keep now.
    """

    __slots__ = ("_budget", "bounds", "entries", "size", "start")

    def __init__(
        self, start: Offset, bounds: RecentBounds, budget: RecentBudget | None = None
    ) -> None:
        self.bounds = bounds
        # A deque, not a list with a moving head: an entry that leaves is
        # released at once, not when the list is next compacted. No sort keys
        # are kept beside them (a tuple and an int, about 100 bytes an entry):
        # :meth:`after` computes the few it bisects with.
        self.entries: deque[Entry] = deque()
        self.size = 0
        """Bytes of memory the entries take (:func:`~agui_hub.store.contract.entry_cost`)."""
        self.start = start
        """The offset right before the oldest entry kept (the cursor when empty)."""
        self._budget = budget

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: Entry) -> None:
        """Keep *entry*, the newest; drop the oldest ones past the bounds and the budget."""
        size = entry_cost(entry)
        self.entries.append(entry)
        self.size += size
        if self._budget is not None:
            self._budget.used += size
        self.trim()

    def after(self, key: tuple[int, int]) -> list[Entry] | None:
        """Every entry after *key* (an offset's sort key) up to the cursor, or
        ``None`` when some are not kept."""
        if key < offset_key(self.start):
            return None
        entries = self.entries
        # Bisecting a deque indexes it about 10 times (each a walk of at most
        # len/64 blocks); a resume is served in microseconds.
        first = bisect_right(entries, key, key=_entry_key)
        return list(islice(entries, first, None))

    def attach(self, budget: RecentBudget) -> None:
        """Count this window in *budget* from now on (and trim it to fit)."""
        self._budget = budget
        budget.used += self.size
        self.trim()

    def release(self) -> None:
        """Give this window's bytes back to the budget: the channel no longer keeps it."""
        if self._budget is not None:
            self._budget.used -= self.size
            self._budget = None

    def trim(self) -> None:
        """Keep the latest entries within the bounds and the budget."""
        bounds, budget, entries = self.bounds, self._budget, self.entries
        while entries and (
            len(entries) > bounds.max_entries
            or self.size > bounds.max_bytes
            or (budget is not None and budget.used > budget.limit)
        ):
            entry = entries.popleft()
            self.start = entry.offset
            size = entry_cost(entry)
            self.size -= size
            if budget is not None:
                budget.used -= size
