"""The viewer page in headless Chromium against a bare page that only receives.

Usage::

    python bench/bench_viewer.py [--runs 3] [--agent-runs 30,300] [--batch 100]
        [--timeout 60] [--chromium PATH]

A real ``agui-hub serve`` process (in-memory store, a free loopback port)
serves the page; threads hold ``--agent-runs`` demo runs each (107 events a
run: streamed text, reasoning, two tool calls with results, state deltas,
steps). Two pages of one browser follow each thread:

* bare: a page that imports ``/agui-hub.js`` from the gateway, subscribes
  from "start" with the same client the viewer uses and counts the event
  items: receiving and decoding only, the ceiling;
* viewer: the viewer page (``/#thread=…``), done when its events line says
  every event was folded and rendered.

Two cases, each timed from its start to the moment each page has all the
events:

1. live: both pages follow the thread, then the events are published in
   batches of ``--batch`` as fast as the gateway takes them;
2. history: the events are stored, then both pages are opened (a reload of a
   long thread).

The ratio viewer / bare is taken run by run and reported as the median of
``--runs`` runs with its spread (min-max). The viewer's long tasks (main
thread busy for more than 50 ms, from the browser's ``longtask`` entries) are
reported too: their count, the longest, and the total blocking time (what
each spent past 50 ms), medians over the runs; and the bare page's blocking
time, what receiving alone costs the main thread. Every wait is bounded by
``--timeout`` seconds; everything stays on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from agui_hub.cli.demo import demo_run
from agui_hub.client.publisher import Publisher

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]

LONG_TASKS = """
window.__longTasks = [];
try {
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
  }).observe({ type: "longtask", buffered: true });
} catch (error) {}
"""

BARE = """async ([thread, total]) => {
  const { HubClient } = await import("/agui-hub.js");
  window.__count = 0;
  const hub = new HubClient({ url: `ws://${location.host}/` });
  const sub = hub.subscribe(thread, { from: "start" });
  sub.onItem((item) => {
    if (item.kind === "event") window.__count += 1;
  });
  window.__hub = hub;
}"""

BARE_DONE = "(total) => window.__count >= total"

VIEWER_DONE = """(total) => {
  const line = document.getElementById("events-line");
  return line !== null && line.textContent.startsWith(`${total} events`);
}"""


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def thread_events(thread: str, runs: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for index in range(runs):
        events.extend(event for _, event in demo_run(thread, f"run-{index}"))
    return events


async def publish(url: str, thread: str, events: list[dict[str, Any]], batch: int) -> None:
    async with Publisher(url) as publisher:
        for start in range(0, len(events), batch):
            await publisher.publish_batch(thread, events[start : start + batch])


async def seconds_until(page: Any, done: str, total: int, began: float, timeout: float) -> float:
    """Seconds from *began* until *done* holds on *page* for *total* events."""
    await page.wait_for_function(done, arg=total, timeout=timeout * 1000)
    return time.perf_counter() - began


async def long_tasks(page: Any) -> list[float]:
    tasks: list[float] = await page.evaluate("window.__longTasks || []")
    return tasks


async def one_run(
    browser: Any, port: int, url: str, agent_runs: int, batch: int, timeout: float
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for case in ("live", "history"):
        thread = f"bench-viewer-{uuid.uuid4().hex[:8]}"
        events = thread_events(thread, agent_runs)
        total = len(events)
        context = await browser.new_context(viewport={"width": 1280, "height": 800})
        await context.add_init_script(LONG_TASKS)
        bare = await context.new_page()
        viewer = await context.new_page()
        try:
            if case == "history":
                await publish(url, thread, events, batch)
            await bare.goto(f"http://127.0.0.1:{port}/healthz")  # an origin, no page
            began = time.perf_counter()
            await bare.evaluate(BARE, [thread, total])
            await viewer.goto(f"http://127.0.0.1:{port}/#thread={thread}")
            if case == "live":
                await viewer.wait_for_function(
                    "() => window.aguiViewer && window.aguiViewer.model().connection.subscribed",
                    timeout=timeout * 1000,
                )
                await bare.wait_for_function("() => window.__hub.status.state === 'open'")
                began = time.perf_counter()
                await publish(url, thread, events, batch)

            bare_s, viewer_s = await asyncio.gather(
                seconds_until(bare, BARE_DONE, total, began, timeout),
                seconds_until(viewer, VIEWER_DONE, total, began, timeout),
            )
            tasks = await long_tasks(viewer)
            bare_tasks = await long_tasks(bare)
            results[case] = {
                "bare_blocking": sum(max(0.0, t - 50) for t in bare_tasks),
                "events": total,
                "bare": bare_s,
                "viewer": viewer_s,
                "long_tasks": len(tasks),
                "longest": max(tasks, default=0.0),
                "blocking": sum(max(0.0, t - 50) for t in tasks),
            }
        finally:
            await context.close()
    return results


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    median = fmt.format(statistics.median(values))
    if len(values) < 2:
        return median
    return f"{median} ({fmt.format(min(values))}-{fmt.format(max(values))})"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--agent-runs", default="30,300")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "")
    args = parser.parse_args()
    if not args.chromium:
        print("no chromium: apt-get install chromium (or --chromium PATH)", file=sys.stderr)
        return 2
    from playwright.async_api import async_playwright

    port = free_port()
    url = f"ws://127.0.0.1:{port}/"
    gateway = subprocess.Popen(
        [sys.executable, "-m", "agui_hub.cli", "serve", "--host", "127.0.0.1", "--port",
         str(port), "--log-level", "WARNING"],
        cwd=ROOT, env=os.environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(100):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.1)
        sizes = [int(n) for n in args.agent_runs.split(",")]
        rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=args.chromium, args=CHROMIUM_ARGS
            )
            try:
                for run in range(args.runs):
                    for size in sizes:
                        result = await one_run(browser, port, url, size, args.batch, args.timeout)
                        for case, row in result.items():
                            rows.setdefault((size, case), []).append(row)
                        print(f"run {run + 1}, {size} agent runs: {result}", file=sys.stderr)
            finally:
                await browser.close()
    finally:
        gateway.terminate()
        gateway.wait(10)

    print(
        "| thread | case | bare s | viewer s | viewer / bare | long tasks | longest ms "
        "| blocking ms | bare's blocking ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (size, case), results in rows.items():
        events = results[0]["events"]
        ratios = [r["viewer"] / r["bare"] for r in results]
        print(
            f"| {size} runs, {events:,} events | {case} "
            f"| {spread([r['bare'] for r in results])} "
            f"| {spread([r['viewer'] for r in results])} "
            f"| {spread(ratios)} "
            f"| {spread([r['long_tasks'] for r in results], '{:.0f}')} "
            f"| {spread([r['longest'] for r in results], '{:.0f}')} "
            f"| {spread([r['blocking'] for r in results], '{:.0f}')} "
            f"| {spread([r['bare_blocking'] for r in results], '{:.0f}')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
