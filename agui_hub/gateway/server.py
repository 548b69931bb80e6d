"""The WebSocket gateway: ``agui-hub serve``.

A thin I/O layer over :mod:`agui_hub.wire.protocol` (what frames mean) and
:mod:`agui_hub.gateway.channels` (who gets which event), on the ``websockets`` asyncio
server. Per connection: one task reads and handles commands in order; the
bounded send queue is written to the socket at the end of each turn of the
event loop, or by the connection's writer task while the socket is full.
Plain HTTP on the same port answers ``/healthz`` and ``/readyz``, serves
the viewer page and the browser client (:data:`STATIC_PATHS`), Prometheus
metrics at ``/metrics`` (:mod:`agui_hub.gateway.metrics`) and, for an admin, the
store's threads at ``/admin/threads`` (docs/metrics.md).

Every connection has an :class:`~agui_hub.gateway.auth.Identity` (from its
handshake's token, an ``auth`` command, or anonymous access where that is
on); every subscribe and publish is checked against its grants, and a
subscription ends when its grant does. Connections, commands and events are
counted against the limits of :class:`GatewayConfig`. docs/security.md has
the threat model.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import enum
import hashlib
import http
import json
import logging
import math
import signal
import ssl
import time
from collections import Counter, deque
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.asyncio import connection as ws_connection
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers, MultipleValuesError
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from ..agui.reducer import StateLimits
from ..bridge.runs import UPSTREAM_KEEPALIVE, Bridge, BridgedRun
from ..errors import (
    AguiHubError,
    Forbidden,
    ProtocolError,
    RateLimited,
    StoreError,
    StoreUnavailable,
    Unauthorized,
)
from ..store import open_store
from ..store.contract import ThreadInfo, ThreadStore
from ..store.urls import redact_url
from ..wire.codec import Encoding
from ..wire.offsets import check_thread, offset_key
from ..wire.protocol import (
    SUBPROTOCOLS,
    Auth,
    Cancel,
    CloseCode,
    Command,
    CommandError,
    Ping,
    Position,
    Publish,
    Run,
    Subscribe,
    Unsubscribe,
    authenticated_frame,
    cancelled_frame,
    encode_frame,
    encoding_of,
    error_frame,
    parse_command,
    pong_frame,
    published_frame,
    running_frame,
    unsubscribed_frame,
)
from .auth import (
    ANONYMOUS_SUBJECT,
    Action,
    Anonymous,
    Authenticator,
    Credentials,
    Grants,
    Identity,
    JWTAuthenticator,
    RedactingLogger,
    TokenSource,
    credentials_of,
    scoped_event_id,
)
from .channels import Hub, Phase
from .config import (
    FD_RESERVE,
    HANDSHAKE_HEADROOM,
    SECONDS,
    GatewayConfig,
    build_agents,
    build_authenticator,
    is_loopback,
    limit_key,
    open_file_limit,
    raise_open_file_limit,
    split_list,
)
from .metrics import Figures, GatewayMetrics
from .web import HttpListener

__all__ = ["Gateway", "GatewayConfig", "raise_open_file_limit"]

log = logging.getLogger("agui_hub.server")

STORE_CHECK_TIMEOUT = 2 * SECONDS
"""How long a store check (start-up, ``/readyz``) waits for an answer."""


# -- the viewer page and the browser client ----------------------------------------------------

_JS = "text/javascript; charset=utf-8"
STATIC_PATHS: dict[str, tuple[str, str, bool]] = {
    # path: (file in agui_hub/static, Content-Type, part of the viewer)
    "/": ("index.html", "text/html; charset=utf-8", True),
    "/index.html": ("index.html", "text/html; charset=utf-8", True),
    "/viewer.js": ("viewer.js", _JS, True),
    "/viewer.css": ("viewer.css", "text/css; charset=utf-8", True),
    "/agui-hub.js": ("agui-hub.js", _JS, False),
    # Served for reading, never run: nosniff keeps a browser from taking it for a script.
    "/agui-hub.d.ts": ("agui-hub.d.ts", "text/plain; charset=utf-8", False),
}
"""What the gateway serves over plain HTTP besides ``/healthz`` and ``/readyz``."""

PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self' ws: wss:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The viewer page's Content-Security-Policy: nothing but its own files, and
WebSockets to any gateway (``/?hub=ws://…`` follows another one). Event data
is untrusted: even if some got into the page as markup, it could load and run
nothing."""


@dataclasses.dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes | None
    """``None``: the package was built without this file."""
    name: str
    content_type: str
    etag: str
    shared: bool
    """Importable from pages on other origins (the client, not the viewer)."""


def static_folder() -> Traversable:
    """Where the package keeps the built page and client (``agui_hub/static``)."""
    return resources.files("agui_hub") / "static"


def load_static(viewer: bool) -> dict[str, StaticFile]:
    """The files of :data:`STATIC_PATHS` to serve, read once, by path (without the
    viewer's own with *viewer* off).

    A file missing from the package (a source checkout where ``npm run build``
    never ran) is answered 404 with the reason, rather than failing the start.
    """
    folder = static_folder()
    found: dict[str, StaticFile] = {}
    for path, (name, content_type, of_viewer) in STATIC_PATHS.items():
        if of_viewer and not viewer:
            continue
        try:
            body: bytes | None = (folder / name).read_bytes()
        except OSError:
            body = None
        tag = hashlib.sha256(body).hexdigest()[:32] if body is not None else ""
        found[path] = StaticFile(body, name, content_type, f'"{tag}"', not of_viewer)
    return found


