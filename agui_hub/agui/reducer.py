"""Fold AG-UI events into the state of a thread, and render it back compactly.

:class:`ThreadState` is what a front end shows: the shared state document,
the message list (text, tool calls and results, reasoning, activity), the
runs of the thread with their lineage, and what is still streaming. It is
built the way the official TypeScript client's default reducer builds it
(``defaultApplyEvents`` in ``@ag-ui/client`` 1.0), on canonical wire dicts:

* STATE_SNAPSHOT replaces the state; STATE_DELTA applies an RFC 6902 JSON
  Patch (add, remove, replace, move, copy, test; RFC 6901 pointers). A patch
  that fails raises :class:`~agui_hub.errors.PatchError` and leaves the state
  unchanged.
* TEXT_MESSAGE_*, TOOL_CALL_*, TOOL_CALL_RESULT and REASONING_* build
  messages; event metadata is merged into the message (or tool call) it
  targets; MESSAGES_SNAPSHOT merges by id; ACTIVITY_SNAPSHOT / ACTIVITY_DELTA
  update activity messages.
* ``*_CHUNK`` events are expanded on the way in (:mod:`agui_hub.agui.chunks`).

:meth:`ThreadState.compact` renders the state as a short event sequence (run
markers, MESSAGES_SNAPSHOT, STATE_SNAPSHOT, and a re-opening event for each
item still streaming). Folding that sequence into a fresh state gives an equal
state, so a late viewer can be handed the compact sequence instead of every
token delta, and then continue with the live events.

Bounded cost
------------
A relay folds every thread it serves in one process, so no event may cost
more than its share:

* :class:`StateLimits` bound the state document and each activity message's
  content (nesting depth, approximate encoded bytes). A STATE_SNAPSHOT,
  STATE_DELTA, ACTIVITY_SNAPSHOT or ACTIVITY_DELTA that would exceed them
  raises :class:`~agui_hub.errors.LimitExceeded` and changes nothing.
* A JSON Patch is applied in place, with an undo log for a patch that fails
  half-way: its cost is that of its operations, not of the document. The size
  of the document is kept as a running estimate. Values are shared, not
  copied (copy-on-write), so ``copy`` costs nothing until the copy changes,
  and :meth:`~ThreadState.compact` hands out the documents without copying
  them. Nothing recurses: any nesting is safe.
* Messages and tool calls are found through indexes by id; token deltas are
  collected and joined when the message is read, not concatenated one by one.

So folding costs about the same per event in a thread of a hundred events
and in one of a hundred thousand (``bench/bench_fold.py``).

Events are expected to be valid (see :func:`agui_hub.agui.events.validate_wire`);
like the official client, the reducer ignores a continuation whose target
does not exist rather than failing (the sequence verifier rejects those
before they are stored). A malformed event (from a producer that wrote to the
store directly) raises :class:`~agui_hub.errors.InvalidEvent` and changes
nothing, never KeyError or TypeError.

:class:`StateDocuments` is the part of the fold that judges STATE_* and
ACTIVITY_* events, on its own: what a writer keeps per thread to refuse, before
storing, a delta that does not apply or that would exceed the limits.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..errors import InvalidEvent, LimitExceeded, PatchError, ProtocolError
from .chunks import ChunkExpander
from .events import EventType, to_wire

__all__ = [
    "DEFAULT_LIMITS",
    "RunRecord",
    "RunStatus",
    "StateDocuments",
    "StateLimits",
    "ThreadState",
    "fold",
]

WireEvent = Mapping[str, Any]
Msg = dict[str, Any]

_CLIENT_METADATA_KEY = "@ag-ui/client"
_UNDECLARED = object()
_MALFORMED = (KeyError, TypeError, AttributeError, ValueError, IndexError)
"""What a handler may raise on an event that is not a valid AG-UI event."""
_KEYS = (str, int, float, bool, type(None))
"""Ids that are indexed (valid events have strings; a malformed one may have anything)."""
_CHUNKS = frozenset({"TEXT_MESSAGE_CHUNK", "TOOL_CALL_CHUNK", "REASONING_MESSAGE_CHUNK"})


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    FINISHED = "finished"
    ERROR = "error"


@dataclass
class RunRecord:
    """One run of the thread.

    ``started`` is the RUN_STARTED event as published for the thread's latest
    run, its ``input`` included (for snapshots) but for the input's messages,
    which are folded into the message list; without ``input`` for earlier runs; ``ended`` is
    the RUN_FINISHED or RUN_ERROR event as published (outcome, interrupts,
    usage, result).
    """

    run_id: str | None
    parent_run_id: str | None
    status: RunStatus
    started: dict[str, Any] | None = None
    ended: dict[str, Any] | None = None


# -- limits ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateLimits:
    """Bounds on what events may put into a thread's folded state.

    They keep one thread from taking the memory or the CPU of every thread
    that shares a process: an event that would exceed them is refused with
    :class:`~agui_hub.errors.LimitExceeded` and changes nothing.
    """

    max_depth: int = 64
    """Deepest nesting of objects and arrays in the state document, and in each
    activity message's content (``{}`` has depth 1, ``{"a": []}`` depth 2)."""
    max_bytes: int = 8 * 1024 * 1024
    """Largest approximate encoded size, in bytes, of the state document, and of
    each activity message's content. A JSON Patch may also walk at most twice
    this much of the document it changes (measuring what it removes or copies)."""

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.max_bytes < 1:
            raise ValueError("state limits must be at least 1")


DEFAULT_LIMITS = StateLimits()


# -- JSON Patch (RFC 6902) on documents with a running size ----------------------------
#
# A document is patched in place, with an undo log that restores it exactly
# (key order included) when an operation fails. Values are shared, never
# deep-copied: the values of a patch are put into the document as they are,
# `copy` makes the copy share the source, and a snapshot is the event's own
# value. A container is changed in place only when the document owns it (it
# made it, and nothing else refers to it: ids in `_Doc.owned`); any other is
# first copied (one level, along the patched path). compact() hands the
# documents out, so it drops every ownership (by bumping a generation).
#
# Sizes are estimates of the JSON encoding: measured once per value that
# enters or leaves the document, by an iterative walker that stops as soon as
# a limit is exceeded, and kept as a running total. Nothing recurses, so no
# nesting can overflow the stack.

_MISSING: Any = object()
_INDEX = re.compile(r"0|[1-9][0-9]*")
_BAD_ESCAPE = re.compile(r"~(?![01])")


class _Fail(Exception):
    """A patch operation that does not apply (becomes a PatchError)."""


class _Over(Exception):
    """A limit exceeded (becomes a LimitExceeded); ``args[0]`` names the limit."""


class _Doc:
    """One patchable document: the state, or the content of an activity message."""

    __slots__ = ("gen", "owned", "root", "size")

    def __init__(self, root: Any, size: int, gen: int = 0) -> None:
        self.root = root
        self.size = size
        """Approximate encoded size in bytes."""
        self.owned: set[int] = set()
        """ids of the containers this document may change in place."""
        self.gen = gen
        """The exposure generation ``owned`` is valid for."""


