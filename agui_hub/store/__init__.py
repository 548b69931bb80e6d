"""Thread streams: where every thread's events live, in order, with offsets.

One typed interface, :class:`ThreadStore`, with two implementations that pass
the same contract tests:

* :class:`~agui_hub.store.memory.MemoryStore` (``memory://``): in-process, the
  zero-set-up default and the reference implementation;
* :class:`~agui_hub.store.redis.store.RedisStore` (``redis://``, ``rediss://``):
  one Redis stream per thread, for real deployments.

Pick one by URL with :func:`open_store`::

    store = open_store("redis://localhost:6379/0?ttl=86400&max_tenant_threads=1000")
    offsets = await store.append("thread-1", [EventInput(wire_event, event_id="e1")])
    entries = await store.read("thread-1", after=START)
    async with store.subscribe("thread-1", after=offsets[-1]) as feed:
        async for entry in feed:
            ...

Offsets
-------
An :class:`Offset` is the Redis stream entry id of the event, ``"<ms>-<seq>"``
(the memory store makes ids the same way). Offsets of one thread grow strictly,
compare with :func:`offset_key`, and survive gateway restarts. They are only
meaningful together with the thread's **epoch**, an opaque string that changes
when the thread's stream was lost and re-created (Redis restarted without
persistence, key evicted or expired, thread deleted): a client that resumes
"after X in epoch E" gets exactly the events after X when E is still the epoch,
and is told to resync otherwise.

Errors
------
Store failures derive from :class:`~agui_hub.errors.StoreError`; see
:mod:`agui_hub.errors` for the whole tree. :class:`OffsetExpired` means "the
events you asked for were trimmed", :class:`ThreadReset` "the stream was
re-created": never a silent partial read.
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    AppendConflict,
    InvalidOffset,
    OffsetExpired,
    StoreError,
    StoreUnavailable,
    SubscriptionLagged,
    ThreadReset,
    TooManyThreads,
)
from ..wire.offsets import START, Offset, check_thread, offset_key
from .contract import (
    Available,
    Checkpoint,
    Entry,
    EventInput,
    Expected,
    FeedSubscription,
    PresenceChange,
    PresenceEntry,
    PresencePage,
    Retention,
    ThreadInfo,
    ThreadStore,
    tenant_of,
)
from .urls import REDIS_SCHEMES, parse_store_url, redact_url

__all__ = [
    "REDIS_SCHEMES",
    "START",
    "AppendConflict",
    "Available",
    "Checkpoint",
    "Entry",
    "EventInput",
    "Expected",
    "FeedSubscription",
    "InvalidOffset",
    "Offset",
    "OffsetExpired",
    "PresenceChange",
    "PresenceEntry",
    "PresencePage",
    "Retention",
    "StoreError",
    "StoreUnavailable",
    "SubscriptionLagged",
    "ThreadInfo",
    "ThreadReset",
    "ThreadStore",
    "TooManyThreads",
    "check_thread",
    "offset_key",
    "open_store",
    "redact_url",
    "tenant_of",
]


def open_store(url: str | None = None, *, retention: Retention | None = None) -> ThreadStore:
    """Create the store named by *url* (``None`` or ``""``: the memory store).

    Options in the URL's query: ``prefix`` (Redis key prefix, default
    ``agui``); retention (see :class:`Retention`, ``0`` disables each):
    ``max_len`` (events per thread, default 100000), ``max_age`` (seconds,
    default off), ``ttl`` (seconds without an append before a thread
    expires, default 604800: 7 days), ``max_bytes`` (bytes of event
    payloads per thread, default 134217728: 128 MiB),
    ``max_tenant_threads`` (threads per tenant, default off); ``op_timeout``
    (seconds, deadline of one store operation, default 5), ``outage_grace``
    (seconds a live feed waits out an outage, default 5), and for
    ``redis://`` the options redis-py documents. An explicit *retention*
    overrides the URL's retention options (all of them). Raises
    :class:`ValueError` for a URL it cannot use: an unknown scheme or
    option, a bad number, or ``redis://`` without the ``redis`` extra
    installed.
    """
    parsed = parse_store_url(url or "memory://")
    chosen = retention or parsed.retention
    if parsed.scheme == "memory":
        from .memory import MemoryStore

        return MemoryStore(retention=chosen)
    try:
        from .redis.store import RedisStore
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith(("redis", "hiredis")):
            raise
        raise ValueError(
            f"the Redis store needs the redis package ({exc.name} is missing): "
            "pip install 'agui-hub[redis]'"
        ) from None

    assert parsed.redis_url is not None
    options: dict[str, Any] = {}
    if parsed.op_timeout is not None:
        options["op_timeout"] = parsed.op_timeout
    if parsed.outage_grace is not None:
        options["outage_grace"] = parsed.outage_grace
    return RedisStore(parsed.redis_url, prefix=parsed.prefix, retention=chosen, **options)
