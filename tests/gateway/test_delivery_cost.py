"""What delivering one event costs a channel does not grow with the thread's open items.

A channel folds every event it relays and, now and then, writes a
checkpoint of the whole folded state. These tests count the work instead of
timing it: the Python bytecode instructions a channel runs to deliver each
event (``sys.settrace`` with opcode events, around ``ThreadChannel._deliver``:
the fold, the frame, the latest entries, the checkpoint's compact) and the
bytes of checkpoints it encodes, in a thread with one open message and in
one with 10,000 open messages and 5,000 open tool calls. A scan of the open
items on that path, or a checkpoint of the whole state every thousand
events, makes the second count grow with them; timings would only make the
test flaky on a shared machine.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from agui_hub.gateway.fanout import channels as hub_module
from agui_hub.gateway.fanout import checkpoints as checkpoints_module
from agui_hub.store.contract import Entry, EventInput, Retention
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.codec import Encoding
from agui_hub.wire.protocol import CloseCode, StartKind

from ..conftest import TIMEOUT_SCALE

pytestmark = pytest.mark.timeout(120)

OPEN_MESSAGES = 10_000
WARM_UP = 1_200
"""Events delivered before counting: past the first checkpoint after the load."""
COUNTED = 3_000


class Counter:
    """A subscriber that keeps nothing: only how many frames it got."""

    encoding = Encoding.MSGPACK

    def __init__(self) -> None:
        self.frames = 0

    @property
    def is_open(self) -> bool:
        return True

    def send(self, frame: bytes | str) -> bool:
        self.frames += 1
        return True

    async def drained(self) -> None:
        return None

    def has_room(self) -> bool:
        return True

    def close_soon(self, code: CloseCode, reason: str) -> None:
        raise AssertionError(f"closed with {code}: {reason}")


class Work:
    """What the channels of one test did: the opcodes run inside
    ``ThreadChannel._deliver`` while :attr:`counting`, the bytes delivered, and
    each checkpoint encoded."""

    def __init__(self) -> None:
        self.counting = False
        self.opcodes = 0
        self.events = 0
        self.delivered_bytes = 0
        self.checkpoint_bytes = 0
        self.since = 0
        self.checkpoints: list[tuple[int, int]] = []
        """(bytes of a checkpoint, bytes delivered since the one before)"""

    def tracer(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        if event == "opcode":
            self.opcodes += 1
        return self.tracer


def instrument(monkeypatch: pytest.MonkeyPatch) -> Work:
    """Count the work of the channels from now on (see :class:`Work`)."""
    work = Work()
    deliver_one = hub_module.ThreadChannel._deliver

    def counted_deliver(channel: hub_module.ThreadChannel, entry: Entry) -> None:
        work.since += len(entry.data)
        if not work.counting:
            deliver_one(channel, entry)
            return
        work.events += 1
        work.delivered_bytes += len(entry.data)
        previous = sys.gettrace()
        sys.settrace(work.tracer)
        try:
            deliver_one(channel, entry)
        finally:
            sys.settrace(previous)

    encode = checkpoints_module.encode_msgpack

    def counted_encode(value: Any) -> bytes:
        encoded = encode(value)  # a checkpoint, taken while a channel delivers an entry
        work.checkpoints.append((len(encoded), work.since))
        work.since = 0
        if work.counting:
            work.checkpoint_bytes += len(encoded)
        return encoded

    monkeypatch.setattr(hub_module.ThreadChannel, "_deliver", counted_deliver)
    monkeypatch.setattr(checkpoints_module, "encode_msgpack", counted_encode)
    return work


def open_items(count: int) -> list[dict[str, Any]]:
    """A run with *count* open messages and one open tool call for every other one."""
    events: list[dict[str, Any]] = [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}]
    for i in range(count):
        events.append({"type": "TEXT_MESSAGE_START", "messageId": f"m{i}", "role": "assistant"})
        if i % 2 == 0:
            events.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": f"c{i}",
                    "toolCallName": "search",
                    "parentMessageId": f"m{i}",
                }
            )
    return events


async def append(store: MemoryStore, events: list[dict[str, Any]]) -> None:
    for i in range(0, len(events), 500):
        await store.append("t", [EventInput.of(e) for e in events[i : i + 500]])


async def deliver(hub: hub_module.Hub, viewer: Counter, events: list[dict[str, Any]]) -> None:
    """Store *events* and wait until the viewer got them all."""
    expected = viewer.frames + len(events)
    for i in range(0, len(events), 100):
        await hub.store.append("t", [EventInput.of(e) for e in events[i : i + 100]])
        await asyncio.sleep(0)
    deadline = asyncio.get_running_loop().time() + 10 * TIMEOUT_SCALE
    while viewer.frames < expected and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.005)
    if viewer.frames >= expected:
        return
    raise AssertionError(f"the viewer got {viewer.frames} frames of {expected}")


async def delivery_work(open_count: int, monkeypatch: pytest.MonkeyPatch) -> Work:
    """The work of delivering :data:`COUNTED` events, after a warm-up, in a thread
    with *open_count* open messages (and half as many open tool calls)."""
    store = MemoryStore()
    await append(store, open_items(max(open_count, 1)))
    work = instrument(monkeypatch)
    hub = hub_module.Hub(store)
    viewer = Counter()
    try:
        await hub.subscribe(viewer, "t", 1, StartKind.LIVE, None)
        # The same events in both threads: deltas to one message, and args to one call.
        stream = [
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m0", "delta": f"token {i} "}
            if i % 3
            else {"type": "TOOL_CALL_ARGS", "toolCallId": "c0", "delta": f'"{i}",'}
            for i in range(WARM_UP + COUNTED)
        ]
        await deliver(hub, viewer, stream[:WARM_UP])
        work.counting = True
        await deliver(hub, viewer, stream[WARM_UP:])
        work.counting = False
    finally:
        await hub.close()
    assert work.events == COUNTED
    return work


async def test_delivering_an_event_costs_the_same_with_ten_thousand_open_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    few = await delivery_work(0, monkeypatch)
    monkeypatch.undo()
    many = await delivery_work(OPEN_MESSAGES, monkeypatch)

    few_per_event = few.opcodes / few.events
    many_per_event = many.opcodes / many.events
    assert few_per_event > 50, "the count saw nothing of the delivery"
    # A scan of the 15,000 open items anywhere on the path, even once every
    # thousand events, adds hundreds of instructions per event.
    assert many_per_event <= few_per_event * 1.1, (
        f"{many_per_event:.0f} instructions per event with {OPEN_MESSAGES} open messages, "
        f"{few_per_event:.0f} with one"
    )
    # Checkpoints are paid for by what is delivered: the bytes encoded for them
    # never outweigh the bytes of the events since the last one.
    for work in (few, many):
        assert work.checkpoint_bytes <= work.delivered_bytes, (
            f"{work.checkpoint_bytes} bytes of checkpoints for "
            f"{work.delivered_bytes} bytes delivered"
        )


async def checkpoints_of(
    store: MemoryStore, events: int, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[int, int]]:
    """Deliver *events* small events to a viewer of a thread of 500 open messages
    in *store*; the checkpoints its channel took."""
    await append(store, open_items(500))
    work = instrument(monkeypatch)
    hub = hub_module.Hub(store)
    viewer = Counter()
    try:
        await hub.subscribe(viewer, "t", 1, StartKind.LIVE, None)
        stream = [
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m0", "delta": f"token {i} "}
            for i in range(events)
        ]
        await deliver(hub, viewer, stream)
    finally:
        await hub.close()
    return work.checkpoints


async def test_a_checkpoint_waits_until_the_events_since_the_last_outweigh_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checkpoints = await checkpoints_of(MemoryStore(), 12_000, monkeypatch)
    # The first after the load (which found no checkpoint) comes after 1000
    # events; each later one as soon as the events since the one before
    # weigh as much as it did.
    assert len(checkpoints) >= 3, checkpoints
    first_size, first_since = checkpoints[0]
    assert first_since < first_size, "the first one waited for a size it could not know"
    for (previous, _), (_, since) in itertools.pairwise(checkpoints):
        assert previous <= since <= previous + 64, checkpoints  # 64: more than one event


async def test_retention_still_gets_a_checkpoint_every_half_of_what_it_keeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each checkpoint weighs more than the events between two of them:
    # retention by length still gets one every max_len / 2 events.
    store = MemoryStore(retention=Retention(max_len=400))
    checkpoints = await checkpoints_of(store, 1_000, monkeypatch)
    assert len(checkpoints) == 1_000 // 200, checkpoints
    assert all(size > since for size, since in checkpoints), checkpoints
