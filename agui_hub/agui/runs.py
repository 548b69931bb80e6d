"""The runs of a thread as a tree: AG-UI's ``parentRunId``, made visible.

Every ``RUN_STARTED`` names the run it continues in ``parentRunId``; one that
names none continues the run started before it in the thread (so a thread
published before branches existed is one straight branch). A run's *branch*
is the path from the root of its tree to it. The stores keep one
:class:`RunInfo` per run next to the stream (docs/store.md), built with the
rules of this module: the hub's Lua script applies the same ones in Redis,
and the contract tests hold both stores to them.

Pure: no I/O. :func:`started_run` and :func:`ended_status` read one event;
:class:`RunTree` orders what a store returns and answers paths and children.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CANCELLED_CODE",
    "PREVIEW_BYTES",
    "RunInfo",
    "RunState",
    "RunTree",
    "ended_status",
    "input_preview",
]

CANCELLED_CODE = "AGUI_HUB_RUN_CANCELLED"
"""The ``RUN_ERROR`` code of a run somebody cancelled (its status: cancelled)."""

PREVIEW_BYTES = 160
"""At most this many bytes of UTF-8 of a run's input preview (cut at a character)."""


class RunState(enum.StrEnum):
    """Where a run stands, as the index of runs says."""

    RUNNING = "running"
    FINISHED = "finished"
    ERROR = "error"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run of a thread.

    *parent_run_id* is the run it continues (``None``: a root); *first* the
    offset of its ``RUN_STARTED``, *last* that of its ``RUN_FINISHED`` or
    ``RUN_ERROR`` (while it runs: the thread's newest offset, when it is the
    thread's current run; else ``None``). *preview* is the start of the last
    user message of its input (``""`` without one).
    """

    run_id: str
    parent_run_id: str | None
    status: RunState
    first: str
    last: str | None
    preview: str

    def as_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "parentRunId": self.parent_run_id,
            "status": self.status.value,
            "first": self.first,
            "last": self.last,
            "preview": self.preview,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunInfo:
        """The inverse of :meth:`as_json` (raises ``KeyError`` / ``ValueError``)."""
        return cls(
            run_id=str(data["runId"]),
            parent_run_id=data.get("parentRunId"),
            status=RunState(data["status"]),
            first=str(data["first"]),
            last=data.get("last"),
            preview=str(data.get("preview") or ""),
        )


def cut_utf8(text: str, limit: int = PREVIEW_BYTES) -> str:
    """*text* cut to at most *limit* bytes of UTF-8, at a character boundary."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore")


def input_preview(run_started: Mapping[str, Any]) -> str:
    """The preview of a run: the start of the last user message in the
    ``input`` of its ``RUN_STARTED`` (a string, or the first text part)."""
    run_input = run_started.get("input")
    if not isinstance(run_input, Mapping):
        return ""
    messages = run_input.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return cut_utf8(content)
            if isinstance(content, list):
                for part in content:
                    if (
                        isinstance(part, Mapping)
                        and part.get("type") == "text"
                        and isinstance(part.get("text"), str)
                    ):
                        return cut_utf8(part["text"])
            return ""
    return ""


def ended_status(event: Mapping[str, Any]) -> RunState | None:
    """The status a ``RUN_FINISHED`` or ``RUN_ERROR`` gives its run (``None``
    for any other event)."""
    kind = event.get("type")
    if kind == "RUN_FINISHED":
        return RunState.FINISHED
    if kind == "RUN_ERROR":
        return RunState.CANCELLED if event.get("code") == CANCELLED_CODE else RunState.ERROR
    return None


def _stream_order(offset: str) -> tuple[int, int]:
    """A stream offset (``<ms>-<seq>``) as numbers, for ordering."""
    ms, _, seq = offset.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return (0, 0)


class RunTree:
    """The runs of one thread, in the order they started, as a tree.

    Build it from what a store's ``runs`` returns (any order). A run whose
    parent is not among them (trimmed away, or named by a producer but never
    stored) is a root. *more*: older runs were left out of *runs* (a ``runs``
    reply's limit).
    """

    def __init__(self, runs: Iterable[RunInfo], *, more: bool = False) -> None:
        self.more = more
        self.runs: list[RunInfo] = sorted(runs, key=lambda r: _stream_order(r.first))
        self.by_id: dict[str, RunInfo] = {r.run_id: r for r in self.runs}
        self._children: dict[str | None, list[RunInfo]] = {}
        for run in self.runs:
            parent = run.parent_run_id if run.parent_run_id in self.by_id else None
            self._children.setdefault(parent, []).append(run)

    def children(self, run_id: str | None) -> list[RunInfo]:
        """The runs that continue *run_id* (``None``: the roots), oldest first."""
        return list(self._children.get(run_id, ()))

    def path(self, run_id: str) -> list[RunInfo]:
        """The branch of *run_id*: its runs from the root to it (``KeyError``:
        no such run). A cycle (only a hand-made index can have one) ends it."""
        path: list[RunInfo] = []
        seen: set[str] = set()
        current: str | None = run_id
        while current is not None and current in self.by_id and current not in seen:
            seen.add(current)
            run = self.by_id[current]
            path.append(run)
            current = run.parent_run_id
        if not path:
            raise KeyError(run_id)
        path.reverse()
        return path

    def tips(self) -> list[RunInfo]:
        """The runs nothing continues: one per branch, oldest first."""
        return [r for r in self.runs if not self._children.get(r.run_id)]

    def render(self) -> list[str]:
        """The tree as lines of text, one run each, children indented under
        their parent (``agui-hub runs`` prints them)."""
        lines: list[str] = []

        def walk(run: RunInfo, prefix: str, last: bool, root: bool) -> None:
            branch = "" if root else ("└─ " if last else "├─ ")
            preview = f"  {run.preview!r}" if run.preview else ""
            lines.append(f"{prefix}{branch}{run.run_id}  {run.status.value}{preview}")
            kids = self._children.get(run.run_id, [])
            inner = prefix if root else prefix + ("   " if last else "│  ")
            for i, kid in enumerate(kids):
                walk(kid, inner, i == len(kids) - 1, False)

        for root in self._children.get(None, []):
            walk(root, "", True, True)
        return lines
