"""Redis CPU per appended event: the store's append script against a minimal
idempotent script and the raw commands, in the same run.

Usage::

    python bench/bench_append_cpu.py [--threads 1000] [--events 20] [--batches 1,10,100]
                                     [--runs 3] [--ttl 86400] [--commandstats]

Starts its own redis-server (loopback, no persistence) and, per batch size
and run, appends ``--threads`` x ``--events`` events round robin over the
threads (a batch of ``B`` events into one thread per call, ``PIPELINE``
calls in flight), three ways, on fresh keys each time:

* ``store``: ``RedisStore.append`` (append.lua: idempotency, conditional
  checks, epochs, retention, byte totals, TTL, the notification carrying
  the entries), with the store's defaults and ``ttl`` = ``--ttl`` seconds;
* ``minimal``: one EVALSHA of a script that checks the event id (``HGET``),
  ``XADD``s, records the id (``HSET``) and ``PUBLISH``es the offset: the
  least an idempotent, notifying append can do;
* ``raw``: ``XADD`` + ``PUBLISH`` per event, pipelined, no script.

Reports redis-server's own CPU (``INFO cpu``, user + system, read before and
after) per event, medians of ``--runs``, and the ratios store / minimal and
store / raw; and the calls per second this one process made (the store's
Python side against redis-py pipelining the raw commands). ``--commandstats``
also prints where the store's time went inside Redis (``INFO commandstats``
of the store's runs: the calls its script makes, with their microseconds).
Not part of the test suite; bounded (``--threads`` x ``--events`` events per
measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import msgpack
import redis.asyncio as aioredis
from bench_store import start_redis

from agui_hub.store.contract import EventInput, Retention
from agui_hub.store.redis import RedisStore

PIPELINE = 100
"""Calls in flight at once (as many publishers would have)."""

MINIMAL = """
local known = redis.call('HGET', KEYS[2], ARGV[1])
if known then return known end
local offset = redis.call('XADD', KEYS[1], '*', 'event', ARGV[2], 'id', ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], offset)
redis.call('PUBLISH', KEYS[3], offset)
return offset
"""


def payload(i: int) -> dict[str, Any]:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f" token{i % 50}"}


async def redis_cpu(admin: aioredis.Redis) -> float:
    info = await admin.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def in_flight(calls: list[Any]) -> float:
    """Run *calls*, PIPELINE at a time: the seconds they took."""
    t0 = time.perf_counter()
    for i in range(0, len(calls), PIPELINE):
        await asyncio.gather(*(call() for call in calls[i : i + PIPELINE]))
    return time.perf_counter() - t0


async def run_store(url: str, threads: list[str], events: int, batch: int, ttl: float) -> float:
    store = RedisStore(url, prefix=f"b{uuid.uuid4().hex[:6]}", retention=Retention(ttl=ttl))
    try:
        calls = []
        for start in range(0, events, batch):
            for thread in threads:
                items = [
                    EventInput.of(payload(i), f"{thread}-{i}")
                    for i in range(start, min(events, start + batch))
                ]
                calls.append(lambda t=thread, it=items: store.append(t, it))
        return await in_flight(calls)
    finally:
        await store.close()


async def run_minimal(client: aioredis.Redis, threads: list[str], events: int, batch: int) -> float:
    sha = await client.script_load(MINIMAL)
    prefix = f"m{uuid.uuid4().hex[:6]}"
    calls = []
    for start in range(0, events, batch):
        for thread in threads:
            keys = [f"{prefix}:{{{thread}}}:events", f"{prefix}:{{{thread}}}:ids"]
            keys.append(f"{prefix}:{{{thread}}}:notify")
            data = [msgpack.packb(payload(i)) for i in range(start, min(events, start + batch))]

            async def call(keys: list[str] = keys, data: list[bytes] = data, t: str = thread,
                           s: int = start) -> None:  # fmt: skip
                pipe = client.pipeline(transaction=False)
                for j, d in enumerate(data):
                    pipe.evalsha(sha, 3, *keys, f"{t}-{s + j}", d)
                await pipe.execute()

            calls.append(call)
    return await in_flight(calls)


async def run_raw(client: aioredis.Redis, threads: list[str], events: int, batch: int) -> float:
    prefix = f"r{uuid.uuid4().hex[:6]}"
    calls = []
    for start in range(0, events, batch):
        for thread in threads:
            data = [msgpack.packb(payload(i)) for i in range(start, min(events, start + batch))]

            async def call(t: str = thread, data: list[bytes] = data, s: int = start) -> None:
                pipe = client.pipeline(transaction=False)
                for j, d in enumerate(data):
                    pipe.xadd(f"{prefix}:{{{t}}}:events", {"event": d, "id": f"{t}-{s + j}"})
                    pipe.publish(f"{prefix}:{{{t}}}:notify", "x")
                await pipe.execute()

            calls.append(call)
    return await in_flight(calls)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20, help="events per thread")
    parser.add_argument("--batches", default="1,10,100", help="events per call")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=86400.0, help="the store's ttl, seconds")
    parser.add_argument("--commandstats", action="store_true")
    args = parser.parse_args()
    proc, url = start_redis()
    admin = aioredis.from_url(url)
    try:
        print(f"{args.threads} threads x {args.events} events, {PIPELINE} calls in flight")
        print(
            "| events per call | store | minimal | raw | store / minimal | store / raw "
            "| store calls/s | raw calls/s | store / raw (calls/s) |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for batch in [int(b) for b in args.batches.split(",")]:
            per_event: dict[str, list[float]] = {"store": [], "minimal": [], "raw": []}
            rates: dict[str, list[float]] = {"store": [], "minimal": [], "raw": []}
            stats: dict[str, float] = {}
            for _ in range(args.runs):
                for kind in ("store", "minimal", "raw"):
                    threads = [f"t{uuid.uuid4().hex[:8]}" for _ in range(args.threads)]
                    await admin.config_resetstat()
                    before = await redis_cpu(admin)
                    if kind == "store":
                        seconds = await run_store(url, threads, args.events, batch, args.ttl)
                    elif kind == "minimal":
                        seconds = await run_minimal(admin, threads, args.events, batch)
                    else:
                        seconds = await run_raw(admin, threads, args.events, batch)
                    used = await redis_cpu(admin) - before
                    calls = args.threads * -(-args.events // batch)
                    rates[kind].append(calls / seconds)
                    per_event[kind].append(used / (args.threads * args.events) * 1e6)
                    if kind == "store" and args.commandstats:
                        for name, row in (await admin.info("commandstats")).items():
                            stats[name] = stats.get(name, 0.0) + row["usec"]
            med = {k: statistics.median(v) for k, v in per_event.items()}
            rate = {k: statistics.median(v) for k, v in rates.items()}
            print(
                f"| {batch} | {med['store']:.1f} us | {med['minimal']:.1f} us | "
                f"{med['raw']:.1f} us | {med['store'] / med['minimal']:.2f} | "
                f"{med['store'] / med['raw']:.2f} | {rate['store']:,.0f} | {rate['raw']:,.0f} | "
                f"{rate['store'] / rate['raw']:.2f} |"
            )
            if args.commandstats:
                events = args.threads * args.events * args.runs
                top = sorted(stats.items(), key=lambda kv: -kv[1])[:14]
                print("  store, Redis microseconds per event by command: " + ", ".join(
                    f"{name.removeprefix('cmdstat_')} {usec / events:.2f}" for name, usec in top
                ))  # fmt: skip
        await admin.flushall()
    finally:
        await admin.aclose()
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
