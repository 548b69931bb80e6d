"""Key names of the Redis store: one set of keys per thread, one per tenant.

Keys of one thread share the ``{thread}`` hash tag, so they live in one Redis
Cluster slot and one Lua script may touch them all (``agui`` is the default
prefix)::

    agui:{<thread>}:events      stream: one entry per event (format below)
    agui:{<thread>}:meta        hash: epoch, run (current run id), trimmed (last
                                trimmed offset), last (last offset appended), ids
                                ("1": ids kept), bytes (sum of the stored entries'
                                event payload sizes)
    agui:{<thread>}:ids         hash: event id -> offset, for idempotent publishing
    agui:{<thread>}:checkpoint  hash: offset, epoch, events, complete (see
                                :class:`~agui_hub.store.contract.Checkpoint`)
    agui:{<thread>}:notify      pub/sub channel: "new entries": the entries
                                themselves (see :mod:`agui_hub.store.redis.live`)
                                or the last offset
    agui:tenant:{<tenant>}      set: the tenant's threads (only with
                                max_tenant_threads; never on Redis Cluster, which
                                refuses that option)

Entry format (fields of each stream entry, values are bytes)::

    event   msgpack of the event's canonical wire dict (camelCase, no null optionals)
    id      the producer's event id (idempotency key)
    run     the run id the event belongs to ("" when unknown)
    type    the event type, e.g. TEXT_MESSAGE_CONTENT

A producer in another language may append with a plain XADD in this format
(docs/store.md); :func:`~agui_hub.store.redis.resp.parse_entry` reads whatever
it finds.
"""

from __future__ import annotations

__all__ = [
    "checkpoint_key",
    "ids_key",
    "meta_key",
    "notify_channel",
    "stream_key",
    "tenant_key",
]


def stream_key(prefix: str, thread: str) -> str:
    """The stream of *thread*'s events."""
    return f"{prefix}:{{{thread}}}:events"


def meta_key(prefix: str, thread: str) -> str:
    """The hash of *thread*'s epoch, current run, trim mark, last offset and byte total."""
    return f"{prefix}:{{{thread}}}:meta"


def ids_key(prefix: str, thread: str) -> str:
    """The hash of *thread*'s event ids to their offsets (idempotent appends)."""
    return f"{prefix}:{{{thread}}}:ids"


def checkpoint_key(prefix: str, thread: str) -> str:
    """The hash of *thread*'s checkpoint."""
    return f"{prefix}:{{{thread}}}:checkpoint"


def notify_channel(prefix: str, thread: str) -> str:
    """The pub/sub channel on which appends to *thread* notify live readers."""
    return f"{prefix}:{{{thread}}}:notify"


def tenant_key(prefix: str, tenant: str) -> str:
    """The set of *tenant*'s thread ids (see :func:`~agui_hub.store.tenant_of`)."""
    return f"{prefix}:tenant:{{{tenant}}}"
