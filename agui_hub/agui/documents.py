"""What a writer keeps of a thread to judge its STATE_* and ACTIVITY_* events.

:class:`StateDocuments` is the part of the fold of
:class:`~agui_hub.agui.reducer.ThreadState` that changes the state document
and the activity contents, on its own: it refuses, before an event is stored,
a delta that does not apply or a document past the limits, exactly as the
thread state would, and costs the size of the documents only (no text).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import InvalidEvent, ProtocolError
from .events import EventType
from .messages import WireEvent, input_messages, snapshot_keeps
from .patch import (
    DEFAULT_LIMITS,
    FOLD_WORK_FACTOR,
    Document,
    StateLimits,
    UndoLog,
    WorkBudget,
    adopted_document,
    apply_patch,
    snapshot_document,
)
from .reducer import MALFORMED_EVENT_ERRORS, malformed_event

__all__ = ["StateDocuments"]


class _Activity:
    """An activity message as StateDocuments knows it: its type and its content."""

    __slots__ = ("doc", "type")

    def __init__(self, activity_type: Any, doc: Document) -> None:
        self.type = activity_type
        self.doc = doc


class StateDocuments:
    """The state document and activity contents of one thread, under
    :class:`~agui_hub.agui.patch.StateLimits`.

    What a writer keeps of a thread to judge STATE_* and ACTIVITY_* events
    before it stores them: :meth:`apply` folds an event into these documents
    exactly as :class:`~agui_hub.agui.reducer.ThreadState` does, and refuses
    what ThreadState would refuse (a patch that does not apply, a limit
    exceeded), changing nothing.
    MESSAGES_SNAPSHOT and the messages of a run's input add, replace and
    remove activity messages as they do in the thread state; other events
    change nothing here. It keeps no text, so it costs the documents only
    (:attr:`memory`; :attr:`size` is what the limits bound).

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

    __slots__ = (
        "_activities",
        "_activity_memory",
        "_state",
        "_txn",
        "known",
        "limits",
    )

    def __init__(self, limits: StateLimits = DEFAULT_LIMITS, *, known: bool = True) -> None:
        self.limits = limits
        self.known = known
        """Whether the state document is known (see above)."""
        self._state = Document({}, 2)
        self._activities: dict[Any, _Activity] = {}
        self._activity_memory = 0
        self._txn: list[UndoLog] | None = None

    @property
    def state(self) -> Any:
        """The state document (do not change it)."""
        return self._state.root

    @property
    def size(self) -> int:
        """Approximate encoded bytes of the state document and every activity content."""
        # Read by no hot path (the writer's cache counts memory): summed, not kept.
        return self._state.size + sum(a.doc.size for a in self._activities.values())

    @property
    def memory(self) -> int:
        """Bytes of memory the state document and the activity contents take
        (see :class:`~agui_hub.agui.patch.Document`): what a cache of them counts."""
        return self._state.memory + self._activity_memory

    def activity(self, message_id: str) -> Any:
        """The content of an activity message, ``None`` when there is none with this id."""
        found = self._activities.get(message_id)
        return None if found is None else found.doc.root

    def apply(self, event: WireEvent, work: WorkBudget | None = None) -> None:
        """Fold one (valid) wire event; raise as ThreadState.apply would, changing nothing.

        Raises :class:`~agui_hub.errors.PatchError`,
        :class:`~agui_hub.errors.LimitExceeded` (also when a delta costs more
        than *work* has left: share one budget between the events of a
        publish; without one, the event gets ``limits.max_work``), or
        :class:`~agui_hub.errors.InvalidEvent` for a malformed event.
        """
        if not isinstance(event, Mapping):
            raise InvalidEvent(f"an event is an object, not {type(event).__name__}")
        handler = _DOC_HANDLERS.get(event.get("type"))  # type: ignore[arg-type]
        if handler is None:
            return
        if work is None:
            work = WorkBudget(self.limits.max_work)
        undo = UndoLog()
        try:
            handler(self, event, undo, work)
        except ProtocolError:
            undo.rollback()
            raise
        except MALFORMED_EVENT_ERRORS as exc:
            undo.rollback()
            raise malformed_event(event, exc) from None
        except BaseException:
            undo.rollback()
            raise
        if self._txn is not None:
            self._txn.append(undo)

    def fold(self, event: Any) -> bool:
        """Fold an event that is stored already: one that does not apply, or that
        costs more than ``FOLD_WORK_FACTOR * limits.max_work``, is skipped
        (``False``), as a gateway's fold skips it."""
        try:
            self.apply(event, WorkBudget(FOLD_WORK_FACTOR * self.limits.max_work))
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

    def _set_activity(
        self, message_id: Any, activity_type: Any, doc: Document, undo: UndoLog
    ) -> None:
        activities = self._activities
        undo.attr(self, "_activity_memory")
        old = activities.get(message_id)
        if old is None:
            undo.added_key(activities, message_id)
        else:
            undo.replaced_key(activities, message_id, old)
            self._activity_memory -= old.doc.memory
        activities[message_id] = _Activity(activity_type, doc)
        self._activity_memory += doc.memory

    def _drop_activity(self, message_id: Any, undo: UndoLog) -> None:
        old = self._activities.pop(message_id)
        undo.attr(self, "_activity_memory")
        undo.removed_key(self._activities, message_id, old)
        self._activity_memory -= old.doc.memory


