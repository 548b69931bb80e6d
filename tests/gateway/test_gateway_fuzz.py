"""Fuzzing a live gateway (issue 10, "Acceptance").

A seeded generator (``AGUI_HUB_FUZZ_SEED``, printed with the number of frames
sent) drives several attacker connections, in both encodings, against an
in-process :class:`~agui_hub.gateway.server.Gateway`: malformed bytes, frames of the
wrong kind, non-map frames, unknown commands, fields of the wrong type, huge
ids, deep nesting, lone surrogates, C1 controls and braces in thread names,
non-ASCII digits in offsets, far-future offsets, wrong epochs, out-of-range
integers, invalid events, events that break the sequence rules, hostile but
valid events (deep STATE_SNAPSHOTs near the limits, JSON Patch copy bombs,
deltas that copy and remove a large value over and over (CPU, not memory:
refused at the work budget), hundreds of open messages, frames just over and
far over the size limit), subscribe / unsubscribe storms, and broken
WebSocket framing on raw sockets.

Meanwhile a well-behaved publisher publishes realistic runs into a thread of
its own and a well-behaved viewer, subscribed from the start, reads it.

Asserted: the gateway never crashed and logged no traceback; every frame an
attacker received is a frame of docs/protocol.md (types, fields, error codes
of its table: the codes are read from the document) and every close code is
one of its table (and not 1011); heartbeat pings are answered throughout; the
pair gets every event exactly once, in order; afterwards the gateway holds
nothing for the attackers and the test process's RSS is within
:data:`RSS_MARGIN` of its baseline.

Copy bombs are capped at 16 operations, each on a thread of its own: a gateway
without state limits then wastes ~4 MiB per bomb instead of the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from agui_hub.gateway.server import Gateway
from agui_hub.store.contract import ThreadStore
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import ROOT
from ..runs import realistic_run
from .test_gateway_leaks import RawClient, members_of, rss_bytes
from .test_server import JSON, MSGPACK, WAIT, Client, Harness

SEED = int(os.environ.get("AGUI_HUB_FUZZ_SEED", "20261203"))
FRAMES = int(os.environ.get("AGUI_HUB_FUZZ_FRAMES", "8000"))
"""Frames of the attack on the memory store (half as many on Redis); at least 10,000 in CI."""
MAX_FRAME = 64 * 1024
"""The fuzzed gateway's max_frame_bytes (its WebSocket limit is 4 times that)."""
MAX_SUBSCRIPTIONS = 20
ATTACKERS = 6
HEARTBEAT_EVERY = 25
"""Frames an attacker sends between two pings it waits for (bounds what is in flight)."""
HEARTBEAT_WAIT = 10.0 * TIMEOUT_SCALE
"""Longest a heartbeat ping may wait for its pong: longer is a stalled gateway."""
RSS_MARGIN = 64 * 1024 * 1024
"""How far above its baseline (after a warm-up attack) the test process's RSS may be
once the attackers are gone: the gateway keeps nothing for them (copy bombs would
keep 4 MiB each, every connection its queue)."""
SERVER_TYPES = {"subscribed", "unsubscribed", "published", "pong", "error", "event", "snapshot"}
OFFSET = re.compile(r"\A[0-9]+-[0-9]+\Z")

Frame = dict[str, Any]


# -- what docs/protocol.md allows --------------------------------------------------------------


