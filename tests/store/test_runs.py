"""The index of runs, on both stores: the rules of agui_hub/agui/runs.py."""

from __future__ import annotations

from typing import Any

import pytest

from agui_hub.agui.runs import PREVIEW_BYTES, RunState, RunTree, cut_utf8
from agui_hub.store.contract import EventInput, Retention

from .conftest import StoreFactory

pytestmark = pytest.mark.timeout(60)


def started(run: str, parent: str | None = None, said: Any = None) -> EventInput:
    event: dict[str, Any] = {"type": "RUN_STARTED", "threadId": "t", "runId": run}
    if parent is not None:
        event["parentRunId"] = parent
    if said is not None:
        event["input"] = {
            "threadId": "t",
            "runId": run,
            "messages": [
                {"id": "u0", "role": "user", "content": "an earlier question"},
                {"id": "a0", "role": "assistant", "content": "an answer"},
                {"id": f"u-{run}", "role": "user", "content": said},
            ],
            "state": {},
            "tools": [],
            "context": [],
        }
    return EventInput.of(event, f"start-{run}")


def finished(run: str) -> EventInput:
    return EventInput.of({"type": "RUN_FINISHED", "threadId": "t", "runId": run}, f"end-{run}")


def failed(run: str, code: str | None = None) -> EventInput:
    event: dict[str, Any] = {"type": "RUN_ERROR", "message": "it broke"}
    if code is not None:
        event["code"] = code
    return EventInput(event, f"end-{run}", run_id=run)


def text(i: int) -> EventInput:
    return EventInput.of(
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}"}, f"x{i}"
    )


async def test_a_straight_thread_is_one_branch(make_store: StoreFactory) -> None:
    store = await make_store()
    assert await store.runs("t") == []
    [s1] = await store.append("t", [started("r1")])
    *_, e1 = await store.append("t", [text(1), finished("r1")])
    [s2] = await store.append("t", [started("r2")])
    [head] = await store.append("t", [text(2)])
    runs = await store.runs("t")
    assert [r.run_id for r in runs] == ["r1", "r2"]
    r1, r2 = runs
    assert (r1.parent_run_id, r1.status, r1.first, r1.last) == (None, RunState.FINISHED, s1, e1)
    # No parentRunId: it continues the run before it. Still running, the
    # thread's current run: its last offset is the thread's newest.
    assert (r2.parent_run_id, r2.status, r2.first, r2.last) == ("r1", RunState.RUNNING, s2, head)
    tree = RunTree(runs)
    assert [r.run_id for r in tree.path("r2")] == ["r1", "r2"]
    assert [r.run_id for r in tree.tips()] == ["r2"]


async def test_parent_run_id_makes_branches(make_store: StoreFactory) -> None:
    store = await make_store()
    await store.append("t", [started("r1"), finished("r1")])
    await store.append("t", [started("r2"), finished("r2")])
    await store.append("t", [started("r3", parent="r1"), failed("r3")])  # a regenerate
    await store.append("t", [started("r4", parent="r1"), failed("r4", "AGUI_HUB_RUN_CANCELLED")])
    await store.append("t", [started("r5"), finished("r5")])  # continues r4, the run before
    runs = {r.run_id: r for r in await store.runs("t")}
    assert {k: (r.parent_run_id, r.status.value) for k, r in runs.items()} == {
        "r1": (None, "finished"),
        "r2": ("r1", "finished"),
        "r3": ("r1", "error"),
        "r4": ("r1", "cancelled"),
        "r5": ("r4", "finished"),
    }
    tree = RunTree(runs.values())
    assert [r.run_id for r in tree.children("r1")] == ["r2", "r3", "r4"]
    assert [r.run_id for r in tree.path("r5")] == ["r1", "r4", "r5"]
    assert [r.run_id for r in tree.tips()] == ["r2", "r3", "r5"]
    # Runs not current and not ended have no last offset.
    await store.append("t", [started("r6", parent="r2"), started("r7", parent="r2")])
    runs = {r.run_id: r for r in await store.runs("t")}
    assert runs["r6"].last is None and runs["r7"].last is not None


async def test_the_preview_is_the_last_user_message_of_the_input(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    long_text = "héllo wörld ✓ " * 40  # non-ASCII, cut inside a character somewhere
    parts = [
        {"type": "binary", "mimeType": "image/png", "url": "u"},
        {"type": "text", "text": "look"},
    ]
    await store.append(
        "t",
        [
            started("plain", said="what is 2 + 2?"),
            started("long", said=long_text),
            started("parts", said=parts),
            started("none"),
        ],
    )
    previews = {r.run_id: r.preview for r in await store.runs("t")}
    assert previews["plain"] == "what is 2 + 2?"
    assert previews["long"] == cut_utf8(long_text)
    assert len(previews["long"].encode()) <= PREVIEW_BYTES
    assert long_text.startswith(previews["long"]) and len(previews["long"]) > 100
    assert previews["parts"] == "look"
    assert previews["none"] == ""


async def test_the_index_outlives_trimming_and_goes_with_the_epoch(
    make_store: StoreFactory,
) -> None:
    store = await make_store(Retention(max_len=3))
    for i in range(4):
        await store.append("t", [started(f"r{i}"), text(i), finished(f"r{i}")])
    assert len((await store.read_available("t")).entries) == 3
    assert [r.run_id for r in await store.runs("t")] == ["r0", "r1", "r2", "r3"]
    assert await store.delete("t") is True
    assert await store.runs("t") == []
    await store.append("t", [started("fresh")])
    assert [(r.run_id, r.parent_run_id) for r in await store.runs("t")] == [("fresh", None)]


async def test_a_retried_or_repeated_run_started_is_indexed_once(
    make_store: StoreFactory,
) -> None:
    store = await make_store()
    [first] = await store.append("t", [started("r1", said="first")])
    await store.append("t", [started("r1", said="first")])  # a retry: same event id
    again = EventInput.of(
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r1", "parentRunId": "zz"}, "other"
    )
    await store.append("t", [again])  # stored, but the index keeps the first
    [run] = await store.runs("t")
    assert (run.run_id, run.first, run.parent_run_id, run.preview) == ("r1", first, None, "first")


async def test_the_index_keeps_the_newest_runs(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("agui_hub.store.memory.MAX_RUNS", 8)
    monkeypatch.setattr("agui_hub.store.redis.appends.MAX_RUNS", 8)
    store = await make_store()
    for i in range(10):
        await store.append("t", [started(f"r{i}")])
    # The 9th run passes the bound: the oldest two go (an eighth of it, and one).
    assert [r.run_id for r in await store.runs("t")] == [f"r{i}" for i in range(2, 10)]
