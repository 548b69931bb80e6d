"""Thread store throughput against raw Redis, and connections per live thread.

Usage::

    python bench/bench_store.py [--events 20000] [--runs 5] [--threads 1,100,10000]

Starts its own redis-server on a free loopback port (no persistence) and
measures, in the same run and with the same bytes:

* append, one event per call: ``RedisStore.append`` (Lua script: idempotency
  check, XADD, trim, TTL, notify) vs raw pipelined ``XADD`` with redis-py;
* append, batches of 100 events per call vs the same raw pipelined ``XADD``;
* catch-up read of a whole stream: ``RedisStore.read`` vs raw ``XRANGE`` in
  pages of the same size;
* Redis client connections of the process (``CLIENT LIST``) with 1, 100 and
  10,000 live threads (one subscription each).

The raw ceilings do less work (no idempotency, no trimming, no decoding into
entries); the ratio says what that costs. Prints medians of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from typing import Any

import msgpack
import redis.asyncio as aioredis

from agui_hub.store.contract import START, EventInput, Retention
from agui_hub.store.redis import RedisStore, stream_key

PIPELINE_DEPTH = 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="agui-bench-")
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def events(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "msg-1", "delta": f" token{i % 50}",
         "timestamp": 1764700000000 + i}
        for i in range(n)
    ]  # fmt: skip


async def raw_xadd(client: aioredis.Redis, key: str, payloads: list[bytes], batch: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(payloads), batch):
        pipe = client.pipeline(transaction=False)
        for j, payload in enumerate(payloads[i : i + batch]):
            pipe.xadd(key, {"event": payload, "id": f"{i + j}", "run": "", "type": "T"})
        await pipe.execute()
    return len(payloads) / (time.perf_counter() - start)


async def store_append(
    store: RedisStore, thread: str, items: list[EventInput], batch: int
) -> float:
    start = time.perf_counter()
    if batch == 1:
        # One event per call, PIPELINE_DEPTH calls in flight (as concurrent publishers would).
        for i in range(0, len(items), PIPELINE_DEPTH):
            await asyncio.gather(
                *(store.append(thread, [it]) for it in items[i : i + PIPELINE_DEPTH])
            )
    else:
        for i in range(0, len(items), batch):
            await store.append(thread, items[i : i + batch])
    return len(items) / (time.perf_counter() - start)


async def raw_xadd_sequential(client: aioredis.Redis, key: str, payloads: list[bytes]) -> float:
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        await client.xadd(key, {"event": payload, "id": f"{i}", "run": "", "type": "T"})
    return len(payloads) / (time.perf_counter() - start)


async def store_append_sequential(store: RedisStore, thread: str, items: list[EventInput]) -> float:
    start = time.perf_counter()
    for item in items:
        await store.append(thread, [item])
    return len(items) / (time.perf_counter() - start)


async def raw_xrange(client: aioredis.Redis, key: str, page: int) -> float:
    start = time.perf_counter()
    cursor, count = "-", 0
    while True:
        entries = await client.xrange(key, min=cursor, count=page)
        count += len(entries)
        if len(entries) < page:
            break
        cursor = "(" + entries[-1][0].decode()
    return count / (time.perf_counter() - start)


async def store_read(store: RedisStore, thread: str) -> float:
    start = time.perf_counter()
    entries = await store.read(thread, after=START)
    return len(entries) / (time.perf_counter() - start)


async def client_count(admin: aioredis.Redis) -> int:
    me = await admin.client_id()
    return sum(1 for c in await admin.client_list() if int(c["id"]) != me)


async def connections_per_live_threads(url: str, counts: list[int]) -> dict[int, int]:
    admin = aioredis.Redis.from_url(url)
    out = {}
    for n in counts:
        base = await client_count(admin)  # connections that are not the store's
        store = RedisStore(url, prefix=f"conn{n}", retention=Retention(max_len=0))
        feeds = [store.subscribe(f"thread-{i}") for i in range(n)]
        for i in range(0, n, 500):
            await asyncio.gather(*(feed.open() for feed in feeds[i : i + 500]))
        # Some traffic on every thread, so every connection has been used.
        for i in range(0, n, 500):
            await asyncio.gather(
                *(store.append(f"thread-{j}", [EventInput.of(events(1)[0])])
                  for j in range(i, min(n, i + 500)))
            )  # fmt: skip
        # The pool grows with concurrency up to its bound, whatever the number of
        # threads: reach that bound first, so the count compares like with like.
        await asyncio.gather(*(store.ping() for _ in range(200)))
        out[n] = await client_count(admin) - base
        for feed in feeds:
            await feed.close()
        await store.close()
        # Let Redis see the connections of this measurement close before the next.
        for _ in range(50):
            if await client_count(admin) <= base:
                break
            await asyncio.sleep(0.1)
    await admin.aclose()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", default="1,100,10000")
    args = parser.parse_args()

    proc, url = start_redis()
    try:
        client = aioredis.Redis.from_url(url)
        wire = events(args.events)
        payloads = [msgpack.packb(e) for e in wire]
        results: dict[str, list[float]] = {}

        def record(name: str, value: float) -> None:
            results.setdefault(name, []).append(value)

        for run in range(args.runs):
            # Unlimited retention: the raw XADD ceiling does not trim either.
            store = RedisStore(url, prefix=f"bench{run}", retention=Retention(max_len=0))
            items = [EventInput.of(e, f"r{run}-{i}") for i, e in enumerate(wire)]
            record("raw xadd", await raw_xadd(client, f"raw{run}:single", payloads, PIPELINE_DEPTH))
            record("append x1", await store_append(store, "single", items, 1))
            few = max(1, len(wire) // 10)  # one round trip each: a tenth is enough
            record(
                "raw xadd seq", await raw_xadd_sequential(client, f"raw{run}:seq", payloads[:few])
            )
            seq_items = [EventInput.of(e, f"s{run}-{i}") for i, e in enumerate(wire[:few])]
            record("append seq", await store_append_sequential(store, "sequential", seq_items))
            items = [EventInput.of(e, f"b{run}-{i}") for i, e in enumerate(wire)]
            record("append x100", await store_append(store, "batched", items, 100))
            # Reads do not change the data: alternate them, best of three each.
            raw_rates, store_rates = [], []
            for _ in range(3):
                key = stream_key(f"bench{run}", "batched")
                raw_rates.append(await raw_xrange(client, key, 5000))
                store_rates.append(await store_read(store, "batched"))
            record("raw xrange", max(raw_rates))
            record("store read", max(store_rates))
            await store.close()
            await client.flushdb()
        med = {k: statistics.median(v) for k, v in results.items()}
        print(f"{args.events} events, median of {args.runs} runs (events/s)")
        for name, rate in med.items():
            print(f"  {name:14s} {rate:>12,.0f}")
        print(
            f"append, 1 event per call, one at a time / raw XADD one at a time: "
            f"{med['append seq'] / med['raw xadd seq']:.2f}"
        )
        print(
            f"append, 1 event per call, 100 in flight / raw pipelined XADD: "
            f"{med['append x1'] / med['raw xadd']:.2f}"
        )
        print(
            f"append, 100 events per call / raw pipelined XADD: "
            f"{med['append x100'] / med['raw xadd']:.2f}"
        )
        print(f"catch-up read / raw XRANGE: {med['store read'] / med['raw xrange']:.2f}")
        counts = [int(x) for x in args.threads.split(",")]
        conns = await connections_per_live_threads(url, counts)
        for n, c in conns.items():
            print(f"Redis connections with {n:>6} live threads: {c}")
        await client.aclose()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    asyncio.run(main())
