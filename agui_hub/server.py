"""The WebSocket gateway: ``agui-hub serve``.

A thin I/O layer over :mod:`agui_hub.protocol` (what frames mean) and
:mod:`agui_hub.hub` (who gets which event), on the ``websockets`` asyncio
server. Per connection: one task reads and handles commands in order, one
task writes the bounded send queue to the socket. Plain HTTP on the same port
answers ``/healthz`` and ``/readyz``.

Every connection, subscribe and publish passes through one authorisation
decision, :meth:`Authorizer.authorize` (who, which action, which thread); the
default allows everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import http
import logging
import os
import signal
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from .codec import DEFAULT_MAX_SIZE, Encoding
from .errors import AguiHubError, ProtocolError, StoreError, StoreUnavailable
from .hub import Hub
from .protocol import (
    SUBPROTOCOLS,
    CloseCode,
    Command,
    CommandError,
    Ping,
    Publish,
    Subscribe,
    Unsubscribe,
    encode_frame,
    encoding_of,
    error_frame,
    parse_command,
    pong_frame,
    published_frame,
    unsubscribed_frame,
)
from .reducer import StateLimits
from .store import ThreadStore, open_store, redact_url

__all__ = ["Action", "AllowAll", "Authorizer", "Gateway", "GatewayConfig", "Principal"]

log = logging.getLogger("agui_hub.server")

KIB = 1024
MIB = 1024 * KIB
SECONDS = 1.0

STORE_CHECK_TIMEOUT = 2 * SECONDS
"""How long a store check (start-up, ``/readyz``) waits for an answer."""


@dataclass
class GatewayConfig:
    """Gateway settings; every one can also come from an ``AGUI_HUB_*`` variable."""

    host: str = "127.0.0.1"
    port: int = 8765
    store: str = ""
    """Store URL; empty: the in-process memory store."""
    max_frame_bytes: int = DEFAULT_MAX_SIZE
    """Largest client command; a larger one is answered ``payload_too_large``, and a
    frame over ``FRAME_LIMIT_FACTOR`` times this closes the connection with 1009."""
    max_subscriptions: int = 1000
    """Threads one connection may subscribe to at once."""
    send_queue_bytes: int = 4 * MIB
    """Unsent bytes per connection: past this, its events come from the store at the
    pace of its socket instead (see docs/gateway.md, "Slow consumers")."""
    ping_interval: float | None = 20 * SECONDS
    ping_timeout: float | None = 20 * SECONDS
    write_timeout: float | None = None
    """Seconds a write to a client may wait for its socket before the connection
    is dropped (a client that stopped reading); default: ``ping_timeout``, or 20."""
    idle_timeout: float = 300 * SECONDS
    """A connection with no subscription and no command for this long is closed (4001)."""
    state_max_bytes: int = 8 * MIB
    """Largest folded state document of a thread (approximate encoded bytes)."""
    state_max_depth: int = 64
    """Deepest nesting of a thread's state document."""
    require_durable_store: bool = False
    """Refuse to start on a store whose settings can lose events (see docs/store.md)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> GatewayConfig:
        env = os.environ if environ is None else environ
        config = cls()
        for name, default in vars(config).items():
            raw = env.get(f"AGUI_HUB_{name.upper()}")
            if raw is not None:
                kind = type(default) if default is not None else float
                try:
                    setattr(config, name, _parse_bool(raw) if kind is bool else kind(raw))
                except ValueError:
                    raise ValueError(
                        f"AGUI_HUB_{name.upper()}={raw!r} is not a {kind.__name__}"
                    ) from None
        for name, value in overrides.items():
            if value is not None:
                setattr(config, name, value)
        return config


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(raw)


# -- authorisation seam ---------------------------------------------------------------


class Action(enum.StrEnum):
    CONNECT = "connect"
    SUBSCRIBE = "subscribe"
    PUBLISH = "publish"


@dataclass(frozen=True)
class Principal:
    """Who is on the other end of a connection, as far as the gateway knows."""

    remote: str
    headers: Headers = field(repr=False, compare=False)


class Authorizer(Protocol):
    async def authorize(self, principal: Principal, action: Action, thread: str | None) -> bool:
        """Whether *principal* may do *action* (on *thread*, for subscribe and publish)."""
        ...


class AllowAll:
    """The default policy: everyone may do everything."""

    async def authorize(self, principal: Principal, action: Action, thread: str | None) -> bool:
        return True


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
        protocol = ws.protocol
        for frame in frames:
            if isinstance(frame, str):
                protocol.send_text(frame.encode())
            else:
                protocol.send_binary(frame)


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


MAX_COMMANDS_IN_FLIGHT = 32
"""Commands one connection may have under way at once; its next frame is read
when one of them is done (the client's own backpressure)."""


class Connection:
    """One client socket, as the hub sees it (a :class:`~agui_hub.hub.Subscriber`).

    Commands run concurrently, each in a task of its own, in order per thread:
    a command about a thread starts when the previous command about the same
    thread is done, so publishes to one thread are stored in the order sent,
    and a ``ping`` (or a command about another thread) is never stuck behind
    a slow publish.
    """

    # Slots, and futures made only while somebody waits: an idle connection
    # is a few hundred bytes here, on top of what websockets keeps for it.
    __slots__ = (
        "_drain",
        "_lanes",
        "_queue",
        "_queued_bytes",
        "_tasks",
        "_wake",
        "_watchdog",
        "encoding",
        "gateway",
        "principal",
        "state",
        "threads",
        "ws",
    )

    def __init__(self, gateway: Gateway, ws: ServerConnection, encoding: Encoding) -> None:
        self.gateway = gateway
        self.ws = ws
        self.encoding = encoding
        self.state = ConnectionState.OPEN
        self.principal = Principal(
            str(ws.remote_address), ws.request.headers if ws.request else Headers()
        )
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
        self._lanes: dict[str, asyncio.Task[None]] | None = None
        """Per thread, the last command task about it (the next one waits for it)."""

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
        can still be delivered.
        """
        if self.state is not ConnectionState.OPEN:
            return True  # going away anyway; not a slow consumer
        bound = self.gateway.config.send_queue_bytes
        before = self._queued_bytes
        self._queue.append(frame)
        self._queued_bytes = before + len(frame)
        _resolve(self._wake)
        if self._queued_bytes <= bound or before <= bound // 2:
            return True
        if self._queued_bytes > REPLY_QUEUE_FACTOR * bound:
            # Whatever keeps queueing (commands whose replies it does not
            # read, subscribes and their snapshots), the queue stays bounded.
            self.close_soon(CloseCode.SLOW_CONSUMER, "slow consumer: reconnect and resume")
        return False

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
            log.exception("connection %s: writer failed", self.principal.remote)
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
        while self.state is ConnectionState.OPEN:
            if not queue:
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
            frames: list[bytes | str] = []
            size = 0
            while queue and size < WRITE_BATCH_BYTES:
                frame = queue.popleft()
                frames.append(frame)
                size += len(frame)
            self._queued_bytes -= size
            if self._queued_bytes <= self.gateway.config.send_queue_bytes // 2:
                _resolve(self._drain)
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

    def _watch(self, last: int) -> None:
        """Drop the connection if nothing left its write buffer since the last look."""
        transport = self.ws.transport
        size = transport.get_write_buffer_size()
        if last >= 0 and size > 0 and size >= last:
            # The client stopped reading: its window is full, and even the
            # keepalive ping waits behind it for ever. Drop it; it resumes.
            log.info(
                "connection %s: no write progress in %.1f s, dropped",
                self.principal.remote,
                self.gateway.write_timeout,
            )
            self._watchdog = None
            transport.abort()
            return
        self._watchdog = asyncio.get_running_loop().call_later(
            self.gateway.write_timeout, self._watch, size
        )

    def reply(self, frame: dict[str, Any]) -> None:
        self.send(encode_frame(frame, self.encoding))

    async def receive(self, data: bytes | str) -> None:
        """Take one client frame: answer it now, or start its command.

        Returns when the command is started (or answered), not when it is
        done; waits first while :data:`MAX_COMMANDS_IN_FLIGHT` are under way.
        """
        gateway = self.gateway
        try:
            command = parse_command(data, self.encoding, max_size=gateway.config.max_frame_bytes)
        except CommandError as exc:
            self.reply(error_frame(exc.code, str(exc), exc.command_id))
            return
        if isinstance(command, Ping):
            self.reply(pong_frame(command.id))
            return
        if self._tasks is None:
            self._tasks = set()
            self._lanes = {}
        assert self._lanes is not None
        while len(self._tasks) >= MAX_COMMANDS_IN_FLIGHT:
            await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        thread = command.thread
        before = self._lanes.get(thread)
        task = asyncio.create_task(self._run(command, before))
        self._tasks.add(task)
        self._lanes[thread] = task
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
        if self._lanes is not None:
            for thread, last in list(self._lanes.items()):
                if last is task:
                    del self._lanes[thread]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, StoreUnavailable):
                self.close_soon(CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later")
            else:
                log.error("connection %s: command failed", self.principal.remote, exc_info=exc)
                self.close_soon(CloseCode.INTERNAL_ERROR, "internal error, resume")

    async def _run(self, command: Command, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            # In order per thread; how the one before ended is its own business.
            await asyncio.wait([before])
        if self.state is ConnectionState.OPEN:
            await self.handle(command)

    async def handle(self, command: Command) -> None:
        """Carry out one parsed command. Errors become error frames."""
        gateway = self.gateway
        command_id = command.id
        thread = None
        try:
            if isinstance(command, Ping):
                self.reply(pong_frame(command.id))
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
                if not await gateway.authorizer.authorize(self.principal, Action.PUBLISH, thread):
                    self.reply(error_frame("forbidden", "publishing here is not allowed",
                                           command.id, thread))  # fmt: skip
                    return
                offsets = await gateway.hub.publish(thread, command.events, command.event_ids)
                self.reply(published_frame(command.id, thread, offsets))
        except AguiHubError as exc:
            index = exc.index if isinstance(exc, ProtocolError) else None
            self.reply(error_frame(exc.code, str(exc), command_id, thread, index))

    async def _subscribe(self, command: Subscribe) -> None:
        gateway = self.gateway
        thread = command.thread
        if thread in self.threads:
            # Subscribing again restarts the subscription from the new position.
            gateway.hub.unsubscribe(self, thread)
            self.threads.discard(thread)
        if len(self.threads) >= gateway.config.max_subscriptions:
            self.reply(self._too_many(command.id, thread))
            return
        if not await gateway.authorizer.authorize(self.principal, Action.SUBSCRIBE, thread):
            self.reply(
                error_frame("forbidden", "subscribing here is not allowed", command.id, thread)
            )
            return
        if len(self.threads) >= gateway.config.max_subscriptions:
            # Others subscribed while the policy decided: the limit still holds.
            self.reply(self._too_many(command.id, thread))
            return
        self.threads.add(thread)
        try:
            await gateway.hub.subscribe(self, thread, command.id, command.start, command.run)
        except BaseException:
            self.threads.discard(thread)
            gateway.hub.unsubscribe(self, thread)
            raise
        if self.state is not ConnectionState.OPEN:
            # Gone while it subscribed: forget() ran before the thread was ours.
            gateway.hub.unsubscribe(self, thread)
            self.threads.discard(thread)

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
        _resolve(self._wake)
        _resolve(self._drain)
        for thread in list(self.threads):
            self.gateway.hub.unsubscribe(self, thread)
        self.threads.clear()
        if self._tasks:
            for task in list(self._tasks):
                task.cancel()


# -- the gateway ------------------------------------------------------------------------------


class Gateway:
    """The WebSocket gateway: a hub over a store, served on one port."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        store: ThreadStore | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.config = config
        self.store = store if store is not None else open_store(config.store or None)
        self.store_name = (
            redact_url(config.store)
            if config.store
            else (repr(store) if store is not None else "memory://")
        )
        self.hub = Hub(
            self.store,
            limits=StateLimits(max_depth=config.state_max_depth, max_bytes=config.state_max_bytes),
        )
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.connections: set[Connection] = set()
        self.server: Server | None = None
        self._chores: set[asyncio.Future[Any]] = set()
        self._draining = False
        self.store_problem: str | None = None
        """Why the store is not usable now (``None``: it answered the last check)."""
        self.store_warnings: list[str] = []
        """What the store's settings put at risk (see docs/store.md)."""
        self._store_watch: asyncio.Task[None] | None = None
        self.write_timeout: float = config.write_timeout or config.ping_timeout or 20 * SECONDS

    # The store ---------------------------------------------------------------------------------

    async def check_store(self) -> bool:
        """Ping the store and read its settings; remember why it is not usable."""
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

    # HTTP side -------------------------------------------------------------------------------

    async def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
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
            return ws.respond(
                http.HTTPStatus.NOT_FOUND,
                "agui-hub: open a WebSocket here, or GET /healthz or /readyz\n",
            )
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
        principal = Principal(str(ws.remote_address), request.headers)
        if not await self.authorizer.authorize(principal, Action.CONNECT, None):
            return ws.respond(http.HTTPStatus.FORBIDDEN, "agui-hub: not allowed\n")
        return None

    @staticmethod
    def _select_subprotocol(ws: ServerConnection, offered: Any) -> Any:
        for name in offered:  # the client's order of preference
            if name in SUBPROTOCOLS:
                return name
        return None

    # WebSocket side -------------------------------------------------------------------------------

    async def _handler(self, ws: ServerConnection) -> None:
        conn = Connection(self, ws, encoding_of(ws.subprotocol))
        self.connections.add(conn)
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
            log.exception("connection %s failed", conn.principal.remote)
            conn.close_soon(CloseCode.INTERNAL_ERROR, "internal error, resume")
        finally:
            conn.forget()
            self.connections.discard(conn)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.wait_closed(), 5 * SECONDS)

    async def start(self) -> Server:
        """Check the store, start listening; log where, on which store, and any risk.

        A store that does not answer yet is not fatal: the gateway serves,
        ``/readyz`` answers 503 with the reason, and a background check logs
        when the store is back. Raises :class:`~agui_hub.errors.StoreError`
        when ``require_durable_store`` is set and the store's settings can
        lose events.
        """
        config = self.config
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
            compression=None,
        )
        port = self.server.sockets[0].getsockname()[1] if self.server.sockets else config.port
        self.config.port = port
        store = (
            self.store_name
            if config.store
            else ("memory:// (in-process: events are lost when it exits)")
        )
        log.info("agui-hub listening on ws://%s:%s, store %s", config.host, port, store)
        return self.server

    async def drain(self) -> None:
        """Stop accepting, tell every client to resume elsewhere (1012), close the store."""
        self._draining = True
        if self._store_watch is not None:
            self._store_watch.cancel()
        if self.server is not None:
            self.server.close(close_connections=False)
        for conn in list(self.connections):
            conn.close_soon(CloseCode.SERVICE_RESTART, "server restart: reconnect and resume")
        if self._chores:
            await asyncio.wait(list(self._chores), timeout=10 * SECONDS)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 10 * SECONDS)
        await self.hub.close()
        await self.store.close()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until *stop* is set or SIGTERM / SIGINT arrives, then drain."""
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
        finally:
            log.info("agui-hub draining")
            await self.drain()
            log.info("agui-hub stopped")
