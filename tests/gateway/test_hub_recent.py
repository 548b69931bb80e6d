"""A channel's latest entries in memory (agui_hub.gateway.fanout.channels): resumes and catch-ups
served without store reads, within the channel's bounds and the hub's budget,
and falling back to the store whenever memory does not hold all they need."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agui_hub.gateway.fanout import channels as hub_module
from agui_hub.gateway.fanout import recent as recent_module
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.codec import Encoding
from agui_hub.wire.protocol import CloseCode, Position, StartKind

pytestmark = pytest.mark.timeout(60)


class Viewer:
    """A subscriber that keeps every frame; its queue holds *room* frames at a time
    until the test empties it (``room=None``: never full)."""

    encoding = Encoding.JSON

    def __init__(self, room: int | None = None) -> None:
        self.frames: list[dict[str, Any]] = []
        self.closed: CloseCode | None = None
        self.room = room
        self.queued = 0
        self._drained = asyncio.Event()
        self._drained.set()

    @property
    def is_open(self) -> bool:
        return self.closed is None

    def send(self, frame: bytes | str) -> bool:
        self.frames.append(json.loads(frame))
        if self.room is None:
            return True
        self.queued += 1
        if self.queued >= self.room:
            self._drained.clear()
            return False
        return True

    def empty(self) -> None:
        self.queued = 0
        self._drained.set()

    async def drained(self) -> None:
        await self._drained.wait()

    def has_room(self) -> bool:
        return self.room is None or self.queued < self.room

    def close_soon(self, code: CloseCode, reason: str) -> None:
        self.closed = code

    def offsets(self) -> list[str]:
        return [f["offset"] for f in self.frames if f["type"] == "event"]


class CountingStore(MemoryStore):
    """A memory store that counts the history reads the hub makes."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read_available(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        return await super().read_available(*args, **kwargs)


def deltas(start: int, count: int) -> list[dict[str, Any]]:
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"{i} "}
        for i in range(start, start + count)
    ]


