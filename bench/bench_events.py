"""Events per second: parse + validate + msgpack encode, ours vs the official SDK.

Usage::

    python bench/bench_events.py [--events 20000] [--runs 5]

Both pipelines start from the same UTF-8 JSON bytes of a realistic run (mostly
TEXT_MESSAGE_CONTENT token deltas, some tool calls, state deltas, steps) and
end with msgpack bytes of the canonical wire dict:

* agui-hub: ``codec.decode_json`` -> ``events.validate_wire`` -> ``codec.encode_msgpack``;
* official: ``json.loads`` -> ``TypeAdapter(ag_ui.core.Event).validate_python``
  -> ``dump_python(mode="json", by_alias=True)`` -> ``msgpack.packb``.

A second line does the same from already-decoded dicts (no JSON parsing), and
a third runs our model path (``parse_event`` + ``to_wire``) for reference. The
figure that matters is the ratio, measured in the same process: absolute rates
on a shared machine are noise. Prints the median of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgpack
from ag_ui.core import Event as OfficialEvent
from pydantic import TypeAdapter

from agui_hub.agui.events import parse_event, to_wire, validate_wire
from agui_hub.wire.codec import decode_json, encode_msgpack


def realistic_run(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """About 85% token deltas, 8% tool-call events, 4% state deltas, the rest markers."""
    rng = random.Random(seed)
    words = ["the", " agent", " streams", " tokens", " to", " every", " viewer", ".", "\n"]
    events: list[dict[str, Any]] = [
        {
            "type": "RUN_STARTED",
            "threadId": "thread-1",
            "runId": "run-1",
            "timestamp": 1764700000000,
        }
    ]
    msg = 0
    while len(events) < n:
        roll = rng.random()
        ts = 1764700000000 + len(events)
        if roll < 0.05:
            msg += 1
            events.append(
                {
                    "type": "TEXT_MESSAGE_START",
                    "messageId": f"msg-{msg}",
                    "role": "assistant",
                    "timestamp": ts,
                }
            )
        elif roll < 0.88:
            events.append(
                {
                    "type": "TEXT_MESSAGE_CONTENT",
                    "messageId": f"msg-{msg}",
                    "delta": rng.choice(words),
                    "timestamp": ts,
                }
            )
        elif roll < 0.90:
            events.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": f"call-{len(events)}",
                    "toolCallName": "search_docs",
                    "parentMessageId": f"msg-{msg}",
                }
            )
        elif roll < 0.94:
            events.append(
                {
                    "type": "TOOL_CALL_ARGS",
                    "toolCallId": "call-1",
                    "delta": '{"query": "redis streams"',
                }
            )
        elif roll < 0.96:
            events.append({"type": "TOOL_CALL_END", "toolCallId": "call-1", "timestamp": ts})
        elif roll < 0.99:
            events.append(
                {
                    "type": "STATE_DELTA",
                    "delta": [
                        {"op": "replace", "path": "/progress", "value": len(events)},
                        {"op": "add", "path": "/log/-", "value": "step"},
                    ],
                }
            )
        else:
            events.append({"type": "STEP_STARTED", "stepName": "retrieve", "timestamp": ts})
    events.append({"type": "RUN_FINISHED", "threadId": "thread-1", "runId": "run-1"})
    return events


def measure(pipeline: Callable[[Any], bytes], inputs: list[Any]) -> float:
    start = time.perf_counter()
    for item in inputs:
        pipeline(item)
    return len(inputs) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    events = realistic_run(args.events)
    blobs = [json.dumps(e).encode() for e in events]
    official = TypeAdapter(OfficialEvent)

    def ours_from_bytes(blob: bytes) -> bytes:
        return encode_msgpack(validate_wire(decode_json(blob)))

    def official_from_bytes(blob: bytes) -> bytes:
        event = official.validate_python(json.loads(blob))
        return msgpack.packb(official.dump_python(event, mode="json", by_alias=True))

    def ours_from_dict(obj: dict[str, Any]) -> bytes:
        return encode_msgpack(validate_wire(obj))

    def ours_models_from_dict(obj: dict[str, Any]) -> bytes:
        return encode_msgpack(to_wire(parse_event(obj)))

    def official_from_dict(obj: dict[str, Any]) -> bytes:
        event = official.validate_python(obj)
        return msgpack.packb(official.dump_python(event, mode="json", by_alias=True))

    # Same output, or the comparison is meaningless.
    for blob in blobs[:500]:
        assert msgpack.unpackb(ours_from_bytes(blob)) == msgpack.unpackb(official_from_bytes(blob))

    rows = {
        "bytes  agui-hub (validate_wire)": (ours_from_bytes, blobs),
        "bytes  official ag_ui.core": (official_from_bytes, blobs),
        "dicts  agui-hub (validate_wire)": (ours_from_dict, events),
        "dicts  agui-hub (models)": (ours_models_from_dict, events),
        "dicts  official ag_ui.core": (official_from_dict, events),
    }
    results: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.runs):
        for name, (pipeline, inputs) in rows.items():
            results[name].append(measure(pipeline, inputs))
    med = {name: statistics.median(rates) for name, rates in results.items()}

    print(f"{len(events)} events, median of {args.runs} runs (events/s)")
    for name, rate in med.items():
        print(f"  {name:34s} {rate:>10,.0f}")
    print(
        f"ratio from bytes  (ours / official): "
        f"{med['bytes  agui-hub (validate_wire)'] / med['bytes  official ag_ui.core']:.2f}"
    )
    print(
        f"ratio from dicts  (ours / official): "
        f"{med['dicts  agui-hub (validate_wire)'] / med['dicts  official ag_ui.core']:.2f}"
    )
    print(
        f"ratio models path (ours / official): "
        f"{med['dicts  agui-hub (models)'] / med['dicts  official ag_ui.core']:.2f}"
    )


if __name__ == "__main__":
    main()
