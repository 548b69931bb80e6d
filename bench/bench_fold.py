"""Fold cost per event, from a thread of 100 events to one of 100,000.

Usage::

    python bench/bench_fold.py [--sizes 100,1000,10000,100000] [--runs 3]

Each thread is one realistic generated stream (see :func:`thread`): runs of
assistant messages streamed token by token, many of them interleaved and
half of them left open for the rest of the run (a thousand open at a time in
the largest thread), tool calls with argument deltas and results placed after their
assistant message, reasoning, STATE_DELTA patches on a state document that
keeps growing, activity updates.
A thread of N events has about N/25 messages (4,000 in the largest).

Prints, per size, the microseconds per event of folding the whole thread into
a fresh :class:`~agui_hub.agui.reducer.ThreadState` (median of ``--runs``), and
the ratio of the last size to the first: about 1 when the cost per event
does not grow with the thread (the reducer's indexes, lazy joins and in-place
patches), far above 1 when it does. Not part of the test suite; bounded (a few
seconds per size at most).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from agui_hub.agui.reducer import ThreadState

Event = dict[str, Any]


def thread(n: int, seed: int = 7) -> list[Event]:
    """About *n* events of one thread (see the module docstring)."""
    rng = random.Random(seed)
    words = [" the", " agent", " streams", " tokens", " to", " every", " viewer", "."]
    events: list[Event] = []
    open_now: list[str] = []  # interleaved messages streaming now
    lingering: list[str] = []  # messages left open until the run ends
    counter = 0
    run = 0

    def start_run() -> None:
        nonlocal run
        run += 1
        events.append({"type": "RUN_STARTED", "threadId": "t", "runId": f"r{run}"})
        if run == 1:
            events.append(
                {
                    "type": "STATE_SNAPSHOT",
                    "snapshot": {"progress": 0, "notes": [], "items": {}, "run": run},
                }
            )

    def end_run() -> None:
        for message_id in open_now + lingering:
            events.append({"type": "TEXT_MESSAGE_END", "messageId": message_id})
        open_now.clear()
        lingering.clear()
        events.append({"type": "RUN_FINISHED", "threadId": "t", "runId": f"r{run}"})

    start_run()
    while len(events) < n - 2:
        roll = rng.random()
        if roll < 0.04 or not open_now:
            counter += 1
            message_id = f"m{counter}"
            events.append({"type": "TEXT_MESSAGE_START", "messageId": message_id})
            open_now.append(message_id)
        elif roll < 0.75:
            if lingering and rng.random() < 0.05:
                message_id = rng.choice(lingering)  # an old message goes on
            else:
                message_id = rng.choice(open_now[-4:])
            delta = "".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
            events.append({"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": delta})
        elif roll < 0.78:
            message_id = open_now.pop(0)
            if rng.random() < 0.5:
                lingering.append(message_id)  # streams on, untouched, until the run ends
            else:
                events.append({"type": "TEXT_MESSAGE_END", "messageId": message_id})
        elif roll < 0.86:
            counter += 1
            pool = lingering if lingering and rng.random() < 0.1 else open_now
            call, parent = f"tc{counter}", rng.choice(pool)
            events.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": call,
                    "toolCallName": "search",
                    "parentMessageId": parent,
                }
            )
            for k in range(rng.randint(2, 6)):
                events.append({"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": f'"q{k}"'})
            events.append({"type": "TOOL_CALL_END", "toolCallId": call})
            events.append(
                {
                    "type": "TOOL_CALL_RESULT",
                    "messageId": f"res{counter}",
                    "toolCallId": call,
                    "content": "result",
                }
            )
        elif roll < 0.95:
            k = len(events)
            op = rng.random()
            if op < 0.4:
                patch = [{"op": "replace", "path": "/progress", "value": k}]
            elif op < 0.7:
                patch = [{"op": "add", "path": "/notes/-", "value": f"note {k}"}]
                if rng.random() < 0.3:
                    patch.append({"op": "remove", "path": "/notes/0"})
            else:
                patch = [{"op": "add", "path": f"/items/i{k % 500}", "value": {"n": k}}]
            events.append({"type": "STATE_DELTA", "delta": patch})
        elif roll < 0.97:
            events.append(
                {
                    "type": "ACTIVITY_SNAPSHOT",
                    "messageId": f"plan{run}",
                    "activityType": "PLAN",
                    "content": {"steps": []},
                    "replace": False,
                }
            )
            events.append(
                {
                    "type": "ACTIVITY_DELTA",
                    "messageId": f"plan{run}",
                    "activityType": "PLAN",
                    "patch": [{"op": "add", "path": "/steps/-", "value": len(events)}],
                }
            )
        elif run == 1 and len(events) > n // 2:
            end_run()  # two runs: what lingers piles up to thousands in the largest thread
            start_run()
        else:
            counter += 1
            reasoning = f"think{counter}"
            events.append({"type": "REASONING_MESSAGE_START", "messageId": reasoning,
                           "role": "reasoning"})  # fmt: skip
            events.append(
                {"type": "REASONING_MESSAGE_CONTENT", "messageId": reasoning, "delta": "hmm"}
            )
            events.append({"type": "REASONING_MESSAGE_END", "messageId": reasoning})
    end_run()
    return events


def fold_cost(events: list[Event], runs: int) -> tuple[float, ThreadState]:
    """Median seconds per event of folding *events* into a fresh state."""
    times = []
    state = ThreadState()
    for _ in range(runs):
        state = ThreadState()
        started = time.perf_counter()
        for event in events:
            state.apply(event)
        assert state.messages  # joined: part of the cost
        times.append((time.perf_counter() - started) / len(events))
    return statistics.median(times), state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    costs = []
    print(f"{'events':>8} {'messages':>9} {'max open':>9} {'us/event':>9}")
    for size in sizes:
        events = thread(size)
        cost, state = fold_cost(events, args.runs)
        costs.append(cost)
        most_open = _most_open(events)
        print(f"{len(events):>8} {len(state.messages):>9} {most_open:>9} {cost * 1e6:>9.2f}")
    print(f"ratio {sizes[-1]} / {sizes[0]} events: {costs[-1] / costs[0]:.2f}")


def _most_open(events: list[Event]) -> int:
    open_now, most = 0, 0
    for event in events:
        if event["type"] == "TEXT_MESSAGE_START":
            open_now += 1
        elif event["type"] == "TEXT_MESSAGE_END":
            open_now -= 1
        most = max(most, open_now)
    return most


if __name__ == "__main__":
    main()
