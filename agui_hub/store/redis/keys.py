"""Key names of the Redis store: one set of keys per thread, one per tenant.

Keys of one thread share one hash tag, ``{<tag>}``, so they live in one Redis
Cluster slot and one Lua script may touch them all (``agui`` is the default
prefix). The tag is :func:`thread_tag`: the thread id itself when it has no
``}``, else a space and the id with ``%`` written ``%25`` and ``}`` written
``%7D`` (a ``}`` would end the tag early: ``}abc`` would hash by the whole key,
each key of the thread to its own slot)::

    agui:{<tag>}:events         stream: one entry per event (format below)
    agui:{<tag>}:meta           hash: epoch, run (current run id), trimmed (last
                                trimmed offset), last (last offset appended), ids
                                ("1": ids kept), bytes (sum of the stored entries'
                                event payload sizes)
    agui:{<tag>}:ids            hash: event id -> offset, for idempotent publishing
    agui:{<tag>}:checkpoint     hash: offset, epoch, events, complete (see
                                :class:`~agui_hub.store.contract.Checkpoint`)
    agui:{<tag>}:runs           hash: run id -> msgpack [parent run id or "",
                                status, first offset, last offset or "", preview]:
                                the index of runs (docs/store.md)
    agui:{<tag>}:presence:exp     zset: connection id -> when its presence entry
                                  expires (ms, Redis's clock)
    agui:{<tag>}:presence:joined  zset: connection id -> when it joined (ms since
                                  the Unix epoch, the gateway's clock)
    agui:{<tag>}:presence:who     hash: connection id -> msgpack [subject, joined,
                                  client or nil]
    agui:{<tag>}:presence:v       string: the version of the thread's presence
                                  (absent: no entries, version 0)
    agui:{<tag>}:notify         pub/sub channel: "new entries": the entries
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

import re

__all__ = [
    "checkpoint_key",
    "ids_key",
    "meta_key",
    "notify_channel",
    "presence_keys",
    "runs_key",
    "stream_key",
    "tenant_key",
    "thread_of_tag",
    "thread_tag",
]

# A thread id never begins with whitespace (wire/offsets.check_thread), so a
# tag that does is an escaped one and no plain id can collide with it.
_ESCAPED = " "
_ESCAPE_RE = re.compile("%(25|7D)")
_UNESCAPE = {"25": "%", "7D": "}"}


def thread_tag(thread: str) -> str:
    """What stands between the braces of *thread*'s keys: their Redis Cluster hash tag.

    Redis hashes a key by the text between its first ``{`` and the first ``}``
    after it, so the tag must hold no ``}``: an id without one is its own tag
    (the keys of every such thread are what they always were); an id with one
    is written as a space, then the id with ``%`` as ``%25`` and ``}`` as
    ``%7D`` (``}abc`` -> ``" %7Dabc"``). A ``{`` needs nothing: it only ends up
    inside the tag. Publishers that build keys themselves must apply the same
    rule (docs/store.md, "Redis layout").
    """
    if "}" not in thread:
        return thread
    return _ESCAPED + thread.replace("%", "%25").replace("}", "%7D")


def thread_of_tag(tag: str) -> str | None:
    """The thread whose keys carry *tag*, or None when :func:`thread_tag` makes it for none.

    None for keys of another layout, e.g. those of an id with ``}`` written
    before the tag was escaped (``agui:{a}b}:events``): they are not read as
    anyone's, rather than taken for a thread whose keys are elsewhere.
    """
    thread = tag
    if tag.startswith(_ESCAPED):
        thread = _ESCAPE_RE.sub(lambda match: _UNESCAPE[match.group(1)], tag[1:])
    return thread if thread and thread_tag(thread) == tag else None


def stream_key(prefix: str, thread: str) -> str:
    """The stream of *thread*'s events."""
    return f"{prefix}:{{{thread_tag(thread)}}}:events"


def meta_key(prefix: str, thread: str) -> str:
    """The hash of *thread*'s epoch, current run, trim mark, last offset and byte total."""
    return f"{prefix}:{{{thread_tag(thread)}}}:meta"


def ids_key(prefix: str, thread: str) -> str:
    """The hash of *thread*'s event ids to their offsets (idempotent appends)."""
    return f"{prefix}:{{{thread_tag(thread)}}}:ids"


def checkpoint_key(prefix: str, thread: str) -> str:
    """The hash of *thread*'s checkpoint."""
    return f"{prefix}:{{{thread_tag(thread)}}}:checkpoint"


def runs_key(prefix: str, thread: str) -> str:
    """The hash that indexes *thread*'s runs."""
    return f"{prefix}:{{{thread_tag(thread)}}}:runs"


def presence_keys(prefix: str, thread: str) -> list[str]:
    """The keys of *thread*'s presence, in the order the presence scripts take them:
    ``exp``, ``joined``, ``who``, ``v`` (docs/store.md, "Presence")."""
    base = f"{prefix}:{{{thread_tag(thread)}}}:presence:"
    return [base + "exp", base + "joined", base + "who", base + "v"]


def notify_channel(prefix: str, thread: str) -> str:
    """The pub/sub channel on which appends to *thread* notify live readers."""
    return f"{prefix}:{{{thread_tag(thread)}}}:notify"


def tenant_key(prefix: str, tenant: str) -> str:
    """The set of *tenant*'s thread ids (see :func:`~agui_hub.store.tenant_of`).

    Its members are thread ids as they are (not tags). Its braces hash nothing
    that matters: it is never used on Redis Cluster (no tenant quota there).
    """
    return f"{prefix}:tenant:{{{tenant}}}"
