"""Who watches a thread: what :meth:`HubClient.presence
<agui_hub.client.HubClient.presence>` returns, what a ``presence=True``
subscription yields and keeps, and the ``client`` map a connection announces.

* :class:`Watcher`: one connection subscribed to the thread (its id, the
  token's subject, when it joined, what it announced of itself);
* :class:`Presence`: the answer to the ``presence`` command;
* :class:`PresenceChanged`: the item a ``presence=True`` subscription yields
  for each ``presence``, ``joined`` and ``left`` frame;
* :class:`LivePresence`: :attr:`Subscription.presence
  <agui_hub.client.Subscription.presence>`, kept up to date from those items.

The wire format is in docs/protocol.md ("presence").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from ..wire.protocol import MAX_CLIENT_BYTES, MAX_CLIENT_KEY_CHARS

__all__ = [
    "ClientInfo",
    "LivePresence",
    "Presence",
    "PresenceChanged",
    "Watcher",
    "check_client_info",
]

ClientInfo = Mapping[str, str | int | float | bool | None]
"""What a connection tells the others watching a thread about itself: a flat map,
keys of at most 32 characters, at most 256 bytes of JSON (e.g. ``{"name": "web"}``)."""

PresenceKind = Literal["presence", "joined", "left"]


def check_client_info(client: ClientInfo | None) -> dict[str, Any] | None:
    """*client* as it goes on the wire (a copy), or ``None``; :class:`ValueError`
    when the gateway would refuse it (``bad_command``): not flat, a key empty or
    over 32 characters, a value that is not a string, number, boolean or null, or
    over 256 bytes of JSON."""
    if client is None:
        return None
    if not isinstance(client, Mapping):
        raise ValueError("client is a map, e.g. {'name': 'web'}")
    copy = dict(client)
    for key, value in copy.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_CLIENT_KEY_CHARS:
            raise ValueError(f"client keys are strings of 1 to {MAX_CLIENT_KEY_CHARS} characters")
        if value is not None and not isinstance(value, str | int | float | bool):
            raise ValueError(
                f"client[{key!r}] is a {type(value).__name__}: client is a flat map of "
                "strings, numbers, booleans and null"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"client[{key!r}] is not a finite number")
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            raise ValueError(f"client[{key!r}] does not fit in 64 bits")
    size = len(json.dumps(copy, ensure_ascii=False).encode())
    if size > MAX_CLIENT_BYTES:
        raise ValueError(f"client is {size} bytes of JSON, over {MAX_CLIENT_BYTES}")
    return copy


@dataclass(frozen=True, slots=True)
class Watcher:
    """One connection subscribed to the thread, on any gateway of the store."""

    connection: str
    """Its id, unique across gateways (a new one for each connection)."""
    subject: str
    """The subject of its token, or ``"anonymous"``."""
    joined: int | None = None
    """When it subscribed, in ms since the Unix epoch (UTC); ``None`` only in a
    ``left`` item about a connection this subscription never saw join."""
    client: dict[str, Any] | None = None
    """What it announced of itself (``client=``), ``None`` when nothing."""

    @property
    def joined_at(self) -> datetime | None:
        """:attr:`joined` as an aware datetime in UTC (``.astimezone()`` for local time)."""
        if self.joined is None:
            return None
        return datetime.fromtimestamp(self.joined / 1000, UTC)

    def as_json(self) -> dict[str, Any]:
        """The entry as the gateway sends it (no ``joined`` / ``client`` when unknown)."""
        out: dict[str, Any] = {"connection": self.connection, "subject": self.subject}
        if self.joined is not None:
            out["joined"] = self.joined
        if self.client is not None:
            out["client"] = self.client
        return out

    @classmethod
    def from_json(cls, entry: Any) -> Watcher | None:
        """The entry of a frame, or ``None`` when it is not one (it is then left out)."""
        if not isinstance(entry, Mapping):
            return None
        connection, subject = entry.get("connection"), entry.get("subject")
        joined, client = entry.get("joined"), entry.get("client")
        if not isinstance(connection, str) or not isinstance(subject, str):
            return None
        if isinstance(joined, bool) or not isinstance(joined, int):
            joined = None
        return cls(
            connection, subject, joined, dict(client) if isinstance(client, Mapping) else None
        )


def _watchers(entries: Any) -> tuple[Watcher, ...]:
    if not isinstance(entries, list):
        return ()
    return tuple(w for w in map(Watcher.from_json, entries) if w is not None)


def _count(frame: Mapping[str, Any]) -> int:
    count = frame.get("count")
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else 0


@dataclass(frozen=True, slots=True)
class Presence:
    """Who watches a thread now, on every gateway that shares the store.

    ``count`` is every watcher; ``entries`` the first ones (by the time they
    joined), as many as the ``limit`` asked; ``more`` says that some were left
    out. ``hidden``: the gateway shows the count only (``--presence count``), so
    ``entries`` is empty.
    """

    count: int
    entries: tuple[Watcher, ...] = ()
    more: bool = False
    hidden: bool = False

    @classmethod
    def from_reply(cls, frame: Mapping[str, Any]) -> Presence:
        """The ``presence`` reply (or frame) as a :class:`Presence`."""
        return cls(
            _count(frame),
            _watchers(frame.get("entries")),
            bool(frame.get("more")),
            bool(frame.get("hidden")),
        )

    def as_json(self) -> dict[str, Any]:
        """As the gateway's reply has it: ``count``, ``more``, ``entries`` (and
        ``hidden`` when true)."""
        out: dict[str, Any] = {
            "count": self.count,
            "more": self.more,
            "entries": [w.as_json() for w in self.entries],
        }
        if self.hidden:
            out["hidden"] = True
        return out


@dataclass(frozen=True, slots=True)
class PresenceChanged:
    """Who watches the thread changed (only with ``subscribe(..., presence=True)``).

    ``kind`` is ``"presence"`` for the whole list (after each (re)subscribe,
    and in count-only mode whenever the count changes: replace what you had),
    ``"joined"`` for connections that came (``entries``: them) and ``"left"``
    for connections that went (``entries``: them, with what the subscription
    knew of them). ``count`` is always the number watching now, even when
    ``entries`` could not name everyone (``more``). ``hidden``: the gateway
    shows the count only. ``off``: the gateway keeps no presence
    (``--presence off``): nothing more about presence follows.
    :attr:`Subscription.presence <agui_hub.client.Subscription.presence>` has
    the result of every such item yielded so far.
    """

    thread: str
    kind: PresenceKind
    count: int
    entries: tuple[Watcher, ...] = ()
    more: bool = False
    hidden: bool = False
    off: bool = False
    connection: str | None = None
    """On a ``"presence"`` item in full mode: this connection's own id."""

    @classmethod
    def from_frame(cls, thread: str, frame: Mapping[str, Any]) -> PresenceChanged | None:
        """The item a ``presence`` (without id), ``joined`` or ``left`` frame stands
        for; ``None`` for another frame."""
        kind = frame.get("type")
        if kind not in ("presence", "joined", "left"):
            return None
        if kind == "presence" and frame.get("off") is True:
            return cls(thread, "presence", 0, off=True)
        own = frame.get("connection")
        return cls(
            thread,
            kind,
            _count(frame),
            _watchers(frame.get("entries")),
            more=bool(frame.get("more")),
            hidden=bool(frame.get("hidden")),
            connection=own if isinstance(own, str) else None,
        )


