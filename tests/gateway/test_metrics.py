"""``GET /metrics``: the gateway's Prometheus metrics (docs/metrics.md).

On in-process gateways over real sockets, on the memory store and on a real
Redis: a known workload (viewers in both encodings, publishes, a refused
publish, a frame that is no command, complete and incomplete resumes) and
the exact figures it must give, frames and bytes sent checked against what
the clients received; slow consumers (closed with 4000, and stalled
sockets); the live backlog and its lag; the event loop's delay; store calls
timed, and failed ones counted; who may read the metrics (anonymous without
authentication, a token with the admin grant, ``metrics_public``, off);
each gateway counting only its own; OpenMetrics on request; and an
``agui-hub serve`` process honouring the settings.
"""

from __future__ import annotations

# ruff: noqa: F811 (fixtures imported from test_server, taken as test arguments)
import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from agui_hub import __version__
from agui_hub.errors import StoreUnavailable
from agui_hub.gateway import http_routes
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.connection import ConnectionState
from agui_hub.gateway.metrics import LOOP_PROBE_INTERVAL
from agui_hub.gateway.server import Gateway
from agui_hub.store.contract import EventInput, Expected, Offset, Retention
from agui_hub.store.memory import MemoryStore
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import Gateways, http_status
from ..test_viewer import http_get
from .test_delivery import connection_of, gone, small_window_client, start_events

# The gateway harness fixtures of test_server (memory and Redis): imported, so that
# tests here take them as arguments (which linters read as redefinitions).
from .test_server import (  # noqa: F401
    JSON,
    MSGPACK,
    Client,
    Harness,
    events_of,
    harness,
    mem,
    memory_store,
    store_factory,
    text_deltas,
)

pytestmark = pytest.mark.timeout(90)

WAIT = 10 * TIMEOUT_SCALE
SECRET = "metrics-test-secret-" + "s" * 32
THREAD = "tenant-1/run-1"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- helpers --------------------------------------------------------------------------------------


class Counted(Client):
    """A test client that keeps count of the messages it received and their sizes
    (characters of a text frame, bytes of a binary one: as the gateway counts)."""

    def __init__(self, ws: Any) -> None:
        super().__init__(ws)
        self.messages = 0
        self.size = 0

    async def _read(self, timeout: float) -> dict[str, Any]:
        data = await asyncio.wait_for(self.ws.recv(), timeout)
        self.messages += 1
        self.size += len(data)
        return self.decode(data)


async def counted(h: Harness, gateway: Gateway, protocol: str = JSON) -> Counted:
    ws = await connect(
        f"ws://127.0.0.1:{gateway.config.port}/",
        subprotocols=[protocol],  # type: ignore[list-item]
        proxy=None,
        open_timeout=WAIT,
        close_timeout=2,
    )
    client = Counted(ws)
    h.clients.append(client)
    return client


