"""Appends to the Redis store: group commit, one script call per thread.

Appends that arrive while a round trip is in flight go together in the next
one (one pipeline), so many small concurrent publishes cost few round trips.
Order per thread is kept. One lane on a single Redis; one per master on a
cluster, so that a master that is down holds up the appends of its own
threads only.

Each thread's appends of a round trip are one call of the append script
(``lua/append.lua``): it checks each event id, appends, creates the epoch if
the thread is new (within its tenant's quota of threads), trims by length,
age and bytes, refreshes the idle TTL and notifies live readers, atomically.
A retried call with the same event ids returns the original offsets and
appends nothing, so redis-py's automatic retries cannot duplicate an event.
A conditional append (``expect``) first checks, in the same script, that the
epoch is the expected one and that no entry follows the expected offset. The
script also detects a stream or ids hash lost under its epoch (eviction) and
gives the thread a new epoch (or rebuilds the ids), so that nothing rewinds
silently.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ...errors import AppendConflict, StoreError, StoreUnavailable, TooManyThreads
from ..contract import (
    MAX_RUNS,
    EventInput,
    Expected,
    Offset,
    Retention,
    encode_event_data,
    tenant_of,
    too_many_threads,
)
from .calls import MAYBE_STORED, Deadlines, RedisCalls, bounded
from .keys import (
    checkpoint_key,
    ids_key,
    meta_key,
    notify_channel,
    runs_key,
    stream_key,
    tenant_key,
)
from .resp import command, normal_offset, round_trip, text
from .scripts import Script

__all__ = ["IDS_REBUILD_LIMIT", "NOTIFY_BYTES", "Appender"]


_epochs = random.Random(os.urandom(16))
"""Epoch candidates, one per script call: unique, not secret (clients see
epochs), so a seeded generator instead of a system call per append. Reseeded
in a forked child, which would otherwise repeat its parent's candidates."""
os.register_at_fork(after_in_child=lambda: _epochs.seed(os.urandom(16)))
log = logging.getLogger("agui_hub.redis_store")

NOTIFY_BYTES = 64 * 1024
"""Default largest total of event payloads an append carries in its notification
(``notify_bytes``): live readers then deliver them without reading them back.
Larger appends notify with their last offset only, and readers read."""

IDS_REBUILD_LIMIT = 100_000
"""Streams up to this long get their evicted ids hash rebuilt by the append
script; a longer one gets a new epoch instead (a rebuild would block Redis).
The same bound applies to counting the payload bytes of a stream that has no
byte total yet (written before it was kept, or by a plain XADD)."""


@dataclass(slots=True)
class _Lane:
    """Appends waiting for a round trip, and the task that commits them."""

    queued: list[_QueuedAppend] = field(default_factory=list)
    committer: asyncio.Task[None] | None = None
    threads: dict[str, int] = field(default_factory=dict)
    """Appends per thread queued or in flight here."""


@dataclass(slots=True)
class _QueuedAppend:
    thread: str
    quads: list[Any]
    """(event id, run id, type, msgpack) per event, flat, as the script takes them."""
    count: int
    done: asyncio.Future[list[Offset]]
    expect: Expected | None


