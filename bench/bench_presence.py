"""Presence (issue 30): what it costs Redis and the gateways, against presence off.

Usage::

    python bench/bench_presence.py [--runs 3] [--connections 1000] [--threads 100]
        [--seconds 30] [--rate 100] [--leave 500] [--cases off,on,quiet]

Starts its own redis-server (loopback, no persistence) and, per case, two
gateway processes on it (``python -m agui_hub.cli serve --presence ...
--presence-interval 1 --presence-ttl 15``: presence is across gateways), then
from this process (raw asyncio WebSocket clients of ``bench_gateway.py``, JSON,
event frames counted, not decoded):

1. join storm: ``--connections`` connections, half on each gateway, opened and
   each subscribed (``from: live``) to one of ``--threads`` threads (each
   thread's connections alternate between the gateways), all subscribes sent
   at once;
2. steady state: ``--seconds`` seconds of ``--rate`` single-event publishes per
   second (TEXT_MESSAGE_CONTENT, round robin over the threads, from one
   publishing connection per gateway); every delivery is counted;
3. leave storm: ``--leave`` connections closed at once (the last ones of each
   thread, so from both gateways).

Cases: ``off`` (``--presence off``; the subscribes still ask ``presence:
true``, as the same client would, and get the ``off`` frame), ``on``
(``--presence full``, every subscribe asks ``presence: true``: every
connection watches its thread) and ``quiet`` (``--presence full``, nobody asks:
only the writes and refreshes of entries). The cases take turns going first
from one run to the next.

Per phase: Redis commands (``INFO commandstats`` deltas: every command,
those run inside scripts included; EVALSHA apart, and the calls of the
presence update script among them: PEXPIRE / 4, as only that script calls
PEXPIRE, on its four keys; the entries it put: ZADD - HSET), Redis CPU (``INFO
cpu`` user + sys), the CPU of both gateways (``/proc/<pid>/stat``), and the
gateways' presence store calls (their ``/metrics``). For the storms: wall time, and with
watchers the time until every watcher's latest ``count`` is right, the
``joined`` / ``left`` frames each watcher got and the entries they named. For
the steady state: per second, and ``connected_clients`` (without this
script's own connection) before the join storm and at most during the steady
state. After the measurements, with presence on, one ``presence`` command per
thread checks the counts.

The storm windows run from the first connect (the close) until everything is
done (every subscribe answered; the counts right, with watchers) and 0.5 s
more for the coalesced writes, at least 2 s after the last subscribe
(2.5 s after the close) in every case, so that the cases compare: they
include the polls of that time, and whatever refresh (every ttl / 3 = 5 s per
gateway) falls in them: the steady state lasting a multiple of 5 s, it is
much the same from one run to the next. One redis-server serves every run:
the first presence case of an invocation pays the scripts' first load (a
NOSCRIPT reply, SCRIPT LOAD, the calls again).

Prints each run, then a Markdown table: the median of ``--runs`` runs per
case (the runs after it), and the ratio on / off. Not part of the test suite;
bounded (every wait has a timeout; every loop a count).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis
from bench_gateway import HOST, Child, Client, cpu_seconds, settle, start_child
from bench_gateway import connect as open_clients
from bench_store import free_port, start_redis  # the same redis-server, no persistence

WAIT = 30.0
"""Seconds any one wait of this script may take at most."""
TAIL = 0.5
"""Seconds a storm window goes on after everything is seen done."""
MIN_JOIN_WINDOW = 2.0
MIN_LEAVE_WINDOW = 2.5
CASES = {
    # name: (--presence, subscribes ask presence: true)
    "off": ("off", True),
    "on": ("full", True),
    "quiet": ("full", False),
}
PRESENCE_FRAMES = {"presence", "joined", "left"}


class Viewer(Client):
    """A subscribed connection: presence frames without an id are kept, with their time."""

    def __init__(self, port: int, encoding: str) -> None:
        super().__init__(port, encoding)
        self.seen: list[tuple[float, dict[str, Any]]] = []

    def reply(self, frame: dict[str, Any]) -> None:
        if frame.get("type") in PRESENCE_FRAMES and "id" not in frame:
            self.seen.append((time.perf_counter(), frame))
        else:
            self.replies.put_nowait(frame)

    def presence_count(self) -> int | None:
        """The thread's count as last told (``None``: nothing told yet)."""
        for _, frame in reversed(self.seen):
            if "count" in frame:
                return int(frame["count"])
        return None


