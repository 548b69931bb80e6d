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
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store.contract import ThreadStore

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
        while rounds < 6 or time.monotonic() - started < 1.0:
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
