"""How a channel uses its thread's stored entries: decoded, folded, encoded as frames.

One entry never ends a channel: an entry that is not msgpack, not an event,
cannot be folded or cannot be encoded is skipped where it fails, with a
logged reason, and whoever can still use it gets it (an event the state
cannot fold is still relayed; the snapshot then says it is incomplete). A
delta whose patch does not apply is not such an event: it changes nothing,
as in the official client, and the fold goes on.
"""

from __future__ import annotations

import logging
from typing import Any

from ...agui.events import check_json_value
from ...agui.reducer import IGNORED_TYPES, ThreadState
from ...errors import PatchError
from ...store.contract import Entry
from ...wire.codec import Encoding, unpack_stored
from ...wire.protocol import event_frame

__all__ = ["LOGGED_SKIPS", "EntryReader"]

log = logging.getLogger("agui_hub.hub")

LOGGED_SKIPS = 5
"""Entries per channel whose skip is logged as a warning (later ones at debug level)."""


class EntryReader:
    """Reads the stored entries of one thread for its channel.

    It keeps what a channel learns from its entries as it goes: how many it
    skipped (the first :data:`LOGGED_SKIPS` are warnings, later ones debug
    messages, so that a broken producer does not flood the log) and the
    running average of their size (:attr:`entry_size`, which sizes history
    pages). Feed it every entry the channel receives with :meth:`measure`.
    """

    __slots__ = ("entry_size", "not_applied", "skipped", "thread")

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.entry_size = 1024
        """A running average of the thread's entry size (sizes history pages)."""
        self.skipped = 0
        self.not_applied = 0
        """Deltas folded that did not apply (they change nothing, as in the official client)."""

    def measure(self, entry: Entry) -> None:
        """Count *entry* in the running average of the entry size."""
        self.entry_size += (len(entry.data) - self.entry_size) // 16

    def skip(self, entry: Entry, why: str) -> None:
        """Log that *entry* is skipped, and *why*."""
        self.skipped += 1
        level = logging.WARNING if self.skipped <= LOGGED_SKIPS else logging.DEBUG
        log.log(level, "thread %s: entry %s %s", self.thread, entry.offset, why)

    def decode(self, entry: Entry) -> dict[str, Any] | None:
        """The event of *entry*; ``None`` (and logged) when it is not a msgpack map."""
        try:
            event = unpack_stored(entry.data)
        except Exception as exc:  # one entry never ends a channel
            self.skip(entry, f"is not msgpack, not relayed: {exc!r:.200}")
            return None
        if not isinstance(event, dict):
            self.skip(entry, "is not an event (a map), not relayed")
            return None
        return event

    def fold(self, state: ThreadState, entry: Entry, event: Any = None) -> bool:
        """Fold *entry* (whose *event* is decoded already, if given) into *state*;
        ``False`` (and logged) when it cannot be."""
        if event is None:
            event = self.decode(entry)
            if event is None:
                return False
        try:
            # The values of events the fold ignores never reach a snapshot: not
            # walked (a JSON member's frame is checked as it is encoded).
            if event.get("type") not in IGNORED_TYPES:
                for value in event.values():
                    if type(value) in (dict, list, bytes, float):
                        # Binary values (a plain-XADD producer's msgpack) would
                        # make every JSON snapshot unencodable: not folded.
                        check_json_value(value)
            state.apply(event)
        except PatchError as exc:
            # As the official client takes it: the state stays as it was, and
            # the fold goes on, complete (the writer warned when it stored it).
            self.not_applied += 1
            level = logging.INFO if self.not_applied <= LOGGED_SKIPS else logging.DEBUG
            log.log(
                level, "thread %s: entry %s changes nothing: %s", self.thread, entry.offset, exc
            )
            return True
        except Exception as exc:  # one entry never ends a channel
            # A stored event the reducer cannot apply (a plain-XADD producer's
            # bad patch, a missing field, a state past the limits): it is still
            # relayed; the snapshot says it is incomplete.
            self.skip(entry, f"not folded: {exc!r:.200}")
            return False
        return True

    def frame(
        self, entry: Entry, encoding: Encoding, frames: dict[Encoding, bytes | str | None] | None
    ) -> bytes | str | None:
        """The event frame of *entry* in *encoding*; ``None`` when it cannot be
        encoded (logged).

        *frames* holds the frames of a live entry, one per encoding, built
        once and shared by every member (a live entry is decoded already);
        ``None`` for an entry of history, which is decoded first.
        """
        if frames is not None and encoding in frames:
            return frames[encoding]
        frame: bytes | str | None = None
        if frames is not None or self.decode(entry) is not None:  # live entries: decoded
            try:
                frame = event_frame(self.thread, entry.offset, entry.data, encoding)
            except Exception as exc:  # one entry never ends a channel
                self.skip(entry, f"not relayed as {encoding.value}: {exc!r:.200}")
        if frames is not None:
            frames[encoding] = frame
        return frame
