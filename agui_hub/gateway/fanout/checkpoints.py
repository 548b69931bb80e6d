"""Checkpoints: a live thread's folded state, stored at an offset now and then.

A channel that starts (in this gateway or another, after a restart or after
retention trimmed the thread's beginning) folds from the thread's checkpoint
rather than from its first event. A :class:`Checkpointer` decides when its
channel writes one and writes it in the background; :func:`fold_checkpoint`
reads one back. A checkpoint is only a shortcut: one that is lost, cannot be
encoded or cannot be read costs a longer fold, never an event.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import msgpack

from ...agui.reducer import ThreadState
from ...store.contract import Checkpoint, ThreadStore
from ...wire.codec import encode_msgpack
from ...wire.offsets import Offset

__all__ = ["CHECKPOINT_EVERY", "CheckpointedChannel", "Checkpointer", "fold_checkpoint"]

log = logging.getLogger("agui_hub.hub")

CHECKPOINT_EVERY = 1000
"""Fewest events between two checkpoints of a live thread's folded state (unless
retention asks for more often)."""


class CheckpointedChannel(Protocol):
    """What a checkpointer reads of its channel, at the instant it takes a checkpoint."""

    @property
    def thread(self) -> str: ...

    @property
    def state(self) -> ThreadState: ...

    @property
    def cursor(self) -> Offset: ...

    @property
    def epoch(self) -> str | None: ...

    @property
    def complete(self) -> bool: ...

    @property
    def closed(self) -> bool: ...


class Checkpointer:
    """Writes the checkpoints of one channel's thread.

    Call :meth:`count` for every entry the channel folds; it writes a
    checkpoint when one is due: after :data:`CHECKPOINT_EVERY` events once
    their bytes add up to the size of the last checkpoint, and in any case
    often enough that retention (by length or by bytes) never trims past the
    last one. A checkpoint encodes the whole folded state, so a thread with
    ten thousand messages open would otherwise pay for encoding them all
    every thousand events, and its cost per delivered event would grow with
    its state; weighed against the bytes delivered, it stays a small share
    of them, and a channel that loads the thread folds at most about a
    checkpoint's worth of events after it. One write is in flight at a time:
    a checkpoint due meanwhile is taken when that write is done, of the
    state of that moment. Call :meth:`restart` when the channel (re)loads
    its thread, :meth:`stop` when it closes.
    """

    __slots__ = ("_bytes_since", "_channel", "_due", "_since", "_size", "_store", "_writing")

    def __init__(self, channel: CheckpointedChannel, store: ThreadStore) -> None:
        self._channel = channel
        self._store = store
        self._since = 0
        self._bytes_since = 0
        self._size = 0
        """Bytes of the last checkpoint taken (or loaded)."""
        self._writing: asyncio.Future[None] | None = None
        self._due = False

    def restart(self, size: int = 0) -> None:
        """Count from zero: the channel folded its thread afresh, from a checkpoint
        of *size* bytes (0: from none)."""
        self._since = 0
        self._bytes_since = 0
        self._size = size

    def stop(self) -> None:
        """Write no more checkpoints (the one in flight finishes)."""
        if self._writing is not None and not self._writing.done():
            self._due = False

    def count(self, size: int) -> None:
        """Count one folded entry of *size* bytes; write a checkpoint if one is due."""
        self._since += 1
        self._bytes_since += size
        retention = self._store.retention
        due = (
            (self._since >= CHECKPOINT_EVERY and self._bytes_since >= self._size)
            # Whatever the size: retention never trims past the last checkpoint.
            or (retention.max_len > 0 and self._since >= max(1, retention.max_len // 2))
            or (retention.max_bytes > 0 and self._bytes_since >= retention.max_bytes // 2)
        )
        if not due or self._channel.epoch is None:
            return
        self._since = 0
        self._bytes_since = 0
        if self._writing is not None and not self._writing.done():
            self._due = True  # written as soon as the one in flight is done
            return
        checkpoint = self._take()
        if checkpoint is not None:
            self._writing = asyncio.ensure_future(self._write(checkpoint))

    def _take(self) -> Checkpoint | None:
        # Encoded now, in one step: the state, cursor and epoch of one instant.
        channel = self._channel
        if channel.epoch is None:
            return None
        try:
            events = encode_msgpack(channel.state.compact(share_messages=True))
        except ValueError as exc:
            log.warning("thread %s: checkpoint not encoded: %s", channel.thread, exc)
            return None
        self._size = len(events)
        return Checkpoint(channel.cursor, channel.epoch, events, channel.complete)

    async def _write(self, checkpoint: Checkpoint) -> None:
        channel = self._channel
        while True:
            try:
                await self._store.put_checkpoint(channel.thread, checkpoint)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a lost checkpoint is only a lost shortcut
                log.warning("thread %s: checkpoint not stored: %r", channel.thread, exc)
            if not self._due or channel.closed:
                return
            self._due = False
            next_one = self._take()
            if next_one is None:
                return
            checkpoint = next_one


def fold_checkpoint(state: ThreadState, checkpoint: Checkpoint, thread: str) -> bool:
    """Fold the events of *checkpoint* into *state* (a fresh one); ``False`` (and
    logged) when they cannot be read or folded: fold the thread from its start."""
    try:
        events: Any = msgpack.unpackb(checkpoint.events, raw=False)
        if not isinstance(events, list):
            raise TypeError("a checkpoint is a list of events")
        for event in events:
            state.apply(event)
    except Exception as exc:  # an unreadable checkpoint is only a lost shortcut
        log.warning("thread %s: checkpoint not used: %r", thread, exc)
        return False
    return True