@dataclass(slots=True)
class LivePresence:
    """Who watches a subscribed thread, as of the last item the subscription yielded
    (:attr:`Subscription.presence <agui_hub.client.Subscription.presence>`).

    Before the first ``presence`` item ``known`` is false and everything is
    empty. After a reconnect the gateway sends the whole list again, which
    replaces this one (with this connection's new id).
    """

    count: int = 0
    """How many connections watch the thread now (this one included)."""
    entries: dict[str, Watcher] = field(default_factory=dict)
    """The watchers by connection id, in the order they joined (empty in count-only mode;
    only the first 100 when ``more``)."""
    connection: str | None = None
    """This connection's own id (``entries[connection]`` is this client); ``None``
    before the first ``presence`` item and in count-only mode."""
    more: bool = False
    """Not everyone watching is in ``entries`` (``count`` says how many there are)."""
    hidden: bool = False
    """The gateway shows the count only (``--presence count``)."""
    off: bool = False
    """The gateway keeps no presence (``--presence off``): nothing here will change."""
    known: bool = False
    """A ``presence`` item was yielded: the fields above mean something."""

    @property
    def me(self) -> Watcher | None:
        """This connection's own entry, when known."""
        return self.entries.get(self.connection) if self.connection is not None else None

    def others(self) -> list[Watcher]:
        """Everyone listed but this connection."""
        return [w for c, w in self.entries.items() if c != self.connection]

    def apply(self, change: PresenceChanged) -> PresenceChanged:
        """Take *change* in; returns it, a ``left`` one with what was known of those
        who left (their ``joined`` and ``client``)."""
        if change.kind == "presence":
            self.known = True
            self.off, self.hidden = change.off, change.hidden
            self.count = change.count
            self.connection = change.connection
            self.entries = {w.connection: w for w in change.entries}
            # (Count only: nobody is named, and that is not "more".)
            self.more = not change.hidden and (change.more or self.count > len(self.entries))
            return change
        self.count = change.count
        if change.kind == "joined":
            for watcher in change.entries:
                self.entries[watcher.connection] = watcher
        else:
            gone = [self.entries.pop(w.connection, w) for w in change.entries]
            change = replace(change, entries=tuple(gone))
        self.more = self.count > len(self.entries)
        return change
