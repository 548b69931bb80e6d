"""agui_hub.gateway.presence: who watches a thread, on every gateway of one store.

In-process gateways on the memory store and on a real Redis (two gateways share
it), real WebSocket clients; and gateway processes on one redis-server, one of
them SIGKILLed, for the expiry of a dead gateway's entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from typing import Any

import pytest
from websockets.asyncio.client import connect

from agui_hub.errors import StoreUnavailable
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.presence import PresenceMode, PresenceTracker
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore
from agui_hub.wire.protocol import SUBPROTOCOL_JSON

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import Gateways
from . import test_server
from .test_server import Client, Frame, Harness

pytestmark = pytest.mark.timeout(60)

# The fixtures of tests/gateway/test_server.py (harness: memory and Redis).
harness = test_server.harness
store_factory = test_server.store_factory

WAIT = 10 * TIMEOUT_SCALE
FAST = {"presence_interval": 0.1, "presence_ttl": 3.0}
SECRET = "presence-test-secret-" + "s" * 32


def new_prefix() -> str:
    """Keys of one test only, on the session's redis-server."""
    return f"test-presence-{uuid.uuid4().hex}"


class Conn:
    """What the tracker needs of a connection, for the tests of the tracker alone."""

    encoding = None

    def __init__(self, *threads: str, is_open: bool = True) -> None:
        self.threads = set(threads)
        self.is_open = is_open

    def send(self, frame: bytes | str) -> bool:
        return True


def frames_of(frames: list[Frame], kind: str) -> list[Frame]:
    return [f for f in frames if f["type"] == kind]


async def next_frame(client: Client, kind: str, thread: str) -> Frame:
    """The next frame of *kind* about *thread* (others stay pending, in order)."""
    for i, seen in enumerate(client.pending):
        if seen["type"] == kind and seen.get("thread") == thread and "id" not in seen:
            del client.pending[i]
            return seen
    deadline = time.monotonic() + WAIT
    while True:
        frame = await client._read(max(0.01, deadline - time.monotonic()))
        if frame["type"] == kind and frame.get("thread") == thread and "id" not in frame:
            return frame
        client.pending.append(frame)


async def watch(viewer: Client, thread: str, **extra: Any) -> Frame:
    """Subscribe with presence: true; the first presence frame."""
    await viewer.subscribe(thread, "live", presence=True, **extra)
    return await next_frame(viewer, "presence", thread)


async def presence(client: Client, thread: str, **extra: Any) -> Frame:
    reply = await client.request({"type": "presence", "thread": thread, **extra})
    assert reply["type"] == "presence", reply
    return reply


async def until_count(client: Client, thread: str, count: int) -> Frame:
    """Ask until the presence of *thread* has *count* entries."""
    deadline = time.monotonic() + WAIT
    while True:
        reply = await presence(client, thread)
        if reply["count"] == count or time.monotonic() > deadline:
            assert reply["count"] == count, reply
            return reply
        await asyncio.sleep(0.05)


async def test_viewers_on_two_gateways_see_the_same_presence(harness: Harness) -> None:
    first = await harness.gateway(**FAST)
    second = await harness.gateway(store=harness.shared_store(first), **FAST)
    thread = "watched"
    alice = await harness.client(first)
    seen = await watch(alice, thread, client={"name": "console", "device": "laptop"})
    assert seen["count"] == 1 and seen["more"] is False
    [own] = seen["entries"]
    assert own["connection"] == seen["connection"]
    assert own["subject"] == "anonymous" and own["client"] == {
        "name": "console",
        "device": "laptop",
    }
    assert abs(own["joined"] / 1000 - time.time()) < 60

    bob = await harness.client(second)
    bob_seen = await watch(bob, thread)
    carol = await harness.client(second)
    await carol.subscribe(thread, "live")  # present, not watching
    joined = await next_frame(alice, "joined", thread)
    names = {e["connection"] for e in joined["entries"]}
    if joined["count"] < 3:  # bob and carol came in two intervals
        names |= {e["connection"] for e in (await next_frame(alice, "joined", thread))["entries"]}
    assert len(names) == 2 and bob_seen["connection"] in names
    on_first = await until_count(alice, thread, 3)
    on_second = await until_count(bob, thread, 3)
    assert on_first["entries"] == on_second["entries"]
    assert on_first["entries"][0] == own  # by joined

    # Unsubscribed, and closed: both leave at once, on both gateways.
    assert (await carol.request({"type": "unsubscribe", "thread": thread}))[
        "type"
    ] == "unsubscribed"
    left = await next_frame(alice, "left", thread)
    assert left["count"] == 2 and len(left["entries"]) == 1
    await bob.close()
    left = await next_frame(alice, "left", thread)
    assert left["entries"] == [{"connection": bob_seen["connection"], "subject": "anonymous"}]
    assert left["count"] == 1
    assert (await presence(alice, thread))["entries"] == [own]


