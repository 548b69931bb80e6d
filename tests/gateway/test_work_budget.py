"""No publish stalls the gateway: the work budget per publish and per connection.

Over real WebSocket connections to an in-process gateway, on the memory
store and on Redis: the heaviest publishes the limits allow (state deltas
that copy and remove the largest value one publish may walk) and the issue's
attack (300 such deltas, refused at the budget) are judged by the writer and
folded by a viewer's channel, while another client, in a thread of its own,
pings the gateway every 5 ms and times every pong.
"""

# ruff: noqa: F811 (fixtures imported from test_server, taken as test arguments)

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from websockets.sync.client import connect as sync_connect

from agui_hub.agui.patch import WorkBudget
from agui_hub.errors import LimitExceeded
from agui_hub.gateway.commands import ThreadWorkRates
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store.contract import ThreadStore
from agui_hub.wire.offsets import START

from ..conftest import TIMEOUT_SCALE

# The gateway harness fixtures of test_server (memory and Redis): imported, so that
# tests here take them as arguments (which linters read as redefinitions).
from .test_server import (  # noqa: F401
    JSON,
    WAIT,
    Client,
    Harness,
    harness,
    store_factory,
    url,
)

pytestmark = pytest.mark.timeout(120)

PONG_WITHIN = 0.5
"""Longest a ping may wait for its pong while a publish is judged (not scaled:
it is what the gateway promises, docs/security.md)."""


