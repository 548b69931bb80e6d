"""The work one publish may cause: CPU and event-loop stall of the copy/remove attack.

Usage::

    python bench/bench_budget.py [--deltas 300] [--entries 9000] [--runs 3]
                                 [--store memory,redis] [--profile]
    python bench/bench_budget.py --calibrate

Starts a gateway in this process on a free loopback port (and its own
redis-server for ``redis``), then, per run, on a fresh thread:

1. a viewer subscribes (so the fan-out folds every event too);
2. a publisher sends ``STATE_SNAPSHOT {"s": {9000 keys of 90-character
   strings}}`` (0.9 MB; ``--entries`` keys, of 40 characters past 9000 so
   that the event stays under 1 MiB);
3. it sends one publish of ``--deltas`` STATE_DELTA events, each
   ``[{"op": "copy", "from": "/s", "path": "/t"}, {"op": "remove", "path": "/t"}]``,
   while another connection sends a ``ping`` every 5 ms and times each pong.

Prints, per store, the median over ``--runs`` of: the process CPU the
publish cost (gateway and clients; the clients' share is small), its wall
time, the reply (``published`` or the error code), and the longest pong
wait, against the ceiling measured in the same run: the longest pong wait
while the same publisher sends as many small TEXT_MESSAGE_CONTENT events.
With ``--profile``, the CPU of the attack is split by where it goes (the
writer's judgement, the fan-out's fold, the store, the rest).

``--deltas 300`` is the issue's attack (refused at the budget since it
exists); ``--deltas 1 --entries 12468`` the heaviest publish of one copy and
one removal the default budget (50,000 units) allows.

``--sustained SECONDS`` measures instead the CPU one connection can take per
second: it sends, for that long, the heaviest publish the budget allows
(``--entries 12468``, one copy and one removal) and the 300-delta attack in
turn, as fast as the gateway lets it (its work rate paces it), while a
viewer follows the thread; prints the process CPU per wall second, and the
longest pong wait meanwhile.

``--frame`` measures what no work budget bounds, for comparison: the
longest pong wait while the gateway parses, validates, stores and relays one
publish of a CUSTOM event whose value is as many empty arrays as a 1 MiB
msgpack frame holds (the cheapest bytes for the most values), a viewer
following the thread in JSON; ``--values N`` sends N empty arrays instead
(``--values 99980``: the most a frame may hold, 100,000 values, with the
rest of the publish).

``--calibrate`` prints, for the kinds of work a patch is charged for, the
nanoseconds of CPU per work unit (best of 5; the units are meant to cost
about the same whatever the shape of the values).

Not part of the test suite; bounded (each publish waits 120 s at most, the
pinger sends at most 20,000 pings per publish).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import json
import math
import pstats
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgpack
from bench_store import free_port, start_redis  # the same redis-server, no persistence
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as sync_connect

from agui_hub.agui.patch import StateLimits, UndoLog, WorkBudget, apply_patch, snapshot_document
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore

JSON = "agui-hub.v1.json"
MSGPACK = "agui-hub.v1.msgpack"
WAIT = 120.0


async def request(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send a command, return its reply (other frames are dropped)."""
    await ws.send(json.dumps(frame))
    deadline = time.monotonic() + WAIT
    while True:
        reply = json.loads(await asyncio.wait_for(ws.recv(), deadline - time.monotonic()))
        if reply.get("id") == frame["id"]:
            return reply  # type: ignore[no-any-return]