def parse(text: str) -> Samples:
    """Every sample of a scrape by (name, labels); the parser is prometheus_client's."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} is not in the scrape"
    return samples[key]


async def scrape(gateway: Gateway, headers: dict[str, str] | None = None) -> Samples:
    answer = await http_get(gateway.config.port, "/metrics", headers)
    assert answer.status == 200, answer.body
    assert (answer.header("Content-Type") or "").startswith("text/plain; version=0.0.4")
    return parse(answer.body.decode())


async def eventually(check: Callable[[], Any], what: str, timeout: float = WAIT) -> None:
    """Wait (bounded) until *check()* (sync or async) is true."""
    deadline = time.monotonic() + timeout
    for _ in range(10_000):
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.02)
    raise AssertionError(f"not in {timeout:.0f} s: {what}")


def run_events(thread: str) -> list[dict[str, Any]]:
    """Eight events of one run (the last one is not the end: the run goes on)."""
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *text_deltas("m1", 5),
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    ]


# -- a known workload, exact figures --------------------------------------------------------------


async def test_a_known_workload_gives_exact_figures(harness: Harness) -> None:
    # Five events kept per thread: a resume from the first offset finds it trimmed.
    gateway = await harness.gateway(retention=Retention(max_len=5))
    viewers = [await counted(harness, gateway, p) for p in (JSON, JSON, MSGPACK)]
    for viewer in viewers:
        await viewer.subscribe(THREAD)
    publisher = await counted(harness, gateway, JSON)
    events = run_events(THREAD)
    offsets = await publisher.publish(THREAD, events[:4])
    offsets += await publisher.publish(THREAD, events[4:])
    for viewer in viewers:
        frames = await viewer.until_offset(THREAD, offsets[-1])
        assert [f["offset"] for f in frames if f["type"] == "event"] == offsets
    refused = await publisher.request(
        {
            "type": "publish",
            "thread": THREAD,
            "events": [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "nope", "delta": "x"}],
        }
    )
    assert refused["code"] == "sequence_error", refused
    await publisher.ws.send("this is not a command")
    assert (await publisher.recv())["code"] == "bad_frame"

    info = await gateway.store.info(THREAD)
    assert info is not None and info.length == 5 and info.trimmed == offsets[2]
    resumers = []
    for protocol in (JSON, MSGPACK):
        # Complete: everything after offsets[-2] is kept; one event follows.
        complete = await counted(harness, gateway, protocol)
        reply = await complete.subscribe(THREAD, {"offset": offsets[-2], "epoch": info.epoch})
        assert reply["recovered"] is True
        assert [f["offset"] for f in await complete.until_offset(THREAD, offsets[-1])] == [
            offsets[-1]
        ]
        # Incomplete: the events after offsets[0] were trimmed; a snapshot instead.
        incomplete = await counted(harness, gateway, protocol)
        reply = await incomplete.subscribe(THREAD, {"offset": offsets[0], "epoch": info.epoch})
        assert reply["recovered"] is False
        assert (await incomplete.recv())["type"] == "snapshot"
        resumers += [complete, incomplete]

    clients = [*viewers, publisher, *resumers]
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_connections", encoding="json") == 5
    assert value(samples, "agui_hub_connections", encoding="msgpack") == 3
    assert value(samples, "agui_hub_connections_opened_total") == 8
    assert value(samples, "agui_hub_connections_limit") == gateway.max_connections > 0
    assert value(samples, "agui_hub_connections_closed_total") == 0
    assert value(samples, "agui_hub_subscriptions") == 7
    assert value(samples, "agui_hub_subscriptions_catching_up") == 0
    assert value(samples, "agui_hub_live_threads") == 1
    assert value(samples, "agui_hub_resumes_total", outcome="complete") == 2
    assert value(samples, "agui_hub_resumes_total", outcome="incomplete") == 2
    assert value(samples, "agui_hub_commands_total", type="subscribe") == 7
    assert value(samples, "agui_hub_commands_total", type="publish") == 3
    assert value(samples, "agui_hub_commands_total", type="invalid") == 1
    for kind in ("unsubscribe", "ping", "auth", "runs", "presence"):
        assert value(samples, "agui_hub_commands_total", type=kind) == 0
    assert value(samples, "agui_hub_command_errors_total", code="sequence_error") == 1
    assert value(samples, "agui_hub_command_errors_total", code="bad_frame") == 1
    assert value(samples, "agui_hub_events_published_total") == 8
    assert value(samples, "agui_hub_publish_errors_total", code="sequence_error") == 1
    # Every message the clients got, and nothing else, was counted as sent.
    assert value(samples, "agui_hub_frames_sent_total") == sum(c.messages for c in clients)
    assert value(samples, "agui_hub_bytes_sent_total") == sum(c.size for c in clients)
    assert value(samples, "agui_hub_send_queue_bytes") == 0
    for kind in ("queue", "stalled"):
        assert value(samples, "agui_hub_slow_consumer_closes_total", kind=kind) == 0
    assert not [k for k in samples if k[0] == "agui_hub_closes_total"]
    assert value(samples, "agui_hub_live_backlog_entries") == 0
    assert value(samples, "agui_hub_live_lag_seconds") == 0
    assert value(samples, "agui_hub_store_up") == 1
    assert value(samples, "agui_hub_recent_entries_bytes") > 0
    # The store calls: the two publishes were two appends (the refused one none).
    assert value(samples, "agui_hub_store_latency_seconds_count", operation="append") == 2
    assert value(samples, "agui_hub_store_latency_seconds_sum", operation="append") > 0
    errors = [v for k, v in samples.items() if k[0] == "agui_hub_store_errors_total"]
    assert errors and not any(errors)  # a series per operation used, all at 0
    assert value(samples, "agui_hub_info", version=__version__) == 1
    assert value(samples, "process_resident_memory_bytes") > 0

    # A viewer leaves: its connection and subscription are gone from the figures.
    await viewers[2].close()

    async def left() -> bool:
        now = await scrape(gateway)
        return (
            value(now, "agui_hub_connections_closed_total") == 1
            and value(now, "agui_hub_connections", encoding="msgpack") == 2
            and value(now, "agui_hub_subscriptions") == 6
        )

    await eventually(left, "the closed connection counted")


async def test_each_gateway_counts_its_own(mem: Harness) -> None:
    """A registry per gateway: two in one process never mix their figures."""
    busy = await mem.gateway()
    idle = await mem.gateway()
    publisher = await counted(mem, busy, MSGPACK)
    await publisher.publish(THREAD, start_events(THREAD))
    busy_samples = await scrape(busy)
    idle_samples = await scrape(idle)
    assert value(busy_samples, "agui_hub_events_published_total") == 2
    assert value(busy_samples, "agui_hub_connections", encoding="msgpack") == 1
    assert value(idle_samples, "agui_hub_events_published_total") == 0
    assert value(idle_samples, "agui_hub_connections", encoding="msgpack") == 0
    assert value(idle_samples, "agui_hub_connections_opened_total") == 0


async def test_runs_and_presence_commands_and_presence_are_counted(mem: Harness) -> None:
    gateway = await mem.gateway(presence_interval=0.1, presence_ttl=3.0)
    viewer = await counted(mem, gateway, JSON)
    await viewer.subscribe(THREAD, "live", presence=True)
    await viewer.subscribe("other", "live")
    assert (await viewer.request({"type": "runs", "thread": THREAD}))["type"] == "runs"
    assert (await viewer.request({"type": "presence", "thread": THREAD}))["count"] == 1
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_commands_total", type="runs") == 1
    assert value(samples, "agui_hub_commands_total", type="presence") == 1
    assert value(samples, "agui_hub_presence_entries") == 2
    assert value(samples, "agui_hub_presence_updates_total") >= 1
    assert value(samples, "agui_hub_presence_reads_total") >= 1


# -- slow consumers -------------------------------------------------------------------------------


async def test_a_client_whose_queue_overflows_is_counted_as_a_slow_consumer(mem: Harness) -> None:
    # Each subscribe from "snapshot" queues a ~100 KB snapshot: a client that asks
    # for them and reads nothing passes twice its queue bound and is closed (4000).
    bound = 64 * 1024
    gateway = await mem.gateway(send_queue_bytes=bound)
    publisher = await counted(mem, gateway, MSGPACK)
    await publisher.publish(
        "big",
        [
            {"type": "RUN_STARTED", "threadId": "big", "runId": "r"},
            {"type": "STATE_SNAPSHOT", "snapshot": {"x": "y" * 100_000}},
        ],
    )
    greedy = await counted(mem, gateway, MSGPACK)
    conn = connection_of(gateway, greedy)
    for i in range(200):
        with contextlib.suppress(Exception):
            await greedy.send({"type": "subscribe", "id": i, "thread": "big", "from": "snapshot"})
        if conn.state is not ConnectionState.OPEN:
            break
        await asyncio.sleep(0)
    assert await greedy.closed_code(timeout=3 * WAIT) == 4000
    await gone(gateway, conn, WAIT)
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_slow_consumer_closes_total", kind="queue") == 1
    assert value(samples, "agui_hub_slow_consumer_closes_total", kind="stalled") == 0
    assert value(samples, "agui_hub_closes_total", code="4000") == 1
    assert value(samples, "agui_hub_connections_closed_total") == 1
    assert value(samples, "agui_hub_connections", encoding="msgpack") == 1  # the publisher


async def test_a_client_that_stops_reading_is_counted_as_stalled(mem: Harness) -> None:
    # A frame larger than both socket buffers, to a client that reads nothing:
    # nothing leaves the socket for write_timeout, the watchdog drops it.
    gateway = await mem.gateway(write_timeout=0.5)
    publisher = await counted(mem, gateway, MSGPACK)
    await publisher.publish("stall", start_events("stall"))
    stalled = await small_window_client(mem, gateway, JSON)
    await stalled.subscribe("stall", "live")
    conn = connection_of(gateway, stalled)
    assert isinstance(stalled.ws.transport, asyncio.Transport)
    stalled.ws.transport.pause_reading()
    await publisher.publish("stall", text_deltas("m1", 1, size=600_000))
    await gone(gateway, conn, (3 * 0.5 + 2) * TIMEOUT_SCALE)
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_slow_consumer_closes_total", kind="stalled") == 1
    assert value(samples, "agui_hub_slow_consumer_closes_total", kind="queue") == 0
    assert value(samples, "agui_hub_connections_closed_total") == 1


# -- the live backlog, the event loop, the store --------------------------------------------------


async def test_live_backlog_and_its_lag(mem: Harness) -> None:
    # A store whose clock is 30 s behind: what it stores now carries an offset
    # 30 s old, which is how old the backlog is once it waits in the gateway.
    store = MemoryStore(clock=lambda: time.time() - 30)
    gateway = await mem.gateway(store=store)
    viewer = await counted(mem, gateway, JSON)
    await viewer.subscribe(THREAD)
    inputs = [EventInput(event, f"id-{i}", "r1") for i, event in enumerate(start_events(THREAD))]
    offsets = await store.append(THREAD, inputs)
    # The store handed the entries to the thread's feed; the channel relays them
    # on its next turn of the event loop, not before this line.
    figures = gateway.figures()
    assert figures.live_backlog_entries == 2
    assert 29 <= figures.live_lag_seconds <= 31 + WAIT
    await viewer.until_offset(THREAD, offsets[-1])
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_live_backlog_entries") == 0
    assert value(samples, "agui_hub_live_lag_seconds") == 0


async def test_event_loop_lag_shows_a_blocked_loop(mem: Harness) -> None:
    gateway = await mem.gateway()

    async def late_probes() -> float:
        """Probes that ran more than 0.25 s late."""
        samples = await scrape(gateway)
        count = value(samples, "agui_hub_event_loop_lag_seconds_count")
        return count - value(samples, "agui_hub_event_loop_lag_seconds_bucket", le="0.25")

    async def probed() -> bool:
        return value(await scrape(gateway), "agui_hub_event_loop_lag_seconds_count") >= 1

    await eventually(probed, "a first probe")
    before = await late_probes()
    time.sleep(4 * LOOP_PROBE_INTERVAL)  # the gateway's loop, blocked as by one long step

    async def noticed() -> bool:
        return await late_probes() > before

    await eventually(noticed, "a probe that ran late")
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_event_loop_lag_seconds_sum") >= 2 * LOOP_PROBE_INTERVAL


class UnavailableForAppends(MemoryStore):
    """A memory store whose appends fail as an unreachable store's do."""

    async def append(
        self, thread: str, events: Any, *, expect: Expected | None = None
    ) -> list[Offset]:
        raise StoreUnavailable("the store is down (for this test)")