def documented_codes() -> tuple[set[str], set[int]]:
    """(error codes, close codes) of the tables in docs/protocol.md."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    errors_part = text.split("### error", 1)[1].split("## Close codes", 1)[0]
    close_part = text.split("## Close codes", 1)[1]
    errors = set(re.findall(r"^\| `([a-z_]+)` \|", errors_part, re.M))
    closes = {int(c) for c in re.findall(r"^\| (\d{4}) \|", close_part, re.M)}
    assert {"bad_frame", "store_unavailable"} <= errors, errors
    assert {1000, 1009, 4000} <= closes, closes
    return errors, closes


def _is_id(value: Any) -> bool:
    return type(value) in (str, int)


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("type"), str)


def frame_problem(frame: Any, codes: set[str]) -> str | None:
    """What makes *frame* not a server frame of docs/protocol.md (None: nothing)."""
    if not isinstance(frame, dict):
        return "not a map"
    kind = frame.get("type")
    if kind not in SERVER_TYPES:
        return f"unknown frame type {kind!r}"
    if "id" in frame and not _is_id(frame["id"]):
        return f"id {frame['id']!r} is not a string or an integer"
    thread = frame.get("thread")
    if kind != "pong" and not (kind == "error" and thread is None) and not isinstance(thread, str):
        return f"{kind} without a thread"
    if kind == "error":
        if frame.get("code") not in codes:
            return f"undocumented error code {frame.get('code')!r}"
        if not isinstance(frame.get("message"), str) or not frame["message"]:
            return "error without a message"
        index = frame.get("index")
        if index is not None and not (type(index) is int and index >= 0):
            return f"index {index!r}"
    elif kind == "subscribed":
        if not (frame.get("epoch") is None or isinstance(frame.get("epoch"), str)):
            return "epoch"
        if not OFFSET.match(str(frame.get("offset"))) or not isinstance(frame.get("offset"), str):
            return "offset"
        if type(frame.get("recovered")) is not bool:
            return "recovered"
    elif kind == "published":
        offsets = frame.get("offsets")
        if not isinstance(offsets, list) or not all(
            isinstance(o, str) and OFFSET.match(o) for o in offsets
        ):
            return "offsets"
    elif kind == "event":
        if not isinstance(frame.get("offset"), str) or not OFFSET.match(frame["offset"]):
            return "offset"
        if not _is_event(frame.get("event")):
            return "event"
    elif kind == "snapshot":
        if not isinstance(frame.get("offset"), str) or not OFFSET.match(frame["offset"]):
            return "offset"
        if not (frame.get("epoch") is None or isinstance(frame.get("epoch"), str)):
            return "epoch"
        if type(frame.get("complete")) is not bool:
            return "complete"
        events = frame.get("events")
        if not isinstance(events, list) or not all(_is_event(e) for e in events):
            return "events"
    return None


# -- the generator -------------------------------------------------------------------------------


def deep_json(depth: int, kind: str = "list") -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def deep_msgpack(depth: int) -> bytes:
    return b"\x91" * depth + b"\x90"


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def _pk(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


@dataclass
class Attacker:
    """One attacking connection's generator state."""

    rng: random.Random
    binary: bool
    name: str
    pair_thread: str
    threads: list[str]
    hostile: list[str]
    """Threads that hostile-but-valid events went to (shared by the attackers)."""
    run_open: dict[str, bool] = field(default_factory=dict)
    open_messages: dict[str, list[str]] = field(default_factory=dict)
    counter: int = 0

    # -- helpers ---------------------------------------------------------------------------

    def enc(self, frame: Any) -> bytes | str:
        if self.binary:
            return _pk(frame)
        return json.dumps(frame, ensure_ascii=self.rng.random() < 0.7)

    def publish(self, thread: str, events: list[Any]) -> bytes | str:
        return self.enc({"type": "publish", "id": self.uid(), "thread": thread, "events": events})

    def uid(self) -> str:
        self.counter += 1
        return f"{self.name}-{self.counter}"

    def any_thread(self) -> str:
        r = self.rng.random()
        if r < 0.15:
            return self.pair_thread
        if r < 0.3 and self.hostile:
            return self.rng.choice(self.hostile[-50:])
        if r < 0.75:
            return self.rng.choice(self.threads)
        return f"fz-{self.rng.randrange(1000)}"

    def fresh_thread(self) -> str:
        return f"{self.name}-x-{self.uid()}"

    def big_int(self) -> int:
        if self.binary:
            return self.rng.choice([2**64 - 1, -(2**63), 2**63, 2**53, -(2**53) - 1])
        return self.rng.choice([2**70, -(2**70), 10**30, 2**64, 2**53, -(2**63) - 1])

    def weird_value(self) -> Any:
        r = self.rng
        choices: list[Any] = [
            None, True, False, 0, -1, 1.5, float("inf") if not self.binary else 1e308,
            "", "x" * r.randrange(1, 300), [], [1, "a"], {}, {"a": 1}, self.big_int(),
            "\x00", "t\nu", "{brace}", "é" * 50,
            "csi\x9b2J", "nel\x85x", "}", "}{", "{}",  # C1 controls; names that end a hash tag
        ]  # fmt: skip
        if self.binary:
            choices.append(b"\x00\x01bytes")
        return r.choice(choices)

    # -- frames ------------------------------------------------------------------------------

    def frames(self) -> list[bytes | str]:
        """One or more payloads of one randomly chosen kind."""
        r = self.rng.random()
        table: list[tuple[float, Callable[[], list[bytes | str]]]] = [
            (0.08, self.garbage),
            (0.04, self.truncated),
            (0.04, self.wrong_kind),
            (0.05, self.non_map),
            (0.05, self.unknown_command),
            (0.12, self.bad_fields),
            (0.04, self.huge_id),
            (0.04, self.deep),
            (0.04, self.surrogates),
            (0.08, self.offsets),
            (0.04, self.out_of_range),
            (0.08, self.invalid_events),
            (0.06, self.sequence_breaks),
            (0.04, self.hostile_valid),
            (0.04, self.storm),
            (0.16, self.valid),
        ]
        total = 0.0
        for weight, make in table:
            total += weight
            if r < total:
                return make()
        return self.valid()

    def garbage(self) -> list[bytes | str]:
        r = self.rng
        if self.binary:
            return [bytes(r.randrange(256) for _ in range(r.randrange(1, 200)))]
        alphabet = '{}[]":,0123456789abc \\ nulltruefalse\u00e9\u2713\U0001f600'
        return ["".join(r.choice(alphabet) for _ in range(r.randrange(0, 200)))]

    def truncated(self) -> list[bytes | str]:
        data = self.enc({"type": "subscribe", "id": self.uid(), "thread": self.any_thread()})
        cut = self.rng.randrange(1, len(data))
        return [data[:cut]]

    def wrong_kind(self) -> list[bytes | str]:
        frame = {"type": "ping", "id": self.uid()}
        if self.binary:
            return [json.dumps(frame)]
        return [_pk(frame)]

    def non_map(self) -> list[bytes | str]:
        value = self.rng.choice(
            [[1, 2], "ping", 42, 1.5, None, True, [{"type": "ping"}], [[["x"]]], ""]
        )
        return [self.enc(value)]

    def unknown_command(self) -> list[bytes | str]:
        kind = self.rng.choice(
            ["frobnicate", "", "SUBSCRIBE", "pingg", "Publish", 5, None, ["ping"], {"a": 1}, True]
        )
        return [self.enc({"type": kind, "id": self.uid()})]

    def base_command(self) -> dict[str, Any]:
        kind = self.rng.choice(["subscribe", "unsubscribe", "publish", "ping"])
        frame: dict[str, Any] = {"type": kind, "id": self.uid()}
        if kind != "ping":
            frame["thread"] = self.rng.choice(self.threads)
        if kind == "subscribe":
            frame["from"] = self.rng.choice(["live", "start", "snapshot"])
        if kind == "publish":
            frame["events"] = [{"type": "CUSTOM", "name": "n", "value": 1}]
        return frame

    def bad_fields(self) -> list[bytes | str]:
        frame = self.base_command()
        keys = [k for k in frame if k != "type"] + ["from", "run", "events", "eventIds", "event"]
        key = self.rng.choice(keys)
        if self.rng.random() < 0.2 and key in frame:
            del frame[key]
        else:
            frame[key] = self.weird_value()
        return [self.enc(frame)]

    def huge_id(self) -> list[bytes | str]:
        r = self.rng
        value = r.choice(
            ["x" * 129, "y" * 5000, "z" * 60_000, self.big_int(), 2**63 - 1, 1.5, True, [1], {}]
        )
        return [self.enc({"type": r.choice(["ping", "subscribe"]), "id": value, "thread": "t"})]

    def deep(self) -> list[bytes | str]:
        r = self.rng
        depth = r.choice([100, 255, 300, 1000, 5000, 20_000])
        where = r.choice(["id", "from", "value", "events"])
        if self.binary:
            body = deep_msgpack(depth)
            if where == "id":
                return [b"\x82" + _pk("type") + _pk("ping") + _pk("id") + body]
            if where == "from":
                head = _pk("type") + _pk("subscribe") + _pk("thread") + _pk(self.threads[0])
                return [b"\x83" + head + _pk("from") + body]
            if where == "events":
                head = _pk("type") + _pk("publish") + _pk("thread") + _pk(self.threads[0])
                return [b"\x83" + head + _pk("events") + body]
            event = b"\x83" + _pk("type") + _pk("CUSTOM") + _pk("name") + _pk("n") + _pk("value")
            head = _pk("type") + _pk("publish") + _pk("thread") + _pk(self.threads[0])
            return [b"\x83" + head + _pk("events") + b"\x91" + event + body]
        body = deep_json(depth, r.choice(["list", "dict"]))
        thread = json.dumps(self.threads[0])
        if where == "id":
            return ['{"type":"ping","id":' + body + "}"]
        if where == "from":
            return ['{"type":"subscribe","thread":' + thread + ',"from":' + body + "}"]
        if where == "events":
            return ['{"type":"publish","thread":' + thread + ',"events":' + body + "}"]
        return [
            '{"type":"publish","thread":' + thread
            + ',"events":[{"type":"CUSTOM","name":"n","value":' + body + "}]}"
        ]  # fmt: skip

    def surrogates(self) -> list[bytes | str]:
        r = self.rng
        if self.binary:
            bad = b"\xa3\xed\xa0\x80"  # a 3-byte str: a UTF-8-encoded lone surrogate
            where = r.choice(["id", "thread", "key", "event"])
            if where == "id":
                return [b"\x82" + _pk("type") + _pk("ping") + _pk("id") + bad]
            if where == "thread":
                return [b"\x82" + _pk("type") + _pk("subscribe") + _pk("thread") + bad]
            if where == "key":
                return [b"\x82" + _pk("type") + _pk("ping") + bad + _pk(1)]
            event = (
                b"\x83" + _pk("type") + _pk("CUSTOM") + _pk("name") + bad + _pk("value") + _pk(1)
            )
            head = _pk("type") + _pk("publish") + _pk("thread") + _pk(self.threads[0])
            return [b"\x83" + head + _pk("events") + b"\x91" + event]
        lone = r.choice(["\\ud800", "\\udfff", "\\udbff\\u0041", "a\\ud83d"])
        thread = json.dumps(self.threads[0])
        return [
            r.choice(
                [
                    '{"type":"ping","id":"' + lone + '"}',
                    '{"type":"subscribe","id":1,"thread":"t' + lone + '"}',
                    '{"type":"ping","' + lone + '":1}',
                    '{"type":"publish","thread":' + thread + ',"events":[{"type":"CUSTOM",'
                    '"name":"' + lone + '","value":1}]}',
                    '{"type":"subscribe","thread":' + thread + ',"from":{"offset":"1-0",'
                    '"epoch":"' + lone + '"}}',
                ]
            )
        ]

    def offsets(self) -> list[bytes | str]:
        r = self.rng
        now = int(time.time() * 1000)
        offset = r.choice(
            [
                *("\u0661-0", "1-\u0660", "\uff11-0", "\u0663\u0664-\u0665", "1\u00b2-0"),
                *("\U0001d7cf-0", "\uff11-\uff10", "99999999999999-0", f"{now + 10**9}-0"),
                *("18446744073709551615-18446744073709551615", f"{now}-{2**64 - 1}"),
                *("18446744073709551616-0", "-1-0", "0-0", "", " 1-0", "1-0 ", "1-", "-0"),
                *("1--0", "1-0-0", "0x1-0", "1e3-0", "9" * 300 + "-0", "1-0\n"),
                *(5, None, [1], {}),
            ]
        )
        epoch = r.choice(
            [None, "", "0" * 16, uuid.uuid4().hex[:16], "x" * 1000, 5, [], "\u0661" * 16]
        )
        start: dict[str, Any] = {"offset": offset}
        if r.random() < 0.8:
            start["epoch"] = epoch
        return [
            self.enc(
                {"type": "subscribe", "id": self.uid(), "thread": self.any_thread(), "from": start}
            )
        ]

    def out_of_range(self) -> list[bytes | str]:
        r = self.rng
        thread = self.rng.choice(self.threads)
        big = self.big_int()
        event = r.choice(
            [
                {"type": "CUSTOM", "name": "n", "value": big},
                {"type": "CUSTOM", "name": "n", "value": {"deep": [1, [big]]}},
                {"type": "RUN_STARTED", "threadId": thread, "runId": "r", "timestamp": big},
                {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "user", "timestamp": big},
            ]
        )
        events = [{"type": "CUSTOM", "name": "ok", "value": 1}, event]
        return [self.enc({"type": "publish", "id": self.uid(), "thread": thread, "events": events})]

    def invalid_events(self) -> list[bytes | str]:
        r = self.rng
        thread = r.choice(self.threads)
        bad = r.choice(
            [
                {"type": "TEXT_MESSAGE_CONTENT"},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": ""},
                {"type": "NOPE"},
                {"type": 5},
                {},
                "string",
                None,
                [1],
                {"type": "RUN_STARTED", "threadId": 5, "runId": "r"},
                {"type": "STATE_DELTA", "delta": "not a list"},
                {"type": "STATE_DELTA", "delta": [{"op": "bogus", "path": "/a"}]},
                {"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/nope/x"}]},
                {"type": "STATE_SNAPSHOT"},
                {"type": "TOOL_CALL_START", "toolCallId": "c"},
                {"type": "MESSAGES_SNAPSHOT", "messages": [{"id": 1}]},
                {"type": "CUSTOM", "name": "n", "value": 1.5, "extra": {1: 2}}
                if self.binary
                else {"type": "CUSTOM", "name": "n", "value": math.nan},
                {"type": "TEXT_MESSAGE_CHUNK", "delta": "x"},
                {"type": "RAW", "event": None},
            ]
        )
        events: list[Any] = [{"type": "CUSTOM", "name": "ok", "value": 1}] * r.randrange(3)
        events.append(bad)
        return [self.enc({"type": "publish", "id": self.uid(), "thread": thread, "events": events})]

    def sequence_breaks(self) -> list[bytes | str]:
        r = self.rng
        thread = r.choice(self.threads)
        message = f"nope-{self.uid()}"
        bad = r.choice(
            [
                [{"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": "x"}],
                [{"type": "TEXT_MESSAGE_END", "messageId": message}],
                [{"type": "TOOL_CALL_ARGS", "toolCallId": message, "delta": "x"}],
                [{"type": "TOOL_CALL_END", "toolCallId": message}],
                [
                    {"type": "RUN_STARTED", "threadId": thread, "runId": "dup"},
                    {"type": "RUN_STARTED", "threadId": thread, "runId": "dup"},
                ],
                [
                    {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
                    {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
                ],
                [{"type": "RUN_FINISHED", "threadId": "other", "runId": "nope"}],
                [{"type": "STEP_FINISHED", "stepName": message}],
            ]
        )
        return [self.enc({"type": "publish", "id": self.uid(), "thread": thread, "events": bad})]

    def hostile_valid(self) -> list[bytes | str]:
        r = self.rng
        thread = self.fresh_thread()  # never stacked on an earlier bomb
        self.hostile.append(thread)
        run = {"type": "RUN_STARTED", "threadId": thread, "runId": "h"}
        # Followed live by this connection: the gateway folds what it stores.
        follow = self.enc({"type": "subscribe", "id": self.uid(), "thread": thread})
        choice = r.randrange(7)
        if choice == 0:  # a deep state, then deltas that make it deeper
            depth = r.choice([60, 64, 65, 120, 250])
            events: list[Any] = [run, {"type": "STATE_SNAPSHOT", "snapshot": nested(depth)}]
            path = "/a" * (depth - 1)
            for key in ("b", "c"):
                op = {"op": "add", "path": f"{path}/{key}", "value": nested(250)}
                events.append({"type": "STATE_DELTA", "delta": [op]})
            if r.random() < 0.5:  # as separate publishes, like the issue's reproduction
                return [
                    follow,
                    self.publish(thread, events[:2]),
                    self.publish(thread, [events[2]]),
                    self.publish(thread, [events[3]]),
                ]
        elif choice == 1:  # a JSON Patch copy bomb (at most 16 doublings: ~4 MiB)
            count = r.randrange(8, 17)
            if r.random() < 0.5:
                ops = [{"op": "copy", "from": "", "path": f"/c{i}"} for i in range(count)]
            else:
                ops = [{"op": "copy", "from": "/x", "path": "/x/-"} for _ in range(count)]
            events = [
                run,
                {"type": "STATE_SNAPSHOT", "snapshot": {"s": "x" * 64, "x": ["y" * 64]}},
                {"type": "STATE_DELTA", "delta": ops},
            ]
        elif choice == 6:  # copies and removals of a large value: CPU, bounded by max_work
            items = r.randrange(2_000, 12_000)  # ~5 units each to walk; 4 bytes in JSON
            snapshot = {"type": "STATE_SNAPSHOT", "snapshot": {"s": [[] for _ in range(items)]}}
            ops = [{"op": "copy", "from": "/s", "path": "/t"}, {"op": "remove", "path": "/t"}]
            deltas = [{"type": "STATE_DELTA", "delta": ops}] * r.randrange(1, 300)
            return [
                follow,
                self.publish(thread, [run, snapshot]),
                self.publish(thread, deltas),
            ]
        elif choice == 2:  # hundreds of open messages
            events = [run] + [
                {"type": "TEXT_MESSAGE_START", "messageId": f"m{i}", "role": "assistant"}
                for i in range(r.randrange(100, 500))
            ]
        elif choice == 3:  # a frame just over max_frame_bytes
            pad = "p" * (MAX_FRAME + r.randrange(1, 4096))
            events = [run, {"type": "CUSTOM", "name": "pad", "value": pad}]
        elif choice == 4:  # a frame far over it (closes the connection: rare)
            pad = "q" * (4 * MAX_FRAME + r.randrange(1, 8192))
            events = [run, {"type": "CUSTOM", "name": "pad", "value": pad}]
        else:  # big but under the limit: a large state and a large delta
            events = [
                run,
                {"type": "STATE_SNAPSHOT", "snapshot": {"k": ["v" * 100] * r.randrange(100, 500)}},
                {"type": "TEXT_MESSAGE_START", "messageId": "big", "role": "assistant"},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": "big", "delta": "d" * 8000},
            ]
        return [follow, self.publish(thread, events)]

    def storm(self) -> list[bytes | str]:
        r = self.rng
        out: list[bytes | str] = []
        for _ in range(r.randrange(10, 40)):
            thread = self.any_thread()
            if r.random() < 0.55:
                start = r.choice(["live", "start", "snapshot", None, {"offset": "0-0"}])
                frame: dict[str, Any] = {"type": "subscribe", "id": self.uid(), "thread": thread}
                if start is not None:
                    frame["from"] = start
                if r.random() < 0.1:
                    frame["run"] = r.choice(["r1", "h", "run-1"])
            else:
                frame = {"type": "unsubscribe", "id": self.uid(), "thread": thread}
            out.append(self.enc(frame))
        return out

    def valid(self) -> list[bytes | str]:
        r = self.rng
        if r.random() < 0.3:
            return [self.enc({"type": "ping", "id": self.uid()})]
        thread = r.choice(self.threads)
        events: list[dict[str, Any]] = []
        opened = self.open_messages.setdefault(thread, [])
        if not self.run_open.get(thread):
            events.append({"type": "RUN_STARTED", "threadId": thread, "runId": self.uid()})
            self.run_open[thread] = True
        for _ in range(r.randrange(1, 8)):
            choice = r.random()
            if choice < 0.2 or not opened:
                message = self.uid()
                opened.append(message)
                events.append(
                    {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"}
                )
            elif choice < 0.85:
                events.append(
                    {"type": "TEXT_MESSAGE_CONTENT", "messageId": r.choice(opened), "delta": "tök✓"}
                )
            else:
                events.append({"type": "TEXT_MESSAGE_END", "messageId": opened.pop()})
        if r.random() < 0.1:
            events += [{"type": "TEXT_MESSAGE_END", "messageId": m} for m in opened]
            opened.clear()
            events.append({"type": "RUN_FINISHED", "threadId": thread, "runId": "x"})
            self.run_open[thread] = False
        return [self.enc({"type": "publish", "id": self.uid(), "thread": thread, "events": events})]


# -- running the attack ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What the attackers saw."""

    sent: int = 0
    received: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    closes: Counter[int] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    slow_pongs: list[float] = field(default_factory=list)
    reconnects: int = 0

    def problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)


class AttackConnection:
    """An attacker's socket and its reader task (which checks every frame)."""

    def __init__(self, ws: ClientConnection, binary: bool, tally: Tally, codes: set[str]) -> None:
        self.ws = ws
        self.binary = binary
        self.tally = tally
        self.codes = codes
        self.pongs: dict[str, asyncio.Future[None]] = {}
        self.closing = False
        """Set when we close: a close we started is not the server's answer to anything."""
        self.reader = asyncio.create_task(self.read())

    async def read(self) -> None:
        tally = self.tally
        try:
            async for message in self.ws:
                tally.received += 1
                if self.binary != isinstance(message, bytes):
                    kind = "binary" if self.binary else "JSON"
                    tally.problem(f"a {kind} connection got {type(message).__name__}")
                    continue
                try:
                    frame = (
                        msgpack.unpackb(message, raw=False) if self.binary else json.loads(message)
                    )
                except Exception as exc:
                    tally.problem(f"undecodable frame: {exc!r}")
                    continue
                problem = frame_problem(frame, self.codes)
                if problem:
                    tally.problem(f"{problem}: {str(frame)[:300]}")
                    continue
                tally.kinds[frame["type"]] += 1
                if frame["type"] == "error":
                    tally.codes[frame["code"]] += 1
                elif frame["type"] == "pong":
                    future = self.pongs.pop(str(frame.get("id")), None)
                    if future is not None and not future.done():
                        future.set_result(None)
        except ConnectionClosed:
            pass
        finally:
            if not self.closing:
                code = self.ws.close_code
                if code is None:
                    tally.problem("the server dropped a connection without a close frame")
                else:
                    tally.closes[code] += 1
            for future in self.pongs.values():
                if not future.done():
                    future.set_exception(ConnectionError("closed"))

    async def heartbeat(self, beat: str) -> None:
        future = asyncio.get_running_loop().create_future()
        self.pongs[beat] = future
        frame = {"type": "ping", "id": beat}
        await self.ws.send(_pk(frame) if self.binary else json.dumps(frame))
        started = time.monotonic()
        try:
            await asyncio.wait_for(future, HEARTBEAT_WAIT)
        except TimeoutError:
            self.tally.problem(f"heartbeat {beat} not answered within {HEARTBEAT_WAIT:.0f}s")
            raise
        self.tally.slow_pongs.append(time.monotonic() - started)

    async def close(self) -> None:
        if self.ws.close_code is None:
            self.closing = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 3)
        self.ws.transport.abort()
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader


async def attack(
    port: int, attacker: Attacker, quota: int, tally: Tally, codes: set[str], deadline: float
) -> None:
    """Send at least *quota* frames (reconnecting after every close) or stop at *deadline*."""
    protocol = MSGPACK if attacker.binary else JSON

    async def open_connection() -> AttackConnection:
        ws = await connect(
            f"ws://127.0.0.1:{port}",
            subprotocols=[protocol],  # type: ignore[list-item]
            proxy=None,
            open_timeout=WAIT,
            close_timeout=2,
            max_size=None,
        )
        return AttackConnection(ws, attacker.binary, tally, codes)

    async def reopen(conn: AttackConnection | None) -> AttackConnection | None:
        if conn is not None:
            await conn.close()
            tally.reconnects += 1
        try:
            return await open_connection()
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            tally.problem(f"{attacker.name}: cannot connect: {exc!r}")
            return None

    conn = await reopen(None)
    sent = beats = stalls = 0
    try:
        while conn is not None and sent < quota and time.monotonic() < deadline:
            for payload in attacker.frames():
                try:
                    await conn.ws.send(payload)
                except ConnectionClosed:
                    conn = await reopen(conn)
                    if conn is None or tally.reconnects > 400:
                        tally.problem("reconnecting all the time")
                        return
                    continue
                sent += 1
                tally.sent += 1
                if sent % HEARTBEAT_EVERY:
                    continue
                beats += 1
                try:
                    await conn.heartbeat(f"hb-{attacker.name}-{beats}")
                except TimeoutError:
                    stalls += 1
                    if stalls >= 3:
                        tally.problem(f"{attacker.name}: gave up after {stalls} stalled heartbeats")
                        return
                    conn = await reopen(conn)
                except (ConnectionClosed, ConnectionError):
                    conn = await reopen(conn)
                if conn is None:
                    return
    finally:
        if conn is not None:
            await conn.close()


async def raw_framing_attacks(port: int, rng: random.Random, tally: Tally) -> None:
    """Broken WebSocket framing on raw sockets; each must end in a documented close."""
    cases: list[tuple[str, Callable[[RawClient], Any]]] = [
        ("invalid UTF-8 text", lambda c: c.send_frame(0x1, b'{"type":"ping","id":"\xff\xfe"}')),
        ("unmasked frame", lambda c: c.send_frame(0x1, b'{"type":"ping"}', mask=False)),
        ("reserved opcode", lambda c: c.send_frame(0x3, b"x")),
        ("RSV1 without extension", lambda c: c.send_frame(0x1, b'{"type":"ping"}', rsv=4)),
        ("fragmented control frame", lambda c: c.send_frame(0x9, b"p", fin=False)),
        ("continuation without start", lambda c: c.send_frame(0x0, b"x")),
        ("oversized ping payload", lambda c: c.send_frame(0x9, b"p" * 200)),
        ("bad close code", lambda c: c.send_frame(0x8, b"\x03\xe7bye")),
    ]
    for _ in range(2):
        for name, send in cases:
            client = await RawClient.connect(port, rng.choice([JSON, MSGPACK]), rcvbuf=65536)
            try:
                await send(client)
                tally.sent += 1
                code = await client.close_code(WAIT)
                tally.closes[code if code is not None else 1006] += 1
                if code is None:
                    tally.problem(f"raw '{name}': the connection ended without a close frame")
            except TimeoutError:
                tally.problem(f"raw '{name}': no close within {WAIT:.0f}s")
            finally:
                client.abort()


@dataclass
class Pair:
    """The well-behaved publisher and viewer of one thread."""

    thread: str
    publisher: Client
    viewer: Client
    published: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    other: list[Any] = field(default_factory=list)
    """Frames the viewer got besides the thread's events; failures of either client."""


async def view(pair: Pair, until: asyncio.Event) -> None:
    """The viewer reads everything; anything but events (and the epoch's announcement) is noted."""
    while True:
        try:
            frame = await pair.viewer.recv(timeout=0.5)
        except ConnectionClosed as exc:
            pair.other.append(f"the viewer was closed: {exc!r}")
            return
        except TimeoutError:
            if until.is_set() and pair.published and pair.received[-1:] == pair.published[-1:]:
                return
            continue
        if frame["type"] == "event" and frame["thread"] == pair.thread:
            pair.received.append((frame["offset"], frame["event"]))
        elif not (frame["type"] == "subscribed" and "id" not in frame and frame.get("recovered")):
            pair.other.append(frame)


async def publish_runs(
    pair: Pair, first: int, *, runs: int, pace: float, until: asyncio.Event | None = None
) -> None:
    """Publish *runs* runs (more while *until* is not set, up to 30), batches of 10."""
    for k in range(first, first + 30):
        if k >= first + runs and (until is None or until.is_set()):
            return
        events = realistic_run(pair.thread, f"run-{k}", turns=4)
        for i in range(0, len(events), 10):
            chunk = events[i : i + 10]
            ids = [f"run-{k}-{i + j}" for j in range(len(chunk))]
            try:
                offsets = await pair.publisher.publish(pair.thread, chunk, ids)
            except (AssertionError, ConnectionClosed, TimeoutError) as exc:
                pair.other.append(f"the publisher failed: {exc!r}"[:300])
                return
            pair.published += list(zip(offsets, chunk, strict=True))
            await asyncio.sleep(pace)


def store_for(kind: str, request: pytest.FixtureRequest) -> Callable[..., ThreadStore]:
    if kind == "memory":
        return lambda retention=None: MemoryStore(retention=retention)
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"test-fuzz-{uuid.uuid4().hex}"
    return lambda retention=None: RedisStore(server.url, prefix=prefix, retention=retention)


@pytest.fixture
async def fuzz_harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    h = Harness(store_for(request.param, request))
    try:
        yield h
    finally:
        await h.close()


async def run_attack(
    gateway: Gateway, seed: int, frames: int, tally: Tally, codes: set[str], budget: float
) -> None:
    rng = random.Random(seed)
    pair_thread = "pair"
    hostile: list[str] = []
    attackers = [
        Attacker(
            random.Random(rng.random()),
            binary=i % 2 == 1,
            name=f"a{seed % 1000}-{i}",
            pair_thread=pair_thread,
            # With braces too: on Redis their keys must stay in one slot.
            threads=[f"fz-{seed % 1000}-{i}-{j}" for j in range(4)] + [f"}}fz{i}{{", f"a{{{i}}}"],
            hostile=hostile,
        )
        for i in range(ATTACKERS)
    ]
    deadline = time.monotonic() + budget
    quota = -(-frames // ATTACKERS)
    results = await asyncio.gather(
        *(attack(gateway.config.port, a, quota, tally, codes, deadline) for a in attackers),
        raw_framing_attacks(gateway.config.port, random.Random(rng.random()), tally),
        return_exceptions=True,
    )
    for result in results:
        if isinstance(result, BaseException):
            tally.problem(f"an attacker failed: {result!r}"[:300])


@pytest.mark.parametrize(
    ("fuzz_harness", "frames", "budget"),
    [
        pytest.param("memory", FRAMES, 60.0, marks=pytest.mark.timeout(90), id="memory"),
        pytest.param("redis", FRAMES // 2, 30.0, marks=pytest.mark.timeout(60), id="redis"),
    ],
    indirect=["fuzz_harness"],
)
async def test_fuzzing_a_live_gateway(
    fuzz_harness: Harness, frames: int, budget: float, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    error_codes, close_codes = documented_codes()
    h = fuzz_harness
    gateway = await h.gateway(max_frame_bytes=MAX_FRAME, max_subscriptions=MAX_SUBSCRIPTIONS)

    pair = Pair("pair", await h.client(gateway, MSGPACK), await h.client(gateway, JSON))
    pair_conns = set(gateway.connections)
    reply = await pair.viewer.subscribe(pair.thread, "start")
    assert reply["recovered"] is True
    done = asyncio.Event()
    attacked = asyncio.Event()
    viewer = asyncio.create_task(view(pair, done))
    publisher: asyncio.Task[None] | None = None
    try:
        # Warm-up: a short attack of another seed; then the baseline.
        warm = Tally()
        await run_attack(gateway, SEED + 1, 600, warm, error_codes, 20.0)
        await publish_runs(pair, 0, runs=1, pace=0.0)
        gc.collect()
        await asyncio.sleep(0.5)
        baseline = rss_bytes(os.getpid())

        tally = Tally()
        started = time.monotonic()
        publisher = asyncio.create_task(publish_runs(pair, 1, runs=3, pace=0.05, until=attacked))
        try:
            await run_attack(gateway, SEED, frames, tally, error_codes, budget)
        finally:
            attacked.set()
        took = time.monotonic() - started
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(publisher), 6 * WAIT)
        done.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(viewer), 3 * WAIT)
    finally:
        for task in (viewer, publisher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

    # Nothing is left for the attackers.
    deadline = time.monotonic() + 5 * TIMEOUT_SCALE
    while time.monotonic() < deadline:
        left = [t for t in gateway.hub.channels if t != pair.thread]
        if set(gateway.connections) <= pair_conns and not left:
            break
        await asyncio.sleep(0.1)
    gc.collect()
    await asyncio.sleep(0.5)
    after = rss_bytes(os.getpid())

    for t in (warm, tally):
        print(
            f"fuzz seed {SEED if t is tally else SEED + 1}: {t.sent} frames sent "
            f"({t.reconnects} reconnects), {t.received} received; "
            f"kinds {dict(t.kinds)}; error codes {dict(t.codes)}; closes {dict(t.closes)}"
        )
    pongs = sorted(tally.slow_pongs)
    print(
        f"attack took {took:.1f}s; heartbeat pongs: {len(pongs)}, slowest "
        f"{pongs[-1] if pongs else float('nan'):.2f}s; test process RSS baseline "
        f"{baseline / 2**20:.1f} MiB, after {after / 2**20:.1f} MiB "
        f"({(after - baseline) / 2**20:+.1f} MiB, margin {RSS_MARGIN / 2**20:.0f} MiB)"
    )

    failures: list[str] = []

    def expect(ok: bool, text: str) -> None:
        if not ok:
            failures.append(text)

    expect(tally.sent >= frames, f"only {tally.sent} of {frames} frames sent in {budget:.0f}s")
    tracebacks = [
        f"{r.levelname} {r.name}: {r.getMessage()}"[:300]
        for r in caplog.records
        if r.exc_info is not None and r.levelno >= logging.WARNING
    ]
    expect(not tracebacks, "tracebacks in the log:\n  " + "\n  ".join(tracebacks[:10]))
    problems = warm.problems + tally.problems
    expect(not problems, "what the attackers saw go wrong:\n  " + "\n  ".join(problems[:20]))
    seen_codes = set(warm.codes) | set(tally.codes)
    expect(seen_codes <= error_codes, f"undocumented error codes: {seen_codes - error_codes}")
    seen_closes = set(warm.closes) | set(tally.closes)
    expect(seen_closes <= close_codes, f"undocumented close codes: {seen_closes - close_codes}")
    expect(1011 not in seen_closes, f"{tally.closes[1011]} internal errors (1011)")
    expect(
        not gateway._draining and gateway.server is not None and gateway.server.is_serving(),
        "the gateway stopped serving",
    )
    # The pair: every event exactly once, in order, and nothing else.
    expect(pair.other == [], f"the pair saw: {str(pair.other[:5])[:600]}")
    expect(
        pair.received == pair.published,
        f"the viewer got {len(pair.received)} events, {len(pair.published)} were published"
        + ("" if pair.received == pair.published[: len(pair.received)] else " (not a prefix)"),
    )
    expect(len({o for o, _ in pair.received}) == len(pair.received), "the viewer got duplicates")
    # The gateway holds nothing for the attackers.
    expect(
        set(gateway.connections) == pair_conns,
        f"{len(set(gateway.connections) - pair_conns)} attacker connection(s) left",
    )
    expect(
        set(gateway.hub.channels) <= {pair.thread},
        f"{len(gateway.hub.channels) - 1} attacker channel(s) left",
    )
    expect(len(members_of(gateway, pair.thread)) == 1, "attackers left as members of the pair")
    expect(
        after - baseline <= RSS_MARGIN,
        f"RSS grew by {(after - baseline) / 2**20:.1f} MiB during the attack",
    )
    assert not failures, "\n".join(failures)
    await pair.publisher.ping()
    await pair.viewer.ping()
