"""The store contract: the values a store takes and returns (:class:`EventInput`,
:class:`Entry`, :class:`ThreadInfo`, :class:`Retention`, ...) and
:class:`ThreadStore`, the protocol every store implements.

Read :mod:`agui_hub.store` first: it says what a thread stream is and how to
pick a store by URL.
"""

from __future__ import annotations

import asyncio
import enum
import math
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ..agui.runs import RunInfo
from ..errors import (
    AppendConflict,
    InvalidEvent,
    InvalidOffset,
    OffsetExpired,
    StoreError,
    StoreUnavailable,
    SubscriptionLagged,
    ThreadReset,
    TooManyThreads,
)
from ..wire.codec import encode_msgpack
from ..wire.offsets import START, Offset, check_thread, offset_key

__all__ = [
    "ENTRY_OVERHEAD",
    "MAX_RUNS",
    "RUN_ID_OVERHEAD",
    "START",
    "AppendConflict",
    "Available",
    "Checkpoint",
    "Entry",
    "EventInput",
    "Expected",
    "InvalidOffset",
    "Offset",
    "OffsetExpired",
    "PresenceChange",
    "PresenceEntry",
    "PresencePage",
    "Retention",
    "RunInfo",
    "StoreError",
    "StoreUnavailable",
    "SubscriptionLagged",
    "ThreadInfo",
    "ThreadReset",
    "ThreadStore",
    "TooManyThreads",
    "check_presence_read",
    "check_presence_ttl",
    "check_thread",
    "entry_cost",
    "offset_key",
    "tenant_of",
]

# -- values ----------------------------------------------------------------------

MAX_RUNS = 4096
"""Runs a thread's index of runs keeps: past it, the oldest eighth goes."""


def encode_event_data(event: dict[str, Any]) -> bytes:
    """The msgpack bytes a store keeps for *event*; :class:`InvalidEvent` if impossible.

    Events from the wire were checked already; this catches values a Python
    caller passed that JSON cannot express (e.g. a lone surrogate in a string).
    """
    try:
        return encode_msgpack(event)
    except ValueError as exc:
        raise InvalidEvent(f"event cannot be stored: {exc}") from None


@dataclass(frozen=True, slots=True)
class EventInput:
    """One event to append.

    ``event`` is the canonical wire dict (validated); ``event_id`` is the
    producer-assigned idempotency key (a retry with the same id appends
    nothing and returns the original offset); ``run_id`` is the run the event
    belongs to when known (RUN_STARTED / RUN_FINISHED carry it; other events
    inherit the thread's current run).
    """

    event: dict[str, Any]
    event_id: str
    run_id: str | None = None

    @classmethod
    def of(cls, event: dict[str, Any], event_id: str | None = None) -> EventInput:
        """Wrap a validated wire dict; take the run id from it, make an id if none given.

        A generated id protects nothing: a producer that retries must keep
        the id it used the first time.
        """
        run_id = event.get("runId")
        return cls(event, event_id or uuid.uuid4().hex, run_id if isinstance(run_id, str) else None)


class Expected(NamedTuple):
    """What a conditional append expects of its thread: *epoch* (``None``: no
    thread yet) and nothing stored after *after*.

    A writer that verified events against everything up to *after* appends
    with this, so that a concurrent append by anyone else (another process, a
    plain ``XADD``) makes the append fail with
    :class:`~agui_hub.errors.AppendConflict` instead of slipping in between.
    """

    epoch: str | None
    after: Offset


class Entry(NamedTuple):
    """One stored event: its offset, the msgpack bytes of its wire dict, its ids.

    A named tuple: catch-up reads build thousands of them.
    """

    offset: Offset
    data: bytes
    event_id: str
    run_id: str | None
    type: str


ENTRY_OVERHEAD = 320
"""Bytes of memory an :class:`Entry` held in a queue costs beyond its data and
the characters of its strings: the tuple (80), the headers of the ``bytes``
(33) and of three ``str`` (49 each), the queue's slot (8), and the allocator's
rounding of each object to 16 bytes (about 40 on average). Measured with
``tracemalloc`` by ``tests/gateway/test_recent_memory.py`` (CPython 3.11+,
64-bit)."""

RUN_ID_OVERHEAD = 56
"""Bytes of memory an entry's run id costs beyond its characters (its header
and rounding); nothing when the entry has none."""


