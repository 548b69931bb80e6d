"""What a gateway reports about itself: its counters, the ``/metrics`` figures and
the summary line it logs every minute.

The counters are plain integers bumped where things happen anyway (the
connections, their commands, the handshake); :func:`collect_figures` reads
them, with the state the gateway keeps anyway, when Prometheus scrapes
(docs/metrics.md), and :func:`log_summaries` compares them minute by minute.
Nothing here is computed per frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Collection, Iterable
from typing import Protocol

from ..bridge.runs import Bridge
from ..wire.codec import Encoding
from ..wire.offsets import offset_key
from ..wire.protocol import (
    Auth,
    Cancel,
    CloseCode,
    CommandError,
    ListRuns,
    Ping,
    Presence,
    Publish,
    Run,
    Subscribe,
    Unsubscribe,
)
from .config import SECONDS
from .fanout.channels import Hub, Phase
from .metrics import Figures
from .presence import PresenceTracker

__all__ = [
    "COMMAND_NAMES",
    "SUMMARY_INTERVAL",
    "ConnectionLoad",
    "Counters",
    "collect_figures",
    "log_summaries",
]

log = logging.getLogger("agui_hub.server")

SUMMARY_INTERVAL = 60 * SECONDS
"""How often the gateway logs its summary line."""


@dataclasses.dataclass
class Counters:
    """What a gateway did since it started (the summary line, and ``/metrics``).

    Plain integers bumped where things happen anyway, read when Prometheus
    scrapes (:func:`collect_figures`); ``frames_out`` and ``bytes_out`` once
    per write, not per frame and viewer.
    """

    opened: int = 0
    closed: int = 0
    commands: int = 0
    events_in: int = 0
    frames_out: int = 0
    bytes_out: int = 0
    resumes_complete: int = 0
    resumes_incomplete: int = 0
    stalled: int = 0
    """Connections dropped because their socket took nothing for ``write_timeout``."""
    # By kind, for /metrics only (the summary line compares the numbers above).
    command_types: Counter[type] = dataclasses.field(default_factory=Counter, compare=False)
    """Client frames by command class (:class:`CommandError`: not a command)."""
    closes: Counter[int] = dataclasses.field(default_factory=Counter, compare=False)
    """Connections the gateway closed, by close code."""
    errors: Counter[str] = dataclasses.field(default_factory=Counter, compare=False)
    """Error frames sent, by code."""
    publish_errors: Counter[str] = dataclasses.field(default_factory=Counter, compare=False)
    refusals: Counter[int] = dataclasses.field(default_factory=Counter, compare=False)
    """WebSocket handshakes refused, by HTTP status."""


COMMAND_NAMES: dict[type, str] = {
    Subscribe: "subscribe",
    Unsubscribe: "unsubscribe",
    Publish: "publish",
    Ping: "ping",
    Auth: "auth",
    Run: "run",
    Cancel: "cancel",
    ListRuns: "runs",
    Presence: "presence",
    CommandError: "invalid",
}
"""The ``type`` label of ``agui_hub_commands_total`` for each command class."""


class ConnectionLoad(Protocol):
    """What the figures read of each WebSocket connection
    (a :class:`~agui_hub.gateway.connection.Connection`)."""

    @property
    def encoding(self) -> Encoding: ...

    @property
    def queued_bytes(self) -> int:
        """Bytes of frames in its send queue now."""
        ...


def collect_figures(
    counters: Counters,
    connections: Iterable[ConnectionLoad],
    hub: Hub,
    *,
    connections_limit: int,
    sockets_dropped: int,
    store_up: bool,
    bridge: Bridge,
    sse_streams: int,
    presence: PresenceTracker | None = None,
) -> Figures:
    """What ``/metrics`` reports now (docs/metrics.md), read from the counters and
    the state the gateway keeps anyway: one pass over the connections and the
    live threads' subscribers, nothing computed per frame."""
    encodings: Counter[str] = Counter()
    queued = 0
    for conn in connections:
        encodings[conn.encoding.value] += 1
        queued += conn.queued_bytes
    subscriptions = catching_up = 0
    for channel in hub.channels.values():
        subscriptions += len(channel.members)
        for member in channel.members.values():
            if member.phase is Phase.CATCHING_UP:
                catching_up += 1
    backlog, lag = live_backlog(hub)
    closes = counters.closes
    return Figures(
        connections=encodings,
        connections_limit=connections_limit,
        connections_opened=counters.opened,
        connections_closed=counters.closed,
        closes=dict(closes),
        slow_consumers={
            "queue": closes[CloseCode.SLOW_CONSUMER.value],
            "stalled": counters.stalled,
        },
        refusals=dict(counters.refusals),
        sockets_dropped=sockets_dropped,
        subscriptions=subscriptions,
        catching_up=catching_up,
        live_threads=len(hub.channels),
        resumes={
            "complete": counters.resumes_complete,
            "incomplete": counters.resumes_incomplete,
        },
        frames_sent=counters.frames_out,
        bytes_sent=counters.bytes_out,
        send_queue_bytes=queued,
        commands={COMMAND_NAMES[kind]: n for kind, n in counters.command_types.items()},
        errors=dict(counters.errors),
        events_published=counters.events_in,
        patches_not_applied=hub.writer.patches_not_applied,
        publish_errors=dict(counters.publish_errors),
        live_backlog_entries=backlog,
        live_lag_seconds=lag,
        recent_bytes=hub.recent_bytes,
        store_up=store_up,
        bridge_runs=len(bridge.runs),
        bridge_runs_started=bridge.started_total,
        bridge_runs_ended=dict(bridge.ended),
        sse_streams=sse_streams,
        presence_entries=presence.entries if presence is not None else 0,
        presence_updates=presence.updates if presence is not None else 0,
        presence_reads=presence.reads if presence is not None else 0,
    )


def live_backlog(hub: Hub) -> tuple[int, float]:
    """(entries, seconds): what the live threads' store feeds hold that their
    channels have not relayed yet, and how long ago the oldest of it was stored.

    The channel's feed is where the store's live reader puts new entries and
    the channel takes them from: entries pile up there only when the
    gateway falls behind the store. An offset is the store's clock at the
    append (milliseconds), so the age is measured against this machine's
    clock: skew between the two shows as lag (or hides it).
    """
    entries = 0
    oldest: int | None = None
    for channel in hub.channels.values():
        waiting, first = channel.backlog()
        if first is not None:
            entries += waiting
            stored = offset_key(first)[0]
            oldest = stored if oldest is None else min(oldest, stored)
    if oldest is None:
        return entries, 0.0
    return entries, max(0.0, time.time() - oldest / 1000)


async def log_summaries(counters: Counters, connections: Collection[object], hub: Hub) -> None:
    """One INFO line per :data:`SUMMARY_INTERVAL`: connections, threads, traffic
    (when there is any). Runs until cancelled (the gateway's drain does)."""
    last = dataclasses.replace(counters)
    while True:
        await asyncio.sleep(SUMMARY_INTERVAL)
        now = dataclasses.replace(counters)
        if now == last and not connections:
            continue  # idle: nothing to say
        log.info(
            "last %.0f s: %d connections (%d opened, %d closed), %d live threads; "
            "%d commands, %d events published, %d frames (%.1f MiB) sent",
            SUMMARY_INTERVAL,
            len(connections),
            now.opened - last.opened,
            now.closed - last.closed,
            len(hub.channels),
            now.commands - last.commands,
            now.events_in - last.events_in,
            now.frames_out - last.frames_out,
            (now.bytes_out - last.bytes_out) / (1024 * 1024),
        )
        last = now
