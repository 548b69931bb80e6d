"""The WebSocket gateway: ``agui-hub serve``.

A thin I/O layer over :mod:`agui_hub.wire.protocol` (what frames mean) and
:mod:`agui_hub.gateway.fanout.channels` (who gets which event), on the ``websockets`` asyncio
server. :class:`Gateway` owns the lifecycle (settings checks, TLS, the
open-file budget, start, serve, drain) and one collaborator per concern, each
in a module of its own beside this one:

* :mod:`~agui_hub.gateway.admission` - origins, connection caps, the sockets
  under the open-file limit, the handshake's credentials;
* :mod:`~agui_hub.gateway.connection` - one WebSocket client: its bounded send
  queue, written at the end of each turn of the event loop or by its writer
  task while the socket is full;
* :mod:`~agui_hub.gateway.commands` - what a client's commands do: paced,
  authorized, in order per thread;
* :mod:`~agui_hub.gateway.http_routes` - plain HTTP on the same port:
  ``/healthz``, ``/readyz``, the viewer page and the browser client
  (:mod:`~agui_hub.gateway.static_files`), Prometheus metrics at ``/metrics``
  and, for an admin, the store's threads at ``/admin/threads`` (docs/metrics.md);
* :mod:`~agui_hub.gateway.run_access` - the bridge's runs behind the clients' grants;
* :mod:`~agui_hub.gateway.watchers` - the store's health, revoked credentials;
* :mod:`~agui_hub.gateway.reporting` - the counters, ``/metrics`` figures and
  the summary line;
* :mod:`~agui_hub.gateway.web` - the HTTP listener on ``http_port`` (SSE).

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
import logging
import signal
import ssl
import time
from collections import Counter
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from ..agui.reducer import StateLimits
from ..bridge.runs import UPSTREAM_KEEPALIVE, Bridge
from ..errors import StoreError
from ..store import open_store
from ..store.contract import ThreadStore
from ..store.urls import redact_url
from ..wire.protocol import SUBPROTOCOLS, CloseCode, encoding_of
from .admission import AcceptFailures, Admission, CountedSocket
from .auth import Anonymous, Authenticator, Grants, JWTAuthenticator, RedactingLogger
from .commands import ThreadWorkRates
from .config import (
    FD_RESERVE,
    HANDSHAKE_HEADROOM,
    SECONDS,
    GatewayConfig,
    build_agents,
    build_authenticator,
    is_loopback,
    open_file_limit,
    raise_open_file_limit,
)
from .connection import Connection, ConnectionState, PendingFlushes
from .fanout.channels import Hub
from .http_routes import HttpRoutes, select_subprotocol
from .metrics import Figures, GatewayMetrics
from .presence import PresenceMode, PresenceTracker
from .reporting import Counters, collect_figures, log_summaries
from .run_access import RunAccess
from .watchers import StoreHealth, close_revoked, watch_credentials
from .web import HttpListener

__all__ = ["Gateway", "GatewayConfig", "raise_open_file_limit"]

log = logging.getLogger("agui_hub.server")

FRAME_LIMIT_FACTOR = 4
"""The WebSocket frame limit is this many times ``max_frame_bytes``: a command
between the two is answered ``payload_too_large``, a larger frame closes 1009."""

SERVER_HEADER = "agui-hub"
"""The ``Server`` header of every response: no versions for a scanner to match."""

MAX_BACKLOG = 100
"""The listen backlog (asyncio's default), lowered under a small open-file limit."""

MIN_BACKLOG = 8


class IdleWatch:
    """Closes a connection that sent nothing for *timeout* seconds while it had
    nothing under way (no subscription, no command).

    One timer per connection, moved only when it fires: a frame read just
    notes the time (an ``asyncio.timeout`` around every read cost a timer in
    the loop's heap per frame, about 2% of a busy gateway's CPU).
    """

    __slots__ = ("_conn", "_last", "_timeout", "_timer")

    def __init__(self, conn: Connection, timeout: float) -> None:
        self._conn, self._timeout = conn, timeout
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        self._timer: asyncio.TimerHandle | None = loop.call_later(timeout, self._check)

    def read(self) -> None:
        """A frame came in: the connection is not idle."""
        self._last = asyncio.get_running_loop().time()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        conn, loop = self._conn, asyncio.get_running_loop()
        if conn.state is not ConnectionState.OPEN:
            self._timer = None
            return
        left = self._last + self._timeout - loop.time()
        if conn.busy or left > 0:
            # Busy: idle again only a whole timeout after it is not (measured
            # from this check, as a read with no deadline used to be).
            self._last = loop.time() if conn.busy else self._last
            self._timer = loop.call_later(self._timeout if conn.busy else left, self._check)
            return
        self._timer = None
        conn.close_soon(CloseCode.IDLE_TIMEOUT, "idle: reconnect when needed")


class Gateway:
    """The WebSocket gateway: a hub over a store, served on one port.

    *authenticator* replaces the one the configuration describes (see
    :class:`~agui_hub.gateway.auth.Authenticator`). Call :meth:`run` to serve
    until a signal, or :meth:`start` and later :meth:`drain` to embed it.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        store: ThreadStore | None = None,
        authenticator: Authenticator | None = None,
    ) -> None:
        self.config = config
        self._custom_auth = authenticator is not None
        self.counters = Counters()
        """What the gateway did since it started (the minute's summary line)."""
        # Before the store is opened: settings it refuses leave nothing to close.
        self.admission = Admission(
            config,
            authenticator if authenticator is not None else build_authenticator(config),
            self.counters,
        )
        """Who may connect, and how many (origins, caps, the handshake's credentials)."""
        self.store = store if store is not None else open_store(config.store or None)
        self.store_health = StoreHealth(
            self.store,
            redact_url(config.store)
            if config.store
            else (repr(store) if store is not None else "memory://"),
        )
        """Whether the store answered its last check (``/readyz``, ``agui_hub_store_up``)."""
        self.metrics = GatewayMetrics(self.figures) if config.metrics else None
        """The ``/metrics`` registry (``None``: the ``metrics`` setting is off)."""
        self.hub = Hub(
            # The hub's store calls are timed at this seam (the store modules know nothing of it).
            self.metrics.timed(self.store) if self.metrics is not None else self.store,
            limits=StateLimits(
                max_depth=config.state_max_depth,
                max_bytes=config.state_max_bytes,
                max_work=config.state_max_work,
            ),
            max_event_bytes=config.max_event_bytes,
            strict_patches=config.strict_patches,
        )
        self.bridge = Bridge(
            self.hub,
            build_agents(config),
            max_runs=config.max_runs,
            max_event_bytes=config.max_event_bytes,
            raw_events=config.raw_events,
        )
        """Runs of upstream AG-UI agents (docs/bridge.md)."""
        self.runs = RunAccess(self.bridge)
        """The bridge as clients reach it: behind their grants."""
        self.thread_work = ThreadWorkRates(
            config.max_thread_state_work_per_second,
            # A publish the limits allow never waits on an idle thread.
            burst=max(config.max_thread_state_work_per_second, float(config.state_max_work)),
        )
        """What the publishes into each thread cost in state work, per second
        (``max_thread_state_work_per_second``), whichever connection sent them."""
        self.presence = PresenceTracker(
            self.hub.store,
            mode=PresenceMode(config.presence),
            ttl=config.presence_ttl,
            interval=config.presence_interval,
        )
        """Who watches each thread, on every gateway of the store (docs/protocol.md)."""
        self._presence_task: asyncio.Task[None] | None = None
        self.http: HttpListener | None = None
        """The HTTP listener (``http_port``): SSE streams and ``POST /agents/<name>``."""
        self.http_connections = config.max_connections
        """Connections the HTTP listener takes (fitted to the open-file limit at start)."""
        self.connections: set[Connection] = set()
        self.server: Server | None = None
        self.chores: set[asyncio.Future[Any]] = set()
        """Closes under way: the drain waits for them."""
        self._draining = False
        self._store_watch: asyncio.Task[None] | None = None
        self._auth_watch: asyncio.Task[None] | None = None
        self._summary: asyncio.Task[None] | None = None
        self._loop_watch: asyncio.Task[None] | None = None
        self.write_timeout: float = config.write_timeout or config.ping_timeout or 20 * SECONDS
        self.backlog = MAX_BACKLOG
        """The listen backlog: also how many sockets asyncio accepts in one go."""
        self.flushes = PendingFlushes()
        """Connections that got frames in this turn of the event loop, to flush at its end."""
        self.routes = HttpRoutes(self)
        """Plain HTTP on the WebSocket port (probes, static files, /metrics, /admin/)."""

    @property
    def authenticator(self) -> Authenticator:
        """Who a connection is: one object, asked by the handshake (:attr:`admission`),
        ``auth`` commands, ``/admin/`` and the revocation check alike."""
        return self.admission.authenticator

    @property
    def draining(self) -> bool:
        """Whether :meth:`drain` has begun (``/readyz`` answers 503 from then on)."""
        return self._draining

    @property
    def max_connections(self) -> int:
        """``config.max_connections``, lowered at start to fit the open-file limit."""
        return self.admission.max_connections

    @property
    def admitted(self) -> int:
        """WebSocket connections admitted (handshake accepted) and not yet gone."""
        return self.admission.admitted

    @property
    def per_address(self) -> Counter[str]:
        """Admitted WebSocket connections by client address."""
        return self.admission.per_address

    # Credentials and figures -----------------------------------------------------------------

    def check_revocations(self) -> int:
        """Re-read the key and revocation files; close revoked connections (4403).

        Returns how many were closed. Runs every few seconds; call it after
        changing a file to act at once.
        """
        streams = self.http.app.streams if self.http is not None else ()
        return close_revoked(self.authenticator, self.connections, streams)

    def figures(self) -> Figures:
        """What ``/metrics`` reports now (docs/metrics.md)."""
        return collect_figures(
            self.counters,
            self.connections,
            self.hub,
            connections_limit=self.admission.max_connections,
            sockets_dropped=self.admission.refused_sockets,
            store_up=self.store_health.problem is None,
            bridge=self.bridge,
            sse_streams=len(self.http.app.streams) if self.http is not None else 0,
            presence=self.presence,
        )

    # WebSocket side -------------------------------------------------------------------------------

    async def _handler(self, ws: ServerConnection) -> None:
        """Serve one admitted WebSocket until it closes: read its frames in order,
        close it when idle, log its opening and closing."""
        identity = ws.identity if isinstance(ws, CountedSocket) else None
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
        idle = IdleWatch(conn, self.config.idle_timeout)
        try:
            while conn.state is ConnectionState.OPEN:
                data = await ws.recv()
                if conn.state is not ConnectionState.OPEN:
                    break  # closed while it waited (idle, drained): not carried out
                idle.read()
                await conn.receive(data)
            # Closing (the gateway closed it: a slow consumer, a drain): what the
            # client still sends is read and dropped, so that its answer to the
            # close is seen and the socket freed at once; unread, a client with
            # frames in flight kept it until websockets' close timeout (10 s).
            while True:
                await ws.recv()
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("connection %s failed", conn.remote)
            conn.close_soon(CloseCode.INTERNAL_ERROR, "internal error, resume")
        finally:
            idle.stop()
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

    # Lifecycle ------------------------------------------------------------------------------

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
        max_connections = self.admission.max_connections
        if room < max_connections:
            fitted = max(1, room)
            log.warning(
                "max_connections %d does not fit the open-file limit %d: serving at most %d "
                "connections (raise the limit: ulimit -n, LimitNOFILE=)",
                max_connections,
                limit,
                fitted,
            )
            max_connections = fitted
        self.admission.fit(max_connections)

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
        store_health = self.store_health
        store_name = store_health.name
        if await store_health.check():
            for warning in store_health.warnings:
                log.warning("store %s: %s", store_name, warning)
            if config.require_durable_store and store_health.warnings:
                raise StoreError(
                    f"store {store_name} can lose events ({'; '.join(store_health.warnings)}); "
                    "fix its settings or start without --require-durable-store"
                )
        else:
            log.warning(
                "store %s is unavailable (%s): serving anyway; /readyz answers 503 "
                "until it answers",
                store_name,
                store_health.problem,
            )
            self._store_watch = asyncio.create_task(store_health.watch())

        # The sockets of this gateway report to its admission (a class per gateway:
        # websockets makes them by calling the class).
        class Socket(CountedSocket):
            pass

        Socket.admission = self.admission
        self.server = await serve(
            self._handler,
            config.host,
            config.port,
            subprotocols=list(SUBPROTOCOLS),  # type: ignore[arg-type]
            select_subprotocol=select_subprotocol,
            process_request=self.routes.process_request,
            max_size=FRAME_LIMIT_FACTOR * config.max_frame_bytes,
            ping_interval=config.ping_interval,
            ping_timeout=config.ping_timeout,
            open_timeout=config.open_timeout,
            compression=None,
            server_header=SERVER_HEADER,
            create_connection=Socket,
            backlog=self.backlog,
            # `serve --workers N`: N processes listen on this port, the kernel
            # spreads connections among them (agui_hub/gateway/workers.py).
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
            self._auth_watch = asyncio.create_task(watch_credentials(self.check_revocations))
        self._summary = asyncio.create_task(
            log_summaries(self.counters, self.connections, self.hub)
        )
        if self.metrics is not None:
            self._loop_watch = asyncio.create_task(self.metrics.watch_loop())
        self._presence_task = asyncio.create_task(self.presence.run(), name="agui-hub presence")
        self._presence_task.add_done_callback(_log_presence_end)
        port = self.server.sockets[0].getsockname()[1] if self.server.sockets else config.port
        self.config.port = port
        store = (
            store_name
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
        log.info("operations: %s", self.routes.describe_operations())
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
        if self.chores:
            await asyncio.wait(list(self.chores), timeout=10 * SECONDS)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 10 * SECONDS)
        # Its viewers left others' presence as they closed (the tracker ran on).
        if self._presence_task is not None:
            self._presence_task.cancel()
        await self.presence.close()
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
        loop.set_exception_handler(AcceptFailures(loop.get_exception_handler()))
        await self.start()
        try:
            await stop.wait()
        finally:
            log.info("agui-hub draining")
            await self.drain()
            log.info("agui-hub stopped")


def _log_presence_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("presence stopped: %r", task.exception())


def _grants_text(grants: Grants) -> str:
    read = ", ".join(grants.subscribe) or "nothing"
    write = ", ".join(grants.publish) or "nothing"
    return f"read {read}; publish {write}"
