"""agui_hub.agui.runs: the tree of a thread's runs, from what a store indexes."""

from __future__ import annotations

import random

import pytest

from agui_hub.agui.runs import (
    CANCELLED_CODE,
    PREVIEW_BYTES,
    RunInfo,
    RunState,
    RunTree,
    cut_utf8,
    ended_status,
    input_preview,
)

pytestmark = pytest.mark.timeout(30)


def run(run_id: str, parent: str | None, n: int, status: RunState = RunState.FINISHED) -> RunInfo:
    return RunInfo(run_id, parent, status, f"1700000000000-{n}", f"1700000000000-{n}", "")


def test_paths_children_and_tips() -> None:
    runs = [run("a", None, 1), run("b", "a", 2), run("c", "a", 3), run("d", "c", 4)]
    random.Random(7).shuffle(runs)  # a store may answer in any order
    tree = RunTree(runs)
    assert [r.run_id for r in tree.runs] == ["a", "b", "c", "d"]
    assert [r.run_id for r in tree.path("d")] == ["a", "c", "d"]
    assert [r.run_id for r in tree.children("a")] == ["b", "c"]
    assert [r.run_id for r in tree.children(None)] == ["a"]
    assert [r.run_id for r in tree.tips()] == ["b", "d"]
    with pytest.raises(KeyError):
        tree.path("nope")


def test_offsets_order_numerically() -> None:
    later = RunInfo("later", None, RunState.RUNNING, "10-0", None, "")
    earlier = RunInfo("earlier", None, RunState.RUNNING, "9-5", None, "")
    assert [r.run_id for r in RunTree([later, earlier]).runs] == ["earlier", "later"]


def test_a_run_whose_parent_is_gone_is_a_root() -> None:
    tree = RunTree([run("b", "trimmed-away", 2), run("c", "b", 3)])
    assert [r.run_id for r in tree.children(None)] == ["b"]
    assert [r.run_id for r in tree.path("c")] == ["b", "c"]


def test_a_cycle_in_a_hand_made_index_ends_the_path() -> None:
    tree = RunTree([run("x", "y", 1), run("y", "x", 2)])
    assert [r.run_id for r in tree.path("x")] == ["y", "x"]
    assert tree.render() == []  # no root to start from: nothing drawn, nothing hangs


def test_render_draws_the_tree() -> None:
    runs = [
        RunInfo("r1", None, RunState.FINISHED, "1-0", "1-1", "hi"),
        RunInfo("r2", "r1", RunState.FINISHED, "2-0", "2-1", ""),
        RunInfo("r3", "r1", RunState.CANCELLED, "3-0", "3-1", "again"),
        RunInfo("r4", "r2", RunState.RUNNING, "4-0", None, ""),
    ]
    assert RunTree(runs).render() == [
        "r1  finished  'hi'",
        "├─ r2  finished",
        "│  └─ r4  running",
        "└─ r3  cancelled  'again'",
    ]


def test_json_round_trip() -> None:
    info = RunInfo("r", "p", RunState.ERROR, "1-0", "2-0", "why")
    assert RunInfo.from_json(info.as_json()) == info
    assert info.as_json()["status"] == "error"


def test_status_of_the_event_that_ends_a_run() -> None:
    assert ended_status({"type": "RUN_FINISHED"}) is RunState.FINISHED
    assert ended_status({"type": "RUN_ERROR", "message": "m"}) is RunState.ERROR
    assert ended_status({"type": "RUN_ERROR", "code": CANCELLED_CODE}) is RunState.CANCELLED
    assert ended_status({"type": "TEXT_MESSAGE_CONTENT"}) is None


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}], "q2"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "q"),
        ([{"role": "user", "content": [{"type": "text", "text": "t"}]}], "t"),
        ([{"role": "user", "content": [{"type": "binary", "url": "u"}]}], ""),
        ([{"role": "user"}], ""),
        ([{"role": "assistant", "content": "a"}], ""),
        ("not a list", ""),
    ],
)
def test_input_preview(messages: object, expected: str) -> None:
    assert input_preview({"input": {"messages": messages}}) == expected


def test_input_preview_without_input() -> None:
    assert input_preview({"type": "RUN_STARTED"}) == ""
    assert input_preview({"input": "nope"}) == ""


def test_cut_utf8_never_splits_a_character() -> None:
    for text in ["a" * 500, "é" * 500, "✓" * 500, "😀" * 500, "aé✓😀" * 100]:
        cut = cut_utf8(text)
        assert len(cut.encode()) <= PREVIEW_BYTES
        assert text.startswith(cut)
        assert len(cut.encode()) > PREVIEW_BYTES - 4  # as much as fits
    assert cut_utf8("short") == "short"
