"""The client's credentials: which token a connection attempt sends, and renewing it in time.

A client is given a token (a JWT) or a :data:`TokenProvider`. With a provider
and ``refresh`` on, :class:`ClientCredentials` renews the connection's
credentials before they expire by sending a new token in an ``auth`` command
on the open connection (:meth:`ClientCredentials.start_renewing`), so the
gateway never has to close it with 4401.

The token is a credential: it is kept private here and never formatted into a
log line, a repr or an exception message.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import inspect
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..gateway.auth import Grants
from .handshake import describe
from .settings import ClientSettings

__all__ = [
    "REFRESH_LEAD_MAX",
    "REFRESH_SHARE",
    "Authenticated",
    "ClientCredentials",
    "LinkStatus",
    "TokenProvider",
    "token_expiry",
]

log = logging.getLogger("agui_hub.client")

TokenProvider = Callable[[], str | Awaitable[str]]
"""A callable that returns a token (a JWT), or an awaitable of one: called for each
connection attempt and each refresh, so it should hand out a fresh token when the
last one is close to expiry."""

REFRESH_SHARE = 0.2
"""The credentials are renewed when this share of their remaining lifetime is left ..."""
REFRESH_LEAD_MAX = 60.0
"""... but not earlier than this many seconds before they expire."""


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (Unix seconds), read without verifying it; ``None``
    when *token* is not a JWT or has no ``exp``.

    The client only schedules refreshes with it: the gateway verifies the token.
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, binascii.Error):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, int | float) and not isinstance(exp, bool) and math.isfinite(exp):
        return float(exp)
    return None


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(x for x in value if isinstance(x, str)) if isinstance(value, list) else ()


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The gateway's answer to :meth:`~agui_hub.client.HubClient.authenticate`: who the
    connection is now.

    ``expires`` is when these credentials end (Unix seconds; ``None``: never);
    ``grants`` which threads the connection may subscribe to and publish into
    (``grants.allows(Action.SUBSCRIBE, thread)``, see :mod:`agui_hub.gateway.auth`).
    """

    subject: str
    expires: float | None
    grants: Grants

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> Authenticated:
        """Read an ``authenticated`` frame, tolerating missing or malformed fields."""
        expires = reply.get("expires")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            expires = None
        grants = reply.get("grants")
        grants = grants if isinstance(grants, dict) else {}
        return cls(
            str(reply.get("subject", "")),
            None if expires is None else float(expires),
            Grants(_strings(grants.get("subscribe")), _strings(grants.get("publish"))),
        )


class LinkStatus(Protocol):
    """What the renewal needs to know of the connection it renews credentials on."""

    @property
    def connected(self) -> bool:
        """A connection is open right now (not reconnecting)."""
        ...

    @property
    def ended(self) -> bool:
        """The client closed, or gave up for good: nothing is left to renew."""
        ...


class ClientCredentials:
    """The token a client sends, when its credentials expire, and their renewal.

    *token* is a JWT, a :data:`TokenProvider`, or ``None`` (no credentials).
    Ask :meth:`token_now` for the token of each connection attempt, and call
    :meth:`adopt` with it once the connection is open (or :meth:`authenticated`
    after an ``auth`` command): that schedules the renewal, which
    :meth:`start_renewing` carries out while the connection is open.
    """

    def __init__(self, settings: ClientSettings, token: str | TokenProvider | None) -> None:
        self._settings = settings
        # The token the next connection attempt sends, or the provider to ask for it.
        self._token: str | None = token if isinstance(token, str) else None
        self._provider: TokenProvider | None = None if isinstance(token, str) else token
        # When the connection's credentials expire, and when to renew them (Unix
        # seconds: token expiries are wall-clock times); the renewal wakes on
        # _rescheduled whenever they change.
        self._expires: float | None = None
        self._refresh_at: float | None = None
        self._rescheduled = asyncio.Event()
        self._renewal: asyncio.Task[None] | None = None

    @property
    def has_provider(self) -> bool:
        """Whether a provider can hand out a new token (after a 4401, a refused one)."""
        return self._provider is not None

    async def token_now(self) -> str | None:
        """The token for the next connection attempt or refresh: the provider's, or the
        one given (``None``: none). What the provider raises propagates."""
        if self._provider is None:
            return self._token
        answer = self._provider()
        token = await answer if inspect.isawaitable(answer) else answer
        if not isinstance(token, str) or not token:
            raise TypeError(
                f"the token provider returned {type(token).__name__}, not a non-empty string"
            )
        return token

    def adopt(self, token: str | None, expires: float | None = None) -> None:
        """The connection's credentials are now *token* (valid until *expires*, else
        the token's ``exp``): schedule their renewal."""
        if expires is None and token is not None:
            expires = token_expiry(token)
        self._expires = expires
        if expires is None or self._provider is None or not self._settings.refresh:
            self._refresh_at = None
        else:
            left = max(0.0, expires - time.time())
            self._refresh_at = expires - min(left * REFRESH_SHARE, REFRESH_LEAD_MAX)
        self._rescheduled.set()

    def authenticated(self, token: str, expires: float | None) -> None:
        """An ``auth`` command with *token* succeeded: adopt it, and without a provider
        send it on later connection attempts too (what proved this connection proves
        the next one)."""
        if self._provider is None:
            self._token = token
        self.adopt(token, expires)

    def start_renewing(
        self, link: LinkStatus, authenticate: Callable[[str], Awaitable[object]]
    ) -> None:
        """Renew the credentials before they expire, with *authenticate* on *link*,
        until :meth:`stop_renewing`. Does nothing without a provider or with
        ``refresh`` off."""
        if self._provider is not None and self._settings.refresh:
            self._renewal = asyncio.create_task(self._renew(link, authenticate))

    def stop_renewing(self) -> None:
        """Cancel the renewal (the client closed or gave up)."""
        if self._renewal is not None:
            self._renewal.cancel()

    async def renewal_stopped(self) -> None:
        """Wait for a cancelled renewal to end."""
        if self._renewal is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewal

    async def _renew(
        self, link: LinkStatus, authenticate: Callable[[str], Awaitable[object]]
    ) -> None:
        """Renew the credentials before they expire, while the client is open."""
        while not link.ended:
            self._rescheduled.clear()
            due = self._refresh_at
            if due is None:
                await self._rescheduled.wait()
                continue
            if not link.connected:
                # A reconnect is under way: it brings a new token and a new schedule.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._rescheduled.wait(), 1.0)
                continue
            delay = due - time.time()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._rescheduled.wait(), delay)
                continue
            expires = self._expires
            try:
                token = await self.token_now()
                assert token is not None  # only runs with a provider
                await authenticate(token)  # adopts the new expiry: a new schedule
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("agui-hub client: renewing the credentials failed (%s); "
                            "trying again shortly", describe(exc))  # fmt: skip
                if self._refresh_at == due:  # not replaced meanwhile (by a reconnect)
                    now = time.time()
                    left = 0.0 if expires is None else expires - now
                    # Often enough to renew before the expiry; past it, until the
                    # gateway closes (4401) and the reconnect brings a new token.
                    pause = min(10.0, max(0.25, left / 4)) if left > 0 else 2.0
                    self._refresh_at = now + pause
