"""The client's connection to a gateway: open it, keep it open, exchange commands over it.

:class:`GatewayLink` is one logical connection of a
:class:`~agui_hub.client.HubClient` that outlives the WebSockets it runs on:
when one drops it reconnects with backoff (honouring a busy gateway's
``Retry-After``, asking the token provider for each attempt), decides from
the close code whether it may (:mod:`agui_hub.client.closes`), and ends the
client with an error when it may not or gives up. Over it, commands get
their replies (:meth:`GatewayLink.request`, :meth:`GatewayLink.exchange`);
the frames about threads go to its :class:`ThreadFrames` (the
:class:`~agui_hub.client.router.SubscriptionRouter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
import random
from collections.abc import Coroutine
from typing import Any, Protocol

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..errors import (
    AguiHubError,
    ClientError,
    ConnectionRejected,
    DecodeError,
    HubUnreachable,
    RateLimited,
    from_error_frame,
)
from ..wire.codec import Encoding, decode, encode
from ..wire.protocol import CloseCode
from .closes import (
    CLIENT_FAULTS,
    NO_RESUME,
    faulty_frame_refused,
    gateway_refused_again,
    no_resume,
    unreadable_frame,
)
from .credentials import ClientCredentials
from .handshake import GatewayBusy, describe, open_websocket
from .retry import Backoff, rate_limited_pause, retry_after
from .settings import ClientSettings

__all__ = ["ClientState", "ConnectionLost", "GatewayLink", "ThreadFrames"]

log = logging.getLogger("agui_hub.client")

THREAD_FRAMES = frozenset({"event", "snapshot", "subscribed", "joined", "left"})
"""Frames about a subscribed thread, for its subscription (``presence`` too, without id)."""


class ClientState(enum.Enum):
    """Where a :class:`~agui_hub.client.HubClient` is in its life."""

    NEW = "new"
    OPEN = "open"
    RECONNECTING = "reconnecting"
    CLOSED = "closed"


class ConnectionLost(Exception):
    """A command's connection closed before its reply; send it again after reconnecting."""


class ThreadFrames(Protocol):
    """Where a :class:`GatewayLink` hands what concerns subscriptions."""

    async def resubscribe_all(self, ws: ClientConnection) -> None:
        """*ws* was just opened: subscribe every thread on it again, before any frame is read."""
        ...

    def route(self, frame: dict[str, Any]) -> None:
        """An ``event``, ``snapshot``, ``subscribed`` frame, or one about who watches the
        thread (``presence`` without id, ``joined``, ``left``)."""
        ...

    def on_error(self, frame: dict[str, Any]) -> bool:
        """An ``error`` frame that answers no command in flight; ``False``: not about a
        subscription (the link logs it)."""
        ...

    def fail(self, error: AguiHubError) -> None:
        """The client ended with *error*: every subscription raises it."""
        ...


