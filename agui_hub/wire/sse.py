"""Server-sent events, sans I/O: the encoder and an incremental, bounded parser.

The HTTP bridge speaks SSE both ways: it reads an upstream agent's response
with :class:`SseParser` and writes the thread's events to HTTP clients with
:func:`encode_event`. Neither touches a socket or an event loop.

The parser follows the WHATWG "event stream interpretation": lines end with
CRLF, LF or CR; ``:`` starts a comment; ``data`` lines are joined with
``\\n``; ``event``, ``id`` and ``retry`` set what they name; a blank line
dispatches. It is bounded: a line or an event's data longer than
*max_event_bytes* raises :class:`~agui_hub.errors.PayloadTooLarge` instead of
growing a buffer without end, whatever the peer sends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PayloadTooLarge

__all__ = ["SseEvent", "SseParser", "SseTooLarge", "encode_comment", "encode_event"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BLANK_LINES = re.compile(rb"(?:\r\n|\r|\n)+")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event: its data (lines joined by ``\\n``), type and last event id."""

    data: str
    event: str = "message"
    id: str | None = None


class SseTooLarge(PayloadTooLarge):
    """A line or an event's data over the parser's bound; :attr:`events` are the events
    the chunk completed before it (hand them on: they are whole)."""

    def __init__(self, size: int, limit: int, events: list[SseEvent]) -> None:
        super().__init__(size, limit)
        self.events = events


class SseParser:
    """Feed it bytes as they arrive; it returns the events completed so far.

    Call :meth:`feed` with each chunk of the body; at the end of the body,
    :meth:`close` tells whether an event was cut off (data without its blank
    line), which a caller reading a finite stream should treat as truncation.
    The work is linear in the bytes fed, however they are cut into chunks: a
    partial line is not scanned again, and a run of blank lines is skipped
    in one step.
    """

    def __init__(self, *, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self.retry: int | None = None
        """The last ``retry`` field (milliseconds), if any."""
        self.last_id: str | None = None
        self._buffer = bytearray()
        self._scanned = 0
        """Bytes at the start of the buffer known to hold no line end."""
        self._data: list[str] = []
        self._data_size = 0
        self._event = ""
        self._first = True
        self._after_cr = False

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Take the next *chunk* of the stream; return the events it completed.

        Raises :class:`SseTooLarge` (with the events completed before it) for a
        line or an event's data over *max_event_bytes*.
        """
        if not chunk:
            return []
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]  # the LF of a CRLF split across two chunks
        buffer = self._buffer
        buffer += chunk
        events: list[SseEvent] = []
        start = 0
        size = len(buffer)
        limit = self.max_event_bytes
        try:
            while True:
                found = _LINE_END.search(buffer, max(start, self._scanned))
                if found is None:
                    break
                end = found.start()
                if end - start > limit:
                    raise SseTooLarge(end - start, limit, events)
                self._line(bytes(buffer[start:end]), events)
                start = found.end()
                if not self._data and not self._event:
                    # Blank lines with nothing to dispatch or reset do nothing: skip
                    # them together.
                    blanks = _BLANK_LINES.match(buffer, start)
                    if blanks is not None:
                        start = blanks.end()
                if start == size and buffer[size - 1] == 0x0D:
                    self._after_cr = True  # its LF, if any, starts the next chunk
            del buffer[:start]
            self._scanned = len(buffer)
            if len(buffer) > limit:
                raise SseTooLarge(len(buffer), limit, events)
        except SseTooLarge:
            raise
        except PayloadTooLarge as exc:  # an event's data lines together
            raise SseTooLarge(exc.size, exc.limit, events) from None
        return events

    def close(self) -> bool:
        """The body ended: ``True`` when it stopped in the middle of an event."""
        return bool(self._buffer.strip() or self._data)

    def _line(self, raw: bytes, events: list[SseEvent]) -> None:
        if self._first:
            self._first = False
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a byte-order mark is allowed before the first line
        if not raw:
            if self._data:
                events.append(
                    SseEvent("\n".join(self._data), self._event or "message", self.last_id)
                )
            self._data, self._data_size, self._event = [], 0, ""
            return
        line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            return  # a comment (keepalive)
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data_size += len(raw) + 1
            if self._data_size > self.max_event_bytes:
                raise PayloadTooLarge(self._data_size, self.max_event_bytes)
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry = int(value)


def encode_event(data: str, *, id: str | None = None, event: str | None = None) -> bytes:
    """One SSE event: ``event:`` (if given), ``id:`` (if given), ``data:`` lines, a blank line.

    *data* may hold newlines (each becomes a ``data:`` line); *id* and *event*
    must not (the caller's ids are offsets and the names are ours).
    """
    parts = []
    if event is not None:
        parts.append(f"event: {event}\n")
    if id is not None:
        parts.append(f"id: {id}\n")
    if "\n" in data or "\r" in data:
        for line in data.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
            parts.append(f"data: {line}\n")
    else:
        parts.append(f"data: {data}\n")
    parts.append("\n")
    return "".join(parts).encode()


def encode_comment(text: str = "") -> bytes:
    """A comment line (``: text``): a keepalive that every SSE client ignores."""
    return f": {text}\n\n".encode()
