"""The work budget of state patches (agui/patch.py ``WorkBudget``, ``StateLimits.max_work``).

What a patch does to values the document holds already (measuring what it
copies, removes, replaces or moves, copying containers along its paths,
shifting array items, saving a key order) is charged to a budget before it
is done; values the event brings cost nothing. A writer shares one budget
between the events of a publish; a fold gives each event its own, larger one.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from agui_hub.agui.documents import StateDocuments
from agui_hub.agui.patch import (
    FOLD_WORK_FACTOR,
    Document,
    StateLimits,
    UndoLog,
    WorkBudget,
    apply_patch,
    snapshot_document,
)
from agui_hub.agui.reducer import ThreadState
from agui_hub.errors import LimitExceeded

pytestmark = pytest.mark.timeout(60)

ROOMY = StateLimits(max_work=10**9)


def strings(n: int) -> dict[str, str]:
    return {f"k{i:05d}": "x" * 90 for i in range(n)}


def doc_of(value: Any, limits: StateLimits = ROOMY) -> Document:
    return snapshot_document(value, limits, "STATE_SNAPSHOT", "the state")


def cost(value: Any, patch: list[dict[str, Any]]) -> int:
    """Work units *patch* spends on a document of *value*."""
    work = WorkBudget(10**9)
    apply_patch(doc_of(value), patch, ROOMY, UndoLog(), "STATE_DELTA", "the state", work)
    return work.spent


def churn(count: int) -> list[dict[str, Any]]:
    """The issue's attack: STATE_DELTA events that copy the big value and remove the copy."""
    ops = [{"op": "copy", "from": "/s", "path": "/t"}, {"op": "remove", "path": "/t"}]
    return [{"type": "STATE_DELTA", "delta": ops} for _ in range(count)]


# -- what each step costs ---------------------------------------------------------------------


def test_measuring_a_value_of_the_document_costs_per_value() -> None:
    # An object entry costs two (its key too), an array item one, a container four.
    assert cost({"s": strings(1000)}, [{"op": "copy", "from": "/s", "path": "/t"}]) == (
        1 + 4 + 2 * 1000  # the root copied (2 slots), the walk of /s
    )
    assert cost({"s": [[] for _ in range(1000)]}, [{"op": "remove", "path": "/s"}]) == (
        1 + 4 + 1000 * (1 + 4)
    )
    # A container met twice in one walk is walked once.
    shared = strings(1000)
    assert cost({"s": [shared, shared]}, [{"op": "remove", "path": "/s"}]) < 2 * 2000


def test_values_the_event_brings_cost_nothing() -> None:
    big = [{"a": i, "b": [i, i]} for i in range(10_000)]
    assert cost({}, [{"op": "add", "path": "/big", "value": big}]) == 1  # the root, copied
    assert cost({"x": 1}, [{"op": "replace", "path": "/x", "value": big}]) == 1 + 1
    assert cost({"x": big}, [{"op": "test", "path": "/x", "value": big}]) == 0


def test_copies_shifts_and_key_orders_are_charged() -> None:
    # The path to a change is copied (the snapshot is shared): one unit per 16 slots.
    assert cost({"s": strings(1600)}, [{"op": "add", "path": "/s/new", "value": 1}]) == 1 + 101
    # Shifting the items after an insert or a removal: one per 256.
    items = list(range(256_000))
    assert cost({"a": items}, [{"op": "add", "path": "/a/0", "value": 0}]) == 1 + 16_001 + 1000
    assert cost({"a": items}, [{"op": "add", "path": "/a/-", "value": 0}]) == 1 + 16_001
    # Removing a key other than the last saves the key order (three per key).
    first = {"s": strings(1000)}
    assert cost(first, [{"op": "remove", "path": "/s/k00000"}]) == 1 + 63 + 3 * 1000 + 1
    assert cost(first, [{"op": "remove", "path": "/s/k00999"}]) == 1 + 63 + 1


def test_a_walk_stops_as_soon_as_the_budget_is_spent() -> None:
    """The work is bounded before it is done: a refused copy of a large value
    costs the budget, not the value."""
    doc = doc_of({"s": strings(200_000)}, StateLimits(max_bytes=64 * 1024 * 1024))
    work = WorkBudget(1000)
    started = time.process_time()
    with pytest.raises(LimitExceeded) as refused:
        apply_patch(
            doc,
            [{"op": "copy", "from": "/s", "path": "/t"}],
            StateLimits(max_bytes=64 * 1024 * 1024),
            UndoLog(),
            "STATE_DELTA",
            "the state",
            work,
        )
    assert time.process_time() - started < 0.02  # a full walk takes ~0.1 s
    assert (refused.value.limit, refused.value.code) == ("max_work", "limit_exceeded")
    assert refused.value.value == StateLimits().max_work  # the limit's setting, as documented
    assert work.spent == 1000 and work.left < 0
    work.restart()
    assert work.left == 1000 and work.spent == 1000


