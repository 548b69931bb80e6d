"""The operator commands that read the store directly: ``agui-hub threads``
(the stored threads, most recently active first), ``info`` (one thread) and
``delete`` (a thread and all its events, asked first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import AguiHubError
from ..wire.offsets import check_thread
from .common import Output, Subcommands, UsageError, thread_name
from .shared_store import STORE_HELP, human_size, open_shared_store, store_url

if TYPE_CHECKING:
    from ..store.contract import ThreadInfo

DEFAULT_THREADS_LIMIT = 100
DEFAULT_SCAN = 10_000
INFO_CONCURRENCY = 64
"""Thread infos asked for at once by ``threads`` (the Redis pool bounds the connections)."""


def _iso_utc(ms: int | None) -> str | None:
    from ..store.contract import iso_utc  # the store module only when a command needs it

    return iso_utc(ms)


def _json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


# -- threads -----------------------------------------------------------------------------------


def add_threads_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "threads",
        help="list the stored threads, most recently active first",
        description="List the threads of the store with their event count, payload bytes, "
        "first and last offset, last activity (the time in the last event's offset) and "
        "epoch, most recently active first: a table, or one JSON object per line with "
        "--json. Reads the store directly, so it needs the shared store the gateways use.",
    )
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument("--limit", type=int, default=DEFAULT_THREADS_LIMIT, metavar="N",
                        help="list at most N threads (default %(default)s)")  # fmt: skip
    parser.add_argument("--scan", type=int, default=DEFAULT_SCAN, metavar="N",
                        help="look at up to N threads to find the most recently active "
                        "(default %(default)s); said on stderr when there are more")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON object per thread and line")


async def threads_command(args: argparse.Namespace) -> int:
    from ..store.urls import redact_url

    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.scan < 1:
        raise UsageError("--scan must be at least 1")
    url = store_url(args, "threads")
    store = open_shared_store(url)
    try:
        # The store lists names, not activity: the newest N are found among all
        # of them (up to --scan), not among the first N the listing returns.
        listed = await store.threads(args.scan + 1)
        more = len(listed) > args.scan
        names, odd = _thread_names(listed[: args.scan])
        infos = await _infos(store, names)
    finally:
        await store.close()
    infos.sort(key=lambda info: (-(info.last_activity or -1), info.thread))
    shown = infos[: args.limit]
    out = Output(sys.stdout)
    if args.json:
        out.write("".join(_json_line(info.as_json()) for info in shown))
    elif shown:
        out.write(_threads_table(shown))
    where = redact_url(url)
    if not infos:
        print(f"agui-hub threads: no threads in {where}", file=sys.stderr)
    elif len(shown) < len(infos):
        print(f"agui-hub threads: the {len(shown)} most recently active of {len(infos)} "
              f"threads in {where} (--limit)", file=sys.stderr)  # fmt: skip
    else:
        print(f"agui-hub threads: {len(infos)} thread{'s' if len(infos) != 1 else ''} in {where}",
              file=sys.stderr)  # fmt: skip
    if more:
        print(f"agui-hub threads: the store holds more than {args.scan} threads and only "
              f"{args.scan} were looked at: more recently active ones may be missing (raise "
              "--scan)", file=sys.stderr)  # fmt: skip
    if odd:
        keys = "stream keys under the prefix do" if odd != 1 else "stream key under the prefix does"
        print(f"agui-hub threads: {odd} {keys} not name a valid thread (written by something "
              "else?): not listed", file=sys.stderr)  # fmt: skip
    return 0


async def _infos(store: Any, names: Sequence[str]) -> list[ThreadInfo]:
    """The infos of the threads *names* that still exist, a bounded number at a time."""
    found: list[ThreadInfo] = []
    for begin in range(0, len(names), INFO_CONCURRENCY):
        chunk = names[begin : begin + INFO_CONCURRENCY]
        infos = await asyncio.gather(*(store.info(name) for name in chunk))
        # None: deleted or expired since it was listed.
        found.extend(info for info in infos if info is not None)
    return found


def _thread_names(names: Sequence[str]) -> tuple[list[str], int]:
    """The valid thread names among *names* (keys a plain XADD made may be odd ones),
    and how many were not."""
    valid = []
    for name in names:
        try:
            valid.append(check_thread(name))
        except AguiHubError:
            continue
    return valid, len(names) - len(valid)


def _threads_table(infos: Sequence[ThreadInfo]) -> str:
    header = ("THREAD", "EVENTS", "BYTES", "FIRST", "LAST", "LAST ACTIVITY (UTC)", "EPOCH")
    rows = [
        (
            info.thread,
            str(info.length),
            human_size(info.bytes),
            info.first or "-",
            info.last or "-",
            _iso_utc(info.last_activity) or "-",
            info.epoch,
        )
        for info in infos
    ]
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    right = {1, 2}  # numbers line up on the right

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip() + "\n"

    return "".join(line(row) for row in (header, *rows))


# -- info --------------------------------------------------------------------------------------


def add_info_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "info",
        help="show one thread: events, bytes, offsets, epoch, run, expiry, checkpoint",
        description="Show what the store holds of THREAD: event count, payload bytes, first, "
        "last and trimmed offsets, last activity, epoch, current run, time left until it "
        "expires, and its checkpoint (the folded state gateways start from). Exit 1 when "
        "the thread does not exist.",
    )
    parser.add_argument("thread")
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument("--json", action="store_true", help="one JSON object")


async def info_command(args: argparse.Namespace) -> int:
    from ..store.urls import redact_url

    thread = thread_name(args.thread)
    url = store_url(args, "info")
    store = open_shared_store(url)
    try:
        info = await store.info(thread)
        checkpoint = await store.get_checkpoint(thread) if info is not None else None
    finally:
        await store.close()
    if info is None:
        print(f"agui-hub info: thread {thread!r} does not exist in {redact_url(url)}",
              file=sys.stderr)  # fmt: skip
        return 1
    record = info.as_json()
    record["checkpoint"] = None
    if checkpoint is not None:
        record["checkpoint"] = {
            "offset": checkpoint.offset,
            "epoch": checkpoint.epoch,
            "complete": checkpoint.complete,
            "bytes": len(checkpoint.events),
            # A checkpoint of another epoch is ignored by the gateways.
            "current": checkpoint.epoch == info.epoch,
        }
    out = Output(sys.stdout)
    if args.json:
        out.write(_json_line(record))
        return 0
    fields = [
        ("thread", info.thread),
        ("epoch", info.epoch),
        ("events", str(info.length)),
        ("bytes", f"{human_size(info.bytes)} of event payloads"),
        ("first", info.first or "-"),
        ("last", info.last or "-"),
        ("last activity", record["lastActivity"] or "-"),
        ("trimmed", f"up to {info.trimmed}" if info.trimmed else "nothing"),
        ("run", info.run_id or "-"),
        ("expires", _expiry(info.ttl)),
        ("checkpoint", _describe_checkpoint(record["checkpoint"])),
    ]
    width = max(len(name) for name, _ in fields)
    out.write("".join(f"{name.ljust(width)}  {value}\n" for name, value in fields))
    return 0


def _expiry(ttl: float | None) -> str:
    if ttl is None:
        return "never (no ttl)"
    return f"in {_duration(ttl)} unless it is published to (ttl)"


def _duration(seconds: float) -> str:
    """*seconds* for people: ``45 s``, ``12 min``, ``6 h 59 min``, ``6 d 23 h``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def _describe_checkpoint(checkpoint: dict[str, Any] | None) -> str:
    if checkpoint is None:
        return "none"
    text = f"at {checkpoint['offset']}, {human_size(checkpoint['bytes'])}"
    if not checkpoint["complete"]:
        text += ", incomplete (folded after events were trimmed)"
    if not checkpoint["current"]:
        text += f", of epoch {checkpoint['epoch']}: stale, ignored"
    return text


