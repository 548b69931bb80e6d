"""Figures for sizing a deployment: gateway memory per connection, Redis memory
per event and per thread.

Usage::

    python bench/bench_sizing.py [--runs 3] [--connections 2000] [--threads 200]
        [--events 20000] [--idle-threads 5000]

Starts its own redis-server (no persistence) and ``agui-hub serve`` processes
on free loopback ports, and measures:

* gateway memory per connection: the gateway's resident memory (``VmRSS``)
  before and after ``--connections`` WebSocket connections, each subscribed
  to one of ``--threads`` threads that hold one demo run (107 events), once
  on the in-memory store and once on Redis (the events the memory store
  holds are counted before the connections open);
* Redis memory per event: ``used_memory`` before and after ``--events``
  events of demo runs (token deltas, tool calls, state deltas: 90 bytes of
  msgpack on average) appended with the store, in threads of one run each,
  with the default retention;
* Redis memory per thread: ``used_memory`` per thread holding a single small
  event (``--idle-threads`` of them): what a thread costs before its events.

Medians of ``--runs`` runs. Every loop is bounded by its count; everything
stays on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import redis.asyncio as aioredis
from bench_store import free_port, start_redis  # the same redis-server, no persistence
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from agui_hub.cli.demo import demo_run
from agui_hub.store.contract import EventInput
from agui_hub.store.redis import RedisStore

ROOT = Path(__file__).resolve().parent.parent


async def wait_port(port: int, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def run_events(thread: str, run: int) -> list[dict[str, Any]]:
    return [event for _, event in demo_run(thread, f"run-{run}")]


async def gateway_per_connection(store: str, connections: int, threads: int) -> float:
    """Bytes of gateway RSS per subscribed WebSocket connection."""
    port = free_port()
    argv = [sys.executable, "-m", "agui_hub.cli", "serve", "--port", str(port),
            "--log-level", "WARNING", "--max-connections-per-address", str(connections + 10),
            "--max-connections", str(connections + 10)]  # fmt: skip
    if store:
        argv += ["--store", store]
    gateway = subprocess.Popen(argv, cwd=ROOT, env=os.environ, stdout=subprocess.DEVNULL)
    sockets: list[Any] = []
    try:
        await wait_port(port)
        url = f"ws://127.0.0.1:{port}/"
        names = [f"size-{uuid.uuid4().hex[:8]}-{i}" for i in range(threads)]
        from agui_hub.client.publisher import Publisher

        async with Publisher(url) as publisher:
            for index, name in enumerate(names):
                await publisher.publish_batch(name, run_events(name, index))
        # Every thread once followed and left: its channel's state is warm, as in use.
        await asyncio.sleep(0.5)
        before = rss_bytes(gateway.pid)
        for index in range(connections):
            ws = await connect(url, subprotocols=[Subprotocol("agui-hub.v1.msgpack")])
            thread = names[index % threads]
            await ws.send(msgpack.packb({"type": "subscribe", "id": 1, "thread": thread}))
            sockets.append(ws)
        # Each got its subscribed reply: the gateway holds every subscription.
        for ws in sockets:
            while True:
                frame = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 30))
                if frame.get("type") == "subscribed":
                    break
        await asyncio.sleep(0.5)
        after = rss_bytes(gateway.pid)
        return (after - before) / connections
    finally:
        for ws in sockets:
            await ws.close()
        gateway.terminate()
        gateway.wait(10)


async def redis_per_event(url: str, events: int) -> tuple[float, float]:
    """Bytes of Redis used_memory per stored event, and per event payload byte."""
    client = aioredis.from_url(url)
    store = RedisStore(url)
    try:
        await client.flushall()
        before = int((await client.info("memory"))["used_memory"])
        stored = payload = 0
        run = 0
        while stored < events:
            thread = f"ev-{uuid.uuid4().hex[:8]}"
            batch = run_events(thread, run)[: events - stored]
            await store.append(thread, [EventInput.of(event) for event in batch])
            stored += len(batch)
            payload += sum(len(msgpack.packb(event)) for event in batch)
            run += 1
        after = int((await client.info("memory"))["used_memory"])
        return (after - before) / stored, payload / stored
    finally:
        await store.close()
        await client.aclose()


async def redis_per_thread(url: str, threads: int) -> float:
    client = aioredis.from_url(url)
    store = RedisStore(url)
    try:
        await client.flushall()
        before = int((await client.info("memory"))["used_memory"])
        event = {"type": "CUSTOM", "name": "n", "value": 1}
        for index in range(threads):
            await store.append(f"idle-{index}", [EventInput.of(event)])
        after = int((await client.info("memory"))["used_memory"])
        return (after - before) / threads
    finally:
        await store.close()
        await client.aclose()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--idle-threads", type=int, default=5000)
    args = parser.parse_args()
    redis_proc, url = start_redis()
    rows: dict[str, list[float]] = {}
    try:
        for run in range(args.runs):
            figures = {
                "gateway bytes per connection (memory store)": await gateway_per_connection(
                    "", args.connections, args.threads
                ),
                "gateway bytes per connection (Redis store)": await gateway_per_connection(
                    url, args.connections, args.threads
                ),
            }
            per_event, payload = await redis_per_event(url, args.events)
            figures["Redis bytes per event"] = per_event
            figures["event payload bytes (msgpack, mean)"] = payload
            figures["Redis bytes per thread (one small event)"] = await redis_per_thread(
                url, args.idle_threads
            )
            for name, value in figures.items():
                rows.setdefault(name, []).append(value)
            print(f"run {run + 1}: {figures}", file=sys.stderr)
    finally:
        redis_proc.terminate()
        redis_proc.wait(10)
    print("| figure | median | runs |")
    print("| --- | --- | --- |")
    for name, values in rows.items():
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {name} | **{statistics.median(values):,.0f}** | {runs} |")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
