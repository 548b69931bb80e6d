"""Pages of thread streams read from Redis: a thread's epoch, trim mark and the
entries after a cursor, consistent with each other.

What both the store's reads (:meth:`RedisStore.read
<agui_hub.store.redis.store.RedisStore.read>`, ``read_available``) and the live
reader's catch-up reads are made of. One round trip reads a page of many
threads at once (the live reader reads every notified thread together).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import StoreError
from ..contract import START, Entry, Offset, offset_key
from .calls import RedisCalls
from .keys import meta_key, stream_key
from .resp import MAX_OFFSET, parse_entry, text

__all__ = ["Page", "ThreadPages"]


@dataclass(frozen=True, slots=True)
class Page:
    """One read of a thread: its epoch, last trimmed offset and entries after a cursor."""

    epoch: str | None
    trimmed: Offset | None
    entries: list[Entry]

    def expired(self, after: Offset) -> bool:
        """Whether events after *after* were trimmed away."""
        return self.trimmed is not None and offset_key(after) < offset_key(self.trimmed)


class ThreadPages:
    """Reads pages of the threads under *prefix* through *calls*.

    Each call is bounded by the store's ``op_timeout``; a Redis failure is a
    :class:`~agui_hub.errors.StoreUnavailable` or
    :class:`~agui_hub.errors.StoreError`.
    """

    def __init__(self, calls: RedisCalls, prefix: str) -> None:
        self._calls = calls
        self._prefix = prefix

    async def read_batch(
        self, cursors: Sequence[tuple[str, Offset]], limit: int | None
    ) -> list[Page | StoreError]:
        """For each (thread, after): epoch, trim mark and entries, in one round trip.

        MULTI makes each thread's meta and entries consistent with trimming (on
        Redis Cluster, where one MULTI cannot span slots, a read script per
        thread does). A thread whose commands fail (say a key of the wrong
        type) gets a :class:`StoreError` in its place (:class:`StoreUnavailable`
        when its cluster master is down); the others are unaffected.
        """
        calls, prefix = self._calls, self._prefix
        results: list[Any]
        if calls.cluster is not None:
            results = []
            for reply in await calls.call(calls.cluster.read_pages(cursors, limit)):
                results += [reply, reply] if isinstance(reply, Exception) else [reply[:2], reply[2]]
        else:
            pipe = calls.client.pipeline(transaction=True)
            for thread, after in cursors:
                pipe.hmget(meta_key(prefix, thread), ["epoch", "trimmed"])
                if offset_key(after) == MAX_OFFSET:
                    pipe.xrange(stream_key(prefix, thread), min="+", max="+", count=0)
                elif limit is None:
                    pipe.xrange(stream_key(prefix, thread), min=f"({after}")
                else:
                    pipe.xrange(stream_key(prefix, thread), min=f"({after}", count=limit)
            results = await calls.call(pipe.execute(raise_on_error=False))
        pages: list[Page | StoreError] = []
        for i, (thread, _) in enumerate(cursors):
            meta, raw = results[2 * i], results[2 * i + 1]
            failed = next((r for r in (meta, raw) if isinstance(r, Exception)), None)
            if failed is not None and calls.unavailable(failed):
                pages.append(calls.failure(failed))
                continue
            if failed is not None:
                pages.append(StoreError(f"thread {thread!r}: Redis error: {failed}"))
                continue
            epoch, trimmed = meta
            entries = [parse_entry(item) for item in raw]
            if epoch is None and entries:
                # Written with a plain XADD (another language) and never read:
                # the stream gets its epoch now.
                epoch = await self.ensure_epoch(thread)
            pages.append(
                Page(
                    epoch=text(epoch) if epoch else None,
                    trimmed=text(trimmed) if trimmed else None,
                    entries=entries,
                )
            )
        return pages

    async def read(self, thread: str, after: Offset, limit: int | None) -> Page:
        """One page of *thread*: up to *limit* entries after *after* (``None``: all)."""
        (page,) = await self.read_batch([(thread, after)], limit)
        if isinstance(page, StoreError):
            raise page
        return page

    async def ensure_epoch(self, thread: str) -> str | None:
        """*thread*'s epoch, made now for a stream written with a plain XADD;
        ``None`` for a thread that does not exist."""
        calls = self._calls
        meta = meta_key(self._prefix, thread)
        pipe = calls.client.pipeline(transaction=True)
        pipe.exists(stream_key(self._prefix, thread))
        pipe.hget(meta, "epoch")
        exists, epoch = await calls.call(pipe.execute())
        if epoch is not None or not exists:
            return text(epoch) if epoch is not None else None
        await calls.call(calls.client.hsetnx(meta, "epoch", secrets.token_hex(8)))
        epoch = await calls.call(calls.client.hget(meta, "epoch"))
        return text(epoch) if epoch is not None else None

    async def last_offset(self, thread: str) -> Offset:
        """The offset of *thread*'s newest entry (``START`` when it has none)."""
        calls = self._calls
        last = await calls.call(calls.client.xrevrange(stream_key(self._prefix, thread), count=1))
        return text(last[0][0]) if last else START
