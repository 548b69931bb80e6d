"""The gateway's Prometheus metrics, served at ``GET /metrics`` (docs/metrics.md).

Most figures are read when Prometheus scrapes, from what the gateway counts
anyway (:class:`~agui_hub.gateway.reporting.Counters`, its connections, the hub's
channels): :func:`~agui_hub.gateway.reporting.collect_figures` gathers them into one
:class:`Figures`, and :class:`GatewayMetrics` turns that into metric
families. The fan-out path does no work for metrics: a Prometheus counter
incremented per frame would take a lock per frame and viewer. Two histograms
are observed as things happen, at rates that do not grow with the number of
viewers: the store calls the hub makes (:class:`TimedStore`, per publish and
per history page, not per delivered event), and the event loop's scheduling
delay (:meth:`GatewayMetrics.watch_loop`, a few probes a second).

Every gateway has a registry of its own, never prometheus_client's global
one: several gateways in one process (tests, an application embedding two)
each report their own figures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from ..errors import AguiHubError, StoreUnavailable
from ..store.contract import (
    START,
    Available,
    Checkpoint,
    Entry,
    EventInput,
    Expected,
    FeedSubscription,
    Offset,
    PresenceChange,
    PresencePage,
    Retention,
    RunInfo,
    ThreadInfo,
    ThreadStore,
)
from ..version import __version__

__all__ = ["Figures", "GatewayMetrics", "TimedStore"]

T = TypeVar("T")

PREFIX = "agui_hub_"

LOOP_PROBE_INTERVAL = 0.25
"""Seconds between two probes of the event loop's scheduling delay."""

STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Store call durations (seconds): a Redis round trip on a LAN is ~0.2-1 ms, a
batched append a few ms; past ``op_timeout`` (5 s by default) a call fails."""

LOOP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Event-loop delays (seconds): a healthy gateway stays in the first buckets;
every frame, reply and heartbeat of the process waits as long."""

