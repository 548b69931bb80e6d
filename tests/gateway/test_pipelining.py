"""Pipelined publishes: many in flight to one thread, stored together, in order.

A connection (or a :class:`HubClient`, or a :class:`Publisher`) that does not
wait for each reply before it sends the next publish to a thread gets them
stored in the order sent, answered in that order, and the verdicts of
publishing them one by one; the writer stores what queued up behind an
append in one append (a group commit). These tests drive that through
:class:`ThreadWriter` directly and through in-process gateways over real
WebSocket connections, on the memory store and on a real redis-server (the
session one, under a key prefix of the test's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection, connect

from agui_hub.client.hub_client import HubClient
from agui_hub.client.publisher import Publisher
from agui_hub.errors import ProtocolError, SequenceError, StoreUnavailable
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.gateway.writer import GROUP_BYTES, GROUP_EVENTS, SequenceCheck, ThreadWriter
from agui_hub.store.contract import EventInput, Expected, ThreadStore, encode_event_data
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore
from agui_hub.wire.offsets import START, Offset, offset_key

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..proxy import FaultProxy
from ..runs import content, end, new_thread, run_finished, run_started, start

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing."""
MSGPACK = "agui-hub.v1.msgpack"

T = TypeVar("T")
Event = dict[str, Any]
Frame = dict[str, Any]


async def within(awaitable: Awaitable[T], timeout: float = WAIT) -> T:
    return await asyncio.wait_for(awaitable, timeout)


async def until(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


async def queued() -> None:
    """Let the tasks just made run up to their first wait (in the writer: queued)."""
    for _ in range(3):
        await asyncio.sleep(0)


def increasing(offsets: Sequence[Offset]) -> bool:
    keys = [offset_key(o) for o in offsets]
    return all(a < b for a, b in itertools.pairwise(keys))


def delta(*ops: Event) -> Event:
    return {"type": "STATE_DELTA", "delta": list(ops)}


# -- stores whose appends a test can watch, slow down, hold or fail ---------------------------


@dataclass
class Appends:
    """Wraps a store's ``append`` (on the instance: the writer calls it there).

    Records the events of every call; *delay* makes each call that much
    slower (a round trip), *hold* keeps calls waiting until it is set,
    *fail* raises StoreUnavailable for that many calls (before storing), and
    *after* runs once a call has stored its events.
    """

    store: ThreadStore
    delay: float = 0.0
    hold: asyncio.Event | None = None
    fail: int = 0
    after: Callable[[], None] | None = None
    calls: list[list[EventInput]] = field(default_factory=list)

    def __post_init__(self) -> None:
        real = self.store.append

        async def append(
            thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
        ) -> list[Offset]:
            self.calls.append(list(events))
            if self.hold is not None:
                await self.hold.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail > 0:
                self.fail -= 1
                await asyncio.sleep(0)
                raise StoreUnavailable("the store is down (a test's)")
            offsets = await real(thread, events, expect=expect)
            if self.after is not None:
                self.after()
            return offsets

        self.store.append = append  # type: ignore[method-assign]

    @property
    def sizes(self) -> list[int]:
        return [len(c) for c in self.calls]


async def stored(store: ThreadStore, thread: str) -> list[tuple[Offset, Event, str]]:
    entries = await within(store.read(thread, after=START))
    return [(e.offset, msgpack.unpackb(e.data, raw=False), e.event_id) for e in entries]


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[], ThreadStore]]:
    """Opens stores of one kind; a redis one under a prefix of this test's own."""
    made: list[ThreadStore] = []
    prefix = f"test-pipelining-{uuid.uuid4().hex}"

    def open_store() -> ThreadStore:
        store: ThreadStore
        if request.param == "memory":
            store = made[0] if made else MemoryStore()  # one process: one store
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            store = RedisStore(server.url, prefix=prefix)
        made.append(store)
        return store

    yield open_store
    for store in {id(s): s for s in made}.values():
        with contextlib.suppress(Exception):
            await within(store.close())


def publishes(
    writer: ThreadWriter,
    thread: str,
    batches: Sequence[Sequence[Event]],
    ids: Sequence[Sequence[str] | None] | None = None,
) -> list[asyncio.Future[list[Offset]]]:
    """One task per batch, started in order (each queues before it first awaits)."""
    ids = ids or [None] * len(batches)
    return [
        asyncio.ensure_future(writer.publish(thread, list(b), i))
        for b, i in zip(batches, ids, strict=True)
    ]


