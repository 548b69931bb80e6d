"""agui_hub.gateway.fanout.branches: a branch of a thread's tree of runs, folded.

The property: for random trees of runs, the fold of a branch (what a
regenerate's input and a branch snapshot are made of) equals the fold of the
events of the runs on its path, computed here without the hub's index.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_hub.agui.patch import StateLimits
from agui_hub.agui.reducer import fold
from agui_hub.agui.runs import RunTree
from agui_hub.gateway.fanout.branches import Branch
from agui_hub.gateway.fanout.entries import EntryReader
from agui_hub.gateway.fanout.history import fold_history
from agui_hub.store.contract import Checkpoint, EventInput, Retention
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.codec import encode_msgpack

pytestmark = pytest.mark.timeout(120)

THREAD = "tree"


def run_events(run: str, parent: str | None, n: int) -> list[dict[str, Any]]:
    """A run: a user message in its input, an answer, a state change."""
    started: dict[str, Any] = {
        "type": "RUN_STARTED",
        "threadId": THREAD,
        "runId": run,
        "input": {
            "threadId": THREAD,
            "runId": run,
            "messages": [{"id": f"u-{run}", "role": "user", "content": f"question {n}"}],
            "state": {},
            "tools": [],
            "context": [],
        },
    }
    if parent is not None:
        started["parentRunId"] = parent
    message = f"a-{run}"
    return [
        started,
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"answer {n}"},
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "STATE_SNAPSHOT", "snapshot": {"last": n, f"seen-{n}": True}},
        {"type": "RUN_FINISHED", "threadId": THREAD, "runId": run},
    ]


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[str, str | None, str | None]]:
    """Runs in the order they start: (run id, parentRunId sent or None, real parent)."""
    count = draw(st.integers(1, 8))
    runs: list[tuple[str, str | None, str | None]] = []
    for i in range(count):
        run = f"r{i}"
        if not runs:
            runs.append((run, None, None))
            continue
        named = draw(st.one_of(st.none(), st.sampled_from([r for r, _, _ in runs])))
        # Without a parentRunId it continues the run started before it.
        runs.append((run, named, named if named is not None else runs[-1][0]))
    return runs


def path_of(runs: list[tuple[str, str | None, str | None]], run: str) -> list[str]:
    parents = {r: p for r, _, p in runs}
    path: list[str] = []
    current: str | None = run
    while current is not None:
        path.append(current)
        current = parents[current]
    return path[::-1]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(runs=trees(), pick=st.integers(0, 7), follow=st.booleans())
def test_a_branch_folds_the_runs_on_its_path(
    runs: list[tuple[str, str | None, str | None]], pick: int, follow: bool
) -> None:
    events = {run: run_events(run, named, i) for i, (run, named, _) in enumerate(runs)}
    target = runs[pick % len(runs)][0]

    async def main() -> tuple[Any, Any]:
        store = MemoryStore()
        for run, _, _ in runs:
            await store.append(THREAD, [EventInput.of(e, None) for e in events[run]])
        tree = RunTree(await store.runs(THREAD))
        assert {r.run_id: r.parent_run_id for r in tree.runs} == {r: p for r, _, p in runs}
        branch = Branch.of(tree, target, follow=follow)
        folded = await fold_history(store, THREAD, StateLimits(), EntryReader(THREAD), None, branch)
        return folded.state, folded.branch

    state, judged = asyncio.run(main())
    path = path_of(runs, target)
    if follow:
        # Followed, the branch goes on along the first run that continues its
        # latest run, in the order they started.
        tip = target
        for run, _, parent in runs:
            if parent == tip and run not in path:
                path.append(run)
                tip = run
        assert judged is not None and judged.tip == tip
    expected = fold([e for run in path for e in events[run]])
    assert state.messages == expected.messages
    assert state.state == expected.state


async def test_a_trimmed_branch_is_served_from_a_checkpoint_that_belongs_to_it() -> None:
    """Its early runs trimmed: folded from the latest checkpoint that holds no other
    branch's runs (complete), or else from what is left (incomplete)."""
    store = MemoryStore(retention=Retention(max_len=12))
    runs = [("r0", None), ("r1", None), ("r2", "r0"), ("r3", None)]  # r2 regenerates r1
    events = {run: run_events(run, parent, i) for i, (run, parent) in enumerate(runs)}
    await store.append(THREAD, [EventInput.of(e, None) for e in events["r0"]])
    # A checkpoint after r0, the fold of r0 alone: it belongs to every branch.
    checkpointed = fold(events["r0"])
    after_r0 = await store.last_offset(THREAD)
    epoch = await store.epoch(THREAD)
    assert epoch is not None
    packed = encode_msgpack(checkpointed.compact())
    await store.put_checkpoint(THREAD, Checkpoint(after_r0, epoch, packed, True))
    for run, _ in runs[1:]:
        await store.append(THREAD, [EventInput.of(e, None) for e in events[run]])
    kept = await store.read_available(THREAD)
    assert kept.gap and len(kept.entries) == 12  # r0 and r1 trimmed: r2 and r3 are left
    tree = RunTree(await store.runs(THREAD))

    async def branch(run: str) -> Any:
        return await fold_history(
            store, THREAD, StateLimits(), EntryReader(THREAD), None,
            Branch.of(tree, run, follow=False),
        )  # fmt: skip

    # r3 continues r2: r0, r2, r3. The checkpoint (r0 only) is its; r2 and r3 are stored.
    on_r3 = await branch("r3")
    assert on_r3.complete
    expected = fold([e for run in ("r0", "r2", "r3") for e in events[run]])
    assert (on_r3.state.messages, on_r3.state.state) == (expected.messages, expected.state)
    # r1's branch: its own events were trimmed past the checkpoint: incomplete.
    on_r1 = await branch("r1")
    assert not on_r1.complete


async def test_a_followed_branch_keeps_runs_whose_start_was_trimmed() -> None:
    """A subscriber on r1 follows r2 and r4 (they continue it): when r4's
    RUN_STARTED is trimmed, the index still says r4 is on the branch, and the run
    after it (no parentRunId: it continues r4) joins too; r3 (from r0) never."""
    store = MemoryStore(retention=Retention(max_len=8))
    runs = [("r0", None), ("r1", None), ("r3", "r0"), ("r2", "r1"), ("r4", "r2")]
    events = {run: run_events(run, parent, i) for i, (run, parent) in enumerate(runs)}
    # r4 has nine events, one more than the retention keeps: its start is trimmed.
    events["r4"][3:3] = [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "a-r4", "delta": "."}] * 3
    for run, _ in runs:
        await store.append(THREAD, [EventInput.of(e, None) for e in events[run]])
    tree = RunTree(await store.runs(THREAD))
    branch = Branch.of(tree, "r1", follow=True)
    assert (branch.runs, branch.tip) == ({"r0", "r1", "r2", "r4"}, "r4")  # never r3
    folded = await fold_history(store, THREAD, StateLimits(), EntryReader(THREAD), None, branch)
    assert not folded.complete and folded.branch is not None
    assert folded.branch.current == "r4"  # the thread's run where the fold stopped
    next_run = run_events("r5", None, 5)  # continues the run before it: r4
    await store.append(THREAD, [EventInput.of(e, None) for e in next_run])
    page = await store.read_available(THREAD, after=folded.cursor)
    judged = [folded.branch.admits(entry) for entry in page.entries]
    assert judged == [True] * len(next_run) and folded.branch.tip == "r5"