class _Meter:
    """Bytes of existing document a patch may still walk (see StateLimits.max_bytes)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


# Undo records: (kind, target, key, old value)
_U_SET = 0  # target[key] = old            (a replaced dict value or list item)
_U_NEWKEY = 1  # del target[key]           (a dict key that was added)
_U_DELKEY = 2  # target[key] = old         (a dict key that was removed; order fixed after)
_U_INSERT = 3  # del target[key]           (a list item that was inserted)
_U_POP = 4  # target.insert(key, old)      (a list item that was removed)
_U_ATTR = 5  # setattr(target, key, old)


class _Undo:
    """What one event changed, to put it back exactly."""

    __slots__ = ("log", "orders")

    def __init__(self) -> None:
        self.log: list[tuple[int, Any, Any, Any]] = []
        self.orders: dict[int, tuple[dict[Any, Any], list[Any]]] = {}
        """Dicts that lost a key other than their last: their key order before."""

    def attr(self, target: Any, name: str) -> None:
        self.log.append((_U_ATTR, target, name, getattr(target, name)))

    def rollback(self) -> None:
        for kind, target, key, old in reversed(self.log):
            if kind in (_U_SET, _U_DELKEY):
                target[key] = old
            elif kind in (_U_NEWKEY, _U_INSERT):
                del target[key]
            elif kind == _U_POP:
                target.insert(key, old)
            else:
                setattr(target, key, old)
        for target, keys in self.orders.values():
            # Keys re-added went to the end: restore the order they had.
            items = [(key, target[key]) for key in keys if key in target]
            target.clear()
            target.update(items)
        self.log.clear()
        self.orders.clear()


def _scalar_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value) + 2
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    return 8


def _frame(node: Any, entered_at: int) -> list[Any]:
    """A walker's frame: [container, iterator, is_dict, total when entered, highest item]."""
    if isinstance(node, dict):
        return [node, iter(node.items()), True, entered_at, 0]
    return [node, iter(node), False, entered_at, 0]


def _measure(
    value: Any,
    room: float,
    max_height: int | None,
    meter: _Meter | None = None,
    owned: set[int] | None = None,
) -> tuple[int, int]:
    """(approximate encoded size, height) of *value*; a scalar has height 0,
    a container one more than its highest item.

    Raises ``_Over("max_bytes")`` as soon as the size exceeds *room*,
    ``_Over("max_depth")`` as soon as the height would exceed *max_height*
    (``None``: no bound), ``_Over("work")`` when the walk costs more than
    *meter* has left. The id of every container walked is dropped from
    *owned*: the value is shared from now on. A value that holds the same
    container several times (a document made by ``copy``) is walked once per
    container, and counted as often as it occurs.
    """
    if not isinstance(value, dict | list):
        size = _scalar_size(value)
        if size > room:
            raise _Over("max_bytes")
        return size, 0
    if max_height is not None and max_height < 1:
        raise _Over("max_depth")
    memo: dict[int, tuple[int, int]] = {}
    shared = 0  # bytes counted from memo, not walked
    total = 2
    stack: list[list[Any]] = [_frame(value, 0)]
    if owned is not None:
        owned.discard(id(value))
    while stack:
        top = stack[-1]
        items, is_dict = top[1], top[2]
        entered = False
        for item in items:
            if is_dict:
                key, child = item
                total += (len(key) if isinstance(key, str) else 8) + 4
            else:
                child = item
                total += 1
            if isinstance(child, dict | list):
                known = memo.get(id(child))
                if known is not None:
                    total += known[0]
                    shared += known[0]
                    if known[1] > top[4]:
                        top[4] = known[1]
                    if max_height is not None and len(stack) + known[1] > max_height:
                        raise _Over("max_depth")
                else:
                    if max_height is not None and len(stack) >= max_height:
                        raise _Over("max_depth")
                    if owned is not None:
                        owned.discard(id(child))
                    stack.append(_frame(child, total))
                    total += 2
                    entered = True
            else:
                total += _scalar_size(child)
            if total > room:
                raise _Over("max_bytes")
            if entered:
                break
        if entered:
            if meter is not None and total - shared > meter.left:
                raise _Over("work")
            continue
        stack.pop()
        height = top[4] + 1
        memo[id(top[0])] = (total - top[3], height)
        if stack and height > stack[-1][4]:
            stack[-1][4] = height
    if meter is not None:
        meter.left -= total - shared
        if meter.left < 0:
            raise _Over("work")
    return total, memo[id(value)][1]


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality (RFC 6902 ``test``): numbers by value, but a boolean is no number."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if x is y:
            continue
        if isinstance(x, bool) or isinstance(y, bool):
            if not (isinstance(x, bool) and isinstance(y, bool) and x == y):
                return False
        elif isinstance(x, int | float) and isinstance(y, int | float):
            if x != y:
                return False
        elif isinstance(x, dict):
            if not isinstance(y, dict) or len(x) != len(y):
                return False
            for key, item in x.items():
                other = y.get(key, _MISSING)
                if other is _MISSING:
                    return False
                pairs.append((item, other))
        elif isinstance(x, list):
            if not isinstance(y, list) or len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _pointer(pointer: Any, field_name: str) -> tuple[str, ...]:
    """The reference tokens of an RFC 6901 JSON Pointer."""
    if not isinstance(pointer, str):
        raise _Fail(f"{field_name!r} is not a JSON Pointer string")
    if pointer == "":
        return ()
    if pointer[0] != "/":
        raise _Fail(f"JSON Pointer {pointer!r} does not start with '/'")
    tokens = pointer.split("/")[1:]
    if "~" in pointer:
        if _BAD_ESCAPE.search(pointer):
            raise _Fail(f"JSON Pointer {pointer!r} has a '~' not followed by 0 or 1")
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in tokens]
    return tuple(tokens)


def _render(tokens: tuple[str, ...]) -> str:
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _index(tokens: tuple[str, ...], length: int, *, end: bool) -> int:
    """The array index the last token names: ``0 <= i < length``, or ``<= length``
    (``-`` meaning *length*) with *end*."""
    token = tokens[-1]
    if token == "-" and end:
        return length
    if not _INDEX.fullmatch(token):
        raise _Fail(f"{_render(tokens)}: {token!r} is not an array index")
    index = int(token)
    if index > length or (index == length and not end):
        raise _Fail(f"{_render(tokens)}: index {index} is out of range (length {length})")
    return index


