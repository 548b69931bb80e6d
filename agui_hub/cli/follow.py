"""Reading a thread through the hub: ``agui-hub tail`` follows it as a chat
transcript (resuming from an :class:`OffsetFile` if given one), ``agui-hub
replay`` prints what is stored and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..errors import AguiHubError, HubUnreachable, OffsetExpired
from ..wire.offsets import START, offset_key
from ..wire.protocol import Position
from .common import (
    GATEWAY_URL_HELP,
    TOKEN_HELP,
    URL_HELP,
    Output,
    Subcommands,
    UsageError,
    add_transcript_options,
    client_token,
    hub_url,
    thread_name,
    use_color,
)
from .retry import NOTICE_EVERY, Retry, connect_client, timeout_of

# -- tail --------------------------------------------------------------------------------------


def add_tail_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "tail",
        help="follow a thread as a chat transcript",
        description="Follow THREAD through a gateway and print it as a chat transcript: "
        "streaming text, tool calls and results, reasoning, state changes, runs. "
        "Reconnects and resumes by itself. With --offset-file the position is kept on "
        "disk after every event, so a tail that is killed and started again continues "
        "exactly where it stopped.",
    )
    parser.add_argument("thread")
    parser.add_argument("--url", help=GATEWAY_URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument(
        "--from",
        dest="start",
        default="start",
        metavar="WHERE",
        help="start, live, snapshot, or an offset (OFFSET or OFFSET@EPOCH); default start",
    )
    parser.add_argument("--offset-file", type=Path, help="keep the position in this file")
    parser.add_argument(
        "--until-finished",
        action="store_true",
        help="exit when a run ends at or after the newest event stored when tail connected",
    )
    parser.add_argument("--run", help="show only this run's events")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="give up after SECONDS without a connection to the gateway, at "
                        "the start or later (default: never: tail waits and reconnects for "
                        "ever); while it cannot be reached tail says so at once, then every "
                        "10 s")  # fmt: skip
    add_transcript_options(parser)


class OffsetFile:
    """A tail's position and transcript state, rewritten in place after every event.

    One small JSON record, padded with spaces so that a shorter record fully
    covers a longer one; one ``pwrite`` per update, so a process killed at any
    moment leaves either the old record or the new one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size

    def load(self, thread: str) -> tuple[Position, dict[str, Any]] | None:
        data = os.pread(self._fd, max(self._size, 1), 0).decode("utf-8", "replace").strip()
        if not data:
            return None
        try:
            record = json.loads(data)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            position = Position.from_json(record)
            view = record.get("view", {})
            if not isinstance(view, dict):
                raise ValueError("view is not an object")
        except ValueError as exc:
            raise UsageError(f"{self.path} is not an agui-hub offset file: {exc}") from None
        if record.get("thread") != thread:
            raise UsageError(
                f"{self.path} holds the position in thread {record.get('thread')!r}, "
                f"not {thread!r}: use another file"
            )
        return position, view

    def save(self, thread: str, position: Position, view: dict[str, Any]) -> None:
        record = {"thread": thread, **position.to_json(), "view": view}
        data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()
        padded = data.ljust(max(self._size - 1, len(data))) + b"\n"
        os.pwrite(self._fd, padded, 0)
        self._size = len(padded)

    def close(self) -> None:
        os.close(self._fd)


def _start(value: str) -> Any:
    if value in ("start", "live", "snapshot"):
        return value
    offset, _, epoch = value.partition("@")
    try:
        offset_key(offset)
    except AguiHubError:
        raise UsageError(
            f"--from {value!r}: expected start, live, snapshot, OFFSET or OFFSET@EPOCH"
        ) from None
    return Position(offset, epoch or None)


async def _watch_connection(client: Any, command: str, url: str) -> None:
    """Say when *client* loses its connection, and every NOTICE_EVERY seconds while
    it has none (it reconnects by itself; the subscription says when it is back)."""
    from ..client.hub_client import ClientState
    from ..store.urls import redact_url

    lost_at: float | None = None
    told = 0.0
    while True:
        await asyncio.sleep(0.2)
        now = time.monotonic()
        if client.state is not ClientState.RECONNECTING:
            lost_at = None
        elif lost_at is None:
            lost_at = told = now
            print(f"agui-hub {command}: lost the connection to {redact_url(url)} (code "
                  f"{client.close_code}); reconnecting", file=sys.stderr)  # fmt: skip
        elif now - told >= NOTICE_EVERY:
            told = now
            print(f"agui-hub {command}: still reconnecting to {redact_url(url)} "
                  f"({now - lost_at:.0f} s so far)", file=sys.stderr)  # fmt: skip