class Pinger:
    """Pings the gateway every 5 ms from a thread of its own, with its own
    connection: each pong's wait is how long the gateway's loop kept it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.waits: list[float] = []
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with sync_connect(self.address, subprotocols=[JSON], proxy=None) as ws:  # type: ignore[list-item]
                for n in range(100_000):
                    if self.stop.is_set():
                        return
                    sent = time.perf_counter()
                    ws.send(json.dumps({"type": "ping", "id": f"p{n}"}))
                    while json.loads(ws.recv(WAIT)).get("id") != f"p{n}":
                        pass
                    self.waits.append(time.perf_counter() - sent)
                    time.sleep(0.005)
        except BaseException as exc:  # reported by finish()
            self.failure = exc

    def __enter__(self) -> Pinger:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(WAIT)

    def longest(self) -> float:
        assert self.failure is None, self.failure
        assert len(self.waits) >= 10, "the pinger hardly ran"
        return max(self.waits)


def walk_units(entries: int) -> int:
    """Work units of measuring an object of *entries* string entries (two each, four
    for the object)."""
    return 4 + 2 * entries


def copy_remove(count: int) -> list[dict[str, Any]]:
    ops = [{"op": "copy", "from": "/s", "path": "/t"}, {"op": "remove", "path": "/t"}]
    return [{"type": "STATE_DELTA", "delta": ops} for _ in range(count)]


async def published(client: Client, thread: str, events: list[dict[str, Any]]) -> dict[str, Any]:
    return await client.request(
        {"type": "publish", "thread": thread, "events": events}, timeout=WAIT * 3
    )


async def test_a_ping_is_answered_while_the_heaviest_publish_is_judged(harness: Harness) -> None:
    gateway = await harness.gateway()
    max_work = gateway.hub.limits.max_work
    # The largest value one publish may copy and then remove: both walks fit
    # its budget (with room for the root's copy), so the publish is accepted,
    # and a second copy of it would not be.
    entries = (max_work // 2 - 64) // 2
    assert 2 * walk_units(entries) < max_work < 3 * walk_units(entries)
    thread = "budget-heaviest"
    publisher = await harness.client(gateway)
    viewer = await harness.client(gateway)
    assert (await viewer.request({"type": "subscribe", "thread": thread}))["type"] == "subscribed"
    big = {f"k{i:05d}": "x" * 40 for i in range(entries)}  # within max_event_bytes
    reply = await published(
        publisher,
        thread,
        [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "r"},
            {"type": "STATE_SNAPSHOT", "snapshot": {"s": big}},
        ],
    )
    assert reply["type"] == "published", reply
    with Pinger(url(gateway)) as pinger:
        started = time.monotonic()
        rounds = 0
        while rounds < 3 or time.monotonic() - started < 1.0:
            # The heaviest publish the budget allows (stored, and folded by the
            # viewer's channel) ...
            reply = await published(publisher, thread, copy_remove(1))
            assert reply["type"] == "published", reply
            # ... and the attack, refused at the budget.
            reply = await published(publisher, thread, copy_remove(300))
            assert (reply["type"], reply.get("code"), reply.get("index")) == (
                "error",
                "limit_exceeded",
                1,
            ), reply
            assert "max_work" in reply["message"]
            rounds += 1
            if rounds >= 40:
                break
    longest = pinger.longest()
    assert longest < PONG_WITHIN, f"a ping waited {longest:.3f} s"
    # The viewer got what was stored, nothing of what was refused, and its
    # channel folded it all.
    deltas = 0

    def last_delta(frame: dict[str, Any]) -> bool:
        nonlocal deltas
        if frame.get("type") == "event" and frame["event"]["type"] == "STATE_DELTA":
            deltas += 1
        return deltas == rounds

    await viewer.collect(last_delta, timeout=WAIT)
    channel = gateway.hub.channels[thread]
    assert channel.complete
    state = channel.state.state
    assert list(state) == ["s"] and len(state["s"]) == entries


async def test_a_connection_over_its_work_rate_is_paced(
    store_factory: Callable[..., ThreadStore],
) -> None:
    gateways = Harness(store_factory)
    try:
        rate = 100_000.0
        gateway = await gateways.gateway(max_state_work_per_second=rate, state_max_work=50_000)
        thread = "budget-paced"
        publisher = await gateways.client(gateway)
        entries = 10_000  # one copy walks ~20,000 units, the remove as many
        big = {f"k{i:05d}": "x" * 9 for i in range(entries)}
        reply = await published(
            publisher,
            thread,
            [
                {"type": "RUN_STARTED", "threadId": thread, "runId": "r"},
                {"type": "STATE_SNAPSHOT", "snapshot": {"s": big}},
            ],
        )
        assert reply["type"] == "published", reply
        count = 8  # ~320,000 units: the first 100,000 are the burst, the rest 2.2 s
        started = time.monotonic()
        for _ in range(count):
            reply = await published(publisher, thread, copy_remove(1))
            assert reply["type"] == "published", reply
        elapsed = time.monotonic() - started
        spent = count * 2 * walk_units(entries)
        assert elapsed >= (spent - rate - 2 * walk_units(entries)) / rate * 0.9, elapsed
        # Another connection is not paced for it.
        other = await gateways.client(gateway)
        started = time.monotonic()
        reply = await published(other, thread, copy_remove(1))
        assert reply["type"] == "published", reply
        assert time.monotonic() - started < 0.5 * TIMEOUT_SCALE
    finally:
        await gateways.close()


async def test_grouped_publishes_have_a_budget_each(
    store_factory: Callable[..., ThreadStore],
) -> None:
    """Publishes stored together in one group commit are judged with their own
    budgets, not one shared between them."""
    store = store_factory()
    writer = ThreadWriter(store)
    max_work = writer.limits.max_work
    thread = "budget-group"
    entries = max_work // 2 // 2 - 100  # one copy + remove: ~100% of a budget
    big = {f"k{i:05d}": "x" for i in range(entries)}
    try:
        await writer.publish(
            thread,
            [
                {"type": "RUN_STARTED", "threadId": thread, "runId": "r"},
                {"type": "STATE_SNAPSHOT", "snapshot": {"s": big}},
            ],
        )
        groups: list[int] = []
        together = writer._together

        async def counted(thread: str, members: list[Any]) -> None:
            groups.append(len(members))
            await together(thread, members)

        writer._together = counted  # type: ignore[method-assign]
        append = store.append

        async def slow_append(*args: Any, **kwargs: Any) -> Any:
            # Each append takes a while, so that the publishes made meanwhile queue up
            # and are stored together by the next one (the memory store never waits).
            await asyncio.sleep(0.05)
            return await append(*args, **kwargs)

        store.append = slow_append  # type: ignore[method-assign]
        budgets = [WorkBudget(max_work) for _ in range(4)]
        results = await asyncio.wait_for(
            asyncio.gather(*(writer.publish(thread, copy_remove(1), work=w) for w in budgets)),
            WAIT,
        )
        assert all(len(r) == 1 for r in results)
        assert max(groups, default=0) >= 2, groups  # some were stored together
        assert all(w.spent >= 2 * walk_units(entries) for w in budgets)
        # Two such deltas in one publish are one too many.
        with pytest.raises(LimitExceeded) as refused:
            await asyncio.wait_for(writer.publish(thread, copy_remove(2)), WAIT)
        assert (refused.value.limit, refused.value.index) == ("max_work", 1)
    finally:
        await store.close()


async def seeded(client: Client, thread: str, entries: int) -> None:
    """Start a run in *thread* with a state of ``{"s": {entries string entries}}``."""
    big = {f"k{i:05d}": "x" * 9 for i in range(entries)}
    reply = await published(
        client,
        thread,
        [
            {"type": "RUN_STARTED", "threadId": thread, "runId": "r"},
            {"type": "STATE_SNAPSHOT", "snapshot": {"s": big}},
        ],
    )
    assert reply["type"] == "published", reply


async def test_connections_publishing_into_one_thread_are_paced_together(
    store_factory: Callable[..., ThreadStore],
) -> None:
    """Two connections, each well within its own work rate, publish heavy deltas
    into one thread: the thread's rate paces them together, while a third
    connection publishing into another thread meanwhile is not held back."""
    gateways = Harness(store_factory)
    try:
        rate = 80_000.0  # the burst is one second's worth (above --state-max-work)
        gateway = await gateways.gateway(
            max_thread_state_work_per_second=rate,
            max_state_work_per_second=10_000_000.0,  # the connections' own rate never paces
            state_max_work=50_000,
        )
        entries = 10_000  # one copy/remove delta: ~40,000 units
        per_delta = 2 * walk_units(entries)
        first, second, third = [await gateways.client(gateway) for _ in range(3)]
        await seeded(first, "paced-together", entries)
        await seeded(third, "paced-apart", 100)
        count = 4  # each of the two: 8 deltas, ~320,000 units into the thread

        async def heavy(client: Client) -> float:
            started = time.monotonic()
            for _ in range(count):
                reply = await published(client, "paced-together", copy_remove(1))
                assert reply["type"] == "published", reply
            return time.monotonic() - started

        async def light() -> list[float]:
            await asyncio.sleep(0.3)  # once the thread is in debt
            waits = []
            for _ in range(10):
                started = time.monotonic()
                reply = await published(third, "paced-apart", copy_remove(1))
                assert reply["type"] == "published", reply
                waits.append(time.monotonic() - started)
            return waits

        started = time.monotonic()
        heavy_tasks = [asyncio.create_task(heavy(c)) for c in (first, second)]
        waits = await light()
        assert not all(t.done() for t in heavy_tasks), "the thread was not paced"
        elapsed = max(await asyncio.gather(*heavy_tasks))
        assert time.monotonic() - started >= elapsed
        # What the two spent, less the burst and the two publishes judged before
        # they were charged, paid at the thread's rate.
        spent = 2 * count * per_delta
        assert elapsed >= (spent - rate - 2 * per_delta) / rate * 0.9, elapsed
        assert max(waits) < 0.5 * TIMEOUT_SCALE, waits
        # Every publish was stored, none refused for the pacing.
        stored = await gateway.store.read("paced-together", START, 100)
        assert [e.type for e in stored].count("STATE_DELTA") == 2 * count
        assert gateway.thread_work._threads["paced-together"].waiting == 0
    finally:
        await gateways.close()


async def test_a_connection_closed_while_its_thread_is_in_debt_leaves_the_line(
    store_factory: Callable[..., ThreadStore],
) -> None:
    """A publish waiting for its thread's bucket, whose connection closes, stores
    nothing, and the publishes behind it in the line go on."""
    gateways = Harness(store_factory)
    try:
        rate = 50_000.0
        gateway = await gateways.gateway(
            max_thread_state_work_per_second=rate,
            max_state_work_per_second=10_000_000.0,
            state_max_work=50_000,
        )
        thread = "paced-closed"
        entries = 10_000
        first = await gateways.client(gateway)
        await seeded(first, thread, entries)
        # Two deltas (~80,000 units) run the thread ~30,000 units into debt: 0.6 s.
        for _ in range(2):
            reply = await published(first, thread, copy_remove(1))
            assert reply["type"] == "published", reply
        leaving = await gateways.client(gateway)
        await leaving.send(
            {"type": "publish", "id": "gone", "thread": thread, "events": copy_remove(1)}
        )
        entry = gateway.thread_work._threads[thread]
        for _ in range(200):
            if entry.waiting:
                break
            await asyncio.sleep(0.005)
        assert entry.waiting == 1  # waiting in line
        waiter = asyncio.create_task(published(first, thread, copy_remove(1)))
        await asyncio.sleep(0.05)
        assert entry.waiting == 2 and not waiter.done()
        await leaving.close()
        reply = await asyncio.wait_for(waiter, WAIT)
        assert reply["type"] == "published", reply
        assert entry.waiting == 0 and entry.line is None
        # Stored: the snapshot's two events and three deltas, not the one of the
        # connection that left.
        stored = await gateway.store.read(thread, START, 100)
        assert [e.type for e in stored].count("STATE_DELTA") == 3
    finally:
        await gateways.close()


async def test_thread_work_waits_in_line_and_forgets_what_it_need_not_keep() -> None:
    """The thread buckets: first come, first served; a waiter cancelled wakes the
    next; at most ``max_threads`` remembered, and full buckets forgotten."""
    rates = ThreadWorkRates(1_000.0, burst=100.0, max_threads=3)
    await asyncio.wait_for(rates.wait("t"), 0.1)  # unknown: at once
    rates.charge("t", 150)  # 50 units of debt: 0.05 s
    order: list[int] = []

    async def waiter(n: int) -> None:
        await rates.wait("t")
        order.append(n)
        rates.charge("t", 60)  # each runs it into debt again

    tasks = [asyncio.create_task(waiter(n)) for n in range(4)]
    await asyncio.sleep(0)
    tasks[1].cancel()  # its connection gone: the next one still goes
    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), WAIT)
    assert order == [0, 2, 3]
    entry = rates._threads["t"]
    assert entry.waiting == 0 and entry.line is None
    # Bounded: past max_threads the one charged longest ago goes, debt and all.
    for name in ("a", "b", "c", "d"):
        rates.charge(name, 1_000)
    assert list(rates._threads) == ["b", "c", "d"]
    # A bucket full again is forgotten once it is the oldest.
    await asyncio.sleep(2.5)
    rates.charge("e", 1)
    assert "b" not in rates._threads and len(rates) <= 3
