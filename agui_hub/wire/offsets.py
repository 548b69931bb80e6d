"""Thread names and offsets: the identifiers the wire protocol and the store share.

An offset is a stream entry id, ``"<ms>-<seq>"``, compared as the pair
``(ms, seq)``; :data:`START` (``"0-0"``) is the position before the first
event. See ``docs/store.md`` for what offsets and epochs guarantee.
"""

from __future__ import annotations

import re

from ..errors import InvalidEvent, InvalidOffset

__all__ = ["MAX_THREAD_LENGTH", "START", "Offset", "check_thread", "offset_key"]

Offset = str
"""A stream entry id, ``"<ms>-<seq>"``."""

START: Offset = "0-0"
"""The offset before the first event: reading after it reads from the beginning."""

MAX_THREAD_LENGTH = 256
# ASCII digits only: `\d` would also take Arabic-Indic and other Unicode
# digits ("\u0661-0"), which int() reads as 1 but Redis rejects.
_OFFSET_RE = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_MAX_PART = 2**64 - 1  # Redis stream ids are two unsigned 64-bit integers
# C0, DEL and C1: the whole of Unicode category Cc.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")


def offset_key(offset: Offset) -> tuple[int, int]:
    """The sort key of an offset. Raises :class:`InvalidOffset`."""
    match = _OFFSET_RE.fullmatch(offset) if isinstance(offset, str) else None
    if match is not None:
        ms, seq = int(match.group(1)), int(match.group(2))
        if ms <= _MAX_PART and seq <= _MAX_PART:
            return ms, seq
    raise InvalidOffset(f"invalid offset {offset!r}: expected '<ms>-<seq>', e.g. '0-0'")


def check_thread(thread: str) -> str:
    """Return *thread* if it is a valid thread name, else raise :class:`InvalidEvent`.

    A thread name is 1 to 256 characters without control characters (C0,
    U+0000 to U+001F; DEL, U+007F; C1, U+0080 to U+009F: a terminal acts on
    ``"\\u009b2J"`` as on ``"\\x1b[2J"``), and neither begins nor ends with
    whitespace.
    """
    if not isinstance(thread, str) or not 0 < len(thread) <= MAX_THREAD_LENGTH:
        raise InvalidEvent(f"a thread name is a string of 1 to {MAX_THREAD_LENGTH} characters")
    if _CONTROL_RE.search(thread) is not None:
        raise InvalidEvent(f"thread name {thread!r} contains control characters")
    stripped = thread.strip()
    if stripped != thread:
        # "demo " would be another thread than "demo", one that nobody can tell
        # apart on a screen: refused rather than taken for a different name.
        if not stripped:
            raise InvalidEvent(f"thread name {thread!r} is only whitespace: give a name")
        raise InvalidEvent(
            f"thread name {thread!r} begins or ends with whitespace: "
            f"remove it (did you mean {stripped!r}?)"
        )
    return thread