async def test_a_storm_of_joins_is_a_few_frames(harness: Harness) -> None:
    gateway = await harness.gateway(presence_interval=0.5, presence_ttl=3.0)
    thread = "storm"
    watcher = await harness.client(gateway)
    await watch(watcher, thread)
    viewers = [await harness.client(gateway) for _ in range(30)]
    await asyncio.gather(*(v.subscribe(thread, "live") for v in viewers))
    frames = [await next_frame(watcher, "joined", thread)]
    while frames[-1]["count"] < 31:
        frames.append(await next_frame(watcher, "joined", thread))
    await asyncio.gather(*(v.close() for v in viewers))
    frames.append(await next_frame(watcher, "left", thread))
    while frames[-1]["count"] > 1:
        frames.append(await next_frame(watcher, "left", thread))
    joins, leaves = frames_of(frames, "joined"), frames_of(frames, "left")
    assert sum(len(f["entries"]) for f in joins) == 30
    assert sum(len(f["entries"]) for f in leaves) == 30
    # Coalesced per interval: 60 changes in a few frames.
    assert len(frames) <= 6, [(f["type"], f["count"]) for f in frames]
    await asyncio.sleep(0.6)  # one more interval: nothing else comes
    await watcher.ping()
    assert not [f for f in watcher.pending if f["type"] in ("joined", "left")]


async def test_a_client_that_joins_and_leaves_within_an_interval_is_in_no_frame(
    harness: Harness,
) -> None:
    gateway = await harness.gateway(presence_interval=1.0, presence_ttl=3.0)
    thread = "blink"
    watcher = await harness.client(gateway)
    await watch(watcher, thread)
    blink = await harness.client(gateway)
    await blink.subscribe(thread, "live")
    await blink.request({"type": "unsubscribe", "thread": thread})
    stay = await harness.client(gateway)
    await stay.subscribe(thread, "live")
    joined = await next_frame(watcher, "joined", thread)
    assert joined["count"] == 2 and len(joined["entries"]) == 1
    await asyncio.sleep(1.2)
    await watcher.ping()
    assert not frames_of(list(watcher.pending), "left")


async def test_count_only_and_off(harness: Harness) -> None:
    counting = await harness.gateway(presence="count", **FAST)
    thread = "private"
    watcher = await harness.client(counting)
    first = await watch(watcher, thread, client={"name": "secret"})
    assert first == {"type": "presence", "thread": thread, "count": 1, "more": False,
                     "entries": [], "hidden": True}  # fmt: skip
    other = await harness.client(counting)
    await other.subscribe(thread, "live")
    changed = await next_frame(watcher, "presence", thread)
    assert changed["count"] == 2 and changed["entries"] == [] and changed["hidden"] is True
    reply = await presence(watcher, thread)
    assert reply["count"] == 2 and reply["entries"] == [] and reply["hidden"] is True

    off = await harness.gateway(store=harness.shared_store(counting), presence="off")
    viewer = await harness.client(off)
    assert await watch(viewer, thread) == {"type": "presence", "thread": thread, "off": True}
    refused = await viewer.request({"type": "presence", "thread": thread})
    assert refused["type"] == "error" and refused["code"] == "presence_off", refused
    await viewer.ping()
    # Nothing recorded for it: the counting gateway still sees two.
    assert (await presence(watcher, thread))["count"] == 2


