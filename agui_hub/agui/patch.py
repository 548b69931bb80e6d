"""RFC 6902 JSON Patch on a thread's documents, in place, with an undo log and bounded work.

A :class:`Document` is one patchable value of a thread's folded state: the
shared state document, or the content of one activity message. It carries a
running estimate of its encoded size, so that :class:`StateLimits` can be
checked per operation without walking the whole document, and a running
count of what it costs in memory, which the caches that keep documents
budget.

* :func:`apply_patch` patches a document in place and logs every change into
  an :class:`UndoLog`; on an error the caller rolls the log back and the
  document is exactly as before (key order included). Its cost is that of
  the operations, not of the document: a patch may walk at most twice
  ``max_bytes`` of the document it changes (measuring what it removes or
  copies), and the work it does on what the document holds already (see
  :class:`WorkBudget`) is charged to a budget, which a writer shares between
  the events of one publish.
* :func:`snapshot_document` makes a document of a value an event brings whole
  (STATE_SNAPSHOT, ACTIVITY_SNAPSHOT), refusing one past the limits;
  :func:`adopted_document` one of a value that is already in the state,
  whatever its size.

Values are shared, never deep-copied: the values of a patch are put into the
document as they are, ``copy`` makes the copy share the source, and a
snapshot is the event's own value. A container is changed in place only when
the document owns it (it made it, and nothing else refers to it: ids in
:attr:`Document.owned`); any other is first copied (one level, along the
patched path). Whoever hands a document out (``ThreadState.compact()``) drops
every ownership, by bumping the generation the ownership is valid for.

Sizes are estimates of the JSON encoding: measured once per value that
enters or leaves the document, by an iterative walker that stops as soon as
a limit is exceeded, and kept as a running total. Nothing recurses, so no
nesting can overflow the stack. The same walk counts memory: every
container's own ``sys.getsizeof`` (its table, with any room it kept after
removals), every scalar that is not one of Python's shared singletons
(``None``, booleans, small integers), and every key with the slot it takes
in the interpreter's table of interned strings (msgpack interns the keys it
decodes), each time it occurs. So a key that decoding shared between
objects, and a value that ``copy`` shared, count once per place: an upper
bound, up to about twice the memory for a list of small records. A small object
decoded from msgpack costs 3 to 25 times its encoded size in memory: the
encoded size alone would let a cache several times its budget.

Errors: :class:`~agui_hub.errors.PatchError` for a patch that does not apply,
:class:`~agui_hub.errors.LimitExceeded` for one (or a snapshot) past the
limits. Nothing else, whatever the patch.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Any

from ..errors import LimitExceeded, PatchError

__all__ = [
    "DEFAULT_LIMITS",
    "FOLD_WORK_FACTOR",
    "YIELD_WORK",
    "Document",
    "StateLimits",
    "UndoLog",
    "WorkBudget",
    "adopted_document",
    "apply_patch",
    "snapshot_document",
]


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
    max_work: int = 50_000
    """Work units (see :class:`WorkBudget`) the STATE_DELTA and ACTIVITY_DELTA
    events of one publish may spend on what the documents hold already:
    measuring what they copy, remove, replace or move, copying containers along
    the paths they change, shifting array items. About 15 ms of CPU on a slow
    core (docs/security.md). A fold of stored events allows one event
    :data:`FOLD_WORK_FACTOR` times this."""

    def __post_init__(self) -> None:
        if self.max_depth < 1 or self.max_bytes < 1 or self.max_work < 1:
            raise ValueError("state limits must be at least 1")


DEFAULT_LIMITS = StateLimits()


_MISSING: Any = object()
_INDEX = re.compile(r"0|[1-9][0-9]*")
_BAD_ESCAPE = re.compile(r"~(?![01])")


class _Fail(Exception):
    """A patch operation that does not apply (becomes a PatchError)."""


class _Over(Exception):
    """A limit exceeded (becomes a LimitExceeded); ``args[0]`` names the limit."""


_EMPTY_OBJECT = sys.getsizeof({})


class Document:
    """One patchable document: the state, or the content of an activity message.

    Make one with :func:`snapshot_document` or :func:`adopted_document`
    (``Document({}, 2)`` is the empty object), and change it only through
    :func:`apply_patch`, which keeps :attr:`size`, :attr:`memory` and
    :attr:`owned` right.
    """

    __slots__ = ("gen", "memory", "owned", "root", "size")

    def __init__(self, root: Any, size: int, memory: int = _EMPTY_OBJECT, gen: int = 0) -> None:
        self.root = root
        self.size = size
        """Approximate encoded size in bytes."""
        self.memory = memory
        """Bytes of memory its values take (see the module's docstring): what a
        cache of documents counts. (The default is that of ``{}``.)"""
        self.owned: set[int] = set()
        """ids of the containers this document may change in place."""
        self.gen = gen
        """The exposure generation ``owned`` is valid for."""


class _Meter:
    """Bytes of existing document a patch may still walk (see StateLimits.max_bytes)."""

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left


FOLD_WORK_FACTOR = 2
"""A fold of events that are stored already (a viewer's state, a writer catching
up) allows each event this many times :attr:`StateLimits.max_work`: what a
writer accepted is folded (a fold may copy a little more than the writer did,
after it handed its documents out), and what it could not afford (an event
stored by another producer) is given up on rather than stall the fold."""

YIELD_WORK = 10_000
"""Work units after which a caller folding or judging many events lets other
tasks run (a few milliseconds): a publish of many costly deltas then holds an
event loop for one event at a time, not for all of them."""

# What the work of a patch costs, in work units: one unit is about one array
# item visited by the measuring walk (~0.3 us of CPU, bench/bench_budget.py
# --calibrate); an object's entry costs two (its key too), entering a
# container four (a frame of the walk); C-level copies and shifts of
# container slots are far cheaper per slot, rebuilding a dict's key order
# (to roll back a removal) dearer per key.
_W_ITEM = 1
_W_ENTRY = 2
_W_CONTAINER = 4
_COPY_SLOTS = 16
"""Slots of a dict or list copied per work unit."""
_SHIFT_SLOTS = 256
"""Array items shifted by an insert or a removal per work unit."""
_W_ORDER_KEY = 3
"""Work units per key of a dict whose key order is saved (rebuilt on a rollback)."""


class WorkBudget:
    """The work a publish (or one folded event) may still do on state documents.

    Work is counted in units, each about one JSON value visited (~0.3 us of
    CPU on a slow core): measuring a value that is in the document already
    (the source of a ``copy``, what ``remove`` and ``replace`` take away, a
    value moved deeper) costs one unit per array item, two per object entry
    and four per container entered; copying a container along a patched path
    costs one unit per 16 slots, shifting array items (an insert or a removal
    before the end) one per 256 items, and removing an object's key other
    than its last costs three per key of the object (its key order is saved,
    to be rebuilt if the event is rolled back). Values an event brings itself cost
    nothing here: they are bounded by the event's size. The cost of each step
    is charged before the step (a walk is charged value by value and stops
    as soon as the budget is spent), so an event past the budget costs at
    most the budget.

    Share one budget between the events of one publish (the writer does),
    or give each event its own (a fold). :attr:`spent` is what was charged
    over every :meth:`restart`: what a connection's rate counts.
    """

    __slots__ = ("left", "limit", "spent")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit
        self.spent = 0
        """Units charged since this budget was made (restarts included)."""

    def restart(self) -> None:
        """Give the whole budget again (the same events judged afresh);
        :attr:`spent` keeps counting."""
        self.left = self.limit

    def charge(self, units: int) -> None:
        """Charge *units* about to be spent; raises ``_Over("max_work")`` when
        they are more than what is left (nothing is charged past it)."""
        if units > self.left:
            self.spent += max(self.left, 0)
            self.left = -1
            raise _Over("max_work")
        self.left -= units
        self.spent += units


# Undo records: (kind, target, key, old value)
_U_SET = 0  # target[key] = old            (a replaced dict value or list item)
_U_NEWKEY = 1  # del target[key]           (a dict key that was added)
_U_DELKEY = 2  # target[key] = old         (a dict key that was removed; order fixed after)
_U_INSERT = 3  # del target[key]           (a list item that was inserted)
_U_POP = 4  # target.insert(key, old)      (a list item that was removed)
_U_ATTR = 5  # setattr(target, key, old)


class UndoLog:
    """What one event changed, to put it back exactly.

    Log each change before making it (:func:`apply_patch` logs its own);
    :meth:`rollback` undoes them all, newest first. A log is used for one
    event (or one batch) and dropped once the change is kept.
    """

    __slots__ = ("log", "orders")

    def __init__(self) -> None:
        self.log: list[tuple[int, Any, Any, Any]] = []
        self.orders: dict[int, tuple[dict[Any, Any], list[Any]]] = {}
        """Dicts that lost a key other than their last: their key order before."""

    def attr(self, target: Any, name: str) -> None:
        """Log the attribute *name* of *target*, about to be set."""
        self.log.append((_U_ATTR, target, name, getattr(target, name)))

    def replaced_key(self, target: dict[Any, Any], key: Any, old: Any) -> None:
        """Log that ``target[key]``, which was *old*, is about to be set."""
        self.log.append((_U_SET, target, key, old))

    def added_key(self, target: dict[Any, Any], key: Any) -> None:
        """Log that *key*, not in *target*, is about to be added."""
        self.log.append((_U_NEWKEY, target, key, None))

    def removed_key(self, target: dict[Any, Any], key: Any, old: Any) -> None:
        """Log that *key*, whose value was *old*, was removed from *target*.

        A rollback puts it back at the end of the dict: where the order
        matters, the patcher records it in :attr:`orders` too.
        """
        self.log.append((_U_DELKEY, target, key, old))

    def rollback(self) -> None:
        """Undo every change logged, newest first, and empty the log."""
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


def _scalar_memory(value: Any) -> int:
    """Bytes a scalar (or a key) takes; 0 for the singletons every value shares."""
    if value is None or value is True or value is False:
        return 0
    if type(value) is int and -5 <= value <= 256:
        return 0  # CPython's cached small integers
    return sys.getsizeof(value)


_INTERNED_SLOT = 48
"""Bytes of the interpreter's table of interned strings one key takes (msgpack
interns the keys it decodes; the table's growth measured at 40 to 100 B a key)."""


def _key_memory(key: Any) -> int:
    return _scalar_memory(key) + _INTERNED_SLOT


def _scalar_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value) + 2
    if value is None or value is True:
        return 4
    if value is False:
        return 5
    return 8


