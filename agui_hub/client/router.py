"""The client's subscriptions, one per thread, multiplexed over its connection.

:class:`SubscriptionRouter` keeps which :class:`~agui_hub.client.subscription.Subscription`
follows which thread, sends their subscribe and unsubscribe commands (again
after a reconnect, after a consumer fell behind, after the gateway could not
serve them yet) and hands each frame about a thread to its subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ..errors import AguiHubError, ClientError, CommandRejected
from .link import ClientState, GatewayLink
from .retry import retry_after
from .settings import ClientSettings
from .subscription import Subscription

__all__ = ["SubscriptionRouter"]


class SubscriptionRouter:
    """The subscriptions of one client over its *link*; *settings* give the backoff
    between subscribes the gateway could not serve.

    It is the :class:`~agui_hub.client.subscription.SubscriptionHost` of every
    subscription and the :class:`~agui_hub.client.link.ThreadFrames` of the link.
    """

    def __init__(self, link: GatewayLink, settings: ClientSettings) -> None:
        self._link = link
        self._settings = settings
        self._subs: dict[str, Subscription] = {}

    def __contains__(self, thread: str) -> bool:
        return thread in self._subs

    # -- the subscriptions' side (SubscriptionHost) --------------------------------------

    async def attach(self, sub: Subscription) -> None:
        link = self._link
        if link.failure is not None:
            raise link.failure
        if link.state in (ClientState.NEW, ClientState.CLOSED):
            raise ClientError("connect the client first (async with HubClient(...))")
        if self._subs.get(sub.thread) not in (None, sub):
            raise ValueError(f"already subscribed to thread {sub.thread!r} on this client")
        self._subs[sub.thread] = sub
        ws = link.ws
        if link.connected and ws is not None and sub._sent_on is not ws:
            sub._sent_on = ws  # before the await: the connection task must not send it too
            with contextlib.suppress(ConnectionClosed):  # resubscribed after reconnecting
                await link.send(ws, sub._subscribe_command(link.next_id()))

    async def detach(self, sub: Subscription) -> None:
        if self._subs.get(sub.thread) is not sub:
            return
        del self._subs[sub.thread]
        link = self._link
        if link.connected and link.ws is not None:
            command = {"type": "unsubscribe", "id": link.next_id(), "thread": sub.thread}
            with contextlib.suppress(ConnectionClosed):
                await link.send(link.ws, command)

    def resubscribe(self, sub: Subscription) -> None:
        """Subscribe *sub* again from what it received (after it lagged)."""
        link = self._link
        if link.connected and link.ws is not None and self._subs.get(sub.thread) is sub:
            link.spawn(link.send(link.ws, sub._subscribe_command(link.next_id())))

    def end_all(self) -> None:
        """The client closed: every subscription's iteration stops."""
        for sub in list(self._subs.values()):
            sub._closed = True
            sub._wake.set()
        self._subs.clear()

    # -- the link's side (ThreadFrames) ----------------------------------------------------

    async def resubscribe_all(self, ws: ClientConnection) -> None:
        for sub in list(self._subs.values()):
            if sub._sent_on is not ws and self._subs.get(sub.thread) is sub:
                sub._sent_on = ws
                await self._link.send(ws, sub._subscribe_command(self._link.next_id()))

    def route(self, frame: dict[str, Any]) -> None:
        thread = frame.get("thread")
        sub = self._subs.get(thread) if isinstance(thread, str) else None
        if sub is None:
            return
        kind = frame.get("type")
        if kind == "event":
            sub._on_event(frame)
        elif kind == "snapshot":
            sub._on_snapshot(frame)
        elif kind == "subscribed":
            if frame.get("id") is not None and frame.get("id") == sub._awaiting:
                self._link.healthy()  # the gateway serves the thread
            sub._on_subscribed(frame)
        elif kind in ("presence", "joined", "left"):
            sub._on_presence(frame)

    def on_error(self, frame: dict[str, Any]) -> bool:
        code, message = str(frame.get("code")), str(frame.get("message"))
        command_id = frame.get("id")
        thread = frame.get("thread") if isinstance(frame.get("thread"), str) else None
        sub = self._subs.get(thread) if thread is not None else None
        if sub is not None and command_id is not None and command_id == sub._awaiting:
            if code == "store_unavailable":
                # Not the subscription's fault: ask again after a pause.
                self._link.spawn(self._retry_subscribe(sub))
                return True
            if code == "rate_limited":
                # Not carried out: the same subscribe again once the gateway allows it.
                wait = retry_after(frame)
                pause = wait + random.uniform(0, 0.05 + 0.2 * wait)
                self._link.spawn(self._retry_subscribe(sub, pause))
                return True
            sub._fail(CommandRejected(code, message, thread))
            self._subs.pop(sub.thread, None)
            return True
        if sub is None and thread is not None and command_id is not None:
            if code == "rate_limited":
                # An unsubscribe the gateway did not carry out: the gateway would keep
                # sending the thread's frames (dropped here), so send it again.
                self._link.spawn(self._retry_unsubscribe(thread, retry_after(frame)))
                return True
            if code == "not_subscribed":
                return True  # an unsubscribe the gateway had done already (a retried one)
        if command_id is None and code in ("forbidden", "unknown_run") and sub is not None:
            # The gateway ended the subscription: the connection's grants (after a
            # refresh) no longer cover the thread, or the branch it followed is
            # gone (the thread was re-created). Not resubscribed on reconnect.
            sub._fail(CommandRejected(code, message, thread))
            self._subs.pop(sub.thread, None)
            return True
        return False

    def fail(self, error: AguiHubError) -> None:
        for sub in self._subs.values():
            sub._fail(error)

    # -- retries --------------------------------------------------------------------------

    async def _retry_subscribe(self, sub: Subscription, delay: float | None = None) -> None:
        if delay is None:
            # Doubling pauses from ~1 s up to backoff_max while the store stays away.
            low, high = self._settings.backoff_min, self._settings.backoff_max
            cap = max(low, min(high, max(low, 1.0) * 2 ** min(sub._retries, 30)))
            sub._retries += 1
            delay = random.uniform(low, cap)
        await asyncio.sleep(delay)
        self.resubscribe(sub)

    async def _retry_unsubscribe(self, thread: str, wait: float) -> None:
        await asyncio.sleep(wait + random.uniform(0, 0.05 + 0.2 * wait))
        link = self._link
        ws = link.ws
        if thread not in self._subs and link.connected and ws is not None:
            command = {"type": "unsubscribe", "id": link.next_id(), "thread": thread}
            await link.send(ws, command)
