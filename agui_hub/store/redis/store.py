"""The Redis thread store (``redis://``, ``rediss://``): one stream per thread.

On Redis Cluster (``redis+cluster://``, ``rediss+cluster://``) the same store
runs each thread's scripts on its slot's master; :mod:`agui_hub.store.redis.cluster`
holds what differs there (docs/cluster.md).

:class:`RedisStore` is the :class:`~agui_hub.store.contract.ThreadStore` on
Redis; its parts live in modules of their own:

- :mod:`~agui_hub.store.redis.keys`: the keys of a thread and the entry format;
- :mod:`~agui_hub.store.redis.appends`: appends, by group commit, each
  thread's in one call of the append script (``lua/append.lua``), which makes
  them idempotent by event id, conditional, trimmed and rewind-proof;
- :mod:`~agui_hub.store.redis.pages`: pages of a thread read consistently with
  trimming (what :meth:`RedisStore.read` and ``read_available`` are made of);
- :mod:`~agui_hub.store.redis.presence`: who is watching each thread, one
  script call per thread (``lua/presence_update.lua``, ``lua/presence_read.lua``);
- :mod:`~agui_hub.store.redis.live`: the live tail, one reader per store
  object serving every thread with local subscribers over one pub/sub
  connection;
- :mod:`~agui_hub.store.redis.calls`: the client, the deadline of each call
  and the mapping of Redis failures to store errors;
- :mod:`~agui_hub.store.redis.scripts` and ``lua/``: the Lua scripts;
- :mod:`~agui_hub.store.redis.resp`: RESP packing and reply parsing for the
  hot paths.

Every operation a caller awaits is bounded by ``op_timeout``; see
docs/store.md for the whole contract.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import msgpack

from ...agui.runs import RunState
from ...errors import OffsetExpired
from ..contract import (
    START,
    Available,
    Checkpoint,
    Entry,
    EventInput,
    Expected,
    FeedSubscription,
    Offset,
    PresenceChange,
    PresencePage,
    Retention,
    RunInfo,
    ThreadInfo,
    check_presence_read,
    check_presence_ttl,
    check_thread,
    offset_key,
    tenant_of,
)
from ..urls import (
    _OWN_OPTIONS,
    CLUSTER_SCHEMES,
    DEFAULT_OP_TIMEOUT,
    check_redis_options,
    redact_url,
)
from . import scripts
from .appends import NOTIFY_BYTES, Appender
from .calls import RedisCalls, single_node_client
from .keys import (
    checkpoint_key,
    ids_key,
    meta_key,
    notify_channel,
    runs_key,
    stream_key,
    tenant_key,
    thread_of_tag,
)
from .live import OUTAGE_GRACE, LiveReader, LiveSource
from .pages import Page, ThreadPages
from .presence import ThreadPresence
from .resp import normal_offset, text

log = logging.getLogger("agui_hub.redis_store")

if TYPE_CHECKING:
    from .cluster_live import ClusterLiveReader

__all__ = [
    "CLUSTER_SCHEMES",
    "NOTIFY_BYTES",
    "OUTAGE_GRACE",
    "READ_PAGE",
    "READ_TRIES",
    "RedisStore",
    "checkpoint_key",
    "durability_problems",
    "ids_key",
    "meta_key",
    "notify_channel",
    "runs_key",
    "stream_key",
    "tenant_key",
]

_GLOB_SPECIAL = re.compile(r"[\\*?\[\]]")  # what SCAN MATCH reads as a pattern

READ_PAGE = 5000
"""Entries per round trip of :meth:`RedisStore.read` and ``read_available``."""

READ_TRIES = 5
"""Pages-wise attempts of ``read_available`` before it reads in one round trip."""


class RedisStore:
    """Thread streams in Redis. See :mod:`agui_hub.store.redis.keys` for keys and entries.

    Every operation a caller awaits is bounded by *op_timeout* seconds: when
    Redis does not answer in time it raises
    :class:`~agui_hub.errors.StoreUnavailable` (redis-py's retries happen
    within that deadline). :attr:`url` is the URL with its password
    redacted; the store never shows the password in a message or log.
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        prefix: str = "agui",
        retention: Retention | None = None,
        max_connections: int = 16,
        socket_timeout: float = 5.0,
        max_pending_bytes: int | None = None,
        outage_grace: float = OUTAGE_GRACE,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        notify_bytes: int = NOTIFY_BYTES,
    ) -> None:
        if notify_bytes < 0:
            raise ValueError(f"RedisStore notify_bytes must not be negative, got {notify_bytes!r}")
        for name, value, positive in (
            ("op_timeout", op_timeout, True),
            ("outage_grace", outage_grace, False),
            ("socket_timeout", socket_timeout, True),
        ):
            if not math.isfinite(value) or value < 0 or (positive and value == 0):
                raise ValueError(
                    f"RedisStore {name} must be a finite number of seconds, got {value!r}"
                )
        self.url = redact_url(url)
        """The Redis URL without its password (safe to show)."""
        parts = urlsplit(url)
        names = list(parse_qs(parts.query, keep_blank_values=True))
        for name in names:
            if name in _OWN_OPTIONS:
                raise ValueError(
                    f"{name!r} in the URL of RedisStore({self.url!r}): pass it as an "
                    "argument, or open the store with open_store(url)"
                )
        scheme = parts.scheme.lower()
        check_redis_options(scheme.removesuffix("+cluster"), names)
        # Read-only below: the parts made from them keep their own copies.
        self._outage_grace = outage_grace
        self._op_timeout = op_timeout
        self._prefix = prefix
        retention = retention or Retention()
        self._max_pending = max_pending_bytes
        append_script, check_script = scripts.APPEND, scripts.CHECK_POSITION
        if scheme in CLUSTER_SCHEMES:
            from .cluster import ClusterOps

            if retention.max_tenant_threads:
                raise ValueError(
                    f"max_tenant_threads is not available on Redis Cluster ({self.url}): a "
                    "tenant's set of threads and the threads live in different slots, which "
                    "one script cannot check atomically; leave it at 0 (docs/cluster.md)"
                )
            cluster = ClusterOps(
                url, prefix=prefix, max_connections=max_connections, socket_timeout=socket_timeout
            )
            self._calls = RedisCalls(cluster.client, self.url, op_timeout, cluster)
            append_script, check_script = cluster.scripts(append_script, check_script)
        else:
            client = single_node_client(url, max_connections, socket_timeout)
            self._calls = RedisCalls(client, self.url, op_timeout)
        self._client: Any = self._calls.client
        """redis-py's Redis or RedisCluster: the calls both take are the ones used."""
        self._appender = Appender(
            self._calls,
            append_script,
            prefix=prefix,
            retention=retention,
            notify_bytes=notify_bytes,
        )
        self._pages = ThreadPages(self._calls, prefix)
        self._presence = ThreadPresence(self._calls, prefix)
        live = LiveSource(self._calls, self._pages, check_script, prefix, outage_grace)
        self._reader: LiveReader | ClusterLiveReader
        if self._calls.cluster is None:
            self._reader = LiveReader(live)
        else:
            from .cluster_live import ClusterLiveReader

            self._reader = ClusterLiveReader(live, self._calls.cluster)
        self._reads: dict[tuple[str, Offset, int], asyncio.Future[Page]] = {}
        """Page reads in flight, shared by the callers that ask for the same one."""

    def __repr__(self) -> str:
        return f"RedisStore({self.url!r}, prefix={self.prefix!r})"

    @property
    def prefix(self) -> str:
        """The key prefix (``agui``): fixed for the store's life."""
        return self._prefix

    @property
    def op_timeout(self) -> float:
        """Seconds one store operation may take; fixed for the store's life."""
        return self._op_timeout

    @property
    def outage_grace(self) -> float:
        """Seconds a live feed waits out an outage; fixed for the store's life."""
        return self._outage_grace

    @property
    def retention(self) -> Retention:
        """What the store keeps of each thread (the append script applies it)."""
        return self._appender.retention

    @retention.setter
    def retention(self, value: Retention) -> None:
        self._appender.retention = value

    @property
    def notify_bytes(self) -> int:
        """Appends whose events total at most this many bytes carry them in their
        notification (0: notifications carry only the last offset)."""
        return self._appender.notify_bytes

    @notify_bytes.setter
    def notify_bytes(self, value: int) -> None:
        self._appender.notify_bytes = value

    # -- writing --------------------------------------------------------------------------

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        check_thread(thread)
        if not events:
            return []
        return await self._appender.append(thread, events, expect)

    # -- reading --------------------------------------------------------------------------

    async def stored_ids(self, thread: str, event_ids: Sequence[str]) -> dict[str, Offset]:
        check_thread(thread)
        if not event_ids:
            return {}
        found = await self._calls.call(
            self._client.hmget(ids_key(self.prefix, thread), list(event_ids))
        )
        return {i: text(o) for i, o in zip(event_ids, found, strict=True) if o is not None}

    async def _shared_page(self, thread: str, after: Offset, limit: int) -> Page:
        """:meth:`_read_page`, one read for all who ask for the same page at once.

        Viewers that resume together (a gateway restart, a network blip) ask
        for the same pages of the same thread: one round trip and one parse
        serve them all. A caller that gives up does not cancel the read for
        the others; a failure reaches them all.
        """
        key = (thread, after, limit)
        read = self._reads.get(key)
        if read is None:
            read = asyncio.ensure_future(self._read_page(thread, after, limit))
            self._reads[key] = read
            read.add_done_callback(lambda done: self._forget_read(key, done))
        return await asyncio.shield(read)

    def _forget_read(self, key: tuple[str, Offset, int], read: asyncio.Future[Page]) -> None:
        if self._reads.get(key) is read:
            del self._reads[key]
        if not read.cancelled():
            read.exception()  # retrieved: whoever awaited it got it

    async def _read_page(self, thread: str, after: Offset, limit: int | None) -> Page:
        """One page of *thread*: what every read of this store is made of."""
        return await self._pages.read(thread, after, limit)

    async def _fetch(
        self, thread: str, after: Offset, limit: int
    ) -> tuple[str | None, list[Entry]]:
        offset_key(after)
        page = await self._read_page(thread, after, limit)
        if page.expired(after):
            first = await self._calls.call(
                self._client.xrange(stream_key(self.prefix, thread), count=1)
            )
            raise OffsetExpired(thread, after, text(first[0][0]) if first else None)
        return page.epoch, page.entries

    async def read(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> list[Entry]:
        check_thread(thread)
        if limit is not None:
            return (await self._fetch(thread, after, limit))[1]
        out: list[Entry] = []
        cursor = after
        while True:
            _, page = await self._fetch(thread, cursor, READ_PAGE)
            out += page
            if len(page) < READ_PAGE:
                return out
            cursor = page[-1].offset

    async def read_available(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> Available:
        check_thread(thread)
        offset_key(after)
        if limit is not None:
            page = await self._shared_page(thread, normal_offset(after), limit)
            return Available(page.epoch, page.trimmed, list(page.entries), page.expired(after))
        for attempt in range(READ_TRIES):
            # The last try reads everything in one MULTI: consistent whatever
            # the producers do meanwhile, at the price of one large reply.
            size = None if attempt == READ_TRIES - 1 else READ_PAGE
            page = await self._read_page(thread, after, size)
            epoch, trimmed, entries = page.epoch, page.trimmed, list(page.entries)
            gap = page.expired(after)
            while size is not None and len(page.entries) == size:
                cursor = entries[-1].offset
                page = await self._read_page(thread, cursor, size)
                if page.epoch != epoch:
                    break  # re-created meanwhile: start over
                if page.expired(cursor):
                    # Trimming overtook this read: what it has is trimmed now;
                    # go on after the new trim mark, with a gap. (Otherwise the
                    # trim mark stays the one read with the first entry: the
                    # entries follow it without a hole.)
                    gap = True
                    trimmed = page.trimmed
                    entries = []
                entries += page.entries
            else:
                return Available(epoch, trimmed, entries, gap)
        raise AssertionError("unreachable")  # pragma: no cover

    async def epoch(self, thread: str) -> str | None:
        check_thread(thread)
        return await self._pages.ensure_epoch(thread)

    async def last_offset(self, thread: str) -> Offset:
        return await self._pages.last_offset(thread)

    def subscribe(self, thread: str, after: Offset | None = None) -> FeedSubscription:
        return FeedSubscription(self, thread, after, max_pending_bytes=self._max_pending)

    async def _register(self, sub: FeedSubscription) -> None:
        await self._reader.register(sub)

    def _unregister(self, sub: FeedSubscription) -> None:
        self._reader.unregister(sub)

    @property
    def live_threads(self) -> int:
        """Threads the live reader currently serves."""
        return self._reader.threads

    # -- operators --------------------------------------------------------------------------

    async def info(self, thread: str) -> ThreadInfo | None:
        check_thread(thread)
        epoch = await self.epoch(thread)
        if epoch is None:
            return None
        stream = stream_key(self.prefix, thread)
        pipe = self._client.pipeline(transaction=False)
        pipe.xlen(stream)
        pipe.xrange(stream, count=1)
        pipe.xrevrange(stream, count=1)
        pipe.hmget(meta_key(self.prefix, thread), ["run", "trimmed", "bytes"])
        pipe.pttl(stream)
        length, first, last, (run, trimmed, size), pttl = await self._calls.call(pipe.execute())
        return ThreadInfo(
            thread=thread,
            epoch=epoch,
            length=int(length),
            first=text(first[0][0]) if first else None,
            last=text(last[0][0]) if last else None,
            trimmed=text(trimmed) if trimmed else None,
            run_id=text(run) if run else None,
            ttl=pttl / 1000 if pttl and pttl > 0 else None,
            bytes=int(size) if size else 0,
        )

    async def threads(self, limit: int = 1000) -> list[str]:
        # The prefix is matched as it is: a `*` or `[` in it is no wildcard.
        pattern = _GLOB_SPECIAL.sub(r"\\\g<0>", self.prefix) + ":{*}:events"
        head, tail = len(self.prefix) + 2, len("}:events")
        found: set[str] = set()

        def add(keys: Iterable[Any]) -> None:
            for key in keys:
                # Keys are named by the thread's tag: read the id back from it.
                thread = thread_of_tag(text(key)[head:-tail])
                if thread is not None:
                    found.add(thread)

        if self._calls.cluster is not None:
            add(await self._calls.call(self._calls.cluster.scan(pattern, limit)))
            return sorted(found)[:limit]
        cursor: Any = 0
        while True:
            cursor, keys = await self._calls.call(
                self._client.scan(cursor, match=pattern, count=1000, _type="stream")
            )
            add(keys)
            if not cursor or len(found) >= limit:
                break
        return sorted(found)[:limit]

    async def delete(self, thread: str) -> bool:
        check_thread(thread)
        keys = [
            stream_key(self.prefix, thread),
            meta_key(self.prefix, thread),
            ids_key(self.prefix, thread),
            checkpoint_key(self.prefix, thread),
            runs_key(self.prefix, thread),
        ]
        channel = notify_channel(self.prefix, thread)
        if self._calls.cluster is not None:
            # No tenant sets on a cluster (no quota there): the thread's keys only.
            removed = await self._calls.call(self._client.delete(*keys))
            await self._calls.call(self._client.spublish(channel, "deleted"))
            return bool(removed)
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(*keys)
        # Its slot in the tenant's quota is free at once (also when the quota
        # is off: a set left from when it was on must not count it).
        pipe.srem(tenant_key(self.prefix, tenant_of(thread)), thread)
        removed, _ = await self._calls.call(pipe.execute())
        # Tell live readers, so their subscribers learn of the reset now.
        await self._calls.call(self._client.publish(channel, "deleted"))
        return bool(removed)

    async def put_checkpoint(self, thread: str, checkpoint: Checkpoint) -> None:
        check_thread(thread)
        keys = [checkpoint_key(self.prefix, thread), meta_key(self.prefix, thread)]
        args: list[Any] = [
            checkpoint.offset,
            checkpoint.epoch,
            checkpoint.events,
            int(checkpoint.complete),
            int(self.retention.ttl * 1000),
        ]
        await self._calls.call(
            self._client.eval(scripts.CHECKPOINT.source, len(keys), *keys, *args)
        )

    async def runs(self, thread: str) -> list[RunInfo]:
        check_thread(thread)
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(runs_key(self.prefix, thread))
        pipe.hmget(meta_key(self.prefix, thread), ["run", "last"])
        records, (current, head) = await self._calls.call(pipe.execute())
        current = text(current) if current else None
        found: list[RunInfo] = []
        for run_id, packed in records.items():
            try:
                parent, status, first, last, preview = msgpack.unpackb(packed, raw=True)
                info = RunInfo(
                    run_id=text(run_id),
                    parent_run_id=text(parent) or None,
                    status=RunState(text(status)),
                    first=text(first),
                    last=text(last) or None,
                    # A preview cut inside a character by the script loses that character.
                    preview=preview.decode("utf-8", "ignore"),
                )
            except (ValueError, TypeError, msgpack.UnpackException):
                log.warning("redis store: thread %r: unreadable run record %r", thread, run_id)
                continue
            if info.last is None and info.run_id == current and head:
                info = dataclasses.replace(info, last=text(head))
            found.append(info)
        found.sort(key=lambda r: offset_key(r.first))
        return found

    async def get_checkpoint(self, thread: str) -> Checkpoint | None:
        check_thread(thread)
        raw = await self._calls.call(
            self._client.hmget(
                checkpoint_key(self.prefix, thread), ["offset", "epoch", "events", "complete"]
            )
        )
        offset, epoch, events, complete = raw
        if offset is None or epoch is None or not isinstance(events, bytes):
            return None
        return Checkpoint(text(offset), text(epoch), events, complete == b"1")

    # -- presence ---------------------------------------------------------------------------

    async def presence_update(self, changes: Sequence[PresenceChange], ttl: float) -> None:
        """See :meth:`ThreadStore.presence_update
        <agui_hub.store.contract.ThreadStore.presence_update>`: one call of
        ``lua/presence_update.lua`` per change, all in one round trip (one per
        master on a cluster). A client that msgpack cannot store raises
        :class:`ValueError` before anything is sent."""
        ttl = check_presence_ttl(ttl)
        for change in changes:
            check_thread(change.thread)
        await self._presence.update(changes, ttl)

    async def presence(
        self, threads: Sequence[str], limit: int, known: Sequence[int | None] | None = None
    ) -> list[PresencePage | None]:
        """See :meth:`ThreadStore.presence <agui_hub.store.contract.ThreadStore.presence>`:
        one call of ``lua/presence_read.lua`` per thread, all in one round trip (one
        per master on a cluster)."""
        check_presence_read(threads, limit, known)
        return await self._presence.read(threads, limit, known)

    async def ping(self) -> None:
        """:class:`StoreUnavailable` unless Redis answers (on a cluster: every master)."""
        if self._calls.cluster is not None:
            await self._calls.call(self._calls.cluster.ping(), "PING")
        else:
            await self._calls.call(self._client.ping(), "PING")

    async def durability_warnings(self) -> list[str]:
        """Warnings about Redis settings that break the store's promises.

        Reads ``appendonly``, ``appendfsync``, ``save``, ``maxmemory`` and
        ``maxmemory-policy`` with CONFIG GET; a Redis that does not allow it
        (managed services) gets one warning saying so. See docs/store.md,
        "Redis settings the store needs". On Redis Cluster every master is
        checked, and each warning names the master.
        """
        names = ("appendonly", "appendfsync", "save", "maxmemory", "maxmemory-policy")
        per_server: dict[str, list[Any]]
        if self._calls.cluster is not None:
            per_server = await self._calls.call(self._calls.cluster.config_get(names), "CONFIG GET")
        else:
            pipe = self._client.pipeline(transaction=False)
            for name in names:
                pipe.config_get(name)
            replies = await self._calls.call(pipe.execute(raise_on_error=False), "CONFIG GET")
            per_server = {self.url: replies}
        warnings: list[str] = []
        for where, replies in per_server.items():
            refused = next((r for r in replies if isinstance(r, Exception)), None)
            settings: dict[str, str] = {}
            for reply in replies:
                if isinstance(reply, dict):
                    settings.update({text(k): text(v) for k, v in reply.items()})
            if refused is not None or any(name not in settings for name in names):
                why = f"CONFIG GET failed: {refused}" if refused is not None else "incomplete reply"
                warnings.append(
                    f"Redis at {where} does not let the store read its settings ({why}); "
                    "check by hand that appendonly is yes and maxmemory-policy is noeviction "
                    "(docs/store.md, 'Redis settings the store needs')."
                )
                continue
            warnings += durability_problems(settings, where, uses_ttl=self.retention.ttl > 0)
        return warnings

    async def close(self) -> None:
        await self._appender.close()
        await self._reader.close()
        await self._calls.close()


def durability_problems(settings: dict[str, str], where: str, *, uses_ttl: bool) -> list[str]:
    """The warnings :meth:`RedisStore.durability_warnings` gives for *settings*
    (CONFIG GET names to values), about the Redis at *where*."""
    warnings = []
    appendonly = settings.get("appendonly", "").lower()
    fsync = settings.get("appendfsync", "").lower()
    save = settings.get("save", "").strip()
    policy = settings.get("maxmemory-policy", "").lower()
    maxmemory = settings.get("maxmemory", "0")
    if appendonly == "no" and not save:
        warnings.append(
            f'Redis at {where} persists nothing (appendonly no, save ""): a restart loses '
            "every thread (readers see new epochs); set appendonly yes "
            "(CONFIG SET appendonly yes, and in redis.conf)."
        )
    elif appendonly == "no":
        warnings.append(
            f'Redis at {where} has appendonly no (RDB snapshots only, save "{save}"): a '
            "restart rolls threads back to the last snapshot and loses the events stored "
            "since (readers see new epochs); set appendonly yes (CONFIG SET appendonly yes, "
            "and in redis.conf)."
        )
    elif fsync == "no":
        warnings.append(
            f"Redis at {where} has appendfsync no: a crash of its machine can lose the last "
            "~30 s of acknowledged events; set appendfsync everysec (at most ~1 s) or always."
        )
    if policy.startswith("allkeys-"):
        warnings.append(
            f"Redis at {where} has maxmemory-policy {policy} (maxmemory {maxmemory}): when "
            "memory runs out it evicts thread keys, events included; set maxmemory-policy "
            "noeviction (appends then fail instead of losing events)."
        )
    elif policy.startswith("volatile-") and uses_ttl:
        warnings.append(
            f"Redis at {where} has maxmemory-policy {policy} (maxmemory {maxmemory}) and the "
            "store gives threads a ttl (7 days unless set), which makes their keys "
            "evictable; set maxmemory-policy noeviction, or the store's ttl option to 0 "
            "(threads then never expire)."
        )
    return warnings