OPENING = [
    {"type": "RUN_STARTED", "threadId": "t", "runId": "r1"},
    {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
]


async def live_hub(store: MemoryStore, **kwargs: Any) -> tuple[hub_module.Hub, Viewer]:
    """A hub whose channel for "t" is live (one viewer from now on)."""
    hub = hub_module.Hub(store, **kwargs)
    keeper = Viewer()
    await hub.subscribe(keeper, "t", 0, StartKind.LIVE, None)
    return hub, keeper


async def until(predicate: Any, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_resume_storm_reads_nothing_from_the_store() -> None:
    store = CountingStore()
    hub, _ = await live_hub(store)
    stored = await hub.publish("t", OPENING)
    stored += await hub.publish("t", deltas(0, 500))
    await until(lambda: hub.channels["t"].cursor == stored[-1], "the channel to relay")
    reads = store.reads
    viewers = [Viewer() for _ in range(300)]
    for n, viewer in enumerate(viewers):
        at = stored[n % 10]  # each up to 500 events behind
        await hub.subscribe(viewer, "t", n, Position(at, hub.channels["t"].epoch), None)
    for n, viewer in enumerate(viewers):
        assert viewer.frames[0]["type"] == "subscribed" and viewer.frames[0]["recovered"]
        assert viewer.offsets() == stored[n % 10 + 1 :], n
    assert store.reads == reads  # all from memory
    await hub.close()


async def test_a_slow_viewer_catches_up_from_memory_in_order() -> None:
    store = CountingStore()
    hub, _ = await live_hub(store)
    stored = await hub.publish("t", OPENING)
    await until(lambda: hub.channels["t"].cursor == stored[-1], "the channel to relay")
    slow = Viewer(room=20)
    await hub.subscribe(slow, "t", 1, StartKind.LIVE, None)
    stored += await hub.publish("t", deltas(0, 200))  # fills its queue: it catches up
    reads = store.reads
    for _ in range(100):
        slow.empty()
        await asyncio.sleep(0.005)
        if slow.offsets() == stored[2:]:
            break
    assert slow.offsets() == stored[2:]
    assert store.reads == reads
    await hub.close()


async def test_what_memory_no_longer_holds_comes_from_the_store() -> None:
    store = CountingStore()
    hub, _ = await live_hub(store)
    stored = await hub.publish("t", OPENING)
    for i in range(0, recent_module.RECENT_ENTRIES + 200, 100):
        stored += await hub.publish("t", deltas(i, 100))
    channel = hub.channels["t"]
    await until(lambda: channel.cursor == stored[-1], "the channel to relay")
    assert len(channel._recent) == recent_module.RECENT_ENTRIES
    reads = store.reads
    viewer = Viewer()
    await hub.subscribe(viewer, "t", 1, Position(stored[0], channel.epoch), None)
    await until(lambda: viewer.offsets() == stored[1:], "the whole history")
    assert store.reads > reads  # the oldest part was read
    await hub.close()


async def test_memory_is_bounded_per_channel_and_by_the_hub_budget() -> None:
    store = MemoryStore()
    budget = 40 * 1024
    hub = hub_module.Hub(store, recent_budget=budget)
    keepers = []
    for t in ("a", "b", "c"):
        keeper = Viewer()
        keepers.append(keeper)
        await hub.subscribe(keeper, t, 0, StartKind.LIVE, None)
    big = "x" * 2000
    for t in ("a", "b", "c"):
        await hub.publish(t, [{"type": "RUN_STARTED", "threadId": t, "runId": "r"}])
        for i in range(0, 60, 20):
            await hub.publish(
                t,
                [{"type": "CUSTOM", "name": "n", "value": f"{i + j}{big}"} for j in range(20)],
            )
    await until(lambda: all(len(k.offsets()) == 61 for k in keepers), "every event relayed")
    total = sum(c._recent.size for c in hub.channels.values())
    assert hub.recent_bytes == total
    assert budget - 3000 <= total <= budget + 3000  # full, and within about one entry
    for t in list(hub.channels):
        for keeper in keepers:
            hub.unsubscribe(keeper, t)
    await until(lambda: not hub.channels, "the channels to close")
    await asyncio.sleep(0.05)
    assert hub.recent_bytes == 0  # closed channels give their bytes back
    await hub.close()


async def test_a_restarted_hub_serves_resumes_from_what_it_loaded() -> None:
    """After a restart the channel's load reads the thread: its tail stays in
    memory, so the viewers resuming right then are not one read each."""
    store = CountingStore()
    first = hub_module.Hub(store)
    stored = await first.publish("t", OPENING)
    stored += await first.publish("t", deltas(0, 300))
    await first.close()
    hub = hub_module.Hub(store)
    opener = Viewer()
    epoch = await store.epoch("t")
    await hub.subscribe(opener, "t", 0, Position(stored[100], epoch), None)
    reads = store.reads
    viewers = [Viewer() for _ in range(50)]
    for n, viewer in enumerate(viewers):
        await hub.subscribe(viewer, "t", n, Position(stored[n], epoch), None)
        assert viewer.offsets() == stored[n + 1 :]
    assert store.reads == reads
    await hub.close()


async def test_a_reset_forgets_the_old_epoch_entries() -> None:
    store = MemoryStore()
    hub, _ = await live_hub(store)
    stored = await hub.publish("t", OPENING)
    stored += await hub.publish("t", deltas(0, 10))
    channel = hub.channels["t"]
    await until(lambda: channel.cursor == stored[-1], "the channel to relay")
    old_epoch = channel.epoch
    await store.delete("t")
    again = await hub.publish("t", OPENING)
    await until(lambda: channel.epoch not in (None, old_epoch), "the reset")
    await until(lambda: channel.cursor == again[-1], "the new epoch relayed")
    kept = list(channel._recent.entries)
    assert [e.offset for e in kept] == [e.offset for e in await store.read("t")]
    assert hub.recent_bytes == channel._recent.size
    # A resume with the old epoch's offset is not served from memory as if it were this one.
    viewer = Viewer()
    await hub.subscribe(viewer, "t", 1, Position(stored[5], old_epoch), None)
    assert viewer.frames[0]["recovered"] is False
    await hub.close()
