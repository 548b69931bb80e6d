"""``agui-hub publish`` (NDJSON events into a thread) and ``agui-hub demo`` (a
realistic run, paced like a model), the commands that write into a thread.

Both publish through a :class:`~agui_hub.client.publisher.Publisher`, with
event ids that make a retry safe, and wait out an unreachable hub as
:class:`~.retry.Retry` says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import stat
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

from ..errors import AguiHubError, HubUnreachable, ProtocolError, SequenceError, StoreUnavailable
from .common import (
    TOKEN_HELP,
    URL_HELP,
    Output,
    Subcommands,
    UsageError,
    client_token,
    hub_url,
    thread_name,
)
from .retry import DEFAULT_TIMEOUT, WAIT_HELP, Retry, timeout_of

ATTEMPT_SECONDS = 2.0
"""How long one publish through a gateway waits for the connection and its reply
before the command says so and tries again (with the same event ids: safe)."""


async def _connect_publisher(publisher: Any, retry: Retry) -> None:
    """Connect *publisher* (a no-op once connected, and for a store URL), waiting
    out an unreachable hub as *retry* says."""
    await retry.call(publisher.connect)
    # Through a gateway one attempt waits for the connection and the reply; a
    # store's attempt is one append, and the pauses between attempts are ours.
    publisher.retry_for = ATTEMPT_SECONDS if publisher.via_gateway else 0.0


async def _published(publisher: Any, thread: str, events: list[Any], ids: list[str]) -> list[str]:
    """One attempt at publishing a batch, with a plain reason when the connection is gone."""
    try:
        offsets: list[str] = await publisher.publish_batch(thread, events, ids)
    except HubUnreachable as exc:
        # Connected once, so the client is reconnecting by itself; its own words
        # ("no connection to ... in time") do not say that the connection was lost.
        if publisher.via_gateway and str(exc).startswith(("no connection to", "publish to")):
            from ..store.urls import redact_url

            raise HubUnreachable(
                f"lost the connection to {redact_url(publisher.url)}: not back within "
                f"{publisher.retry_for:g} s"
            ) from exc
        raise
    return offsets


# -- publish -----------------------------------------------------------------------------------


def add_publish_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "publish",
        help="publish NDJSON events into a thread",
        description="Publish AG-UI events, one JSON object per line, into THREAD and print "
        'one offset per event. A line is an event, or {"event": {...}, "eventId": '
        '"..."} (what `replay --json` prints also works: publishing it again stores '
        "nothing twice). Event ids must all differ. Every event is validated and "
        "checked against the thread's sequence rules before it is stored; from a file, "
        "nothing is published unless every line is a valid event. Input without any "
        "event publishes nothing, says so on stderr and exits 0.",
    )
    parser.add_argument("thread")
    parser.add_argument("file", nargs="?", default="-", help="NDJSON file (default -: stdin)")
    parser.add_argument("--url", help=URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument(
        "--sequence",
        choices=["strict", "off"],
        default="strict",
        help="sequence checks when publishing into a store (a gateway is always strict)",
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip


@dataclass
class _Line:
    number: int
    event: Any
    event_id: str | None


def _parse_line(number: int, text: str) -> _Line | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"line {number}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"line {number}: expected a JSON object (an event)")
    if "type" not in value and isinstance(value.get("event"), dict):
        event_id = value.get("eventId")
        if event_id is not None and (not isinstance(event_id, str) or not event_id):
            raise ValueError(f"line {number}: eventId must be a non-empty string")
        return _Line(number, value["event"], event_id)
    return _Line(number, value, None)


def _check_line(line: _Line, thread: str) -> dict[str, Any]:
    from ..agui.events import validate_wire
    from ..errors import InvalidEvent

    try:
        event = validate_wire(line.event)
    except InvalidEvent as exc:
        raise ValueError(f"line {line.number}: {exc}") from None
    named = event.get("threadId")
    if event["type"] in ("RUN_STARTED", "RUN_FINISHED") and named != thread:
        # A thread copied under another name (replay --json | publish): its run
        # markers must name the thread they are in, or the hub refuses them.
        if not _retargeted:
            print(f"agui-hub publish: run events name thread {named!r}; published into "
                  f"{thread!r} with threadId {thread!r}", file=sys.stderr)  # fmt: skip
            _retargeted.append(named)
        event = {**event, "threadId": thread}
    return event


_retargeted: list[Any] = []


async def _lines_of_stream(stream: IO[str]) -> AsyncIterator[list[tuple[int, str]]]:
    """Lines of a pipe or terminal, in the batches they arrive in (at most 1000)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[int, str] | None] = asyncio.Queue()

    def pump() -> None:
        # A thread: a blocking read of stdin must not stall the event loop.
        try:
            for number, text in enumerate(stream, 1):
                loop.call_soon_threadsafe(queue.put_nowait, (number, text))
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    threading.Thread(target=pump, daemon=True).start()
    done = False
    while not done:
        first = await queue.get()
        if first is None:
            return
        batch = [first]
        while len(batch) < 1000 and not queue.empty():
            item = queue.get_nowait()
            if item is None:
                done = True
                break
            batch.append(item)
        yield batch