ENCODINGS = ("json", "msgpack")
RESUME_OUTCOMES = ("complete", "incomplete")
SLOW_CONSUMER_KINDS = ("queue", "stalled")
COMMAND_TYPES = (
    "subscribe", "unsubscribe", "publish", "ping", "auth", "run", "cancel", "runs", "presence",
    "invalid",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Figures:
    """What a gateway reports at one scrape; each field is one metric of docs/metrics.md.

    Counters count since the gateway started; gauges are the state now.
    """

    connections: Mapping[str, int] = field(default_factory=dict)
    """Open WebSocket connections by encoding (``json``, ``msgpack``)."""
    connections_limit: int = 0
    """``max_connections`` as fitted to the open-file limit."""
    connections_opened: int = 0
    connections_closed: int = 0
    closes: Mapping[int, int] = field(default_factory=dict)
    """Connections the gateway closed, by close code."""
    slow_consumers: Mapping[str, int] = field(default_factory=dict)
    """``queue``: closed with 4000; ``stalled``: dropped for taking no data."""
    refusals: Mapping[int, int] = field(default_factory=dict)
    """WebSocket handshakes refused, by HTTP status."""
    sockets_dropped: int = 0
    subscriptions: int = 0
    catching_up: int = 0
    live_threads: int = 0
    resumes: Mapping[str, int] = field(default_factory=dict)
    """Subscribes from a position, by outcome (``complete``, ``incomplete``)."""
    frames_sent: int = 0
    bytes_sent: int = 0
    send_queue_bytes: int = 0
    commands: Mapping[str, int] = field(default_factory=dict)
    """Client frames by command type (``invalid``: not a command)."""
    errors: Mapping[str, int] = field(default_factory=dict)
    """Error frames sent, by code."""
    events_published: int = 0
    patches_not_applied: int = 0
    """Deltas stored whose JSON Patch did not apply (they change nothing)."""
    publish_errors: Mapping[str, int] = field(default_factory=dict)
    live_backlog_entries: int = 0
    live_lag_seconds: float = 0.0
    recent_bytes: int = 0
    store_up: bool = True
    presence_entries: int = 0
    """This gateway's presence entries (a connection on two threads: two)."""
    presence_updates: int = 0
    presence_reads: int = 0
    bridge_runs: int = 0
    """Upstream runs going (docs/bridge.md)."""
    bridge_runs_started: int = 0
    bridge_runs_ended: Mapping[str, int] = field(default_factory=dict)
    """Ended upstream runs by outcome: ``finished``, ``error`` (the agent's RUN_ERROR), or
    the code of the hub's RUN_ERROR (``AGUI_HUB_UPSTREAM_STATUS``, ...)."""
    sse_streams: int = 0
    """Open SSE responses of the HTTP listener."""


# -- store calls --------------------------------------------------------------------------------


class TimedStore:
    """*store* with every call the hub awaits timed: the view of the store a
    gateway gives its hub (the seam between the two, not inside the stores).

    Durations go to *latency* (a histogram labelled by ``operation``, the
    method's name); calls that fail because the store is unavailable (or
    with an unexpected error) also count in *errors*. Refusals that are part
    of the contract (an append conflict, a tenant's quota, a trimmed offset)
    are answers, not errors. Live feeds (:meth:`subscribe`) are not timed:
    their entries arrive by the store's own reader, per event.
    """

    def __init__(self, store: ThreadStore, latency: Histogram, errors: Counter) -> None:
        self.inner = store
        self._latency = latency
        self._errors = errors
        # Label children made once per operation: a labels() lookup takes a lock.
        self._timers: dict[str, tuple[Any, Any]] = {}

    def __repr__(self) -> str:
        return repr(self.inner)

    def __getattr__(self, name: str) -> Any:
        # Whatever a store offers beyond the protocol (a test's hooks, a backend's
        # own settings) is the inner store's.
        if name == "inner":  # not set yet (a copy being made): no endless recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def retention(self) -> Retention:
        return self.inner.retention

    @retention.setter
    def retention(self, value: Retention) -> None:
        self.inner.retention = value

    async def _timed(self, operation: str, call: Awaitable[T]) -> T:
        timers = self._timers.get(operation)
        if timers is None:
            timers = self._timers[operation] = (
                self._latency.labels(operation),
                self._errors.labels(operation),
            )
        started = time.perf_counter()
        try:
            return await call
        except StoreUnavailable:
            timers[1].inc()
            raise
        except AguiHubError:
            raise  # an answer of the store's contract (conflict, quota, trimmed)
        except Exception:
            timers[1].inc()
            raise
        finally:
            timers[0].observe(time.perf_counter() - started)

    async def append(
        self, thread: str, events: Sequence[EventInput], *, expect: Expected | None = None
    ) -> list[Offset]:
        return await self._timed("append", self.inner.append(thread, events, expect=expect))

    async def stored_ids(self, thread: str, event_ids: Sequence[str]) -> dict[str, Offset]:
        return await self._timed("stored_ids", self.inner.stored_ids(thread, event_ids))

    async def read(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> list[Entry]:
        return await self._timed("read", self.inner.read(thread, after, limit))

    async def read_available(
        self, thread: str, after: Offset = START, limit: int | None = None
    ) -> Available:
        return await self._timed("read_available", self.inner.read_available(thread, after, limit))

    async def epoch(self, thread: str) -> str | None:
        return await self._timed("epoch", self.inner.epoch(thread))

    async def last_offset(self, thread: str) -> Offset:
        return await self._timed("last_offset", self.inner.last_offset(thread))

    def subscribe(self, thread: str, after: Offset | None = None) -> FeedSubscription:
        return self.inner.subscribe(thread, after)

    async def info(self, thread: str) -> ThreadInfo | None:
        return await self._timed("info", self.inner.info(thread))

    async def threads(self, limit: int = 1000) -> list[str]:
        return await self._timed("threads", self.inner.threads(limit))

    async def delete(self, thread: str) -> bool:
        return await self._timed("delete", self.inner.delete(thread))

    async def put_checkpoint(self, thread: str, checkpoint: Checkpoint) -> None:
        await self._timed("put_checkpoint", self.inner.put_checkpoint(thread, checkpoint))

    async def get_checkpoint(self, thread: str) -> Checkpoint | None:
        return await self._timed("get_checkpoint", self.inner.get_checkpoint(thread))

    async def runs(self, thread: str) -> list[RunInfo]:
        return await self._timed("runs", self.inner.runs(thread))

    async def presence_update(self, changes: Sequence[PresenceChange], ttl: float) -> None:
        await self._timed("presence_update", self.inner.presence_update(changes, ttl))

    async def presence(
        self, threads: Sequence[str], limit: int, known: Sequence[int | None] | None = None
    ) -> list[PresencePage | None]:
        return await self._timed("presence", self.inner.presence(threads, limit, known))

    async def ping(self) -> None:
        await self._timed("ping", self.inner.ping())

    async def durability_warnings(self) -> list[str]:
        return await self.inner.durability_warnings()

    async def close(self) -> None:
        await self.inner.close()


# -- the registry -------------------------------------------------------------------------------


class GatewayMetrics:
    """The metrics of one gateway: its registry, the two histograms observed as
    things happen, and the figures read at each scrape from *figures*.

    Give the hub :meth:`timed` of the store, run :meth:`watch_loop` while the
    gateway serves, and answer ``/metrics`` with :meth:`exposition`.
    """

    def __init__(self, figures: Callable[[], Figures]) -> None:
        self.registry = CollectorRegistry()
        self.store_latency = Histogram(
            PREFIX + "store_latency_seconds",
            "Duration of the store calls the gateway's hub makes (append: a publish's "
            "events; read_available, read: history pages; ...), by operation.",
            ["operation"],
            buckets=STORE_BUCKETS,
            registry=self.registry,
        )
        self.store_errors = Counter(
            PREFIX + "store_errors",
            "Store calls that failed because the store was unavailable or slower than its "
            "op_timeout (or with an unexpected error), by operation.",
            ["operation"],
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            PREFIX + "event_loop_lag_seconds",
            f"How late the event loop ran a timer due every {LOOP_PROBE_INTERVAL:g} s: the "
            "delay every frame, reply and heartbeat of this process waits on top of its own "
            "work.",
            buckets=LOOP_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_FiguresCollector(figures))
        # The process's own CPU, memory and open files (Linux /proc; nothing elsewhere).
        ProcessCollector(registry=self.registry)

    def timed(self, store: ThreadStore) -> TimedStore:
        """*store* as the hub should see it: every call timed (:class:`TimedStore`)."""
        return TimedStore(store, self.store_latency, self.store_errors)

    async def watch_loop(self, interval: float = LOOP_PROBE_INTERVAL) -> None:
        """Measure how late the event loop runs a timer, every *interval* seconds,
        until cancelled. A loop busy with one long step (a huge fold, a blocking
        call) shows here long before anywhere else."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            self.loop_lag.observe(max(0.0, loop.time() - due))

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The scrape's body and its Content-Type: the Prometheus text format, or
        OpenMetrics when the ``Accept`` header asks for it."""
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class _FiguresCollector(Collector):
    """The metric families of a gateway's :class:`Figures`, read at each scrape."""

    def __init__(self, figures: Callable[[], Figures]) -> None:
        self._figures = figures

    def describe(self) -> Iterator[Metric]:
        # The names, without reading a gateway that may not be started yet.
        return _families(Figures())

    def collect(self) -> Iterator[Metric]:
        return _families(self._figures())


def _counter(name: str, text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, text, value=value)


def _gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, text, value=value)


def _labelled(
    family: CounterMetricFamily | GaugeMetricFamily,
    values: Mapping[Any, int],
    always: Sequence[str] = (),
) -> CounterMetricFamily | GaugeMetricFamily:
    """*family* with one sample per label value of *values*, and a 0 for each of
    *always* not among them (a series that exists from the start makes ``rate()``
    and ``increase()`` see its first increment)."""
    seen = {str(key): count for key, count in values.items()}
    for key in always:
        seen.setdefault(key, 0)
    for key in sorted(seen):
        family.add_metric([key], seen[key])
    return family


def _families(f: Figures) -> Iterator[Metric]:
    yield _labelled(
        GaugeMetricFamily(
            PREFIX + "info", "The gateway's version (the value is 1).", labels=["version"]
        ),
        {__version__: 1},
    )
    yield _labelled(
        GaugeMetricFamily(
            PREFIX + "connections", "Open WebSocket connections, by encoding.", labels=["encoding"]
        ),
        f.connections,
        ENCODINGS,
    )
    yield _gauge(
        "connections_limit",
        "WebSocket connections this gateway admits at most (max_connections, lowered to fit "
        "the open-file limit); past it handshakes get 503.",
        f.connections_limit,
    )
    yield _counter(
        "connections_opened_total", "WebSocket connections admitted.", f.connections_opened
    )
    yield _counter(
        "connections_closed_total",
        "WebSocket connections ended, however they ended.",
        f.connections_closed,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "closes_total",
            "Connections the gateway closed, by close code (4000 slow consumer, 4001 idle, "
            "4401 credentials expired, 4403 revoked, 1011 internal error, 1012 draining, "
            "1013 store unavailable).",
            labels=["code"],
        ),
        f.closes,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "slow_consumer_closes_total",
            "Clients dropped for not keeping up: queue = closed with 4000 (its send queue "
            "passed twice send_queue_bytes, or the history it was catching up on was "
            "trimmed), stalled = its socket took no data for write_timeout.",
            labels=["kind"],
        ),
        f.slow_consumers,
        SLOW_CONSUMER_KINDS,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "handshake_refusals_total",
            "WebSocket handshakes refused, by HTTP status (401 bad token, 403 origin or "
            "revoked, 429 per-address limit, 503 gateway full).",
            labels=["status"],
        ),
        f.refusals,
    )
    yield _counter(
        "sockets_dropped_total",
        "Sockets closed at once because the gateway had no "
        "room left for another socket (see max_connections).",
        f.sockets_dropped,
    )
    yield _gauge(
        "subscriptions", "Subscriptions (a connection following a thread).", f.subscriptions
    )
    yield _gauge(
        "subscriptions_catching_up",
        "Subscriptions reading history from the store "
        "(joining from an offset, or a slow viewer that fell behind) rather than "
        "getting events live.",
        f.catching_up,
    )
    yield _gauge(
        "live_threads",
        "Threads with subscribers on this gateway (one live feed each).",
        f.live_threads,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "resumes_total",
            "Subscribes from a position (a client resuming), by outcome: complete = every "
            "event after its offset followed (recovered: true); incomplete = some were "
            "trimmed or the thread has a new epoch, so it got a snapshot (recovered: false).",
            labels=["outcome"],
        ),
        f.resumes,
        RESUME_OUTCOMES,
    )
    yield _counter(
        "frames_sent_total",
        "WebSocket messages sent to clients: events, snapshots and replies.",
        f.frames_sent,
    )
    yield _counter(
        "bytes_sent_total",
        "Size of those messages' payloads, before WebSocket framing and TLS (a JSON text "
        "message counts its characters: its bytes for ASCII).",
        f.bytes_sent,
    )
    yield _gauge(
        "send_queue_bytes",
        "Bytes queued for clients and not written to their sockets yet, all connections together.",
        f.send_queue_bytes,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "commands_total",
            "Client frames, by command type (invalid: a frame that is not a command).",
            labels=["type"],
        ),
        f.commands,
        COMMAND_TYPES,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "command_errors_total",
            "Error frames sent to clients, by error code (docs/protocol.md).",
            labels=["code"],
        ),
        f.errors,
    )
    yield _counter(
        "events_published_total",
        "Events published through this gateway and "
        "acknowledged (stored, or already stored under the same event id).",
        f.events_published,
    )
    yield _counter(
        "patches_not_applied_total",
        "STATE_DELTA and ACTIVITY_DELTA events published through this gateway and "
        "stored though their JSON Patch did not apply: they change nothing, as in the "
        "official client (an agent that sends bad patches; --strict-patches refuses them).",
        f.patches_not_applied,
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "publish_errors_total",
            "Publish commands refused, by error code (invalid_event, sequence_error, "
            "forbidden, store_unavailable, ...).",
            labels=["code"],
        ),
        f.publish_errors,
    )
    yield _gauge(
        "live_backlog_entries",
        "Entries the store's live feed has handed to this "
        "gateway that its threads have not relayed to their viewers yet.",
        f.live_backlog_entries,
    )
    yield _gauge(
        "live_lag_seconds",
        "Age of the oldest of those entries (now minus the time in "
        "its offset, when the store appended it); 0 when none waits.",
        f.live_lag_seconds,
    )
    yield _gauge(
        "recent_entries_bytes",
        "Bytes of recent entries the threads keep in memory for "
        "viewers that resume (bounded by the hub's budget).",
        f.recent_bytes,
    )
    yield _gauge(
        "store_up",
        "1 when the store answered the gateway's last check (start-up, "
        "/readyz), 0 when it did not.",
        1 if f.store_up else 0,
    )
    yield _gauge("bridge_runs", "Runs of upstream agents going (docs/bridge.md).", f.bridge_runs)
    yield _counter(
        "bridge_runs_started_total", "Runs of upstream agents started.", f.bridge_runs_started
    )
    yield _labelled(
        CounterMetricFamily(
            PREFIX + "bridge_runs_ended_total",
            "Runs of upstream agents ended, by outcome: finished, error (the agent's own "
            "RUN_ERROR), or the code of the RUN_ERROR the hub stored (AGUI_HUB_UPSTREAM_*, "
            "AGUI_HUB_RUN_CANCELLED, ...).",
            labels=["outcome"],
        ),
        f.bridge_runs_ended,
        ("finished", "error"),
    )
    yield _gauge("sse_streams", "Open SSE responses of the HTTP listener.", f.sse_streams)
    yield _gauge(
        "presence_entries",
        "Presence entries this gateway keeps in the store (one per subscription).",
        f.presence_entries,
    )
    yield _counter(
        "presence_updates_total",
        "Store calls writing this gateway's presence entries (each for every thread "
        "that changed, in one round trip).",
        f.presence_updates,
    )
    yield _counter(
        "presence_reads_total",
        "Store calls reading presence: one per poll of the threads watched here (all of "
        "them in one round trip), one per presence command.",
        f.presence_reads,
    )