def _etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-None-Match`` value names *etag* (weak comparison, RFC 9110)."""
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate == "*" or candidate.removeprefix("W/") == etag:
            return True
    return False


def _static_response(file: StaticFile, request: Request) -> Response:
    if file.body is None:
        status = http.HTTPStatus.NOT_FOUND
        body = (
            f"agui-hub: this package was built without {file.name} "
            "(run `npm ci && npm run build` in js/ of a source checkout)\n"
        ).encode()
        headers = Headers(
            [
                ("Date", email.utils.formatdate(usegmt=True)),
                ("Connection", "close"),
                ("Content-Length", str(len(body))),
                ("Content-Type", "text/plain; charset=utf-8"),
            ]
        )
        return Response(status.value, status.phrase, headers, body)
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("ETag", file.etag),
            # Revalidated at each load (a 304 costs no body): a gateway upgrade
            # never leaves a page running with the previous version's script.
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        ]
    )
    if file.content_type.startswith("text/html"):
        headers["Content-Security-Policy"] = PAGE_POLICY
    if file.shared:
        # Public code, no credentials: a page on another origin may import it
        # (module scripts are fetched with CORS).
        headers["Access-Control-Allow-Origin"] = "*"
    if _etag_matches(",".join(request.headers.get_all("If-None-Match")), file.etag):
        # No Content-Length: a 304 has no body, and a cache would take a 0 for
        # the length of the file it keeps.
        status = http.HTTPStatus.NOT_MODIFIED
        return Response(status.value, status.phrase, headers, b"")
    status = http.HTTPStatus.OK
    headers["Content-Type"] = file.content_type
    headers["Content-Length"] = str(len(file.body))
    return Response(status.value, status.phrase, headers, file.body)


# -- connections ------------------------------------------------------------------------------


WRITE_BATCH_BYTES = 256 * 1024
"""Most bytes of queued frames a connection writes before it waits for the socket."""

REPLY_QUEUE_FACTOR = 2
"""A connection whose queue would hold more than this many times its bound is
closed as a slow consumer (4000): it keeps asking for frames it does not read."""


FRAME_LIMIT_FACTOR = 4
"""The WebSocket frame limit is this many times ``max_frame_bytes``: a command
between the two is answered ``payload_too_large``, a larger frame closes 1009."""


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


def require_publish(identity: Identity | None, thread: str) -> Identity:
    """*identity*, if it may publish into *thread*; else :class:`~agui_hub.errors.Forbidden`."""
    if identity is None or not identity.allows(Action.PUBLISH, thread):
        raise Forbidden(f"this connection may not publish into thread {thread!r}")
    return identity


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


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


PACE_LIMIT = 1.0
"""Longest a connection over its rates is paced for one frame; a frame that
would have to wait longer is refused with ``rate_limited`` instead.
Publishes are paced however long it takes (a refusal would let the
publishes after it overtake it)."""

MAX_COMMANDS_IN_FLIGHT = 32
"""Commands one connection may have under way at once; its next frame is read
when one of them is done (the client's own backpressure)."""


class Connection:
    """One client socket, as the hub sees it (a :class:`~agui_hub.gateway.channels.Subscriber`).

    Commands run concurrently, each in a task of its own, in order per thread:
    a command about a thread starts when the previous command about the same
    thread is done (a publish behind a publish: once that one is in the
    writer's queue, so that the writer can store them together; its reply
    still comes after the previous one), so publishes to one thread are
    stored and answered in the order sent, and a ``ping`` (or a command about
    another thread) is never stuck behind a slow publish.
    """

    # Slots, and futures made only while somebody waits: an idle connection
    # is a few hundred bytes here, on top of what websockets keeps for it.
    __slots__ = (
        "_auths",
        "_commands",
        "_deadline",
        "_drain",
        "_events",
        "_failed_auths",
        "_lanes",
        "_queue",
        "_queued_bytes",
        "_tasks",
        "_wake",
        "_watchdog",
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
        gateway: Gateway,
        ws: ServerConnection,
        encoding: Encoding,
        identity: Identity | None,
    ) -> None:
        self.gateway = gateway
        self.ws = ws
        self.encoding = encoding
        self.state = ConnectionState.OPEN
        self.remote = _address(ws)
        self.identity = identity
        """Who it is (``None``: not yet; only ``auth`` and ``ping`` are answered)."""
        self._deadline: asyncio.TimerHandle | None = None
        """When its credentials expire (or, without any, when it must have sent ``auth``)."""
        config = gateway.config
        self._commands = RateLimit(config.max_commands_per_second)
        self._events = RateLimit(config.max_events_per_second)
        # A signature check costs ~0.1 ms of CPU: an unauthenticated client
        # gets a handful, not a thousand a second.
        self._auths = RateLimit(AUTHS_PER_SECOND, burst=AUTH_BURST)
        self._failed_auths = 0
        self.threads: set[str] = set()
        self._queue: deque[bytes | str] = deque()
        self._queued_bytes = 0
        self._wake: asyncio.Future[None] | None = None
        """Pending while the writer waits for frames."""
        self._watchdog: asyncio.TimerHandle | None = None
        """While a write waits for the socket: the check that it makes progress."""
        self._drain: asyncio.Future[None] | None = None
        """Pending while somebody waits for the queue to fall to half."""
        self._tasks: set[asyncio.Task[None]] | None = None
        """Commands under way (made on the first command that awaits)."""
        self._lanes: dict[str, tuple[asyncio.Task[None], asyncio.Future[None] | None]] | None = None
        """Per thread, the last command task about it (the next one waits for it)
        and, for a publish, the future resolved once it is in the writer's queue
        (a publish right behind it waits only for that)."""

    @property
    def busy(self) -> bool:
        """Whether it has a subscription or a command under way (so it is not idle)."""
        return bool(self.threads or self._tasks)

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
            self.gateway.flush_soon(self)
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
        frames in it (:meth:`Gateway.flush_soon`). A live thread's steady
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
            _resolve(self._wake)
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
            _resolve(self._wake)
            _resolve(self._drain)
            ws.transport.abort()
            return
        if queue or ws.paused:
            _resolve(self._wake)  # more than a batch, or a full buffer: the writer's

    def has_room(self) -> bool:
        return self._queued_bytes <= self.gateway.config.send_queue_bytes

    async def drained(self) -> None:
        half = self.gateway.config.send_queue_bytes // 2
        while self._queued_bytes > half and self.state is ConnectionState.OPEN:
            if self._drain is None or self._drain.done():
                self._drain = asyncio.get_running_loop().create_future()
            # Shielded: a cancelled waiter must not cancel the others' future.
            await asyncio.shield(self._drain)

    def close_soon(self, code: CloseCode, reason: str) -> None:
        if self.state is ConnectionState.OPEN:
            self.gateway.counters.closes[int(code)] += 1
            self.state = ConnectionState.CLOSING
            self._queue.clear()
            self._queued_bytes = 0
            _resolve(self._drain)
            _resolve(self._wake)
            task = asyncio.ensure_future(self.ws.close(int(code), reason))
            self.gateway._chores.add(task)
            task.add_done_callback(self.gateway._chores.discard)

    # I/O ------------------------------------------------------------------------------------

    async def write_loop(self) -> None:
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
            _resolve(self._drain)

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
            _resolve(self._drain)
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
        """Take one client frame: answer it now, or start its command.

        Returns when the command is started (or answered), not when it is
        done; waits first while :data:`MAX_COMMANDS_IN_FLIGHT` are under way.
        An ``auth`` is carried out before the next frame is read, so the
        commands after it are judged by the identity it gave.
        """
        gateway = self.gateway
        try:
            command = parse_command(data, self.encoding, max_size=gateway.config.max_frame_bytes)
        except CommandError as exc:
            # Malformed frames count too: what a client sends is bounded in
            # the work it causes, not only in its size.
            gateway.counters.command_types[CommandError] += 1
            await self._paced(self._commands, 1)
            self.reply(error_frame(exc.code, str(exc), exc.command_id))
            return
        gateway.counters.commands += 1
        gateway.counters.command_types[type(command)] += 1
        if isinstance(command, Auth):
            # A signature check each: refused past the rate, never paced (and
            # failures are counted towards the close).
            wait = self._commands.take(1) or self._auths.take(1)
        elif isinstance(command, Publish):
            # As much work as its events: a publish counts against the events
            # rate only, so that single-event publishes can be pipelined. Paced
            # however long it takes, never refused: a refusal in the middle of
            # a pipeline would let the publishes after it overtake it.
            wait = await self._paced(self._events, len(command.events), limit=math.inf)
        else:
            wait = await self._paced(self._commands, 1)
        if wait:
            self.reply(self._rate_limited(command, wait))
            return
        if self.state is not ConnectionState.OPEN:
            return  # closed while it was paced
        if isinstance(command, Ping):
            self.reply(pong_frame(command.id))
            return
        if isinstance(command, Auth):
            await self.authenticate(command)
            return
        if self.identity is None:
            if isinstance(command, Publish):
                gateway.counters.publish_errors["unauthorized"] += 1
            self.reply(
                error_frame(
                    "unauthorized",
                    'authenticate first: send {"type": "auth", "token": "<token>"}',
                    command.id,
                    command.thread,
                )
            )
            return
        if self._tasks is None:
            self._tasks = set()
            self._lanes = {}
        assert self._lanes is not None
        while len(self._tasks) >= MAX_COMMANDS_IN_FLIGHT:
            await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        thread = command.thread
        before = self._lanes.get(thread)
        entered = (
            asyncio.get_running_loop().create_future() if isinstance(command, Publish) else None
        )
        task = asyncio.create_task(self._run(command, before, entered))
        self._tasks.add(task)
        self._lanes[thread] = (task, entered)
        task.add_done_callback(self._finished)

    async def _paced(self, bucket: RateLimit, count: int, *, limit: float = PACE_LIMIT) -> float:
        """Wait until *bucket* has *count* tokens and take them: 0.0. Past
        *limit* seconds it does not wait: the seconds it would have waited.

        Pacing, not refusing, keeps a pipelining client's commands in order:
        the connection's next frame is read only once this one is within the
        rates (the client is slowed down by its own socket), where a refusal
        in the middle of a pipeline would let the publishes after it overtake
        it.
        """
        while True:
            wait = bucket.take(count)
            if wait == 0.0 or wait > limit:
                return wait
            await asyncio.sleep(wait)

    def _rate_limited(self, command: Command, wait: float) -> dict[str, Any]:
        config = self.gateway.config
        thread = getattr(command, "thread", None)
        return error_frame(
            "rate_limited",
            f"over this connection's limit of {config.max_commands_per_second:g} commands "
            f"and {config.max_events_per_second:g} published events per second: send it "
            f"again in {wait:.3f} s",
            command.id,
            thread,
            retry_after=wait,
        )

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

    async def authenticate(self, command: Auth) -> None:
        """Carry out an ``auth``: take the token's identity, or say why not."""
        gateway = self.gateway
        try:
            identity = await gateway.authenticator.authenticate(
                Credentials(command.token, TokenSource.FRAME)
            )
            current = self.identity
            if (
                current is not None
                and not current.anonymous
                and (identity.subject != current.subject)
            ):
                raise Forbidden(
                    f"this connection is {current.subject!r}: a new token must be for the "
                    "same subject (open another connection for another one)"
                )
        except AguiHubError as exc:
            code = exc.code if isinstance(exc, Unauthorized | Forbidden) else "unauthorized"
            self.reply(error_frame(code, str(exc), command.id))
            self._failed_auths += 1
            if self._failed_auths >= MAX_FAILED_AUTHS:
                self.close_soon(
                    CloseCode.UNAUTHORIZED,
                    f"{MAX_FAILED_AUTHS} failed auth commands: connect again with a valid token",
                )
            return
        if self.state is not ConnectionState.OPEN:
            return
        self._failed_auths = 0
        self.identity = identity
        self.start_clock()
        self.reply(
            authenticated_frame(
                command.id,
                identity.subject,
                identity.expires,
                identity.grants.as_json(),
            )
        )
        self.drop_ungranted()

    def drop_ungranted(self) -> None:
        """End the subscriptions the connection's identity no longer grants."""
        identity = self.identity
        for thread in list(self.threads):
            if identity is None or not identity.allows(Action.SUBSCRIBE, thread):
                self.gateway.hub.unsubscribe(self, thread)
                self.threads.discard(thread)
                self.reply(
                    error_frame(
                        "forbidden",
                        f"subscription to thread {thread!r} ended: this connection's "
                        "credentials no longer grant it",
                        None,
                        thread,
                    )
                )

    def _finished(self, task: asyncio.Task[None]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
        if self._lanes is not None:
            for thread, (last, _entered) in list(self._lanes.items()):
                if last is task:
                    del self._lanes[thread]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, StoreUnavailable):
                self.close_soon(CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
            else:
                log.error("connection %s: command failed", self.remote, exc_info=exc)
                self.close_soon(CloseCode.INTERNAL_ERROR, "internal error, resume")

    async def _run(
        self,
        command: Command,
        before: tuple[asyncio.Task[None], asyncio.Future[None] | None] | None,
        entered: asyncio.Future[None] | None,
    ) -> None:
        after = None
        try:
            if before is not None:
                previous, queued = before
                if entered is not None and queued is not None:
                    # A publish behind a publish: once that one is in the writer's
                    # queue this one may join it there (the writer stores what
                    # queued up together, in queue order), and replies after it.
                    after = previous
                    if not queued.done():
                        await asyncio.wait([queued])
                else:
                    # In order per thread; how the one before ended is its own business.
                    await asyncio.wait([previous])
            if self.state is ConnectionState.OPEN:
                await self.handle(command, entered, after)
        finally:
            _resolve(entered)

    def _allowed(self, action: Action, thread: str) -> bool:
        identity = self.identity
        return identity is not None and identity.allows(action, thread)

    async def handle(
        self,
        command: Command,
        entered: asyncio.Future[None] | None = None,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        """Carry out one parsed command. Errors become error frames.

        For a publish, *entered* is resolved once its events are in the
        writer's queue, and its reply waits until *after* (the publish before
        it on the thread) is done: replies keep the order of the commands.
        """
        gateway = self.gateway
        command_id = command.id
        thread = None
        try:
            if isinstance(command, Ping):
                self.reply(pong_frame(command.id))
            elif isinstance(command, Auth):
                await self.authenticate(command)
            elif isinstance(command, Subscribe):
                thread = command.thread
                await self._subscribe(command)
            elif isinstance(command, Unsubscribe):
                thread = command.thread
                if gateway.hub.unsubscribe(self, command.thread):
                    self.threads.discard(command.thread)
                    self.reply(unsubscribed_frame(command.id, command.thread))
                else:
                    self.reply(
                        error_frame(
                            "not_subscribed",
                            f"not subscribed to thread {command.thread!r}",
                            command.id,
                            command.thread,
                        )
                    )
            elif isinstance(command, Publish):
                thread = command.thread
                identity = require_publish(self.identity, thread)
                ids = command.event_ids
                if ids is not None:
                    ids = [scoped_event_id(identity, i) for i in ids]
                # The writer queues the events before it first awaits, and the
                # next publish cannot run before this task awaits: resolved
                # now, that one still queues behind this one.
                _resolve(entered)
                offsets = await gateway.hub.publish(thread, command.events, ids)
                gateway.counters.events_in += len(offsets)
                if after is not None and not after.done():
                    await asyncio.wait([after])
                self.reply(published_frame(command.id, thread, offsets))
            elif isinstance(command, Run):
                thread = command.thread
                run = await gateway.start_run(self.identity, command)
                self.reply(running_frame(command.id, run.as_json()))
            elif isinstance(command, Cancel):
                thread = command.thread
                if command.abandoned:
                    run_id = await gateway.end_abandoned_run(self.identity, thread, command.run_id)
                    record = {"thread": thread, "runId": run_id, "status": "ended"}
                    self.reply(cancelled_frame(command.id, record))
                else:
                    run = gateway.cancel_run(self.identity, thread, command.run_id)
                    await run.done.wait()
                    self.reply(cancelled_frame(command.id, run.as_json()))
        except AguiHubError as exc:
            if isinstance(command, Publish):
                gateway.counters.publish_errors[exc.code] += 1
            index = exc.index if isinstance(exc, ProtocolError) else None
            retry = exc.retry_after if isinstance(exc, RateLimited) else None
            if after is not None and not after.done():
                await asyncio.wait([after])
            self.reply(error_frame(exc.code, str(exc), command_id, thread, index,
                                   retry_after=retry))  # fmt: skip

    async def _subscribe(self, command: Subscribe) -> None:
        gateway = self.gateway
        thread = command.thread
        if thread in self.threads:
            # Subscribing again restarts the subscription from the new position.
            gateway.hub.unsubscribe(self, thread)
            self.threads.discard(thread)
        if not self._allowed(Action.SUBSCRIBE, thread):
            raise Forbidden(f"this connection may not read thread {thread!r}")
        if len(self.threads) >= gateway.config.max_subscriptions:
            self.reply(self._too_many(command.id, thread))
            return
        self.threads.add(thread)
        try:
            recovered = await gateway.hub.subscribe(
                self, thread, command.id, command.start, command.run
            )
        except BaseException:
            self.threads.discard(thread)
            gateway.hub.unsubscribe(self, thread)
            raise
        if (
            isinstance(command.start, Position)
            and self.state is ConnectionState.OPEN
            and thread in self.threads
        ):
            # A client resuming (and still here): did it get every event after its position?
            if recovered:
                gateway.counters.resumes_complete += 1
            else:
                gateway.counters.resumes_incomplete += 1
        if self.state is not ConnectionState.OPEN:
            # Gone while it subscribed: forget() ran before the thread was ours.
            gateway.hub.unsubscribe(self, thread)
            self.threads.discard(thread)
        elif thread not in self.threads:
            # An auth took the grant away while it subscribed, and was told so
            # (drop_ungranted) before the hub had the member: remove it now.
            gateway.hub.unsubscribe(self, thread)
        elif not self._allowed(Action.SUBSCRIBE, thread):
            self.drop_ungranted()

    def _too_many(self, command_id: Any, thread: str) -> dict[str, Any]:
        limit = self.gateway.config.max_subscriptions
        return error_frame(
            "too_many_subscriptions",
            f"at most {limit} subscriptions per connection",
            command_id,
            thread,
        )

    def forget(self) -> None:
        self.state = ConnectionState.CLOSED
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        _resolve(self._wake)
        _resolve(self._drain)
        for thread in list(self.threads):
            self.gateway.hub.unsubscribe(self, thread)
        self.threads.clear()
        if self._tasks:
            for task in list(self._tasks):
                task.cancel()


AUTHS_PER_SECOND = 0.5
"""``auth`` commands a connection may send per second, after a burst of AUTH_BURST."""

AUTH_BURST = 5.0

MAX_FAILED_AUTHS = 3
"""Failed ``auth`` commands in a row after which a connection is closed (4401)."""


class RateLimit:
    """A token bucket: *rate* per second, a burst of *burst* (default: one second's worth).

    A request larger than the bucket (a publish of many events under a low
    limit) is let through when the bucket is not empty and leaves it in
    debt, so the average rate still holds and no request is refused for ever.
    """

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, *, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = rate if burst is None else burst
        self._tokens = self.burst
        self._at = time.monotonic()

    def take(self, count: int) -> float:
        """Take *count* tokens: 0.0, or the seconds to wait before there are some."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens <= 0:
            return max(0.001, -self._tokens / self.rate + 1 / self.rate)
        self._tokens -= count
        return 0.0


def _address(ws: ServerConnection) -> str:
    """The client's address as the per-address limit counts it (see :func:`limit_key`)."""
    remote = ws.remote_address
    return limit_key(str(remote[0]) if isinstance(remote, tuple) and remote else str(remote))


# -- the gateway ------------------------------------------------------------------------------


class _Socket(ServerConnection):
    """A client socket, counted from the moment it is accepted until it is gone.

    The counts keep the gateway under its open-file limit whatever clients
    do: past ``max_connections + HANDSHAKE_HEADROOM`` sockets, the oldest one
    that has not sent its request yet is dropped to make room (sockets that
    connect and say nothing cannot lock out a health check), or the new one
    when all are busy; every admitted WebSocket is released here, however it
    ends.
    """

    gateway: Gateway
    admitted: str | None = None
    """The client address this socket was admitted as a WebSocket for."""
    identity: Identity | None = None
    """What its handshake's credentials proved."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        gateway = self.gateway
        gateway.sockets += 1
        gateway.silent[self] = None
        if gateway.sockets > gateway.socket_cap:
            # No descriptor to spare for even a refusal: drop the socket that
            # has been silent longest (maybe this one).
            gateway.refused_sockets += 1
            victim = next(iter(gateway.silent))
            del gateway.silent[victim]
            victim.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        gateway = self.gateway
        gateway.sockets -= 1
        gateway.silent.pop(self, None)
        gateway.release(self)
        super().connection_lost(exc)


class Gateway:
    """The WebSocket gateway: a hub over a store, served on one port.

    *authenticator* replaces the one the configuration describes (see
    :class:`~agui_hub.gateway.auth.Authenticator`).
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        store: ThreadStore | None = None,
        authenticator: Authenticator | None = None,
    ) -> None:
        self.config = config
        self.authenticator: Authenticator = (
            authenticator if authenticator is not None else build_authenticator(config)
        )
        self._custom_auth = authenticator is not None
        self.allowed_origins = {o.rstrip("/").lower() for o in split_list(config.allowed_origins)}
        if config.jwt_cookie and (not self.allowed_origins or "*" in self.allowed_origins):
            raise ValueError(
                "a token in a cookie is sent by the browser from any page: list the origins "
                "allowed to connect (allowed_origins), not '*'"
            )
        self.store = store if store is not None else open_store(config.store or None)
        self.store_name = (
            redact_url(config.store)
            if config.store
            else (repr(store) if store is not None else "memory://")
        )
        self.metrics = GatewayMetrics(self.figures) if config.metrics else None
        """The ``/metrics`` registry (``None``: the ``metrics`` setting is off)."""
        self.hub = Hub(
            # The hub's store calls are timed at this seam (the store modules know nothing of it).
            self.metrics.timed(self.store) if self.metrics is not None else self.store,
            limits=StateLimits(max_depth=config.state_max_depth, max_bytes=config.state_max_bytes),
            max_event_bytes=config.max_event_bytes,
        )
        self.bridge = Bridge(
            self.hub,
            build_agents(config),
            max_runs=config.max_runs,
            max_event_bytes=config.max_event_bytes,
        )
        """Runs of upstream AG-UI agents (docs/bridge.md)."""
        self.http: HttpListener | None = None
        """The HTTP listener (``http_port``): SSE streams and ``POST /agents/<name>``."""
        self.http_connections = config.max_connections
        """Connections the HTTP listener takes (fitted to the open-file limit at start)."""
        self.connections: set[Connection] = set()
        self.server: Server | None = None
        self._chores: set[asyncio.Future[Any]] = set()
        self._draining = False
        self.store_problem: str | None = None
        """Why the store is not usable now (``None``: it answered the last check)."""
        self.store_warnings: list[str] = []
        """What the store's settings put at risk (see docs/store.md)."""
        self._store_watch: asyncio.Task[None] | None = None
        self._auth_watch: asyncio.Task[None] | None = None
        self.write_timeout: float = config.write_timeout or config.ping_timeout or 20 * SECONDS
        self.max_connections = config.max_connections
        """``config.max_connections``, lowered at start to fit the open-file limit."""
        self.sockets = 0
        """Open client sockets (handshakes, health checks, WebSockets)."""
        self.socket_cap = self.max_connections + HANDSHAKE_HEADROOM
        self.admitted = 0
        """WebSocket connections admitted (handshake accepted) and not yet gone."""
        self.per_address: Counter[str] = Counter()
        self.silent: dict[_Socket, None] = {}
        """Sockets that have not sent their HTTP request yet, oldest first."""
        self.refused_sockets = 0
        """Sockets dropped at once because the gateway had no room for them."""
        self.backlog = MAX_BACKLOG
        """The listen backlog: also how many sockets asyncio accepts in one go."""
        self.counters = Counters()
        """What the gateway did since it started (the minute's summary line)."""
        self._summary: asyncio.Task[None] | None = None
        self._loop_watch: asyncio.Task[None] | None = None
        self._store_checked_at = -math.inf
        """When the store was last checked (monotonic); a scrape checks it again after
        METRICS_STORE_CHECK."""
        self._unflushed: list[Connection] = []
        """Connections that got frames in this turn of the event loop, to flush at its end."""
        self.static = load_static(config.viewer)
        """The files served over plain HTTP, by path (read once)."""

    # Delivery ----------------------------------------------------------------------------------

    def flush_soon(self, conn: Connection) -> None:
        """Have *conn*'s queue written at the end of this turn of the event loop.

        One callback per turn for every connection: a channel relaying an
        event to its viewers queues a frame on each, and each socket then
        gets one write with all it got in the turn (a burst stays together
        per socket, which costs less than frame by frame across sockets).
        """
        if not self._unflushed:
            asyncio.get_running_loop().call_soon(self._flush)
        self._unflushed.append(conn)

    def _flush(self) -> None:
        conns, self._unflushed = self._unflushed, []
        for conn in conns:
            try:
                conn.flush()
            except Exception:
                # Never the others' flush: this one's writer takes its queue.
                log.exception("connection %s: flush failed", conn.remote)
                _resolve(conn._wake)

    # Admission ---------------------------------------------------------------------------------

    def release(self, socket: _Socket) -> None:
        address = socket.admitted
        if address is not None:
            socket.admitted = None
            self.admitted -= 1
            left = self.per_address[address] - 1
            if left > 0:
                self.per_address[address] = left
            else:
                del self.per_address[address]

    def origin_allowed(self, headers: Headers) -> bool:
        """Whether a request with these headers comes from no browser, or from an origin
        that may call (``allowed_origins``, or a page of the gateway's own loopback address)."""
        origins = headers.get_all("Origin")
        if not origins:
            return True  # not a browser: an Origin protects browsers' ambient credentials
        if len(origins) > 1:
            return False
        origin = origins[0].strip().rstrip("/").lower()
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        # A page from the gateway's own loopback address (the viewer it serves
        # on a developer's machine). Only by address: any other Host a browser
        # sends is a name the page's author controls (DNS rebinding).
        hosts = headers.get_all("Host")
        parts = urlsplit(origin)
        return (
            len(hosts) == 1
            and parts.scheme in {"http", "https"}
            and parts.netloc == hosts[0].strip().lower()
            and is_loopback(parts.hostname or "")
        )

    def _refuse(
        self,
        ws: ServerConnection,
        status: http.HTTPStatus,
        text: str,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        self.counters.refusals[status.value] += 1
        response = ws.respond(status, f"agui-hub: {text}\n")
        for name, value in (headers or {}).items():
            response.headers[name] = value
        return response

    async def _admit(self, ws: _Socket, request: Request) -> Response | None:
        """Decide on a WebSocket handshake: ``None`` admits it, a response refuses it."""
        config = self.config
        if not self.origin_allowed(request.headers):
            log.info(
                "connection from %s refused: origin %r is not allowed",
                _address(ws),
                request.headers.get("Origin"),
            )
            return self._refuse(
                ws,
                http.HTTPStatus.FORBIDDEN,
                f"origin {request.headers.get('Origin')!r} is not allowed to connect "
                "(see allowed_origins in docs/security.md)",
            )
        if self.admitted >= self.max_connections:
            return self._refuse(
                ws,
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"this gateway is full ({self.max_connections} connections): retry later, "
                "or another gateway",
                {"Retry-After": "5"},
            )
        address = _address(ws)
        if self.per_address[address] >= config.max_connections_per_address:
            return self._refuse(
                ws,
                http.HTTPStatus.TOO_MANY_REQUESTS,
                f"too many connections from {address} "
                f"(at most {config.max_connections_per_address})",
                {"Retry-After": "5"},
            )
        # Counted before the authenticator is awaited, so that handshakes
        # arriving meanwhile see it: the limits hold however slow it is.
        ws.admitted = address
        self.admitted += 1
        self.per_address[address] += 1
        try:
            credentials = credentials_of(request.path, request.headers, cookie=config.jwt_cookie)
            if credentials is None:
                identity = self.authenticator.anonymous
                # No identity yet: a JWT gateway waits for an auth command.
            else:
                identity = await self.authenticator.authenticate(credentials)
        except Forbidden as exc:
            self.release(ws)
            log.info("connection from %s refused: %s", address, exc)
            return self._refuse(ws, http.HTTPStatus.FORBIDDEN, str(exc))
        except Unauthorized as exc:
            self.release(ws)
            log.info("connection from %s refused: %s", address, exc)
            return self._refuse(
                ws,
                http.HTTPStatus.UNAUTHORIZED,
                str(exc),
                # The reason is in the body; the header stays fixed (it would
                # otherwise quote what the client sent, e.g. a key id).
                {"WWW-Authenticate": 'Bearer error="invalid_token"'},
            )
        except BaseException:
            self.release(ws)
            raise
        ws.identity = identity
        return None

    # The bridge ----------------------------------------------------------------------------------

    def check_run_grant(self, identity: Identity | None, agent: str, thread: str) -> None:
        """Raise :class:`~agui_hub.errors.Forbidden` unless *identity* may run *agent*
        in *thread* (publish into the thread, and a run grant covering the agent)."""
        identity = require_publish(identity, thread)
        if not identity.grants.may_run(agent):
            raise Forbidden(f"this connection may not run agent {agent!r} (its run grant)")

    async def start_run(self, identity: Identity | None, command: Run) -> BridgedRun:
        """Start the run a ``run`` command asks for (see :meth:`Bridge.start`)."""
        self.check_run_grant(identity, command.agent, command.thread)
        assert identity is not None  # checked above
        return await self.bridge.start(
            command.agent,
            command.thread,
            subject=identity.subject,
            messages=command.messages,
            state=command.state,
            tools=command.tools,
            context=command.context,
            forwarded_props=command.forwarded_props,
            run_id=command.run_id,
        )

    def cancel_run(self, identity: Identity | None, thread: str, run_id: str | None) -> BridgedRun:
        """Cancel the bridged run in *thread*: for identities that may publish into it."""
        identity = require_publish(identity, thread)
        return self.bridge.cancel(thread, by=identity.subject, run_id=run_id)

    async def end_abandoned_run(
        self, identity: Identity | None, thread: str, run_id: str | None
    ) -> str:
        """End the run *thread* holds open that no gateway relays (see
        :meth:`Bridge.end_abandoned`): for identities that may publish into it."""
        identity = require_publish(identity, thread)
        return await self.bridge.end_abandoned(thread, by=identity.subject, run_id=run_id)

    # The store ---------------------------------------------------------------------------------

    async def check_store(self) -> bool:
        """Ping the store and read its settings; remember why it is not usable."""
        self._store_checked_at = time.monotonic()
        try:
            await asyncio.wait_for(self.store.ping(), STORE_CHECK_TIMEOUT)
            self.store_warnings = await asyncio.wait_for(
                self.store.durability_warnings(), STORE_CHECK_TIMEOUT
            )
        except (AguiHubError, TimeoutError, OSError) as exc:
            # The store's messages name it by its redacted URL: no password here.
            self.store_problem = str(exc) or "no answer in time"
            return False
        self.store_problem = None
        return True

    async def _watch_store(self) -> None:
        """Until the store answers: retry, and say so once it does."""
        delay = 0.5 * SECONDS
        while not await self.check_store():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10 * SECONDS)
        log.info("store %s is available", self.store_name)
        for warning in self.store_warnings:
            log.warning("store %s: %s", self.store_name, warning)

    # Credentials over time ------------------------------------------------------------------

    def check_revocations(self) -> int:
        """Re-read the key and revocation files; close revoked connections (4403).

        Returns how many were closed. Runs every few seconds; call it after
        changing a file to act at once.
        """
        try:
            self.authenticator.reload()
        except ValueError as exc:
            log.error("authentication files: %s (keeping the previous ones)", exc)
        closed = 0
        for conn in list(self.connections):
            identity = conn.identity
            if identity is not None and self.authenticator.revoked(identity):
                log.info("connection %s: credentials of %r revoked", conn.remote,
                         identity.subject)  # fmt: skip
                conn.close_soon(CloseCode.FORBIDDEN, "credentials revoked")
                closed += 1
        if self.http is not None:
            for stream in list(self.http.app.streams):
                identity = stream.identity
                if identity is not None and self.authenticator.revoked(identity):
                    log.info("SSE stream of thread %s: credentials of %r revoked",
                             stream.thread, identity.subject)  # fmt: skip
                    stream.close_soon(CloseCode.FORBIDDEN, "the token was revoked")
                    closed += 1
        return closed

    async def _watch_credentials(self) -> None:
        while True:
            await asyncio.sleep(AUTH_FILES_INTERVAL)
            try:
                self.check_revocations()
            except Exception:  # never let a bad file end the watch
                log.exception("checking revocations failed")

    async def _summarize(self) -> None:
        """One INFO line per interval: connections, threads, traffic (when there is any)."""
        last = dataclasses.replace(self.counters)
        while True:
            await asyncio.sleep(SUMMARY_INTERVAL)
            now = dataclasses.replace(self.counters)
            if now == last and not self.connections:
                continue  # idle: nothing to say
            log.info(
                "last %.0f s: %d connections (%d opened, %d closed), %d live threads; "
                "%d commands, %d events published, %d frames (%.1f MiB) sent",
                SUMMARY_INTERVAL,
                len(self.connections),
                now.opened - last.opened,
                now.closed - last.closed,
                len(self.hub.channels),
                now.commands - last.commands,
                now.events_in - last.events_in,
                now.frames_out - last.frames_out,
                (now.bytes_out - last.bytes_out) / (1024 * 1024),
            )
            last = now

    # Metrics ---------------------------------------------------------------------------------

    @property
    def _unauthenticated(self) -> bool:
        """Whether nobody authenticates here (every connection is anonymous)."""
        return isinstance(self.authenticator, Anonymous)

    def figures(self) -> Figures:
        """What ``/metrics`` reports now (docs/metrics.md), read from the counters and
        the state the gateway keeps anyway: one pass over the connections and the
        live threads' subscribers, nothing computed per frame."""
        counters = self.counters
        encodings: Counter[str] = Counter()
        queued = 0
        for conn in self.connections:
            encodings[conn.encoding.value] += 1
            queued += conn._queued_bytes
        subscriptions = catching_up = 0
        for channel in self.hub.channels.values():
            subscriptions += len(channel.members)
            for member in channel.members.values():
                if member.phase is Phase.CATCHING_UP:
                    catching_up += 1
        backlog, lag = self._live_backlog()
        closes = counters.closes
        return Figures(
            connections=encodings,
            connections_limit=self.max_connections,
            connections_opened=counters.opened,
            connections_closed=counters.closed,
            closes=dict(closes),
            slow_consumers={
                "queue": closes[CloseCode.SLOW_CONSUMER.value],
                "stalled": counters.stalled,
            },
            refusals=dict(counters.refusals),
            sockets_dropped=self.refused_sockets,
            subscriptions=subscriptions,
            catching_up=catching_up,
            live_threads=len(self.hub.channels),
            resumes={
                "complete": counters.resumes_complete,
                "incomplete": counters.resumes_incomplete,
            },
            frames_sent=counters.frames_out,
            bytes_sent=counters.bytes_out,
            send_queue_bytes=queued,
            commands={COMMAND_NAMES[kind]: n for kind, n in counters.command_types.items()},
            errors=dict(counters.errors),
            events_published=counters.events_in,
            publish_errors=dict(counters.publish_errors),
            live_backlog_entries=backlog,
            live_lag_seconds=lag,
            recent_bytes=self.hub.recent_bytes,
            store_up=self.store_problem is None,
            bridge_runs=len(self.bridge.runs),
            bridge_runs_started=self.bridge.started_total,
            bridge_runs_ended=dict(self.bridge.ended),
            sse_streams=len(self.http.app.streams) if self.http is not None else 0,
        )

    def _live_backlog(self) -> tuple[int, float]:
        """(entries, seconds): what the live threads' store feeds hold that their
        channels have not relayed yet, and how long ago the oldest of it was stored.

        The channel's feed is where the store's live reader puts new entries and
        the channel takes them from: entries pile up there only when the
        gateway falls behind the store. An offset is the store's clock at the
        append (milliseconds), so the age is measured against this machine's
        clock: skew between the two shows as lag (or hides it).
        """
        entries = 0
        oldest: int | None = None
        for channel in self.hub.channels.values():
            waiting, first = channel.backlog()
            if first is not None:
                entries += waiting
                stored = offset_key(first)[0]
                oldest = stored if oldest is None else min(oldest, stored)
        if oldest is None:
            return entries, 0.0
        return entries, max(0.0, time.time() - oldest / 1000)

    # HTTP side -------------------------------------------------------------------------------

    async def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        self.silent.pop(ws, None)  # type: ignore[call-overload]
        # websockets < 15 refuses other methods than GET while parsing the request.
        method = getattr(request, "method", "GET")
        path = request.path.split("?", 1)[0]
        operator = path == METRICS_PATH or path.startswith(ADMIN_PREFIX)
        if method not in ("GET", "HEAD") and not operator:
            return self._method_not_allowed(ws, method)
        try:
            if operator:
                response: Response | None = await self._operator(ws, request, method, path)
            else:
                response = await self._answer(ws, request)
        except MultipleValuesError as exc:
            # Two Authorization, Origin or Host headers: ambiguous, refused.
            return ws.respond(
                http.HTTPStatus.BAD_REQUEST, f"agui-hub: the header {exc} appears more than once\n"
            )
        if method == "HEAD" and response is not None:
            # The headers of the GET (its Content-Length too), without the body.
            response = dataclasses.replace(response, body=b"")
        return response

    @staticmethod
    def _method_not_allowed(ws: ServerConnection, method: str) -> Response:
        return _Refusal(
            http.HTTPStatus.METHOD_NOT_ALLOWED,
            "method_not_allowed",
            f"{method} is not served here: GET (or HEAD) a page, or open a "
            "WebSocket (a GET with Upgrade: websocket)",
            {"Allow": "GET, HEAD"},
        ).response(ws, as_json=False)

    # Operator endpoints: /metrics and /admin/ (docs/metrics.md) -------------------------------

    async def _operator(
        self, ws: ServerConnection, request: Request, method: str, path: str
    ) -> Response:
        """Answer ``/metrics`` or an admin request; a refusal says why (text for
        ``/metrics``, JSON for ``/admin/``), never with a traceback."""
        try:
            if path == METRICS_PATH:
                return await self._serve_metrics(request, method)
            return await self._serve_admin(request, method, path)
        except _Refusal as refusal:
            if refusal.status in (http.HTTPStatus.UNAUTHORIZED, http.HTTPStatus.FORBIDDEN):
                log.info("%s %s from %s refused: %s", method, path, _address(ws), refusal)
            return refusal.response(ws, as_json=path != METRICS_PATH)

    async def _serve_metrics(self, request: Request, method: str) -> Response:
        if method not in ("GET", "HEAD"):
            raise _Refusal.method(method, METRICS_PATH, ("GET", "HEAD"))
        if self.metrics is None:
            raise _Refusal(
                http.HTTPStatus.NOT_FOUND,
                "not_found",
                "metrics are off on this gateway (the metrics setting)",
            )
        if not (self.config.metrics_public or self._unauthenticated):
            await self._admin_subject(request, METRICS_PATH)
        if time.monotonic() - self._store_checked_at >= METRICS_STORE_CHECK:
            # agui_hub_store_up must not wait for a /readyz probe that may never come
            # (compose, systemd): a scrape checks the store itself, at most this often.
            await self.check_store()
        body, content_type = self.metrics.exposition(request.headers.get("Accept"))
        return _body_response(http.HTTPStatus.OK, body, content_type)

    async def _serve_admin(self, request: Request, method: str, path: str) -> Response:
        if path == ADMIN_THREADS:
            allowed: tuple[str, ...] = ("GET", "HEAD")
        elif path.startswith(ADMIN_THREADS + "/"):
            allowed = ("GET", "HEAD", "DELETE")
        else:
            raise _Refusal(
                http.HTTPStatus.NOT_FOUND,
                "not_found",
                f"nothing at {path}: GET {ADMIN_THREADS} lists the threads, "
                f"{ADMIN_THREADS}/<thread> shows one (docs/metrics.md)",
            )
        if method not in allowed:
            raise _Refusal.method(method, path, allowed)
        subject = await self._admin_access(request)
        try:
            if path == ADMIN_THREADS:
                return _json_response(http.HTTPStatus.OK, await self._thread_list(request.path))
            thread = _admin_thread(path)
            if method == "DELETE":
                return await self._delete_thread(thread, subject)
            info = await self.hub.store.info(thread)
            if info is None:
                raise _Refusal(
                    http.HTTPStatus.NOT_FOUND, "not_found", f"no thread {thread!r} in the store"
                )
            return _json_response(http.HTTPStatus.OK, self._thread_record(info))
        except StoreError as exc:
            # The store's messages name it by its redacted URL: no password here.
            raise _Refusal(
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                exc.code,
                f"the store did not answer: {exc}",
                {"Retry-After": "5"},
            ) from None

    async def _admin_access(self, request: Request) -> str:
        """Who makes an admin request (its token's subject); :class:`_Refusal` unless
        it may: a token with the admin grant, or ``admin_anonymous`` on a gateway
        without authentication (which the configuration allows on loopback only)."""
        if not self._unauthenticated:
            return await self._admin_subject(request, "the admin endpoints")
        if self.config.admin_anonymous:
            # No token stands for the caller: only what runs on this machine may ask,
            # and a web page it has open must not. A page of another name that
            # resolves here (DNS rebinding) sends that name as Host, and a page of
            # another origin sends its Origin.
            hosts = request.headers.get_all("Host")
            host = urlsplit(f"//{hosts[0].strip()}").hostname if len(hosts) == 1 else None
            if host is None or not (host == "localhost" or is_loopback(host)):
                raise _Refusal(
                    http.HTTPStatus.FORBIDDEN,
                    "forbidden",
                    "admin_anonymous serves requests to a loopback address only "
                    "(Host: 127.0.0.1:PORT, [::1]:PORT or localhost:PORT)",
                )
            if request.headers.get_all("Origin") and not self.origin_allowed(request.headers):
                raise _Refusal(
                    http.HTTPStatus.FORBIDDEN,
                    "forbidden",
                    "a web page of another origin may not use the admin endpoints",
                )
            return ANONYMOUS_SUBJECT
        raise _Refusal(
            http.HTTPStatus.FORBIDDEN,
            "forbidden",
            "the admin endpoints are off: this gateway has no authentication. On a loopback "
            "host, admin_anonymous serves them without a token; elsewhere configure JWT and "
            "use a token with the admin grant (docs/metrics.md)",
        )

    async def _admin_subject(self, request: Request, what: str) -> str:
        """The subject of the request's bearer token if it grants admin; else
        :class:`_Refusal` (401 without a valid token, 403 without the grant).

        Only the ``Authorization`` header counts: a token in the query would
        end up in access logs, and a cookie is sent by any page's request.
        """
        header = request.headers.get("Authorization")
        if header is None:
            raise _Refusal(
                http.HTTPStatus.UNAUTHORIZED,
                "unauthorized",
                f"{what} need a token with the admin grant: send it as "
                "Authorization: Bearer <token>",
                {"WWW-Authenticate": 'Bearer realm="agui-hub"'},
            )
        try:
            credentials = credentials_of("/", {"Authorization": header})
            if credentials is None:
                raise Unauthorized("no token")
            identity = await self.authenticator.authenticate(credentials)
        except Forbidden as exc:
            raise _Refusal(http.HTTPStatus.FORBIDDEN, "forbidden", str(exc)) from None
        except AguiHubError as exc:
            raise _Refusal(
                http.HTTPStatus.UNAUTHORIZED,
                "unauthorized",
                str(exc),
                {"WWW-Authenticate": 'Bearer error="invalid_token"'},
            ) from None
        if not identity.grants.admin:
            raise _Refusal(
                http.HTTPStatus.FORBIDDEN,
                "forbidden",
                f"the token of {identity.subject!r} does not grant admin: {what} need a "
                'token whose grants claim holds "admin": true (docs/metrics.md)',
            )
        return identity.subject

    async def _thread_list(self, target: str) -> dict[str, Any]:
        """``GET /admin/threads``: at most ``limit`` threads of the store, the most
        recently active first, and whether the store holds more."""
        limit = _limit_of(target)
        store = self.hub.store
        names = await store.threads(limit + 1)
        truncated = len(names) > limit
        names = names[:limit]
        infos: list[ThreadInfo] = []
        for begin in range(0, len(names), ADMIN_INFO_CONCURRENCY):
            chunk = names[begin : begin + ADMIN_INFO_CONCURRENCY]
            found = await asyncio.gather(
                *(_info_of(store, name) for name in chunk), return_exceptions=True
            )
            for item in found:
                if isinstance(item, BaseException):
                    raise item
                if item is not None:
                    infos.append(item)
        infos.sort(key=lambda info: (-(info.last_activity or -1), info.thread))
        return {
            "threads": [self._thread_record(info) for info in infos],
            "limit": limit,
            "truncated": truncated,
        }

    def _thread_record(self, info: ThreadInfo) -> dict[str, Any]:
        """*info* as JSON (the fields of ``agui-hub info --json``), with the
        thread's subscribers on this gateway."""
        channel = self.hub.channels.get(info.thread)
        return {
            **info.as_json(),
            "ttl": round(info.ttl, 3) if info.ttl is not None else None,
            "subscribers": len(channel.members) if channel is not None else 0,
        }

    async def _delete_thread(self, thread: str, subject: str) -> Response:
        """``DELETE /admin/threads/<thread>``: the thread, its events, ids and
        checkpoint; its viewers (on every gateway) are told by the store."""
        if not await self.hub.store.delete(thread):
            raise _Refusal(
                http.HTTPStatus.NOT_FOUND,
                "not_found",
                f"no thread {thread!r} in the store: nothing deleted",
            )
        log.info("thread %r deleted over HTTP by %s", thread, subject)
        return _json_response(http.HTTPStatus.OK, {"thread": thread, "deleted": True})

    async def _answer(self, ws: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return ws.respond(http.HTTPStatus.OK, "ok\n")
        if path == "/readyz":
            if self._draining:
                return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "draining\n")
            if not await self.check_store():
                return ws.respond(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    f"store unavailable: {self.store_problem}\n",
                )
            body = "ready\n" + "".join(f"warning: {w}\n" for w in self.store_warnings)
            return ws.respond(http.HTTPStatus.OK, body)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            # Only here: a WebSocket upgrade on / never looks for a file.
            file = self.static.get(path)
            if file is not None:
                return _static_response(file, request)
            viewer = ", GET / for the viewer" if self.config.viewer else ""
            return ws.respond(
                http.HTTPStatus.NOT_FOUND,
                f"agui-hub: open a WebSocket here{viewer}, or GET /healthz or /readyz\n",
            )
        if getattr(request, "method", "GET") != "GET":
            return self._method_not_allowed(ws, request.method)  # only a GET opens a WebSocket
        offered = [
            p.strip()
            for value in request.headers.get_all("Sec-WebSocket-Protocol")
            for p in value.split(",")
        ]
        if not any(p in SUBPROTOCOLS for p in offered):
            return ws.respond(
                http.HTTPStatus.BAD_REQUEST,
                "agui-hub: offer the subprotocol agui-hub.v1.json (text frames) or "
                "agui-hub.v1.msgpack (binary frames) in Sec-WebSocket-Protocol\n",
            )
        assert isinstance(ws, _Socket)
        return await self._admit(ws, request)

    @staticmethod
    def _select_subprotocol(ws: ServerConnection, offered: Any) -> Any:
        for name in offered:  # the client's order of preference
            if name in SUBPROTOCOLS:
                return name
        return None

    # WebSocket side -------------------------------------------------------------------------------

    async def _handler(self, ws: ServerConnection) -> None:
        identity = ws.identity if isinstance(ws, _Socket) else None
        conn = Connection(self, ws, encoding_of(ws.subprotocol), identity)
        self.connections.add(conn)
        counters = self.counters
        counters.opened += 1
        number = counters.opened
        opened_at = time.monotonic()
        log.info(
            "connection %d from %s opened: %s, %s",
            number,
            conn.remote,
            identity.subject if identity is not None else "not authenticated yet",
            conn.encoding.value,
        )
        conn.start_clock()
        writer = asyncio.create_task(conn.write_loop())
        try:
            while conn.state is ConnectionState.OPEN:
                timeout = None if conn.busy else self.config.idle_timeout
                try:
                    async with asyncio.timeout(timeout):
                        data = await ws.recv()  # cancelling recv() loses nothing
                except TimeoutError:
                    if conn.busy:
                        continue  # a command made it busy meanwhile
                    conn.close_soon(CloseCode.IDLE_TIMEOUT, "idle: reconnect when needed")
                    break
                await conn.receive(data)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("connection %s failed", conn.remote)
            conn.close_soon(CloseCode.INTERNAL_ERROR, "internal error, resume")
        finally:
            conn.forget()
            self.connections.discard(conn)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.wait_closed(), 5 * SECONDS)
            counters.closed += 1
            reason = ws.close_reason or ""
            log.info(
                "connection %d from %s closed: %s%s after %.1f s",
                number,
                conn.remote,
                ws.close_code if ws.close_code is not None else "no close frame (1006)",
                f" {reason}" if reason else "",
                time.monotonic() - opened_at,
            )

    def _check_exposure(self) -> None:
        """Refuse to serve every thread to anyone on a network without being told to."""
        config = self.config
        if (
            not is_loopback(config.host)
            and not config.jwt_configured
            and not self._custom_auth
            and not config.allow_anonymous
        ):
            raise ValueError(
                f"listening on {config.host} (not loopback) without authentication would let "
                "anyone who reaches it read and write every thread: configure JWT "
                "(--jwt-secret-file, --jwt-public-key-file or --jwt-jwks-file), or pass "
                "--allow-anonymous to mean it (docs/security.md)"
            )
        anonymous = self.authenticator.anonymous
        if anonymous is not None and config.jwt_configured and not anonymous.grants:
            log.warning(
                "allow_anonymous is set but anonymous_subscribe and anonymous_publish grant "
                "nothing: connections without a token can only authenticate"
            )

    def _fit_open_files(self) -> None:
        """Lower the connection cap so that every socket fits under the open-file limit.

        Besides the sockets it counts, the process holds sockets that asyncio
        accepted in one go before the gateway could look at them (up to the
        listen backlog), and dropped ones whose descriptor is closed on the
        next turn of the loop (up to a backlog more): room for both is kept.
        """
        limit = open_file_limit()
        if limit is None:
            return
        self.backlog = max(MIN_BACKLOG, min(MAX_BACKLOG, limit // 16))
        room = limit - FD_RESERVE - HANDSHAKE_HEADROOM - 2 * self.backlog
        if self.config.http_port is not None:
            # The HTTP listener (its own backlog too) and the upstream requests of
            # the bridge take descriptors from the same budget: a quarter of it at
            # most for the listener, what the runs can hold is kept aside.
            room -= self.backlog + self.config.max_runs + UPSTREAM_KEEPALIVE
            self.http_connections = max(1, min(self.config.max_connections, room // 4))
            room -= self.http_connections
        if room < self.max_connections:
            fitted = max(1, room)
            log.warning(
                "max_connections %d does not fit the open-file limit %d: serving at most %d "
                "connections (raise the limit: ulimit -n, LimitNOFILE=)",
                self.max_connections,
                limit,
                fitted,
            )
            self.max_connections = fitted
        self.socket_cap = self.max_connections + HANDSHAKE_HEADROOM

    def _tls_context(self) -> ssl.SSLContext | None:
        config = self.config
        if not config.tls_cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(config.tls_cert, config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load the TLS certificate and key: {exc}") from None
        return context

    async def start(self) -> Server:
        """Check the settings and the store, start listening; log where, on which
        store, and any risk.

        A store that does not answer yet is not fatal: the gateway serves,
        ``/readyz`` answers 503 with the reason, and a background check logs
        when the store is back. Raises :class:`ValueError` for settings that
        cannot be served (no authentication on a public address, an unusable
        TLS key), and :class:`~agui_hub.errors.StoreError` when
        ``require_durable_store`` is set and the store's settings can lose
        events.
        """
        config = self.config
        self._check_exposure()
        tls = self._tls_context()
        self._fit_open_files()
        if await self.check_store():
            for warning in self.store_warnings:
                log.warning("store %s: %s", self.store_name, warning)
            if config.require_durable_store and self.store_warnings:
                raise StoreError(
                    f"store {self.store_name} can lose events ({'; '.join(self.store_warnings)}); "
                    "fix its settings or start without --require-durable-store"
                )
        else:
            log.warning(
                "store %s is unavailable (%s): serving anyway; /readyz answers 503 "
                "until it answers",
                self.store_name,
                self.store_problem,
            )
            self._store_watch = asyncio.create_task(self._watch_store())
        gateway = self

        class Socket(_Socket):
            pass

        Socket.gateway = gateway
        self.server = await serve(
            self._handler,
            config.host,
            config.port,
            subprotocols=list(SUBPROTOCOLS),  # type: ignore[arg-type]
            select_subprotocol=self._select_subprotocol,
            process_request=self._process_request,
            max_size=FRAME_LIMIT_FACTOR * config.max_frame_bytes,
            ping_interval=config.ping_interval,
            ping_timeout=config.ping_timeout,
            open_timeout=config.open_timeout,
            compression=None,
            server_header=SERVER_HEADER,
            create_connection=Socket,
            backlog=self.backlog,
            # `serve --workers N`: N processes listen on this port, the kernel
            # spreads connections among them (agui_hub/workers.py).
            reuse_port=config.workers > 1,
            ssl=tls,
            logger=RedactingLogger(logging.getLogger("websockets.server"), {}),
        )
        if config.http_port is not None:
            self.http = HttpListener(self)
            try:
                files = (config.tls_cert, config.tls_key) if tls else None
                config.http_port = await self.http.start(files)
            except BaseException:
                self.server.close()
                await self.server.wait_closed()
                raise
        if isinstance(self.authenticator, JWTAuthenticator) or self._custom_auth:
            self._auth_watch = asyncio.create_task(self._watch_credentials())
        self._summary = asyncio.create_task(self._summarize())
        if self.metrics is not None:
            self._loop_watch = asyncio.create_task(self.metrics.watch_loop())
        port = self.server.sockets[0].getsockname()[1] if self.server.sockets else config.port
        self.config.port = port
        store = (
            self.store_name
            if config.store
            else ("memory:// (in-process: events are lost when it exits)")
        )
        scheme = "wss" if tls else "ws"
        log.info("agui-hub listening on %s://%s:%s, store %s", scheme, config.host, port, store)
        if config.viewer:
            page = "https" if tls else "http"
            log.info("viewer: %s://%s:%s/#thread=<thread>", page, config.host, port)
        log.info("authentication: %s; at most %d connections (%d per address)",
                 self.describe_auth(), self.max_connections,
                 config.max_connections_per_address)  # fmt: skip
        log.info("operations: %s", self.describe_operations())
        if self.http is not None:
            log.info("HTTP bridge: %s://%s:%s (SSE streams, POST /agents/<name>)",
                     "https" if tls else "http", config.host, config.http_port)  # fmt: skip
        if self.bridge.agents:
            names = (f"{a.name} ({redact_url(a.url)})" for a in self.bridge.agents.values())
            log.info("upstream agents: %s", ", ".join(names))
        return self.server

    def describe_auth(self) -> str:
        """One line on how connections authenticate (for the start-up log)."""
        authenticator = self.authenticator
        anonymous = authenticator.anonymous
        if isinstance(authenticator, Anonymous):
            assert anonymous is not None
            return f"none (anonymous: {_grants_text(anonymous.grants)})"
        kind = type(authenticator).__name__
        if isinstance(authenticator, JWTAuthenticator):
            kind = "JWT"
        if anonymous is None:
            return f"{kind}, no anonymous access"
        return f"{kind}, anonymous: {_grants_text(anonymous.grants)}"

    def describe_operations(self) -> str:
        """One line on who may read ``/metrics`` and the admin endpoints (start-up log)."""
        admin_grant = "a token with the admin grant"
        if self.metrics is None:
            metrics = "off"
        elif self.config.metrics_public or self._unauthenticated:
            metrics = "open"
        else:
            metrics = f"for {admin_grant}"
        if not self._unauthenticated:
            admin = f"for {admin_grant}"
        elif self.config.admin_anonymous:
            admin = "open (admin_anonymous, loopback)"
        else:
            admin = "off (no authentication; see admin_anonymous)"
        return f"{METRICS_PATH} {metrics}; {ADMIN_THREADS} {admin}"

    async def drain(self) -> None:
        """Stop accepting, tell every client to resume elsewhere (1012), close the store."""
        self._draining = True
        if self._store_watch is not None:
            self._store_watch.cancel()
        if self._auth_watch is not None:
            self._auth_watch.cancel()
        if self._summary is not None:
            self._summary.cancel()
        if self._loop_watch is not None:
            self._loop_watch.cancel()
        if self.server is not None:
            self.server.close(close_connections=False)
        for conn in list(self.connections):
            conn.close_soon(CloseCode.SERVICE_RESTART, "server restart: reconnect and resume")
        # Runs still going end in their threads (RUN_ERROR), while the store is open
        # and while the HTTP clients of those runs can still be told.
        ends = await self.bridge.close()
        if self.http is not None:
            await self.http.stop(ends)
        if self._chores:
            await asyncio.wait(list(self._chores), timeout=10 * SECONDS)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 10 * SECONDS)
        await self.hub.close()
        await self.store.close()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until *stop* is set or SIGTERM / SIGINT arrives, then drain.

        SIGHUP re-reads the key and revocation files at once.
        """
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        with contextlib.suppress(NotImplementedError, RuntimeError, AttributeError):
            loop.add_signal_handler(signal.SIGHUP, self.check_revocations)
        loop.set_exception_handler(_AcceptFailures(loop.get_exception_handler()))
        await self.start()
        try:
            await stop.wait()
        finally:
            log.info("agui-hub draining")
            await self.drain()
            log.info("agui-hub stopped")


SUMMARY_INTERVAL = 60 * SECONDS
"""How often the gateway logs its summary line."""

METRICS_PATH = "/metrics"

METRICS_STORE_CHECK = 5 * SECONDS
"""A scrape checks the store (for ``agui_hub_store_up``) when the last check is older."""
ADMIN_PREFIX = "/admin/"
ADMIN_THREADS = "/admin/threads"
DEFAULT_ADMIN_LIMIT = 100
"""Threads ``GET /admin/threads`` lists without a ``limit``."""
MAX_ADMIN_LIMIT = 1000
"""Most threads one ``GET /admin/threads`` lists (each one is a store call)."""
ADMIN_INFO_CONCURRENCY = 64
"""Thread infos asked of the store at once (the Redis pool bounds the connections)."""


class _Refusal(Exception):
    """An operator request answered with an error status, a code and a message saying why."""

    def __init__(
        self,
        status: http.HTTPStatus,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = dict(headers or {})

    @classmethod
    def method(cls, method: str, path: str, allowed: tuple[str, ...]) -> _Refusal:
        return cls(
            http.HTTPStatus.METHOD_NOT_ALLOWED,
            "method_not_allowed",
            f"{method} is not served at {path}: use {' or '.join(allowed)}",
            {"Allow": ", ".join(allowed)},
        )

    def response(self, ws: ServerConnection, *, as_json: bool) -> Response:
        if as_json:
            response = _json_response(self.status, {"error": self.code, "message": str(self)})
        else:
            response = ws.respond(self.status, f"agui-hub: {self}\n")
        for name, value in self.headers.items():
            response.headers[name] = value
        return response


def _body_response(status: http.HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers(
        [
            ("Date", email.utils.formatdate(usegmt=True)),
            ("Connection", "close"),
            ("Content-Length", str(len(body))),
            ("Content-Type", content_type),
            # Figures of this moment, and for an admin only: never kept by a cache.
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
        ]
    )
    return Response(status.value, status.phrase, headers, body)


def _json_response(status: http.HTTPStatus, payload: Any) -> Response:
    # ASCII (\u escapes): any thread name a store holds is valid JSON this way.
    body = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
    return _body_response(status, body, "application/json")


def _admin_thread(path: str) -> str:
    """The thread of ``/admin/threads/<thread>``: percent-decoded (``tenant-42%2Frun-1``,
    or ``tenant-42/run-1`` as it is), and a valid thread name."""
    raw = path[len(ADMIN_THREADS) + 1 :]
    try:
        return check_thread(unquote(raw, errors="strict"))
    except UnicodeDecodeError:
        raise _Refusal(
            http.HTTPStatus.BAD_REQUEST,
            "bad_request",
            "the thread in the path is not percent-encoded UTF-8",
        ) from None
    except AguiHubError as exc:
        raise _Refusal(http.HTTPStatus.BAD_REQUEST, "bad_request", str(exc)) from None


def _limit_of(target: str) -> int:
    """The ``limit`` query parameter of *target* (``DEFAULT_ADMIN_LIMIT`` without one)."""
    values = parse_qs(urlsplit(target).query, keep_blank_values=True).get("limit")
    if not values:
        return DEFAULT_ADMIN_LIMIT
    raw = values[0]
    # A handful of digits at most: int() of thousands of them raises (and costs).
    if len(values) > 1 or not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise _Refusal(
            http.HTTPStatus.BAD_REQUEST,
            "bad_request",
            f"limit is one whole number from 1 to {MAX_ADMIN_LIMIT}",
        )
    limit = int(raw)
    if not 1 <= limit <= MAX_ADMIN_LIMIT:
        raise _Refusal(
            http.HTTPStatus.BAD_REQUEST,
            "bad_request",
            f"limit {limit} is out of range: 1 to {MAX_ADMIN_LIMIT} threads per request",
        )
    return limit


async def _info_of(store: ThreadStore, name: str) -> ThreadInfo | None:
    """The info of the listed thread *name*, ``None`` when it is gone or is not a
    valid thread name (a stream key some other program wrote)."""
    try:
        return await store.info(name)
    except StoreError:
        raise
    except AguiHubError:
        return None


@dataclasses.dataclass
class Counters:
    """What a gateway did since it started (the summary line, and ``/metrics``).

    Plain integers bumped where things happen anyway, read when Prometheus
    scrapes (:meth:`Gateway.figures`); ``frames_out`` and ``bytes_out`` once
    per write, not per frame and viewer.
    """

    opened: int = 0
    closed: int = 0
    commands: int = 0
    events_in: int = 0
    frames_out: int = 0
    bytes_out: int = 0
    resumes_complete: int = 0
    resumes_incomplete: int = 0
    stalled: int = 0
    """Connections dropped because their socket took nothing for ``write_timeout``."""
    # By kind, for /metrics only (the summary line compares the numbers above).
    command_types: Counter[type] = dataclasses.field(default_factory=Counter, compare=False)
    """Client frames by command class (:class:`CommandError`: not a command)."""
    closes: Counter[int] = dataclasses.field(default_factory=Counter, compare=False)
    """Connections the gateway closed, by close code."""
    errors: Counter[str] = dataclasses.field(default_factory=Counter, compare=False)
    """Error frames sent, by code."""
    publish_errors: Counter[str] = dataclasses.field(default_factory=Counter, compare=False)
    refusals: Counter[int] = dataclasses.field(default_factory=Counter, compare=False)
    """WebSocket handshakes refused, by HTTP status."""


COMMAND_NAMES: dict[type, str] = {
    Subscribe: "subscribe",
    Unsubscribe: "unsubscribe",
    Publish: "publish",
    Ping: "ping",
    Auth: "auth",
    Run: "run",
    Cancel: "cancel",
    CommandError: "invalid",
}
"""The ``type`` label of ``agui_hub_commands_total`` for each command class."""


SERVER_HEADER = "agui-hub"
"""The ``Server`` header of every response: no versions for a scanner to match."""

MAX_BACKLOG = 100
"""The listen backlog (asyncio's default), lowered under a small open-file limit."""

MIN_BACKLOG = 8

AUTH_FILES_INTERVAL = 5 * SECONDS
"""How often the key and revocation files are checked for changes."""


def _grants_text(grants: Grants) -> str:
    read = ", ".join(grants.subscribe) or "nothing"
    write = ", ".join(grants.publish) or "nothing"
    return f"read {read}; publish {write}"


class _AcceptFailures:
    """The loop's exception handler: asyncio's "accept() out of system resource"
    once per interval with a count, not once per failed accept with a traceback.

    The connection cap keeps the gateway's own sockets under the open-file
    limit; this is for descriptors taken by something else (the store, a
    lowered limit), where asyncio would otherwise log thousands of tracebacks.
    """

    INTERVAL = 10 * SECONDS

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.failures = 0
        self.logged_at = -math.inf

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith("socket.accept() out of system resource"):
            self.failures += 1
            now = time.monotonic()
            if now - self.logged_at >= self.INTERVAL:
                log.error(
                    "out of file descriptors: %d connection(s) could not be accepted (%s); "
                    "raise the open-file limit or lower --max-connections",
                    self.failures,
                    context.get("exception"),
                )
                self.logged_at, self.failures = now, 0
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)