class Publisher(Client):
    """A publishing connection: its replies are counted, not queued."""

    def __init__(self, port: int, encoding: str) -> None:
        super().__init__(port, encoding)
        self.published = 0
        self.errors: list[dict[str, Any]] = []

    def reply(self, frame: dict[str, Any]) -> None:
        if frame.get("type") == "published":
            self.published += 1
        elif frame.get("type") == "error":
            self.errors.append(frame)
        else:
            self.replies.put_nowait(frame)


# -- measuring ---------------------------------------------------------------------------------


class Meter:
    """Redis commands and CPU, gateway CPU and presence store calls, between two points."""

    def __init__(self, admin: redis.Redis, gateways: Sequence[Child]) -> None:
        self.admin = admin
        self.gateways = gateways
        self.start = self.read()

    def read(self) -> dict[str, Any]:
        stats = self.admin.info("commandstats")
        cpu = self.admin.info("cpu")
        return {
            "t": time.perf_counter(),
            "calls": {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()},
            "redis_cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            "gw_cpu": sum(cpu_seconds(g.pid) for g in self.gateways),
            "store": [store_calls(g.port) for g in self.gateways],
        }

    def stop(self) -> dict[str, Any]:
        end, start = self.read(), self.start
        calls = {
            name: n - start["calls"].get(name, 0)
            for name, n in end["calls"].items()
            if n - start["calls"].get(name, 0) > 0
        }
        calls.pop("info", None)  # this meter's own
        store: dict[str, int] = {}
        for before, after in zip(start["store"], end["store"], strict=True):
            for op, n in after.items():
                store[op] = store.get(op, 0) + n - before.get(op, 0)
        return {
            "seconds": end["t"] - start["t"],
            "calls": calls,
            "total": sum(calls.values()),
            "evalsha": calls.get("evalsha", 0),
            # Only the presence update script calls PEXPIRE: four keys per call
            # (the append path and the read script do not).
            "updates": calls.get("pexpire", 0) / 4,
            # Each entry put is one ZADD of its expiry; one written whole (a join, a
            # change) also a ZADD of joined and an HSET: ZADD - HSET counts them all.
            "entries_put": calls.get("zadd", 0) - calls.get("hset", 0),
            "redis_cpu": end["redis_cpu"] - start["redis_cpu"],
            "gw_cpu": end["gw_cpu"] - start["gw_cpu"],
            "store": store,
        }


