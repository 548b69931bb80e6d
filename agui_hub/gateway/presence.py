"""Presence: who is subscribed to a thread now, on every gateway that shares the store.

Each gateway writes its own connections' entries into the store
(:meth:`ThreadStore.presence_update`): at once (coalesced) when a connection
joins or leaves a thread, and every ``ttl / 3`` seconds all of them again, so
that the entries of a gateway that dies expire ``ttl`` seconds later. For
the connections that asked (``subscribe`` with ``presence: true``) it reads
the watched threads once per ``interval``, all in one store call, and sends
what changed as ``joined`` and ``left`` frames, one of each per thread per
interval at most: a reconnect storm is a few frames, not one per connection.
The store keeps a version per thread, so an unchanged thread costs a poll
that returns no entries.

::

    connection ──join/leave──▶ PresenceTracker ──presence_update (batched)──▶ store
                                     │   ▲
           joined / left frames ◀────┘   └──presence(watched threads, known versions)

Everything here runs in one task (:meth:`PresenceTracker.run`); join, leave,
watch and unwatch only record what to do, so they never wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import itertools
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import StoreError
from ..store.contract import PresenceChange, PresenceEntry, PresencePage, ThreadStore
from ..wire.codec import Encoding
from ..wire.protocol import encode_frame, presence_frame

__all__ = [
    "FRAME_ENTRIES",
    "PresenceMode",
    "PresenceTracker",
    "Present",
]

log = logging.getLogger("agui_hub.presence")

FRAME_ENTRIES = 100
"""Entries in one ``presence``, ``joined`` or ``left`` frame at most."""
HIDDEN_SUBJECT = "hidden"
"""The subject a count-only gateway writes (it writes no client either)."""
DIFF_ENTRIES = 1000
"""Entries read per watched thread to tell who joined and who left: beyond
them, ``joined`` and ``left`` name nobody, and ``count`` still tells."""
COALESCE = 0.05
"""Seconds a join or leave waits for others to be written with it."""
CLOSE_TIMEOUT = 2.0
"""Seconds a closing gateway spends removing its entries (they expire anyway)."""


class PresenceMode(enum.Enum):
    """What a gateway does about presence (``--presence``)."""

    FULL = "full"
    """Entries with subjects and client info."""
    COUNT = "count"
    """The count only: subjects and client info stay hidden."""
    OFF = "off"
    """Nothing recorded; the ``presence`` command is answered ``presence_off``."""


class Present(Protocol):
    """What the tracker needs of a connection."""

    encoding: Encoding
    threads: set[str]

    @property
    def is_open(self) -> bool: ...

    def send(self, frame: bytes | str) -> bool: ...


@dataclass(slots=True)
class _Watched:
    """A thread some local connections watch: who, and what they were told."""

    watchers: set[Present]
    fresh: set[Present]
    """Watchers that have not had their first ``presence`` frame yet."""
    page: PresencePage | None = None
    """The thread as last read (``None``: not read yet)."""


class PresenceTracker:
    """This gateway's part of the presence of every thread (see the module docstring).

    Start :meth:`run` in a task; :meth:`close` removes this gateway's
    entries. *ttl*: seconds an entry lives unless refreshed; *interval*:
    seconds between two reads of the watched threads (and so between two
    ``joined`` / ``left`` frames of one thread).
    """

    def __init__(
        self,
        store: ThreadStore,
        *,
        mode: PresenceMode = PresenceMode.FULL,
        ttl: float = 15.0,
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.mode = mode
        self.ttl = ttl
        self.interval = interval
        self.gateway_id = secrets.token_hex(4)
        """Part of every connection id of this gateway (unique across gateways)."""
        self._numbers = itertools.count(1)
        self._ids: dict[Present, str] = {}
        self._threads: dict[Present, set[str]] = {}
        """Each connection's threads here, joined or watched: a close visits only those."""
        self._local: dict[str, dict[Present, PresenceEntry]] = {}
        self._put: dict[str, dict[str, PresenceEntry]] = {}
        self._gone: dict[str, dict[str, float]] = {}
        """Per thread, the connections that left and when (monotonic): a leave older
        than the ttl has expired in the store, and is not written again."""
        self._watched: dict[str, _Watched] = {}
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._refreshed = time.monotonic()
        self._polled = -float("inf")
        self.updates = 0
        """Store updates made (one call per flush, whatever the number of threads)."""
        self.reads = 0
        """Store reads made: one per poll of the watched threads, one per ``presence``
        command."""

    @property
    def enabled(self) -> bool:
        return self.mode is not PresenceMode.OFF

    @property
    def entries(self) -> int:
        """This gateway's entries now (a connection subscribed to two threads: two)."""
        return sum(len(entries) for entries in self._local.values())

    def connection_id(self, conn: Present) -> str:
        """*conn*'s id in presence entries: ``<gateway id>-<n>``, the same for all its
        subscriptions, for as long as it is open."""
        found = self._ids.get(conn)
        if found is None:
            found = self._ids[conn] = f"{self.gateway_id}-{next(self._numbers)}"
        return found

    # -- what connections do (never waits) -----------------------------------------------

    def join(self, conn: Present, thread: str, subject: str, client: dict[str, Any] | None) -> None:
        """*conn* is subscribed to *thread* (again: its entry is replaced)."""
        if not self.enabled:
            return
        if self.mode is PresenceMode.COUNT:
            # Nothing to hide if it is never written (other gateways read the store).
            subject, client = HIDDEN_SUBJECT, None
        entry = PresenceEntry(self.connection_id(conn), subject, int(time.time() * 1000), client)
        self._threads.setdefault(conn, set()).add(thread)
        self._local.setdefault(thread, {})[conn] = entry
        self._put.setdefault(thread, {})[entry.connection] = entry
        gone = self._gone.get(thread)
        if gone is not None:
            gone.pop(entry.connection, None)
        self._wake.set()

    def resubject(self, conn: Present, subject: str) -> None:
        """*conn* authenticated as *subject*: its entries say so from now on."""
        if self.mode is not PresenceMode.FULL:
            return
        for thread in self._threads.get(conn, ()):
            entry = self._local.get(thread, {}).get(conn)
            if entry is not None and entry.subject != subject:
                entry = dataclasses.replace(entry, subject=subject)
                self._local[thread][conn] = entry
                self._put.setdefault(thread, {})[entry.connection] = entry
                self._wake.set()

    def leave(self, conn: Present, thread: str) -> None:
        """*conn* is no longer subscribed to *thread* (a no-op when it was not)."""
        self.unwatch(conn, thread)
        threads = self._threads.get(conn)
        if threads is not None:
            threads.discard(thread)
            if not threads:
                del self._threads[conn]
        local = self._local.get(thread)
        entry = local.pop(conn, None) if local is not None else None
        if entry is None:
            return
        if not local:
            del self._local[thread]
        put = self._put.get(thread)
        if put is not None:
            put.pop(entry.connection, None)
        self._gone.setdefault(thread, {})[entry.connection] = time.monotonic()
        self._wake.set()

    def leave_all(self, conn: Present) -> None:
        """*conn* is gone: it leaves every thread."""
        for thread in self._threads.pop(conn, ()):
            self.leave(conn, thread)
        # Kept until now: a connection that subscribes again is the same entry.
        self._ids.pop(conn, None)

    def watch(self, conn: Present, thread: str) -> None:
        """Send *conn* the presence of *thread*, then its changes (``joined``, ``left``)."""
        if not self.enabled:
            return
        watched = self._watched.get(thread)
        if watched is None:
            watched = self._watched[thread] = _Watched(set(), set())
        watched.watchers.add(conn)
        watched.fresh.add(conn)
        self._threads.setdefault(conn, set()).add(thread)
        self._wake.set()

    def unwatch(self, conn: Present, thread: str) -> None:
        watched = self._watched.get(thread)
        if watched is None:
            return
        watched.watchers.discard(conn)
        watched.fresh.discard(conn)
        if not watched.watchers:
            del self._watched[thread]

    # -- what the commands ask -------------------------------------------------------------

    async def page(self, thread: str, limit: int) -> PresencePage:
        """The presence of *thread* now: this gateway's changes are written first,
        so that a connection finds itself."""
        await self.flush()
        [page] = await self.store.presence([thread], limit)
        self.reads += 1
        assert page is not None
        return page

    async def close(self) -> None:
        """Remove this gateway's entries (a closing gateway's viewers leave at once,
        not when their entries expire); gives up after :data:`CLOSE_TIMEOUT`."""
        now = time.monotonic()
        for thread, entries in self._local.items():
            gone = self._gone.setdefault(thread, {})
            gone.update((entry.connection, now) for entry in entries.values())
            self._put.pop(thread, None)
        self._local.clear()
        self._watched.clear()
        if not self.enabled:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self.flush()
        except (TimeoutError, StoreError) as exc:
            log.warning("presence: this gateway's entries expire by themselves: %r", exc)

    # -- the task ------------------------------------------------------------------------

    async def run(self) -> None:
        """Write, refresh and read presence until cancelled. Store errors are
        logged and tried again at the next turn."""
        if not self.enabled:
            return
        refresh_every = self.ttl / 3
        while True:
            now = time.monotonic()
            # Watched threads, new watchers' too, are read at the interval only: a
            # storm of watchers is one read per interval, not one each.
            due = min(self._refreshed + refresh_every, self._polled + self.interval)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, due - now)):
                    await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(COALESCE)  # the joins and leaves of a storm, together
            try:
                if time.monotonic() >= self._refreshed + refresh_every:
                    self._refresh()
                await self.flush()
                await self._poll()
            except StoreError as exc:
                log.warning("presence: the store failed, trying again: %s", exc)
                await asyncio.sleep(min(self.interval, 1.0))
            except Exception:
                # Presence must not stop for good: the next turn tries again.
                log.exception("presence: a turn failed, trying again")
                await asyncio.sleep(min(self.interval, 1.0))

    def _refresh(self) -> None:
        """Put every local entry again (their expiry moves), and drop those of
        connections that left without telling (a safety net)."""
        self._refreshed = time.monotonic()
        for thread, entries in list(self._local.items()):
            for conn in list(entries):
                if not conn.is_open or thread not in conn.threads:
                    self.leave(conn, thread)
            for entry in self._local.get(thread, {}).values():
                self._put.setdefault(thread, {})[entry.connection] = entry

    async def flush(self) -> None:
        """Write the joins and leaves recorded since the last flush (one store call)."""
        async with self._lock:
            if not self._put and not self._gone:
                return
            put, gone = self._put, self._gone
            self._put, self._gone = {}, {}
            changes = [
                PresenceChange(
                    thread, list(put.get(thread, {}).values()), sorted(gone.get(thread, {}))
                )
                for thread in put.keys() | gone.keys()
            ]
            try:
                await self.store.presence_update(changes, self.ttl)
            except BaseException:
                # Not written: kept for the next flush, behind what came meanwhile.
                for thread, entries in put.items():
                    later = self._put.setdefault(thread, {})
                    left = self._gone.get(thread, {})
                    for connection, entry in entries.items():
                        if connection not in left:  # a leave since wins
                            later.setdefault(connection, entry)
                now = time.monotonic()
                for thread, connections in gone.items():
                    later_gone = self._gone.setdefault(thread, {})
                    for connection, left_at in connections.items():
                        if now - left_at < self.ttl:  # older ones have expired anyway
                            later_gone.setdefault(connection, left_at)
                    if not later_gone:
                        del self._gone[thread]
                raise
            self.updates += 1

    async def _poll(self) -> None:
        """Read the watched threads that are due, and tell their watchers what changed."""
        now = time.monotonic()
        if now < self._polled + self.interval:
            return
        self._polled = now  # with nothing watched too: the loop then sleeps an interval
        if not self._watched:
            return
        threads = list(self._watched)
        known = [
            None if w.page is None or w.fresh else w.page.version
            for w in (self._watched[t] for t in threads)
        ]
        # The count is all a count-only gateway shows.
        limit = 1 if self.mode is PresenceMode.COUNT else DIFF_ENTRIES
        pages = await self.store.presence(threads, limit, known)
        self.reads += 1
        for thread, page in zip(threads, pages, strict=True):
            watched = self._watched.get(thread)
            if watched is None:
                continue  # every watcher left while we read
            if page is not None:
                self._tell(thread, watched, page)

    def _tell(self, thread: str, watched: _Watched, page: PresencePage) -> None:
        before, watched.page = watched.page, page
        hidden = self.mode is PresenceMode.COUNT
        complete = page.count == len(page.entries)
        listed = {e.connection for e in page.entries}
        # A new watcher whose own join was written after this read began waits for
        # the next read: its first frame lists it.
        fresh = {c for c in watched.fresh if hidden or not complete or self._ids.get(c) in listed}
        watched.fresh -= fresh
        frames: dict[tuple[str, Encoding], bytes | str] = {}

        def send(to: Sequence[Present] | set[Present], kind: str, frame: dict[str, Any]) -> None:
            for conn in to:
                key = (kind, conn.encoding)
                data = frames.get(key)
                if data is None:
                    data = frames[key] = encode_frame(frame, conn.encoding)
                conn.send(data)

        for conn in fresh:
            # The first frame says which entry is the watcher's own: one each.
            listing = _listing(thread, page, hidden)
            if not hidden:
                listing["connection"] = self._ids.get(conn)
            conn.send(encode_frame(listing, conn.encoding))
        others = watched.watchers - fresh - watched.fresh
        if not others or before is None:
            return
        if hidden:
            if page.count != before.count:
                send(others, "presence", _listing(thread, page, hidden))
            return
        # An entry whose subject or client changed comes again in joined.
        if page.count > len(page.entries) or before.count > len(before.entries):
            # Not everyone was read: names at the edge of what was would be wrong.
            joined, left = [], []
        else:
            old = {e.connection: e for e in before.entries}
            new = {e.connection: e for e in page.entries}
            joined = [e for c, e in new.items() if old.get(c) != e]
            left = [e for c, e in old.items() if c not in new]
        if joined or page.count > before.count:
            send(others, "joined", _change("joined", thread, page.count, joined, full=True))
        if left or page.count < before.count:
            send(others, "left", _change("left", thread, page.count, left, full=False))


def _listing(thread: str, page: PresencePage, hidden: bool) -> dict[str, Any]:
    entries = [] if hidden else [e.as_json() for e in page.entries[:FRAME_ENTRIES]]
    return presence_frame(None, thread, page.count, entries, hidden=hidden)


def _change(
    kind: str, thread: str, count: int, entries: list[PresenceEntry], *, full: bool
) -> dict[str, Any]:
    shown = entries[:FRAME_ENTRIES]
    frame: dict[str, Any] = {
        "type": kind,
        "thread": thread,
        "count": count,
        "entries": [
            e.as_json() if full else {"connection": e.connection, "subject": e.subject}
            for e in shown
        ],
    }
    if len(entries) > len(shown):
        frame["more"] = True
    return frame
