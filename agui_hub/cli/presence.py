"""``agui-hub presence``: who watches a thread now, on every gateway that shares
the store (docs/protocol.md, ``presence``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .common import (
    GATEWAY_URL_HELP,
    TOKEN_HELP,
    Output,
    Subcommands,
    UsageError,
    client_token,
    hub_url,
    thread_name,
)
from .retry import DEFAULT_TIMEOUT, WAIT_HELP, Retry, connect_client, timeout_of

if TYPE_CHECKING:
    from ..client.presence import Watcher

MAX_LIMIT = 1000
"""The most entries one ``presence`` reply lists (the gateway's bound)."""

# What a terminal could act on, in a subject or a client map (they come from other
# people's tokens and clients): shown escaped, never written raw.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_BARE = re.compile(r"[^\s=\"]+")


def add_presence_parser(commands: Subcommands) -> None:
    parser = commands.add_parser(
        "presence",
        help="who watches a thread now",
        description="Print who is subscribed to THREAD now, on every gateway that shares "
        "the store: the count, then one line per connection (its subject, connection "
        "id, when it joined in local time, and what its client announced of itself). "
        "Exit 1 when the gateway keeps no presence (--presence off) or the token does "
        "not grant the thread.",
    )
    parser.add_argument("thread")
    parser.add_argument("--limit", type=int, default=100,
                        help=f"list the first N to join (default 100, at most {MAX_LIMIT}); "
                        "the count is always everyone")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help='the reply as one JSON object: {"thread", "count", "more", '
                        '"entries": [{"connection", "subject", "joined", "client"}]}')  # fmt: skip
    parser.add_argument("--url", help=GATEWAY_URL_HELP)
    parser.add_argument("--token", help=TOKEN_HELP)
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=WAIT_HELP % f"{DEFAULT_TIMEOUT:g}")  # fmt: skip


async def presence_command(args: argparse.Namespace) -> int:
    thread = thread_name(args.thread)
    if not 0 < args.limit <= MAX_LIMIT:
        raise UsageError(f"--limit must be from 1 to {MAX_LIMIT}")
    url = hub_url(args, gateway_only=True)
    retry = Retry("presence", url, timeout_of(args, DEFAULT_TIMEOUT))
    client = await connect_client(url, retry, client_token(args))
    try:
        presence = await client.presence(thread, args.limit, timeout=retry.timeout)
    finally:
        await client.close()
    out = Output(sys.stdout)
    if args.json:
        out.write(json.dumps({"thread": thread, **presence.as_json()}, ensure_ascii=False) + "\n")
    else:
        out.write(f"{presence.count} watching {thread}\n")
        out.write("".join(line + "\n" for line in render(presence.entries)))
    if presence.hidden:
        print("agui-hub presence: this gateway shows the count only (--presence count)",
              file=sys.stderr)  # fmt: skip
    elif presence.more:
        print(f"agui-hub presence: the first {len(presence.entries)} of {presence.count} "
              "are listed (--limit)", file=sys.stderr)  # fmt: skip
    return 0


def render(entries: tuple[Watcher, ...]) -> list[str]:
    """One line per watcher, in columns: subject, connection, joined (local time), client."""
    rows = [
        (
            _shown(w.subject),
            _shown(w.connection),
            _local_time(w.joined),
            _client(w.client),
        )
        for w in entries
    ]
    if not rows:
        return []
    subject_width = max(len(row[0]) for row in rows)
    connection_width = max(len(row[1]) for row in rows)
    return [
        f"{subject.ljust(subject_width)}  {connection.ljust(connection_width)}  "
        f"{joined}  {client}".rstrip()
        for subject, connection, joined, client in rows
    ]


def _shown(text: str) -> str:
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _local_time(ms: int | None) -> str:
    if ms is None:
        return "joined ?"
    return "joined " + datetime.fromtimestamp(ms / 1000).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _client(client: dict[str, Any] | None) -> str:
    """``name=web device=laptop``: a value quoted (JSON) when it is not one plain word."""
    if not client:
        return ""
    parts = []
    for key, value in client.items():
        if isinstance(value, str) and _BARE.fullmatch(value):
            shown = value
        else:
            shown = json.dumps(value, ensure_ascii=False)
        parts.append(f"{_shown(key)}={_shown(shown)}")
    return " ".join(parts)