async def outcomes(tasks: Sequence[asyncio.Future[list[Offset]]]) -> list[Any]:
    """Each task's offsets, or (error class, code, rule, index) for its error."""
    await within(asyncio.wait(list(tasks)))
    results: list[Any] = []
    for task in tasks:
        error = task.exception()
        if error is None:
            results.append(task.result())
        else:
            assert isinstance(error, ProtocolError), error
            results.append(
                (type(error).__name__, error.code, getattr(error, "rule", None), error.index)
            )
    return results


# -- the writer: group commit -----------------------------------------------------------------


async def test_publishes_queued_behind_an_append_are_stored_in_one(
    make_store: Callable[[], ThreadStore],
) -> None:
    store = make_store()
    appends = Appends(store, hold=asyncio.Event())
    writer = ThreadWriter(store)
    thread = new_thread()
    first = publishes(writer, thread, [[run_started(thread), start("m1")]])
    await until(lambda: appends.sizes == [2])  # held: the next ones queue up behind it
    batches = [[content("m1", f"d{n}")] for n in range(50)] + [[end("m1"), run_finished(thread)]]
    rest = publishes(writer, thread, batches)
    await queued()
    assert appends.sizes == [2]
    assert appends.hold is not None
    appends.hold.set()
    offsets = [o for t in [*first, *rest] for o in await within(t)]

    assert appends.sizes == [2, 52]  # the 51 waiting publishes: one append
    assert [len(await t) for t in rest] == [1] * 50 + [2]  # each its own offsets
    assert increasing(offsets)
    rows = await stored(store, thread)
    assert [offset for offset, _, _ in rows] == offsets
    expected = [run_started(thread), start("m1"), *(b for batch in batches for b in batch)]
    assert [event for _, event, _ in rows] == expected
    assert writer._gates == {}


def _candidates(thread: str, rng: random.Random, count: int) -> list[list[Event]]:
    """Publishes for a thread with one run and messages m1..m3: most of them valid,
    some refused (content of a message never started or already ended, a second
    start, a delta that does not apply, a state over the depth limit)."""
    pool: list[Callable[[], list[Event]]] = [
        lambda: [content(f"m{rng.randint(1, 3)}", f"c{rng.randint(0, 99)}")],
        lambda: [start(f"m{rng.randint(1, 3)}")],
        lambda: [end(f"m{rng.randint(1, 3)}")],
        lambda: [content("m1", "a"), content(f"m{rng.randint(1, 3)}", "b")],
        lambda: [delta({"op": "add", "path": f"/k{rng.randint(0, 3)}", "value": 1})],
        lambda: [delta({"op": "remove", "path": f"/k{rng.randint(0, 3)}"})],
        lambda: [{"type": "STATE_SNAPSHOT", "snapshot": {"k0": 0}}],
    ]
    batches = [[run_started(thread), {"type": "STATE_SNAPSHOT", "snapshot": {}}]]
    batches += [rng.choice(pool)() for _ in range(count)]
    batches.append([run_finished(thread)])
    return batches


@pytest.mark.parametrize("seed", range(4))
async def test_a_group_gets_the_verdicts_of_publishing_one_by_one(
    make_store: Callable[[], ThreadStore], seed: int
) -> None:
    """Refused publishes in the middle of a queue: each gets its own error and
    index, and the ones after it are judged as if it had never been sent."""
    store = make_store()
    appends = Appends(store, delay=0.002)
    pipelined, one_by_one = new_thread(), new_thread()
    rng = random.Random(seed)
    batches = _candidates(pipelined, rng, 60)
    twin = [[dict(e, threadId=one_by_one) if "threadId" in e else e for e in b] for b in batches]

    writer = ThreadWriter(store)
    got = await outcomes(publishes(writer, pipelined, batches))
    grouped = len(appends.calls)
    sequential = ThreadWriter(store)
    want = [(await outcomes(publishes(sequential, one_by_one, [b])))[0] for b in twin]

    def shape(results: list[Any]) -> list[Any]:
        return [len(r) if isinstance(r, list) else r for r in results]

    assert shape(got) == shape(want)
    assert any(not isinstance(r, list) for r in want), "the seed refuses nothing: no test"
    mine = [(e, i) for _, e, i in await stored(store, pipelined)]
    theirs = [(e, i) for _, e, i in await stored(store, one_by_one)]
    assert [e for e, _ in mine] == [
        dict(e, threadId=pipelined) if "threadId" in e else e for e, _ in theirs
    ]
    ok = [o for r in got if isinstance(r, list) for o in r]
    assert increasing(ok) and [o for o, _, _ in await stored(store, pipelined)] == ok
    assert grouped < len(batches) // 2  # they were stored in groups
    assert writer._gates == {}


