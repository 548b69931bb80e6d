"""One SSE client of the HTTP listener, as the hub sees it: the frames a
WebSocket client would get, turned into Server-Sent Events (docs/bridge.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque

from ..bridge.runs import TERMINAL, BridgedRun
from ..wire.codec import Encoding
from ..wire.protocol import CloseCode
from ..wire.sse import encode_comment, encode_event
from .auth import Identity
from .commands import wake

__all__ = ["JOINS_AT_OFFSET", "SseStream"]

log = logging.getLogger("agui_hub.web")

JOINS_AT_OFFSET = ("live",)
"""Subscribes whose reply's offset is where the stream's events begin (the ids the
HTTP listener gives its own subscribes, echoed in the replies). Not a resume from a
position, nor "start": their reply's offset is the head, with history to come."""

_EVENT_HEAD = '{"type":"event","thread":'


class SseStream:
    """One SSE client, as the hub sees it (a :class:`~agui_hub.gateway.fanout.channels.Subscriber`).

    The hub sends it the JSON frames a WebSocket client would get; it turns
    them into SSE. With *run*, it is the answer to ``POST /agents/<name>``:
    only that run's events, the agent's RUN_STARTED as the agent sent it, no
    frames of the hub's own, and the end of the run ends the stream. With
    *plain* (``?plain=1``), the stream holds AG-UI events only: the hub's own
    named events (``subscribed``, ``snapshot``, ``hub-error``, ``close``)
    become ``id:`` lines (where they carry an offset) and comment lines.
    """

    encoding = Encoding.JSON

    def __init__(
        self,
        thread: str,
        bound: int,
        run: BridgedRun | None = None,
        identity: Identity | None = None,
        plain: bool = False,
    ) -> None:
        self.thread = thread
        self.plain = plain
        self.identity = identity
        """Who reads it: the stream ends when its credentials expire or are revoked."""
        self.bound = bound
        self.run = run
        self._head = _EVENT_HEAD + json.dumps(thread, ensure_ascii=False) + ',"offset":"'
        self._queue: deque[bytes] = deque()
        self.queued_bytes = 0
        self.open = True
        self.finished = False
        """The stream ended on purpose (the run's end, an error told to the client)."""
        self.close_reason: tuple[CloseCode, str] | None = None
        self.offset: str | None = None
        """The offset of the last event queued (a snapshot's, after one)."""
        self._wake: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None

    # Subscriber protocol -----------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.open and not self.finished

    def send(self, frame: bytes | str) -> bool:
        if not self.is_open:
            return True
        assert isinstance(frame, str)
        data = self._convert(frame)
        if data:
            before = self.queued_bytes
            self._queue.append(data)
            self.queued_bytes = before + len(data)
            wake(self._wake)
            if self.queued_bytes > self.bound and before > self.bound // 2:
                if self.queued_bytes > 4 * self.bound:
                    self.close_soon(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect and resume")
                return False
        return True

    def has_room(self) -> bool:
        return self.queued_bytes <= self.bound

    async def drained(self) -> None:
        while self.queued_bytes > self.bound // 2 and self.is_open:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drain)

    def ended(self, thread: str) -> None:
        # A stream follows one thread: without it, nothing is left to send.
        self.close_soon(CloseCode.SERVICE_RESTART, "subscription ended: reconnect")

    def close_soon(self, code: CloseCode, reason: str) -> None:
        if self.is_open:
            self.close_reason = (code, reason)
            if self.run is None:
                # EventSource reconnects by itself, with Last-Event-ID: it resumes.
                info = json.dumps({"code": int(code), "reason": reason})
                self._push(self.named(info, "close"))
            self.finished = True
            wake(self._wake)
            wake(self._drain)

    def close_for_restart(self) -> None:
        """End the stream for a drain (1012): the client reconnects, to any gateway,
        and resumes where it was."""
        self.close_soon(CloseCode.SERVICE_RESTART, "server restart: reconnect and resume")

    # Frames to SSE --------------------------------------------------------------------------

    def named(self, info: str, event: str, id: str | None = None) -> bytes:
        """The hub's own event *event* (data *info*); in a plain stream, the
        ``id:`` alone (a client's last event id, no event) and a comment."""
        if not self.plain:
            return encode_event(info, event=event, id=id)
        return (f"id: {id}\n\n" if id is not None else "").encode() + encode_comment(
            f"{event} {info}".replace("\n", " ")
        )

    def _convert(self, frame: str) -> bytes | None:
        head = self._head
        if frame.startswith(head):
            # '{"type":"event","thread":<thread>,"offset":"<offset>","event":<event>}'
            end = frame.index('"', len(head))
            self.offset = offset = frame[len(head) : end]
            event = frame[end + 10 : -1]  # after '","event":', before the final '}'
            run = self.run
            if run is None:
                return encode_event(event, id=offset)
            if offset == run.first_offset and run.first_event is not None:
                event = json.dumps(run.first_event, ensure_ascii=False, separators=(",", ":"))
            data = encode_event(event, id=offset)
            if json.loads(event).get("type") in TERMINAL:
                self.finished = True  # the run's end: after this, the response ends
                self._push(data)
                return None
            return data
        message = json.loads(frame)
        kind = message.get("type")
        if self.run is not None:
            # Only the run's events go to an HttpAgent; whether the join was
            # complete is the subscribe's answer (see HttpApp._join_run).
            if kind == "error":
                # The run's events cannot be told whole: end the response, the
                # client sees a run without its end (the thread still has it all).
                log.warning("run stream of thread %s ended early: %s", self.thread, message)
                self.finished = True
                wake(self._wake)
            return None
        if kind == "subscribed":
            info = {k: message.get(k) for k in ("thread", "epoch", "offset", "recovered")}
            # Where the events that follow start, when they follow at once: the id
            # lets a client cut off before the first event resume without a gap
            # (not after "start" or a position, whose reply's offset is the head
            # with history to come, nor before a snapshot, whose last event
            # carries the id).
            resumes = message.get("recovered") and message.get("id") in (None, *JOINS_AT_OFFSET)
            if resumes and self.offset is None:
                self.offset = message.get("offset")
            return self.named(
                json.dumps(info, ensure_ascii=False),
                "subscribed",
                message.get("offset") if resumes else None,
            )
        if kind == "snapshot":
            # The snapshot's events carry no offsets of their own; the last one
            # carries the snapshot's, so a client cut off within it starts over.
            info = {k: message.get(k) for k in ("offset", "epoch", "complete")}
            self.offset = message["offset"]
            parts = [self.named(json.dumps(info), "snapshot")]
            events = message.get("events") or []
            for n, event in enumerate(events):
                last = n == len(events) - 1
                parts.append(
                    encode_event(
                        json.dumps(event, ensure_ascii=False, separators=(",", ":")),
                        id=message["offset"] if last else None,
                    )
                )
            if not events:
                parts.append(f"id: {message['offset']}\n\n".encode())
            return b"".join(parts)
        if kind == "error":
            info = {k: message.get(k) for k in ("code", "message")}
            self._push(self.named(json.dumps(info, ensure_ascii=False), "hub-error"))
            self.finished = True
            return None
        return None

    def discard(self) -> None:
        """Drop what is queued (a join that is started again)."""
        self._queue.clear()
        self.queued_bytes = 0
        wake(self._drain)

    def _push(self, data: bytes) -> None:
        self._queue.append(data)
        self.queued_bytes += len(data)
        wake(self._wake)

    # The response's side ------------------------------------------------------------------

    async def next_chunk(self, timeout: float) -> bytes | None:
        """What to write next: queued bytes, ``b""`` after *timeout* with nothing
        (write a keepalive), or ``None`` when the stream is over."""
        if not self._queue:
            if not self.is_open:
                return None
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(self._wake), timeout)
            except TimeoutError:
                return b""
            finally:
                self._wake = None
            if not self._queue:
                return None if not self.is_open else b""
        chunk = b"".join(self._queue)
        self._queue.clear()
        self.queued_bytes = 0
        wake(self._drain)
        return chunk

    def gone(self) -> None:
        """The client went away."""
        self.open = False
        self._queue.clear()
        self.queued_bytes = 0
        wake(self._wake)
        wake(self._drain)