class GatewayLink:
    """One client's connection to the gateway, reconnected whenever it drops.

    *settings* is the client (its URL, encoding, timeouts, backoff and frame
    limits, read when needed); *credentials* give the token of each attempt.
    Set :attr:`threads` before :meth:`connect`. Commands go through
    :meth:`request` (or :meth:`wait_connected` then :meth:`exchange`, to do
    something once the connection is known), which wait for a connection
    while the link reconnects.
    """

    threads: ThreadFrames
    """Where frames about threads go, and who resubscribes them after a reconnect."""

    def __init__(self, settings: ClientSettings, credentials: ClientCredentials) -> None:
        self._settings = settings
        self._credentials = credentials
        self.state = ClientState.NEW
        self.reconnects = 0
        """How many times the connection was re-established."""
        self.close_code: int | None = None
        """The close code of the last lost connection (``None`` before any)."""
        self._close_reason = ""
        self._closed_here = False  # the last connection was failed by this client
        self._backoff = Backoff(settings.backoff_min, settings.backoff_max)
        self._faulted = False  # a CLIENT_FAULTS close since the gateway last answered
        self.ws: ClientConnection | None = None
        """The current WebSocket (the last one while reconnecting)."""
        self.failure: AguiHubError | None = None
        """Why the client ended for good (it gave up or was rejected)."""
        self._connected = asyncio.Event()
        self._stopped = asyncio.Event()  # set when the client closed or gave up
        self._kick = asyncio.Event()  # set to reconnect now rather than after the backoff
        self._task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._chores: set[asyncio.Task[Any]] = set()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def ended(self) -> bool:
        return self.state is ClientState.CLOSED or self.failure is not None

    def next_id(self) -> int:
        """A fresh command id (the gateway echoes it in the reply)."""
        return next(self._ids)

    # -- life cycle -----------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the first connection (see :meth:`~agui_hub.client.HubClient.connect` for
        what it raises)
        and keep it open from then on."""
        if self.state is not ClientState.NEW:
            raise ClientError(f"this client is already {self.state.value}")
        self.ws = await self._open(await self._credentials.token_now())
        self.state = ClientState.OPEN
        self._connected.set()
        self._task = asyncio.create_task(self._manage(self.ws))

    async def close(self) -> None:
        """Close the connection for good; commands in flight raise
        :class:`~agui_hub.errors.ClientError`."""
        self.state = ClientState.CLOSED
        self._connected.clear()
        self._stopped.set()
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._credentials.stop_renewing()
        await self._credentials.renewal_stopped()
        for task in list(self._chores):
            task.cancel()
        self.fail_pending(ClientError("the client was closed"))

    async def _open(self, token: str | None) -> ClientConnection:
        settings = self._settings
        ws = await open_websocket(
            settings.url,
            encoding=settings.encoding,
            headers=settings.headers,
            token=token,
            open_timeout=settings.open_timeout,
            max_receive_bytes=settings.max_receive_bytes,
        )
        self._credentials.adopt(token)
        return ws

    async def _manage(self, ws: ClientConnection) -> None:
        """Serve the connection; when it drops, reconnect and resubscribe, until closed."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                opened = loop.time()
                await self._serve(ws)
                code = self.close_code or 0
                self._connected.clear()
                if loop.time() - opened >= self._settings.backoff_max:
                    # Lasted as long as the longest pause: reconnecting at once
                    # costs no more than waiting backoff_max would.
                    self.healthy()
                fault = None if self._closed_here else CLIENT_FAULTS.get(code)
                if fault is not None:
                    # Sending the same command again would be refused again.
                    self.fail_pending(faulty_frame_refused(code, fault, self._close_reason))
                self.fail_pending(ConnectionLost(f"connection closed ({code})"))
                if self.state is ClientState.CLOSED:
                    return
                if code in NO_RESUME and not (
                    code == CloseCode.UNAUTHORIZED and self._credentials.has_provider
                ):
                    # (With a provider, 4401 means: connect again with a new token.)
                    self._fail_all(no_resume(code, self._close_reason))
                    return
                if self._closed_here:
                    self._fail_all(
                        unreadable_frame(code, self._close_reason, self._settings.max_receive_bytes)
                    )
                    return
                if fault is not None:
                    if self._faulted:
                        self._fail_all(gateway_refused_again(code, fault, self._close_reason))
                        return
                    self._faulted = True
                self.state = ClientState.RECONNECTING
                ws = await self._reconnect()
                self.ws = ws
                self.reconnects += 1
                self.state = ClientState.OPEN
                self._connected.set()
        except AguiHubError as exc:
            self._fail_all(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: do not leave consumers waiting forever
            log.exception("agui-hub client: connection manager failed")
            self._fail_all(ClientError(f"the client failed: {exc!r}"))

    async def _reconnect(self) -> ClientConnection:
        loop = asyncio.get_running_loop()
        settings = self._settings
        lost_at = loop.time()
        backoff = self._backoff  # grows over connections until one proves healthy
        not_before = 0.0  # a busy gateway's Retry-After: not even a command cuts it short
        refused = False  # a 401 to the provider's last token
        while True:
            delay = backoff.next_delay()
            if settings.give_up_after is not None:
                left = lost_at + settings.give_up_after - loop.time()
                if left <= 0:
                    raise HubUnreachable(
                        f"no connection to {settings.url} for {settings.give_up_after:g} s; gave up"
                    )
                delay = min(delay, left)
                not_before = min(not_before, lost_at + settings.give_up_after)
            if not_before > loop.time():
                await asyncio.sleep(not_before - loop.time())
            # A command waiting for the connection cuts the pause short: backoff
            # spares a gateway that nobody needs right now, not one that is wanted.
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), delay)
            try:
                token = await self._credentials.token_now()
            except Exception as exc:  # the provider's: it may work next time
                log.warning("agui-hub client: the token provider failed: %s", describe(exc))
                continue
            try:
                return await self._open(token)
            except GatewayBusy as exc:
                # The gateway named the earliest retry that can succeed.
                pause = exc.retry_after
                not_before = loop.time() + pause + random.uniform(0, 0.1 + 0.1 * pause)
                log.info("agui-hub client: reconnecting to %s: %s", settings.url, exc)
            except HubUnreachable as exc:
                log.info("agui-hub client: reconnecting to %s: %s", settings.url, exc)
            except ConnectionRejected as exc:
                # A provider's token may have expired on its way here: one more, fresh
                # one. A second 401 in a row is the provider's problem, not a race.
                if (
                    exc.close_code != CloseCode.UNAUTHORIZED
                    or not self._credentials.has_provider
                    or refused
                ):
                    raise
                refused = True
                log.warning("agui-hub client: reconnecting to %s: %s; asking the token "
                            "provider for another token", settings.url, exc)  # fmt: skip

    async def _serve(self, ws: ClientConnection) -> None:
        """Resubscribe every thread, then dispatch frames until the connection closes."""
        encoding = self._settings.encoding
        try:
            await self.threads.resubscribe_all(ws)
            async for data in ws:
                try:
                    # The gateway's own frames: a snapshot of a long thread may hold
                    # any number of values (bounded by max_receive_bytes).
                    frame = decode(data, encoding, max_size=None, max_values=None)
                except DecodeError as exc:
                    log.warning("agui-hub client: undecodable frame ignored: %s", exc)
                    continue
                if isinstance(frame, dict):
                    self._dispatch(frame)
        except ConnectionClosed:
            pass
        protocol = ws.protocol
        received, sent = protocol.close_rcvd, protocol.close_sent
        self._closed_here = (
            sent is not None
            and sent.code in CLIENT_FAULTS
            and (received is None or protocol.close_rcvd_then_sent is False)
        )
        if self._closed_here:
            # websockets failed the connection: a frame of the gateway over
            # max_receive_bytes (1009), not UTF-8 (1007) or malformed (1002).
            assert sent is not None
            self.close_code, self._close_reason = sent.code, sent.reason
        elif received is not None:
            self.close_code, self._close_reason = received.code, received.reason
        else:
            # 1006 when the connection ended without a close frame (the network).
            self.close_code, self._close_reason = 1006, ""

    def _dispatch(self, frame: dict[str, Any]) -> None:
        kind = frame.get("type")
        if kind in THREAD_FRAMES or (kind == "presence" and frame.get("id") is None):
            # (A presence frame with an id answers a presence command.)
            self.threads.route(frame)
        elif kind == "error":
            if not self._settle_error(frame) and not self.threads.on_error(frame):
                log.warning("agui-hub client: error from the gateway: %s %s",
                            frame.get("code"), frame.get("message"))  # fmt: skip
        else:  # published, pong, unsubscribed, and the replies to other commands
            future = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
            if future is not None and not future.done():
                self.healthy()
                future.set_result(frame)

    def _settle_error(self, frame: dict[str, Any]) -> bool:
        """Raise an error frame in the command it answers; ``False``: none is waiting."""
        future = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return False
        thread, index = frame.get("thread"), frame.get("index")
        error = from_error_frame(
            str(frame.get("code")),
            str(frame.get("message")),
            thread if isinstance(thread, str) else None,
            index if type(index) is int else None,
        )
        if isinstance(error, RateLimited):
            error.retry_after = retry_after(frame)
        future.set_exception(error)
        return True

    def healthy(self) -> None:
        """The connection works: the next reconnect starts from the shortest pause."""
        self._backoff.reset()
        self._faulted = False

    def _fail_all(self, error: AguiHubError) -> None:
        self.failure = error
        self._credentials.stop_renewing()
        self._connected.clear()
        self._stopped.set()
        self.fail_pending(error)
        self.threads.fail(error)

    # -- commands -------------------------------------------------------------------------

    async def request(self, command: dict[str, Any], deadline: float | None) -> dict[str, Any]:
        """Send *command* and await its reply; sent again while the gateway answers
        ``rate_limited``, until *deadline* (then :class:`~agui_hub.errors.RateLimited`)."""
        while True:
            try:
                ws = await self.wait_connected(deadline)
                return await self.exchange(ws, command, deadline)
            except RateLimited as exc:
                await asyncio.sleep(rate_limited_pause(exc, deadline))

    async def exchange(
        self, ws: ClientConnection, command: dict[str, Any], deadline: float | None
    ) -> dict[str, Any]:
        """Send *command* on *ws* with a fresh id and await its reply (an error frame
        raises); :class:`ConnectionLost` when *ws* closes first, then it is up to the
        caller to send it again."""
        loop = asyncio.get_running_loop()
        command_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[command_id] = future
        try:
            try:
                await self.send(ws, {**command, "id": command_id})
            except ConnectionClosed:
                raise ConnectionLost("connection closed while sending") from None
            remaining = None if deadline is None else deadline - loop.time()
            try:
                return await asyncio.wait_for(asyncio.shield(future), remaining)
            except TimeoutError:
                raise HubUnreachable(f"no reply from {self._settings.url} in time") from None
        finally:
            self._pending.pop(command_id, None)

    async def wait_connected(self, deadline: float | None) -> ClientConnection:
        """The open connection, once there is one (a reconnect is hurried along);
        raises why there will be none, or :class:`~agui_hub.errors.HubUnreachable` at
        *deadline* (a loop time)."""
        while not self._connected.is_set():
            if self.failure is not None:
                raise self.failure
            if self.state is ClientState.CLOSED:
                raise ClientError("the client is closed")
            if self.state is ClientState.NEW:
                raise ClientError("connect the client first (async with HubClient(...))")
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                raise HubUnreachable(f"no connection to {self._settings.url} in time")
            self._kick.set()
            # Woken by a connection, or by the client closing or giving up.
            waiters = [
                asyncio.ensure_future(self._connected.wait()),
                asyncio.ensure_future(self._stopped.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        assert self.ws is not None
        return self.ws

    async def send(self, ws: ClientConnection, frame: dict[str, Any]) -> None:
        """Encode and send *frame* on *ws* (raises ``ConnectionClosed``)."""
        encoding = self._settings.encoding
        data = encode(frame, encoding)
        await ws.send(data if encoding is Encoding.MSGPACK else data.decode())

    def fail_pending(self, error: BaseException) -> None:
        """Every command awaiting a reply raises *error*."""
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that gave up must not warn
        self._pending.clear()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run *coro* in the background until it ends or the client closes (its
        failure is only logged)."""
        task = asyncio.ensure_future(coro)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[Any]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("client chore failed: %s", task.exception())