async def test_waiting_callers_and_leaders_that_go_away_leave_the_rest_working(
    make_store: Callable[[], ThreadStore],
) -> None:
    """A caller cancelled while it waits stores nothing; a leader cancelled while
    its append is under way, or told to lead and cancelled before it could,
    hands its group to the next caller; nobody is left waiting."""
    store = make_store()
    writer = ThreadWriter(store)
    thread = new_thread()
    await within(writer.publish(thread, [run_started(thread), start("m1")]))
    hold, second = asyncio.Event(), asyncio.Event()
    appends = Appends(store, hold=hold)
    first = publishes(writer, thread, [[content("m1", "first")]])[0]
    await until(lambda: len(appends.calls) == 1)
    # Behind it: the next leader, and the group it will lead.
    leader = publishes(writer, thread, [[content("m1", "leader")]])[0]
    waiting = publishes(writer, thread, [[content("m1", f"w{n}")] for n in range(6)])
    await queued()
    waiting[1].cancel()  # waits: as if never sent

    def hold_the_next_append() -> None:
        appends.after, appends.hold = None, second

    appends.after = hold_the_next_append
    hold.set()
    await within(first)
    await until(lambda: len(appends.calls) == 2)
    assert appends.sizes[1] == 6  # the leader, w0 and w2..w5: held
    leader.cancel()  # its append never ran: the others go on, led by w0
    await until(lambda: len(appends.calls) == 3)
    assert leader.cancelled() and waiting[1].cancelled()
    assert appends.sizes[2] == 5

    # The late ones queue behind w0's group. Once its append is done, late[0]
    # is told to lead and is cancelled before it runs.
    late = publishes(writer, thread, [[content("m1", "late0")], [content("m1", "late1")]])
    await queued()

    def cancel_the_next_leader() -> None:
        appends.after = None
        asyncio.get_running_loop().call_soon(late[0].cancel)

    appends.after = cancel_the_next_leader
    second.set()
    await within(asyncio.wait([*waiting, *late]))

    assert late[0].cancelled()
    done = [t for t in [*waiting, *late] if not t.cancelled()]
    assert [t.exception() for t in done] == [None] * 6
    deltas = [e["delta"] for _, e, _ in await stored(store, thread) if "delta" in e]
    assert deltas == ["first", "w0", "w2", "w3", "w4", "w5", "late1"]  # the others never ran
    assert len(appends.calls) == 4
    assert writer._gates == {}
    # The writer is in step with the stream: the thread goes on.
    await within(writer.publish(thread, [end("m1"), run_finished(thread)]))


async def test_a_store_failure_fails_the_group_and_the_queue_and_a_retry_stores_it_once(
    make_store: Callable[[], ThreadStore],
) -> None:
    store = make_store()
    writer = ThreadWriter(store)
    thread = new_thread()
    await within(writer.publish(thread, [run_started(thread), start("m1")]))
    hold = asyncio.Event()
    appends = Appends(store, hold=hold, fail=1)
    ids = [[f"e{n}"] for n in range(8)]
    tasks = publishes(writer, thread, [[content("m1", f"d{n}")] for n in range(8)], ids)
    await until(lambda: len(appends.calls) == 1)
    hold.set()
    await within(asyncio.wait(tasks))
    # The seven waiting behind the failed one are not judged without it: they
    # get its failure too, to be sent again after it.
    assert appends.sizes == [1]
    assert all(isinstance(t.exception(), StoreUnavailable) for t in tasks)

    retried = publishes(writer, thread, [[content("m1", f"d{n}")] for n in range(8)], ids)
    offsets = [(await within(t))[0] for t in retried]
    again = await within(writer.publish(thread, [content("m1", "d3")], ["e3"]))
    assert again == [offsets[3]]
    rows = await stored(store, thread)
    assert [i for _, _, i in rows[2:]] == [i[0] for i in ids]
    assert [o for o, _, _ in rows[2:]] == offsets