def entry_cost(entry: Entry) -> int:
    """Bytes of memory *entry* costs when the queue that holds it is its only
    holder (as the entries a Redis store reads are): count this, not
    ``len(entry.data)``, against a budget of entries kept in memory.

    A small event costs several times its data: 60 bytes of msgpack with a
    32-character event id cost about 520 bytes. Ids with characters outside
    ASCII are counted at 4 bytes a character, the most CPython may use.
    """
    offset, data, event_id, run_id, event_type = entry
    size = len(data) + len(offset) + ENTRY_OVERHEAD
    size += len(event_id) if event_id.isascii() else 4 * len(event_id)
    size += len(event_type) if event_type.isascii() else 4 * len(event_type)
    if run_id is not None:
        size += RUN_ID_OVERHEAD + (len(run_id) if run_id.isascii() else 4 * len(run_id))
    return size


@dataclass(frozen=True, slots=True)
class Available:
    """What :meth:`ThreadStore.read_available` found: the stored entries after
    an offset, with the epoch and trim mark read together with them.

    ``entries`` are the entries after ``max(after, trimmed)``, oldest first,
    with no hole between them nor before the first; ``gap`` is ``True`` when
    events after the requested offset had been trimmed, so the entries do not
    continue it (the history they give is incomplete). ``trimmed`` is the
    trim mark read with the first entry: read page by page, retention may
    have trimmed some of the entries since.
    """

    epoch: str | None
    """The thread's epoch (``None``: no such thread)."""
    trimmed: Offset | None
    """Offset of the last event removed by retention (``None``: nothing trimmed)."""
    entries: list[Entry]
    gap: bool = False
    """Events after the requested offset were trimmed before they could be read."""


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """What an operator sees of a thread."""

    thread: str
    epoch: str
    length: int
    first: Offset | None
    last: Offset | None
    trimmed: Offset | None
    """Offset of the last event removed by retention (``None``: nothing trimmed)."""
    run_id: str | None
    ttl: float | None
    """Seconds until the idle thread expires, ``None`` when it does not."""
    bytes: int = 0
    """Bytes of event payloads (msgpack) the thread holds: what ``max_bytes`` bounds."""

    @property
    def last_activity(self) -> int | None:
        """When the thread last got an event, in ms since the Unix epoch: the time
        part of its last offset (``None`` without one)."""
        if self.last is None:
            return None
        try:
            return offset_key(self.last)[0]
        except InvalidOffset:
            return None

    def as_json(self) -> dict[str, Any]:
        """What ``agui-hub info --json``, ``threads --json`` and ``/admin/threads``
        show of the thread (``lastActivity`` in ISO 8601 UTC, to the millisecond)."""
        return {
            "thread": self.thread,
            "epoch": self.epoch,
            "events": self.length,
            "bytes": self.bytes,
            "first": self.first,
            "last": self.last,
            "lastActivity": iso_utc(self.last_activity, precise=True),
            "trimmed": self.trimmed,
            "runId": self.run_id,
            "ttl": self.ttl,
        }


