"""A thread's message list, and the rules by which snapshots and run inputs change it.

:class:`MessageList` is the message list of a
:class:`~agui_hub.agui.reducer.ThreadState`: canonical wire dicts in
conversation order, found by id and by tool call id through indexes kept in
step with the list, and token deltas collected and joined when the list is
read rather than concatenated one by one. So a TEXT_MESSAGE_CONTENT costs
about the same in a thread of a hundred messages and in one of a hundred
thousand.

The functions below are the message rules that both folds of a thread
follow (``ThreadState`` and :class:`~agui_hub.agui.documents.StateDocuments`):
which messages a MESSAGES_SNAPSHOT keeps that it does not name, and which
messages a RUN_STARTED's input brings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "INDEXED_IDS",
    "MessageList",
    "Msg",
    "WireEvent",
    "input_messages",
    "own_message",
    "snapshot_keeps",
]

WireEvent = Mapping[str, Any]
Msg = dict[str, Any]

INDEXED_IDS = (str, int, float, bool, type(None))
"""Ids that are indexed (valid events have strings; a malformed one may have anything)."""

_CLIENT_METADATA_KEY = "@ag-ui/client"
_UNDECLARED = object()


class MessageList:
    """A thread's messages, in conversation order, with their indexes.

    Read the messages with :attr:`items` (pending deltas are joined first);
    change the list only through the methods here, which keep the indexes in
    step: :attr:`by_id` (the first message with an id), :attr:`calls` (the
    first message and tool call with a tool call id, in any message) and
    :attr:`assistant_calls` (the same, in assistant messages). The messages
    themselves may be changed in place, but not their ids or tool calls
    (use :meth:`add_tool_call`).
    """

    __slots__ = ("_items", "_parts", "_pos", "assistant_calls", "by_id", "calls")

    def __init__(self) -> None:
        self._items: list[Msg] = []
        self.by_id: dict[Any, Msg] = {}
        self.calls: dict[Any, tuple[Msg, Msg]] = {}
        self.assistant_calls: dict[Any, tuple[Msg, Msg]] = {}
        # Where each message was last seen in the list: id(message) -> index. An
        # insertion moves the messages after it one place on, so a hint is at or
        # before the message's place; _position() walks on from it.
        self._pos: dict[int, int] = {}
        # Deltas not yet joined: id(target) -> [target dict, key, parts]; the
        # target holds a reference, so its id is not reused meanwhile.
        self._parts: dict[int, tuple[Msg, str, list[str]]] = {}

    @property
    def items(self) -> list[Msg]:
        """The messages, every delta joined: read it, do not change the list."""
        if self._parts:
            self.join()
        return self._items

    def get(self, message_id: Any) -> Msg | None:
        """The first message with this id, its deltas joined; ``None`` when there is none."""
        if self._parts:
            self.join()
        return self.by_id.get(message_id)

    def ids(self) -> set[Any]:
        """The ids of every message but activity messages (deltas need not be joined)."""
        return {m.get("id") for m in self._items if m.get("role") != "activity"}

    def append(self, message: Msg) -> None:
        """Append *message* and index it (a later message never shadows an earlier one)."""
        self._pos[id(message)] = len(self._items)
        self._items.append(message)
        self._index(message)

    def add_tool_call(self, owner: Msg, call: Msg) -> None:
        """Append *call* to the tool calls of *owner*, an assistant message of the list."""
        if owner.get("toolCalls") is None:
            owner["toolCalls"] = []
        owner["toolCalls"].append(call)
        self.calls.setdefault(call["id"], (owner, call))
        self.assistant_calls.setdefault(call["id"], (owner, call))

    def insert_after_results(self, anchor: Msg, message: Msg) -> None:
        """Insert *message* right after *anchor* and the tool results that follow it.

        Where a TOOL_CALL_RESULT goes: after the assistant message that made
        the call, and after the results already given to its calls.
        """
        messages = self._items
        at = self._position(anchor) + 1
        while at < len(messages) and messages[at].get("role") == "tool":
            at += 1
        messages.insert(at, message)
        self._pos[id(message)] = at
        first = self.by_id.setdefault(message["id"], message)
        if first is not message and self._position(first) > at:
            self.by_id[message["id"]] = message  # inserted before the one indexed so far

    def replace(self, old: Msg, new: Msg) -> None:
        """Put *new* in the place of *old*, a message of the list, and reindex."""
        self.join()
        self._items[self._position(old)] = new
        self._reindex()

    def replace_all(self, messages: list[Msg]) -> None:
        """Make *messages* the list (their order is kept), and reindex."""
        self.join()
        self._items = list(messages)
        self._reindex()

    def append_text(self, target: Msg, key: str, delta: str) -> None:
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

    def join(self) -> None:
        """Join every pending delta into its string."""
        for target, key, parts in self._parts.values():
            target[key] = "".join(parts)
        self._parts.clear()

    def __getstate__(self) -> dict[str, Any]:
        # For copy.deepcopy and pickle: pending deltas and positions are keyed
        # by id(), which a copy does not keep.
        self.join()
        return {
            "items": self._items,
            "by_id": self.by_id,
            "calls": self.calls,
            "assistant_calls": self.assistant_calls,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._items = state["items"]
        self.by_id = state["by_id"]
        self.calls = state["calls"]
        self.assistant_calls = state["assistant_calls"]
        self._parts = {}
        self._pos = {id(message): i for i, message in enumerate(self._items)}

    def _index(self, message: Msg) -> None:
        message_id = message.get("id")
        if isinstance(message_id, INDEXED_IDS):  # anything else is in no valid event
            self.by_id.setdefault(message_id, message)
        calls = message.get("toolCalls")
        if not isinstance(calls, list):
            return
        assistant = message.get("role") == "assistant"
        for call in calls:
            if isinstance(call, dict) and isinstance(call_id := call.get("id"), INDEXED_IDS):
                self.calls.setdefault(call_id, (message, call))
                if assistant:
                    self.assistant_calls.setdefault(call_id, (message, call))

    def _reindex(self) -> None:
        self.by_id = {}
        self.calls = {}
        self.assistant_calls = {}
        self._pos = {id(message): i for i, message in enumerate(self._items)}
        for message in self._items:
            self._index(message)

    def _position(self, message: Msg) -> int:
        """Where *message* is in the list: from where it was last seen, walking on
        past the messages inserted before it since."""
        messages = self._items
        at, end = self._pos.get(id(message), 0), len(messages)
        while at < end and messages[at] is not message:
            at += 1
        if at == end:  # pragma: no cover - the hints are kept in step
            at = next(i for i, m in enumerate(messages) if m is message)
        self._pos[id(message)] = at
        return at


def own_message(message: Mapping[str, Any]) -> Msg:
    """A copy of *message* that can be mutated without touching the original."""
    owned = dict(message)
    calls = owned.get("toolCalls")
    if calls is not None:
        owned["toolCalls"] = [{**c, "function": dict(c.get("function") or {})} for c in calls]
    return owned


def input_messages(e: WireEvent) -> list[Msg]:
    """The messages of a RUN_STARTED's input, as copies the fold may change.

    Raises ``TypeError`` when a message id is not a string (the caller turns
    it into :class:`~agui_hub.errors.InvalidEvent`).
    """
    run_input = e.get("input")
    if not isinstance(run_input, dict):
        return []
    messages = [own_message(m) for m in run_input.get("messages") or ()]
    if not all(isinstance(m.get("id"), INDEXED_IDS) for m in messages):
        raise TypeError("a message id is not a string")
    return messages


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


def snapshot_keeps(e: WireEvent, incoming: list[Msg]) -> Callable[[Msg], bool]:
    """Whether a message the MESSAGES_SNAPSHOT *e* (whose messages are
    *incoming*) does not name survives it.

    Client-only messages the producer may not know about (activity,
    reasoning) survive a snapshot unless the snapshot declares itself
    authoritative for their kind, or brings messages of that kind itself.
    """
    owned = _authoritative_activity_types(e)
    has_activity = any(m.get("role") == "activity" for m in incoming)
    has_reasoning = any(m.get("role") == "reasoning" for m in incoming)

    def preserved(m: Msg) -> bool:
        if m.get("role") == "activity":
            if isinstance(owned, list):
                return m.get("activityType") not in owned
            return owned is _UNDECLARED and not has_activity
        return m.get("role") == "reasoning" and not has_reasoning

    return preserved
