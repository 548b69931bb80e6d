"""A channel's latest entries in memory, for members that join from an offset or catch up.

A resume storm (every viewer of a thread reconnecting after a gateway
restart or a network blip) then reads no store: what each viewer lacks is
usually among the thread's last entries. Memory is bounded twice: per channel
(:class:`RecentBounds`, never more than the store itself keeps) and per hub
(:class:`RecentBudget`, shared by every channel of the process).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from ...store.contract import Entry, ThreadStore
from ...wire.offsets import Offset, offset_key

__all__ = [
    "DEFAULT_RECENT_BUDGET",
    "ENTRY_OVERHEAD",
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
"""About the most bytes of entries a channel keeps in memory for them."""
DEFAULT_RECENT_BUDGET = 64 * 1024 * 1024
"""About the most bytes of recent entries all channels of a hub keep together."""
ENTRY_OVERHEAD = 128
"""Bytes an entry held in memory costs beyond its event data (tuple, strings)."""


@dataclass(frozen=True, slots=True)
class RecentBounds:
    """How many of its latest entries, and about how many bytes, one channel keeps."""

    max_entries: int = RECENT_ENTRIES
    max_bytes: int = RECENT_BYTES

    @classmethod
    def for_store(cls, store: ThreadStore) -> RecentBounds:
        """The default bounds, but never more than *store* keeps: a resume from a
        trimmed offset gets the same answer (a snapshot) whether memory or the
        store serves it."""
        retention = getattr(store, "retention", None)
        return cls(
            min(RECENT_ENTRIES, getattr(retention, "max_len", 0) or RECENT_ENTRIES),
            min(RECENT_BYTES, getattr(retention, "max_bytes", 0) or RECENT_BYTES),
        )


class RecentBudget:
    """The bytes of latest entries all channels of a hub keep, against their limit."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int = DEFAULT_RECENT_BUDGET) -> None:
        self.limit = limit
        """About the most bytes the channels may keep together."""
        self.used = 0
        """Bytes they keep now."""


class RecentEntries:
    """A channel's latest entries, contiguous: every entry after :attr:`start`
    up to the channel's cursor, oldest first (a deque that can be bisected).

    A window being built (a channel's load) counts against its own bounds
    only; :meth:`attach` it to the hub's budget when the channel adopts it,
    and :meth:`release` it when the channel drops it, so that the budget
    counts what the channels keep now.
    """

    __slots__ = ("_budget", "bounds", "entries", "head", "keys", "size", "start", "start_key")

    def __init__(
        self, start: Offset, bounds: RecentBounds, budget: RecentBudget | None = None
    ) -> None:
        self.bounds = bounds
        self.keys: list[tuple[int, int]] = []
        self.entries: list[Entry] = []
        self.head = 0
        """Index of the oldest entry kept (those before it are dropped)."""
        self.size = 0
        self.start = start
        """The offset right before the oldest entry kept (the cursor when empty)."""
        self.start_key = offset_key(start)
        self._budget = budget

    def __len__(self) -> int:
        return len(self.keys) - self.head

    def add(self, key: tuple[int, int], entry: Entry) -> None:
        """Keep *entry* (whose offset's sort key is *key*), the newest; drop the
        oldest ones past the bounds and the budget."""
        size = len(entry.data) + ENTRY_OVERHEAD
        self.keys.append(key)
        self.entries.append(entry)
        self.size += size
        if self._budget is not None:
            self._budget.used += size
        self.trim()

    def after(self, key: tuple[int, int]) -> list[Entry] | None:
        """Every entry after *key* up to the cursor, or ``None`` when some are not kept."""
        if key < self.start_key:
            return None
        return self.entries[bisect_right(self.keys, key, self.head) :]

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
        bounds, budget = self.bounds, self._budget
        while len(self) and (
            len(self) > bounds.max_entries
            or self.size > bounds.max_bytes
            or (budget is not None and budget.used > budget.limit)
        ):
            size = self._drop_oldest()
            if budget is not None:
                budget.used -= size

    def _drop_oldest(self) -> int:
        """Forget the oldest entry; the bytes it was counted for."""
        entry = self.entries[self.head]
        self.start, self.start_key = entry.offset, self.keys[self.head]
        self.head += 1
        if self.head > 64 and self.head * 2 > len(self.keys):
            del self.keys[: self.head], self.entries[: self.head]
            self.head = 0
        size = len(entry.data) + ENTRY_OVERHEAD
        self.size -= size
        return size