async def tail_command(args: argparse.Namespace) -> int:
    from ..client.hub_client import Snapshot, Subscribed, ThreadEvent
    from ..client.transcript import TranscriptView

    thread = thread_name(args.thread)
    url = hub_url(args, gateway_only=True)
    start = _start(args.start)
    retry = Retry("tail", url, timeout_of(args, None))
    view_state: dict[str, Any] | None = None
    offset_file = OffsetFile(args.offset_file) if args.offset_file else None
    if offset_file is not None and (saved := offset_file.load(thread)) is not None:
        start, view_state = saved
    try:
        view = TranscriptView(
            color=use_color(args.color, sys.stdout), state=view_state, raw=args.raw
        )
    except ValueError as exc:
        raise UsageError(f"{args.offset_file}: {exc}") from None
    out = Output(sys.stdout)
    # --timeout bounds the later outages too: the client gives up after as long.
    client = await connect_client(url, retry, client_token(args), give_up_after=retry.timeout)
    watcher = asyncio.create_task(_watch_connection(client, "tail", url))
    newest: tuple[int, int] | None = None
    subscribed = False  # the first Subscribed is the reply to our subscribe
    reconnects = 0
    try:
        async with client.subscribe(thread, start, run=args.run) as sub:
            async for item in sub:
                text = ""
                finished = False
                if isinstance(item, Subscribed):
                    if newest is None:
                        newest = offset_key(item.offset)
                    if item.resumed and client.reconnects > reconnects:
                        reconnects = client.reconnects
                        print(f"agui-hub tail: reconnected (code {client.close_code})",
                              file=sys.stderr)  # fmt: skip
                    # Not recovered: after a reconnect or from a position, events
                    # were lost; later, unasked, the thread was re-created.
                    if not item.recovered and (
                        item.resumed or subscribed or isinstance(start, Position)
                    ):
                        text = view.notice(
                            "events were lost to retention or a reset: a snapshot follows"
                        )
                    if not subscribed and item.offset == START:
                        print(f"agui-hub tail: thread {thread!r} has no events yet; waiting "
                              "for its first event", file=sys.stderr)  # fmt: skip
                    subscribed = True
                elif isinstance(item, Snapshot):
                    text = view.reset() + "".join(view.render(event) for event in item.events)
                elif isinstance(item, ThreadEvent):
                    text = view.render(item.event)
                    finished = (
                        args.until_finished
                        and item.event.get("type") in ("RUN_FINISHED", "RUN_ERROR")
                        and newest is not None
                        and offset_key(item.offset) >= newest
                    )
                out.write(text)
                if offset_file is not None and sub.position is not None:
                    offset_file.save(thread, sub.position, view.state())
                if finished:
                    break
    except BaseException as exc:
        # Interrupted. With an offset file, stdout gets nothing more: the saved
        # state describes exactly what was printed, so a tail started again
        # continues the open line and the two outputs join up exactly. On a
        # terminal the line is ended on stderr, for the prompt. Without an
        # offset file the open line is ended on stdout.
        with contextlib.suppress(Exception):
            if offset_file is None:
                out.write(view.close())
            elif sys.stdout.isatty() and sys.stderr.isatty() and view.state().get("line"):
                print(file=sys.stderr)
        if isinstance(exc, HubUnreachable) and retry.timeout is not None:
            # The client gave up reconnecting after --timeout: said as the others say it.
            raise HubUnreachable(
                f"gave up after {retry.timeout:g} s without a connection (--timeout): "
                f"lost the connection to {retry.url}"
            ) from exc
        raise
    finally:
        watcher.cancel()
        await client.close()
        if offset_file is not None:
            offset_file.close()
    return 0


# -- replay ------------------------------------------------------------------------------------