class Appender:
    """Appends events to the threads under *prefix* with *script* (the append
    script, sharded on a cluster), many appends per round trip.

    :attr:`retention` and :attr:`notify_bytes` are read at each round trip:
    changing them applies to the appends not sent yet. :meth:`close` waits
    for the appends in flight.
    """

    def __init__(
        self,
        calls: RedisCalls,
        script: Script,
        *,
        prefix: str,
        retention: Retention,
        notify_bytes: int,
    ) -> None:
        self._calls = calls
        self._script = script
        self._prefix = prefix
        self.retention = retention
        """What the append script keeps of each thread."""
        self.notify_bytes = notify_bytes
        """Appends whose events total at most this many bytes carry them in their
        notification (0: notifications carry only the last offset)."""
        self._deadlines = Deadlines(calls.op_timeout, self._not_confirmed)
        """The callers' deadlines (``op_timeout`` after each call)."""
        self._lanes: dict[str, _Lane] = {}
        self._lane_of: dict[str, str] = {}
        """The lane of each thread with appends queued or in flight (it stays
        there until they are done, so that they keep their order)."""

    async def append(
        self, thread: str, events: Sequence[EventInput], expect: Expected | None = None
    ) -> list[Offset]:
        """Append *events* to *thread* (checked, not empty): their offsets, when
        the round trip they went in is answered. See
        :meth:`RedisStore.append <agui_hub.store.redis.store.RedisStore.append>`."""
        if expect is not None:
            expect = Expected(expect.epoch, normal_offset(expect.after))
        quads: list[Any] = []
        for item in events:
            quads += [
                item.event_id,
                item.run_id or "",
                str(item.event.get("type", "")),
                encode_event_data(item.event),
            ]
        done: asyncio.Future[list[Offset]] = asyncio.get_running_loop().create_future()
        name = self._lane_of.get(thread)
        if name is None:
            cluster = self._calls.cluster
            name = "" if cluster is None else cluster.lane(thread)
            self._lane_of[thread] = name
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane()
        lane.queued.append(_QueuedAppend(thread, quads, len(events), done, expect))
        lane.threads[thread] = lane.threads.get(thread, 0) + 1
        if lane.committer is None or lane.committer.done():
            lane.committer = asyncio.create_task(
                self._commit(name, lane), name="agui-hub redis commit"
            )
        # A cancelled (or timed-out) caller ends only its own future; the
        # commit goes on for the others that share its round trip (and the
        # caller's events may still be appended: retry with the same ids).
        self._deadlines.add(done)
        return await done

    def _not_confirmed(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"Redis at {self._calls.url} is unavailable: the append was not confirmed within "
            f"{self._calls.op_timeout:g} s; the events may or may not be stored: "
            "retry with the same event ids"
        )

    async def _commit(self, name: str, lane: _Lane) -> None:
        while lane.queued:
            taken, lane.queued = lane.queued[:1000], lane.queued[1000:]
            try:
                # Callers that gave up (deadline, cancellation) before their
                # round trip started were told to retry: their events are not sent.
                batch = [queued for queued in taken if not queued.done.done()]
                if batch:
                    await self._commit_batch(batch)
            finally:
                for queued in taken:
                    left = lane.threads.pop(queued.thread) - 1
                    if left:
                        lane.threads[queued.thread] = left
                    elif self._lane_of.get(queued.thread) == name:
                        del self._lane_of[queued.thread]
        if self._lanes.get(name) is lane:
            del self._lanes[name]

    async def _commit_batch(self, batch: list[_QueuedAppend]) -> None:
        """One round trip for *batch*; each caller's future gets its offsets or error."""
        # Appends to one thread queued together become one script call, in
        # arrival order; threads are independent of each other. A
        # conditional append has its expectation, so a call of its own.
        groups: list[tuple[str, list[_QueuedAppend]]] = []
        shared: dict[str, list[_QueuedAppend]] = {}
        for queued in batch:
            members = shared.get(queued.thread) if queued.expect is None else None
            if members is not None:
                members.append(queued)
                continue
            groups.append((queued.thread, [queued]))
            if queued.expect is None:
                shared[queued.thread] = groups[-1][1]
        error: Exception | None = None
        replies: list[Any] = []
        try:
            # Bounded like the callers' wait: a stalled Redis does not hold
            # the appends queued behind this round trip for redis-py's
            # socket timeout times its retries.
            replies = await bounded(self._run_appends(groups), self._calls.op_timeout)
        except asyncio.CancelledError:
            for queued in batch:
                if not queued.done.done():
                    queued.done.set_exception(StoreError("the store was closed"))
            raise
        except TimeoutError:
            error = StoreUnavailable(
                f"Redis at {self._calls.url} is unavailable: no answer to the append within "
                f"{self._calls.op_timeout:g} s; the events may or may not be stored: "
                "retry with the same event ids"
            )
        except (RedisError, RedisClusterException, OSError) as exc:
            error = self._calls.failure(exc, retry_hint=MAYBE_STORED)
        for index, (thread, members) in enumerate(groups):
            reply = error or replies[index]
            status = b""
            if not isinstance(reply, Exception):
                if reply and reply[0] == b"conflict":
                    status = reply[1] if len(reply) > 1 else b""
                    reply = AppendConflict(thread)
                elif reply and reply[0] == b"too_many_threads":
                    status = reply[1] if len(reply) > 1 else b""
                    limit = self.retention.max_tenant_threads
                    reply = too_many_threads(thread, tenant_of(thread), limit)
                elif len(reply) > 2:
                    status = reply[2]
            if status:
                log.warning(
                    "redis store: thread %r got a new epoch or a repair (%s): "
                    "its stream or ids were lost or rolled back (see docs/store.md, "
                    "'Redis settings the store needs')",
                    thread,
                    text(status),
                )
            if isinstance(reply, Exception):
                failure = reply
                if error is None and self._calls.unavailable(reply):
                    # A cluster master down or its slots moving: worth a retry.
                    failure = self._calls.failure(reply, retry_hint=MAYBE_STORED)
                elif not error and not isinstance(reply, (AppendConflict, TooManyThreads)):
                    failure = StoreError(f"append failed: {reply}{self._calls.cluster_hint(reply)}")
                for queued in members:
                    if not queued.done.done():
                        queued.done.set_exception(failure)
                continue
            offsets = [text(o) for o in reply[1]]
            start = 0
            for queued in members:
                if not queued.done.done():
                    queued.done.set_result(offsets[start : start + queued.count])
                start += queued.count

    async def _run_appends(self, groups: list[tuple[str, list[_QueuedAppend]]]) -> list[Any]:
        """One pipeline with one EVALSHA per thread; loads the script if Redis lost it.

        Replaying after NoScriptError is safe: event ids make appends idempotent.
        On Redis Cluster each master gets the calls of its threads (see
        :meth:`agui_hub.store.redis.cluster.ClusterOps.run_scripts`).
        """
        calls = [self._append_call(thread, members) for thread, members in groups]
        script, cluster = self._script, self._calls.cluster
        if cluster is not None:
            return await cluster.run_scripts(script, calls)
        for attempt in range(2):
            packed = b"".join(
                command(b"EVALSHA", script.sha, len(keys), *keys, *args) for keys, args in calls
            )
            replies = await round_trip(self._calls.client, packed, len(calls))
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
                await self._calls.client.script_load(script.source)
                continue
            return list(replies)
        raise AssertionError("unreachable")  # pragma: no cover

    def _append_call(
        self, thread: str, members: list[_QueuedAppend]
    ) -> tuple[list[str], list[Any]]:
        """The append script's KEYS and ARGV for *members*, appends to *thread*."""
        r = self.retention
        expect = members[0].expect
        args: list[Any] = [
            f"{_epochs.getrandbits(64):016x}",
            r.max_len,
            int(r.max_age * 1000),
            int(r.ttl * 1000),
            notify_channel(self._prefix, thread),
            sum(m.count for m in members),
            "" if expect is None else expect.after,
            "" if expect is None or expect.epoch is None else expect.epoch,
            IDS_REBUILD_LIMIT,
            r.max_bytes,
            r.max_tenant_threads,
            thread,
            self._prefix,
            self.notify_bytes,
            MAX_RUNS,
        ]
        for member in members:
            args += member.quads
        # On a cluster every key of one script must be in the thread's slot: the
        # tenant's set is not (there is no quota there), so the meta key stands
        # in for it; the script touches KEYS[5] only when max_tenant_threads is set.
        tenant = (
            tenant_key(self._prefix, tenant_of(thread))
            if self._calls.cluster is None
            else meta_key(self._prefix, thread)
        )
        keys = [
            stream_key(self._prefix, thread),
            meta_key(self._prefix, thread),
            ids_key(self._prefix, thread),
            checkpoint_key(self._prefix, thread),
            tenant,
            runs_key(self._prefix, thread),
        ]
        return keys, args

    async def close(self) -> None:
        """Wait (up to ``op_timeout``) for the appends in flight to be answered."""
        committing = [
            lane.committer
            for lane in self._lanes.values()
            if lane.committer is not None and not lane.committer.done()
        ]
        if committing:
            await asyncio.wait(committing, timeout=self._calls.op_timeout)
