"""JSON Patch documents: what a document is counted to cost in memory.

(The patch operations themselves are tested against the jsonpatch library
in test_reducer.py, their work in test_work.py.)
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import msgpack
import pytest

from agui_hub.agui.patch import (
    StateLimits,
    UndoLog,
    adopted_document,
    apply_patch,
    snapshot_document,
)

pytestmark = pytest.mark.timeout(60)

LIMITS = StateLimits(max_bytes=64 * 1024 * 1024)

SHAPES: dict[str, Any] = {
    "unique keys of strings": {"s": {f"k{i:05d}": "x" * 90 for i in range(3000)}},
    "records": {"items": [{"id": i, "name": f"item {i}", "tags": ["a"]} for i in range(3000)]},
    "floats": [i * 0.5 for i in range(20_000)],
    "large integers": [10**9 + i for i in range(20_000)],
    "empty lists": [[] for _ in range(20_000)],
    "empty objects": [{} for _ in range(20_000)],
    "non-ASCII text": [{"t": f"Zürich ✓ {i}"} for i in range(3000)],
}


def traced(wire: bytes) -> tuple[Any, int]:
    """The value *wire* decodes to, and the memory it takes (tracemalloc).

    Decoded once before, so that the interpreter's table of interned strings
    has grown already: that growth comes in steps (it doubles), which would
    make the figure depend on what the process interned before.
    """
    msgpack.unpackb(wire)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = msgpack.unpackb(wire)
        return value, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_memory_counted_is_what_the_document_takes(shape: str) -> None:
    """At least the memory traced and at most 2.5x it, whatever the shape,
    where the encoded size is 1x to 25x off."""
    value, used = traced(msgpack.packb(SHAPES[shape]))
    doc = snapshot_document(value, LIMITS, "STATE_SNAPSHOT", "the state")
    assert 0.95 * used <= doc.memory <= 2.5 * used, (doc.memory, used)


def test_memory_follows_patches_and_is_released_with_the_values() -> None:
    doc = adopted_document({"a": []})
    empty = doc.memory
    big = msgpack.unpackb(msgpack.packb([{"n": i * 0.5} for i in range(1000)]))
    apply_patch(doc, [{"op": "add", "path": "/b", "value": big}], LIMITS, UndoLog(), "", "")
    added = doc.memory - empty
    assert added >= 1000 * (64 + 24)  # a small dict and a float each, at least
    assert adopted_document(doc.root).memory == doc.memory  # the running count is exact
    undo = UndoLog()
    apply_patch(doc, [{"op": "remove", "path": "/b"}], LIMITS, undo, "", "")
    assert doc.memory - empty < 200  # what is left: room the root object kept
    undo.rollback()
    assert doc.memory == empty + added  # an undone patch leaves the count as it was
    apply_patch(
        doc,
        [{"op": "copy", "from": "/b", "path": "/a/-"}, {"op": "move", "from": "/a", "path": "/c"}],
        LIMITS,
        UndoLog(),
        "",
        "",
    )
    # A copy shares its source, but counts again: an upper bound.
    assert adopted_document(doc.root).memory == doc.memory >= 2 * added