async def drain(ws: ClientConnection, stop: asyncio.Event) -> None:
    """A viewer that reads whatever comes, so that its queue never fills."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(ws.recv(), 0.2)
        except TimeoutError:
            continue
        except ConnectionClosed:
            return


def pinger(url: str, stop: threading.Event, waits: list[float]) -> None:
    """Ping every 5 ms from a thread of its own (its own connection and loop):
    each pong's wait is how long the gateway's event loop kept it waiting."""
    with sync_connect(url, subprotocols=[JSON], proxy=None) as ws:  # type: ignore[list-item]
        for n in range(20_000):
            if stop.is_set():
                return
            sent = time.perf_counter()
            ws.send(json.dumps({"type": "ping", "id": f"p{n}"}))
            while json.loads(ws.recv(WAIT)).get("id") != f"p{n}":
                pass
            waits.append(time.perf_counter() - sent)
            time.sleep(0.005)


def big_snapshot(entries: int) -> dict[str, Any]:
    pad = "x" * (90 if entries <= 9000 else 40)
    return {"type": "STATE_SNAPSHOT", "snapshot": {"s": {f"k{i:05d}": pad for i in range(entries)}}}


def attack(deltas: int) -> list[dict[str, Any]]:
    patch = [{"op": "copy", "from": "/s", "path": "/t"}, {"op": "remove", "path": "/t"}]
    return [{"type": "STATE_DELTA", "delta": patch} for _ in range(deltas)]


def harmless(count: int) -> list[dict[str, Any]]:
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"w{i} "}
          for i in range(count - 2)),
        {"type": "TEXT_MESSAGE_END", "messageId": "m"},
    ]  # fmt: skip


async def timed_publish(
    gateway: Gateway, events: list[dict[str, Any]], profile: cProfile.Profile | None, entries: int
) -> tuple[float, float, str, float]:
    """(CPU s, wall s, reply, longest pong wait s) of one publish into a fresh thread."""
    url = f"ws://127.0.0.1:{gateway.config.port}/"
    thread = f"bench-{uuid.uuid4().hex[:8]}"
    async with (
        connect(url, subprotocols=[JSON], proxy=None, max_size=None) as pub,  # type: ignore[list-item]
        connect(url, subprotocols=[JSON], proxy=None) as viewer,  # type: ignore[list-item]
    ):
        reply = await request(viewer, {"type": "subscribe", "id": "s", "thread": thread})
        assert reply["type"] == "subscribed", reply
        stop = asyncio.Event()
        viewing = asyncio.create_task(drain(viewer, stop))
        reply = await request(
            pub,
            {
                "type": "publish",
                "id": "snap",
                "thread": thread,
                "events": [
                    {"type": "RUN_STARTED", "threadId": thread, "runId": "r"},
                    big_snapshot(entries),
                ],
            },
        )
        assert reply["type"] == "published", reply
        await asyncio.sleep(0.2)  # the viewer has the snapshot: nothing else runs
        waits: list[float] = []
        stop_pings = threading.Event()
        pinging = asyncio.create_task(asyncio.to_thread(pinger, url, stop_pings, waits))
        await asyncio.sleep(0.1)
        cpu, wall = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        reply = await request(
            pub, {"type": "publish", "id": "x", "thread": thread, "events": events}
        )
        await asyncio.sleep(0.2)  # the fan-out folds what was stored
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall - 0.2
        stop.set()
        stop_pings.set()
        await asyncio.gather(pinging, viewing)
        outcome = reply["type"] if reply["type"] != "error" else reply["code"]
        return cpu, wall, outcome, max(waits, default=0.0)


WHERE = {
    "writer judgement": ("gateway/writer.py", "agui/documents.py"),
    "fan-out fold": ("fanout/", "agui/reducer.py"),
    "store": ("store/",),
}


def split(profile: cProfile.Profile) -> dict[str, float]:
    """CPU seconds by where it goes: the cumulative time of the outermost frames
    of each part (a rough split; the rest is parsing, validation, sockets)."""
    stats = pstats.Stats(profile)
    total = stats.total_tt  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for name, entry in [
        ("writer judgement", ("agui_hub/gateway/writer.py", "_judge")),
        ("fan-out fold", ("agui_hub/gateway/fanout/entries.py", "fold")),
        ("store append", ("agui_hub/store/", "append")),
    ]:
        path, function = entry
        out[name] = max(
            (ct for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
             if path in file and fn == function),
            default=0.0,
        )  # fmt: skip
    out["total"] = total
    return out


async def sustained(
    store: ThreadStore, seconds: float, entries: int, publishers: int = 1, **config: Any
) -> float:
    """CPU per wall second while *publishers* connections publish into one thread."""
    gateway = Gateway(
        GatewayConfig(host="127.0.0.1", port=free_port(), ping_interval=None, **config),
        store=store,
    )
    await gateway.start()
    url = f"ws://127.0.0.1:{gateway.config.port}/"
    thread = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        async with contextlib.AsyncExitStack() as stack:
            pubs = [
                await stack.enter_async_context(
                    connect(url, subprotocols=[JSON], proxy=None, max_size=None)  # type: ignore[list-item]
                )
                for _ in range(publishers)
            ]
            viewer = await stack.enter_async_context(
                connect(url, subprotocols=[JSON], proxy=None)  # type: ignore[list-item]
            )
            await request(viewer, {"type": "subscribe", "id": "s", "thread": thread})
            stop = asyncio.Event()
            viewing = asyncio.create_task(drain(viewer, stop))
            run = {"type": "RUN_STARTED", "threadId": thread, "runId": "r"}
            frame = {"type": "publish", "id": "snap", "thread": thread,
                     "events": [run, big_snapshot(entries)]}  # fmt: skip
            assert (await request(pubs[0], frame))["type"] == "published"
            waits: list[float] = []
            stop_pings = threading.Event()
            pinging = asyncio.create_task(asyncio.to_thread(pinger, url, stop_pings, waits))
            await asyncio.sleep(0.1)
            replies: dict[str, int] = {}
            cpu, wall = time.process_time(), time.perf_counter()

            async def publishing(pub: ClientConnection) -> None:
                for n in range(100_000):
                    if time.perf_counter() - wall > seconds:
                        break
                    events = attack(1) if n % 2 == 0 else attack(300)
                    reply = await request(
                        pub, {"type": "publish", "id": f"x{n}", "thread": thread, "events": events}
                    )
                    outcome = reply["type"] if reply["type"] != "error" else reply["code"]
                    replies[outcome] = replies.get(outcome, 0) + 1

            await asyncio.gather(*(publishing(p) for p in pubs))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            stop.set()
            stop_pings.set()
            await asyncio.gather(pinging, viewing)
        print(
            f"{type(store).__name__:12} {publishers} connection(s) into one thread for "
            f"{wall:.1f} s{' ' + str(config) if config else ''}: "
            f"{cpu / wall:.2f} s of CPU per second; replies {replies}; "
            f"longest pong wait {max(waits) * 1e3:.1f} ms"
        )
        return cpu / wall
    finally:
        await gateway.drain()


async def sustained_pair(
    make_store: Callable[[], ThreadStore], seconds: float, entries: int, publishers: int
) -> None:
    """With several publishers: the thread's work rate against a ceiling measured
    in the same run, the same publishers with the thread's rate out of the way."""
    paced = await sustained(make_store(), seconds, entries, publishers)
    if publishers > 1:
        ceiling = await sustained(
            make_store(), seconds, entries, publishers, max_thread_state_work_per_second=1e12
        )
        print(f"  the thread's rate: {paced / ceiling:.2f} of the CPU without it")


