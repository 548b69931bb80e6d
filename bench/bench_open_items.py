"""Gateway CPU per delivered event, with 0, 1,000 and 10,000 items left open.

Usage::

    python bench/bench_open_items.py [--open 0,1000,10000] [--frames 30] [--runs 3]

A real gateway process (``agui-hub serve``, memory store), a new one for
each case and run, and, in this process, one publisher and one viewer
(``HubClient``, WebSocket on 127.0.0.1). The viewer subscribes, the
publisher opens a run with N messages and N / 2 tool calls that stay open
(``TEXT_MESSAGE_START`` / ``TOOL_CALL_START`` with no end), then publishes
two frames of 1,000 events to warm up and ``--frames`` frames of 1,000
``TEXT_MESSAGE_CONTENT`` deltas (about 60 bytes each) to one of the open
messages; the gateway's CPU (user + system, from /proc) over those frames,
until the viewer has every event, divided by the events, is the cost per
delivered event. The same without a viewer is the publish side alone.

The measured window is long enough (30,000 events, about 1.8 MB) to include
what the channel does now and then and not per event (a checkpoint of the
whole folded state: 1.6 MB with 10,000 open messages), so the figure is the
amortized cost. Prints, per case, the median of ``--runs`` runs and its
ratio to the 0-items case of the same run (the ceiling: nothing open to
scan): about 1 when the cost per event does not grow with the open items.
Not part of the test suite; bounded (each publish waits at most 60 s, a few
minutes in all on a 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gateway import cpu_seconds, settle, start_gateway

from agui_hub.client.hub_client import HubClient
from agui_hub.client.subscription import ThreadEvent

FRAME = 1000
"""Events per publish (the most one publish takes)."""
WARM_UP = 2
"""Frames published before the measurement."""
WAIT = 60.0
"""Seconds the viewer may take to get a frame's events before the run gives up."""

Event = dict[str, Any]
_threads = itertools.count()


def open_items(thread: str, count: int) -> list[Event]:
    """A run with *count* open messages and one open tool call for every other one."""
    events: list[Event] = [{"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}]
    events.append({"type": "TEXT_MESSAGE_START", "messageId": "live", "role": "assistant"})
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


def deltas(frame: int) -> list[Event]:
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "live", "delta": f" token {frame}.{i}"}
        for i in range(FRAME)
    ]


class Viewer:
    """Counts the events of one subscription as they come."""

    def __init__(self) -> None:
        self.events = 0
        self.changed = asyncio.Event()

    async def follow(self, client: HubClient, thread: str, ready: asyncio.Event) -> None:
        async with client.subscribe(thread, "live") as subscription:
            ready.set()
            async for item in subscription:
                if isinstance(item, ThreadEvent):
                    self.events += 1
                    self.changed.set()

    async def until(self, count: int) -> None:
        deadline = time.monotonic() + WAIT
        while self.events < count:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"the viewer got {self.events} events of {count}")
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                continue


async def one_run(url: str, pid: int, open_count: int, frames: int, watch: bool) -> float:
    """Gateway CPU-seconds per delivered event (published, without a viewer)."""
    thread = f"open-{open_count}-{next(_threads)}"
    async with HubClient(url) as publisher, HubClient(url) as viewer_client:
        viewer, task = Viewer(), None
        if watch:
            ready = asyncio.Event()
            task = asyncio.create_task(viewer.follow(viewer_client, thread, ready))
            await asyncio.wait_for(ready.wait(), WAIT)
        setup = open_items(thread, open_count)
        for i in range(0, len(setup), FRAME):
            await asyncio.wait_for(publisher.publish(thread, setup[i : i + FRAME]), WAIT)
        published = len(setup)
        for k in range(WARM_UP):
            await asyncio.wait_for(publisher.publish(thread, deltas(-k)), WAIT)
            published += FRAME
        if watch:
            await viewer.until(published)
        await settle([pid])
        before = cpu_seconds(pid)
        for k in range(frames):
            await asyncio.wait_for(publisher.publish(thread, deltas(k)), WAIT)
            published += FRAME
        if watch:
            await viewer.until(published)
        used = cpu_seconds(pid) - before
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return used / (frames * FRAME)


async def measure(open_count: int, frames: int, watch: bool) -> float:
    """One run in a gateway of its own: every case starts from the same process
    state (a store holding only its thread, nothing left to collect of another
    case's channel)."""
    gateway = start_gateway("memory://", ["--max-events-per-second", "1000000000"])
    try:
        return await one_run(f"ws://127.0.0.1:{gateway.port}/", gateway.pid, open_count,
                             frames, watch)  # fmt: skip
    finally:
        gateway.stop()


async def bench(args: argparse.Namespace) -> None:
    counts = list(dict.fromkeys(int(c) for c in args.open.split(",")))
    for watch in (True, False):
        per_event: dict[int, list[float]] = {c: [] for c in counts}
        ratios: dict[int, list[float]] = {c: [] for c in counts}
        for _run in range(args.runs):
            costs = {c: await measure(c, args.frames, watch) for c in counts}
            for c in counts:
                per_event[c].append(costs[c])
                ratios[c].append(costs[c] / costs[counts[0]])
        title = "one viewer" if watch else "no viewer (the publish alone)"
        print(f"\n{title}: gateway CPU per event, median of {args.runs} runs")
        print(f"{'open messages':>14} {'tool calls':>11} {'us/event':>9} {'ratio':>6}  runs")
        for c in counts:
            runs = ", ".join(f"{r:.2f}" for r in ratios[c])
            print(
                f"{c:>14} {c // 2 + c % 2:>11} "
                f"{statistics.median(per_event[c]) * 1e6:>9.1f} "
                f"{statistics.median(ratios[c]):>6.2f}  ({runs})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--open", default="0,1000,10000", help="open messages per case")
    parser.add_argument("--frames", type=int, default=30, help="measured frames of 1,000")
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