class _EventIds:
    """The event ids of the input so far, with their lines.

    An id given twice would be taken by the store for a retry of the first
    event, and the second event silently dropped: refused instead, naming both
    lines. (Kept for the whole input: a repeat may be far from the first.)
    """

    def __init__(self) -> None:
        self._lines: dict[str, int] = {}

    def check(self, lines: list[_Line], stored: str) -> None:
        for line in lines:
            if line.event_id is None:
                continue
            first = self._lines.setdefault(line.event_id, line.number)
            if first != line.number:
                raise ValueError(
                    f"line {line.number}: eventId {line.event_id!r} is also the id of line "
                    f"{first}: give each event an id of its own ({stored})"
                )


async def publish_command(args: argparse.Namespace) -> int:
    from ..client.publisher import Publisher

    thread = thread_name(args.thread)
    url = hub_url(args)
    retry = Retry("publish", url, timeout_of(args, DEFAULT_TIMEOUT))
    out = Output(sys.stdout)
    if args.file == "-":
        stream: IO[str] = sys.stdin
        whole = not stream.isatty() and stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    else:
        try:
            stream = open(args.file, encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
        whole = True
    ids = _EventIds()
    published = 0
    # Retries are this command's (said, and bounded by --timeout): one attempt each.
    publisher = Publisher(url, sequence=args.sequence, token=client_token(args), retry_for=0.0)
    try:
        if whole:
            # A file: check every line before anything is published.
            lines = [
                line
                for number, text in enumerate(stream, 1)
                if (line := _parse_line(number, text)) is not None
            ]
            events = [_check_line(line, thread) for line in lines]
            ids.check(lines, "nothing was published")
            for begin in range(0, len(lines), 1000):
                await _publish_lines(publisher, retry, thread, lines[begin : begin + 1000],
                                     events[begin : begin + 1000], out)  # fmt: skip
                published += len(lines[begin : begin + 1000])
        else:
            async for batch in _lines_of_stream(stream):
                lines = [line for number, text in batch if (line := _parse_line(number, text))]
                events = [_check_line(line, thread) for line in lines]
                ids.check(lines, "nothing of this batch was stored")
                await _publish_lines(publisher, retry, thread, lines, events, out)
                published += len(lines)
    finally:
        if stream is not sys.stdin:
            stream.close()
        await publisher.close()
    if not published:
        # Not an error: `replay --json` of an empty thread piped in is no mistake.
        where = "stdin" if args.file == "-" else args.file
        print(f"agui-hub publish: no events in {where}: nothing published", file=sys.stderr)
    return 0


async def _publish_lines(
    publisher: Any,
    retry: Retry,
    thread: str,
    lines: list[_Line],
    events: list[dict[str, Any]],
    out: Output,
) -> None:
    if not lines:
        return
    await _connect_publisher(publisher, retry)
    ids = [line.event_id or publisher.new_event_id() for line in lines]
    try:
        # The same ids on every attempt: a batch stored before its reply was lost
        # is not stored again.
        offsets = await retry.call(lambda: _published(publisher, thread, events, ids))
    except ProtocolError as exc:
        where = f"lines {lines[0].number}-{lines[-1].number}" if len(lines) > 1 else "line"
        number = _culprit(lines, exc)
        prefix = f"line {number}" if number is not None else where
        raise ValueError(f"{prefix}: {exc} (nothing of this batch was stored)") from None
    out.write("".join(f"{offset}\n" for offset in offsets))


def _culprit(lines: list[_Line], exc: ProtocolError) -> int | None:
    """The line of the event an error is about, when it can be told."""
    if exc.index is not None and 0 <= exc.index < len(lines):
        return lines[exc.index].number
    return lines[0].number if len(lines) == 1 else None


# -- demo --------------------------------------------------------------------------------------


def add_demo_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "demo",
        help="stream a realistic demo run into a thread",
        description="Publish a realistic agent run (reasoning, streamed text, tool calls "
        "with results, state deltas, steps) into THREAD, paced like a real model. Watch "
        "it with `agui-hub tail THREAD`. Event ids derive from the run id: a run cut "
        "short is finished by running demo again with --run-id and its id.",
    )
    parser.add_argument("thread", nargs="?", default="demo", help="default: demo")
    parser.add_argument("--url", help=URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument("--run-id", help="the run's id (default: a new one)")
    parser.add_argument(
        "--parent-run-id",
        metavar="RUN",
        help="the run the first run continues (its RUN_STARTED's parentRunId: a new "
        "version on that branch); default: the run before it",
    )
    parser.add_argument("--runs", type=int, default=1, help="how many runs, one after another")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="pace multiplier (2: twice as fast; 0: no pauses)"
    )
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip


