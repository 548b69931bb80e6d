"""The latest-entries cache (agui_hub.gateway.fanout.recent) counted at what it
really costs: memory measured with tracemalloc stays within 25% of what the
budget and the ``agui_hub_recent_entries_bytes`` gauge say, at every moment
of a steady stream, and an entry that leaves is released at once.

The entries are made as the Redis store makes them (every string and bytes
object their own), since there the cache is their only holder; the last test
runs a hub on a real Redis and measures the entries its live reader made.
"""

from __future__ import annotations

import fnmatch
import gc
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agui_hub.gateway.fanout import channels as hub_module
from agui_hub.gateway.fanout.recent import RecentBounds, RecentBudget, RecentEntries
from agui_hub.store.contract import Entry, entry_cost
from agui_hub.store.redis import RedisStore
from agui_hub.wire.protocol import StartKind
from tests.conftest import RedisServer
from tests.gateway.test_hub_recent import Viewer, until

pytestmark = pytest.mark.timeout(120)

TOLERANCE = 0.25


def fresh(text: str) -> str:
    """*text* as a new object, as decoding a Redis reply makes it."""
    return text.encode().decode()


def shaped(data: int, event_id: str, run_id: str | None) -> Iterator[Entry]:
    """Endless entries of *data* bytes with these ids (made unique), offsets ascending."""
    n = 0
    while True:
        n += 1
        yield Entry(
            fresh(f"{1712345678901 + n // 4}-{n % 4}"),
            bytes([n % 251]) * data,
            fresh(f"{event_id}{n}"),
            None if run_id is None else fresh(run_id),
            fresh("TEXT_MESSAGE_CONTENT"),
        )


SHAPES = {
    "small": (40, uuid.uuid4().hex, f"run-{uuid.uuid4()}"),
    "typical": (200, uuid.uuid4().hex, f"run-{uuid.uuid4()}"),
    "no run": (200, uuid.uuid4().hex, None),
    "large": (4000, uuid.uuid4().hex, f"run-{uuid.uuid4()}"),
    "non-ascii ids": (60, "évènement-" + "\U0001f600" * 8, "exécution-\u4e2d\u6587"),
    "long ids": (60, "i" * 400, "r" * 300),
}


class Traced:
    """Memory allocated since it was made (tracemalloc)."""

    def __init__(self) -> None:
        gc.collect()
        self.base = tracemalloc.get_traced_memory()[0]

    def now(self) -> int:
        return tracemalloc.get_traced_memory()[0] - self.base


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_budget_counts_what_the_entries_cost(shape: str, traced: None) -> None:
    data, event_id, run_id = SHAPES[shape]
    make = shaped(data, event_id, run_id)
    budget = RecentBudget(2 * 1024 * 1024)
    memory = Traced()
    recent = RecentEntries("0-0", RecentBounds(10**9, 10**12), budget)
    while recent.start == "0-0":  # until the budget is full: the oldest entry goes
        recent.add(next(make))
    full = len(recent)
    # A steady stream: every entry added pushes the oldest out. Measured
    # throughout, since entries that left but were still referenced would
    # show only between two compactions.
    ratios = []
    for n in range(3 * full):
        recent.add(next(make))
        if n % (full // 8) == 0:
            ratios.append(memory.now() / budget.used)
    assert budget.used <= budget.limit
    assert all(abs(r - 1) <= TOLERANCE for r in ratios), (shape, ratios)
    # Entries that leave are released at once: a smaller budget, a smaller memory.
    budget.limit //= 4
    recent.trim()
    assert len(recent) < full // 3
    assert abs(memory.now() / budget.used - 1) <= TOLERANCE, (shape, memory.now(), budget.used)
    recent.release()
    assert budget.used == 0
    del recent
    assert memory.now() < 8 * 1024  # nothing of the entries is left


def test_a_non_ascii_id_is_counted_at_4_bytes_a_character() -> None:
    ascii_id = Entry("1-0", b"x", "a" * 100, None, "CUSTOM")
    wide = Entry("1-0", b"x", "\U0001f600" * 100, None, "CUSTOM")
    assert entry_cost(wide) - entry_cost(ascii_id) == 300
    with_run = Entry("1-0", b"x", "a" * 100, "r", "CUSTOM")
    assert entry_cost(with_run) > entry_cost(ascii_id) + 50  # a run id is an object too


async def test_a_hub_on_redis_keeps_its_budget_in_real_memory(
    redis_server: RedisServer, traced: None
) -> None:
    """Three live threads on a real Redis fill a 1 MiB budget: the entries the
    store's live reader made and the cache keeps weigh what the gauge says,
    and they are gone once the channels close."""
    store = RedisStore(redis_server.url, prefix=f"recent-memory-{uuid.uuid4().hex}")
    hub = hub_module.Hub(store, recent_budget=1024 * 1024)
    keepers: dict[str, Viewer] = {}
    try:
        threads = ["a", "b", "c"]
        for t in threads:
            keepers[t] = Viewer()
            await hub.subscribe(keepers[t], t, 0, StartKind.LIVE, None)
            await hub.publish(t, [{"type": "RUN_STARTED", "threadId": t, "runId": f"run-{t}"}])
        await until(
            lambda: all(len(keepers[t].offsets()) == 1 for t in threads), "the runs relayed"
        )
        base = entries_memory() - hub.recent_bytes  # the store's own objects, and 3 entries
        sent = dict.fromkeys(threads, 1)
        ratios: list[float] = []
        for round_ in range(20):
            for t in threads:
                batch: list[dict[str, Any]] = [
                    {"type": "CUSTOM", "name": "tick", "value": f"{round_}-{i}-" + "v" * 150}
                    for i in range(100)
                ]
                await hub.publish(t, batch)
                sent[t] += len(batch)
            await until(
                lambda: all(len(keepers[t].offsets()) == sent[t] for t in threads),
                "every event relayed",
            )
            if round_ >= 10:  # the budget is full from about round 6 on
                ratios.append((entries_memory() - base) / hub.recent_bytes)
        assert hub.recent_bytes >= 0.9 * hub.recent_budget
        assert all(abs(r - 1) <= TOLERANCE for r in ratios), ratios
        for t in threads:
            hub.unsubscribe(keepers[t], t)
        await until(lambda: not hub.channels and hub.recent_bytes == 0, "the channels to close")
        assert entries_memory() - base < 0.05 * hub.recent_budget
    finally:
        await hub.close()
        await store.close()


def entries_memory() -> int:
    """Bytes held now that were allocated by the code that makes stored entries
    (the Redis store's replies and notifications) and keeps them (the cache)."""
    gc.collect()
    # Summed per file, then the files kept: what Snapshot.filter_traces() with these
    # patterns keeps, without matching each of the ~100,000 traces one by one
    # (seconds a measurement under tracemalloc).
    per_file = tracemalloc.take_snapshot().statistics("filename")
    return sum(
        stat.size
        for stat in per_file
        if any(fnmatch.fnmatch(stat.traceback[0].filename, p) for p in ENTRY_FILES)
    )


ENTRY_FILES = (
    "*/agui_hub/store/redis/*",
    "*/agui_hub/gateway/fanout/recent.py",
    "<string>",  # Entry.__new__, made by NamedTuple
)
"""The files whose allocations :func:`entries_memory` counts (fnmatch patterns)."""
