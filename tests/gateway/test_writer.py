"""ThreadWriter (agui_hub.gateway.writer): validate, verify the sequence, append all or nothing.

Every test runs over the memory store and over a real redis-server (the
session ``redis_server``, isolated by a key prefix per test). "Another
writer" is another ThreadWriter on the same threads: on Redis it has a store
object of its own, as another process would; in memory it shares the one
MemoryStore (there is no other way to share an in-process store).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar, cast

import msgpack
import pytest

from agui_hub.agui.reducer import StateLimits, ThreadState, fold
from agui_hub.errors import (
    InvalidEvent,
    LimitExceeded,
    OffsetExpired,
    PatchError,
    SequenceError,
    StoreUnavailable,
)
from agui_hub.gateway.writer import SequenceCheck, ThreadWriter
from agui_hub.store.contract import (
    START,
    Checkpoint,
    EventInput,
    Expected,
    Offset,
    Retention,
    ThreadStore,
)
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore
from agui_hub.wire.offsets import offset_key

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..runs import content, end, new_thread, run_finished, run_started, start

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one store operation."""

T = TypeVar("T")
Event = dict[str, Any]


async def within(awaitable: Awaitable[T]) -> T:
    """*awaitable*, or TimeoutError after WAIT seconds."""
    return await asyncio.wait_for(awaitable, WAIT)


# -- events -----------------------------------------------------------------------------------


# -- stores -----------------------------------------------------------------------------------


class Stores:
    """Handles on one set of threads: memory (one shared object) or Redis (one per call)."""

    def __init__(self, kind: str, redis: RedisServer | None) -> None:
        self.kind = kind
        self.redis = redis
        self.prefix = f"test-writer-{uuid.uuid4().hex}"
        self.opened: list[ThreadStore] = []
        self._memory: MemoryStore | None = None

    def open(self, retention: Retention | None = None) -> ThreadStore:
        """A store on this test's threads (for Redis: a new connection pool, like a process)."""
        if self.kind == "memory":
            if self._memory is None:
                self._memory = MemoryStore(retention=retention)
                self.opened.append(self._memory)
            return self._memory
        assert self.redis is not None
        store = RedisStore(self.redis.url, prefix=self.prefix, retention=retention)
        self.opened.append(store)
        return store

    async def close(self) -> None:
        for store in self.opened:
            await within(store.close())


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    redis = request.getfixturevalue("redis_server") if request.param == "redis" else None
    handles = Stores(request.param, redis)
    try:
        yield handles
    finally:
        await handles.close()


async def stored(store: ThreadStore, thread: str) -> list[tuple[Offset, Event, str]]:
    """(offset, event, event id) of every entry still stored in *thread*, oldest first."""
    info = await within(store.info(thread))
    after = info.trimmed if info is not None and info.trimmed is not None else START
    entries = await within(store.read(thread, after=after))
    return [(e.offset, msgpack.unpackb(e.data, raw=False), e.event_id) for e in entries]


async def stored_events(store: ThreadStore, thread: str) -> list[Event]:
    return [event for _, event, _ in await stored(store, thread)]


async def publish(
    writer: ThreadWriter, thread: str, events: Sequence[Any], ids: Sequence[str] | None = None
) -> list[Offset]:
    return await within(writer.publish(thread, events, ids))


def increasing(offsets: Sequence[Offset]) -> bool:
    keys = [offset_key(o) for o in offsets]
    return all(a < b for a, b in itertools.pairwise(keys))


# -- the tests --------------------------------------------------------------------------------


async def test_a_valid_batch_is_stored_in_order(stores: Stores) -> None:
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    events = [run_started(thread, "r1"), start("m1"), content("m1", "Hello"), end("m1")]
    events.append(run_finished(thread, "r1"))
    ids = [f"e{i}" for i in range(len(events))]

    offsets = await publish(writer, thread, events, ids)

    assert len(offsets) == 5 and increasing(offsets)
    assert await stored(store, thread) == list(zip(offsets, events, ids, strict=True))
    entries = await within(store.read(thread))
    assert [e.type for e in entries] == [e["type"] for e in events]
    assert [e.run_id for e in entries] == ["r1"] * 5  # later events inherit the run
    assert await within(store.last_offset(thread)) == offsets[-1]


async def test_an_invalid_event_stores_nothing(stores: Stores) -> None:
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    missing_delta = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1"}

    with pytest.raises(InvalidEvent) as caught:
        await publish(writer, thread, [run_started(thread, "r1"), start("m1"), missing_delta])
    assert "delta" in str(caught.value)
    assert caught.value.index == 2  # the position of the event at fault
    with pytest.raises(InvalidEvent) as caught:
        await publish(writer, thread, [{"type": "NOT_AN_AGUI_EVENT"}])
    assert caught.value.index == 0

    assert await stored(store, thread) == []
    assert await within(store.epoch(thread)) is None  # not even created
    # The thread is usable: the same run can start now.
    assert len(await publish(writer, thread, [run_started(thread, "r1")])) == 1


