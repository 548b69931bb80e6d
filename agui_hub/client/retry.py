"""When the client tries again: reconnect backoff, ``Retry-After`` and ``rate_limited`` pauses.

Shared by the connection (reconnecting), the publish pipeline (a publish sent
again) and the subscriptions (a subscribe the gateway could not serve yet).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import RateLimited

__all__ = ["MAX_RETRY_AFTER", "Backoff", "rate_limited_pause", "retry_after"]

MAX_RETRY_AFTER = 300.0
"""Longest ``Retry-After`` (seconds) honoured from a gateway that is full or draining."""


@dataclass
class Backoff:
    """Exponential backoff with full jitter between *minimum* and *maximum* seconds.

    Call :meth:`next_delay` before each attempt and :meth:`reset` once an
    attempt proved the other side healthy.
    """

    minimum: float
    maximum: float
    attempt: int = field(default=0)

    def next_delay(self) -> float:
        """Full jitter: uniform in [0, min(maximum, minimum * 2**attempt)]."""
        cap = min(self.maximum, self.minimum * 2 ** min(self.attempt, 30))
        self.attempt += 1
        return random.uniform(0, cap)

    def reset(self) -> None:
        self.attempt = 0


def retry_after(frame: Mapping[str, Any]) -> float:
    """A ``rate_limited`` frame's ``retryAfter`` (seconds), sane or 0."""
    value = frame.get("retryAfter")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return min(max(float(value), 0.0), MAX_RETRY_AFTER)
    return 0.0


def rate_limited_pause(exc: RateLimited, deadline: float | None) -> float:
    """Seconds to wait before sending a command answered ``rate_limited`` again;
    raises *exc* when that would pass *deadline* (a loop time).

    Nothing of the command was carried out: the same command (the same event
    ids) again is safe. The jitter spreads the clients it paused.
    """
    wait = max(exc.retry_after, 0.01)
    delay = wait + random.uniform(0, 0.05 + 0.2 * wait)
    if deadline is not None and asyncio.get_running_loop().time() + delay > deadline:
        raise exc
    return delay