class _Patcher:
    """Applies the operations of one JSON Patch to a document (see above)."""

    __slots__ = ("doc", "limits", "meter", "undo")

    def __init__(self, doc: _Doc, limits: StateLimits, undo: _Undo) -> None:
        self.doc = doc
        self.limits = limits
        self.undo = undo
        self.meter = _Meter(2 * limits.max_bytes)

    def apply(self, patch: Any) -> None:
        if not isinstance(patch, list):
            raise _Fail("a JSON Patch is a list of operations")
        doc, undo = self.doc, self.undo
        undo.attr(doc, "size")
        undo.attr(doc, "root")
        for n, op in enumerate(patch):
            if not isinstance(op, dict):
                raise _Fail(f"operation {n} is not an object")
            name = op.get("op")
            try:
                path = _pointer(op.get("path"), "path")
                if name == "add":
                    self._put(path, self._value(op), move_from=None)
                elif name == "remove":
                    self._remove(path, measure=True)
                elif name == "replace":
                    self._replace(path, self._value(op))
                elif name == "move":
                    source = _pointer(op.get("from"), "from")
                    if path[: len(source)] == source and len(path) > len(source):
                        raise _Fail("a value cannot be moved into one of its own children")
                    if path == source:
                        self._get(source)
                        continue
                    self._put(path, self._remove(source, measure=False), move_from=source)
                elif name == "copy":
                    source = _pointer(op.get("from"), "from")
                    self._put(path, self._get(source), move_from=None)
                elif name == "test":
                    if not _json_equal(self._get(path), self._value(op)):
                        raise _Fail(f"test failed: the value at {op.get('path')!r} differs")
                else:
                    raise _Fail(f"unknown operation {name!r}")
            except _Fail as exc:
                raise _Fail(f"operation {n} ({name}): {exc}") from None

    @staticmethod
    def _value(op: dict[str, Any]) -> Any:
        if "value" not in op:
            raise _Fail("no 'value'")
        return op["value"]

    def _get(self, tokens: tuple[str, ...]) -> Any:
        node = self.doc.root
        for depth, token in enumerate(tokens, 1):
            if isinstance(node, dict):
                node = node.get(token, _MISSING)
                if node is _MISSING:
                    raise _Fail(f"{_render(tokens[:depth])} does not exist")
            elif isinstance(node, list):
                node = node[_index(tokens[:depth], len(node), end=False)]
            else:
                where = _render(tokens[: depth - 1]) or "the root"
                raise _Fail(f"{where} is not an object or array")
        return node

    def _parent(self, tokens: tuple[str, ...]) -> Any:
        """The container holding the target of *tokens*, owned (copied on the way as needed)."""
        doc, owned, undo = self.doc, self.doc.owned, self.undo
        node = doc.root
        if not isinstance(node, dict | list):
            raise _Fail("the document is not an object or array")
        if id(node) not in owned:
            node = dict(node) if isinstance(node, dict) else list(node)
            owned.add(id(node))
            doc.root = node  # the undo log holds the root already
        for depth in range(1, len(tokens)):
            key: Any
            if isinstance(node, dict):
                key = tokens[depth - 1]
                child = node.get(key, _MISSING)
                if child is _MISSING:
                    raise _Fail(f"{_render(tokens[:depth])} does not exist")
            else:
                key = _index(tokens[:depth], len(node), end=False)
                child = node[key]
            if not isinstance(child, dict | list):
                raise _Fail(f"{_render(tokens[:depth])} is not an object or array")
            if id(child) not in owned:
                child = dict(child) if isinstance(child, dict) else list(child)
                owned.add(id(child))
                undo.log.append((_U_SET, node, key, node[key]))
                node[key] = child
            node = child
        return node

    def _old_size(self, value: Any) -> int:
        return _measure(value, math.inf, None, self.meter)[0]

    def _put(self, tokens: tuple[str, ...], value: Any, move_from: tuple[str, ...] | None) -> None:
        """add (and the second half of move and copy)."""
        doc, limits = self.doc, self.limits
        if move_from is None:
            # Measured first: this also makes the value (a copy's source) shared.
            size, _ = _measure(
                value, limits.max_bytes, limits.max_depth - len(tokens), self.meter, doc.owned
            )
        else:
            size = 0  # moved: the size of the document changes only by the keys
            if len(tokens) > len(move_from):
                _measure(value, math.inf, limits.max_depth - len(tokens), self.meter)
        if not tokens:
            doc.root = value
            doc.size = size if move_from is None else self._old_size(value)
        else:
            parent = self._parent(tokens)
            last = tokens[-1]
            if isinstance(parent, dict):
                old = parent.get(last, _MISSING)
                if old is _MISSING:
                    self.undo.log.append((_U_NEWKEY, parent, last, None))
                    doc.size += len(last) + 4 + size
                else:
                    self.undo.log.append((_U_SET, parent, last, old))
                    doc.size += size - self._old_size(old)
                parent[last] = value
            elif isinstance(parent, list):
                index = _index(tokens, len(parent), end=True)
                parent.insert(index, value)
                self.undo.log.append((_U_INSERT, parent, index, None))
                doc.size += 1 + size
            else:
                raise _Fail(f"{_render(tokens[:-1]) or 'the root'} is not an object or array")
        if doc.size > limits.max_bytes:
            raise _Over("max_bytes")

    def _remove(self, tokens: tuple[str, ...], *, measure: bool) -> Any:
        if not tokens:
            raise _Fail("the whole document cannot be removed")
        doc = self.doc
        parent = self._parent(tokens)
        last = tokens[-1]
        if isinstance(parent, dict):
            old = parent.get(last, _MISSING)
            if old is _MISSING:
                raise _Fail(f"{_render(tokens)} does not exist")
            if next(reversed(parent)) != last and id(parent) not in self.undo.orders:
                self.undo.orders[id(parent)] = (parent, list(parent))
            del parent[last]
            self.undo.log.append((_U_DELKEY, parent, last, old))
            doc.size -= len(last) + 4
        elif isinstance(parent, list):
            index = _index(tokens, len(parent), end=False)
            old = parent.pop(index)
            self.undo.log.append((_U_POP, parent, index, old))
            doc.size -= 1
        else:
            raise _Fail(f"{_render(tokens[:-1]) or 'the root'} is not an object or array")
        if measure:
            doc.size -= self._old_size(old)
        return old

    def _replace(self, tokens: tuple[str, ...], value: Any) -> None:
        doc, limits = self.doc, self.limits
        size, _ = _measure(
            value, limits.max_bytes, limits.max_depth - len(tokens), self.meter, doc.owned
        )
        if not tokens:
            doc.root, doc.size = value, size
            return
        parent = self._parent(tokens)
        key: Any = tokens[-1]
        if isinstance(parent, dict):
            old = parent.get(key, _MISSING)
            if old is _MISSING:
                raise _Fail(f"{_render(tokens)} does not exist")
        elif isinstance(parent, list):
            key = _index(tokens, len(parent), end=False)
            old = parent[key]
        else:
            raise _Fail(f"{_render(tokens[:-1]) or 'the root'} is not an object or array")
        self.undo.log.append((_U_SET, parent, key, old))
        parent[key] = value
        doc.size += size - self._old_size(old)
        if doc.size > limits.max_bytes:
            raise _Over("max_bytes")


def _limit_error(over: _Over, limits: StateLimits, what: str, where: str) -> LimitExceeded:
    kind = over.args[0]
    if kind == "max_depth":
        return LimitExceeded(
            f"{what} would nest {where} deeper than max_depth={limits.max_depth}",
            limit="max_depth",
            value=limits.max_depth,
        )
    if kind == "work":
        return LimitExceeded(
            f"{what} walks more than twice max_bytes={limits.max_bytes} of {where} "
            "(operations that copy or remove large values over and over)",
            limit="max_bytes",
            value=limits.max_bytes,
        )
    return LimitExceeded(
        f"{what} would make {where} larger than max_bytes={limits.max_bytes} "
        "(encoded, approximately)",
        limit="max_bytes",
        value=limits.max_bytes,
    )


def _patch(doc: _Doc, patch: Any, limits: StateLimits, undo: _Undo, what: str, where: str) -> None:
    """Apply *patch* to *doc* in place, logging into *undo* (roll it back on an error).

    Raises PatchError or LimitExceeded.
    """
    try:
        _Patcher(doc, limits, undo).apply(patch)
    except _Fail as exc:
        raise PatchError(f"JSON Patch does not apply: {exc}", patch=patch) from None
    except _Over as over:
        raise _limit_error(over, limits, what, where) from None


def _measured(value: Any, limits: StateLimits, what: str, where: str) -> _Doc:
    """A document of *value* (a snapshot), or LimitExceeded."""
    try:
        size, _ = _measure(value, limits.max_bytes, limits.max_depth)
    except _Over as over:
        raise _limit_error(over, limits, what, where) from None
    return _Doc(value, size)


def _adopted(value: Any) -> _Doc:
    """A document of a value that is already in the state, whatever its size."""
    return _Doc(value, _measure(value, math.inf, None)[0])


# -- the thread state ------------------------------------------------------------------


