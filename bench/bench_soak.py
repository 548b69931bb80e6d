"""A soak: does a gateway's memory stay flat once its caches are full?

Usage::

    python bench/bench_soak.py [--stores memory,redis] [--threads 150] [--viewers 3000]
        [--rate 200] [--warmup 40] [--seconds 150] [--churn-every 20] [--churn 0.1]

Per store (the in-process memory store, then a redis-server this script
starts), one ``agui-hub serve`` process on a free loopback port:

1. every one of ``--threads`` threads gets a run and ``--backlog`` events
   (CUSTOM events of about 200 bytes of msgpack), published in batches, so
   that the store is at its retention (``max_len`` = ``--backlog``: the
   memory store then stops growing) and each channel's latest-entries
   cache fills as soon as it loads: at the defaults the per-channel bound
   (512 KiB) and the hub's budget (64 MiB) are both reached;
2. ``--viewers`` WebSocket viewers subscribe, spread over the threads;
3. an agent publishes ``--rate`` events/s round robin over the threads, and
   every ``--churn-every`` seconds a ``--churn`` share of the viewers
   disconnects and resumes from the last offset it received;
4. after ``--warmup`` seconds the gateway's resident memory (``VmRSS``) is
   the baseline, then it is sampled every 10 s for ``--seconds`` more.

Reported: RSS at the baseline and at the end, the growth between them (the
goal: under 10%), the ``agui_hub_recent_entries_bytes`` gauge, and the
viewers' deliveries (with those that came out of order or twice: none is
the expectation). Every loop is bounded by count and by time; everything
stays on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from bench_sizing import rss_bytes, wait_port
from bench_store import free_port, start_redis
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Subprotocol

from agui_hub.client.publisher import Publisher
from agui_hub.wire.offsets import offset_key

ROOT = Path(__file__).resolve().parent.parent
SUBPROTOCOL = Subprotocol("agui-hub.v1.msgpack")
SAMPLE_EVERY = 10.0
CONNECT_BATCH = 100


def custom(i: int) -> dict[str, Any]:
    return {"type": "CUSTOM", "name": "tick", "value": f"{i:08d}-" + "v" * 170}


@dataclass
class Viewer:
    """One viewer: its socket, and where it is in its thread."""

    thread: str
    ws: ClientConnection | None = None
    reader: asyncio.Task[None] | None = None
    epoch: str | None = None
    last: str | None = None
    events: int = 0
    disorder: int = 0

    async def open(self, url: str) -> None:
        self.ws = await connect(url, subprotocols=[SUBPROTOCOL], max_queue=None)
        start: Any = "live"
        if self.last is not None and self.epoch is not None:
            start = {"offset": self.last, "epoch": self.epoch}
        command = {"type": "subscribe", "id": 1, "thread": self.thread, "from": start}
        await self.ws.send(msgpack.packb(command))
        self.reader = asyncio.create_task(self.read(self.ws))

    async def read(self, ws: ClientConnection) -> None:
        async for raw in ws:
            frame = msgpack.unpackb(raw)
            kind = frame.get("type")
            if kind == "event":
                offset = frame["offset"]
                if self.last is not None and offset_key(offset) <= offset_key(self.last):
                    self.disorder += 1
                self.last = offset
                self.events += 1
            elif kind in ("subscribed", "snapshot"):
                self.epoch = frame.get("epoch") or self.epoch
                if kind == "snapshot" or not frame.get("recovered", True):
                    self.last = frame.get("offset") or self.last

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 10)
            except Exception:  # closed under it: nothing more to count
                self.reader.cancel()
        self.ws = self.reader = None


@dataclass
class Result:
    store: str
    baseline: int = 0
    end: int = 0
    peak: int = 0
    samples: list[int] = field(default_factory=list)
    gauge_baseline: float = 0.0
    gauge_end: float = 0.0
    events: int = 0
    disorder: int = 0
    published: int = 0
    resumes: int = 0

    @property
    def growth(self) -> float:
        return self.end / self.baseline - 1


def gauge(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^agui_hub_recent_entries_bytes (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


async def soak(store: str, args: argparse.Namespace) -> Result:
    result = Result("redis" if store.startswith("redis") else "memory")
    port = free_port()
    argv = [sys.executable, "-m", "agui_hub.cli", "serve", "--port", str(port),
            "--log-level", "WARNING", "--store", store,
            "--max-connections", str(args.viewers + 100),
            "--max-connections-per-address", str(args.viewers + 100)]  # fmt: skip
    gateway = subprocess.Popen(argv, cwd=ROOT, env=os.environ, stdout=subprocess.DEVNULL)
    viewers: list[Viewer] = []
    try:
        await wait_port(port)
        url = f"ws://127.0.0.1:{port}/"
        names = [f"soak-{uuid.uuid4().hex[:8]}-{i}" for i in range(args.threads)]
        async with Publisher(url) as publisher:
            for name in names:
                await publisher.publish_batch(
                    name, [{"type": "RUN_STARTED", "threadId": name, "runId": f"run-{name}"}]
                )
                for i in range(0, args.backlog, 100):
                    await publisher.publish_batch(name, [custom(i + j) for j in range(100)])
            viewers = [Viewer(names[i % len(names)]) for i in range(args.viewers)]
            for i in range(0, len(viewers), CONNECT_BATCH):
                await asyncio.gather(*(v.open(url) for v in viewers[i : i + CONNECT_BATCH]))
            print(f"  {result.store}: {args.threads} threads x {args.backlog} events, "
                  f"{len(viewers)} viewers", flush=True)  # fmt: skip

            started = time.monotonic()
            stop_at = started + args.warmup + args.seconds
            next_churn = started + args.churn_every
            next_sample = started + args.warmup
            tick, n = 0.1, 0
            per_tick = max(1, round(args.rate * tick))
            while time.monotonic() < stop_at:
                due = time.monotonic() + tick
                for _ in range(per_tick):
                    await publisher.publish_batch(names[n % len(names)], [custom(n)])
                    n += 1
                result.published = n
                now = time.monotonic()
                if now >= next_churn:
                    next_churn += args.churn_every
                    leaving = random.sample(viewers, int(len(viewers) * args.churn))
                    await asyncio.gather(*(v.close() for v in leaving))
                    for i in range(0, len(leaving), CONNECT_BATCH):
                        await asyncio.gather(*(v.open(url) for v in leaving[i : i + CONNECT_BATCH]))
                    result.resumes += len(leaving)
                if now >= next_sample:
                    next_sample += SAMPLE_EVERY
                    rss = rss_bytes(gateway.pid)
                    if not result.samples:
                        result.baseline, result.gauge_baseline = rss, gauge(port)
                    result.samples.append(rss)
                    print(f"    t={now - started:5.0f}s RSS {rss / 2**20:7.1f} MiB, "
                          f"recent entries {gauge(port) / 2**20:5.1f} MiB", flush=True)  # fmt: skip
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await asyncio.sleep(2)  # the last events reach the viewers
        result.end, result.gauge_end = rss_bytes(gateway.pid), gauge(port)
        result.peak = max([*result.samples, result.end])
        result.events = sum(v.events for v in viewers)
        result.disorder = sum(v.disorder for v in viewers)
        return result
    finally:
        for i in range(0, len(viewers), CONNECT_BATCH):
            await asyncio.gather(*(v.close() for v in viewers[i : i + CONNECT_BATCH]))
        gateway.terminate()
        gateway.wait(15)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="memory,redis")
    parser.add_argument("--threads", type=int, default=150)
    parser.add_argument("--viewers", type=int, default=3000)
    parser.add_argument("--backlog", type=int, default=1100)
    parser.add_argument("--rate", type=float, default=200.0, help="events/s over all threads")
    parser.add_argument("--warmup", type=float, default=40.0)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--churn-every", type=float, default=20.0)
    parser.add_argument("--churn", type=float, default=0.1)
    args = parser.parse_args()
    results = []
    for kind in args.stores.split(","):
        if kind == "memory":
            results.append(await soak(f"memory://?max_len={args.backlog}", args))
        else:
            redis, url = start_redis()
            try:
                results.append(await soak(f"{url}?max_len={args.backlog}", args))
            finally:
                redis.terminate()
                redis.wait(10)
    print()
    print("| store | RSS after warm-up | RSS at the end (peak) | growth | recent entries gauge "
          "| deliveries | resumes | out of order or twice |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        mib = 2**20
        print(f"| {r.store} | {r.baseline / mib:.1f} MiB | {r.end / mib:.1f} MiB "
              f"({r.peak / mib:.1f}) | {r.growth:+.1%} | {r.gauge_baseline / mib:.1f} -> "
              f"{r.gauge_end / mib:.1f} MiB | {r.events:,} | {r.resumes:,} "
              f"| {r.disorder} |")  # fmt: skip
    return 0 if all(r.growth < 0.10 and not r.disorder for r in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