async def test_failed_store_calls_are_counted(mem: Harness) -> None:
    gateway = await mem.gateway(store=UnavailableForAppends())
    publisher = await counted(mem, gateway, JSON)
    reply = await publisher.request(
        {"type": "publish", "thread": THREAD, "events": start_events(THREAD)}
    )
    assert reply["code"] == "store_unavailable", reply
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_store_errors_total", operation="append") == 1
    assert value(samples, "agui_hub_store_latency_seconds_count", operation="append") == 1
    assert value(samples, "agui_hub_publish_errors_total", code="store_unavailable") == 1
    assert value(samples, "agui_hub_events_published_total") == 0


# -- who may read them ----------------------------------------------------------------------------


def token(*, admin: bool, subject: str = "ops") -> str:
    grants: dict[str, Any] = {"subscribe": ["*"], "publish": []}
    if admin:
        grants["admin"] = True
    return encode_token(SECRET, subject, extra={"agui": grants})


async def test_without_authentication_metrics_are_open(mem: Harness) -> None:
    gateway = await mem.gateway()
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_connections_opened_total") == 0


async def test_with_jwt_only_an_admin_token_reads_metrics(mem: Harness) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET)
    port = gateway.config.port
    missing = await http_get(port, "/metrics")
    assert missing.status == 401
    assert missing.header("WWW-Authenticate") == 'Bearer realm="agui-hub"'
    assert b"admin grant" in missing.body and b"Authorization: Bearer" in missing.body
    assert b"agui_hub_" not in missing.body
    bad = await http_get(port, "/metrics", {"Authorization": "Bearer not-a-jwt"})
    assert bad.status == 401 and b"agui_hub_" not in bad.body
    viewer = await http_get(port, "/metrics", {"Authorization": f"Bearer {token(admin=False)}"})
    assert viewer.status == 403
    assert b"does not grant admin" in viewer.body
    # The query is not where an admin token goes (access logs keep URLs).
    query = await http_get(port, f"/metrics?access_token={token(admin=True)}")
    assert query.status == 401
    admin = await scrape(gateway, {"Authorization": f"Bearer {token(admin=True)}"})
    # A token refused over HTTP is no WebSocket handshake refused.
    assert not [k for k in admin if k[0] == "agui_hub_handshake_refusals_total"]
    head = await http_get(
        port, "/metrics", {"Authorization": f"Bearer {token(admin=True)}"}, method="HEAD"
    )
    assert head.status == 200 and head.body == b""


