"""The fan-out core (agui_hub.gateway.fanout.channels) with an in-memory subscriber: no sockets."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agui_hub.agui.reducer import fold
from agui_hub.gateway.fanout import channels as hub_module
from agui_hub.store.contract import EventInput, Retention
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.codec import Encoding
from agui_hub.wire.protocol import CloseCode, Position, StartKind

pytestmark = pytest.mark.timeout(60)


class Viewer:
    """A subscriber that keeps every frame (JSON) and never overflows."""

    encoding = Encoding.JSON

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.closed: CloseCode | None = None

    @property
    def is_open(self) -> bool:
        return self.closed is None

    def send(self, frame: bytes | str) -> bool:
        self.frames.append(json.loads(frame))
        return True

    async def drained(self) -> None:
        return None

    def has_room(self) -> bool:
        return True

    def close_soon(self, code: CloseCode, reason: str) -> None:
        self.closed = code

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]


def run_events(n_deltas: int) -> list[dict[str, Any]]:
    return [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"{i} "}
          for i in range(n_deltas)),
        {"type": "STATE_SNAPSHOT", "snapshot": {"done": True}},
    ]  # fmt: skip


async def publish_all(hub: hub_module.Hub, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 100):
        await hub.publish("t", events[i : i + 100])
        await asyncio.sleep(0)  # as between two frames from the network


async def settled(hub: hub_module.Hub) -> None:
    """Wait until every channel relayed all it stored and no member is catching up."""
    for _ in range(500):
        heads = [await hub.store.last_offset(t) for t in hub.channels]
        cursors = [c.cursor for c in hub.channels.values()]
        if hub.stats()["catching_up"] == 0 and heads == cursors:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("members still catching up")


async def publish_while_live(store: MemoryStore, events: list[dict[str, Any]]) -> None:
    """Publish *events* through a hub where the thread is live (so it checkpoints)."""
    first = hub_module.Hub(store)
    await first.subscribe(Viewer(), "t", 1, StartKind.LIVE, None)
    await publish_all(first, events)
    await asyncio.sleep(0.05)  # let the checkpoint task run
    await first.close()


async def late_snapshot(store: MemoryStore) -> dict[str, Any]:
    """The snapshot a viewer of another process (a new hub) gets for the thread."""
    second = hub_module.Hub(store)
    late = Viewer()
    await second.subscribe(late, "t", 1, StartKind.SNAPSHOT, None)
    await second.close()
    (snapshot,) = late.of_type("snapshot")
    return snapshot


async def test_a_new_process_folds_a_trimmed_thread_from_the_checkpoint() -> None:
    # Checkpoints come every max_len / 2 events, so trimming never outruns them.
    store = MemoryStore(retention=Retention(max_len=150))
    events = run_events(600)
    await publish_while_live(store, events)
    assert await store.get_checkpoint("t") is not None

    # Another process starts after most of the thread was trimmed away.
    snapshot = await late_snapshot(store)
    assert snapshot["complete"] is True
    assert fold(snapshot["events"]) == fold(events)


async def test_checkpoints_keep_up_with_retention_by_bytes() -> None:
    # Trimmed by bytes, not length: checkpoints come every max_bytes / 2 bytes.
    store = MemoryStore(retention=Retention(max_len=0, max_bytes=8_000))
    events = run_events(1200)  # ~40 bytes each: the store keeps ~200 of them
    await publish_while_live(store, events)
    info = await store.info("t")
    assert info is not None and info.length < 400  # most of the thread was trimmed

    snapshot = await late_snapshot(store)
    assert snapshot["complete"] is True
    assert fold(snapshot["events"]) == fold(events)


async def test_without_a_checkpoint_a_trimmed_thread_gives_an_incomplete_snapshot() -> None:
    store = MemoryStore(retention=Retention(max_len=50))
    events = run_events(300)
    hub = hub_module.Hub(store)
    await publish_all(hub, events)  # nobody subscribed: no checkpoint written
    viewer = Viewer()
    await hub.subscribe(viewer, "t", 1, StartKind.START, None)
    subscribed, snapshot = viewer.frames[:2]
    assert subscribed["type"] == "subscribed" and subscribed["recovered"] is False
    assert snapshot["type"] == "snapshot" and snapshot["complete"] is False
    await hub.close()


async def test_history_then_live_without_gap_or_duplicate() -> None:
    store = MemoryStore()
    hub = hub_module.Hub(store)
    events = run_events(2000)
    await publish_all(hub, events[:1000])
    viewer = Viewer()
    publishing = asyncio.create_task(publish_all(hub, events[1000:]))
    await hub.subscribe(viewer, "t", 1, StartKind.START, None)
    await publishing
    await settled(hub)
    got = [f["event"] for f in viewer.of_type("event")]
    assert got == events
    offsets = [f["offset"] for f in viewer.of_type("event")]
    assert offsets == [e.offset for e in await store.read("t")]
    await hub.close()


async def test_a_client_ahead_of_the_channel_misses_nothing_the_channel_relays_meanwhile() -> None:
    # A client resumes here with an offset another gateway showed it, ahead of
    # this channel's cursor. While the hub asks the store whether that offset
    # exists, the channel relays past it: the events in between must still
    # reach the client (they come from the store).
    class Racing(MemoryStore):
        racing = False

        async def last_offset(self, thread: str) -> str:
            head = await super().last_offset(thread)
            if self.racing:
                self.racing = False
                more = [
                    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": f"late {i}"}
                    for i in range(3)
                ]
                await hub.publish("t", more)
                for _ in range(20):
                    await asyncio.sleep(0)  # the channel relays them before we answer
            return head

    store = Racing()
    hub = hub_module.Hub(store)
    keeper = Viewer()
    await hub.subscribe(keeper, "t", 1, StartKind.LIVE, None)
    await publish_all(hub, run_events(5))
    await settled(hub)
    # Another gateway saw two more events than this channel relayed so far.
    ahead = [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x"}] * 2
    stored = await store.append("t", [EventInput.of(e) for e in ahead])
    # The client has those two; the channel has not relayed them yet.
    store.racing = True
    viewer = Viewer()
    epoch = await store.epoch("t")
    await hub.subscribe(viewer, "t", 2, Position(stored[-1], epoch), None)
    await settled(hub)
    got = [f["offset"] for f in viewer.of_type("event")]
    after = [e.offset for e in await store.read("t", after=stored[-1])]
    assert len(after) == 3
    assert got == after  # the three late events, once each, in order
    await hub.close()


class Full(Viewer):
    """A viewer whose queue is over its bound: every send says so."""

    def send(self, frame: bytes | str) -> bool:
        super().send(frame)
        return False

    def has_room(self) -> bool:
        return False


async def test_a_reset_sends_the_snapshot_even_to_a_full_queue() -> None:
    store = MemoryStore()
    hub = hub_module.Hub(store)
    await publish_all(hub, run_events(3))
    viewer = Full()
    await hub.subscribe(viewer, "t", 1, StartKind.SNAPSHOT, None)
    await settled(hub)
    await store.delete("t")
    await hub.publish("t", [{"type": "RUN_STARTED", "threadId": "t", "runId": "r2"}])
    for _ in range(200):
        if len(viewer.of_type("snapshot")) == 2:
            break
        await asyncio.sleep(0.01)
    kinds = [f["type"] for f in viewer.frames]
    resync = len(kinds) - 1 - kinds[::-1].index("subscribed")
    assert viewer.frames[resync]["recovered"] is False
    assert kinds[resync + 1] == "snapshot"  # never a resync without its snapshot
    await hub.close()


async def test_an_expired_thread_is_noticed_by_the_next_join() -> None:
    # Expiry announces nothing: the join that reads another epoch makes the
    # channel reload instead of waiting for a reset that never comes.
    # (A join served from the channel's latest entries in memory reads nothing:
    # no memory here, so that this join reads.)
    now = [1000.0]
    store = MemoryStore(retention=Retention(ttl=60), clock=lambda: now[0])
    hub = hub_module.Hub(store, recent_budget=0)
    await publish_all(hub, run_events(3))
    keeper = Viewer()
    await hub.subscribe(keeper, "t", 1, StartKind.LIVE, None)
    old_epoch = hub.channels["t"].epoch
    now[0] += 120  # expired
    late = Viewer()
    await asyncio.wait_for(hub.subscribe(late, "t", 2, StartKind.START, None), 5)
    (reply,) = late.of_type("subscribed")
    assert (reply["epoch"], reply["offset"], reply["recovered"]) == (None, "0-0", True)
    resync = keeper.of_type("subscribed")[-1]
    assert resync["recovered"] is False and resync["epoch"] != old_epoch
    await hub.close()


async def test_binary_values_are_relayed_but_not_folded() -> None:
    store = MemoryStore()
    hub = hub_module.Hub(store)
    await publish_all(hub, run_events(2))
    keeper = Viewer()
    await hub.subscribe(keeper, "t", 1, StartKind.LIVE, None)
    # A plain-XADD producer's event with a msgpack binary value.
    await store.append("t", [EventInput.of({"type": "STATE_SNAPSHOT", "snapshot": {"a": b"x"}})])
    await hub.publish("t", [{"type": "STATE_SNAPSHOT", "snapshot": {"b": 1}}])
    await settled(hub)
    late = Viewer()  # JSON: the snapshot must still encode
    await hub.subscribe(late, "t", 2, StartKind.SNAPSHOT, None)
    (snapshot,) = late.of_type("snapshot")
    assert snapshot["complete"] is False
    assert fold(snapshot["events"]).state == {"b": 1}
    assert keeper.closed is None and len(keeper.of_type("event")) == 1  # JSON skips the bytes
    await hub.close()
