"""One WebSocket client as the gateway keeps it: its send queue and how it is written.

A :class:`Connection` is a :class:`~agui_hub.gateway.fanout.channels.Subscriber` of
the hub: every frame for the client (events, snapshots, replies) goes into its
bounded send queue, which is written to the socket at the end of each turn of
the event loop (:class:`PendingFlushes`, :meth:`Connection.flush`), or by the
connection's writer task while the socket is full (:meth:`Connection.write_loop`,
under a watchdog). A client that does not read is closed as a slow consumer
(4000) or dropped when its socket takes nothing. What the client sends goes to
the connection's :class:`~agui_hub.gateway.commands.CommandHandler`.
docs/gateway.md ("Slow consumers") explains the two write paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import deque
from typing import Any, Protocol

from websockets.asyncio import connection as ws_connection
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from ..wire.codec import Encoding
from ..wire.protocol import CloseCode, encode_frame
from .admission import client_address
from .auth import Identity
from .commands import CommandHandler, CommandHost, wake

__all__ = [
    "Connection",
    "ConnectionHost",
    "ConnectionState",
    "PendingFlushes",
    "write_messages",
]

log = logging.getLogger("agui_hub.server")

WRITE_BATCH_BYTES = 256 * 1024
"""Most bytes of queued frames a connection writes before it waits for the socket."""

REPLY_QUEUE_FACTOR = 2
"""A connection whose queue would hold more than this many times its bound is
closed as a slow consumer (4000): it keeps asking for frames it does not read."""


_BATCHED_WRITES = hasattr(ServerConnection, "send_context")

_SENDING_FRAGMENTS = next(
    (
        name
        for name in ("send_in_progress", "fragmented_send_waiter")
        if name in ws_connection.Connection.__init__.__code__.co_names
    ),
    None,
)
"""The websockets connection's attribute that is set while it sends a fragmented
message (websockets 14 and later versions name it differently); ``None``:
unknown, and :meth:`Connection.flush` leaves every write to the writer."""


async def write_messages(ws: ServerConnection, frames: list[bytes | str]) -> None:
    """Send each of *frames* as one message (bytes: binary, str: text), then drain once.

    What ``ws.send`` does for one message, for many: the protocol frames them,
    the data goes to the transport in one write, and the drain waits while
    the socket is over its high-water mark, so flow control still holds.
    ``websockets.broadcast`` uses the same calls. Raises ``ConnectionClosed``
    like ``ws.send``. On a websockets version without these calls, one
    ``ws.send`` per frame: slower, the same on the wire.
    """
    if not _BATCHED_WRITES:
        for frame in frames:
            await ws.send(frame)
        return
    async with ws.send_context():
        _frame_all(ws, frames)


def _frame_all(ws: ServerConnection, frames: list[bytes | str]) -> None:
    """Frame each of *frames* as one message (bytes: binary, str: text) into
    *ws*'s protocol; the caller sends the data (``send_context``, ``send_data``)."""
    protocol = ws.protocol
    for frame in frames:
        if isinstance(frame, str):
            protocol.send_text(frame.encode())
        else:
            protocol.send_binary(frame)


def _send_joined(ws: ServerConnection) -> None:
    """What ``ws.send_data()`` does, in one ``transport.write`` for all the data.

    ``send_data`` writes each frame's bytes on their own: with an empty buffer,
    a system call per frame and connection. Joined, a burst of frames to one
    socket costs one (docs/benchmarks.md has the fan-out before and after).
    The end-of-stream marker (an empty chunk, when the protocol closes) is
    handled as ``send_data`` handles it, after what comes before it.
    """
    chunks = ws.protocol.data_to_send()
    if not chunks:
        return
    transport = ws.transport
    if all(chunks):
        transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        return
    end = chunks.index(b"")
    if end:
        transport.write(b"".join(chunks[:end]))
    # Half-close (or close) as send_data does; nothing follows an end of stream.
    if transport.can_write_eof():
        with contextlib.suppress(Exception):
            transport.write_eof()
    else:
        transport.close()


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class PendingFlushes:
    """The connections that got frames in this turn of the event loop, flushed at its end.

    One callback per turn for every connection: a channel relaying an event
    to its viewers queues a frame on each, and each socket then gets one
    write with all it got in the turn (a burst stays together per socket,
    which costs less than frame by frame across sockets).
    """

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: list[Connection] = []

    def add(self, conn: Connection) -> None:
        """Have *conn*'s queue written at the end of this turn of the event loop."""
        if not self._due:
            asyncio.get_running_loop().call_soon(self._flush)
        self._due.append(conn)

    def _flush(self) -> None:
        conns, self._due = self._due, []
        for conn in conns:
            try:
                conn.flush()
            except Exception:
                # Never the others' flush: this one's writer takes its queue.
                log.exception("connection %s: flush failed", conn.remote)
                wake(conn._wake)