async def test_an_expired_or_revoked_admin_token_is_refused(mem: Harness, tmp_path: Path) -> None:
    revoked = tmp_path / "revoked"
    revoked.write_text("gone\n")
    gateway = await mem.gateway(jwt_secret=SECRET, revocation_file=str(revoked))
    port = gateway.config.port
    expired = encode_token(SECRET, "ops", ttl=-3600, extra={"agui": {"admin": True}})
    answer = await http_get(port, "/metrics", {"Authorization": f"Bearer {expired}"})
    assert answer.status == 401 and b"expired" in answer.body
    gone_token = token(admin=True, subject="gone")
    answer = await http_get(port, "/metrics", {"Authorization": f"Bearer {gone_token}"})
    assert answer.status == 403 and b"revoked" in answer.body


async def test_metrics_public_opens_them_next_to_jwt(mem: Harness) -> None:
    gateway = await mem.gateway(jwt_secret=SECRET, metrics_public=True)
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_connections_opened_total") == 0


async def test_metrics_off(mem: Harness) -> None:
    gateway = await mem.gateway(metrics=False)
    assert gateway.metrics is None
    answer = await http_get(gateway.config.port, "/metrics")
    assert answer.status == 404
    assert b"metrics are off" in answer.body
    # The gateway serves as before, without the timing of its store.
    publisher = await counted(mem, gateway, JSON)
    await publisher.publish(THREAD, start_events(THREAD))
    assert gateway.hub.store is gateway.store