@pytest.mark.parametrize(
    "client",
    [
        {"name": "x" * 300},
        {"nested": {"a": 1}},
        {"list": [1, 2]},
        {"": "empty key"},
        {"k" * 33: "long key"},
        "a string",
        [1, 2],
    ],
)
async def test_client_info_is_bounded(harness: Harness, client: Any) -> None:
    gateway = await harness.gateway(**FAST)
    hostile, fine = await harness.client(gateway), await harness.client(gateway)
    reply = await hostile.request(
        {"type": "subscribe", "thread": "t", "from": "live", "client": client}
    )
    assert reply["type"] == "error" and reply["code"] == "bad_command", reply
    assert "client" in reply["message"]
    assert (await hostile.request({"type": "auth", "token": "x", "client": client}))[
        "code"
    ] == "bad_command"
    await fine.subscribe("t", "live")
    assert (await until_count(hostile, "t", 1))["entries"][0]["subject"] == "anonymous"


async def test_presence_limits_and_bad_commands(harness: Harness) -> None:
    gateway = await harness.gateway(**FAST)
    viewers = [await harness.client(gateway) for _ in range(5)]
    for viewer in viewers:
        await viewer.subscribe("many", "live")
    asker = viewers[0]
    await until_count(asker, "many", 5)
    two = await presence(asker, "many", limit=2)
    assert two["count"] == 5 and len(two["entries"]) == 2 and two["more"] is True
    empty = await presence(asker, "nobody-here")
    assert empty["count"] == 0 and empty["entries"] == [] and empty["more"] is False
    for limit in (0, 1001, "5", True, 2.5):
        bad = await asker.request({"type": "presence", "thread": "many", "limit": limit})
        assert bad["type"] == "error" and bad["code"] == "bad_command", (limit, bad)
    bad = await asker.request({"type": "subscribe", "thread": "x", "presence": "yes"})
    assert bad["type"] == "error" and bad["code"] == "bad_command"


async def test_presence_polled_in_a_loop_is_paced(harness: Harness) -> None:
    gateway = await harness.gateway(max_commands_per_second=40, **FAST)
    poller, other = await harness.client(gateway), await harness.client(gateway)
    await other.subscribe("polled", "live")
    started = time.monotonic()
    replies = [await poller.request({"type": "presence", "thread": "polled"}) for _ in range(80)]
    elapsed = time.monotonic() - started
    # A burst of one second's worth (40), then 40 a second: about a second more.
    assert elapsed >= 0.8, elapsed
    assert all(r["type"] in ("presence", "error") for r in replies)
    assert [r for r in replies if r["type"] == "presence"], replies[-1]
    await other.ping()  # the others are served meanwhile


async def test_presence_needs_the_read_grant(harness: Harness) -> None:
    gateway = await harness.gateway(jwt_secret=SECRET, **FAST)
    grants = {"subscribe": ["mine/*"], "publish": []}
    token = encode_token(SECRET, "alice", extra={"agui": grants})
    alice = await harness.client(gateway, additional_headers={"Authorization": f"Bearer {token}"})
    refused = await alice.request({"type": "presence", "thread": "theirs/1"})
    assert refused["type"] == "error" and refused["code"] == "forbidden", refused
    seen = await watch(alice, "mine/1")
    assert [e["subject"] for e in seen["entries"]] == ["alice"]
    # A client map from auth is what later subscriptions announce.
    again = await alice.request({"type": "auth", "token": token, "client": {"device": "phone"}})
    assert again["type"] == "authenticated", again
    await alice.subscribe("mine/2", "live")
    [entry] = (await until_count(alice, "mine/2", 1))["entries"]
    assert entry["client"] == {"device": "phone"} and entry["subject"] == "alice"


async def test_a_draining_gateway_takes_its_viewers_out_at_once(
    redis_server: RedisServer,
) -> None:
    """Two gateways on one Redis (each with its own store object: a drain closes
    its store); the drained one's viewers leave at once, not when they expire."""
    prefix = new_prefix()
    harness = Harness(lambda retention=None: RedisStore(redis_server.url, prefix=prefix))
    try:
        config = {"presence_interval": 0.1, "presence_ttl": 60.0}
        first = await harness.gateway(**config)
        second = await harness.gateway(**config)
        watcher = await harness.client(first)
        await watch(watcher, "drained")
        for _ in range(3):
            await (await harness.client(second)).subscribe("drained", "live")
        joined = await next_frame(watcher, "joined", "drained")
        while joined["count"] < 4:
            joined = await next_frame(watcher, "joined", "drained")
        started = time.monotonic()
        await second.drain()
        left = await next_frame(watcher, "left", "drained")
        while left["count"] > 1:
            left = await next_frame(watcher, "left", "drained")
        assert time.monotonic() - started < 10  # not the 60 s of the ttl
    finally:
        await harness.close()


