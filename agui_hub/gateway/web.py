"""The gateway's HTTP listener: SSE streams of threads, and runs for HTTP clients.

The WebSocket gateway runs on the ``websockets`` library, whose server answers
plain HTTP requests only with a whole body; an SSE stream is a body that never
ends. So HTTP streams have a listener of their own, on ``http_port``: an ASGI
app (:class:`HttpApp`) served by uvicorn in the gateway's process and event
loop, over the same :class:`~agui_hub.gateway.fanout.channels.Hub`, store and
:class:`~agui_hub.bridge.runs.Bridge`. The WebSocket path is not touched by it
(docs/bridge.md explains the choice).

Endpoints (docs/bridge.md):

- ``POST /agents/<name>``: a stock AG-UI ``HttpAgent`` points here. The body
  is its RunAgentInput; the hub runs the upstream agent *name* in the input's
  thread and answers with the SSE stream of that run as the agent sent it,
  with ``id: <offset>`` on every event. The run is the gateway's: a client
  that goes away does not stop it.
- ``GET /threads/<thread>/events``: the thread's events as SSE, ``id:`` the
  offset; ``Last-Event-ID`` (or ``?lastEventId=``) resumes after it, as a
  browser's EventSource does by itself.
- ``DELETE /threads/<thread>/run``: cancel the bridged run going in the thread.
- ``GET /healthz``.

Each SSE client is a :class:`~agui_hub.gateway.fanout.channels.Subscriber` of the hub like a
WebSocket connection: bounded queue, paced from the store when it falls
behind, never a silent gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    MutableMapping,
)
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, unquote

from websockets.datastructures import Headers, MultipleValuesError

from ..bridge.runs import Bridge, BridgedRun
from ..errors import (
    AguiHubError,
    Forbidden,
    InvalidEvent,
    NoActiveRun,
    ProtocolError,
    RunActive,
    StoreError,
    TooManyRuns,
    Unauthorized,
    UnknownAgent,
)
from ..wire.offsets import check_thread, offset_key
from ..wire.protocol import CloseCode, Position, Start, StartKind
from ..wire.sse import encode_comment, encode_event
from .admission import Admission
from .auth import Action, Authenticator, Identity, credentials_of
from .config import GatewayConfig, limit_key
from .fanout.channels import Hub
from .run_access import RunAccess
from .sse_stream import SseStream

if TYPE_CHECKING:
    import uvicorn

__all__ = ["HttpApp", "HttpHost", "HttpListener", "SseStream"]

log = logging.getLogger("agui_hub.web")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

KEEPALIVE_SECONDS = 15.0
"""A comment line this often on a quiet stream: proxies do not time it out, and a
client that vanished is noticed."""

RETRY_MILLISECONDS = 1000
"""The ``retry:`` an SSE stream announces: how soon EventSource reconnects."""

BODY_BUDGET_FACTOR = 4
"""Request bodies being read at once hold at most this many times ``max_input_bytes``."""

RUN_JOIN_ATTEMPTS = 10
"""Subscribes a run's stream makes before it gives up (about a second in all)."""

AGENTS_PREFIX = "/agents/"
THREADS_PREFIX = "/threads/"

_ALLOWED_HEADERS = b"authorization, content-type, accept, last-event-id"


class HttpHost(Protocol):
    """What the HTTP listener needs of the gateway it serves beside (a
    :class:`~agui_hub.gateway.server.Gateway`): the same config, hub, bridge, grants,
    credentials and origin policy (``admission``) as the WebSocket side, its write
    timeout, and its share of the open files (``http_connections``, ``backlog``)."""

    @property
    def config(self) -> GatewayConfig: ...
    @property
    def hub(self) -> Hub: ...
    @property
    def bridge(self) -> Bridge: ...
    @property
    def runs(self) -> RunAccess: ...
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def admission(self) -> Admission: ...
    @property
    def write_timeout(self) -> float: ...
    @property
    def http_connections(self) -> int: ...
    @property
    def backlog(self) -> int: ...