async def test_other_methods_on_metrics_are_405(mem: Harness) -> None:
    gateway = await mem.gateway()
    answer = await http_get(gateway.config.port, "/metrics", method="POST")
    assert answer.status == 405
    assert answer.header("Allow") == "GET, HEAD"


async def test_openmetrics_on_request(mem: Harness) -> None:
    gateway = await mem.gateway()
    answer = await http_get(
        gateway.config.port, "/metrics", {"Accept": "application/openmetrics-text"}
    )
    assert answer.status == 200
    assert (answer.header("Content-Type") or "").startswith("application/openmetrics-text")
    assert answer.body.endswith(b"# EOF\n")
    assert answer.header("Cache-Control") == "no-store"


# -- agui-hub serve -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_serve_settings(gateways: Gateways) -> None:
    """The flags and variables reach a real ``agui-hub serve``: open without
    authentication, off with --no-metrics, an admin token's with JWT."""
    plain = gateways.start()
    assert http_status(plain.port, "/metrics") == 200
    assert "/metrics open" in plain.log()
    off = gateways.start(None, "--no-metrics")
    assert http_status(off.port, "/metrics") == 404
    variable = gateways.start(None, env={"AGUI_HUB_METRICS": "false"})
    assert http_status(variable.port, "/metrics") == 404
    jwt = gateways.start(None, "--jwt-secret", SECRET)
    assert http_status(jwt.port, "/metrics") == 401
    assert "/metrics for a token with the admin grant" in jwt.log()
    public = gateways.start(None, "--jwt-secret", SECRET, "--metrics-public")
    assert http_status(public.port, "/metrics") == 200


