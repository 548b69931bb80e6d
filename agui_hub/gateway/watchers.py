"""What a running gateway keeps an eye on: its store, and the credentials of its clients.

:class:`StoreHealth` remembers whether the store answered its last check (and
what its settings put at risk): ``/readyz`` and the ``agui_hub_store_up``
metric report it, and a gateway that started without its store waits for it
in the background (:meth:`StoreHealth.watch`). :func:`close_revoked` ends the
connections and SSE streams whose credentials were revoked since they
authenticated; :func:`watch_credentials` runs the gateway's check every few
seconds, so that a changed key or revocation file takes effect by itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable

from ..errors import AguiHubError
from ..store.contract import ThreadStore
from ..wire.protocol import CloseCode
from .auth import Authenticator
from .config import SECONDS
from .connection import Connection
from .sse_stream import SseStream

__all__ = ["AUTH_FILES_INTERVAL", "StoreHealth", "close_revoked", "watch_credentials"]

log = logging.getLogger("agui_hub.server")

STORE_CHECK_TIMEOUT = 2 * SECONDS
"""How long a store check (start-up, ``/readyz``) waits for an answer."""

AUTH_FILES_INTERVAL = 5 * SECONDS
"""How often the key and revocation files are checked for changes."""


class StoreHealth:
    """Whether the gateway's store is usable now, as its last check found it.

    *name* is how the log names the store (its URL without a password).
    """

    def __init__(self, store: ThreadStore, name: str) -> None:
        self.store = store
        self.name = name
        self.problem: str | None = None
        """Why the store is not usable now (``None``: it answered the last check)."""
        self.warnings: list[str] = []
        """What the store's settings put at risk (see docs/store.md)."""
        self.checked_at = -math.inf
        """When the store was last checked (monotonic)."""

    async def check(self) -> bool:
        """Ping the store and read its settings; remember why it is not usable."""
        self.checked_at = time.monotonic()
        try:
            await asyncio.wait_for(self.store.ping(), STORE_CHECK_TIMEOUT)
            self.warnings = await asyncio.wait_for(
                self.store.durability_warnings(), STORE_CHECK_TIMEOUT
            )
        except (AguiHubError, TimeoutError, OSError) as exc:
            # The store's messages name it by its redacted URL: no password here.
            self.problem = str(exc) or "no answer in time"
            return False
        self.problem = None
        return True

    async def watch(self) -> None:
        """Until the store answers: retry, and say so once it does (run it in a task)."""
        delay = 0.5 * SECONDS
        while not await self.check():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10 * SECONDS)
        log.info("store %s is available", self.name)
        for warning in self.warnings:
            log.warning("store %s: %s", self.name, warning)


def close_revoked(
    authenticator: Authenticator,
    connections: Iterable[Connection],
    streams: Iterable[SseStream],
) -> int:
    """Re-read the key and revocation files; close the revoked connections and
    SSE streams (4403). Returns how many were closed."""
    try:
        authenticator.reload()
    except ValueError as exc:
        log.error("authentication files: %s (keeping the previous ones)", exc)
    closed = 0
    for conn in list(connections):
        identity = conn.identity
        if identity is not None and authenticator.revoked(identity):
            log.info("connection %s: credentials of %r revoked", conn.remote,
                     identity.subject)  # fmt: skip
            conn.close_soon(CloseCode.FORBIDDEN, "credentials revoked")
            closed += 1
    for stream in list(streams):
        identity = stream.identity
        if identity is not None and authenticator.revoked(identity):
            log.info("SSE stream of thread %s: credentials of %r revoked",
                     stream.thread, identity.subject)  # fmt: skip
            stream.close_soon(CloseCode.FORBIDDEN, "the token was revoked")
            closed += 1
    return closed


async def watch_credentials(check: Callable[[], object]) -> None:
    """Call *check* (the gateway's revocation check) every
    :data:`AUTH_FILES_INTERVAL`, until cancelled; a failure is logged, never
    the end of the watch."""
    while True:
        await asyncio.sleep(AUTH_FILES_INTERVAL)
        try:
            check()
        except Exception:  # never let a bad file end the watch
            log.exception("checking revocations failed")
