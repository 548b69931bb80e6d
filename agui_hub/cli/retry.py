"""Waiting out a hub that cannot be reached: :class:`Retry`, the ``--timeout``
option that bounds it, and connecting a :class:`~agui_hub.client.hub_client.HubClient`
through it."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import AguiHubError, HubUnreachable, RateLimited, StoreUnavailable
from .common import UsageError

DEFAULT_TIMEOUT = 30.0
"""Seconds that publish, demo, run and cancel wait for an unreachable hub before giving up."""
NOTICE_EVERY = 10.0
"""Seconds between two "still retrying" lines while the hub cannot be reached."""
WAIT_HELP = (
    "give up after SECONDS without a connection to the hub (default %s); while it "
    "cannot be reached the command says so at once, then every 10 s"
)

_T = TypeVar("_T")


class Retry:
    """How one command waits out a hub it cannot reach.

    The first failure is said at once (the URL and the reason), then one
    "still retrying" line every :data:`NOTICE_EVERY` seconds rather than one
    per attempt, and one line when the hub answers again. After *timeout*
    seconds without a connection (``None``: never; ``0``: at the first
    failure) the command gives up with :class:`HubUnreachable`.
    """

    def __init__(
        self,
        command: str,
        url: str,
        timeout: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ) -> None:
        from ..store.urls import redact_url

        self.url = redact_url(url)
        self.timeout = timeout
        self._clock = clock
        self._say = say or (lambda text: print(f"agui-hub {command}: {text}", file=sys.stderr))
        self._since: float | None = None  # when the current outage began
        self._told = 0.0  # when it was last said
        self._delay = 0.1

    def failed(self, exc: AguiHubError, began: float | None = None) -> float:
        """Note a failed attempt (*began* at that time): the seconds to pause
        before the next one.

        Raises *exc* itself with a timeout of 0, :class:`HubUnreachable` once the
        outage has lasted *timeout* seconds (counted from the start of its first
        failed attempt, which may have waited for the connection a while).
        """
        if self.timeout == 0:
            raise exc
        now = self._clock()
        reason = str(exc) if self.url in str(exc) else f"cannot reach {self.url}: {exc}"
        first = self._since is None
        if self._since is None:
            self._since, self._told = (now if began is None else began), now
            until = "until it answers" if self.timeout is None else f"for up to {self.timeout:g} s"
            self._say(f"{reason}; retrying {until} (--timeout)")
        if self.timeout is not None and now - self._since >= self.timeout:
            raise HubUnreachable(
                f"gave up after {self.timeout:g} s without a connection (--timeout): {reason}"
            ) from exc
        if not first and now - self._told >= NOTICE_EVERY:
            self._told = now
            self._say(f"still retrying {self.url} ({now - self._since:.0f} s so far): {exc}")
        # A busy gateway (HTTP 429 / 503) says when to come back.
        pause = max(self._delay, getattr(exc, "retry_after", 0.0))
        self._delay = min(self._delay * 2, 2.0)
        if self.timeout is not None:
            pause = min(pause, max(0.0, self._since + self.timeout - now))
        return pause

    def succeeded(self) -> None:
        if self._since is not None:
            self._say(f"connected to {self.url} after {self._clock() - self._since:.0f} s")
        self._since = None
        self._delay = 0.1

    async def call(self, attempt: Callable[[], Awaitable[_T]]) -> _T:
        """*attempt()* until it does not fail for want of the hub."""
        while True:
            began = self._clock()
            try:
                result = await attempt()
            except (HubUnreachable, StoreUnavailable) as exc:
                await asyncio.sleep(self.failed(exc, began))
                continue
            except RateLimited as exc:
                # Nothing was carried out: the same command again is safe, once
                # the gateway's pause is over. The hub is there: not an outage.
                await asyncio.sleep(max(exc.retry_after, 0.05))
                continue
            self.succeeded()
            return result


def timeout_of(args: argparse.Namespace, default: float | None) -> float | None:
    """The command's --timeout in seconds (``None``: wait for ever)."""
    value: float | None = getattr(args, "timeout", None)
    if value is None:
        return default
    if not value >= 0:  # also NaN
        raise UsageError("--timeout must be 0 or more seconds")
    return None if math.isinf(value) else value


async def connect_client(
    url: str, retry: Retry, token: str | None = None, give_up_after: float | None = None
) -> Any:
    """A connected HubClient, once the gateway answers (as *retry* says)."""
    from ..client.hub_client import HubClient

    async def attempt() -> Any:
        client = HubClient(url, token=token, give_up_after=give_up_after)
        await client.connect()
        return client

    return await retry.call(attempt)