def _frame(node: Any, entered_at: int, memory_at: int) -> list[Any]:
    """A walker's frame: [container, iterator, is_dict, total when entered,
    highest item, memory when entered]."""
    if isinstance(node, dict):
        return [node, iter(node.items()), True, entered_at, 0, memory_at]
    return [node, iter(node), False, entered_at, 0, memory_at]


def _measure(
    value: Any,
    room: float,
    max_height: int | None,
    meter: _Meter | None = None,
    owned: set[int] | None = None,
    work: WorkBudget | None = None,
) -> tuple[int, int, int]:
    """(approximate encoded size, height, memory) of *value*; a scalar has
    height 0, a container one more than its highest item; memory as the
    module's docstring says.

    Raises ``_Over("max_bytes")`` as soon as the size exceeds *room*,
    ``_Over("max_depth")`` as soon as the height would exceed *max_height*
    (``None``: no bound), ``_Over("work")`` when the walk costs more than
    *meter* has left, ``_Over("max_work")`` as soon as the values visited cost
    more than *work* has left (a value of the document, not of the event).
    The id of every container walked is dropped from
    *owned*: the value is shared from now on. A value that holds the same
    container several times (a document made by ``copy``) is walked once per
    container, and counted as often as it occurs.
    """
    if not isinstance(value, dict | list):
        size = _scalar_size(value)
        if size > room:
            raise _Over("max_bytes")
        if work is not None:
            work.charge(_W_ITEM)
        return size, 0, _scalar_memory(value)
    if max_height is not None and max_height < 1:
        raise _Over("max_depth")
    # Work is counted in a local and charged once, or as soon as it would
    # exceed what is left: one comparison per value.
    affordable = work.left if work is not None else math.inf
    steps = _W_CONTAINER
    if steps > affordable:
        assert work is not None
        work.charge(steps)
    try:
        getsizeof = sys.getsizeof
        memo: dict[int, tuple[int, int, int]] = {}
        shared = 0  # bytes counted from memo, not walked
        total = 2
        memory = sys.getsizeof(value)
        stack: list[list[Any]] = [_frame(value, 0, 0)]
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
                    memory += getsizeof(key) + _INTERNED_SLOT
                    steps += _W_ENTRY
                else:
                    child = item
                    total += 1
                    steps += _W_ITEM
                if isinstance(child, dict | list):
                    known = memo.get(id(child))
                    if known is not None:
                        total += known[0]
                        memory += known[2]
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
                        stack.append(_frame(child, total, memory))
                        total += 2
                        memory += sys.getsizeof(child)
                        steps += _W_CONTAINER
                        entered = True
                elif isinstance(child, str):  # _scalar_size and _scalar_memory, inline
                    total += len(child) + 2
                    memory += getsizeof(child)
                elif child is None or child is True:
                    total += 4
                elif child is False:
                    total += 5
                else:
                    total += 8
                    if type(child) is not int or not -5 <= child <= 256:
                        memory += getsizeof(child)
                if total > room:
                    raise _Over("max_bytes")
                if steps > affordable:
                    assert work is not None
                    work.charge(steps)  # raises: more than what is left
                if entered:
                    break
            if entered:
                if meter is not None and total - shared > meter.left:
                    raise _Over("work")
                continue
            stack.pop()
            height = top[4] + 1
            memo[id(top[0])] = (total - top[3], height, memory - top[5])
            if stack and height > stack[-1][4]:
                stack[-1][4] = height
        if meter is not None:
            meter.left -= total - shared
            if meter.left < 0:
                raise _Over("work")
    except _Over:
        if work is not None and work.left >= 0:
            work.spent += steps  # a refused walk costs the connection's rate all the same
        raise
    if work is not None:
        work.charge(steps)
    return total, memo[id(value)][1], memory


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

    __slots__ = ("doc", "limits", "meter", "undo", "work")

    def __init__(self, doc: Document, limits: StateLimits, undo: UndoLog, work: WorkBudget) -> None:
        self.doc = doc
        self.limits = limits
        self.undo = undo
        self.meter = _Meter(2 * limits.max_bytes)
        self.work = work

    def apply(self, patch: Any) -> None:
        if not isinstance(patch, list):
            raise _Fail("a JSON Patch is a list of operations")
        doc, undo = self.doc, self.undo
        undo.attr(doc, "size")
        undo.attr(doc, "memory")
        undo.attr(doc, "root")
        for n, op in enumerate(patch):
            if not isinstance(op, dict):
                raise _Fail(f"operation {n} is not an object")
            name = op.get("op")
            try:
                path = _pointer(op.get("path"), "path")
                if name == "add":
                    self._put(path, self._value(op), move_from=None, existing=False)
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
                    moved = self._remove(source, measure=False)
                    self._put(path, moved, move_from=source, existing=True)
                elif name == "copy":
                    source = _pointer(op.get("from"), "from")
                    self._put(path, self._get(source), move_from=None, existing=True)
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
        work = self.work
        if id(node) not in owned:
            work.charge(1 + len(node) // _COPY_SLOTS)
            node = self._copy(node)
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
                work.charge(1 + len(child) // _COPY_SLOTS)
                child = self._copy(child)
                owned.add(id(child))
                undo.log.append((_U_SET, node, key, node[key]))
                node[key] = child
            node = child
        return node

    def _copy(self, node: dict[str, Any] | list[Any]) -> dict[str, Any] | list[Any]:
        """A copy of one level of *node*, to change in place (its table may be smaller)."""
        copied = dict(node) if isinstance(node, dict) else list(node)
        self.doc.memory += sys.getsizeof(copied) - sys.getsizeof(node)
        return copied

    def _forget(self, value: Any) -> None:
        """Count *value* (which leaves the document) out of its size and memory."""
        size, _, memory = _measure(value, math.inf, None, self.meter, work=self.work)
        self.doc.size -= size
        self.doc.memory -= memory

    def _put(
        self,
        tokens: tuple[str, ...],
        value: Any,
        move_from: tuple[str, ...] | None,
        *,
        existing: bool,
    ) -> None:
        """add (and the second half of move and copy); *existing*: the value is
        the document's (moved, copied), and measuring it is work."""
        doc, limits = self.doc, self.limits
        work = self.work if existing else None
        if move_from is None:
            # Measured first: this also makes the value (a copy's source) shared.
            size, _, memory = _measure(
                value,
                limits.max_bytes,
                limits.max_depth - len(tokens),
                self.meter,
                doc.owned,
                work,
            )
        else:
            # Moved: the document changes only by the keys (and its tables).
            size = memory = 0
            if len(tokens) > len(move_from):
                _measure(value, math.inf, limits.max_depth - len(tokens), self.meter, work=work)
        if not tokens:
            doc.root = value
            if move_from is None:
                doc.size, doc.memory = size, memory
            else:
                doc.size, _, doc.memory = _measure(
                    value, math.inf, None, self.meter, work=self.work
                )
        else:
            parent = self._parent(tokens)
            table = sys.getsizeof(parent)
            last = tokens[-1]
            if isinstance(parent, dict):
                old = parent.get(last, _MISSING)
                if old is _MISSING:
                    self.undo.log.append((_U_NEWKEY, parent, last, None))
                    doc.size += len(last) + 4
                    doc.memory += _key_memory(last)
                else:
                    self.undo.log.append((_U_SET, parent, last, old))
                    self._forget(old)
                parent[last] = value
            elif isinstance(parent, list):
                index = _index(tokens, len(parent), end=True)
                self.work.charge((len(parent) - index) // _SHIFT_SLOTS)
                parent.insert(index, value)
                self.undo.log.append((_U_INSERT, parent, index, None))
                doc.size += 1
            else:
                raise _Fail(f"{_render(tokens[:-1]) or 'the root'} is not an object or array")
            doc.size += size
            doc.memory += memory + sys.getsizeof(parent) - table
        if doc.size > limits.max_bytes:
            raise _Over("max_bytes")

    def _remove(self, tokens: tuple[str, ...], *, measure: bool) -> Any:
        if not tokens:
            raise _Fail("the whole document cannot be removed")
        doc = self.doc
        parent = self._parent(tokens)
        table = sys.getsizeof(parent)
        last = tokens[-1]
        if isinstance(parent, dict):
            old = parent.get(last, _MISSING)
            if old is _MISSING:
                raise _Fail(f"{_render(tokens)} does not exist")
            if next(reversed(parent)) != last and id(parent) not in self.undo.orders:
                # Saved to roll back, and rebuilt key by key if it is.
                self.work.charge(_W_ORDER_KEY * len(parent))
                self.undo.orders[id(parent)] = (parent, list(parent))
            del parent[last]
            self.undo.log.append((_U_DELKEY, parent, last, old))
            doc.size -= len(last) + 4
            doc.memory -= _key_memory(last)
        elif isinstance(parent, list):
            index = _index(tokens, len(parent), end=False)
            self.work.charge((len(parent) - index) // _SHIFT_SLOTS)
            old = parent.pop(index)
            self.undo.log.append((_U_POP, parent, index, old))
            doc.size -= 1
        else:
            raise _Fail(f"{_render(tokens[:-1]) or 'the root'} is not an object or array")
        doc.memory += sys.getsizeof(parent) - table
        if measure:
            self._forget(old)
        return old

    def _replace(self, tokens: tuple[str, ...], value: Any) -> None:
        doc, limits = self.doc, self.limits
        size, _, memory = _measure(
            value, limits.max_bytes, limits.max_depth - len(tokens), self.meter, doc.owned
        )
        if not tokens:
            doc.root, doc.size, doc.memory = value, size, memory
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
        self._forget(old)
        doc.size += size
        doc.memory += memory
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
    if kind == "max_work":
        return LimitExceeded(
            f"{what} would take more work than max_work={limits.max_work} units on {where} "
            "(one publish's copies, removals, replacements and moves of values it holds "
            "already; the gateway's --state-max-work)",
            limit="max_work",
            value=limits.max_work,
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


def apply_patch(
    doc: Document,
    patch: Any,
    limits: StateLimits,
    undo: UndoLog,
    what: str,
    where: str,
    work: WorkBudget | None = None,
) -> None:
    """Apply *patch* to *doc* in place, logging every change into *undo*.

    Raises :class:`~agui_hub.errors.PatchError` (the patch does not apply) or
    :class:`~agui_hub.errors.LimitExceeded` (*doc* would exceed *limits*, or
    the patch would cost more than *work* has left: ``limit="max_work"``);
    the document is then half-patched: call ``undo.rollback()``. *what* and
    *where* name the event and the document in the error's message (e.g.
    ``"STATE_DELTA"``, ``"the state"``). Without *work*, the patch gets a
    budget of its own of ``limits.max_work``.
    """
    if work is None:
        work = WorkBudget(limits.max_work)
    try:
        _Patcher(doc, limits, undo, work).apply(patch)
    except _Fail as exc:
        raise PatchError(f"JSON Patch does not apply: {exc}", patch=patch) from None
    except _Over as over:
        raise _limit_error(over, limits, what, where) from None


def snapshot_document(value: Any, limits: StateLimits, what: str, where: str) -> Document:
    """A document of *value*, which an event brings whole (a snapshot).

    Raises :class:`~agui_hub.errors.LimitExceeded` when *value* is past
    *limits* (*what* and *where* as for :func:`apply_patch`). The document
    owns nothing yet: *value* is the event's own, shared.
    """
    try:
        size, _, memory = _measure(value, limits.max_bytes, limits.max_depth)
    except _Over as over:
        raise _limit_error(over, limits, what, where) from None
    return Document(value, size, memory)


def adopted_document(value: Any) -> Document:
    """A document of a value that is already in the state, whatever its size
    (the state was assigned from outside, a message snapshot brought it)."""
    size, _, memory = _measure(value, math.inf, None)
    return Document(value, size, memory)