async def test_a_sequence_error_in_a_batch_stores_none_of_it(stores: Stores) -> None:
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    first = await publish(writer, thread, [run_started(thread, "r1")], ["rs"])

    # m2 was never started: the third event of four breaks the rules.
    batch = [start("m1"), content("m1", "a"), content("m2", "b"), end("m1")]
    with pytest.raises(SequenceError) as caught:
        await publish(writer, thread, batch, ["s", "c1", "c2", "e"])
    error = caught.value
    assert error.rule == "message_not_open"
    assert error.event == content("m2", "b")
    assert error.index == 2
    assert error.thread == thread
    assert "[message_not_open] TEXT_MESSAGE_CONTENT" in str(error) and "'m2'" in str(error)
    assert await stored(store, thread) == [(first[0], run_started(thread, "r1"), "rs")]

    # The writer recorded nothing of the rejected batch: m1 is not open, so
    # the corrected batch (which starts m1 again) is accepted.
    fixed = [start("m1"), content("m1", "a"), content("m1", "b"), end("m1")]
    offsets = await publish(writer, thread, fixed, ["s", "c1", "c2", "e"])
    assert increasing(first + offsets)
    assert await stored_events(store, thread) == [run_started(thread, "r1"), *fixed]

    # A single event goes through the same check (a faster path in the writer).
    with pytest.raises(SequenceError) as single:
        await publish(writer, thread, [end("m1")])
    assert (single.value.rule, single.value.index) == ("message_not_open", 0)
    assert len(await stored(store, thread)) == 5
    assert len(await publish(writer, thread, [run_finished(thread, "r1")])) == 1


async def test_a_retry_with_the_same_ids_stores_nothing_twice(stores: Stores) -> None:
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    batch = [run_started(thread, "r1"), start("m1"), content("m1", "a")]
    ids = ["a1", "a2", "a3"]
    offsets = await publish(writer, thread, batch, ids)

    # The whole batch again: it opens a run and a message, which would break
    # the rules if it were judged again; it is answered from the store.
    assert await publish(writer, thread, batch, ids) == offsets
    # Another writer (an agent that restarted, or another gateway) retrying.
    other = ThreadWriter(stores.open())
    assert await publish(other, thread, batch, ids) == offsets
    assert len(await stored(store, thread)) == 3

    # Partly known: the known events keep their offsets, the new ones are
    # judged after them and appended.
    more = [*batch, content("m1", "b"), end("m1")]
    again = await publish(writer, thread, more, [*ids, "a4", "a5"])
    assert again[:3] == offsets
    assert increasing(again)
    assert await stored(store, thread) == list(zip(again, more, [*ids, "a4", "a5"], strict=True))

    # A partly known batch whose new part breaks the rules stores nothing new;
    # the error names the event's position in the whole batch.
    with pytest.raises(SequenceError) as caught:
        await publish(writer, thread, [*more, content("m1", "late")], [*ids, "a4", "a5", "a6"])
    assert caught.value.index == 5
    assert len(await stored(store, thread)) == 5


