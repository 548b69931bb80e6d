"""Plain HTTP on the gateway's WebSocket port: what a request gets before (or
instead of) a WebSocket.

The ``websockets`` server hands every request to
:meth:`HttpRoutes.process_request` before its handshake. A request that is
not a WebSocket upgrade is answered there and never reaches the WebSocket
path: ``/healthz`` and ``/readyz``, the viewer page and the browser client
(:mod:`~agui_hub.gateway.static_files`), Prometheus metrics at ``/metrics``
(:mod:`~agui_hub.gateway.metrics`) and, for an admin, the store's threads
at ``/admin/threads`` (docs/metrics.md). An upgrade that offers one of the
hub's subprotocols goes on to :meth:`~agui_hub.gateway.admission.Admission.admit`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import http
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers, MultipleValuesError
from websockets.http11 import Request, Response

from ..errors import AguiHubError, Forbidden, StoreError, Unauthorized
from ..store.contract import ThreadInfo, ThreadStore
from ..wire.offsets import check_thread
from ..wire.protocol import SUBPROTOCOLS
from .admission import Admission, CountedSocket, client_address
from .auth import ANONYMOUS_SUBJECT, Anonymous, Authenticator, credentials_of
from .config import SECONDS, GatewayConfig, is_loopback
from .fanout.channels import Hub
from .metrics import GatewayMetrics
from .static_files import load_static, static_response
from .watchers import StoreHealth

__all__ = ["ADMIN_THREADS", "METRICS_PATH", "HttpRoutes", "RoutesHost", "select_subprotocol"]

log = logging.getLogger("agui_hub.server")

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


class RoutesHost(Protocol):
    """What :class:`HttpRoutes` needs of its gateway
    (a :class:`~agui_hub.gateway.server.Gateway`)."""

    @property
    def config(self) -> GatewayConfig: ...
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def store_health(self) -> StoreHealth: ...
    @property
    def hub(self) -> Hub: ...
    @property
    def metrics(self) -> GatewayMetrics | None: ...

    @property
    def draining(self) -> bool:
        """Whether the gateway is draining (``/readyz`` answers 503)."""
        ...


def select_subprotocol(ws: ServerConnection, offered: Any) -> Any:
    """The ``select_subprotocol`` hook: the first of the client's offers the hub speaks."""
    for name in offered:  # the client's order of preference
        if name in SUBPROTOCOLS:
            return name
    return None


class HttpRoutes:
    """The ``process_request`` hook of the gateway's WebSocket server (see the module
    docstring). Static files are read once, when it is made."""

    def __init__(self, gateway: RoutesHost) -> None:
        self.gateway = gateway
        self.static = load_static(gateway.config.viewer)
        """The files served over plain HTTP, by path (read once)."""

    @property
    def _unauthenticated(self) -> bool:
        """Whether nobody authenticates here (every connection is anonymous)."""
        return isinstance(self.gateway.authenticator, Anonymous)

    def describe_operations(self) -> str:
        """One line on who may read ``/metrics`` and the admin endpoints (start-up log)."""
        admin_grant = "a token with the admin grant"
        config = self.gateway.config
        if self.gateway.metrics is None:
            metrics = "off"
        elif config.metrics_public or self._unauthenticated:
            metrics = "open"
        else:
            metrics = f"for {admin_grant}"
        if not self._unauthenticated:
            admin = f"for {admin_grant}"
        elif config.admin_anonymous:
            admin = "open (admin_anonymous, loopback)"
        else:
            admin = "off (no authentication; see admin_anonymous)"
        return f"{METRICS_PATH} {metrics}; {ADMIN_THREADS} {admin}"

    async def process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        """Answer *request*, or ``None`` to let its WebSocket handshake go on."""
        self.gateway.admission.heard(ws)
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

    async def _answer(self, ws: ServerConnection, request: Request) -> Response | None:
        gateway = self.gateway
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return ws.respond(http.HTTPStatus.OK, "ok\n")
        if path == "/readyz":
            if gateway.draining:
                return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "draining\n")
            store = gateway.store_health
            if not await store.check():
                return ws.respond(
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    f"store unavailable: {store.problem}\n",
                )
            body = "ready\n" + "".join(f"warning: {w}\n" for w in store.warnings)
            return ws.respond(http.HTTPStatus.OK, body)
        if request.headers.get("Upgrade", "").lower() != "websocket":
            # Only here: a WebSocket upgrade on / never looks for a file.
            file = self.static.get(path)
            if file is not None:
                return static_response(file, request)
            viewer = ", GET / for the viewer" if gateway.config.viewer else ""
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
        assert isinstance(ws, CountedSocket)
        return await gateway.admission.admit(ws, request)

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
                log.info("%s %s from %s refused: %s", method, path, client_address(ws), refusal)
            return refusal.response(ws, as_json=path != METRICS_PATH)

    async def _serve_metrics(self, request: Request, method: str) -> Response:
        gateway = self.gateway
        if method not in ("GET", "HEAD"):
            raise _Refusal.method(method, METRICS_PATH, ("GET", "HEAD"))
        if gateway.metrics is None:
            raise _Refusal(
                http.HTTPStatus.NOT_FOUND,
                "not_found",
                "metrics are off on this gateway (the metrics setting)",
            )
        if not (gateway.config.metrics_public or self._unauthenticated):
            await self._admin_subject(request, METRICS_PATH)
        store = gateway.store_health
        if time.monotonic() - store.checked_at >= METRICS_STORE_CHECK:
            # agui_hub_store_up must not wait for a /readyz probe that may never come
            # (compose, systemd): a scrape checks the store itself, at most this often.
            await store.check()
        body, content_type = gateway.metrics.exposition(request.headers.get("Accept"))
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
            info = await self.gateway.hub.store.info(thread)
            if info is None:
                raise _Refusal(
                    http.HTTPStatus.NOT_FOUND, "not_found", f"no thread {thread!r} in the store"
                )
            record = self._thread_record(info)
            if "runs" in parse_qs(urlsplit(request.path).query, keep_blank_values=True):
                # The index of runs, in the order they started (docs/metrics.md).
                runs = await self.gateway.hub.store.runs(thread)
                record["runs"] = [run.as_json() for run in runs]
            return _json_response(http.HTTPStatus.OK, record)
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
        if self.gateway.config.admin_anonymous:
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
            if request.headers.get_all("Origin") and not self.gateway.admission.origin_allowed(
                request.headers
            ):
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
            identity = await self.gateway.authenticator.authenticate(credentials)
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
        store = self.gateway.hub.store
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
        channel = self.gateway.hub.channels.get(info.thread)
        return {
            **info.as_json(),
            "ttl": round(info.ttl, 3) if info.ttl is not None else None,
            "subscribers": len(channel.members) if channel is not None else 0,
        }

    async def _delete_thread(self, thread: str, subject: str) -> Response:
        """``DELETE /admin/threads/<thread>``: the thread, its events, ids and
        checkpoint; its viewers (on every gateway) are told by the store."""
        if not await self.gateway.hub.store.delete(thread):
            raise _Refusal(
                http.HTTPStatus.NOT_FOUND,
                "not_found",
                f"no thread {thread!r} in the store: nothing deleted",
            )
        log.info("thread %r deleted over HTTP by %s", thread, subject)
        return _json_response(http.HTTPStatus.OK, {"thread": thread, "deleted": True})


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