def iso_utc(ms: int | None, *, precise: bool = False) -> str | None:
    """*ms* since the Unix epoch in ISO 8601 UTC (``2026-12-04T15:23:49Z``, or with
    ``.123`` when *precise*); ``None`` for ``None`` or a time no calendar holds."""
    from datetime import UTC, datetime

    if ms is None:
        return None
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    if precise:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The folded state of a thread at an offset, stored to spare a full replay.

    ``events`` is the msgpack of :meth:`~agui_hub.agui.reducer.ThreadState.compact`
    at ``offset`` in ``epoch``; ``complete`` says whether that state folded
    the thread's whole history. A gateway writes checkpoints of the threads it
    serves, so that one that starts later (or after retention trimmed the
    beginning) folds from the checkpoint instead of the whole stream.
    """

    offset: Offset
    epoch: str
    events: bytes
    complete: bool = True


DEFAULT_MAX_BYTES = 128 * 1024 * 1024
"""Default ``max_bytes``: 128 MiB of event payloads per thread."""

DEFAULT_TTL = 7 * 24 * 3600.0
"""Default ``ttl``: a thread without appends for 7 days expires."""


@dataclass(frozen=True, slots=True)
class Retention:
    """What the store keeps: per thread (events, bytes, idle time) and per tenant
    (threads); ``0`` disables a limit.

    The default keeps, of each thread, the newest 100,000 events and at most
    128 MiB of them, of any age, and lets a thread expire after 7 days
    without an append; threads per tenant are not limited. A shared relay
    should also set ``max_tenant_threads``: with the default, one tenant can
    create threads without bound (each one bounded). Set ``ttl=0`` to keep
    idle threads for ever.

    Limits are checked when a thread is appended to: ``max_len``,
    ``max_age`` and ``max_bytes`` trim the oldest events (a reader past them
    gets :class:`OffsetExpired`), ``max_tenant_threads`` refuses the append
    that would create one thread too many.
    """

    max_len: int = 100_000
    """Keep at most this many events per thread (oldest go first); 0: no limit."""
    max_age: float = 0.0
    """Drop events older than this many seconds (checked when the thread is appended to)."""
    ttl: float = DEFAULT_TTL
    """Delete a whole thread after this many seconds without an append; 0: never."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Keep at most this many bytes of event payloads (their msgpack) per thread,
    trimming the oldest events; 0: no limit. The events of the append being made
    are never trimmed by it: an append larger than this on its own is kept whole
    (and trims every older event)."""
    max_tenant_threads: int = 0
    """At most this many live threads per tenant (:func:`tenant_of`); 0: no limit.
    An append that would create one more raises
    :class:`~agui_hub.errors.TooManyThreads` and stores nothing."""

    def __post_init__(self) -> None:
        for name in ("max_len", "max_age", "ttl", "max_bytes", "max_tenant_threads"):
            value = getattr(self, name)
            if name in ("max_bytes", "max_tenant_threads") and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise ValueError(f"retention limit {name} must be a whole number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"retention limit {name} must be a finite number")
            if value < 0:
                raise ValueError("retention limits must not be negative")


def tenant_of(thread: str) -> str:
    """The tenant *thread* belongs to: the part of its id before the first ``/``.

    ``"tenant-42/run-1"`` belongs to ``"tenant-42"``; an id without ``/``
    (and one that starts with it) belongs to the tenant ``""``, so all such
    threads share one quota of ``max_tenant_threads``.
    """
    head, slash, _ = thread.partition("/")
    return head if slash else ""


def too_many_threads(thread: str, tenant: str, limit: int) -> TooManyThreads:
    """The error of an append that would create *thread* past its tenant's quota."""
    who = f"tenant {tenant!r}" if tenant else "tenant '' (thread ids without '/')"
    return TooManyThreads(
        f"thread {thread!r} was not created: {who} already has {limit} threads, its "
        f"limit (max_tenant_threads={limit}); delete threads of the tenant, let idle "
        "ones expire (the store's ttl) or raise max_tenant_threads, then publish again"
    )


# -- presence: who is watching a thread --------------------------------------------------


@dataclass(frozen=True, slots=True)
class PresenceEntry:
    """One connection watching a thread (docs/protocol.md, "presence").

    Treat ``client`` as read-only: the store may hand the same dict to every
    reader of the entry.
    """

    connection: str
    """Unique across gateways: ``"<gateway id>-<n>"``."""
    subject: str
    """The token's subject, or ``"anonymous"``."""
    joined: int
    """When the connection joined the thread, ms since the Unix epoch (the caller's
    wall clock: the store keeps it as given)."""
    client: dict[str, Any] | None = None
    """What the connection announced of itself (a flat JSON object), ``None`` when nothing."""

    def as_json(self) -> dict[str, Any]:
        """The entry as the wire shows it: ``client`` only when one was announced."""
        out: dict[str, Any] = {
            "connection": self.connection,
            "subject": self.subject,
            "joined": self.joined,
        }
        if self.client is not None:
            out["client"] = self.client
        return out


@dataclass(frozen=True, slots=True)
class PresencePage:
    """What :meth:`ThreadStore.presence` found of one thread."""

    count: int
    """Live entries of the thread, on every gateway (the truth, whatever the limit)."""
    entries: list[PresenceEntry]
    """The first ``limit`` of them by ``(joined, connection)``."""
    version: int
    """Changes whenever an entry is added or removed (expiry included) or its values
    change, not when one is only refreshed. Opaque: compare it for equality only.
    ``0`` exactly when the thread has no entry; a value, once left, is never the
    thread's version again."""


@dataclass(frozen=True, slots=True)
class PresenceChange:
    """What :meth:`ThreadStore.presence_update` does to one thread: *gone* first, then *put*."""

    thread: str
    put: Sequence[PresenceEntry] = ()
    """Entries to add, or to refresh (same connection id: its values replace the stored ones)."""
    gone: Sequence[str] = ()
    """Connection ids to remove (unknown ones are ignored)."""