class ConnectionHost(CommandHost, Protocol):
    """What a :class:`Connection` needs of its gateway
    (a :class:`~agui_hub.gateway.server.Gateway`), besides what its commands need."""

    @property
    def write_timeout(self) -> float:
        """Seconds a write may make no progress before the connection is dropped."""
        ...

    @property
    def flushes(self) -> PendingFlushes: ...

    @property
    def chores(self) -> set[asyncio.Future[Any]]:
        """Tasks the gateway's drain waits for (closes under way)."""
        ...


class Connection:
    """One client socket, as the hub sees it (a
    :class:`~agui_hub.gateway.fanout.members.Subscriber`).

    The gateway makes one per WebSocket it admits, calls :meth:`start_clock`
    and runs :meth:`write_loop` in a task, passes each frame it reads to
    :meth:`receive`, and calls :meth:`forget` once the socket is gone.
    """

    # Slots, and futures made only while somebody waits: an idle connection
    # is a few hundred bytes here, on top of what websockets keeps for it.
    __slots__ = (
        "_deadline",
        "_drain",
        "_queue",
        "_queued_bytes",
        "_wake",
        "_watchdog",
        "client",
        "commands",
        "encoding",
        "gateway",
        "identity",
        "remote",
        "state",
        "threads",
        "ws",
    )

    def __init__(
        self,
        gateway: ConnectionHost,
        ws: ServerConnection,
        encoding: Encoding,
        identity: Identity | None,
    ) -> None:
        self.gateway = gateway
        self.ws = ws
        self.encoding = encoding
        self.state = ConnectionState.OPEN
        self.remote = client_address(ws)
        self.identity = identity
        """Who it is (``None``: not yet; only ``auth`` and ``ping`` are answered)."""
        self._deadline: asyncio.TimerHandle | None = None
        """When its credentials expire (or, without any, when it must have sent ``auth``)."""
        self.threads: set[str] = set()
        self.client: dict[str, Any] | None = None
        """What it told others about itself (``auth``'s ``client``; presence)."""
        self._queue: deque[bytes | str] = deque()
        self._queued_bytes = 0
        self._wake: asyncio.Future[None] | None = None
        """Pending while the writer waits for frames."""
        self._watchdog: asyncio.TimerHandle | None = None
        """While a write waits for the socket: the check that it makes progress."""
        self._drain: asyncio.Future[None] | None = None
        """Pending while somebody waits for the queue to fall to half."""
        self.commands = CommandHandler(self, gateway)
        """What it sends: parsed, paced and carried out."""

    @property
    def busy(self) -> bool:
        """Whether it has a subscription or a command under way (so it is not idle)."""
        return bool(self.threads or self.commands.under_way)

    @property
    def queued_bytes(self) -> int:
        """Bytes of frames in its send queue now."""
        return self._queued_bytes

    # Subscriber protocol ------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.state is ConnectionState.OPEN

    def send(self, frame: bytes | str) -> bool:
        """Queue *frame*; ``False`` when the queue is now over its bound.

        The frame is queued either way (a sender that gets ``False`` stops and
        waits for :meth:`drained`), so the queue holds at most its bound plus
        one frame. A frame that arrives while the queue is at most half full
        is always accepted, however large: a snapshot bigger than the bound
        can still be delivered. What is queued goes out at the end of this
        turn of the event loop (:meth:`flush`), or with the writer.
        """
        if self.state is not ConnectionState.OPEN:
            return True  # going away anyway; not a slow consumer
        bound = self.gateway.config.send_queue_bytes
        before = self._queued_bytes
        queue = self._queue
        if not queue:
            # Anything already queued has a flush or the writer coming.
            self.gateway.flushes.add(self)
        queue.append(frame)
        self._queued_bytes = before + len(frame)
        if self._queued_bytes <= bound or before <= bound // 2:
            return True
        if self._queued_bytes > REPLY_QUEUE_FACTOR * bound:
            # Whatever keeps queueing (commands whose replies it does not
            # read, subscribes and their snapshots), the queue stays bounded.
            self.close_soon(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect and resume")
        return False

    def flush(self) -> None:
        """Write the queue to the socket now, if the writer has nothing to wait for.

        Called once per turn of the event loop for the connections that got
        frames in it (:class:`PendingFlushes`). A live thread's steady
        state is one event at a time: waking the writer task for each would
        cost a wake-up, a write and a drain per frame and connection, where
        ``websockets.broadcast`` makes only the write. This is that write,
        with its checks, for everything queued since the last turn: a burst
        still goes to each socket together. While the socket is over its
        high-water mark (or closing) the writer has it, and waits under its
        watchdog; so it has when this write fills the buffer.
        """
        queue = self._queue
        if not queue or self.state is not ConnectionState.OPEN:
            return
        ws = self.ws
        if (
            ws.paused
            or ws.protocol.state is not State.OPEN  # closing: the writer's path waits for it
            or _SENDING_FRAGMENTS is None
            or getattr(ws, _SENDING_FRAGMENTS) is not None
            or ws.transport.is_closing()
            or not _BATCHED_WRITES
        ):
            wake(self._wake)
            return
        frames = self._take()
        try:
            _frame_all(ws, frames)
            _send_joined(ws)
        except Exception:
            # What send_context does with an unexpected error: the connection
            # is done for (the reader sees the close and cleans up). The
            # others flushed in this turn are not held up.
            log.exception("connection %s: write failed", self.remote)
            self.state = ConnectionState.CLOSING
            queue.clear()
            self._queued_bytes = 0
            wake(self._wake)
            wake(self._drain)
            ws.transport.abort()
            return
        if queue or ws.paused:
            wake(self._wake)  # more than a batch, or a full buffer: the writer's

    def has_room(self) -> bool:
        return self._queued_bytes <= self.gateway.config.send_queue_bytes

    async def drained(self) -> None:
        half = self.gateway.config.send_queue_bytes // 2
        while self._queued_bytes > half and self.state is ConnectionState.OPEN:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            # Shielded: a cancelled waiter must not cancel the others' future.
            await asyncio.shield(self._drain)

    def ended(self, thread: str) -> None:
        self.threads.discard(thread)
        self.gateway.presence.leave(self, thread)

    def close_soon(self, code: CloseCode, reason: str) -> None:
        if self.state is ConnectionState.OPEN:
            self.gateway.counters.closes[int(code)] += 1
            self.state = ConnectionState.CLOSING
            self._queue.clear()
            self._queued_bytes = 0
            wake(self._drain)
            wake(self._wake)
            task = asyncio.ensure_future(self.ws.close(int(code), reason))
            chores = self.gateway.chores
            chores.add(task)
            task.add_done_callback(chores.discard)

    # I/O ------------------------------------------------------------------------------------

    async def write_loop(self) -> None:
        """Write the queue whenever a flush leaves it to the writer, until the
        connection closes (run it in a task; cancel it once the reader is done)."""
        try:
            await self._write_all()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("connection %s: writer failed", self.remote)
            self.ws.transport.abort()  # the reader sees the close and cleans up
        finally:
            # However the writer ends (the socket closed, an error), nothing
            # it queued will be sent: whoever waits for the queue wakes now.
            if self.state is ConnectionState.OPEN:
                self.state = ConnectionState.CLOSING
            self._queue.clear()
            self._queued_bytes = 0
            wake(self._drain)

    async def _write_all(self) -> None:
        queue = self._queue
        ws = self.ws
        while self.state is ConnectionState.OPEN:
            # With nothing queued but a buffer that a flush filled, the writer
            # still waits for the socket (an empty batch: a drain), so that a
            # client that stops reading meets the watchdog.
            if not queue and not (ws.paused and _BATCHED_WRITES):
                self._wake = asyncio.get_running_loop().create_future()
                try:
                    await self._wake
                finally:
                    self._wake = None
                continue
            # Everything queued since the last write goes out together (up to
            # WRITE_BATCH_BYTES): events reach a thread's viewers in bursts,
            # and one wake-up, write and drain per burst instead of per frame
            # is most of a fan-out's cost.
            frames = self._take()
            # A watchdog, not a deadline: a large snapshot may take long to a
            # slow reader, but a socket that takes nothing is dropped.
            loop = asyncio.get_running_loop()
            self._watchdog = loop.call_later(self.gateway.write_timeout, self._watch, -1)
            try:
                await write_messages(self.ws, frames)
            except ConnectionClosed:
                return
            finally:
                if self._watchdog is not None:
                    self._watchdog.cancel()
                    self._watchdog = None

    def _take(self) -> list[bytes | str]:
        """The frames of the next write: the queue's first WRITE_BATCH_BYTES (counted as sent)."""
        queue = self._queue
        frames: list[bytes | str] = []
        size = 0
        while queue and size < WRITE_BATCH_BYTES:
            frame = queue.popleft()
            frames.append(frame)
            size += len(frame)
        self._queued_bytes -= size
        counters = self.gateway.counters
        counters.frames_out += len(frames)
        counters.bytes_out += size
        if self._queued_bytes <= self.gateway.config.send_queue_bytes // 2:
            wake(self._drain)
        return frames

    def _watch(self, last: int) -> None:
        """Drop the connection if nothing left its write buffer since the last look."""
        transport = self.ws.transport
        size = transport.get_write_buffer_size()
        if last >= 0 and size > 0 and size >= last:
            # The client stopped reading: its window is full, and even the
            # keepalive ping waits behind it for ever. Drop it; it resumes.
            log.info(
                "connection %s: no write progress in %.1f s, dropped",
                self.remote,
                self.gateway.write_timeout,
            )
            self.gateway.counters.stalled += 1
            self._watchdog = None
            transport.abort()
            return
        self._watchdog = asyncio.get_running_loop().call_later(
            self.gateway.write_timeout, self._watch, size
        )

    def reply(self, frame: dict[str, Any]) -> None:
        if frame["type"] == "error":  # a reply, never an event: not the fan-out path
            self.gateway.counters.errors[frame["code"]] += 1
        self.send(encode_frame(frame, self.encoding))

    async def receive(self, data: bytes | str) -> None:
        """Take one client frame: answer it now, or start its command
        (see :meth:`CommandHandler.receive`). Call it for each frame read, in
        order, one at a time: it returns once the next frame may be read."""
        await self.commands.receive(data)

    # Identity -------------------------------------------------------------------------------

    def start_clock(self) -> None:
        """Arm the deadline of the connection's identity (or of its first ``auth``)."""
        loop = asyncio.get_running_loop()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        identity = self.identity
        if identity is None:
            self._deadline = loop.call_later(
                self.gateway.config.auth_timeout,
                self.close_soon,
                CloseCode.UNAUTHORIZED,
                "no auth in time: connect with a token, or send auth first",
            )
        elif identity.expires is not None:
            left = identity.expires + self.gateway.config.jwt_leeway - time.time()
            self._deadline = loop.call_later(
                max(0.0, left),
                self.close_soon,
                CloseCode.UNAUTHORIZED,
                "token expired: reconnect with a new token (or send auth before it expires)",
            )

    def forget(self) -> None:
        """The socket is gone: leave every thread, cancel the commands under way."""
        self.state = ConnectionState.CLOSED
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        wake(self._wake)
        wake(self._drain)
        for thread in list(self.threads):
            self.gateway.hub.unsubscribe(self, thread)
        self.threads.clear()
        self.gateway.presence.leave_all(self)
        self.commands.cancel()