def _before(offset: str) -> str:
    """The offset just before *offset* (no event can lie between them)."""
    ms, seq = offset_key(offset)
    return f"{ms}-{seq - 1}" if seq else f"{ms - 1}-{2**64 - 1}"


class _HttpError(Exception):
    """A request answered with an error status and a JSON body ``{"error": {code, message}}``."""

    def __init__(
        self,
        status: http.HTTPStatus,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers or {}


_STATUS_OF: dict[type[AguiHubError], http.HTTPStatus] = {
    UnknownAgent: http.HTTPStatus.NOT_FOUND,
    RunActive: http.HTTPStatus.CONFLICT,
    TooManyRuns: http.HTTPStatus.SERVICE_UNAVAILABLE,
    NoActiveRun: http.HTTPStatus.NOT_FOUND,
    Unauthorized: http.HTTPStatus.UNAUTHORIZED,
    Forbidden: http.HTTPStatus.FORBIDDEN,
}


def _http_error(exc: AguiHubError) -> _HttpError:
    found = [status for kind, status in _STATUS_OF.items() if isinstance(exc, kind)]
    if found:
        status = found[0]
    else:
        if isinstance(exc, StoreError):
            status = http.HTTPStatus.SERVICE_UNAVAILABLE
        elif isinstance(exc, ProtocolError):
            status = http.HTTPStatus.BAD_REQUEST
        else:
            status = http.HTTPStatus.INTERNAL_SERVER_ERROR
    headers = {}
    if status is http.HTTPStatus.SERVICE_UNAVAILABLE:
        headers["Retry-After"] = "5"
    if status is http.HTTPStatus.UNAUTHORIZED:
        headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'
    return _HttpError(status, exc.code, str(exc), headers)


class HttpApp:
    """The ASGI app of the HTTP listener (see the module docstring)."""

    def __init__(self, gateway: HttpHost) -> None:
        self.gateway = gateway
        self.streams: set[SseStream] = set()
        self.body_bytes = 0
        """Bytes of request bodies being read now (bounded: see :meth:`_body`)."""
        self.per_address: Counter[str] = Counter()
        """Open streams by client address (``max_connections_per_address`` bounds them)."""
        self.closing = asyncio.Event()
        self.run_ends: dict[str, tuple[int, int]] = {}
        """While draining: where the runs it stopped ended, by thread (see :meth:`holds`)."""

    def holds(self, stream: SseStream) -> bool:
        """Whether a draining listener keeps *stream* open: a run's own stream until
        its run's end, a viewer of a stopped run's thread until that end reached it."""
        if not stream.is_open:
            return False
        if stream.run is not None:
            return True
        end = self.run_ends.get(stream.thread)
        return end is not None and (stream.offset is None or offset_key(stream.offset) < end)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan is off; websockets are the other listener's
        method = scope["method"]
        path = scope.get("raw_path", b"").decode("latin-1").split("?", 1)[0] or scope["path"]
        headers = Headers(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", ())
        )
        origin: str | None = None
        try:
            origin = self._cors(headers)
            if method == "OPTIONS":
                await self._preflight(send, origin)
            elif path == "/healthz":
                self._allow(method, ("GET", "HEAD"))
                await _plain(send, http.HTTPStatus.OK, b"ok\n", origin)
            elif path.startswith(AGENTS_PREFIX):
                self._allow(method, ("POST",))
                await self._run_post(scope, receive, send, headers, origin, path)
            elif path.startswith(THREADS_PREFIX) and path.endswith("/events"):
                self._allow(method, ("GET",))
                await self._thread_get(scope, receive, send, headers, origin, path)
            elif path.startswith(THREADS_PREFIX) and path.endswith("/run"):
                self._allow(method, ("DELETE",))
                await self._cancel(scope, send, headers, origin, path)
            else:
                raise _HttpError(http.HTTPStatus.NOT_FOUND, "not_found", f"no endpoint {path}")
        except _HttpError as exc:
            await _error(send, exc, origin)
        except MultipleValuesError as exc:
            message = f"the header {exc} appears more than once"
            await _error(
                send, _HttpError(http.HTTPStatus.BAD_REQUEST, "bad_request", message), origin
            )
        except AguiHubError as exc:
            await _error(send, _http_error(exc), origin)
        except Exception:
            # A bug: this request gets a 500 (when its response has not started),
            # every other request and stream goes on.
            log.exception("HTTP %s %s failed", method, path)
            refusal = _HttpError(
                http.HTTPStatus.INTERNAL_SERVER_ERROR, "internal_error", "internal error"
            )
            await _error(send, refusal, origin)

    # -- plumbing ------------------------------------------------------------------------------

    def _cors(self, headers: Headers) -> str | None:
        """The origin to allow (a browser's), ``None`` without one; an origin that may
        not call is refused (403)."""
        if not headers.get_all("Origin"):
            return None
        if not self.gateway.admission.origin_allowed(headers):
            raise _HttpError(
                http.HTTPStatus.FORBIDDEN,
                "forbidden",
                f"origin {headers.get('Origin')!r} is not allowed "
                "(see allowed_origins in docs/security.md)",
            )
        return headers["Origin"].strip()

    @staticmethod
    def _allow(method: str, allowed: tuple[str, ...]) -> None:
        if method not in allowed:
            raise _HttpError(
                http.HTTPStatus.METHOD_NOT_ALLOWED,
                "method_not_allowed",
                f"{method} is not allowed here: use {' or '.join(allowed)}",
                {"Allow": ", ".join(allowed)},
            )

    async def _preflight(self, send: Send, origin: str | None) -> None:
        headers = [(b"allow", b"GET, POST, DELETE, OPTIONS")]
        if isinstance(origin, str):
            headers += [
                (b"access-control-allow-methods", b"GET, POST, DELETE"),
                (b"access-control-allow-headers", _ALLOWED_HEADERS),
                (b"access-control-max-age", b"600"),
            ]
        await send({"type": "http.response.start", "status": 204,
                    "headers": headers + _cors_headers(origin)})  # fmt: skip
        await send({"type": "http.response.body", "body": b""})

    async def _identity(self, headers: Headers, query: str) -> Identity:
        path = "/?" + query if query else "/"
        credentials = credentials_of(path, headers, cookie=self.gateway.config.jwt_cookie)
        authenticator = self.gateway.authenticator
        if credentials is None:
            if authenticator.anonymous is None:
                raise Unauthorized(
                    "this gateway needs a token: send 'Authorization: Bearer <token>' "
                    "(or ?access_token= where a header cannot be set)"
                )
            return authenticator.anonymous
        identity = await authenticator.authenticate(credentials)
        if authenticator.revoked(identity):
            raise Forbidden("this token was revoked")
        return identity

    @staticmethod
    def _thread_of(path: str, suffix: str) -> str:
        raw = path[len(THREADS_PREFIX) : -len(suffix)]
        try:
            return check_thread(unquote(raw, errors="strict"))
        except (UnicodeDecodeError, InvalidEvent) as exc:
            raise _HttpError(
                http.HTTPStatus.BAD_REQUEST, "bad_request", f"not a thread name: {exc}"
            ) from None

    @contextlib.contextmanager
    def _admitted(self, scope: Scope) -> Iterator[None]:
        """Count a stream against its address's limit while it is open (429 past it)."""
        client = scope.get("client")
        address = limit_key(str(client[0])) if client else "unknown"
        limit = self.gateway.config.max_connections_per_address
        if self.per_address[address] >= limit:
            raise _HttpError(
                http.HTTPStatus.TOO_MANY_REQUESTS,
                "too_many_streams",
                f"too many streams from {address} (at most {limit})",
                {"Retry-After": "5"},
            )
        self.per_address[address] += 1
        try:
            yield
        finally:
            self.per_address[address] -= 1
            if not self.per_address[address]:
                del self.per_address[address]

    async def _body(self, receive: Receive, limit: int) -> bytes:
        """The request body, at most *limit* bytes (413), counted with every other body
        being read against :data:`BODY_BUDGET_FACTOR` times *limit* (503 past it)."""
        body = bytearray()
        budget = BODY_BUDGET_FACTOR * limit
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _HttpError(http.HTTPStatus.BAD_REQUEST, "bad_request", "the client left")
                part = message.get("body", b"")
                if len(body) + len(part) > limit:
                    raise _HttpError(
                        http.HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        "payload_too_large",
                        f"the request body is over {limit} bytes (max_input_bytes)",
                    )
                if self.body_bytes + len(part) > budget:
                    raise _HttpError(
                        http.HTTPStatus.SERVICE_UNAVAILABLE,
                        "too_busy",
                        "the gateway is reading as many request bodies as it may: retry later",
                        {"Retry-After": "1"},
                    )
                body += part
                self.body_bytes += len(part)
                if not message.get("more_body"):
                    return bytes(body)
        finally:
            self.body_bytes -= len(body)

    # -- POST /agents/<name> -------------------------------------------------------------------

    async def _run_post(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Headers,
        origin: str | None,
        path: str,
    ) -> None:
        gateway = self.gateway
        name = unquote(path[len(AGENTS_PREFIX) :])
        identity = await self._identity(headers, scope.get("query_string", b"").decode("latin-1"))
        if not identity.grants.may_run(name):
            # Before the body is read: a refused caller costs no buffering.
            raise Forbidden(f"this token may not run agent {name!r} (its run grant)")
        with self._admitted(scope):
            body = await self._body(receive, gateway.config.max_input_bytes)
            try:
                given = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise _HttpError(
                    http.HTTPStatus.BAD_REQUEST, "bad_request", f"the body is not JSON: {exc}"
                ) from None
            finally:
                del body
            thread = given.get("threadId") if isinstance(given, dict) else None
            if not isinstance(thread, str):
                raise _HttpError(
                    http.HTTPStatus.BAD_REQUEST,
                    "bad_request",
                    "the body is a RunAgentInput: a JSON object with a threadId",
                )
            check_thread(thread)
            gateway.runs.check_grant(identity, name, thread)
            if not identity.allows(Action.SUBSCRIBE, thread):
                # The answer is the thread's events of the run: reading them is reading.
                raise Forbidden(f"this token may not read thread {thread!r}")
            run = await gateway.bridge.start(name, thread, subject=identity.subject, input=given)
            del given
            await self._run_stream(receive, send, origin, identity, run)

    async def _run_stream(
        self, receive: Receive, send: Send, origin: str | None, identity: Identity, run: BridgedRun
    ) -> None:
        """Answer ``POST /agents/<name>`` with the SSE stream of *run*, as the agent sent it."""
        gateway = self.gateway
        thread = run.thread
        stream = SseStream(thread, gateway.config.send_queue_bytes, run, identity)
        await _start_sse(send, origin)
        async with self._serving(stream, receive, send):
            try:
                # Keepalives while the agent has not started (a model may take a while).
                while not run.started.done():
                    done, _ = await asyncio.wait([run.started], timeout=KEEPALIVE_SECONDS)
                    if not done:
                        await _write(send, encode_comment("waiting"), gateway.write_timeout)
                    if not stream.open:
                        return
                first = run.started.result()
            except AguiHubError as exc:
                # Nothing of the run could be stored: say so the AG-UI way.
                code = "AGUI_HUB_" + exc.code.upper()
                error = {"type": "RUN_ERROR", "message": str(exc), "code": code}
                await _write(send, encode_event(json.dumps(error)), gateway.write_timeout)
                return
            if await self._join_run(stream, thread, Position(_before(first), run.epoch)):
                await self._pump(stream, send)

    async def _join_run(self, stream: SseStream, thread: str, start: Position) -> bool:
        """Subscribe a run's stream from just before the run's first event.

        A channel that has not relayed the thread's first events yet (it was
        opened on an empty thread a moment ago) answers such a position with a
        snapshot: asked again once it caught up. ``False`` when it never did.
        """
        hub = self.gateway.hub
        for attempt in range(RUN_JOIN_ATTEMPTS):
            if await hub.subscribe(stream, thread, None, start, None):
                return True
            hub.unsubscribe(stream, thread)
            stream.discard()
            if not stream.is_open:
                return False
            await asyncio.sleep(0.02 * (attempt + 1))
        log.warning("run stream of thread %s: no complete join from %s", thread, start.offset)
        return False

    # -- GET /threads/<thread>/events ----------------------------------------------------------

    async def _thread_get(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: Headers,
        origin: str | None,
        path: str,
    ) -> None:
        thread = self._thread_of(path, "/events")
        query = scope.get("query_string", b"").decode("latin-1")
        identity = await self._identity(headers, query)
        if not identity.allows(Action.SUBSCRIBE, thread):
            raise Forbidden(f"this token may not read thread {thread!r}")
        params = parse_qs(query)
        start = _start_of(headers, params)
        plain = _first(params, "plain") in ("1", "true")
        with self._admitted(scope):
            await self._thread_stream(receive, send, origin, identity, thread, start, plain)

    async def _thread_stream(
        self,
        receive: Receive,
        send: Send,
        origin: str | None,
        identity: Identity,
        thread: str,
        start: Start,
        plain: bool,
    ) -> None:
        """Answer ``GET /threads/<thread>/events``: the thread from *start*, then live
        (*plain*: AG-UI events only, see :class:`SseStream`)."""
        gateway = self.gateway
        stream = SseStream(thread, gateway.config.send_queue_bytes, identity=identity, plain=plain)
        if isinstance(start, Position):
            # What the client has: a drain need not hold a client that resumed at
            # (or past) a stopped run's end (a snapshot, in another epoch, resets it).
            stream.offset = start.offset
        await _start_sse(send, origin)
        await _write(send, f"retry: {RETRY_MILLISECONDS}\n\n".encode(), gateway.write_timeout)
        async with self._serving(stream, receive, send):
            try:
                join = "position" if isinstance(start, Position) else start.value
                await gateway.hub.subscribe(stream, thread, join, start, None)
                await self._pump(stream, send)
            except AguiHubError as exc:
                info = json.dumps({"code": exc.code, "message": str(exc)})
                await _write(send, stream.named(info, "hub-error"), gateway.write_timeout)

    @contextlib.asynccontextmanager
    async def _serving(
        self, stream: SseStream, receive: Receive, send: Send
    ) -> AsyncIterator[None]:
        """While an SSE response is written: *stream* is one of :attr:`streams` and a
        task watches for its client leaving; then it leaves the hub and the response
        ends (bounded, whatever the client does)."""
        self.streams.add(stream)
        watcher = asyncio.ensure_future(_watch_disconnect(receive, stream))
        try:
            yield
        finally:
            watcher.cancel()
            self.streams.discard(stream)
            self.gateway.hub.unsubscribe(stream, stream.thread)
            await _end(send, self.gateway.write_timeout)

    async def _pump(self, stream: SseStream, send: Send) -> None:
        """Write what the hub queues for *stream* until it ends or the client goes."""
        gateway = self.gateway
        write_timeout = gateway.write_timeout
        identity = stream.identity
        while True:
            if self.closing.is_set() and not self.holds(stream):
                # (A run's stream ends with the run, which the drain ends first; a
                # viewer of a stopped run's thread is held until that end reached it.)
                stream.close_for_restart()
            wait = KEEPALIVE_SECONDS
            if identity is not None and identity.expires is not None:
                left = identity.expires - time.time()
                if left <= 0:
                    # As a WebSocket is closed 4401: the client comes back with a new token.
                    stream.close_soon(CloseCode.UNAUTHORIZED, "the token expired")
                wait = max(0.0, min(wait, left))
            chunk = await stream.next_chunk(wait)
            if chunk is None:
                return
            if not chunk:
                if identity is not None and gateway.authenticator.revoked(identity):
                    stream.close_soon(CloseCode.FORBIDDEN, "the token was revoked")
                    continue
                run = stream.run
                if run is not None and run.done.is_set() and run.outcome is None:
                    return  # the run ended without an end the thread holds (the store failed)
            body = chunk or encode_comment()
            try:
                # A client that stops reading holds its stream, not the gateway.
                await asyncio.wait_for(
                    send({"type": "http.response.body", "body": body, "more_body": True}),
                    write_timeout,
                )
            except TimeoutError:
                # A client whose window stays full would hold the socket (and its
                # buffer) for ever: dropped as a WebSocket that stalls is.
                log.info("SSE client of thread %s took no data for %.1f s: dropped",
                         stream.thread, write_timeout)  # fmt: skip
                stream.gone()
                _abort(send)
                return
            except OSError:
                stream.gone()
                return

    # -- DELETE /threads/<thread>/run ----------------------------------------------------------

    async def _cancel(
        self, scope: Scope, send: Send, headers: Headers, origin: str | None, path: str
    ) -> None:
        gateway = self.gateway
        thread = self._thread_of(path, "/run")
        query = scope.get("query_string", b"").decode("latin-1")
        identity = await self._identity(headers, query)
        run_id = _first(parse_qs(query), "runId")
        run = gateway.runs.cancel(identity, thread, run_id)
        await run.done.wait()
        body = json.dumps({"cancelled": run.as_json()}).encode() + b"\n"
        await _plain(send, http.HTTPStatus.OK, body, origin, "application/json")


def _start_of(headers: Headers, query: dict[str, list[str]]) -> Start:
    """Where a GET stream starts: after Last-Event-ID, or ``from`` (default: the start)."""
    last = headers.get("Last-Event-ID") or _first(query, "lastEventId")
    epoch = _first(query, "epoch")
    if last:
        try:
            offset_key(last)
        except AguiHubError:
            raise _HttpError(
                http.HTTPStatus.BAD_REQUEST, "invalid_offset",
                f"Last-Event-ID {last!r} is not an offset of this hub ('<ms>-<seq>')",
            ) from None  # fmt: skip
        return Position(last, epoch)
    value = (query.get("from") or ["start"])[0]
    kinds = {"start": StartKind.START, "live": StartKind.LIVE, "snapshot": StartKind.SNAPSHOT}
    if value not in kinds:
        raise _HttpError(
            http.HTTPStatus.BAD_REQUEST, "bad_request",
            f"from={value!r}: use start, live or snapshot (or Last-Event-ID to resume)",
        )  # fmt: skip
    return kinds[value]


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


async def _write(send: Send, body: bytes, timeout: float) -> None:
    """Write a part of a streamed response; a client that takes nothing for *timeout*
    seconds is dropped (:func:`_abort`), as a WebSocket that stalls is."""
    try:
        await asyncio.wait_for(
            send({"type": "http.response.body", "body": body, "more_body": True}), timeout
        )
    except TimeoutError:
        _abort(send)


def _abort(send: Send) -> None:
    """Drop the connection of *send* at once (uvicorn's response cycle has the transport)."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    if transport is not None:
        transport.abort()


async def _end(send: Send, timeout: float) -> None:
    """Finish a streamed response (bounded: the client may have stopped reading)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(
            send({"type": "http.response.body", "body": b"", "more_body": False}), timeout
        )


async def _watch_disconnect(receive: Receive, stream: SseStream) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            stream.gone()
            return


def _cors_headers(origin: str | None) -> list[tuple[bytes, bytes]]:
    """The CORS headers of an answer to an allowed *origin*. Credentials (the token's
    cookie) are allowed too: an origin is only allowed by name when a cookie may carry
    the token (``jwt_cookie`` refuses ``allowed_origins=*``), and without a cookie
    setting the browser has no credentials this listener reads."""
    if not isinstance(origin, str):
        return []
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-allow-credentials", b"true"),
        (b"vary", b"Origin"),
    ]


