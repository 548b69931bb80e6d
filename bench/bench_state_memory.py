"""What a state document costs in memory against what the writer's cache
counts for it.

Usage::

    python bench/bench_state_memory.py

Each document is folded from a STATE_SNAPSHOT into the writer's
``StateDocuments`` under ``tracemalloc``; printed: its approximate encoded size
(``StateDocuments.size``, what ``--state-max-bytes`` bounds), the memory
traced and its ratio to the encoded size, and the memory counted
(``StateDocuments.memory``, what the writer's ``max_state_cache_bytes``
budgets) with its ratio to the memory traced (1 or more: never less than
what it costs).
No I/O; a few seconds.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import msgpack

from agui_hub.agui.documents import StateDocuments
from agui_hub.agui.patch import StateLimits

CASES: dict[str, Any] = {
    "9,000 keys of 90-character strings": {"s": {f"k{i:05d}": "x" * 90 for i in range(9000)}},
    "5,000 small objects (id, name, flag, tags)": {
        "items": [
            {"id": i, "name": f"item {i}", "done": i % 2 == 0, "tags": ["a", "b"]}
            for i in range(5000)
        ]
    },
    "200,000 small integers": {"a": [1] * 200_000},
    "100,000 floats": {"a": [i * 0.5 for i in range(100_000)]},
    "100,000 empty lists": {"a": [[] for _ in range(100_000)]},
    "100,000 empty objects": {"a": [{} for _ in range(100_000)]},
    "2,000 nested records of non-ASCII text": {
        "rows": [
            {
                "who": {"name": f"Zoë {i}", "city": "Zürich"},
                "note": "naïve café " * 4,
                "n": 10**6 + i,
            }
            for i in range(2000)
        ]
    },
}


def main() -> None:
    limits = StateLimits(max_bytes=64 * 1024 * 1024)
    print("| state document | encoded | in memory | / encoded | counted | counted / in memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, document in CASES.items():
        wire = msgpack.packb({"type": "STATE_SNAPSHOT", "snapshot": document})
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        docs = StateDocuments(limits)
        docs.apply(msgpack.unpackb(wire))
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        print(
            f"| {name} | {docs.size:,} B | {used:,} B | {used / docs.size:.1f} "
            f"| {docs.memory:,} B | {docs.memory / used:.2f} |"
        )


if __name__ == "__main__":
    main()