# -- delete ------------------------------------------------------------------------------------


def add_delete_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "delete",
        help="delete a thread and all its events (asks first)",
        description="Delete THREAD from the store: its events, event ids and checkpoint. "
        "On a terminal it shows the thread and asks you to type its id; otherwise it "
        "refuses unless given --yes. Viewers of the thread are told at once (a new "
        "epoch when it is published to again). Exit 1 when the thread does not exist.",
    )
    parser.add_argument("thread")
    parser.add_argument("--store", metavar="URL", help=STORE_HELP)
    parser.add_argument("--yes", action="store_true", help="delete without asking")


async def delete_command(args: argparse.Namespace) -> int:
    from ..store.urls import redact_url

    thread = thread_name(args.thread)
    url = store_url(args, "delete")
    where = redact_url(url)
    ask = not args.yes
    if ask and not sys.stdin.isatty():
        # A pipe or a script cannot answer: deleting must be asked for explicitly.
        raise UsageError(
            f"not deleting thread {thread!r}: stdin is not a terminal, so nobody can "
            "confirm; pass --yes to delete without asking"
        )
    store = open_shared_store(url)
    try:
        info = await store.info(thread)
        if info is None:
            print(f"agui-hub delete: thread {thread!r} does not exist in {where}: nothing "
                  "deleted", file=sys.stderr)  # fmt: skip
            return 1
        if ask:
            print(
                f"thread {thread!r} in {where}: {_describe_thread(info)}\n"
                "Deleting it removes its events, event ids and checkpoint for good; its "
                "viewers are told.\n"
                f"Type the thread id ({thread}) to delete it: ",
                end="",
                file=sys.stderr,
                flush=True,
            )
            answer = sys.stdin.readline().rstrip("\r\n")
            if answer != thread:
                said = "no answer" if not answer else f"the answer was {answer!r}"
                print(f"agui-hub delete: not deleted ({said}, not {thread!r})", file=sys.stderr)
                return 1
        deleted = await store.delete(thread)
    finally:
        await store.close()
    if not deleted:
        print(f"agui-hub delete: thread {thread!r} was gone already (deleted or expired "
              "meanwhile): nothing deleted", file=sys.stderr)  # fmt: skip
        return 1
    said = f"deleted thread {thread!r} from {where}: {_describe_thread(info)}"
    Output(sys.stdout).write(said + "\n")
    return 0


def _describe_thread(info: ThreadInfo) -> str:
    """One line about *info*'s thread: what deleting it removes."""
    span = f", offsets {info.first} to {info.last}" if info.first and info.last else ""
    activity = _iso_utc(info.last_activity)
    when = f", last activity {activity}" if activity else ""
    return f"{info.length} events ({human_size(info.bytes)}){span}{when}, epoch {info.epoch}"