def _doc_state_snapshot(d: StateDocuments, e: WireEvent, undo: UndoLog, work: WorkBudget) -> None:
    doc = snapshot_document(e["snapshot"], d.limits, "STATE_SNAPSHOT", "the state")
    undo.attr(d, "_state")
    undo.attr(d, "known")
    d._state, d.known = doc, True


def _doc_state_delta(d: StateDocuments, e: WireEvent, undo: UndoLog, work: WorkBudget) -> None:
    delta = e["delta"]
    if d.known:
        apply_patch(d._state, delta, d.limits, undo, "STATE_DELTA", "the state", work)


def _doc_activity_snapshot(
    d: StateDocuments, e: WireEvent, undo: UndoLog, work: WorkBudget
) -> None:
    message_id, activity_type, content = e["messageId"], e["activityType"], e["content"]
    if message_id in d._activities and not e.get("replace", True):
        return
    doc = snapshot_document(content, d.limits, "ACTIVITY_SNAPSHOT", "the activity content")
    d._set_activity(message_id, activity_type, doc, undo)


def _doc_activity_delta(d: StateDocuments, e: WireEvent, undo: UndoLog, work: WorkBudget) -> None:
    patch, activity_type = e["patch"], e["activityType"]
    activity = d._activities.get(e["messageId"])
    if activity is None:
        return
    undo.attr(d, "_activity_memory")
    undo.attr(activity, "type")
    undo.attr(activity, "doc")
    memory = activity.doc.memory
    if not activity.doc.root:
        activity.doc = Document({}, 2)  # as ThreadState: a patch of a missing content patches {}
    apply_patch(activity.doc, patch, d.limits, undo, "ACTIVITY_DELTA", "the activity content", work)
    d._activity_memory += activity.doc.memory - memory
    activity.type = activity_type


def _doc_messages_snapshot(
    d: StateDocuments, e: WireEvent, undo: UndoLog, work: WorkBudget
) -> None:
    incoming = e["messages"]
    by_id = {m["id"]: m for m in incoming}
    preserved = snapshot_keeps(e, incoming)
    for message_id, activity in list(d._activities.items()):
        replacement = by_id.get(message_id)
        if replacement is not None:
            if replacement.get("role") == "activity":
                doc = adopted_document(replacement.get("content"))
                d._set_activity(message_id, replacement.get("activityType"), doc, undo)
            else:
                d._drop_activity(message_id, undo)
        elif not preserved({"role": "activity", "activityType": activity.type}):
            d._drop_activity(message_id, undo)
    for message in incoming:
        message_id = message["id"]
        if message.get("role") == "activity" and message_id not in d._activities:
            doc = adopted_document(message.get("content"))
            d._set_activity(message_id, message.get("activityType"), doc, undo)


def _doc_run_started(d: StateDocuments, e: WireEvent, undo: UndoLog, work: WorkBudget) -> None:
    for message in input_messages(e):
        message_id = message.get("id")
        if message.get("role") == "activity" and message_id not in d._activities:
            doc = adopted_document(message.get("content"))
            d._set_activity(message_id, message.get("activityType"), doc, undo)


_DOC_HANDLERS: dict[str, Callable[[StateDocuments, WireEvent, UndoLog, WorkBudget], None]] = {
    EventType.STATE_SNAPSHOT: _doc_state_snapshot,
    EventType.STATE_DELTA: _doc_state_delta,
    EventType.ACTIVITY_SNAPSHOT: _doc_activity_snapshot,
    EventType.ACTIVITY_DELTA: _doc_activity_delta,
    EventType.MESSAGES_SNAPSHOT: _doc_messages_snapshot,
    EventType.RUN_STARTED: _doc_run_started,
}
