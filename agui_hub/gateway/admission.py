"""Who may connect to the gateway, and how many: the WebSocket handshake's checks.

Before a WebSocket is opened, :meth:`Admission.admit` checks the request's
``Origin`` against ``allowed_origins``, the gateway's connection cap and the
per-address cap, and the credentials of the handshake (a token in a header,
the query or a cookie). Every accepted socket is counted from the moment
asyncio accepts it (:class:`CountedSocket`), so that the gateway stays under
its open-file limit whatever clients do; :class:`AcceptFailures` quiets
asyncio when something else took the descriptors. docs/security.md has the
threat model.
"""

from __future__ import annotations

import asyncio
import http
import logging
import math
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from ..errors import Forbidden, Unauthorized
from .auth import Authenticator, Identity, credentials_of
from .config import HANDSHAKE_HEADROOM, SECONDS, GatewayConfig, is_loopback, limit_key, split_list
from .reporting import Counters

__all__ = ["AcceptFailures", "Admission", "CountedSocket", "client_address"]

log = logging.getLogger("agui_hub.server")


def client_address(ws: ServerConnection) -> str:
    """The client's address as the per-address limit counts it (see :func:`limit_key`)."""
    remote = ws.remote_address
    return limit_key(str(remote[0]) if isinstance(remote, tuple) and remote else str(remote))


class CountedSocket(ServerConnection):
    """A client socket, counted from the moment it is accepted until it is gone.

    The counts keep the gateway under its open-file limit whatever clients
    do: past ``max_connections + HANDSHAKE_HEADROOM`` sockets, the oldest one
    that has not sent its request yet is dropped to make room (sockets that
    connect and say nothing cannot lock out a health check), or the new one
    when all are busy; every admitted WebSocket is released here, however it
    ends. The gateway serves a subclass of its own whose :attr:`admission` is
    its :class:`Admission`.
    """

    admission: Admission
    admitted: str | None = None
    """The client address this socket was admitted as a WebSocket for."""
    identity: Identity | None = None
    """What its handshake's credentials proved."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.admission.accepted(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.admission.lost(self)
        super().connection_lost(exc)


class Admission:
    """The gateway's door: origins, connection caps and the handshake's credentials.

    It counts the open sockets (:class:`CountedSocket` reports to it) and the
    admitted WebSockets, overall and per client address. Call :meth:`fit`
    before serving when the open-file limit lowers the cap; a refusal is
    counted in ``counters.refusals`` by HTTP status.
    """

    def __init__(
        self, config: GatewayConfig, authenticator: Authenticator, counters: Counters
    ) -> None:
        self.config = config
        self.authenticator = authenticator
        self.counters = counters
        self.allowed_origins = {o.rstrip("/").lower() for o in split_list(config.allowed_origins)}
        if config.jwt_cookie and (not self.allowed_origins or "*" in self.allowed_origins):
            raise ValueError(
                "a token in a cookie is sent by the browser from any page: list the origins "
                "allowed to connect (allowed_origins), not '*'"
            )
        self.max_connections = config.max_connections
        """``config.max_connections``, lowered at start to fit the open-file limit."""
        self.sockets = 0
        """Open client sockets (handshakes, health checks, WebSockets)."""
        self.socket_cap = self.max_connections + HANDSHAKE_HEADROOM
        self.admitted = 0
        """WebSocket connections admitted (handshake accepted) and not yet gone."""
        self.per_address: Counter[str] = Counter()
        self.silent: dict[CountedSocket, None] = {}
        """Sockets that have not sent their HTTP request yet, oldest first."""
        self.refused_sockets = 0
        """Sockets dropped at once because the gateway had no room for them."""

    def fit(self, max_connections: int) -> None:
        """Serve at most *max_connections* WebSockets (and that many sockets plus
        the handshake headroom)."""
        self.max_connections = max_connections
        self.socket_cap = max_connections + HANDSHAKE_HEADROOM

    # Sockets -------------------------------------------------------------------------------------

    def accepted(self, socket: CountedSocket) -> None:
        """Count a socket asyncio just accepted; past the cap, drop the one that
        has been silent longest (maybe this one)."""
        self.sockets += 1
        self.silent[socket] = None
        if self.sockets > self.socket_cap:
            # No descriptor to spare for even a refusal: drop the socket that
            # has been silent longest (maybe this one).
            self.refused_sockets += 1
            victim = next(iter(self.silent))
            del self.silent[victim]
            victim.transport.abort()

    def heard(self, ws: ServerConnection) -> None:
        """*ws* sent its request: it is no longer one to drop first."""
        if isinstance(ws, CountedSocket):
            self.silent.pop(ws, None)

    def lost(self, socket: CountedSocket) -> None:
        """Forget a socket that is gone (releasing its WebSocket's places)."""
        self.sockets -= 1
        self.silent.pop(socket, None)
        self.release(socket)

    def release(self, socket: CountedSocket) -> None:
        """Give back the places *socket*'s WebSocket took (once: later calls do nothing)."""
        address = socket.admitted
        if address is not None:
            socket.admitted = None
            self.admitted -= 1
            left = self.per_address[address] - 1
            if left > 0:
                self.per_address[address] = left
            else:
                del self.per_address[address]

    # The handshake -------------------------------------------------------------------------------

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

    def refuse(
        self,
        ws: ServerConnection,
        status: http.HTTPStatus,
        text: str,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """A handshake's refusal (counted): *status*, *text* saying why, *headers*."""
        self.counters.refusals[status.value] += 1
        response = ws.respond(status, f"agui-hub: {text}\n")
        for name, value in (headers or {}).items():
            response.headers[name] = value
        return response

    async def admit(self, ws: CountedSocket, request: Request) -> Response | None:
        """Decide on a WebSocket handshake: ``None`` admits it (its identity is then
        ``ws.identity``), a response refuses it."""
        config = self.config
        if not self.origin_allowed(request.headers):
            log.info(
                "connection from %s refused: origin %r is not allowed",
                client_address(ws),
                request.headers.get("Origin"),
            )
            return self.refuse(
                ws,
                http.HTTPStatus.FORBIDDEN,
                f"origin {request.headers.get('Origin')!r} is not allowed to connect "
                "(see allowed_origins in docs/security.md)",
            )
        if self.admitted >= self.max_connections:
            return self.refuse(
                ws,
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                f"this gateway is full ({self.max_connections} connections): retry later, "
                "or another gateway",
                {"Retry-After": "5"},
            )
        address = client_address(ws)
        if self.per_address[address] >= config.max_connections_per_address:
            return self.refuse(
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
            return self.refuse(ws, http.HTTPStatus.FORBIDDEN, str(exc))
        except Unauthorized as exc:
            self.release(ws)
            log.info("connection from %s refused: %s", address, exc)
            return self.refuse(
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


class AcceptFailures:
    """The loop's exception handler: asyncio's "accept() out of system resource"
    once per interval with a count, not once per failed accept with a traceback.

    The connection cap keeps the gateway's own sockets under the open-file
    limit; this is for descriptors taken by something else (the store, a
    lowered limit), where asyncio would otherwise log thousands of tracebacks.
    Install it with ``loop.set_exception_handler(AcceptFailures(previous))``:
    every other error goes to *previous* (or the loop's default handler).
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
