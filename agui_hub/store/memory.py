"""The in-process thread store (``memory://``): the zero-set-up default.

It is also the reference implementation of :class:`~agui_hub.store.ThreadStore`:
the contract tests run against it and against Redis with the same
expectations. Offsets are made like Redis stream ids (``"<ms>-<seq>"``, strictly
growing even when the clock steps back), every thread gets a random epoch when
it is created, and retention trims by length, by age and by bytes, expires
idle threads and bounds the threads of each tenant. Presence entries (who is
watching a thread) expire on ``time.monotonic``.

Everything lives in this process: events are gone when it exits, and another
process cannot see them. Use Redis to share threads between gateways.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..agui.runs import RunState, ended_status, input_preview
from ..errors import AppendConflict, OffsetExpired
from .contract import (
    MAX_RUNS,
    START,
    Available,
    Checkpoint,
    Entry,
    EventInput,
    Expected,
    FeedSubscription,
    Offset,
    PresenceChange,
    PresenceEntry,
    PresencePage,
    Retention,
    RunInfo,
    ThreadInfo,
    check_presence_read,
    check_presence_ttl,
    check_thread,
    encode_event_data,
    offset_key,
    tenant_of,
    too_many_threads,
)

__all__ = ["MemoryStore"]


def new_epoch() -> str:
    """A fresh random epoch."""
    return secrets.token_hex(8)


@dataclass
class _Thread:
    epoch: str
    entries: list[Entry] = field(default_factory=list)
    keys: list[tuple[int, int]] = field(default_factory=list)
    ids: dict[str, Offset] = field(default_factory=dict)
    last: tuple[int, int] = (0, 0)
    run_id: str | None = None
    trimmed: Offset | None = None
    touched: float = 0.0
    checkpoint: Checkpoint | None = None
    bytes: int = 0
    """Sum of ``len(entry.data)`` over ``entries``."""
    runs: dict[str, _Run] = field(default_factory=dict)
    """The index of runs: run id -> what the store keeps of it, in the order
    the runs started (trimming leaves it; see docs/store.md)."""


@dataclass
class _Run:
    parent: str | None
    status: RunState
    first: Offset
    last: Offset | None
    preview: str


@dataclass
class _Watchers:
    """A thread's presence entries: connection id -> (entry, when it expires on
    ``time.monotonic``), and the version of the list."""

    version: int
    entries: dict[str, tuple[PresenceEntry, float]] = field(default_factory=dict)


PRUNE_SAMPLE = 64
"""Threads checked for expiry per try at a full tenant quota."""


class MemoryStore:
    """Thread streams in this process's memory."""

    def __init__(
        self,
        *,
        retention: Retention | None = None,
        clock: Callable[[], float] = time.time,
        max_pending_bytes: int | None = None,
    ) -> None:
        self.retention = retention or Retention()
        self._clock = clock
        self._threads: dict[str, _Thread] = {}
        self._tenants: dict[str, dict[str, None]] = {}
        """Each tenant's threads, the longest unchecked first (see _check_quota)."""
        """Tenant -> its threads (expired ones included until looked at)."""
        self._subs: dict[str, set[FeedSubscription]] = {}
        self._max_pending = max_pending_bytes
        self._watchers: dict[str, _Watchers] = {}
        """Threads with presence entries (a thread without any has no record)."""
        self._versions = itertools.count(1)
        """Presence versions: every change takes the next, so that no value is ever
        a thread's version twice (0 is that of a thread without entries)."""

    # -- internals ------------------------------------------------------------------------

    def _get(self, thread: str) -> _Thread | None:
        state = self._threads.get(thread)
        if (
            state is not None
            and self.retention.ttl
            and (self._clock() - state.touched > self.retention.ttl)
        ):
            self._drop(thread)  # idle past its TTL: expired whole
            return None
        return state

    def _drop(self, thread: str) -> None:
        del self._threads[thread]
        tenant = tenant_of(thread)
        members = self._tenants.get(tenant)
        if members is not None:
            members.pop(thread, None)
            if not members:
                del self._tenants[tenant]

    def _check_quota(self, thread: str) -> None:
        """Raise TooManyThreads if creating *thread* would pass its tenant's quota."""
        limit = self.retention.max_tenant_threads
        if not limit:
            return
        tenant = tenant_of(thread)
        members = self._tenants.get(tenant, {})
        if len(members) >= limit:
            # As the Redis store: at most PRUNE_SAMPLE checks per try, so that a
            # client trying at its limit costs little whatever the quota.
            for other in list(itertools.islice(members, PRUNE_SAMPLE)):
                if self._get(other) is not None:  # else forgotten: it expired
                    del members[other]
                    members[other] = None  # checked: to the back of the line
            if len(members) >= limit:
                raise too_many_threads(thread, tenant, limit)

    def _next_key(self, state: _Thread) -> tuple[int, int]:
        ms = int(self._clock() * 1000)
        last_ms, last_seq = state.last
        return (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)

    def _trim(self, state: _Thread, added: int) -> None:
        """Apply retention after an append of *added* entries (the newest ones)."""
        r = self.retention
        cut = 0
        if r.max_len and len(state.entries) > r.max_len:
            cut = len(state.entries) - r.max_len
        if r.max_age:
            oldest_ms = int((self._clock() - r.max_age) * 1000)
            cut = max(cut, bisect.bisect_left(state.keys, (oldest_ms, 0)))
        removed = sum(len(entry.data) for entry in state.entries[:cut])
        if r.max_bytes:
            # Oldest first, down to max_bytes, but never the entries just added.
            keep_from = len(state.entries) - added
            while state.bytes - removed > r.max_bytes and cut < keep_from:
                removed += len(state.entries[cut].data)
                cut += 1
        if cut:
            for entry in state.entries[:cut]:
                state.ids.pop(entry.event_id, None)
            state.trimmed = state.entries[cut - 1].offset
            state.bytes -= removed
            del state.entries[:cut]
            del state.keys[:cut]

    # -- the contract ---------------------------------------------------------------------

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        check_thread(thread)
        if not events:
            return []
        # Encode first: a value that cannot be encoded appends nothing.
        encoded = [encode_event_data(item.event) for item in events]
        state = self._get(thread)
        if expect is not None and (
            (state.epoch if state is not None else None) != expect.epoch
            or (state is not None and state.last > offset_key(expect.after))
        ):
            raise AppendConflict(thread)
        if state is None:
            self._check_quota(thread)
            state = self._threads[thread] = _Thread(epoch=new_epoch())
            self._tenants.setdefault(tenant_of(thread), {})[thread] = None
        offsets: list[Offset] = []
        added: list[Entry] = []
        for item, data in zip(events, encoded, strict=True):
            known = state.ids.get(item.event_id)
            if known is not None:
                offsets.append(known)
                continue
            event_type = str(item.event.get("type", ""))
            key = self._next_key(state)
            offset = f"{key[0]}-{key[1]}"
            if event_type == "RUN_STARTED" and item.run_id:
                _index_run(state, item.run_id, item.event, offset)
                state.run_id = item.run_id
            elif event_type in ("RUN_FINISHED", "RUN_ERROR"):
                run = state.runs.get(item.run_id or state.run_id or "")
                status = ended_status(item.event)
                if run is not None and status is not None:
                    run.status, run.last = status, offset
            entry = Entry(offset, data, item.event_id, item.run_id or state.run_id, event_type)
            state.entries.append(entry)
            state.keys.append(key)
            state.ids[item.event_id] = offset
            state.last = key
            state.bytes += len(data)
            offsets.append(offset)
            added.append(entry)
        state.touched = self._clock()
        self._trim(state, len(added))
        if added:
            for sub in list(self._subs.get(thread, ())):
                sub._on_live(added, state.epoch)
        return offsets

    async def runs(self, thread: str) -> list[RunInfo]:
        check_thread(thread)
        state = self._get(thread)
        if state is None:
            return []
        head = f"{state.last[0]}-{state.last[1]}"
        return [
            RunInfo(
                run_id=run_id,
                parent_run_id=run.parent,
                status=run.status,
                first=run.first,
                last=run.last
                if run.last is not None
                or run_id != state.run_id
                or run.status is not RunState.RUNNING
                else head,
                preview=run.preview,
            )
            for run_id, run in state.runs.items()
        ]

    async def stored_ids(self, thread: str, event_ids: Sequence[str]) -> dict[str, Offset]:
        state = self._get(thread)
        if state is None:
            return {}
        return {i: state.ids[i] for i in event_ids if i in state.ids}

    async def _fetch(
        self, thread: str, after: Offset, limit: int
    ) -> tuple[str | None, list[Entry]]:
        after_key = offset_key(after)
        state = self._get(thread)
        if state is None:
            return None, []
        if state.trimmed is not None and after_key < offset_key(state.trimmed):
            first = state.entries[0].offset if state.entries else None
            raise OffsetExpired(thread, after, first)
        start = bisect.bisect_right(state.keys, after_key)
        return state.epoch, state.entries[start : start + limit]

    async def read(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> list[Entry]:
        check_thread(thread)
        _, entries = await self._fetch(thread, after, limit or 2**62)
        return entries

    async def read_available(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> Available:
        check_thread(thread)
        after_key = offset_key(after)
        state = self._get(thread)
        if state is None:
            return Available(None, None, [])
        gap = state.trimmed is not None and after_key < offset_key(state.trimmed)
        start = bisect.bisect_right(state.keys, after_key)
        end = None if limit is None else start + limit
        return Available(state.epoch, state.trimmed, state.entries[start:end], gap)

    async def epoch(self, thread: str) -> str | None:
        state = self._get(thread)
        return state.epoch if state is not None else None

    async def last_offset(self, thread: str) -> Offset:
        state = self._get(thread)
        if state is None or state.last == (0, 0):
            return START
        return f"{state.last[0]}-{state.last[1]}"

    def subscribe(self, thread: str, after: Offset | None = None) -> FeedSubscription:
        return FeedSubscription(self, thread, after, max_pending_bytes=self._max_pending)

    async def _register(self, sub: FeedSubscription) -> None:
        self._subs.setdefault(sub.thread, set()).add(sub)

    def _unregister(self, sub: FeedSubscription) -> None:
        subs = self._subs.get(sub.thread)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.thread]

    async def info(self, thread: str) -> ThreadInfo | None:
        state = self._get(thread)
        if state is None:
            return None
        ttl = None
        if self.retention.ttl:
            ttl = max(0.0, self.retention.ttl - (self._clock() - state.touched))
        return ThreadInfo(
            thread=thread,
            epoch=state.epoch,
            length=len(state.entries),
            first=state.entries[0].offset if state.entries else None,
            last=f"{state.last[0]}-{state.last[1]}" if state.last != (0, 0) else None,
            trimmed=state.trimmed,
            run_id=state.run_id,
            ttl=ttl,
            bytes=state.bytes,
        )

    async def threads(self, limit: int = 1000) -> list[str]:
        alive = [t for t in list(self._threads) if self._get(t) is not None]
        return sorted(alive)[:limit]

    async def delete(self, thread: str) -> bool:
        state = self._get(thread)
        if state is None:
            return False
        self._drop(thread)
        for sub in list(self._subs.get(thread, ())):
            sub._on_live([], None)
        return True

    async def put_checkpoint(self, thread: str, checkpoint: Checkpoint) -> None:
        state = self._get(thread)
        if state is None or state.epoch != checkpoint.epoch:
            return  # the thread is gone or re-created: the checkpoint is stale
        known = state.checkpoint
        if known is None or offset_key(known.offset) < offset_key(checkpoint.offset):
            state.checkpoint = checkpoint

    async def get_checkpoint(self, thread: str) -> Checkpoint | None:
        state = self._get(thread)
        return state.checkpoint if state is not None else None

    # -- presence -------------------------------------------------------------------------

    def _expire_watchers(self, thread: str, now: float) -> _Watchers | None:
        """*thread*'s presence without its expired entries (``None``: it has none left)."""
        watchers = self._watchers.get(thread)
        if watchers is None:
            return None
        dead = [c for c, (_, expires) in watchers.entries.items() if expires <= now]
        for connection in dead:
            del watchers.entries[connection]
        return self._settle(thread, watchers, bool(dead))

    def _settle(self, thread: str, watchers: _Watchers, changed: bool) -> _Watchers | None:
        # A thread left without entries is forgotten (its version reads 0), so that
        # threads watched once do not pile up; a change otherwise takes a version
        # never used before, so a reader's known version never matches another list.
        if not watchers.entries:
            del self._watchers[thread]
            return None
        if changed:
            watchers.version = next(self._versions)
        return watchers

    async def presence_update(self, changes: Sequence[PresenceChange], ttl: float) -> None:
        ttl = check_presence_ttl(ttl)
        for change in changes:
            check_thread(change.thread)
        now = time.monotonic()
        for change in changes:
            watchers = self._expire_watchers(change.thread, now)
            if watchers is None:
                if not change.put:
                    continue
                watchers = self._watchers[change.thread] = _Watchers(0)
            changed = False
            for connection in change.gone:
                changed |= watchers.entries.pop(connection, None) is not None
            for entry in change.put:
                # A copy of the client: what the caller changes later is not stored.
                client = dict(entry.client) if entry.client is not None else None
                stored = PresenceEntry(entry.connection, entry.subject, entry.joined, client)
                before = watchers.entries.get(entry.connection)
                changed |= before is None or before[0] != stored  # new, or other values
                watchers.entries[entry.connection] = (stored, now + ttl)
            self._settle(change.thread, watchers, changed)

    async def presence(
        self, threads: Sequence[str], limit: int, known: Sequence[int | None] | None = None
    ) -> list[PresencePage | None]:
        check_presence_read(threads, limit, known)
        now = time.monotonic()
        pages: list[PresencePage | None] = []
        for i, thread in enumerate(threads):
            watchers = self._expire_watchers(thread, now)
            version = watchers.version if watchers is not None else 0
            if known is not None and known[i] == version:
                pages.append(None)
            elif watchers is None:
                pages.append(PresencePage(0, [], 0))
            else:
                first = heapq.nsmallest(
                    limit,
                    (entry for entry, _ in watchers.entries.values()),
                    key=lambda e: (e.joined, e.connection),
                )
                pages.append(PresencePage(len(watchers.entries), first, version))
        return pages

    async def ping(self) -> None:
        return None

    async def durability_warnings(self) -> list[str]:
        # Nothing to configure: what it promises (this process's lifetime) holds.
        return []

    async def close(self) -> None:
        for subs in list(self._subs.values()):
            for sub in list(subs):
                await sub.close()
        self._subs.clear()


def _index_run(state: _Thread, run_id: str, started: dict[str, object], offset: Offset) -> None:
    """Record a run that starts at *offset*: the rules of docs/store.md's index
    of runs, which append.lua applies in Redis."""
    if run_id in state.runs:
        return  # a second RUN_STARTED of a known run: the index keeps the first
    parent = started.get("parentRunId")
    if not isinstance(parent, str) or not parent:
        parent = state.run_id  # continues the run before it
    state.runs[run_id] = _Run(parent, RunState.RUNNING, offset, None, input_preview(started))
    if len(state.runs) > MAX_RUNS:
        # The oldest go, an eighth of the bound at a time (as in Redis).
        for old in list(state.runs)[: len(state.runs) - MAX_RUNS + MAX_RUNS // 8]:
            del state.runs[old]