async def test_an_event_id_repeated_across_a_group_is_stored_once(
    make_store: Callable[[], ThreadStore],
) -> None:
    """A publish sent again while the first try still waits (a retry): one by
    one, the second is answered with the first's offsets."""
    store = make_store()
    writer = ThreadWriter(store)
    thread = new_thread()
    await within(writer.publish(thread, [run_started(thread)]))
    hold = asyncio.Event()
    appends = Appends(store, hold=hold)
    batches = [[start("m1")], [start("m1"), content("m1", "x")], [start("m1")], [end("m1")]]
    ids = [["s"], ["s", "x"], ["s"], ["e"]]
    blocker = publishes(writer, thread, [[start("m0")]])
    await until(lambda: len(appends.calls) == 1)
    tasks = publishes(writer, thread, batches, ids)
    await queued()
    hold.set()
    results = [await within(t) for t in [*blocker, *tasks]]
    assert results[1][0] == results[2][0] == results[3][0]
    assert len(appends.calls) > 2  # not one group: one by one
    assert [i for _, _, i in await stored(store, thread)][2:] == ["s", "x", "e"]


async def test_a_group_is_bounded_in_events_and_bytes(
    make_store: Callable[[], ThreadStore],
) -> None:
    store = make_store()
    writer = ThreadWriter(store)
    thread = new_thread()
    await within(writer.publish(thread, [run_started(thread), start("m1")]))
    hold = asyncio.Event()
    appends = Appends(store, hold=hold)
    blocker = publishes(writer, thread, [[content("m1", "first")]])
    await until(lambda: len(appends.calls) == 1)
    many = [[content("m1", f"{b}.{n}") for n in range(300)] for b in range(7)]
    pad = "y" * (GROUP_BYTES // 5)
    big = [[content("m1", pad)] for _ in range(12)]
    tasks = publishes(writer, thread, [*many, *big])
    await queued()
    hold.set()
    await within(asyncio.gather(*blocker, *tasks), 3 * WAIT)

    assert appends.sizes[0] == 1
    assert appends.sizes[1:3] == [900, 900]  # a fourth batch of 300 would pass 1000 events
    assert all(size <= GROUP_EVENTS for size in appends.sizes)
    for call in appends.calls:
        assert sum(len(encode_event_data(e.event)) for e in call) <= GROUP_BYTES
    # Five of the large events would pass the byte bound: at most four go together.
    assert max(sum(len(e.event["delta"]) == len(pad) for e in call) for call in appends.calls) == 4
    assert len(appends.calls) < 1 + 7 + 12  # grouped all the same
    events = [e for _, e, _ in await stored(store, thread)][3:]
    assert events == [e for batch in [*many, *big] for e in batch]


async def test_sequence_check_off_keeps_the_order_of_concurrent_calls(
    make_store: Callable[[], ThreadStore],
) -> None:
    store = make_store()
    Appends(store, delay=0.002)
    writer = ThreadWriter(store, sequence=SequenceCheck.OFF)
    thread = new_thread()
    batches = [[content("m9", f"d{n}")] for n in range(100)]  # never started: OFF takes it
    results = await within(asyncio.gather(*publishes(writer, thread, batches)))
    offsets = [r[0] for r in results]
    assert increasing(offsets)
    assert [e for _, e, _ in await stored(store, thread)] == [b[0] for b in batches]


# -- the gateway ------------------------------------------------------------------------------


async def start_gateway(store: ThreadStore, **config: Any) -> Gateway:
    settings = {"host": "127.0.0.1", "port": 0, "ping_interval": None, **config}
    gateway = Gateway(GatewayConfig(**settings), store=store)
    await within(gateway.start())
    return gateway


@contextlib.asynccontextmanager
async def gateway_on(store: ThreadStore, **config: Any) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(store, **config)
    try:
        yield gateway
    finally:
        await within(gateway.drain(), 15 * TIMEOUT_SCALE)


class Raw:
    """A raw msgpack connection: send many commands, then read the frames."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, gateway: Gateway) -> Raw:
        url = f"ws://127.0.0.1:{gateway.config.port}/"
        ws = await within(connect(url, subprotocols=[MSGPACK], max_size=None))  # type: ignore[list-item]
        return cls(ws)

    async def send(self, frame: Frame) -> None:
        await self.ws.send(msgpack.packb(frame, use_bin_type=True))

    async def recv(self) -> Frame:
        frame = msgpack.unpackb(await within(self.ws.recv()), raw=False)
        assert isinstance(frame, dict)
        return frame

    async def replies(self, count: int) -> list[Frame]:
        """The next *count* replies (frames other than events and snapshots)."""
        frames: list[Frame] = []
        for _ in range(count * 4 + 100):
            frame = await self.recv()
            if frame["type"] not in ("event", "snapshot"):
                frames.append(frame)
                if len(frames) == count:
                    return frames
        raise AssertionError(f"no {count} replies")

    async def request(self, frame: Frame) -> Frame:
        await self.send(frame)
        (reply,) = await self.replies(1)
        return reply

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await within(self.ws.close())


def publish_frame(n: int, thread: str, events: list[Event], ids: list[str] | None = None) -> Frame:
    frame: Frame = {"type": "publish", "id": n, "thread": thread, "events": events}
    if ids is not None:
        frame["eventIds"] = ids
    return frame


@pytest.mark.timeout(90)
async def test_two_thousand_pipelined_publishes_into_one_thread_on_redis(
    redis_server: RedisServer,
) -> None:
    count = 2000
    store = RedisStore(redis_server.url, prefix=f"test-pipelining-{uuid.uuid4().hex}")
    appends = Appends(store)
    thread = new_thread()
    events = [run_started(thread), start("m1")]
    events += [content("m1", f"t{n} ") for n in range(count - 2)]
    async with gateway_on(store, max_commands_per_second=100_000) as gateway:
        raw = await Raw.open(gateway)
        for n, event in enumerate(events):
            await raw.send(publish_frame(n, thread, [event], [f"id-{n}"]))
        replies = await raw.replies(count)
        await raw.close()

        assert [r["type"] for r in replies] == ["published"] * count
        assert [r["id"] for r in replies] == list(range(count))  # acks in order
        offsets = [r["offsets"][0] for r in replies]
        assert increasing(offsets)
        rows = await stored(store, thread)
        assert [(o, e, i) for o, e, i in rows] == [
            (o, e, f"id-{n}") for n, (o, e) in enumerate(zip(offsets, events, strict=True))
        ]
        # One conditional append per group, not per publish.
        assert len(appends.calls) <= count // 4, len(appends.calls)


def _mixed_frames(thread: str, first_id: int) -> list[Frame]:
    """Publishes with refusals in the middle: a delta of an unknown message, a
    batch refused at its second event, an invalid event, a delta that does not
    apply, content after the end; and a retry of ids stored before."""
    batches: list[tuple[list[Event], list[str]]] = [
        ([run_started(thread), {"type": "STATE_SNAPSHOT", "snapshot": {"n": 0}}], ["a", "b"]),
        ([start("m1")], ["c"]),
        ([content("m1", "one")], ["d"]),
        ([content("nobody", "refused")], ["e"]),
        ([content("m1", "two"), content("m2", "refused"), content("m1", "never")], ["f", "g", "h"]),
        ([content("m1", "three")], ["i"]),
        ([{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1"}], ["j"]),  # no delta: invalid
        ([delta({"op": "remove", "path": "/missing"})], ["k"]),
        ([delta({"op": "replace", "path": "/n", "value": 1})], ["l"]),
        ([content("m1", "one")], ["d"]),  # the same id again: a retry
        ([end("m1")], ["m"]),
        ([content("m1", "after the end")], ["n"]),
        ([run_finished(thread)], ["o"]),
    ]
    return [publish_frame(first_id + n, thread, b, ids) for n, (b, ids) in enumerate(batches)]


def _verdict(reply: Frame) -> Any:
    if reply["type"] == "published":
        return ("published", len(reply["offsets"]))
    return ("error", reply["code"], reply.get("index"))


async def test_a_refused_publish_in_a_pipeline_is_answered_as_if_sent_alone(
    make_store: Callable[[], ThreadStore],
) -> None:
    store = make_store()
    appends = Appends(store, delay=0.003)
    pipelined, one_by_one = new_thread(), new_thread()
    async with gateway_on(store) as gateway:
        raw = await Raw.open(gateway)
        frames = _mixed_frames(pipelined, 100)
        for frame in frames:
            await raw.send(frame)
        got = await raw.replies(len(frames))
        grouped = len(appends.calls)
        want = [await raw.request(f) for f in _mixed_frames(one_by_one, 200)]
        await raw.close()

    assert [r["id"] for r in got] == [f["id"] for f in frames]  # in order, refusals too
    assert [_verdict(r) for r in got] == [_verdict(r) for r in want]
    assert ("error", "sequence_error", 1) in [_verdict(r) for r in got]
    assert grouped < len(frames)  # some were stored together
    retried = [r["offsets"] for r in got if r["id"] in (102, 109)]
    assert retried[0] == retried[1]
    mine = [(e, i) for _, e, i in await stored(store, pipelined)]
    theirs = [(e, i) for _, e, i in await stored(store, one_by_one)]
    assert [e for e, _ in mine] == [
        dict(e, threadId=pipelined) if "threadId" in e else e for e, _ in theirs
    ]
    assert [i for _, i in mine] == [i for _, i in theirs]


async def _wait_idle(gateway: Gateway) -> None:
    for _ in range(int(200 * TIMEOUT_SCALE)):
        if not gateway.hub.writer._gates:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"publishes still queued: {gateway.hub.writer._gates}")


async def test_a_connection_closed_mid_pipeline_leaves_the_others_working(
    make_store: Callable[[], ThreadStore],
) -> None:
    store = make_store()
    Appends(store, delay=0.02)
    thread = new_thread()
    async with gateway_on(store) as gateway:
        setup = await Raw.open(gateway)
        reply = await setup.request(
            publish_frame(0, thread, [run_started(thread), start("mA"), start("mB")])
        )
        assert reply["type"] == "published"
        leaving, staying = await Raw.open(gateway), await Raw.open(gateway)
        count = 300
        for n in range(count):
            await staying.send(publish_frame(n, thread, [content("mB", f"b{n}")], [f"b{n}"]))
            await leaving.send(publish_frame(n, thread, [content("mA", f"a{n}")], [f"a{n}"]))
        first = await leaving.recv()  # it is being served ...
        assert first["type"] == "published"
        leaving.ws.transport.abort()  # ... and goes away with most still to do
        replies = await staying.replies(count)

        assert [r["id"] for r in replies] == list(range(count))
        assert {r["type"] for r in replies} == {"published"}
        assert increasing([r["offsets"][0] for r in replies])
        later = await setup.request(
            publish_frame(1, thread, [end("mB"), content("mA", "later"), end("mA")])
        )
        assert later["type"] == "published"
        await _wait_idle(gateway)
        await setup.close()
        await staying.close()

    deltas = [e["delta"] for _, e, _ in await stored(store, thread) if "delta" in e]
    assert [d for d in deltas if d.startswith("b")] == [f"b{n}" for n in range(count)]
    from_a = [d for d in deltas if d.startswith("a")]
    assert from_a == [f"a{n}" for n in range(len(from_a))]  # a prefix, in order, once each
    assert 1 <= len(from_a) < count
    assert deltas[-1] == "later"


async def test_a_publish_after_a_subscribe_is_seen_by_that_subscription(
    make_store: Callable[[], ThreadStore],
) -> None:
    """Pipelined publish, subscribe "live", publishes: the subscription starts
    after the first and before the others, as when each reply is awaited."""
    store = make_store()
    thread = new_thread()
    async with gateway_on(store) as gateway:
        raw = await Raw.open(gateway)
        await raw.send(publish_frame(1, thread, [run_started(thread)]))
        await raw.send({"type": "subscribe", "id": 2, "thread": thread, "from": "live"})
        events = [start("m1"), *(content("m1", f"d{n}") for n in range(30))]
        for n, event in enumerate(events):
            await raw.send(publish_frame(3 + n, thread, [event]))
        frames: list[Frame] = []
        for _ in range(4 * len(events) + 20):
            frames.append(await raw.recv())
            seen = [f for f in frames if f["type"] == "event"]
            answered = sum(f["type"] == "published" for f in frames)
            if len(seen) == len(events) and answered == 1 + len(events):
                break
        await raw.close()

    replies = [f for f in frames if f["type"] not in ("event",)]
    assert [(r["type"], r["id"]) for r in replies][:2] == [("published", 1), ("subscribed", 2)]
    assert [r["id"] for r in replies[2:]] == list(range(3, 3 + len(events)))
    assert [f["event"] for f in frames if f["type"] == "event"] == events


# -- clients: order across reconnects ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_hub_client_pipelined_publishes_keep_their_order_across_drops(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Concurrent publishes through one client; the connection drops three times
    with replies lost: the unanswered ones go again, in order, before later ones."""
    store: ThreadStore
    if kind == "memory":
        store = MemoryStore()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisStore(server.url, prefix=f"test-pipelining-{uuid.uuid4().hex}")
    Appends(store, delay=0.003)
    thread = new_thread()
    count = 240
    events = [run_started(thread), start("m1")]
    events += [content("m1", f"<{n}>") for n in range(count - 4)]
    events += [end("m1"), run_finished(thread)]
    async with (
        gateway_on(store) as gateway,
        FaultProxy("127.0.0.1", gateway.config.port, websocket=True) as proxy,
    ):

        async def drops() -> None:
            # One at a time: all of them go out on the first connection, and
            # each later marker has to be in what is sent again.
            for count, n in enumerate((30, 90, 170), 1):
                proxy.drop_reply_after(f"<{n}>".encode())
                await proxy.wait_dropped(count, timeout=WAIT)

        dropping = asyncio.create_task(drops())
        async with HubClient(f"ws://127.0.0.1:{proxy.port}/", backoff_max=0.2) as client:
            calls = [client.publish(thread, [event], timeout=WAIT) for event in events]
            results = await within(asyncio.gather(*calls), 3 * WAIT)
            await within(dropping)
            assert client.reconnects == proxy.dropped == 3
            assert client._publishes.lanes == {}
        rows = await stored(store, thread)

    offsets = [r[0] for r in results]
    assert increasing(offsets)
    assert [(o, e) for o, e, _ in rows] == list(zip(offsets, events, strict=True))


async def test_hub_client_sends_concurrent_publishes_in_call_order() -> None:
    store = MemoryStore()
    thread = new_thread()
    events = [run_started(thread), start("m1"), *(content("m1", f"d{n}") for n in range(200))]
    async with gateway_on(store) as gateway:
        url = f"ws://127.0.0.1:{gateway.config.port}/"
        async with HubClient(url, encoding="json") as client:
            tasks = [asyncio.create_task(client.publish(thread, [e])) for e in events]
            refused = asyncio.create_task(client.publish(thread, [content("m2", "no")]))
            tail = asyncio.create_task(client.publish(thread, [end("m1")]))
            offsets = [(await within(t))[0] for t in tasks]
            with pytest.raises(SequenceError) as caught:
                await within(refused)
            assert caught.value.index == 0
            await within(tail)
    rows = await stored(store, thread)
    assert [e for _, e, _ in rows] == [*events, end("m1")]
    assert [o for o, _, _ in rows][: len(offsets)] == offsets


async def test_publisher_first_calls_share_one_connection_and_keep_their_order() -> None:
    store = MemoryStore()
    thread = new_thread()
    events = [run_started(thread), start("m1"), *(content("m1", f"d{n}") for n in range(50))]
    async with gateway_on(store) as gateway:
        publisher = Publisher(f"ws://127.0.0.1:{gateway.config.port}/")
        try:
            # Not connected yet: every call waits for the same connection.
            offsets = await within(asyncio.gather(*(publisher.publish(thread, e) for e in events)))
        finally:
            await within(publisher.close())
        assert gateway.counters.opened == 1
    assert increasing(offsets)
    assert [e for _, e, _ in await stored(store, thread)] == events


async def test_publisher_into_a_store_retries_a_failed_group_in_call_order() -> None:
    thread = new_thread()
    async with Publisher("memory://", retry_for=WAIT) as publisher:
        assert publisher._store is not None
        appends = Appends(publisher._store, fail=1)
        events = [run_started(thread), start("m1"), *(content("m1", f"d{n}") for n in range(40))]
        offsets = await within(asyncio.gather(*(publisher.publish(thread, e) for e in events)))
        assert appends.sizes[0] == 1  # the first failed, and everything behind it went again
        assert publisher._lanes == {}
        rows = await stored(publisher._store, thread)
    assert increasing(offsets)
    assert [(o, e) for o, e, _ in rows] == list(zip(offsets, events, strict=True))