async def largest_frame(store: ThreadStore, runs: int, values: int) -> None:
    gateway = Gateway(
        GatewayConfig(host="127.0.0.1", port=free_port(), ping_interval=None), store=store
    )
    await gateway.start()
    url = f"ws://127.0.0.1:{gateway.config.port}/"
    stalls: list[float] = []
    try:
        for n in range(runs):
            thread = f"bench-{uuid.uuid4().hex[:8]}"
            count = values or gateway.config.max_frame_bytes - 300
            event = {"type": "CUSTOM", "name": "x", "value": [[] for _ in range(count)]}
            run = {"type": "RUN_STARTED", "threadId": thread, "runId": "r"}
            frame = msgpack.packb(
                {"type": "publish", "id": f"f{n}", "thread": thread, "events": [run, event]}
            )
            async with (
                connect(url, subprotocols=[MSGPACK], proxy=None, max_size=None) as pub,  # type: ignore[list-item]
                connect(url, subprotocols=[JSON], proxy=None, max_size=None) as viewer,  # type: ignore[list-item]
            ):
                reply = await request(viewer, {"type": "subscribe", "id": "s", "thread": thread})
                assert reply["type"] == "subscribed", reply
                stop = asyncio.Event()
                viewing = asyncio.create_task(drain(viewer, stop))
                waits: list[float] = []
                stop_pings = threading.Event()
                pinging = asyncio.create_task(asyncio.to_thread(pinger, url, stop_pings, waits))
                await asyncio.sleep(0.1)
                await pub.send(frame)
                reply = msgpack.unpackb(await asyncio.wait_for(pub.recv(), WAIT))
                await asyncio.sleep(0.2)
                stop_pings.set()
                stop.set()
                await asyncio.gather(pinging, viewing)
                stalls.append(max(waits))
        print(
            f"{type(store).__name__:12} one {len(frame)}-byte frame of {count} empty arrays "
            "(a JSON viewer following): "
            f"reply {reply.get('code', reply['type'])}; "
            f"longest pong wait {statistics.median(stalls) * 1e3:.1f} ms"
        )
    finally:
        await gateway.drain()