def add_replay_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "replay",
        help="print every stored event of a thread",
        description="Print every stored event of THREAD and exit: as NDJSON lines "
        '{"offset": ..., "event": {...}, "eventId": "THREAD@OFFSET"} with --json, as a '
        "transcript otherwise. The eventId makes `replay --json | agui-hub publish "
        "OTHER` idempotent: run twice, it stores the events once.",
    )
    parser.add_argument("thread")
    parser.add_argument("--url", help=URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument("--json", action="store_true", help="NDJSON, one event per line")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="wait up to SECONDS for an unreachable hub (default 0: fail at "
                        "once)")  # fmt: skip
    add_transcript_options(parser)


def replay_event_id(thread: str, offset: str, index: int | None = None) -> str:
    """The eventId that ``replay --json`` gives an event: ``THREAD@OFFSET``.

    Stable for a stored event (the same replay printed again gives the same
    ids), different for every event of the thread, and the same through a
    gateway and from the store: publishing the output twice stores it once.
    The *index*-th event of a snapshot (several events at one offset) gets
    ``THREAD@OFFSET#INDEX``.
    """
    return f"{thread}@{offset}" if index is None else f"{thread}@{offset}#{index}"


async def replay_command(args: argparse.Namespace) -> int:
    thread = thread_name(args.thread)
    url = hub_url(args)
    retry = Retry("replay", url, timeout_of(args, 0.0))
    scheme = urlsplit(url).scheme.lower()
    out = Output(sys.stdout)
    if args.json:

        def emit(offset: str, event: dict[str, Any], snapshot: int | None = None) -> None:
            record: dict[str, Any] = {
                "offset": offset,
                "event": event,
                "eventId": replay_event_id(thread, offset, snapshot),
            }
            if snapshot is not None:
                record["snapshot"] = True
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")

    else:
        from ..client.transcript import TranscriptView

        view = TranscriptView(color=use_color(args.color, sys.stdout), raw=args.raw)

        def emit(offset: str, event: dict[str, Any], snapshot: int | None = None) -> None:
            out.write(view.render(event))

    count = 0
    if scheme in ("ws", "wss"):
        count = await _replay_gateway(url, thread, emit, client_token(args), retry)
    else:
        count = await _replay_store(url, thread, emit, retry)
    if not args.json:
        out.write(view.close())
    if count == 0:
        print(f"agui-hub replay: thread {thread!r} has no events", file=sys.stderr)
    return 0


async def _replay_gateway(
    url: str, thread: str, emit: Callable[..., None], token: str | None, retry: Retry
) -> int:
    from ..client.hub_client import Snapshot, Subscribed, ThreadEvent

    client = await connect_client(url, retry, token, give_up_after=retry.timeout)
    count = 0
    try:
        async with client.subscribe(thread, "start") as sub:
            newest: tuple[int, int] | None = None
            async for item in sub:
                if isinstance(item, Subscribed) and newest is None:
                    newest = offset_key(item.offset)
                    if item.offset == START:
                        break
                elif isinstance(item, Snapshot):
                    print(
                        f"agui-hub replay: the beginning of thread {thread!r} was trimmed; "
                        "what was trimmed is summarised by a snapshot (marked snapshot)",
                        file=sys.stderr,
                    )
                    for index, event in enumerate(item.events):
                        emit(item.offset, event, index)
                    count += len(item.events)
                    if newest is not None and offset_key(item.offset) >= newest:
                        break
                elif isinstance(item, ThreadEvent):
                    emit(item.offset, item.event)
                    count += 1
                    if newest is not None and offset_key(item.offset) >= newest:
                        break
    finally:
        await client.close()
    return count


async def _replay_store(url: str, thread: str, emit: Callable[..., None], retry: Retry) -> int:
    from functools import partial

    import msgpack

    from ..store import open_store

    store = open_store(url)
    count = 0
    try:
        after = START
        while True:
            try:
                entries = await retry.call(partial(store.read, thread, after=after, limit=1000))
            except OffsetExpired as exc:
                print(
                    f"agui-hub replay: events of thread {thread!r} up to {exc.first} were "
                    "trimmed; printing what is stored",
                    file=sys.stderr,
                )
                info = await retry.call(lambda: store.info(thread))
                if info is None or info.trimmed is None or info.trimmed == after:
                    raise
                after = info.trimmed
                continue
            for entry in entries:
                emit(entry.offset, msgpack.unpackb(entry.data, raw=False))
            count += len(entries)
            if len(entries) < 1000:
                return count
            after = entries[-1].offset
    finally:
        await store.close()