def check_presence_ttl(ttl: float) -> float:
    """*ttl* if it is a usable lifetime of presence entries (seconds, finite, > 0),
    else :class:`ValueError`."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl):
        raise ValueError(f"presence ttl must be a finite number of seconds, got {ttl!r}")
    if ttl <= 0:
        raise ValueError(f"presence ttl must be more than 0 seconds, got {ttl!r}")
    return float(ttl)


def check_presence_read(
    threads: Sequence[str], limit: int, known: Sequence[int | None] | None
) -> None:
    """Raise :class:`ValueError` for a :meth:`ThreadStore.presence` call no store can
    answer: a *limit* that is not a whole number of at least 1, or *known* not one
    version (or ``None``) per thread; :class:`~agui_hub.errors.InvalidEvent` for a bad
    thread name."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"presence limit must be a whole number of at least 1, got {limit!r}")
    if known is not None and len(known) != len(threads):
        raise ValueError(
            f"presence known versions: give one per thread ({len(threads)}), got {len(known)}"
        )
    for thread in threads:
        check_thread(thread)


# -- the interface -------------------------------------------------------------------


class ThreadStore(Protocol):
    """The contract both stores implement. All methods are coroutines except
    :meth:`subscribe`, which returns an async context manager."""

    retention: Retention

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        """Append *events* atomically, in order; return one offset per event.

        A retried event id returns the original offset and appends nothing.
        With *expect*, append only if the thread still has ``expect.epoch``
        and nothing after ``expect.after``; otherwise append nothing and raise
        :class:`~agui_hub.errors.AppendConflict`, also when the events after
        ``expect.after`` are these very events (stored by an earlier try whose
        reply was lost): read them, and an id already stored is answered with
        its offset as usual.

        An append that would create the thread when its tenant
        (:func:`tenant_of`) already has ``retention.max_tenant_threads``
        threads raises :class:`~agui_hub.errors.TooManyThreads` and stores
        nothing; appends to an existing thread are never refused by it.
        """
        ...

    async def stored_ids(self, thread: str, event_ids: Sequence[str]) -> dict[str, Offset]:
        """The offsets of those of *event_ids* that are stored (a retry's check)."""
        ...

    async def runs(self, thread: str) -> list[RunInfo]:
        """The index of *thread*'s runs, in the order they started (``[]``: no
        thread, or no run yet). It outlives trimming and goes with the epoch
        (a re-created thread starts a new one); at most :data:`MAX_RUNS`, the
        newest. Build a :class:`~agui_hub.agui.runs.RunTree` from it."""
        ...

    async def read(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> list[Entry]:
        """Entries after *after*, oldest first, at most *limit*.

        Raises :class:`OffsetExpired` if events after *after* were trimmed.
        An unknown thread reads as empty.
        """
        ...

    async def read_available(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> Available:
        """The entries after ``max(after, trimmed)`` with the epoch and trim mark
        taken atomically with them; never raises :class:`OffsetExpired`.

        For reloads racing a producer that trims flat out: where :meth:`read`
        would raise, this answers what is still stored and sets
        :attr:`Available.gap`. Without *limit* it reads up to the head; when
        trimming overtakes it between pages it goes on after the new trim
        mark (``gap``), when the epoch changes meanwhile it starts over.
        """
        ...

    async def epoch(self, thread: str) -> str | None:
        """The thread's epoch, ``None`` when the thread does not exist."""
        ...

    async def last_offset(self, thread: str) -> Offset:
        """Offset of the newest event, :data:`START` when the thread is empty."""
        ...

    def subscribe(self, thread: str, after: Offset | None = None) -> FeedSubscription:
        """A live feed of entries after *after* (``None``: only new events).

        Use it as ``async with store.subscribe(t, after) as feed: async for
        entry in feed``; see :class:`FeedSubscription` for the guarantees.
        """
        ...

    async def info(self, thread: str) -> ThreadInfo | None:
        """Operator view of one thread, ``None`` when it does not exist."""
        ...

    async def threads(self, limit: int = 1000) -> list[str]:
        """Names of stored threads (at most *limit*)."""
        ...

    async def delete(self, thread: str) -> bool:
        """Delete a thread and all its events; ``True`` if it existed."""
        ...

    async def put_checkpoint(self, thread: str, checkpoint: Checkpoint) -> None:
        """Store *checkpoint* for *thread* unless a later one is stored."""
        ...

    async def get_checkpoint(self, thread: str) -> Checkpoint | None:
        """The thread's checkpoint, ``None`` if it has none."""
        ...

    async def presence_update(self, changes: Sequence[PresenceChange], ttl: float) -> None:
        """Apply each change: its *gone* connections are removed, then every entry of
        its *put* lives until *ttl* seconds from now; expired entries are dropped.

        "Now" is the store's clock (Redis: its TIME), so the gateways' clocks do not
        matter; ``joined`` is kept as given. Refresh your entries well within *ttl*
        (every ``ttl / 3``): an entry not refreshed in time expires, and other
        readers see it leave. All threads go in one round trip (Redis: a pipeline of
        one script call per thread; on a cluster, one per master), never a
        connection per thread: batch every thread of a refresh into one call.
        Raises :class:`ValueError` for a *ttl* that is not a finite number of
        seconds above 0, :class:`~agui_hub.errors.StoreUnavailable` /
        :class:`~agui_hub.errors.StoreError` when the store fails (some threads may
        then be updated and others not: the next refresh repairs them).
        """
        ...

    async def presence(
        self, threads: Sequence[str], limit: int, known: Sequence[int | None] | None = None
    ) -> list[PresencePage | None]:
        """Per thread, in order: its live entries (:class:`PresencePage`: the count,
        the first *limit* by ``(joined, connection)`` and the version).

        Expired entries are dropped first (which changes the version). With *known*
        (one version or ``None`` per thread, as a previous call returned them): ``None``
        in place of a thread whose version is still the known one, a cheap answer for
        a poll of an unchanged thread. A thread nobody watches answers
        ``PresencePage(0, [], 0)``. One round trip for all threads, as
        :meth:`presence_update`. Raises :class:`ValueError` for a *limit* below 1 or
        *known* of another length than *threads*.
        """
        ...

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless the backend answers."""
        ...

    async def durability_warnings(self) -> list[str]:
        """One actionable sentence per backend setting that breaks a promise of
        the store (events lost on restart, evictable keys); ``[]`` when none does.

        Raises :class:`StoreUnavailable` when the backend cannot be reached.
        """
        ...

    async def close(self) -> None:
        """Release connections and end every subscription."""
        ...


# -- live feeds (shared by every store) ------------------------------------------------

PAGE_SIZE = 500
"""Entries fetched per round trip while a subscription catches up."""

DEFAULT_MAX_PENDING_BYTES = 8 * 1024 * 1024
"""Default bound of a subscription's queue: bytes of memory its entries take
(:func:`entry_cost` each, not only their data)."""


class FeedBackend(Protocol):
    """What :class:`FeedSubscription` needs from a store."""

    async def _fetch(
        self, thread: str, after: Offset, limit: int
    ) -> tuple[str | None, list[Entry]]:
        """(epoch, entries after *after*); raises OffsetExpired."""
        ...

    async def last_offset(self, thread: str) -> Offset: ...

    async def epoch(self, thread: str) -> str | None: ...

    async def _register(self, sub: FeedSubscription) -> None:
        """Start calling ``sub._on_live`` with every entry appended from now on."""
        ...

    def _unregister(self, sub: FeedSubscription) -> None: ...


class FeedState(enum.Enum):
    NEW = "new"
    CATCHING_UP = "catching_up"
    LIVE = "live"
    CLOSED = "closed"


class FeedSubscription:
    """A gap-free live feed of one thread, shared by both store implementations.

    Hand-off from history to live without a gap or a duplicate: the
    subscription registers for live entries first (buffering them), then
    reads history page by page as the consumer asks for more, then delivers
    the buffer; every entry at or before the last delivered offset is
    dropped. Its queue is bounded in bytes of memory (:func:`entry_cost`);
    on overflow it fails with :class:`SubscriptionLagged` after delivering
    what it holds.
    """

    def __init__(
        self,
        backend: FeedBackend,
        thread: str,
        after: Offset | None,
        *,
        max_pending_bytes: int | None = None,
    ) -> None:
        self.thread = check_thread(thread)
        if after is not None:
            offset_key(after)  # validate early, in the caller's frame
        self._backend = backend
        self._after = after
        self.last: Offset = after or START
        self.epoch: str | None = None
        self.state = FeedState.NEW
        self._max_pending = max_pending_bytes or DEFAULT_MAX_PENDING_BYTES
        self._queue: deque[Entry] = deque()
        self._pending_bytes = 0
        self._buffer: list[Entry] = []
        self._buffer_bytes = 0
        self._cursor: Offset = after or START
        self._last_key = offset_key(self._cursor)
        self._error: BaseException | None = None
        self._wake = asyncio.Event()
        self._head_key = (0, 0)

    # -- consumer side -----------------------------------------------------------------

    async def open(self) -> None:
        """Register for live entries; idempotent. ``async with`` calls it."""
        if self.state is not FeedState.NEW:
            return
        self.state = FeedState.CATCHING_UP
        try:
            await self._backend._register(self)
            # Registered first: every entry after `head` reaches the buffer, so
            # history is needed only up to `head`.
            self.epoch = await self._backend.epoch(self.thread)
            head = await self._backend.last_offset(self.thread)
        except BaseException:
            # A failed start leaves nothing behind: no registration, no
            # subscription to the thread's notifications.
            await self.close()
            raise
        self._head_key = offset_key(head)
        if self._after is None:
            self._cursor = head
            self._last_key = offset_key(self._cursor)
            self.last = self._cursor

    def backlog(self) -> tuple[int, Offset | None]:
        """Entries received and not taken by the consumer yet, and the offset of the
        oldest of them (``None`` when there is none): how far the consumer is behind."""
        queue = self._queue
        return len(queue), (queue[0].offset if queue else None)

    def __aiter__(self) -> FeedSubscription:
        return self

    async def __anext__(self) -> Entry:
        await self.open()
        while True:
            if self._queue:
                entry = self._queue.popleft()
                self._pending_bytes -= entry_cost(entry)
                self.last = entry.offset
                return entry
            if self._error is not None:
                raise self._error
            if self.state is FeedState.CLOSED:
                raise StopAsyncIteration
            if self.state is FeedState.CATCHING_UP:
                await self._catch_up_one_page()
                continue
            self._wake.clear()
            await self._wake.wait()

    async def close(self) -> None:
        if self.state is not FeedState.CLOSED:
            registered = self.state is not FeedState.NEW
            self.state = FeedState.CLOSED
            self._wake.set()
            if registered:
                self._backend._unregister(self)

    async def __aenter__(self) -> FeedSubscription:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- store side ---------------------------------------------------------------------

    async def _catch_up_one_page(self) -> None:
        if offset_key(self._cursor) < self._head_key:
            epoch, page = await self._backend._fetch(self.thread, self._cursor, PAGE_SIZE)
            if not self._check_epoch(epoch):
                return
            if page:
                self._cursor = page[-1].offset
                self._enqueue(page)
                return
        # History exhausted: what arrived live meanwhile follows, then live mode.
        self.state = FeedState.LIVE
        buffered, self._buffer, self._buffer_bytes = self._buffer, [], 0
        self._enqueue(buffered)

    def _check_epoch(self, epoch: str | None) -> bool:
        if self.epoch is None:
            self.epoch = epoch
            return True
        if epoch != self.epoch:
            self._fail(ThreadReset(self.thread, self.epoch, epoch))
            return False
        return True

    def _on_live(self, entries: Sequence[Entry], epoch: str | None) -> None:
        """Called by the store with entries appended to the thread, in order."""
        if self.state is FeedState.CLOSED or self._error is not None:
            return
        if self.state is FeedState.LIVE:
            if self._check_epoch(epoch):
                self._enqueue(entries, pushed=True)
            return
        if not self._check_epoch(epoch):
            return
        self._buffer.extend(entries)
        self._buffer_bytes += sum(entry_cost(e) for e in entries)
        if self._buffer_bytes > self._max_pending:
            self._fail(SubscriptionLagged(self.thread, self.last))

    def _enqueue(self, entries: Sequence[Entry], *, pushed: bool = False) -> None:
        for entry in entries:
            key = offset_key(entry.offset)
            if key <= self._last_key:
                continue  # already delivered (history and live overlap)
            self._queue.append(entry)
            self._pending_bytes += entry_cost(entry)
            self._last_key = key
        # Only pushed (live) entries count against the bound: pages of history
        # are pulled at the consumer's pace.
        if pushed and self._pending_bytes > self._max_pending:
            self._fail(SubscriptionLagged(self.thread, self.last))
        self._wake.set()

    def _fail(self, error: BaseException) -> None:
        """End the feed with *error*, after the entries it already holds."""
        if self._error is None:
            if isinstance(error, SubscriptionLagged):
                self._queue.clear()  # resume from what the consumer has actually seen
                self._pending_bytes = 0
                error = SubscriptionLagged(self.thread, self.last)
            self._error = error
        self._wake.set()