async def bench(store: ThreadStore, deltas: int, entries: int, runs: int, profile: bool) -> None:
    gateway = Gateway(
        GatewayConfig(host="127.0.0.1", port=free_port(), ping_interval=None), store=store
    )
    await gateway.start()
    try:
        rows: list[tuple[float, float, str, float, float]] = []
        prof = cProfile.Profile() if profile else None
        for _ in range(runs):
            _c, _w, _o, ceiling = await timed_publish(gateway, harmless(deltas + 2), None, entries)
            cpu, wall, outcome, stall = await timed_publish(gateway, attack(deltas), prof, entries)
            rows.append((cpu, wall, outcome, stall, ceiling))
        cpu = statistics.median(r[0] for r in rows)
        wall = statistics.median(r[1] for r in rows)
        stall = statistics.median(r[3] for r in rows)
        ceiling = statistics.median(r[4] for r in rows)
        outcomes = ",".join(sorted({r[2] for r in rows}))
        print(
            f"{type(store).__name__:12} {deltas} deltas on {entries} entries: "
            f"CPU {cpu:.3f} s, wall {wall:.3f} s, "
            f"reply {outcomes}; longest pong wait {stall * 1e3:.1f} ms "
            f"(ceiling, {deltas} text events: {ceiling * 1e3:.1f} ms; "
            f"ratio {stall / max(ceiling, 1e-6):.1f})"
        )
        if prof is not None:
            parts = split(prof)
            print("  CPU by part over the runs: "
                  + ", ".join(f"{k} {v:.3f} s" for k, v in parts.items()))  # fmt: skip
    finally:
        await gateway.drain()


def calibrate() -> None:
    """ns of CPU per work unit, per kind of work (worst shapes, best of 5)."""
    limits = StateLimits(max_work=10**9, max_bytes=10**9, max_depth=1000)
    n = 200_000
    strings = {f"k{i:06d}": "x" * 90 for i in range(n)}
    cases: list[tuple[str, Any, list[dict[str, Any]], bool]] = [
        ("copy + remove an object of strings", {"s": strings},
         [{"op": "copy", "from": "/s", "path": "/t"}, {"op": "remove", "path": "/t"}], False),
        ("remove an array of []", {"s": [[] for _ in range(n)]},
         [{"op": "remove", "path": "/s"}], False),
        ("remove an array of integers", {"s": list(range(n))},
         [{"op": "remove", "path": "/s"}], False),
        ("remove an array of {}", {"s": [{} for _ in range(n)]},
         [{"op": "remove", "path": "/s"}], False),
        ("remove nested arrays", {"s": [[[[[[[[[[i]]]]]]]]] for i in range(n // 10)]},
         [{"op": "remove", "path": "/s"}], False),
        ("add a key: the path copied", {"s": strings},
         [{"op": "add", "path": "/s/new", "value": 1}], False),
        ("insert at 0 of a long array, x200", {"s": list(range(10 * n))},
         [{"op": "add", "path": "/s/0", "value": 1}] * 200, False),
        ("remove the first key, rolled back", {"s": strings},
         [{"op": "remove", "path": "/s/k000000"}], True),
    ]  # fmt: skip
    for name, state, patch, rollback in cases:
        best = math.inf
        spent = 0
        for _ in range(5):
            doc = snapshot_document(state, limits, "STATE_SNAPSHOT", "the state")
            undo, work = UndoLog(), WorkBudget(10**9)
            started = time.perf_counter()
            apply_patch(doc, patch, limits, undo, "STATE_DELTA", "the state", work)
            if rollback:
                undo.rollback()
            best = min(best, time.perf_counter() - started)
            spent = work.spent
        print(f"{name:38} {spent:>9} units {best * 1e3:7.1f} ms {best / spent * 1e9:6.0f} ns/unit")


def redis_store(kind: type[ThreadStore], url: str) -> ThreadStore:
    """A Redis store under a prefix of its own (each measurement on fresh keys)."""
    return kind(url, prefix=f"bench-{uuid.uuid4().hex[:8]}")  # type: ignore[call-arg]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deltas", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", default="memory,redis")
    parser.add_argument("--entries", type=int, default=9000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--publishers", type=int, default=1)
    parser.add_argument("--frame", action="store_true")
    parser.add_argument("--values", type=int, default=0, help="empty arrays in --frame's event")
    args = parser.parse_args()
    if args.calibrate:
        calibrate()
        return
    for kind in args.store.split(","):
        if kind == "memory" and args.frame:
            await largest_frame(MemoryStore(), args.runs, args.values)
        elif kind == "memory" and args.sustained:
            await sustained_pair(MemoryStore, args.sustained, args.entries, args.publishers)
        elif kind == "memory":
            await bench(MemoryStore(), args.deltas, args.entries, args.runs, args.profile)
        elif kind == "redis":
            from agui_hub.store.redis.store import RedisStore

            proc, url = start_redis()
            try:
                if args.frame:
                    await largest_frame(RedisStore(url, prefix="bench"), args.runs, args.values)
                    continue
                if args.sustained:
                    fresh = functools.partial(redis_store, RedisStore, url)
                    await sustained_pair(fresh, args.sustained, args.entries, args.publishers)
                    continue
                await bench(
                    RedisStore(url, prefix="bench"), args.deltas, args.entries, args.runs,
                    args.profile,
                )  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(10)
        else:
            raise SystemExit(f"unknown store {kind!r}")


if __name__ == "__main__":
    asyncio.run(main())