def test_the_tracker_forgets_connections_that_left_without_telling() -> None:
    """The refresh drops the entries of connections that are closed or no longer
    subscribed (a path that forgot to call leave() costs one refresh, no more)."""

    tracker = PresenceTracker(object())  # type: ignore[arg-type]
    conn: Any = Conn(is_open=False)
    tracker.join(conn, "t", "alice", None)
    assert tracker.entries == 1
    connection = tracker.connection_id(conn)
    tracker._refresh()
    assert tracker.entries == 0 and set(tracker._gone["t"]) == {connection}


# -- processes: a gateway SIGKILLed ---------------------------------------------------------


async def test_a_killed_gateways_viewers_leave_within_the_ttl(
    gateways: Gateways, redis_server: RedisServer
) -> None:
    """Two gateway processes on one Redis; the one with two viewers is SIGKILLed:
    its viewers leave the other's presence once their entries expire (the ttl,
    plus an interval); a viewer that reconnects to the survivor counts twice until
    then, once after."""
    store = f"{redis_server.url}?prefix={new_prefix()}"
    args = ("--presence-ttl", "2", "--presence-interval", "0.2")
    survivor = gateways.start(store, *args)
    doomed = gateways.start(store, *args)
    thread = "vigil"

    async def client(url: str) -> Client:
        return Client(await connect(url, subprotocols=[SUBPROTOCOL_JSON], open_timeout=WAIT))  # type: ignore[list-item]

    watcher = await client(survivor.url)
    await watch(watcher, thread)
    lost = [await client(doomed.url) for _ in range(2)]
    for viewer in lost:
        await viewer.subscribe(thread, "live", client={"name": "doomed"})
    await until_count(watcher, thread, 3)
    doomed.signal(signal.SIGKILL)
    assert await asyncio.to_thread(doomed.wait, WAIT) == -signal.SIGKILL
    killed = time.monotonic()
    moved = await client(survivor.url)  # one of them reconnects to the survivor
    await moved.subscribe(thread, "live")
    assert (await presence(watcher, thread))["count"] == 4  # the old entries are still there
    while True:
        left = await next_frame(watcher, "left", thread)
        if left["count"] == 2:
            break
    waited = time.monotonic() - killed
    assert 1.0 <= waited <= 2 + 0.2 + 2.0 * TIMEOUT_SCALE, waited
    names = {e.get("client", {}).get("name") for e in (await presence(watcher, thread))["entries"]}
    assert names == {None}  # the watcher and the reconnected viewer, once each
    for c in (watcher, moved, *lost):
        await c.close()


async def test_a_failed_write_is_written_later_without_bringing_back_who_left() -> None:
    """The store fails a write; meanwhile one connection leaves and another joins:
    the next write has the joins still there and nobody who left."""

    class Flaky(MemoryStore):
        fail = True

        async def presence_update(self, changes: Any, ttl: float) -> None:
            if self.fail:
                self.fail = False
                raise StoreUnavailable("down for a moment")
            await super().presence_update(changes, ttl)

    store = Flaky()
    tracker = PresenceTracker(store)
    stays, goes, late = Conn("t"), Conn("t"), Conn("t")
    tracker.join(stays, "t", "alice", None)
    tracker.join(goes, "t", "bob", None)
    with pytest.raises(StoreUnavailable):
        await tracker.flush()
    tracker.leave(goes, "t")
    tracker.join(late, "t", "carol", {"device": "phone"})
    await tracker.flush()
    [page] = await store.presence(["t"], 10)
    assert page is not None
    assert [e.subject for e in page.entries] == ["alice", "carol"]
    # Subscribing again keeps the connection's id.
    before = tracker.connection_id(stays)
    tracker.leave(stays, "t")
    tracker.join(stays, "t", "alice", None)
    assert tracker.connection_id(stays) == before


