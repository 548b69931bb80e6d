"""What the store tests share: each contract test runs on both stores."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agui_hub.store.contract import Retention, ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import RedisServer

StoreFactory = Callable[..., Awaitable[ThreadStore]]
"""Makes a store (``retention`` and the store's keyword arguments); closed after the test."""


@pytest.fixture(params=["memory", "redis"])
async def make_store(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[StoreFactory]:
    created: list[ThreadStore] = []

    async def factory(retention: Retention | None = None, **kwargs: Any) -> ThreadStore:
        store: ThreadStore
        if request.param == "memory":
            store = MemoryStore(retention=retention, **kwargs)
        else:
            prefix = f"t{uuid.uuid4().hex[:12]}"
            store = RedisStore(redis_server.url, prefix=prefix, retention=retention, **kwargs)
        created.append(store)
        return store

    yield factory
    for store in created:
        await store.close()