def store_calls(port: int) -> dict[str, int]:
    """The gateway's presence store calls so far, by operation (its ``/metrics``)."""
    with socket.create_connection((HOST, port), timeout=5) as sock:
        sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
        chunks = []
        for _ in range(10_000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    text = b"".join(chunks).decode(errors="replace")
    out = {}
    for m in re.finditer(
        r'^agui_hub_store_latency_seconds_count\{operation="(presence\w*)"\} (\S+)$', text, re.M
    ):
        out[m.group(1)] = int(float(m.group(2)))
    return out


def clients(admin: redis.Redis) -> int:
    """Redis client connections, without this script's own."""
    return int(admin.info("clients")["connected_clients"]) - 1


async def wait_until(check: Any, seconds: float = WAIT) -> float | None:
    """Seconds until ``check()`` holds (polled every 10 ms), ``None`` past *seconds*."""
    start = time.perf_counter()
    for _ in range(int(seconds / 0.01) + 1):
        if check():
            return time.perf_counter() - start
        await asyncio.sleep(0.01)
    return None


# -- one case ----------------------------------------------------------------------------------


def start_gateways(url: str, presence: str, count: int = 2) -> list[Child]:
    gateways: list[Child] = []
    try:
        for i in range(count):
            port = free_port()
            argv = [sys.executable, "-m", "agui_hub.cli", "serve", "--host", HOST,
                    "--port", str(port), "--store", url, "--log-level", "WARNING",
                    "--max-connections-per-address", "100000", "--presence", presence,
                    "--presence-interval", "1", "--presence-ttl", "15"]  # fmt: skip
            gateways.append(start_child(f"gateway{i}", argv, port, "/readyz"))
    except BaseException:
        for g in gateways:
            g.stop()
        raise
    return gateways


async def case(name: str, url: str, args: argparse.Namespace, admin: redis.Redis) -> dict[str, Any]:
    mode, ask = CASES[name]
    n, per = args.connections, args.connections // args.threads
    tag = uuid.uuid4().hex[:6]
    threads = [f"pr-{tag}-{i}" for i in range(args.threads)]
    gateways = start_gateways(url, mode)
    viewers: list[Viewer] = []
    pubs: list[Publisher] = []
    out: dict[str, Any] = {"case": name, "problems": []}
    problems: list[str] = out["problems"]
    try:
        ports = [g.port for g in gateways]
        # Every thread has a run and a message open, published before anything is measured.
        pubs = [(await open_clients(p, 1, "json", Publisher))[0] for p in ports]  # type: ignore[misc]
        for i, t in enumerate(threads):
            opening = [
                {"type": "RUN_STARTED", "threadId": t, "runId": "r"},
                {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
            ]
            pubs[i % 2].send({"type": "publish", "id": f"s{i}", "thread": t, "events": opening})
        if await wait_until(lambda: sum(p.published for p in pubs) >= len(threads)) is None:
            raise RuntimeError(f"setup publishes not answered: {[p.errors for p in pubs]}")
        await settle([g.pid for g in gateways])
        out["clients_idle"] = clients(admin)

        # -- 1. join storm -----------------------------------------------------------------
        meter = Meter(admin, gateways)
        t0 = time.perf_counter()
        halves = await asyncio.gather(
            *(open_clients(p, n // 2 + (i < n % 2), "json", Viewer) for i, p in enumerate(ports))
        )
        # Connection c of the storm: thread c // per, gateway c % 2.
        viewers = [halves[c % 2][c // 2] for c in range(n)]  # type: ignore[misc]
        frame: dict[str, Any] = {"type": "subscribe", "id": 1, "from": "live"}
        if ask:
            frame["presence"] = True
        for c, v in enumerate(viewers):
            v.send({**frame, "thread": threads[c // per]})
        replies = await asyncio.wait_for(asyncio.gather(*(v.replies.get() for v in viewers)), WAIT)
        subscribed = time.perf_counter() - t0
        bad = [r for r in replies if r.get("type") != "subscribed"]
        if bad:
            problems.append(f"join: {len(bad)} subscribes not answered subscribed: {bad[:3]}")
        converged = None
        if name == "on":
            converged = await wait_until(lambda: all(v.presence_count() == per for v in viewers))
            if converged is None:
                counts = sorted({v.presence_count() for v in viewers}, key=str)
                problems.append(f"join: counts never all {per} within {WAIT} s: {counts}")
            else:
                converged = time.perf_counter() - t0
        done = max(subscribed + MIN_JOIN_WINDOW, (converged or subscribed) + TAIL)
        await asyncio.sleep(max(0.0, t0 + done - time.perf_counter()))
        join = meter.stop()
        out["join_s"] = subscribed
        out["join_counts_s"] = converged
        out["join"] = join
        if name == "on":
            out["join_frames"] = statistics.median(
                sum(f["type"] == "joined" for _, f in v.seen) for v in viewers
            )
        if name == "off":
            offs = sum(any(f.get("off") for _, f in v.seen) for v in viewers)
            if offs != n:
                problems.append(
                    f"join: {n - offs} of {n} presence:true subscribes had no off frame"
                )

        # -- 2. steady state ---------------------------------------------------------------
        total = int(args.rate * args.seconds)
        expected = [0] * len(threads)
        for k in range(total):
            expected[k % len(threads)] += 1
        for c, v in enumerate(viewers):
            v.arm(expected[c // per])
        for p in pubs:
            p.published = 0
        await settle([g.pid for g in gateways], timeout=3)
        meter = Meter(admin, gateways)
        peak_clients = clients(admin)
        t1 = time.perf_counter()
        sent = 0
        next_sample = t1 + 1.0
        for _ in range(int(args.seconds * 200) + 2000):
            now = time.perf_counter()
            due = min(total, int((now - t1) * args.rate))
            while sent < due:
                t = threads[sent % len(threads)]
                ev = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f" w{sent}"}
                pubs[(sent // len(threads)) % 2].send(
                    {"type": "publish", "id": sent, "thread": t, "events": [ev]}
                )
                sent += 1
            if now >= next_sample:
                peak_clients = max(peak_clients, clients(admin))
                next_sample += 1.0
            if sent >= total and now - t1 >= args.seconds:
                break
            await asyncio.sleep(0.005)
        steady = meter.stop()
        out["steady"] = steady
        out["clients_peak"] = peak_clients
        await wait_until(lambda: all(v.done.done() for v in viewers), 5)
        delivered = sum(v.count for v in viewers)
        want = sum(expected[c // per] for c in range(n))
        if delivered != want or sum(p.published for p in pubs) != total:
            problems.append(
                f"steady: {delivered} of {want} deliveries, "
                f"{sum(p.published for p in pubs)} of {total} publishes answered, "
                f"errors {[p.errors[:2] for p in pubs]}"
            )
        for v in viewers:
            v.counting = False  # late frames are replies again (none expected)

        # -- 3. leave storm ----------------------------------------------------------------
        leaving = [v for c, v in enumerate(viewers) if c % per >= per - args.leave // args.threads]
        staying = [v for v in viewers if v not in set(leaving)]
        remain = per - args.leave // args.threads
        marks = {id(v): len(v.seen) for v in staying}
        await settle([g.pid for g in gateways], timeout=3)
        meter = Meter(admin, gateways)
        t2 = time.perf_counter()
        for v in leaving:
            v.close()
        await asyncio.wait([v.closed for v in leaving], timeout=WAIT)
        closed = time.perf_counter() - t2
        left_counts = None
        if name == "on":
            left_counts = await wait_until(
                lambda: all(v.presence_count() == remain for v in staying)
            )
            if left_counts is None:
                counts = sorted({v.presence_count() for v in staying}, key=str)
                problems.append(f"leave: counts never all {remain} within {WAIT} s: {counts}")
            else:
                left_counts = time.perf_counter() - t2
        done = max(MIN_LEAVE_WINDOW, (left_counts or closed) + TAIL)
        await asyncio.sleep(max(0.0, t2 + done - time.perf_counter()))
        out["leave"] = meter.stop()
        out["leave_closed_s"] = closed
        out["leave_counts_s"] = left_counts
        if name == "on":
            after = [[f for _, f in v.seen[marks[id(v)] :]] for v in staying]
            lefts = [sum(f["type"] == "left" for f in fs) for fs in after]
            named = [sum(len(f["entries"]) for f in fs if f["type"] == "left") for fs in after]
            others = sum(f["type"] != "left" for fs in after for f in fs)
            out["left_frames"] = (min(lefts), statistics.median(lefts), max(lefts))
            out["left_named"] = (min(named), max(named))
            if others or min(named) != per - remain or max(named) != per - remain:
                problems.append(
                    f"leave: entries named per watcher {min(named)}..{max(named)} "
                    f"(want {per - remain}), {others} frames other than left"
                )
        if mode != "off":
            # The counts as the presence command reads them, one per thread.
            wrong = []
            for i, t in enumerate(threads):
                v = viewers[i * per]
                reply = await v.command(
                    {"type": "presence", "id": f"p{i}", "thread": t}, "presence", WAIT
                )
                if reply["count"] != remain:
                    wrong.append((t, reply["count"]))
            if wrong:
                problems.append(f"presence command: counts not {remain}: {wrong[:5]}")
        for g in gateways:
            with open(g.log, errors="replace") as f:
                text = f.read()
            if "Traceback" in text or " ERROR " in text:
                problems.append(f"{g.name} logged errors:\n{g.tail()}")
        return out
    finally:
        for c in [*viewers, *pubs]:
            c.close()
        with contextlib.suppress(Exception):
            await asyncio.wait([c.closed for c in [*viewers, *pubs]], timeout=10)
        for g in gateways:
            g.stop()


# -- report ------------------------------------------------------------------------------------


def figures(r: dict[str, Any], off: dict[str, Any] | None) -> dict[str, float]:
    """The table's figures of one case's run (nan: not measured in that case). *off*:
    the off case of the same run (its EVALSHA are the publish load's, not presence's)."""
    s, j, lv = r["steady"], r["join"], r["leave"]
    sec = s["seconds"]
    nan = float("nan")
    base = off["steady"]["evalsha"] / off["steady"]["seconds"] if off is not None else nan
    out = {
        "join storm: wall s (all subscribed)": r["join_s"],
        "join storm: s until every count is right": r.get("join_counts_s") or nan,
        "join storm: window s": j["seconds"],
        "join storm: Redis commands": j["total"],
        "join storm: EVALSHA (update script + read script)": j["evalsha"],
        "join storm: update script calls": j["updates"],
        "join storm: entries put (ZADD - HSET)": j["entries_put"],
        "join storm: Redis CPU s": j["redis_cpu"],
        "join storm: gateway CPU s (both)": j["gw_cpu"],
        "steady: Redis commands/s": s["total"] / sec,
        "steady: EVALSHA/s": s["evalsha"] / sec,
        "steady: update script calls/s": s["updates"] / sec,
        "steady: read script calls/s (EVALSHA - updates - off's EVALSHA)": (
            s["evalsha"] - s["updates"]
        )
        / sec
        - base,
        "steady: store calls/s, presence_update (both gateways)": s["store"].get(
            "presence_update", 0
        )
        / sec,
        "steady: store calls/s, presence (both gateways)": s["store"].get("presence", 0) / sec,
        "steady: Redis CPU ms/s": s["redis_cpu"] / sec * 1e3,
        "steady: gateway CPU ms/s (both)": s["gw_cpu"] / sec * 1e3,
        "Redis connected_clients before the join storm": r["clients_idle"],
        "Redis connected_clients, steady peak": r["clients_peak"],
        "leave storm: window s": lv["seconds"],
        "leave storm: Redis commands": lv["total"],
        "leave storm: EVALSHA": lv["evalsha"],
        "leave storm: update script calls": lv["updates"],
        "leave storm: entries put (ZADD - HSET: refreshes)": lv["entries_put"],
        "leave storm: store calls, presence_update (both gateways)": lv["store"].get(
            "presence_update", 0
        ),
        "leave storm: Redis CPU s": lv["redis_cpu"],
        "leave storm: gateway CPU s (both)": lv["gw_cpu"],
        "leave storm: s until every count is right": r.get("leave_counts_s") or nan,
        "leave storm: left frames per watcher (max)": r["left_frames"][2]
        if "left_frames" in r
        else nan,
        "leave storm: entries named in left frames per watcher (min)": r["left_named"][0]
        if "left_named" in r
        else nan,
    }
    if r["case"] == "off":
        out["steady: read script calls/s (EVALSHA - updates - off's EVALSHA)"] = nan
    return out


def show(value: float) -> str:
    if value != value:  # nan
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    names = list(results)
    rows: dict[str, dict[str, list[float]]] = {}
    offs = results.get("off", [])
    for name, runs in results.items():
        for i, r in enumerate(runs):
            for k, v in figures(r, offs[i] if i < len(offs) else None).items():
                rows.setdefault(k, {}).setdefault(name, []).append(v)
    head = " | ".join(f"{n} (median; runs)" for n in names)
    ratio = "on" in names and "off" in names
    print(f"\n| figure | {head} |" + (" on / off |" if ratio else ""))
    print("| --- |" + " --- |" * (len(names) + ratio))
    for k, per in rows.items():
        cells = []
        med: dict[str, float] = {}
        for n in names:
            vals = per.get(n, [])
            med[n] = statistics.median(vals) if vals else float("nan")
            cells.append(f"**{show(med[n])}** ({', '.join(show(v) for v in vals)})")
        line = f"| {k} | " + " | ".join(cells) + " |"
        if ratio:
            on, off = med["on"], med["off"]
            ok = off == off and on == on and off > 0
            line += f" {on / off:.2f} |" if ok else " - |"
        print(line)
    # What the steady-state commands are: per second, median over the runs, by command.
    print("\nsteady state, Redis calls per second by command (median of the runs):")
    commands = sorted({c for runs in results.values() for r in runs for c in r["steady"]["calls"]})
    print("| command | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for c in commands:
        vals = [
            statistics.median(r["steady"]["calls"].get(c, 0) / r["steady"]["seconds"] for r in runs)
            for runs in results.values()
        ]
        if max(vals) >= 0.5:
            print(f"| {c} | " + " | ".join(f"{v:,.1f}" for v in vals) + " |")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="publishes per second")
    parser.add_argument("--leave", type=int, default=500)
    parser.add_argument("--cases", default="off,on,quiet")
    args = parser.parse_args()
    if args.connections % args.threads or args.leave % args.threads:
        raise SystemExit("--connections and --leave must be multiples of --threads")
    if args.leave >= args.connections:
        raise SystemExit("--leave must leave someone")
    names = args.cases.split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {list(CASES)}")
    proc, url = start_redis()
    admin = redis.Redis.from_url(url)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    failed = False
    try:
        for run in range(args.runs):
            order = names[run % len(names) :] + names[: run % len(names)]
            for name in order:
                r = await case(name, url, args, admin)
                results[name].append(r)
                s = r["steady"]
                print(
                    f"run {run + 1} {name:5}: join {r['join_s']:.2f} s"
                    + (f" (counts right {r['join_counts_s']:.2f} s)" if r.get("join_counts_s")
                       else "")
                    + f", {r['join']['total']} cmds ({r['join']['evalsha']} EVALSHA, "
                    f"store {r['join']['store']}); "
                    f"steady {s['total'] / s['seconds']:.0f} cmds/s "
                    f"({s['evalsha'] / s['seconds']:.1f} EVALSHA/s, store {s['store']}), "
                    f"Redis CPU {s['redis_cpu'] / s['seconds'] * 1e3:.1f} ms/s, "
                    f"gateways {s['gw_cpu'] / s['seconds'] * 1e3:.1f} ms/s, "
                    f"clients {r['clients_idle']}/{r['clients_peak']}; "
                    f"leave {r['leave']['total']} cmds ({r['leave']['evalsha']} EVALSHA, "
                    f"store {r['leave']['store']})"
                    + (f", counts right {r['leave_counts_s']:.2f} s, left frames "
                       f"{r['left_frames']}, named {r['left_named']}" if r.get("leave_counts_s")
                       else ""),
                    flush=True,
                )  # fmt: skip
                for problem in r["problems"]:
                    failed = True
                    print(f"  PROBLEM: {problem}", flush=True)
    finally:
        admin.close()
        proc.terminate()
        proc.wait(10)
    if any(results.values()):
        report({n: rs for n, rs in results.items() if rs})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