def test_a_closing_connection_leaves_its_own_threads_only() -> None:
    """The tracker indexes each connection's threads: a close leaves those (and
    no other connection's); a thread left earlier leaves no trace."""

    tracker = PresenceTracker(MemoryStore())
    crowd = [Conn() for _ in range(50)]
    for i, conn in enumerate(crowd):
        tracker.join(conn, f"t{i}", "someone", None)
    mine: Any = Conn()
    for thread in ("a", "b"):
        tracker.join(mine, thread, "me", None)
    tracker.watch(mine, "a")
    tracker.leave(mine, "b")
    assert tracker._threads[mine] == {"a"}
    tracker.leave_all(mine)
    assert mine not in tracker._threads and mine not in tracker._ids
    assert "a" not in tracker._watched and tracker.entries == 50


async def test_a_storm_of_new_watchers_is_read_once_per_interval(harness: Harness) -> None:
    """Watchers arriving one after another: each first frame lists its own entry,
    and the watcher already there gets a few joined frames, not one per arrival."""
    gateway = await harness.gateway(presence_interval=0.5, presence_ttl=3.0)
    thread = "arrivals"
    first = await harness.client(gateway)
    await watch(first, thread)
    reads = gateway.presence.reads
    started = time.monotonic()
    arrivals = [await harness.client(gateway) for _ in range(20)]
    for arrival in arrivals:
        await arrival.subscribe(thread, "live", presence=True)
        await asyncio.sleep(0.03)
    for arrival in arrivals:
        listing = await next_frame(arrival, "presence", thread)
        assert listing["connection"] in {e["connection"] for e in listing["entries"]}
    frames = [await next_frame(first, "joined", thread)]
    while frames[-1]["count"] < 21:
        frames.append(await next_frame(first, "joined", thread))
    assert sum(len(f["entries"]) for f in frames) == 20
    assert len(frames) <= 4, [f["count"] for f in frames]
    polls = gateway.presence.reads - reads
    assert polls <= (time.monotonic() - started) / 0.5 + 2, polls


async def test_a_count_only_gateway_writes_no_subject_or_client(harness: Harness) -> None:
    """Its viewers' names stay private from the other gateways of the store too."""
    counting = await harness.gateway(presence="count", **FAST)
    full = await harness.gateway(store=harness.shared_store(counting), **FAST)
    private = await harness.client(counting)
    await private.subscribe("shared", "live", client={"name": "secret"})
    reader = await harness.client(full)
    await reader.subscribe("shared", "live")
    entries = (await until_count(reader, "shared", 2))["entries"]
    theirs = [e for e in entries if not e["connection"].startswith(full.presence.gateway_id)]
    assert theirs == [{"connection": theirs[0]["connection"], "subject": "hidden",
                       "joined": theirs[0]["joined"]}]  # fmt: skip


def test_an_auth_renames_the_connections_entries() -> None:
    for mode, subject in [(PresenceMode.FULL, "alice"), (PresenceMode.COUNT, "hidden")]:
        tracker = PresenceTracker(MemoryStore(), mode=mode)
        conn: Any = Conn()
        tracker.join(conn, "t1", "anonymous", {"device": "phone"})
        tracker.join(conn, "t2", "anonymous", None)
        tracker._put.clear()
        tracker.resubject(conn, "alice")
        renamed = {t: [e.subject for e in entries.values()] for t, entries in tracker._put.items()}
        if mode is PresenceMode.FULL:
            assert renamed == {"t1": [subject], "t2": [subject]}
            assert tracker._local["t1"][conn].client == {"device": "phone"}
        else:
            assert renamed == {}  # a count-only gateway writes no subject at all


async def test_an_idle_tracker_sleeps_between_intervals() -> None:
    """Nothing joined, nothing watched: the loop wakes once per interval (or per
    refresh), not as fast as it can."""
    tracker = PresenceTracker(MemoryStore(), interval=0.5, ttl=30.0)
    turns = 0
    flush = tracker.flush

    async def counted() -> None:
        nonlocal turns
        turns += 1
        await flush()

    tracker.flush = counted  # type: ignore[method-assign]
    task = asyncio.create_task(tracker.run())
    await asyncio.sleep(1.6)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert 2 <= turns <= 5, turns
