"""Presence in Redis: who is watching each thread, across every gateway that
shares the store (docs/store.md, "Presence").

A thread's entries are four keys in its slot (:func:`~agui_hub.store.redis.keys.presence_keys`),
changed and read only by two scripts, ``lua/presence_update.lua`` and
``lua/presence_read.lua``, which take Redis's TIME for "now" (the gateways'
clocks do not matter for expiry) and drop expired entries before anything
else. Each store call is one round trip whatever the number of threads: one
script call per thread, all in one pipeline on the store's pool (on Redis
Cluster, one pipeline per master). Both scripts are safe to send twice (a
replay after a lost connection changes nothing more), so the connection
retries of redis-py are too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import msgpack
from redis.exceptions import NoScriptError

from ...errors import StoreError
from ...wire.codec import encode_msgpack
from ..contract import PresenceChange, PresenceEntry, PresencePage
from . import scripts
from .calls import RedisCalls
from .keys import presence_keys
from .resp import command, round_trip, text
from .scripts import Script

__all__ = ["ThreadPresence"]

log = logging.getLogger("agui_hub.redis_store")

Call = tuple[list[str], list[Any]]
"""One script call: its KEYS and ARGV."""


class ThreadPresence:
    """The presence entries of the threads under *prefix*, through *calls*.

    Each method is bounded by the store's ``op_timeout``; a Redis failure is a
    :class:`~agui_hub.errors.StoreUnavailable` or
    :class:`~agui_hub.errors.StoreError`. Arguments are checked by the store
    (:func:`~agui_hub.store.contract.check_presence_ttl`,
    :func:`~agui_hub.store.contract.check_presence_read`).
    """

    def __init__(self, calls: RedisCalls, prefix: str) -> None:
        self._calls = calls
        self._prefix = prefix

    async def update(self, changes: Sequence[PresenceChange], ttl: float) -> None:
        """Apply *changes* (see :meth:`RedisStore.presence_update
        <agui_hub.store.redis.store.RedisStore.presence_update>`); after every
        thread's reply, raise the first thread's failure, if any."""
        if not changes:
            return
        ttl_ms = max(1, round(ttl * 1000))
        batch: list[Call] = []
        for change in changes:
            args: list[Any] = [ttl_ms, len(change.put)]
            for entry in change.put:
                # Packed before anything is sent: a client that cannot be stored
                # (ValueError) changes no thread.
                packed = encode_msgpack([entry.subject, entry.joined, entry.client])
                args += [entry.connection, entry.joined, packed]
            args += change.gone
            batch.append((presence_keys(self._prefix, change.thread), args))
        replies = await self._run(scripts.PRESENCE_UPDATE, batch, "a presence update")
        for change, reply in zip(changes, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._failure(change.thread, reply)

    async def read(
        self, threads: Sequence[str], limit: int, known: Sequence[int | None] | None
    ) -> list[PresencePage | None]:
        """Each thread's page, ``None`` where *known* gives its version (see
        :meth:`RedisStore.presence <agui_hub.store.redis.store.RedisStore.presence>`)."""
        if not threads:
            return []
        batch: list[Call] = []
        for i, thread in enumerate(threads):
            version = known[i] if known is not None else None
            args: list[Any] = ["" if version is None else str(version), limit - 1]
            batch.append((presence_keys(self._prefix, thread), args))
        replies = await self._run(scripts.PRESENCE_READ, batch, "a presence read")
        pages: list[PresencePage | None] = []
        for thread, reply in zip(threads, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._failure(thread, reply)
            pages.append(_page(thread, reply))
        return pages

    async def _run(self, script: Script, batch: list[Call], what: str) -> list[Any]:
        """*script* once per call of *batch*: the replies in order, an error reply
        as its exception. One round trip (one per master on a cluster), one more
        when Redis lost the script (a restart, a failover, SCRIPT FLUSH)."""
        calls = self._calls
        if calls.cluster is not None:
            return await calls.call(calls.cluster.eval_each(script, batch), what)
        return await calls.call(self._single(script, batch), what)

    async def _single(self, script: Script, batch: list[Call]) -> list[Any]:
        client = self._calls.client
        replies = await round_trip(client, _packed(script, batch), len(batch))
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            await client.script_load(script.source)
            again = [batch[i] for i in missing]
            for i, reply in zip(
                missing, await round_trip(client, _packed(script, again), len(again)), strict=True
            ):
                replies[i] = reply
        return replies

    def _failure(self, thread: str, exc: Exception) -> StoreError:
        if self._calls.unavailable(exc):
            return self._calls.failure(exc)  # a cluster master down, its slots moving
        return StoreError(
            f"thread {thread!r}: presence: Redis error: {exc}{self._calls.cluster_hint(exc)}"
        )


def _packed(script: Script, batch: list[Call]) -> bytes:
    return b"".join(
        command(b"EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in batch
    )


def _page(thread: str, reply: list[Any]) -> PresencePage | None:
    """A thread's page from the read script's reply (``None``: the known version)."""
    version = int(reply[0])
    if len(reply) == 1:
        return None
    _, count, ids, packed = reply
    entries: list[PresenceEntry] = []
    for connection, record in zip(ids, packed, strict=True):
        try:
            subject, joined, client = msgpack.unpackb(record, raw=False)
            entries.append(
                PresenceEntry(
                    text(connection),
                    str(subject),
                    int(joined),
                    client if isinstance(client, dict) else None,
                )
            )
        except (ValueError, TypeError, msgpack.UnpackException):
            # A record lost (evicted alone) or not written by the script: the
            # others are still worth showing.
            log.warning(
                "redis store: thread %r: unreadable presence record of %r", thread, connection
            )
    return PresencePage(int(count), entries, version)
