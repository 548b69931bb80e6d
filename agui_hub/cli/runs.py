"""``agui-hub run`` and ``agui-hub cancel``: runs of upstream AG-UI agents that a
gateway makes in a thread (docs/bridge.md). The run belongs to the gateway; these
commands ask for it, follow it, or end it. ``agui-hub runs``: the tree of a
thread's runs, from a gateway or straight from a Redis store.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import uuid
from typing import Any

from .common import (
    GATEWAY_URL_HELP,
    TOKEN_HELP,
    Output,
    Subcommands,
    add_transcript_options,
    client_token,
    hub_url,
    thread_name,
    use_color,
)
from .retry import DEFAULT_TIMEOUT, WAIT_HELP, Retry, connect_client, timeout_of


def add_run_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "run",
        help="run an upstream AG-UI agent in a thread, through the hub",
        description="Ask a gateway to run upstream agent NAME (configured on the gateway "
        "with --agents or --agents-file) in THREAD, and print the run as a transcript "
        "until it ends. The gateway builds the agent's input from the thread: its messages "
        "(plus --message), its state, and parentRunId its latest run. The run belongs to "
        "the gateway: interrupting this command (or --detach) leaves it going, and every "
        "viewer of the thread follows it. Exit status 0 when the run finishes, 1 when it "
        "ends with RUN_ERROR.",
    )
    parser.add_argument("--agent", required=True, metavar="NAME", help="the upstream agent")
    parser.add_argument("--thread", required=True, help="the thread to run it in")
    parser.add_argument("--message", action="append", default=[], metavar="TEXT",
                        help="a user message to add before the run (repeat for more)")  # fmt: skip
    parser.add_argument("--run-id", help="the run's id (default: a new one)")
    parser.add_argument("--parent-run-id", metavar="RUN",
                        help="run from the branch that ends with RUN (as of its end) "
                        "instead of the thread's latest run: regenerate or edit "
                        "(see agui-hub runs)")  # fmt: skip
    parser.add_argument("--detach", action="store_true",
                        help="print the run id and exit once the run is going")  # fmt: skip
    parser.add_argument("--url", help=GATEWAY_URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip
    add_transcript_options(parser)


async def run_command(args: argparse.Namespace) -> int:
    from ..client.hub_client import Subscribed, ThreadEvent
    from ..client.transcript import TranscriptView

    thread = thread_name(args.thread)
    url = hub_url(args, gateway_only=True)
    retry = Retry("run", url, timeout_of(args, DEFAULT_TIMEOUT))
    messages = [
        {"id": f"msg-{uuid.uuid4().hex}", "role": "user", "content": text} for text in args.message
    ]
    view = TranscriptView(color=use_color(args.color, sys.stdout), raw=args.raw)
    out = Output(sys.stdout)
    client = await connect_client(url, retry, client_token(args))
    outcome: dict[str, Any] | None = None
    try:
        # Following from the live end before the run starts: none of its events is missed.
        async with client.subscribe(thread, "live") as sub:
            async for item in sub:
                if isinstance(item, Subscribed):
                    break
            reply = await client.run(
                thread,
                args.agent,
                messages=messages,
                run_id=args.run_id,
                parent_run_id=args.parent_run_id,
                timeout=retry.timeout,
            )
            run_id = reply.get("runId")
            cancel = shlex.join(["agui-hub", "cancel", thread])
            if args.detach:
                print(run_id)
                print(f"agui-hub run: run {run_id} of {args.agent} is going in thread "
                      f"{thread!r}; follow it with: {shlex.join(['agui-hub', 'tail', thread])}",
                      file=sys.stderr)  # fmt: skip
                return 0
            print(f"agui-hub run: run {run_id} of {args.agent} in thread {thread!r} (Ctrl-C "
                  f"stops following, the run goes on; stop it with: {cancel})",
                  file=sys.stderr)  # fmt: skip
            async for item in sub:
                if isinstance(item, ThreadEvent):
                    out.write(view.render(item.event))
                    if item.event.get("type") in ("RUN_FINISHED", "RUN_ERROR"):
                        outcome = item.event
                        break
    finally:
        with contextlib.suppress(Exception):
            out.write(view.close())
        await client.close()
    if outcome is not None and outcome["type"] == "RUN_ERROR":
        code = outcome.get("code")
        print(f"agui-hub run: the run ended with RUN_ERROR{f' {code}' if code else ''}: "
              f"{outcome.get('message')}", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def add_cancel_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "cancel",
        help="cancel the bridged run going in a thread",
        description="Cancel the run of an upstream agent going in THREAD: the gateway closes "
        "its request to the agent and the run ends with RUN_ERROR AGUI_HUB_RUN_CANCELLED. "
        "Send it to the gateway that started the run.",
    )
    parser.add_argument("thread")
    parser.add_argument("--run-id", help="only this run")
    parser.add_argument("--abandoned", action="store_true",
                        help="end a run the thread holds open that no gateway relays any "
                        "more (its gateway crashed): appends RUN_ERROR "
                        "AGUI_HUB_RUN_ABANDONED")  # fmt: skip
    parser.add_argument("--url", help=GATEWAY_URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip


async def cancel_command(args: argparse.Namespace) -> int:
    thread = thread_name(args.thread)
    url = hub_url(args, gateway_only=True)
    retry = Retry("cancel", url, timeout_of(args, DEFAULT_TIMEOUT))
    client = await connect_client(url, retry, client_token(args))
    try:
        reply = await client.cancel(thread, args.run_id, abandoned=args.abandoned)
    finally:
        await client.close()
    agent = f" of {reply['agent']}" if reply.get("agent") else ""
    print(f"agui-hub cancel: run {reply.get('runId')}{agent} in thread {thread!r} "
          f"{'ended' if args.abandoned else 'cancelled'}", file=sys.stderr)  # fmt: skip
    return 0


def add_runs_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "runs",
        help="the runs of a thread, as a tree",
        description="Print the runs of THREAD as a tree: each run under the run it "
        "continues (its parentRunId, or the run before it), with its status and the start "
        "of its last user message. Asks a gateway (--url), or reads a Redis store (--store).",
    )
    parser.add_argument("thread")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per run, in the order they started")  # fmt: skip
    parser.add_argument("--limit", type=int, default=1000,
                        help="the newest N runs (default 1000, at most 4096)")  # fmt: skip
    parser.add_argument("--url", help=GATEWAY_URL_HELP)
    parser.add_argument("--store", help="read a Redis store instead of asking a gateway "
                        "(redis://HOST:PORT/DB, as for agui-hub serve)")  # fmt: skip
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip


async def runs_command(args: argparse.Namespace) -> int:
    from ..agui.runs import RunTree
    from ..wire.protocol import MAX_RUNS_LISTED
    from .common import UsageError
    from .shared_store import open_shared_store, store_url

    thread = thread_name(args.thread)
    if not 0 < args.limit <= MAX_RUNS_LISTED:
        raise UsageError(f"--limit must be from 1 to {MAX_RUNS_LISTED}")
    if args.store is None:
        url = hub_url(args, gateway_only=True)
        retry = Retry("runs", url, timeout_of(args, DEFAULT_TIMEOUT))
        client = await connect_client(url, retry, client_token(args))
        try:
            tree = await client.runs(thread, limit=args.limit)
        finally:
            await client.close()
    else:
        store = open_shared_store(store_url(args, "runs"))
        try:
            runs = await store.runs(thread)
        finally:
            await store.close()
        tree = RunTree(runs[-args.limit :], more=len(runs) > args.limit)
    out = Output(sys.stdout)
    if args.json:
        for run in tree.runs:
            out.write(json.dumps(run.as_json(), ensure_ascii=False) + "\n")
    else:
        for line in tree.render():
            out.write(line + "\n")
    if not tree.runs:
        print(f"agui-hub runs: thread {thread!r} has no runs", file=sys.stderr)
    elif tree.more:
        print(f"agui-hub runs: the newest {args.limit} runs; older ones left out (--limit)",
              file=sys.stderr)  # fmt: skip
    return 0