async def _start_sse(send: Send, origin: str | None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-store"),
                (b"x-accel-buffering", b"no"),  # nginx: pass each event on at once
                (b"x-content-type-options", b"nosniff"),
                *_cors_headers(origin),
            ],
        }
    )


async def _plain(
    send: Send,
    status: http.HTTPStatus,
    body: bytes,
    origin: str | None,
    content_type: str = "text/plain; charset=utf-8",
    extra: dict[str, str] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
        *_cors_headers(origin),
        *((k.lower().encode(), v.encode()) for k, v in (extra or {}).items()),
    ]
    await send({"type": "http.response.start", "status": status.value, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _error(send: Send, exc: _HttpError, origin: str | None) -> None:
    body = json.dumps({"error": {"code": exc.code, "message": str(exc)}}).encode() + b"\n"
    with contextlib.suppress(Exception):  # the response may have started: nothing to add then
        await _plain(send, exc.status, body, origin, "application/json", exc.headers)


class HttpListener:
    """uvicorn serving :class:`HttpApp` on ``http_port``, in this event loop."""

    def __init__(self, gateway: HttpHost) -> None:
        self.gateway = gateway
        self.app = HttpApp(gateway)
        self.server: uvicorn.Server | None = None
        self.socket: socket.socket | None = None
        self.port: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, ssl_files: tuple[str, str] | None) -> int:
        import uvicorn

        config = self.gateway.config
        sock = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if config.workers > 1:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((config.host, config.http_port or 0))
        sock.setblocking(False)
        self.socket = sock
        uv_config = uvicorn.Config(
            self.app,
            host=config.host,
            port=config.http_port or 0,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            date_header=False,
            ws="none",
            timeout_graceful_shutdown=5,
            # Past this many connections and tasks, new requests get 503 (per process);
            # fitted with the WebSocket connections to the open-file limit.
            limit_concurrency=self.gateway.http_connections,
            backlog=self.gateway.backlog,
            # The socket's address is the client's: a header must not choose whose
            # per-address limit a request counts against.
            proxy_headers=False,
            ssl_certfile=ssl_files[0] if ssl_files else None,
            ssl_keyfile=ssl_files[1] if ssl_files else None,
        )
        self.server = server = uvicorn.Server(uv_config)
        # Server._serve(), not serve(): serve() would take SIGINT and SIGTERM
        # over, and they are the gateway's (it drains on them).
        self._task = asyncio.create_task(server._serve(sockets=[sock]), name="agui-hub http")
        while not server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if not server.started:
            await self._task  # raises what stopped it
            raise OSError(f"the HTTP listener could not start on port {config.http_port}")
        self.port = sock.getsockname()[1]
        return self.port

    async def stop(self, ends: Mapping[str, str] | None = None, timeout: float = 5.0) -> None:
        """End every SSE stream (clients resume elsewhere), then stop listening.

        Call it after the bridge's runs ended, with where they ended (*ends*,
        thread: offset, from :meth:`Bridge.close`): a run's own stream, and a
        viewer of its thread, are given *timeout* seconds to deliver the run's
        end before they are cut (from a Redis store, the end reaches a viewer
        after its reader's next read).
        """
        app = self.app
        app.run_ends = {thread: offset_key(offset) for thread, offset in (ends or {}).items()}
        app.closing.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for stream in list(app.streams):
                if not app.holds(stream):
                    stream.close_for_restart()
            if not any(app.holds(s) for s in app.streams) or loop.time() > deadline:
                break
            await asyncio.sleep(0.05)
        app.run_ends = {}
        for stream in list(app.streams):
            stream.close_for_restart()
        if self.server is not None and self._task is not None:
            self.server.should_exit = True
            with contextlib.suppress(Exception):
                await self._task