def _demo_again(args: argparse.Namespace, *more: str) -> str:
    """The demo command line that goes on from here (never with a token or password)."""
    from ..store.urls import redact_url

    words = ["agui-hub", "demo", args.thread]
    if args.url:
        words += ["--url", redact_url(args.url)]
    return shlex.join([*words, *more])


async def demo_command(args: argparse.Namespace) -> int:
    from functools import partial

    from ..client.publisher import Publisher
    from .demo import demo_run

    thread = thread_name(args.thread)
    url = hub_url(args)
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    if args.speed < 0:
        raise UsageError("--speed must be 0 or more")
    retry = Retry("demo", url, timeout_of(args, DEFAULT_TIMEOUT))
    publisher = Publisher(url, token=client_token(args), retry_for=0.0)
    try:
        await _connect_publisher(publisher, retry)
        for number in range(args.runs):
            run_id = args.run_id or f"run-{uuid.uuid4().hex[:8]}"
            if args.run_id and args.runs > 1:
                run_id = f"{args.run_id}-{number + 1}"
            events = demo_run(thread, run_id)
            if number == 0 and args.parent_run_id:
                events[0][1]["parentRunId"] = args.parent_run_id
            watch = shlex.join(["agui-hub", "tail", thread])
            print(
                f"agui-hub demo: streaming run {run_id} ({len(events)} events) into thread "
                f"{thread!r} at {retry.url}; watch it with: {watch}",
                file=sys.stderr,
            )
            offset = ""
            index = 0
            try:
                for index, (delay, event) in enumerate(events):
                    if delay and args.speed:
                        await asyncio.sleep(delay / args.speed)
                    # Ids from the run id: a retry never stores an event twice, and
                    # `demo --run-id` again finishes a run cut short.
                    published = partial(
                        _published, publisher, thread, [event], [f"{run_id}-{index}"]
                    )
                    offset = (await retry.call(published))[0]
            except SequenceError as exc:
                if exc.rule != "run_not_started" or index == 0:
                    raise
                # The run's RUN_STARTED was stored, and now no run was ever started:
                # the thread is empty again.
                raise AguiHubError(
                    f"thread {thread!r} was reset while run {run_id} was streaming (the hub "
                    "restarted on the memory store, or Redis lost its data): its earlier "
                    "events are gone, so this run cannot go on. Start a new run: "
                    f"{_demo_again(args)} (or stream this one again from its start: "
                    f"{_demo_again(args, '--run-id', run_id)})"
                ) from None
            except (HubUnreachable, StoreUnavailable) as exc:
                raise HubUnreachable(
                    f"{exc}; run {run_id} is unfinished: finish it, once the hub is back, "
                    f"with: {_demo_again(args, '--run-id', run_id)}"
                ) from None
            print(f"agui-hub demo: run {run_id} finished at offset {offset}", file=sys.stderr)
    finally:
        await publisher.close()
    return 0