@dataclass(eq=False, repr=False)
class ThreadState:
    """The folded state of one thread. Feed events with :meth:`apply`.

    ``state`` and ``messages`` are the live state: read them, do not change
    them in place (assign ``messages`` a new list to replace it). What
    :meth:`compact` returns does not change as more events are applied.
    *limits* bound the state document and activity contents (see
    :class:`StateLimits`). Two states are equal when their state documents,
    messages, runs and open items are.
    """

    state: Any = field(default_factory=dict)
    """The shared state document (STATE_SNAPSHOT / STATE_DELTA)."""
    runs: list[RunRecord] = field(default_factory=list)
    """Every run of the thread, oldest first; the lineage is in ``parent_run_id``."""
    open_messages: dict[str, Msg] = field(default_factory=dict)
    """Text messages still streaming: id -> their (START) attributes."""
    open_tool_calls: dict[str, Msg] = field(default_factory=dict)
    """Tool calls whose arguments are still streaming: id -> START attributes."""
    open_reasoning_messages: dict[str, Msg] = field(default_factory=dict)
    open_reasoning_spans: dict[str, Msg] = field(default_factory=dict)
    open_steps: dict[tuple[str | None, str], Msg] = field(default_factory=dict)
    """Steps still running, keyed by (subagentRunId, stepName)."""
    active_subagents: dict[str, Msg] = field(default_factory=dict)
    """Subagents started and not yet finished: id -> SUBAGENT_STARTED event."""
    rejected: list[ProtocolError] = field(default_factory=list)
    """Errors met by :func:`fold` (e.g. patches that did not apply)."""
    limits: StateLimits = field(default=DEFAULT_LIMITS, compare=False, repr=False)
    """Bounds on the state document and on each activity message's content."""
    _chunks: ChunkExpander = field(default_factory=ChunkExpander, init=False)
    _messages: list[Msg] = field(default_factory=list, init=False)
    # Indexes, kept in step with _messages: the first message with an id; the
    # first (message, tool call) with a tool call id, in any message and in
    # assistant messages.
    _by_id: dict[Any, Msg] = field(default_factory=dict, init=False)
    _calls: dict[Any, tuple[Msg, Msg]] = field(default_factory=dict, init=False)
    _assistant_calls: dict[Any, tuple[Msg, Msg]] = field(default_factory=dict, init=False)
    # Where each message was last seen in the list: id(message) -> index. An
    # insertion moves the messages after it one place on, so a hint is at or
    # before the message's place; _position() walks on from it.
    _pos: dict[int, int] = field(default_factory=dict, init=False)
    # Deltas not yet joined: id(target) -> [target dict, key, parts]; the
    # target holds a reference, so its id is not reused meanwhile.
    _parts: dict[int, tuple[Msg, str, list[str]]] = field(default_factory=dict, init=False)
    _doc: _Doc | None = field(default=None, init=False)
    _activity: dict[Any, _Doc] = field(default_factory=dict, init=False)
    _exposed: int = field(default=0, init=False)
    """Bumped by compact(): documents handed out are shared from then on."""

    # -- queries ------------------------------------------------------------------

    @property
    def messages(self) -> list[Msg]:
        """Messages as canonical wire dicts, in conversation order."""
        if self._parts:
            self._join()
        return self._messages

    @messages.setter
    def messages(self, messages: list[Msg]) -> None:
        self._join()
        self._messages = list(messages)
        self._reindex()

    @property
    def current_run(self) -> RunRecord | None:
        """The latest run, or ``None`` before the first one."""
        return self.runs[-1] if self.runs else None

    @property
    def run_active(self) -> bool:
        run = self.current_run
        return run is not None and run.status is RunStatus.RUNNING

    def message(self, message_id: str) -> Msg | None:
        """The first message with this id, or ``None``."""
        if self._parts:
            self._join()
        return self._by_id.get(message_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ThreadState):
            return NotImplemented
        return self._compared() == other._compared()

    __hash__ = None  # type: ignore[assignment]

    def _compared(self) -> tuple[Any, ...]:
        return (
            self.state,
            self.messages,
            self.runs,
            self.open_messages,
            self.open_tool_calls,
            self.open_reasoning_messages,
            self.open_reasoning_spans,
            self.open_steps,
            self.active_subagents,
        )

    def __getstate__(self) -> dict[str, Any]:
        # For copy.deepcopy and pickle: pending deltas are keyed by id(), and
        # ownership is by id() too; a copy starts with neither.
        self._join()
        self._exposed += 1
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pos = {id(message): i for i, message in enumerate(self._messages)}

    def __repr__(self) -> str:
        return (
            f"ThreadState(state={self.state!r}, messages={self.messages!r}, runs={self.runs!r}, "
            f"open_messages={self.open_messages!r}, open_tool_calls={self.open_tool_calls!r}, "
            f"open_reasoning_messages={self.open_reasoning_messages!r}, "
            f"open_reasoning_spans={self.open_reasoning_spans!r}, "
            f"open_steps={self.open_steps!r}, active_subagents={self.active_subagents!r}, "
            f"rejected={self.rejected!r})"
        )

    # -- folding ------------------------------------------------------------------

    def apply(self, event: WireEvent | BaseModel) -> None:
        """Fold one event into the state.

        Raises, leaving the state unchanged:
        :class:`~agui_hub.errors.PatchError` when a STATE_DELTA or
        ACTIVITY_DELTA does not apply; :class:`~agui_hub.errors.LimitExceeded`
        when a STATE_SNAPSHOT, STATE_DELTA, ACTIVITY_SNAPSHOT or ACTIVITY_DELTA
        would exceed :attr:`limits`; :class:`~agui_hub.errors.ChunkError` for
        a chunk that cannot be expanded; :class:`~agui_hub.errors.InvalidEvent`
        for an event that is not a valid AG-UI event (e.g. without a field its
        type requires; a chunk stream such an event ends is ended all the
        same). Nothing else, whatever the event.
        """
        if isinstance(event, BaseModel):
            event = to_wire(event)
        elif not isinstance(event, Mapping):
            raise InvalidEvent(f"an event is an object, not {type(event).__name__}")
        if "metadata" in event and not isinstance(event["metadata"], dict):
            # Checked first: handlers merge metadata last, after their changes.
            raise _malformed(event, TypeError("metadata is not an object"))
        chunk = isinstance(event.get("type"), str) and event["type"] in _CHUNKS
        if chunk and not isinstance(event.get("delta", ""), str):
            raise _malformed(event, TypeError("delta is not a string"))
        try:
            expanded_events = self._chunks.expand(event)
        except ProtocolError:
            raise
        except _MALFORMED as exc:
            raise _malformed(event, exc) from None
        for expanded in expanded_events:
            handler = _HANDLERS.get(expanded.get("type"))  # type: ignore[arg-type]
            if handler is None:
                continue
            try:
                handler(self, expanded)
            except ProtocolError:
                raise
            except _MALFORMED as exc:
                raise _malformed(expanded, exc) from None

    def flush(self) -> None:
        """End every chunk stream left open (the producer stopped mid-stream)."""
        for expanded in self._chunks.flush():
            _HANDLERS[expanded["type"]](self, expanded)

    # -- rendering ----------------------------------------------------------------

    def compact(self) -> list[dict[str, Any]]:
        """Render the state as a short event sequence that folds to an equal state.

        Layout: for every run, its RUN_STARTED and (when it ended) its
        RUN_FINISHED / RUN_ERROR; inside the latest started run, a
        MESSAGES_SNAPSHOT and a STATE_SNAPSHOT, then one opening event for
        each subagent, step, reasoning span, message and tool call still open,
        so the live events that follow continue them.

        The sequence shares the state document and activity contents with
        this state (nothing is copied); later events change copies of what
        they touch, never what was returned.
        """
        self._exposed += 1
        snapshot_at = max(
            (i for i, run in enumerate(self.runs) if run.started is not None), default=-1
        )
        out: list[dict[str, Any]] = []
        if snapshot_at < 0:
            out.extend(self._snapshots())
        for i, run in enumerate(self.runs):
            if run.started is not None:
                out.append(dict(run.started))
            if i == snapshot_at:
                out.extend(self._snapshots())
                out.extend(self._reopen())
            if run.ended is not None:
                out.append(dict(run.ended))
        return out

    def _snapshots(self) -> list[dict[str, Any]]:
        return [
            {"type": "MESSAGES_SNAPSHOT", "messages": [_own_message(m) for m in self.messages]},
            {"type": "STATE_SNAPSHOT", "snapshot": self.state},
        ]

    def _reopen(self) -> list[dict[str, Any]]:
        # A stream that chunks opened is reopened by a chunk (without content),
        # so that the chunks that continue it, which may leave out its id, still
        # find it. Last, since other events may end a chunk stream.
        chunked = set(self._chunks.open_streams.values())
        out: list[dict[str, Any]] = [dict(started) for started in self.active_subagents.values()]
        chunks: list[dict[str, Any]] = []
        out += [{"type": "STEP_STARTED", **attrs} for attrs in self.open_steps.values()]
        out += [{"type": "REASONING_START", **a} for a in self.open_reasoning_spans.values()]
        for kind, opener, chunk, key, open_now in (
            ("text", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CHUNK", "messageId", self.open_messages),
            ("tool", "TOOL_CALL_START", "TOOL_CALL_CHUNK", "toolCallId", self.open_tool_calls),
            ("reasoning", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CHUNK", "messageId",
             self.open_reasoning_messages),
        ):  # fmt: skip
            for attrs in open_now.values():
                event = {"type": opener, **attrs}
                if (kind, attrs.get(key)) in chunked:
                    # A chunk has exactly the fields of its type in AG-UI 1.0
                    # (REASONING_MESSAGE_CHUNK has no role): nothing extra.
                    event["type"] = chunk
                    chunks.append(event)
                else:
                    if kind == "reasoning":
                        event["role"] = "reasoning"
                    out.append(event)
        return out + chunks

    # -- internals ----------------------------------------------------------------

    def _close_everything(self) -> None:
        self.open_messages.clear()
        self.open_tool_calls.clear()
        self.open_reasoning_messages.clear()
        self.open_reasoning_spans.clear()
        self.open_steps.clear()
        self.active_subagents.clear()

    def _forget_removed(self) -> None:
        """Stop tracking streams whose message a snapshot removed.

        Their further deltas have nothing to apply to, in this state as in
        one rebuilt from :meth:`compact`.
        """
        ids = {m.get("id") for m in self._messages if m.get("role") != "activity"}
        for tracked in (self.open_messages, self.open_reasoning_messages):
            for message_id in [k for k in tracked if k not in ids]:
                del tracked[message_id]
        for call_id, opened in list(self.open_tool_calls.items()):
            found = self._calls.get(call_id)
            if found is None:
                del self.open_tool_calls[call_id]
            else:
                # The snapshot may hold the call under another message than the one
                # it was started in: further args go there, and a reopener says so.
                opened["parentMessageId"] = found[0]["id"]

    def _find_tool_call(self, tool_call_id: str) -> tuple[Msg, Msg] | None:
        return self._calls.get(tool_call_id)

    def _add_message(self, message: Msg) -> None:
        """Append *message* and index it (a later message never shadows an earlier one)."""
        self._pos[id(message)] = len(self._messages)
        self._messages.append(message)
        self._index(message)

    def _index(self, message: Msg) -> None:
        message_id = message.get("id")
        if isinstance(message_id, _KEYS):  # anything else is in no valid event
            self._by_id.setdefault(message_id, message)
        calls = message.get("toolCalls")
        if not isinstance(calls, list):
            return
        assistant = message.get("role") == "assistant"
        for call in calls:
            if isinstance(call, dict) and isinstance(call_id := call.get("id"), _KEYS):
                self._calls.setdefault(call_id, (message, call))
                if assistant:
                    self._assistant_calls.setdefault(call_id, (message, call))

    def _reindex(self) -> None:
        self._by_id = {}
        self._calls = {}
        self._assistant_calls = {}
        self._pos = {id(message): i for i, message in enumerate(self._messages)}
        for message in self._messages:
            self._index(message)
        for message_id in [k for k in self._activity if k not in self._by_id]:
            del self._activity[message_id]

    def _position(self, message: Msg) -> int:
        """Where *message* is in the list: from where it was last seen, walking on
        past the messages inserted before it since."""
        messages = self._messages
        at, end = self._pos.get(id(message), 0), len(messages)
        while at < end and messages[at] is not message:
            at += 1
        if at == end:  # pragma: no cover - the hints are kept in step
            at = next(i for i, m in enumerate(messages) if m is message)
        self._pos[id(message)] = at
        return at

    def _append_text(self, target: Msg, key: str, delta: str) -> None:
        """Add *delta* to the string ``target[key]``, joined when it is read."""
        pending = self._parts.get(id(target))
        if pending is None:
            current = target.get(key)
            base = current if isinstance(current, str) else ""
            target[key] = base  # the key's place in the dict, as if concatenated now
            self._parts[id(target)] = (target, key, [base, delta])
            return
        # Merged like a binary counter: the parts get shorter from first to
        # last, so there are few of them and each character is copied only
        # a logarithmic number of times.
        parts = pending[2]
        parts.append(delta)
        while len(parts) > 1 and len(parts[-2]) <= len(parts[-1]):
            last = parts.pop()
            parts[-1] += last

    def _join(self) -> None:
        for target, key, parts in self._parts.values():
            target[key] = "".join(parts)
        self._parts.clear()

    def _state_doc(self) -> _Doc:
        doc = self._doc
        if doc is None or doc.root is not self.state:
            doc = self._doc = _adopted(self.state)  # the state was assigned from outside
        if doc.gen != self._exposed:
            doc.owned.clear()
            doc.gen = self._exposed
        return doc

    def _activity_doc(self, message: Msg) -> _Doc:
        message_id = message.get("id")
        content = message.get("content") or {}
        doc = self._activity.get(message_id)
        if doc is None or doc.root is not content:
            doc = self._activity[message_id] = _adopted(content)
        if doc.gen != self._exposed:
            doc.owned.clear()
            doc.gen = self._exposed
        return doc


def fold(
    events: Iterable[WireEvent | BaseModel],
    state: ThreadState | None = None,
    *,
    flush: bool = False,
    limits: StateLimits | None = None,
) -> ThreadState:
    """Fold *events* into *state* (a new one by default, with *limits*) and return it.

    Protocol errors (a patch that does not apply, a limit exceeded, a broken
    chunk) do not stop the fold: the event is skipped and the error kept in
    ``state.rejected``. With ``flush=True``, chunk streams still open at the
    end are ended, as if the producer had stopped; leave it off when more
    events may follow.
    """
    if state is None:
        state = ThreadState(limits=limits) if limits is not None else ThreadState()
    for event in events:
        try:
            state.apply(event)
        except ProtocolError as exc:
            state.rejected.append(exc)
    if flush:
        state.flush()
    return state


# -- helpers ------------------------------------------------------------------------


def _malformed(event: WireEvent, exc: BaseException) -> InvalidEvent:
    event_type = event.get("type")
    detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
    return InvalidEvent(
        f"{event_type or 'event'} cannot be folded: {detail or type(exc).__name__}",
        event_type=event_type if isinstance(event_type, str) else None,
    )


def _attrs(event: WireEvent, *keys: str) -> Msg:
    """The given keys of *event* that are present, in that order."""
    return {key: event[key] for key in keys if key in event}


def _merge_metadata(target: Msg | None, event: WireEvent) -> None:
    if target is None or "metadata" not in event:
        return
    existing = target.get("metadata")
    incoming = event["metadata"]
    if isinstance(existing, dict) and existing:
        target["metadata"] = {**existing, **incoming}
    else:
        target["metadata"] = dict(incoming)


def _own_message(message: Mapping[str, Any]) -> Msg:
    """A copy of *message* that can be mutated without touching the original."""
    owned = dict(message)
    calls = owned.get("toolCalls")
    if calls is not None:
        owned["toolCalls"] = [{**c, "function": dict(c.get("function") or {})} for c in calls]
    return owned


# -- handlers, one per event type ---------------------------------------------------------


def _text_start(ts: ThreadState, e: WireEvent, role_default: str) -> None:
    message_id = e["messageId"]
    message = ts._by_id.get(message_id)
    if message is not None and message.get("role") == "activity":
        return  # ids are unique across activity and streamed messages; ignore the reuse
    if message is None:
        message = {"id": message_id, "role": e.get("role", role_default), "content": ""}
        message.update(_attrs(e, "name", "subagentRunId"))
        ts._add_message(message)
    _merge_metadata(message, e)


def _text_content(ts: ThreadState, e: WireEvent) -> None:
    message = ts._by_id.get(e["messageId"])
    delta = e["delta"]
    if message is None or message.get("role") == "activity":
        return
    if not isinstance(delta, str):
        raise TypeError("delta is not a string")
    ts._append_text(message, "content", delta)
    _merge_metadata(message, e)


def _text_end(ts: ThreadState, e: WireEvent) -> None:
    message = ts._by_id.get(e["messageId"])
    if message is not None and message.get("role") != "activity":
        _merge_metadata(message, e)


def on_text_message_start(ts: ThreadState, e: WireEvent) -> None:
    _text_start(ts, e, "assistant")
    message = ts._by_id.get(e["messageId"])
    if message is not None and message.get("role") != "activity":
        ts.open_messages[e["messageId"]] = {
            "messageId": e["messageId"],
            "role": message.get("role", "assistant"),
            **_attrs(e, "subagentRunId"),
        }


def on_text_message_end(ts: ThreadState, e: WireEvent) -> None:
    _text_end(ts, e)
    ts.open_messages.pop(e["messageId"], None)


def _tool_parent(ts: ThreadState, parent_id: str | None, tool_call_id: str) -> tuple[Msg, bool]:
    """The assistant message a new tool call attaches to, and whether it is new."""
    if parent_id is not None:
        existing = ts._by_id.get(parent_id)
        if existing is not None and existing.get("role") == "assistant":
            return existing, False
        new_id = tool_call_id if existing is not None else parent_id
    else:
        new_id = tool_call_id
    parent: Msg = {"id": new_id, "role": "assistant", "toolCalls": []}
    ts._add_message(parent)
    return parent, True


def on_tool_call_start(ts: ThreadState, e: WireEvent) -> None:
    tool_call_id, name = e["toolCallId"], e["toolCallName"]
    found = ts._calls.get(tool_call_id)
    if found is not None:
        owner, call = found
        call["function"]["name"] = name
        _merge_metadata(call, e)
    else:
        owner, is_new = _tool_parent(ts, e.get("parentMessageId"), tool_call_id)
        if is_new and e.get("subagentRunId") is not None and "subagentRunId" not in owner:
            owner["subagentRunId"] = e["subagentRunId"]
        if owner.get("toolCalls") is None:
            owner["toolCalls"] = []
        call = {"id": tool_call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        owner["toolCalls"].append(call)
        ts._calls.setdefault(tool_call_id, (owner, call))
        ts._assistant_calls.setdefault(tool_call_id, (owner, call))
        _merge_metadata(call, e)
    ts.open_tool_calls[tool_call_id] = {
        "toolCallId": tool_call_id,
        "toolCallName": name,
        "parentMessageId": owner["id"],
        **_attrs(e, "subagentRunId"),
    }


def on_tool_call_args(ts: ThreadState, e: WireEvent) -> None:
    found = ts._calls.get(e["toolCallId"])
    delta = e["delta"]
    if found is not None:
        call = found[1]
        if not isinstance(delta, str):
            raise TypeError("delta is not a string")
        ts._append_text(call["function"], "arguments", delta)
        _merge_metadata(call, e)


def on_tool_call_end(ts: ThreadState, e: WireEvent) -> None:
    found = ts._calls.get(e["toolCallId"])
    if found is not None:
        _merge_metadata(found[1], e)
    ts.open_tool_calls.pop(e["toolCallId"], None)


def on_tool_call_result(ts: ThreadState, e: WireEvent) -> None:
    tool_call_id = e["toolCallId"]
    if not isinstance(e["messageId"], _KEYS):
        raise TypeError("messageId is not a string")
    message: Msg = {
        "id": e["messageId"],
        "toolCallId": tool_call_id,
        "role": e.get("role") or "tool",
        "content": e["content"],
        **_attrs(e, "subagentRunId"),
    }
    _merge_metadata(message, e)
    found = ts._assistant_calls.get(tool_call_id)
    if found is None:
        ts._add_message(message)
        return
    messages = ts._messages
    at = ts._position(found[0]) + 1
    while at < len(messages) and messages[at].get("role") == "tool":
        at += 1
    messages.insert(at, message)
    ts._pos[id(message)] = at
    first = ts._by_id.setdefault(message["id"], message)
    if first is not message and ts._position(first) > at:
        ts._by_id[message["id"]] = message  # inserted before the one indexed so far


def on_state_snapshot(ts: ThreadState, e: WireEvent) -> None:
    doc = _measured(e["snapshot"], ts.limits, "STATE_SNAPSHOT", "the state")
    doc.gen = ts._exposed
    ts.state = doc.root
    ts._doc = doc


def on_state_delta(ts: ThreadState, e: WireEvent) -> None:
    delta = e["delta"]
    doc = ts._state_doc()
    undo = _Undo()
    try:
        _patch(doc, delta, ts.limits, undo, "STATE_DELTA", "the state")
    except BaseException:
        undo.rollback()
        raise
    ts.state = doc.root


def _authoritative_activity_types(e: WireEvent) -> Any:
    """The activity types a MESSAGES_SNAPSHOT declares it owns (client metadata).

    ``_UNDECLARED`` when not declared, ``None`` for "all types", else a list.
    """
    metadata = e.get("metadata")
    if not isinstance(metadata, dict) or _CLIENT_METADATA_KEY not in metadata:
        return _UNDECLARED
    declared = metadata[_CLIENT_METADATA_KEY]
    if not isinstance(declared, dict):
        return []
    if "authoritativeActivityTypes" not in declared:
        return _UNDECLARED
    types = declared["authoritativeActivityTypes"]
    if types is None:
        return None
    if isinstance(types, list) and all(isinstance(t, str) for t in types):
        return types
    return []


def _preserved(owned: Any, has_activity: bool, has_reasoning: bool) -> Callable[[Msg], bool]:
    """Whether a message a MESSAGES_SNAPSHOT does not name survives it.

    Client-only messages the producer may not know about survive a snapshot
    unless the snapshot declares itself authoritative for their kind.
    """

    def preserved(m: Msg) -> bool:
        if m.get("role") == "activity":
            if isinstance(owned, list):
                return m.get("activityType") not in owned
            return owned is _UNDECLARED and not has_activity
        return m.get("role") == "reasoning" and not has_reasoning

    return preserved


def on_messages_snapshot(ts: ThreadState, e: WireEvent) -> None:
    incoming = [_own_message(m) for m in e["messages"]]
    by_id = {m["id"]: m for m in incoming}
    preserved = _preserved(
        _authoritative_activity_types(e),
        any(m.get("role") == "activity" for m in incoming),
        any(m.get("role") == "reasoning" for m in incoming),
    )
    ts._join()
    kept = [by_id.get(m.get("id"), m) for m in ts._messages if m.get("id") in by_id or preserved(m)]
    kept_ids = {m.get("id") for m in kept}
    kept += [m for m in incoming if m["id"] not in kept_ids]
    ts._messages = kept
    ts._reindex()
    ts._forget_removed()


def on_activity_snapshot(ts: ThreadState, e: WireEvent) -> None:
    message_id = e["messageId"]
    activity_type, content = e["activityType"], e["content"]
    existing = ts._by_id.get(message_id)
    replace = e.get("replace", True)
    doc = None
    if existing is None or replace:  # the content goes into the state
        doc = _measured(content, ts.limits, "ACTIVITY_SNAPSHOT", "the activity content")
        doc.gen = ts._exposed
    fresh: Msg = {
        "id": message_id,
        "role": "activity",
        "activityType": activity_type,
        "content": content,
        **_attrs(e, "subagentRunId"),
    }
    target: Msg | None
    if existing is None:
        ts._add_message(fresh)
        target = fresh
    elif existing.get("role") == "activity":
        target = existing
        if replace:
            target["activityType"] = activity_type
            target["content"] = content
            target.pop("subagentRunId", None)
            target.update(_attrs(e, "subagentRunId"))
    elif replace:
        ts._join()
        ts._messages[ts._position(existing)] = target = fresh
        ts._reindex()
        ts._forget_removed()
    else:
        target = None
    if doc is not None and target is not None:
        ts._activity[message_id] = doc
    _merge_metadata(target, e)


def on_activity_delta(ts: ThreadState, e: WireEvent) -> None:
    patch, activity_type = e["patch"], e["activityType"]
    current = ts._by_id.get(e["messageId"])
    if current is None or current.get("role") != "activity":
        return
    doc = ts._activity_doc(current)
    undo = _Undo()
    try:
        _patch(doc, patch, ts.limits, undo, "ACTIVITY_DELTA", "the activity content")
    except BaseException:
        undo.rollback()
        raise
    current["content"] = doc.root
    current["activityType"] = activity_type
    _merge_metadata(current, e)


def _input_messages(e: WireEvent) -> list[Msg]:
    run_input = e.get("input")
    if not isinstance(run_input, dict):
        return []
    messages = [_own_message(m) for m in run_input.get("messages") or ()]
    if not all(isinstance(m.get("id"), _KEYS) for m in messages):
        raise TypeError("a message id is not a string")
    return messages


def on_run_started(ts: ThreadState, e: WireEvent) -> None:
    input_messages = _input_messages(e)  # first: a malformed input changes nothing
    ts._close_everything()
    # The latest run keeps its input (tools, context, forwarded props: what a
    # late joiner's snapshot must carry); earlier runs drop theirs, so that a
    # long thread does not hold every run's input.
    for earlier in ts.runs:
        if earlier.started is not None and "input" in earlier.started:
            earlier.started = {k: v for k, v in earlier.started.items() if k != "input"}
    started = dict(e)
    run_input = started.get("input")
    if isinstance(run_input, dict) and run_input.get("messages"):
        # Its messages are kept once, in the message list (and in a snapshot's
        # MESSAGES_SNAPSHOT, in the thread's order): not twice.
        started["input"] = {**run_input, "messages": []}
    ts.runs.append(
        RunRecord(
            run_id=e.get("runId"),
            parent_run_id=e.get("parentRunId"),
            status=RunStatus.RUNNING,
            started=started,
        )
    )
    for message in input_messages:
        if message.get("id") not in ts._by_id:
            ts._add_message(message)


def _end_run(ts: ThreadState, e: WireEvent, status: RunStatus) -> None:
    ts._close_everything()
    run = ts.current_run
    if run is not None and run.status is RunStatus.RUNNING:
        run.status = status
        run.ended = dict(e)
    else:
        ts.runs.append(
            RunRecord(run_id=e.get("runId"), parent_run_id=None, status=status, ended=dict(e))
        )


def on_run_finished(ts: ThreadState, e: WireEvent) -> None:
    _end_run(ts, e, RunStatus.FINISHED)


def on_run_error(ts: ThreadState, e: WireEvent) -> None:
    _end_run(ts, e, RunStatus.ERROR)


def on_step_started(ts: ThreadState, e: WireEvent) -> None:
    key = (e.get("subagentRunId"), e["stepName"])
    ts.open_steps[key] = _attrs(e, "stepName", "subagentRunId")


def on_step_finished(ts: ThreadState, e: WireEvent) -> None:
    ts.open_steps.pop((e.get("subagentRunId"), e["stepName"]), None)


def on_reasoning_start(ts: ThreadState, e: WireEvent) -> None:
    ts.open_reasoning_spans[e["messageId"]] = _attrs(e, "messageId", "subagentRunId")


def on_reasoning_end(ts: ThreadState, e: WireEvent) -> None:
    ts.open_reasoning_spans.pop(e["messageId"], None)


def on_reasoning_message_start(ts: ThreadState, e: WireEvent) -> None:
    _text_start(ts, {**e, "role": "reasoning"}, "reasoning")
    message = ts._by_id.get(e["messageId"])
    if message is not None and message.get("role") != "activity":
        ts.open_reasoning_messages[e["messageId"]] = _attrs(e, "messageId", "subagentRunId")


def on_reasoning_message_end(ts: ThreadState, e: WireEvent) -> None:
    _text_end(ts, e)
    ts.open_reasoning_messages.pop(e["messageId"], None)


def on_reasoning_encrypted_value(ts: ThreadState, e: WireEvent) -> None:
    entity_id, value = e["entityId"], e["encryptedValue"]
    if e["subtype"] == "tool-call":
        found = ts._assistant_calls.get(entity_id)
        if found is not None:
            found[1]["encryptedValue"] = value
        return
    target = ts._by_id.get(entity_id)
    if target is not None and target.get("role") != "activity":
        target["encryptedValue"] = value


def on_subagent_started(ts: ThreadState, e: WireEvent) -> None:
    ts.active_subagents[e["subagentRunId"]] = dict(e)


def on_subagent_ended(ts: ThreadState, e: WireEvent) -> None:
    ts.active_subagents.pop(e["subagentRunId"], None)


def _ignore(ts: ThreadState, e: WireEvent) -> None:
    """RAW and CUSTOM events do not change the thread state."""


_HANDLERS: dict[str, Callable[[ThreadState, WireEvent], None]] = {
    EventType.TEXT_MESSAGE_START: on_text_message_start,
    EventType.TEXT_MESSAGE_CONTENT: _text_content,
    EventType.TEXT_MESSAGE_END: on_text_message_end,
    EventType.TOOL_CALL_START: on_tool_call_start,
    EventType.TOOL_CALL_ARGS: on_tool_call_args,
    EventType.TOOL_CALL_END: on_tool_call_end,
    EventType.TOOL_CALL_RESULT: on_tool_call_result,
    EventType.STATE_SNAPSHOT: on_state_snapshot,
    EventType.STATE_DELTA: on_state_delta,
    EventType.MESSAGES_SNAPSHOT: on_messages_snapshot,
    EventType.ACTIVITY_SNAPSHOT: on_activity_snapshot,
    EventType.ACTIVITY_DELTA: on_activity_delta,
    EventType.RAW: _ignore,
    EventType.CUSTOM: _ignore,
    EventType.RUN_STARTED: on_run_started,
    EventType.RUN_FINISHED: on_run_finished,
    EventType.RUN_ERROR: on_run_error,
    EventType.STEP_STARTED: on_step_started,
    EventType.STEP_FINISHED: on_step_finished,
    EventType.REASONING_START: on_reasoning_start,
    EventType.REASONING_MESSAGE_START: on_reasoning_message_start,
    EventType.REASONING_MESSAGE_CONTENT: _text_content,
    EventType.REASONING_MESSAGE_END: on_reasoning_message_end,
    EventType.REASONING_END: on_reasoning_end,
    EventType.REASONING_ENCRYPTED_VALUE: on_reasoning_encrypted_value,
    EventType.SUBAGENT_STARTED: on_subagent_started,
    EventType.SUBAGENT_FINISHED: on_subagent_ended,
    EventType.SUBAGENT_ERROR: on_subagent_ended,
}


# -- what a writer judges ------------------------------------------------------------------


class _Activity:
    __slots__ = ("doc", "type")

    def __init__(self, activity_type: Any, doc: _Doc) -> None:
        self.type = activity_type
        self.doc = doc


class StateDocuments:
    """The state document and activity contents of one thread, under :class:`StateLimits`.

    What a writer keeps of a thread to judge STATE_* and ACTIVITY_* events
    before it stores them: :meth:`apply` folds an event into these documents
    exactly as :class:`ThreadState` does, and refuses what ThreadState would
    refuse (a patch that does not apply, a limit exceeded), changing nothing.
    MESSAGES_SNAPSHOT and the messages of a run's input add, replace and
    remove activity messages as they do in the thread state; other events
    change nothing here. It keeps no text, so it costs the size of the
    documents only (:attr:`size`).

    Changes can be grouped: :meth:`begin`, then :meth:`commit` or
    :meth:`rollback` (a batch is stored whole or not at all).

    With ``known=False`` (a thread whose beginning was trimmed away) the state
    document is unknown: STATE_DELTA events are not judged until a
    STATE_SNAPSHOT. An activity message it never saw is not judged either.

    Unlike the thread state it does not know the ids of other messages: an
    ACTIVITY_SNAPSHOT with ``replace: false`` (or an activity message in a
    run's input) whose id is that of a text message is taken as a new activity
    message, where the thread state ignores it (ids are unique across kinds of
    messages in practice).
    """

    __slots__ = ("_activities", "_activity_bytes", "_state", "_txn", "known", "limits")

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS, *, known: bool = True) -> None:
        self.limits = limits
        self.known = known
        """Whether the state document is known (see above)."""
        self._state = _Doc({}, 2)
        self._activities: dict[Any, _Activity] = {}
        self._activity_bytes = 0
        self._txn: list[_Undo] | None = None

    @property
    def state(self) -> Any:
        """The state document (do not change it)."""
        return self._state.root

    @property
    def size(self) -> int:
        """Approximate encoded bytes of the state document and every activity content."""
        return self._state.size + self._activity_bytes

    def activity(self, message_id: str) -> Any:
        """The content of an activity message, ``None`` when there is none with this id."""
        found = self._activities.get(message_id)
        return None if found is None else found.doc.root

    def apply(self, event: WireEvent) -> None:
        """Fold one (valid) wire event; raise as :meth:`ThreadState.apply` would, changing nothing.

        Raises :class:`~agui_hub.errors.PatchError`,
        :class:`~agui_hub.errors.LimitExceeded`, or
        :class:`~agui_hub.errors.InvalidEvent` for a malformed event.
        """
        if not isinstance(event, Mapping):
            raise InvalidEvent(f"an event is an object, not {type(event).__name__}")
        handler = _DOC_HANDLERS.get(event.get("type"))  # type: ignore[arg-type]
        if handler is None:
            return
        undo = _Undo()
        try:
            handler(self, event, undo)
        except ProtocolError:
            undo.rollback()
            raise
        except _MALFORMED as exc:
            undo.rollback()
            raise _malformed(event, exc) from None
        except BaseException:
            undo.rollback()
            raise
        if self._txn is not None:
            self._txn.append(undo)

    def fold(self, event: Any) -> bool:
        """Fold an event that is stored already: one that does not apply is skipped (``False``)."""
        try:
            self.apply(event)
        except ProtocolError:
            return False
        return True

    def begin(self) -> None:
        """Start recording changes, to :meth:`commit` or :meth:`rollback` them together."""
        self._txn = []

    def commit(self) -> None:
        """Keep the changes since :meth:`begin` (no-op without one)."""
        self._txn = None

    def rollback(self) -> None:
        """Undo every change since :meth:`begin`, exactly (no-op without one)."""
        txn, self._txn = self._txn, None
        for undo in reversed(txn or ()):
            undo.rollback()

    def _set_activity(self, message_id: Any, activity_type: Any, doc: _Doc, undo: _Undo) -> None:
        activities = self._activities
        undo.attr(self, "_activity_bytes")
        old = activities.get(message_id)
        if old is None:
            undo.log.append((_U_NEWKEY, activities, message_id, None))
        else:
            undo.log.append((_U_SET, activities, message_id, old))
            self._activity_bytes -= old.doc.size
        activities[message_id] = _Activity(activity_type, doc)
        self._activity_bytes += doc.size

    def _drop_activity(self, message_id: Any, undo: _Undo) -> None:
        old = self._activities.pop(message_id)
        undo.attr(self, "_activity_bytes")
        undo.log.append((_U_DELKEY, self._activities, message_id, old))
        self._activity_bytes -= old.doc.size


def _doc_state_snapshot(d: StateDocuments, e: WireEvent, undo: _Undo) -> None:
    doc = _measured(e["snapshot"], d.limits, "STATE_SNAPSHOT", "the state")
    undo.attr(d, "_state")
    undo.attr(d, "known")
    d._state, d.known = doc, True


def _doc_state_delta(d: StateDocuments, e: WireEvent, undo: _Undo) -> None:
    delta = e["delta"]
    if d.known:
        _patch(d._state, delta, d.limits, undo, "STATE_DELTA", "the state")


def _doc_activity_snapshot(d: StateDocuments, e: WireEvent, undo: _Undo) -> None:
    message_id, activity_type, content = e["messageId"], e["activityType"], e["content"]
    if message_id in d._activities and not e.get("replace", True):
        return
    doc = _measured(content, d.limits, "ACTIVITY_SNAPSHOT", "the activity content")
    d._set_activity(message_id, activity_type, doc, undo)


def _doc_activity_delta(d: StateDocuments, e: WireEvent, undo: _Undo) -> None:
    patch, activity_type = e["patch"], e["activityType"]
    activity = d._activities.get(e["messageId"])
    if activity is None:
        return
    undo.attr(d, "_activity_bytes")
    undo.attr(activity, "type")
    undo.attr(activity, "doc")
    before = activity.doc.size
    if not activity.doc.root:
        activity.doc = _Doc({}, 2)  # as ThreadState: a patch of a missing content patches {}
    _patch(activity.doc, patch, d.limits, undo, "ACTIVITY_DELTA", "the activity content")
    d._activity_bytes += activity.doc.size - before
    activity.type = activity_type


def _doc_messages_snapshot(d: StateDocuments, e: WireEvent, undo: _Undo) -> None:
    incoming = e["messages"]
    by_id = {m["id"]: m for m in incoming}
    preserved = _preserved(
        _authoritative_activity_types(e),
        any(m.get("role") == "activity" for m in incoming),
        any(m.get("role") == "reasoning" for m in incoming),
    )
    for message_id, activity in list(d._activities.items()):
        replacement = by_id.get(message_id)
        if replacement is not None:
            if replacement.get("role") == "activity":
                doc = _adopted(replacement.get("content"))
                d._set_activity(message_id, replacement.get("activityType"), doc, undo)
            else:
                d._drop_activity(message_id, undo)
        elif not preserved({"role": "activity", "activityType": activity.type}):
            d._drop_activity(message_id, undo)
    for message in incoming:
        message_id = message["id"]
        if message.get("role") == "activity" and message_id not in d._activities:
            doc = _adopted(message.get("content"))
            d._set_activity(message_id, message.get("activityType"), doc, undo)


def _doc_run_started(d: StateDocuments, e: WireEvent, undo: _Undo) -> None:
    for message in _input_messages(e):
        message_id = message.get("id")
        if message.get("role") == "activity" and message_id not in d._activities:
            doc = _adopted(message.get("content"))
            d._set_activity(message_id, message.get("activityType"), doc, undo)


_DOC_HANDLERS: dict[str, Callable[[StateDocuments, WireEvent, _Undo], None]] = {
    EventType.STATE_SNAPSHOT: _doc_state_snapshot,
    EventType.STATE_DELTA: _doc_state_delta,
    EventType.ACTIVITY_SNAPSHOT: _doc_activity_snapshot,
    EventType.ACTIVITY_DELTA: _doc_activity_delta,
    EventType.MESSAGES_SNAPSHOT: _doc_messages_snapshot,
    EventType.RUN_STARTED: _doc_run_started,
}
