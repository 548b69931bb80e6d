"""What a snapshot on a branch costs against one of the whole thread.

Usage::

    python bench/bench_branches.py [--runs 200] [--joins 30] [--store memory,redis]

Starts a gateway in this process on a free loopback port (and its own
redis-server for ``redis``), stores a thread of ``--runs`` runs of ten
events each, every fifth run a new version of the run before it (its
``parentRunId`` is that run's parent: a regenerated answer), then times,
``--joins`` times each, a new connection that subscribes ``from:
"snapshot"`` until its snapshot arrives:

* ``whole``: the whole thread (the channel's folded state: the ceiling);
* ``latest``: the branch of the latest run;
* ``early``: the branch of a run from the first tenth of the thread.

A branch snapshot is folded from the store at each join (the channel's
state folds every branch), so it costs a read of the thread: prints the
median milliseconds per join, and each branch's ratio to ``whole``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from bench_store import free_port, start_redis  # the same redis-server, no persistence
from websockets.asyncio.client import connect

from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.protocol import SUBPROTOCOL_JSON

THREAD = "bench-branches"


def run_events(run: str, parent: str | None) -> list[dict[str, Any]]:
    started: dict[str, Any] = {"type": "RUN_STARTED", "threadId": THREAD, "runId": run}
    if parent is not None:
        started["parentRunId"] = parent
    message = f"m-{run}"
    return [
        started,
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        *[
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f" word{i}"}
            for i in range(6)
        ],
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "RUN_FINISHED", "threadId": THREAD, "runId": run},
    ]


async def fill(url: str, runs: int) -> tuple[str, str]:
    """Store the thread; returns (the latest run, a run of the first tenth)."""
    parents: dict[str, str | None] = {}
    previous: str | None = None
    async with connect(url, subprotocols=[SUBPROTOCOL_JSON]) as ws:  # type: ignore[list-item]
        for i in range(runs):
            run = f"r{i}"
            parent = parents.get(previous) if previous and i % 5 == 4 else None
            parents[run] = parent if parent is not None else previous
            await ws.send(json.dumps({"type": "publish", "id": i, "thread": THREAD,
                                      "events": run_events(run, parent)}))  # fmt: skip
            reply = json.loads(await ws.recv())
            assert reply["type"] == "published", reply
            previous = run
    return f"r{runs - 1}", f"r{max(1, runs // 10) - 1}"


async def join(url: str, branch: str | None) -> float:
    """Seconds from the subscribe to its snapshot, on a new connection."""
    async with connect(url, subprotocols=[SUBPROTOCOL_JSON]) as ws:  # type: ignore[list-item]
        command: dict[str, Any] = {"type": "subscribe", "id": 1, "thread": THREAD,
                                   "from": "snapshot"}  # fmt: skip
        if branch is not None:
            command["branch"] = branch
        started = time.perf_counter()
        await ws.send(json.dumps(command))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame["type"] == "snapshot":
                return time.perf_counter() - started
            assert frame["type"] == "subscribed", frame


async def measure(store: ThreadStore, runs: int, joins: int) -> dict[str, float]:
    gateway = Gateway(
        GatewayConfig(host="127.0.0.1", port=free_port(), ping_interval=None), store=store
    )
    await gateway.start()
    url = f"ws://127.0.0.1:{gateway.config.port}/"
    try:
        latest, early = await fill(url, runs)
        # A viewer of the whole thread keeps its channel loaded, as on a busy relay.
        async with connect(url, subprotocols=[SUBPROTOCOL_JSON]) as keeper:  # type: ignore[list-item]
            await keeper.send(json.dumps({"type": "subscribe", "thread": THREAD, "from": "live"}))
            await keeper.recv()
            times: dict[str, list[float]] = {"whole": [], "latest": [], "early": []}
            for _ in range(joins):  # interleaved: the box's noise falls on all three alike
                times["whole"].append(await join(url, None))
                times["latest"].append(await join(url, latest))
                times["early"].append(await join(url, early))
        return {name: statistics.median(values) * 1000 for name, values in times.items()}
    finally:
        await gateway.drain()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--joins", type=int, default=30)
    parser.add_argument("--store", default="memory,redis")
    args = parser.parse_args()
    print(f"thread of {args.runs} runs ({args.runs * 10} events), {args.joins} joins each; "
          "median ms per snapshot join (ratio to the whole thread's)")  # fmt: skip
    for kind in args.store.split(","):
        if kind == "memory":
            result = await measure(MemoryStore(), args.runs, args.joins)
        else:
            from agui_hub.store.redis.store import RedisStore

            proc, url = start_redis()
            try:
                result = await measure(RedisStore(url, prefix="bench"), args.runs, args.joins)
            finally:
                proc.kill()
                proc.wait()
        whole = result["whole"]
        print(f"{kind:7} whole {whole:7.2f}   latest branch {result['latest']:7.2f} "
              f"({result['latest'] / whole:5.2f}x)   early branch {result['early']:7.2f} "
              f"({result['early'] / whole:5.2f}x)")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