# -- the attack, judged and folded -------------------------------------------------------


def test_a_publish_of_copy_remove_deltas_is_refused_at_the_budget() -> None:
    limits = StateLimits()
    docs = StateDocuments(limits)
    docs.apply({"type": "STATE_SNAPSHOT", "snapshot": {"s": strings(9000)}})
    before = docs.size
    work = WorkBudget(limits.max_work)
    docs.begin()
    started = time.process_time()
    with pytest.raises(LimitExceeded) as refused:
        for n, event in enumerate(churn(300)):
            try:
                docs.apply(event, work)
            except LimitExceeded as exc:
                exc.index = n
                raise
    docs.rollback()
    elapsed = time.process_time() - started
    # Each delta walks the 9000 entries twice (~36,000 units): the second is refused.
    assert refused.value.limit == "max_work" and refused.value.index == 1
    assert work.spent == limits.max_work
    assert docs.size == before and docs.state["s"] == strings(9000) and "t" not in docs.state
    assert elapsed < 0.5  # it took 10 s of CPU before the budget
    # One delta alone is within a publish's budget.
    docs.apply(churn(1)[0], WorkBudget(limits.max_work))
    assert docs.size == before


def test_each_publish_has_its_own_budget_and_a_fold_a_larger_one_per_event() -> None:
    limits = StateLimits()
    docs = StateDocuments(limits)
    docs.apply({"type": "STATE_SNAPSHOT", "snapshot": {"s": strings(9000)}})
    for event in churn(20):  # one budget per call: every delta fits its own
        docs.apply(event)
    # A stored event is folded with FOLD_WORK_FACTOR budgets: what a writer
    # allowed one publish always fits one event of the fold.
    heavy = {"type": "STATE_DELTA", "delta": churn(1)[0]["delta"] * 2}  # ~72,000 units
    with pytest.raises(LimitExceeded):
        docs.apply(heavy)
    assert docs.fold(heavy)
    too_heavy = {"type": "STATE_DELTA", "delta": churn(1)[0]["delta"] * 4}
    assert FOLD_WORK_FACTOR * limits.max_work < 4 * 36_000
    assert not docs.fold(too_heavy)  # skipped, changing nothing
    assert "t" not in docs.state


def test_the_thread_state_gives_up_on_an_event_it_cannot_afford() -> None:
    state = ThreadState()
    state.apply({"type": "STATE_SNAPSHOT", "snapshot": {"s": strings(9000)}})
    before = state.work
    state.apply(churn(1)[0])
    assert state.work - before >= 36_000  # counted, for a caller to yield on
    too_heavy = {"type": "STATE_DELTA", "delta": churn(1)[0]["delta"] * 4}
    started = time.process_time()
    with pytest.raises(LimitExceeded) as refused:
        state.apply(too_heavy)
    assert time.process_time() - started < 0.5
    assert refused.value.limit == "max_work"
    assert list(state.state) == ["s"] and len(state.state["s"]) == 9000
    # A smaller budget per event comes with smaller limits.
    small = ThreadState(limits=StateLimits(max_work=1000))
    small.apply({"type": "STATE_SNAPSHOT", "snapshot": {"s": strings(9000)}})
    with pytest.raises(LimitExceeded):
        small.apply(churn(1)[0])
    with pytest.raises(ValueError):
        StateLimits(max_work=0)


def test_a_refused_walk_still_counts_what_it_spent() -> None:
    """Work spent before another limit refused the patch counts too (a
    connection's rate charges it)."""
    limits = StateLimits(max_depth=4)
    # The deep item comes last: the walk of the copy finds it after the rest.
    doc = doc_of({"s": [[] for _ in range(100)] + [[[1]]]})
    work = WorkBudget(10**6)
    with pytest.raises(LimitExceeded) as refused:
        apply_patch(
            doc,
            [
                {"op": "add", "path": "/c", "value": {}},
                {"op": "copy", "from": "/s", "path": "/c/e"},
            ],
            limits,
            UndoLog(),
            "STATE_DELTA",
            "the state",
            work,
        )
    assert refused.value.limit == "max_depth"
    assert work.spent >= 100 * 5
