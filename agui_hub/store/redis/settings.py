"""Reading a Redis server's settings and INFO for ``agui-hub check``: the one
place outside the stores where the hub talks to Redis, kept in the store layer
so that nothing above it imports redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import StoreUnavailable
from ..urls import redact_url


async def redis_settings(
    redis_url: str, names: Sequence[str], timeout: float
) -> tuple[dict[str, str], str | None, dict[str, str]]:
    """Redis's settings *names* (CONFIG GET), why they could not be read (or None),
    and INFO: what ``agui-hub check`` judges.

    Raises :class:`StoreUnavailable` when Redis does not answer.
    """
    client = aioredis.Redis.from_url(
        redis_url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
    )
    settings: dict[str, str] = {}
    refused: str | None = None
    facts: dict[str, str] = {}
    try:
        for name in names:
            try:
                reply = await asyncio.wait_for(client.config_get(name), timeout)
            except (RedisConnectionError, RedisTimeoutError):
                raise
            except RedisError as exc:  # a managed Redis may refuse CONFIG
                refused = str(exc)
                break
            settings.update({str(k): str(v) for k, v in reply.items()})
        with contextlib.suppress(RedisConnectionError, RedisTimeoutError, RedisError):
            raw = await asyncio.wait_for(client.info(), timeout)
            facts = {str(k): str(v) for k, v in raw.items()}
    except (RedisConnectionError, RedisTimeoutError, TimeoutError, OSError) as exc:
        raise StoreUnavailable(f"Redis at {redact_url(redis_url)} is unavailable: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            await client.aclose()
    if refused is None and any(name not in settings for name in names):
        refused = "incomplete reply"
    return settings, refused, facts