async def test_the_scrape_parses_and_every_metric_is_described(mem: Harness) -> None:
    gateway = await mem.gateway()
    answer = await http_get(gateway.config.port, "/metrics")
    families = list(text_string_to_metric_families(answer.body.decode()))
    ours = [f for f in families if f.name.startswith("agui_hub_")]
    assert len(ours) >= 25
    for family in ours:
        assert family.documentation, f"{family.name} has no HELP text"
        assert family.type in {"counter", "gauge", "histogram"}, family.name


async def test_a_scrape_sees_the_store_go_down_without_a_readiness_probe(
    own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Compose and systemd deployments have no /readyz probe: the scrape checks.
    monkeypatch.setattr(http_routes, "METRICS_STORE_CHECK", 0.0)
    h = Harness(lambda retention=None: RedisStore(own_redis.url, prefix="up", op_timeout=1))
    try:
        gateway = await h.gateway()
        assert value(await scrape(gateway), "agui_hub_store_up") == 1
        own_redis.stop()
        assert value(await scrape(gateway), "agui_hub_store_up") == 0
    finally:
        await h.close()


async def test_a_delta_that_does_not_apply_is_relayed_folded_as_nothing_and_counted(
    harness: Harness,
) -> None:
    """As the official client takes it: stored and relayed, the state as it was
    in every snapshot (still complete), counted; --strict-patches refuses it."""
    gateway = await harness.gateway()
    strict = await harness.gateway(harness.shared_store(gateway), strict_patches=True)
    thread = f"patches-{uuid.uuid4().hex[:8]}"
    viewer = await harness.client(gateway)
    await viewer.subscribe(thread, "start")
    agent = await harness.client(gateway, MSGPACK)
    opening = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "STATE_SNAPSHOT", "snapshot": {"count": 1}},
    ]
    bad = {"type": "STATE_DELTA", "delta": [{"op": "remove", "path": "/missing"}]}
    good = {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/count", "value": 2}]}
    offsets = await agent.publish(thread, [*opening, bad, good])
    frames = await viewer.until_offset(thread, offsets[-1])
    assert [e for _, e in events_of(frames, thread)] == [*opening, bad, good]
    samples = await scrape(gateway)
    assert value(samples, "agui_hub_patches_not_applied_total") == 1

    late = await harness.client(gateway)
    await late.subscribe(thread, "snapshot")
    snap = await late.recv()
    assert snap["type"] == "snapshot" and snap["complete"] is True
    states = [e["snapshot"] for e in snap["events"] if e["type"] == "STATE_SNAPSHOT"]
    assert states == [{"count": 2}]

    refused = await (await harness.client(strict)).request(
        {"type": "publish", "thread": thread, "events": [bad]}
    )
    assert (refused["type"], refused["code"], refused["index"]) == ("error", "patch_error", 0)
    assert value(await scrape(strict), "agui_hub_patches_not_applied_total") == 0