async def test_sequence_check_off_stores_what_strict_rejects(stores: Stores) -> None:
    store = stores.open()
    thread = new_thread()
    out_of_order = content("m9", "repair")  # no run, no message started

    with pytest.raises(SequenceError) as caught:
        await publish(ThreadWriter(store), thread, [out_of_order])
    assert caught.value.rule == "run_not_started"
    assert await stored(store, thread) == []

    relaxed = ThreadWriter(store, sequence=SequenceCheck.OFF)
    offsets = await publish(relaxed, thread, [out_of_order, end("m8")], ["x1", "x2"])
    assert await stored(store, thread) == [
        (offsets[0], out_of_order, "x1"),
        (offsets[1], end("m8"), "x2"),
    ]
    # Still idempotent, and still validated one event at a time.
    assert await publish(relaxed, thread, [out_of_order], ["x1"]) == offsets[:1]
    with pytest.raises(InvalidEvent):
        await publish(relaxed, thread, [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m9"}])
    assert len(await stored(store, thread)) == 2


async def test_a_second_writer_is_seen(stores: Stores) -> None:
    thread = new_thread()
    a_store, b_store = stores.open(), stores.open()
    a, b = ThreadWriter(a_store), ThreadWriter(b_store)
    # A has judged this thread before: it holds a verifier at its own last offset.
    await publish(a, thread, [run_started(thread, "r1"), start("m1"), end("m1")])
    await publish(a, thread, [run_finished(thread, "r1")])

    # B starts a run and a message ...
    await publish(b, thread, [run_started(thread, "r2"), start("m2")])
    # ... and A, catching up, may send content for B's message and close it.
    await publish(a, thread, [content("m2", "from A"), end("m2")])
    # A knows the message is closed now, B learns it too:
    with pytest.raises(SequenceError) as closed:
        await publish(b, thread, [content("m2", "too late")])
    assert closed.value.rule == "message_not_open"
    await publish(b, thread, [run_finished(thread, "r2")])
    # ... and A learns the run is over.
    with pytest.raises(SequenceError) as over:
        await publish(a, thread, [start("m3")])
    assert over.value.rule == "run_already_finished"

    events = await stored_events(a_store, thread)
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert await stored_events(b_store, thread) == events


async def test_events_published_again_leave_the_writer_in_step(stores: Stores) -> None:
    """Events republished with their ids (a demo run twice, a replay piped back into
    its thread) are answered with their offsets; what the writer knows stays what
    the stream holds, whether the rules refused them or not."""
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    first = await publish(writer, thread, [run_started(thread, "r1")], ["a1"])
    closing = await publish(writer, thread, [run_finished(thread, "r1")], ["a2"])
    # RUN_STARTED r1 again passes the rules after RUN_FINISHED; its id is stored.
    assert await publish(writer, thread, [run_started(thread, "r1")], ["a1"]) == first
    assert len(await stored(store, thread)) == 2
    # The run is over in the stream, and for the writer: a new run may start.
    second = await publish(writer, thread, [run_started(thread, "r2"), start("m1")], ["b1", "b2"])

    # Partly known: only what was stored counts.
    more = await publish(writer, thread, [start("m1"), content("m1")], ["b2", "b3"])
    assert more[0] == second[1]
    with pytest.raises(SequenceError) as caught:
        await publish(writer, thread, [start("m1")])  # m1 is open in the stream
    assert caught.value.rule == "message_already_open"
    await publish(writer, thread, [end("m1"), run_finished(thread, "r2")])
    assert [e["type"] for e in await stored_events(store, thread)] == [
        "RUN_STARTED", "RUN_FINISHED", "RUN_STARTED", "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED",
    ]  # fmt: skip
    assert closing[0] != more[0]


async def test_a_retry_through_another_writer_that_is_behind(stores: Stores) -> None:
    """A producer's reply is lost on one gateway and it retries on another, whose
    state predates events the first one stored: the retry gets its offsets, and
    the second writer then knows everything in between."""
    thread = new_thread()
    w1, w2 = ThreadWriter(stores.open()), ThreadWriter(stores.open())
    await publish(w1, thread, [run_started(thread)])
    await publish(w2, thread, [{"type": "STATE_SNAPSHOT", "snapshot": {}}])
    await publish(w1, thread, [start("m1")])  # w2 has not read this
    offsets = await publish(w1, thread, [start("m2")], ["x"])  # the reply is lost
    assert await publish(w2, thread, [start("m2")], ["x"]) == offsets
    # w2 knows that m1 is open: content for it passes, the run cannot finish yet.
    await publish(w2, thread, [content("m1", "hi")])
    with pytest.raises(SequenceError) as caught:
        await publish(w2, thread, [end("m2"), run_finished(thread)])
    assert caught.value.rule == "run_finished_with_open_items"
    await publish(w2, thread, [end("m2"), end("m1"), run_finished(thread)])


async def test_a_trimmed_history_still_accepts_the_open_message(stores: Stores) -> None:
    retention = Retention(max_len=5)
    store = stores.open(retention)
    thread = new_thread()
    writer = ThreadWriter(store)
    opening = [run_started(thread, "r1"), start("m1")]
    await publish(writer, thread, [*opening, *(content("m1", f"d{i}") for i in range(8))])
    info = await within(store.info(thread))
    assert info is not None and info.length == 5 and info.trimmed is not None
    assert [e["type"] for e in await stored_events(store, thread)] == ["TEXT_MESSAGE_CONTENT"] * 5

    # The writer that wrote it goes on.
    await publish(writer, thread, [content("m1", "same writer")])
    # A fresh writer (a restarted gateway) no longer sees RUN_STARTED and
    # TEXT_MESSAGE_START, yet accepts what continues them ...
    fresh = ThreadWriter(stores.open(retention))
    await publish(fresh, thread, [content("m1", f"fresh {i}") for i in range(6)])
    await publish(fresh, thread, [end("m1")])
    # ... while still judging what the kept events show: m1 is closed now.
    with pytest.raises(SequenceError) as closed:
        await publish(fresh, thread, [content("m1", "after the end")])
    assert closed.value.rule == "message_not_open"

    # The first writer's last event was trimmed by the fresh writer's appends
    # meanwhile: it too goes on from what is stored (the run is still active).
    assert "same writer" not in [e.get("delta") for e in await stored_events(store, thread)]
    await publish(writer, thread, [start("m2"), content("m2", "old writer")])
    with pytest.raises(SequenceError) as still_closed:
        await publish(writer, thread, [content("m1", "old writer, after the end")])
    assert still_closed.value.rule == "message_not_open"
    await publish(fresh, thread, [end("m2"), run_finished(thread, "r1")])

    assert await stored_events(store, thread) == [
        end("m1"),
        start("m2"),
        content("m2", "old writer"),
        end("m2"),
        run_finished(thread, "r1"),
    ]


async def test_a_trimmed_history_judges_what_continues_it(stores: Stores) -> None:
    """The benefit of the doubt is given once: what it let through, and what other
    writers stored since, is judged by the usual rules afterwards."""
    retention = Retention(max_len=3)
    thread = new_thread()
    a = ThreadWriter(stores.open(retention))
    await publish(a, thread, [run_started(thread, "r1"), start("m1")])
    for i in range(3):
        await publish(a, thread, [content("m1", f"d{i}")])
    # B starts on the trimmed thread: it sees neither the run nor m1's start.
    b = ThreadWriter(stores.open(retention))
    await publish(b, thread, [end("m1")])

    # A opens and closes m7; B learns of it by catching up, and refuses content after its end.
    await publish(a, thread, [start("m7")])
    await publish(a, thread, [end("m7")])
    with pytest.raises(SequenceError) as after_end:
        await publish(b, thread, [content("m7", "late")])
    assert after_end.value.rule == "message_not_open"

    # zz was never mentioned: its end gets the benefit of the doubt, once.
    await publish(b, thread, [end("zz")])
    for late in (content("zz"), end("zz")):
        with pytest.raises(SequenceError) as closed:
            await publish(b, thread, [late])
        assert closed.value.rule == "message_not_open"
    # Content of a message never mentioned is accepted and continues it until its end.
    await publish(b, thread, [content("yy", "1"), content("yy", "2"), end("yy")])
    with pytest.raises(SequenceError):
        await publish(b, thread, [content("yy", "3")])


async def test_a_trimmed_history_accepts_a_message_opened_before_the_window(
    stores: Stores,
) -> None:
    retention = Retention(max_len=5)
    store = stores.open(retention)
    thread = new_thread()
    writer = ThreadWriter(store)
    # m1 opens, then m2 streams so much that nothing of m1 is kept.
    events = [run_started(thread, "r1"), start("m1"), content("m1", "a"), start("m2")]
    await publish(writer, thread, [*events, *(content("m2", f"d{i}") for i in range(8))])
    assert {e["messageId"] for e in await stored_events(store, thread)} == {"m2"}

    # The writer that wrote it knows m1 is open (and m2 pushes that out again):
    await publish(writer, thread, [content("m1", "b"), *(content("m2", f"e{i}") for i in range(5))])
    assert {e["messageId"] for e in await stored_events(store, thread)} == {"m2"}
    # A restarted writer cannot know, and should give the producer the benefit
    # of the doubt as it does for m2: m1 may have been opened in the trimmed part.
    fresh = ThreadWriter(stores.open(retention))
    await publish(fresh, thread, [content("m2", "more")])  # accepted (kept in the window)
    await publish(fresh, thread, [content("m1", "c"), end("m1")])
    # Taken on trust, not tracked: it does not hold up the end of the run.
    await publish(fresh, thread, [end("m2"), run_finished(thread, "r1")])
    assert (await stored_events(store, thread))[-4:] == [
        content("m1", "c"),
        end("m1"),
        end("m2"),
        run_finished(thread, "r1"),
    ]


async def test_a_checkpoint_makes_a_trimmed_history_exact(stores: Stores) -> None:
    """With a checkpoint of the folded thread, a fresh writer knows what was opened."""
    retention = Retention(max_len=5)
    store = stores.open(retention)
    thread = new_thread()
    writer = ThreadWriter(store)
    events = [run_started(thread, "r1"), start("m1"), content("m1", "a"), start("m2")]
    offsets = await publish(writer, thread, events)
    # What a gateway serving the thread stores: its folded state at an offset.
    state = ThreadState()
    for event in events:
        state.apply(event)
    epoch = await within(store.epoch(thread))
    assert epoch is not None
    checkpoint = Checkpoint(offsets[-1], epoch, msgpack.packb(state.compact()), True)
    await within(store.put_checkpoint(thread, checkpoint))
    await publish(writer, thread, [content("m2", f"d{i}") for i in range(4)])
    assert {e["messageId"] for e in await stored_events(store, thread)} == {"m2"}

    fresh = ThreadWriter(stores.open(retention))
    await publish(fresh, thread, [content("m1", "b")])  # m1 is open: the checkpoint says so
    with pytest.raises(SequenceError) as never:
        await publish(fresh, thread, [content("m7")])  # and m7 never was
    assert never.value.rule == "message_not_open"
    with pytest.raises(SequenceError) as still_open:
        await publish(fresh, thread, [run_finished(thread, "r1")])
    assert "m1" in str(still_open.value)
    await publish(fresh, thread, [end("m1"), end("m2"), run_finished(thread, "r1")])


class GatedAppends:
    """A real store whose next append waits until :attr:`gate` is set.

    Used to run one writer's whole publish between another writer's read
    and its append, deterministically (the same interleaving two processes
    get by chance).
    """

    def __init__(self, store: ThreadStore) -> None:
        self.store = store
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()
        self.appends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        self.appends += 1
        self.waiting.set()
        await self.gate.wait()
        return await self.store.append(thread, events, expect=expect)


async def racing_writers(
    stores: Stores, thread: str
) -> tuple[ThreadStore, ThreadWriter, GatedAppends, ThreadWriter]:
    """Writer A, and writer B whose next append waits for its gate; r1 started."""
    a_store = stores.open()
    gated = GatedAppends(stores.open())
    a, b = ThreadWriter(a_store), ThreadWriter(cast(ThreadStore, gated))
    gated.gate.set()
    await publish(b, thread, [run_started(thread, "r1")])
    gated.gate.clear()
    gated.waiting.clear()
    gated.appends = 0
    return a_store, a, gated, b


async def test_a_writer_that_raced_another_catches_up_afterwards(stores: Stores) -> None:
    thread = new_thread()
    a_store, a, gated, b = await racing_writers(stores, thread)

    # B has judged m2's start and waits to append it; A meanwhile publishes
    # m1's start (both are valid at that instant).
    b_publish = asyncio.create_task(b.publish(thread, [start("m2")]))
    await within(gated.waiting.wait())
    await publish(a, thread, [start("m1")])
    gated.gate.set()
    await within(b_publish)
    # B's first append found A's event after what it had seen and stored
    # nothing; B read it, judged again and appended.
    assert gated.appends == 2
    assert [e.get("messageId") for e in await stored_events(a_store, thread)] == [
        None,
        "m1",
        "m2",
    ]

    # After the race both writers know that m1 and m2 are open.
    await publish(a, thread, [content("m2", "A writes to m2")])
    await publish(b, thread, [content("m1", "B writes to m1")])


async def test_a_race_that_would_break_the_rules_is_refused(stores: Stores) -> None:
    """Two writers open the same message at the same instant: only one is stored."""
    thread = new_thread()
    a_store, a, gated, b = await racing_writers(stores, thread)

    b_publish = asyncio.create_task(b.publish(thread, [start("m1"), content("m1", "B")]))
    await within(gated.waiting.wait())
    await publish(a, thread, [start("m1"), content("m1", "A")])
    gated.gate.set()
    with pytest.raises(SequenceError) as caught:
        await within(b_publish)
    assert (caught.value.rule, caught.value.index) == ("message_already_open", 0)
    assert [e.get("delta") for e in await stored_events(a_store, thread)] == [None, None, "A"]
    # B knows A's message now: it may continue it.
    await publish(b, thread, [content("m1", "B"), end("m1")])


class CountingStore:
    """A real store that counts the calls a writer makes to it."""

    def __init__(self, store: ThreadStore) -> None:
        self.store = store
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return await method(*args, **kwargs)

        return counted


async def test_a_lone_writer_makes_one_store_call_per_publish(stores: Stores) -> None:
    """Reads happen when the thread is new to the writer or someone else wrote."""
    thread = new_thread()
    counting = CountingStore(stores.open())
    writer = ThreadWriter(cast(ThreadStore, counting))
    await publish(writer, thread, [run_started(thread), start("m1")])
    assert counting.calls["append"] == 1
    # The append created the thread: the next publish reads its epoch, once.
    await publish(writer, thread, [content("m1", "second")])
    counting.calls.clear()
    for n in range(20):
        await publish(writer, thread, [content("m1", f"d{n}")])
    assert counting.calls == {"append": 20}

    # Someone else appends (a plain producer, no writer): the next publish
    # reads what it stored, once.
    other = stores.open()
    await other.append(thread, [EventInput.of(end("m1"), "plain-end")])
    counting.calls.clear()
    with pytest.raises(SequenceError) as caught:
        await publish(writer, thread, [content("m1", "after the end")])
    assert caught.value.rule == "message_not_open"
    assert counting.calls.get("read", 0) == 1
    counting.calls.clear()
    await publish(writer, thread, [run_finished(thread)])
    assert counting.calls == {"append": 1}


async def test_a_batch_with_a_repeated_id_is_not_half_stored(stores: Stores) -> None:
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    batch = [run_started(thread, "r1"), start("m1"), end("m1")]
    try:
        offsets = await publish(writer, thread, batch, ["a", "b", "b"])
    except ValueError:
        assert await stored(store, thread) == []  # rejected as a whole: fine
        return
    # Accepted: then each returned offset must hold the event it was returned for.
    by_offset = {offset: event for offset, event, _ in await stored(store, thread)}
    assert [by_offset.get(offset) for offset in offsets] == batch


async def test_the_writer_keeps_the_state_of_a_bounded_number_of_threads(stores: Stores) -> None:
    """The least recently published threads are dropped, and read again when needed."""
    counting = CountingStore(stores.open())
    writer = ThreadWriter(cast(ThreadStore, counting), max_threads=3)
    threads = [new_thread() for _ in range(6)]
    for thread in threads:
        await publish(writer, thread, [run_started(thread), start("m1")])
        await publish(writer, thread, [content("m1", "known now")])  # reads the new thread
    counting.calls.clear()
    for thread in threads[-3:]:  # kept: one append each
        await publish(writer, thread, [content("m1")])
    assert counting.calls == {"append": 3}
    counting.calls.clear()
    # Dropped: read again, and judged as before (m1 is open, the run goes on).
    await publish(writer, threads[0], [end("m1")])
    assert counting.calls.get("read", 0) == 1
    with pytest.raises(SequenceError):
        await publish(writer, threads[0], [content("m1", "after the end")])

    # Concurrent publishes to many threads leave no per-thread lock behind.
    await asyncio.gather(
        *(publish(writer, t, [content("m1", f"c{n}")]) for n in range(5) for t in threads[1:])
    )
    assert writer._gates == {}
    assert len(writer._seen) <= 3
    with pytest.raises(ValueError):
        ThreadWriter(counting, max_threads=0)  # type: ignore[arg-type]


# -- state events are judged before they are stored ---------------------------------------------


def snapshot(state: Any) -> Event:
    return {"type": "STATE_SNAPSHOT", "snapshot": state}


def delta(*ops: Event) -> Event:
    return {"type": "STATE_DELTA", "delta": list(ops)}


def add(path: str, value: Any) -> Event:
    return {"op": "add", "path": path, "value": value}


def remove(path: str) -> Event:
    return {"op": "remove", "path": path}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_a_delta_that_does_not_apply_is_stored_and_changes_nothing(
    stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    """As the official client takes it: it warns and goes on, the state as it
    was. Stored, relayed, logged with its thread and offset, counted."""
    store = stores.open()
    writer = ThreadWriter(store)
    thread = new_thread()
    await publish(writer, thread, [run_started(thread), snapshot({"count": 1, "items": []})])
    activity = {"type": "ACTIVITY_SNAPSHOT", "messageId": "p", "activityType": "PLAN"}
    step = {"type": "ACTIVITY_DELTA", "messageId": "p", "activityType": "PLAN"}
    bad = [
        delta({"op": "replace", "path": "/count", "value": 2}),
        delta(remove("/missing")),  # all or nothing: nothing of it applies
        delta(add("/items/-", "a"), {"op": "test", "path": "/count", "value": 1}),
        {**activity, "content": {"steps": []}},
        {**step, "patch": [remove("/nothing")]},
    ]
    with caplog.at_level(logging.WARNING, logger="agui_hub.hub"):
        offsets = await publish(writer, thread, bad)
        (single,) = await publish(writer, thread, [bad[1]])  # the one-event path
    assert writer.patches_not_applied == 4
    warned = [r.getMessage() for r in caplog.records if "stays as it was" in r.getMessage()]
    assert len(warned) == 4
    assert offsets[1] in warned[0] and thread in warned[0] and "/missing" in warned[0]
    assert single in warned[3]
    assert [e for e in await stored_events(store, thread)][2:] == [*bad, bad[1]]
    # The writer's state is the official client's: later deltas are judged against it.
    await publish(writer, thread, [delta({"op": "test", "path": "/count", "value": 2})])
    await publish(writer, thread, [delta({"op": "test", "path": "/items", "value": []})])
    await publish(writer, thread, [{**step, "patch": [add("/steps/-", "s")]}])
    # A fresh writer (another gateway) folds the stream to the same state.
    other = ThreadWriter(stores.open())
    await publish(other, thread, [delta({"op": "test", "path": "/count", "value": 2})])
    await publish(other, thread, [run_finished(thread)])
    assert other.patches_not_applied == 0  # what others stored is not counted again
    folded = fold(await stored_events(store, thread))
    assert folded.state == {"count": 2, "items": []}
    assert len(folded.rejected) == 4  # the fold's own record of what did not apply


async def test_a_delta_that_does_not_apply_is_refused_in_strict_mode(
    stores: Stores,
) -> None:
    store = stores.open()
    writer = ThreadWriter(store, strict_patches=True)
    thread = new_thread()
    await publish(writer, thread, [run_started(thread), snapshot({"count": 1, "items": []})])

    bad = [delta({"op": "replace", "path": "/count", "value": 2}), delta(remove("/missing"))]
    with pytest.raises(PatchError) as caught:
        await publish(writer, thread, bad)
    assert (caught.value.index, caught.value.code) == (1, "patch_error")
    with pytest.raises(PatchError) as single:  # the one-event path
        await publish(writer, thread, [bad[1]])
    assert single.value.index == 0
    assert len(await stored(store, thread)) == 2

    # Each event of a batch is judged after the ones before it ...
    await publish(writer, thread, [delta(add("/x", 1)), delta(remove("/x")), bad[0]])
    with pytest.raises(PatchError) as twice:
        await publish(
            writer, thread, [delta(add("/y", 1)), delta(remove("/y")), delta(remove("/y"))]
        )
    assert twice.value.index == 2
    # ... and nothing of a refused batch is kept: /y is not there, /count is 2.
    await publish(writer, thread, [delta({"op": "test", "path": "/count", "value": 2})])
    await publish(writer, thread, [delta(add("/y", 2), add("/items/-", "a"))])

    # A fresh writer (another gateway) knows the same state from the stream.
    other = ThreadWriter(stores.open(), strict_patches=True)
    with pytest.raises(PatchError):
        await publish(other, thread, [delta({"op": "test", "path": "/y", "value": 1})])
    await publish(other, thread, [delta({"op": "test", "path": "/y", "value": 2})])
    await publish(other, thread, [run_finished(thread)])
    folded = fold(await stored_events(store, thread))
    assert folded.rejected == []
    assert folded.state == {"count": 2, "items": ["a"], "y": 2}


async def test_a_state_event_over_the_limits_is_refused_before_storing(stores: Stores) -> None:
    store = stores.open()
    thread = new_thread()
    # The reproduction of issue 10, with the default limits: a 250-deep snapshot.
    writer = ThreadWriter(store)
    with pytest.raises(LimitExceeded) as deep:
        await publish(writer, thread, [run_started(thread), snapshot(nested(250))])
    assert (deep.value.index, deep.value.limit, deep.value.value) == (1, "max_depth", 64)
    assert deep.value.code == "limit_exceeded"
    assert await within(store.epoch(thread)) is None  # nothing stored, not even the thread

    small = ThreadWriter(
        store, limits=StateLimits(max_depth=8, max_bytes=2000), strict_patches=True
    )
    await publish(small, thread, [run_started(thread), snapshot({"notes": []})])
    grow = [delta(add("/notes/-", "x" * 1000)), delta(add("/notes/-", "y" * 1000))]
    with pytest.raises(LimitExceeded) as big:
        await publish(small, thread, grow)
    assert (big.value.index, big.value.limit, big.value.value) == (1, "max_bytes", 2000)
    with pytest.raises(LimitExceeded) as deeper:
        await publish(small, thread, [delta(add("/deep", nested(8)))])
    assert (deeper.value.index, deeper.value.limit) == (0, "max_depth")
    activity = {"type": "ACTIVITY_SNAPSHOT", "messageId": "p", "activityType": "PLAN"}
    with pytest.raises(LimitExceeded):
        await publish(small, thread, [{**activity, "content": {"text": "z" * 2000}}])
    await publish(small, thread, [{**activity, "content": {"steps": []}}])
    step = {"type": "ACTIVITY_DELTA", "messageId": "p", "activityType": "PLAN",
            "patch": [add("/steps/-", "s" * 1200)]}  # fmt: skip
    with pytest.raises(LimitExceeded) as activity_delta:
        await publish(small, thread, [step, step])
    assert activity_delta.value.index == 1
    with pytest.raises(PatchError):
        await publish(small, thread, [{**step, "patch": [remove("/nothing")]}])
    assert [e["type"] for e in await stored_events(store, thread)] == [
        "RUN_STARTED", "STATE_SNAPSHOT", "ACTIVITY_SNAPSHOT",
    ]  # fmt: skip
    # The next valid publish goes through.
    await publish(small, thread, [grow[0], step, run_finished(thread)])


async def test_state_deltas_are_judged_after_what_other_writers_stored(stores: Stores) -> None:
    thread = new_thread()
    a_store = stores.open()
    a = ThreadWriter(a_store, strict_patches=True)
    b = ThreadWriter(stores.open(), strict_patches=True)
    await publish(a, thread, [run_started(thread), snapshot({"n": 0})])
    await publish(b, thread, [snapshot({"m": []})])  # a has not read this
    # a judges against {"n": 0}, refuses, catches up and accepts against {"m": []}.
    await publish(a, thread, [delta(add("/m/-", 1))])
    with pytest.raises(PatchError):
        await publish(a, thread, [delta({"op": "replace", "path": "/n", "value": 1})])
    # A plain producer stores a delta that does not apply: it is skipped when
    # catching up, as a gateway's fold skips it.
    plain = EventInput.of(delta(remove("/nothing")), "plain")
    await within(stores.open().append(thread, [plain]))
    await publish(a, thread, [delta(add("/m/-", 2))])
    await publish(b, thread, [delta({"op": "test", "path": "/m", "value": [1, 2]})])
    folded = fold(await stored_events(a_store, thread))
    assert folded.state == {"m": [1, 2]} and len(folded.rejected) == 1


async def test_a_trimmed_thread_is_judged_from_its_checkpoint_or_taken_on_trust(
    stores: Stores,
) -> None:
    retention = Retention(max_len=5)
    store = stores.open(retention)
    writer = ThreadWriter(store)
    push_out = [content("m1", f"d{i}") for i in range(6)]
    opening = [run_started("x"), snapshot({"count": 0}), start("m1")]

    # Without a checkpoint the state document is unknown: deltas are taken on
    # trust until the next snapshot, then judged again.
    unknown = new_thread()
    await publish(writer, unknown, [{**opening[0], "threadId": unknown}, *opening[1:], *push_out])
    fresh = ThreadWriter(stores.open(retention), strict_patches=True)
    await publish(fresh, unknown, [delta({"op": "replace", "path": "/count", "value": 1})])
    await publish(fresh, unknown, [delta(remove("/unknown"))])  # on trust
    await publish(fresh, unknown, [snapshot({"count": 5})])
    with pytest.raises(PatchError):
        await publish(fresh, unknown, [delta(remove("/unknown"))])

    # With a checkpoint the writer knows the state exactly.
    known = new_thread()
    events = [{**opening[0], "threadId": known}, *opening[1:]]
    offsets = await publish(writer, known, events)
    epoch = await within(store.epoch(known))
    assert epoch is not None
    checkpoint = Checkpoint(offsets[-1], epoch, msgpack.packb(fold(events).compact()), True)
    await within(store.put_checkpoint(known, checkpoint))
    await publish(writer, known, push_out[:4])  # the checkpoint still reaches what is kept
    assert "STATE_SNAPSHOT" not in [e["type"] for e in await stored_events(store, known)]
    fresh = ThreadWriter(stores.open(retention), strict_patches=True)
    with pytest.raises(PatchError):
        await publish(fresh, known, [delta(remove("/unknown"))])
    await publish(fresh, known, [delta({"op": "replace", "path": "/count", "value": 1})])


async def test_an_integer_out_of_range_is_an_invalid_event_with_its_index(stores: Stores) -> None:
    store = stores.open()
    thread = new_thread()
    for writer in (ThreadWriter(store), ThreadWriter(store, sequence=SequenceCheck.OFF)):
        with pytest.raises(InvalidEvent) as caught:
            await publish(writer, thread, [run_started(thread), snapshot({"n": 2**70})])
        assert caught.value.index == 1
        assert "cannot be stored" in str(caught.value)
    assert await within(store.epoch(thread)) is None


async def test_sequence_check_off_does_not_judge_state_events(stores: Stores) -> None:
    """Documented: a writer that checks no order keeps nothing of the thread, so it
    stores deltas that do not apply (a gateway's fold skips them)."""
    store = stores.open()
    thread = new_thread()
    relaxed = ThreadWriter(store, sequence=SequenceCheck.OFF)
    await publish(relaxed, thread, [snapshot({"a": 1}), delta(remove("/missing"))])
    assert len(await stored(store, thread)) == 2
    assert relaxed._seen == {}


async def test_the_writer_bounds_the_bytes_of_state_it_keeps(stores: Stores) -> None:
    store = stores.open()
    writer = ThreadWriter(store, max_state_cache_bytes=50_000, strict_patches=True)
    threads = [new_thread() for _ in range(5)]
    for n, thread in enumerate(threads):
        await publish(writer, thread, [run_started(thread)])
        await publish(writer, thread, [snapshot({"blob": "x" * 20_000, "n": n})])
        await publish(writer, thread, [delta({"op": "replace", "path": "/n", "value": n + 100})])
        assert writer._state_bytes <= 50_000
        assert writer._state_bytes == sum(seen.docs.memory for seen in writer._seen.values())
    assert len(writer._seen) == 2  # two documents of ~20 kB fit
    # A thread dropped for room is read again, and judged as before.
    with pytest.raises(PatchError):
        await publish(writer, threads[0], [delta({"op": "test", "path": "/n", "value": 0})])
    await publish(writer, threads[0], [delta({"op": "test", "path": "/n", "value": 100})])
    # One thread larger than the bound is kept while it is published to.
    alone = ThreadWriter(store, max_state_cache_bytes=100)
    await publish(alone, threads[1], [delta({"op": "replace", "path": "/n", "value": 8})])
    assert list(alone._seen) == [threads[1]]
    writer.forget(threads[0])
    assert writer._state_bytes == sum(seen.docs.memory for seen in writer._seen.values())
    with pytest.raises(ValueError):
        ThreadWriter(store, max_state_cache_bytes=-1)


async def test_the_state_cache_counts_memory_not_encoded_bytes(stores: Stores) -> None:
    """5,000 empty lists encode to 15 kB and take about 360 kB: the cache
    counts the latter, so a 1 MB budget keeps three such threads, not sixty."""
    store = stores.open()
    writer = ThreadWriter(store, max_state_cache_bytes=1_000_000)
    for _ in range(5):
        thread = new_thread()
        await publish(writer, thread, [run_started(thread)])
        await publish(writer, thread, [snapshot({"a": [[] for _ in range(5000)]})])
        seen = writer._seen[thread]
        assert seen.docs.size < 16_000 and seen.docs.memory > 300_000
        assert writer._state_bytes <= 1_000_000
    assert len(writer._seen) == 3


class YieldingReads:
    """A real store whose reads take a turn of the event loop first (a round trip).

    Appends do not: with a producer appending at every turn, a read that
    takes two calls (trim mark, then entries) always straddles an append.
    """

    def __init__(self, store: ThreadStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)
        if name in ("append", "subscribe", "close") or not callable(method):
            return method

        async def after_a_turn(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)
            return await method(*args, **kwargs)

        return after_a_turn


@pytest.mark.timeout(30)
async def test_a_thread_trimmed_flat_out_is_rebuilt_without_offset_expired(
    stores: Stores,
) -> None:
    """Issue 10: with max_len 20 and a producer appending flat out, a fresh writer
    read the trim mark, then the events after it, and got OffsetExpired in between
    (50 of 50 publishes through a Publisher).

    Against a producer that appends between any two calls, a writer may still
    fail to find a moment to append after what it read: it then raises
    StoreUnavailable ("kept changing"), and the same ids succeed later.
    """
    retention = Retention(max_len=20)
    thread = new_thread()
    producer = stores.open(retention)
    await within(producer.append(thread, [EventInput.of(run_started(thread)),
                                          EventInput.of(start("m1"))]))  # fmt: skip
    done = asyncio.Event()
    appended = 0

    async def produce() -> None:
        nonlocal appended
        while not done.is_set() and appended < 50_000:
            await producer.append(thread, [EventInput.of(content("m1", "p"))])
            appended += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(produce())
    expired: list[OffsetExpired] = []
    starved: list[int] = []
    try:
        for n in range(30):
            store = stores.open(retention)
            reads = cast(ThreadStore, YieldingReads(store)) if stores.kind == "memory" else store
            writer = ThreadWriter(reads)  # fresh each time, as a new Publisher is
            try:
                await publish(writer, thread, [content("m1", f"w{n}")], [f"w{n}"])
            except OffsetExpired as exc:
                expired.append(exc)
            except StoreUnavailable as exc:
                assert "kept changing" in str(exc)
                starved.append(n)
    finally:
        done.set()
        await within(task)
    assert expired == []
    assert appended > 30
    if stores.kind == "memory":
        assert starved == []  # the trim mark and the events are read in one call
    for n in starved:  # once the producer stops, the same ids go through
        await publish(ThreadWriter(stores.open(retention)), thread, [content("m1", f"w{n}")],
                      [f"w{n}"])  # fmt: skip


class TrimmingBetweenReads:
    """A store without ``read_available``: the first ``info()`` is followed, before
    its caller's next call, by appends that trim past the trim mark it returned."""

    def __init__(self, store: ThreadStore, thread: str) -> None:
        self.store = store
        self.thread = thread
        self.infos = 0

    def __getattr__(self, name: str) -> Any:
        if name == "read_available":
            raise AttributeError(name)
        return getattr(self.store, name)

    async def info(self, thread: str) -> Any:
        info = await self.store.info(thread)
        self.infos += 1
        if self.infos == 1:
            more = [EventInput.of(content("m1", "meanwhile")) for _ in range(3)]
            await self.store.append(self.thread, more)
        return info


async def test_without_read_available_a_trimmed_read_is_retried(stores: Stores) -> None:
    retention = Retention(max_len=5)
    thread = new_thread()
    store = stores.open(retention)
    events = [run_started(thread), start("m1"), *(content("m1") for _ in range(8))]
    await within(store.append(thread, [EventInput.of(e) for e in events]))
    racing = TrimmingBetweenReads(stores.open(retention), thread)
    writer = ThreadWriter(cast(ThreadStore, racing))
    await publish(writer, thread, [content("m1", "after the race")])
    assert racing.infos == 2  # read again after the trim overtook the first read
    assert (await stored_events(store, thread))[-1] == content("m1", "after the race")
