"""Acceptance tests of the gateway's authentication and limits (docs/protocol.md, auth.py).

Most tests run real ``agui-hub serve`` processes (``--jwt-secret-file``) on
loopback ports, on the memory store and on a real redis-server, and talk to
them over real sockets with a small JSON client (:class:`Peer`). Tokens are
HS256 JWTs minted with :func:`agui_hub.gateway.auth.encode_token`. Covered:

* tenant isolation: a token for ``tenant-a/*`` can neither read (live, start,
  snapshot, offset) nor write tenant B's threads, and nothing of it is stored;
* where tokens travel, connections without a token (only ``auth``/``ping``,
  closed 4401 after ``--auth-timeout``), bad tokens (401), revoked ones (403,
  4403 on open connections), expiry (4401) and refresh with ``auth``;
* the Origin allow-list and the cookie token;
* every limit (rates, event size, subscriptions, connections per address and
  per process, the store's tenant thread quota and byte retention) trips with
  its code and the gateway keeps serving others;
* socket floods (idle TCP sockets and handshakes, hundreds): health checks and
  subscribers are served, no traceback; also under a low open-file limit that
  the gateway fitted its connection cap to itself; the open-file limit is logged;
* a property test of grants against a reference, on one in-process gateway;
* idempotency keys scoped by subject (no squatting of another's event ids);
* ``serve`` refusing to listen beyond loopback without authentication (and a
  cookie token without an Origin allow-list); anonymous access on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Response

from agui_hub.errors import InvalidEvent
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store import open_store
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.offsets import check_thread

from .. import processes
from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import CLI, ROOT, GatewayProcess, child_env

pytestmark = pytest.mark.timeout(120)

SECRET = "security-acceptance-secret-0123456789-abcdef"
OTHER_SECRET = "a-different-secret-of-at-least-32-bytes-xyz"
WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing that should happen."""
JSON_SUBPROTOCOL = "agui-hub.v1.json"
Event = dict[str, Any]
Frame = dict[str, Any]


# -- tokens and events -----------------------------------------------------------------------------


def token(
    subject: str,
    *,
    subscribe: list[str] | tuple[str, ...] = (),
    publish: list[str] | tuple[str, ...] = (),
    ttl: float = 300,
    secret: str = SECRET,
    jti: str | None = None,
) -> str:
    extra = {"jti": jti} if jti is not None else None
    return encode_token(secret, subject, subscribe=subscribe, publish=publish, ttl=ttl, extra=extra)


def tenant_token(subject: str, tenant: str, **kwargs: Any) -> str:
    """A token that may read and write exactly the threads ``<tenant>/*``."""
    return token(subject, subscribe=[f"{tenant}/*"], publish=[f"{tenant}/*"], **kwargs)


def expiry_of(jwt_token: str) -> int:
    import jwt

    return int(jwt.decode(jwt_token, options={"verify_signature": False})["exp"])


def run_started(thread: str, run: str = "r1") -> Event:
    return {"type": "RUN_STARTED", "threadId": thread, "runId": run}


def run_finished(thread: str, run: str = "r1") -> Event:
    return {"type": "RUN_FINISHED", "threadId": thread, "runId": run}


def custom(value: Any, name: str = "probe") -> Event:
    return {"type": "CUSTOM", "name": name, "value": value}


# -- a small JSON client ---------------------------------------------------------------------------


class Peer:
    """One WebSocket connection; every frame it receives is kept, replies matched by id."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[Frame] = []
        self._taken: set[int] = set()
        self._changed = asyncio.Event()
        self._ids = itertools.count(1)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                frame = json.loads(data)
                assert isinstance(frame, dict), frame
                self.frames.append(frame)
                self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            self._changed.set()

    @property
    def is_open(self) -> bool:
        return not self.reader.done()

    async def send(self, frame: Frame) -> None:
        await self.ws.send(json.dumps(frame, ensure_ascii=False))

    async def wait(
        self, matches: Callable[[Frame], bool], what: str, timeout: float = WAIT
    ) -> Frame:
        """The first frame not yet taken that *matches* (waiting up to *timeout*)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for n, frame in enumerate(self.frames):
                if n not in self._taken and matches(frame):
                    self._taken.add(n)
                    return frame
            if self.reader.done():
                raise AssertionError(
                    f"connection closed ({self.ws.close_code} {self.ws.close_reason!r}) "
                    f"before {what}; last frames: {self.frames[-8:]}"
                )
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(
                    f"no {what} within {timeout} s; last frames: {self.frames[-8:]}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def request(self, frame: Frame, timeout: float = WAIT) -> Frame:
        """Send *frame* with a fresh id; its reply (or error)."""
        frame = {**frame, "id": frame.get("id", f"c{next(self._ids)}")}
        await self.send(frame)
        command_id = frame["id"]
        return await self.wait(
            lambda f: f.get("id") == command_id, f"reply to {frame}", timeout=timeout
        )

    async def subscribe(self, thread: str, start: Any = "live") -> Frame:
        return await self.request({"type": "subscribe", "thread": thread, "from": start})

    async def publish(
        self, thread: str, events: list[Event], ids: list[str] | None = None
    ) -> Frame:
        frame: Frame = {"type": "publish", "thread": thread, "events": events}
        if ids is not None:
            frame["eventIds"] = ids
        return await self.request(frame)

    async def ping(self) -> None:
        reply = await self.request({"type": "ping"})
        assert reply["type"] == "pong", reply

    def events(self, thread: str) -> list[Event]:
        return [
            f["event"] for f in self.frames if f.get("type") == "event" and f["thread"] == thread
        ]

    async def event(self, thread: str, matches: Callable[[Event], bool], what: str) -> Frame:
        return await self.wait(
            lambda f: f.get("type") == "event" and f["thread"] == thread and matches(f["event"]),
            what,
        )

    async def closed(self, timeout: float = WAIT) -> int | None:
        """Wait until the server closed the connection; its close code."""
        try:
            await asyncio.wait_for(asyncio.shield(self.reader), timeout)
        except TimeoutError:
            raise AssertionError(f"connection still open after {timeout} s") from None
        return self.ws.close_code

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.ws.close(), 3)
        self.ws.transport.abort()
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader


async def open_peer(
    url: str,
    jwt_token: str | None = None,
    *,
    via: str = "header",
    origin: str | None = None,
    cookie: str | None = None,
    local_host: str | None = None,
) -> Peer:
    """A connection to *url*, its token sent *via* header / subprotocol / query / cookie
    / frame (an ``auth`` command right after the handshake)."""
    headers: dict[str, str] = {}
    subprotocols = [JSON_SUBPROTOCOL]
    target = url + "/"
    if jwt_token is not None:
        if via == "header":
            headers["Authorization"] = f"Bearer {jwt_token}"
        elif via == "subprotocol":
            subprotocols.append(f"agui-hub.bearer.{jwt_token}")
        elif via == "query":
            target = f"{url}/?access_token={jwt_token}"
        elif via == "cookie":
            assert cookie is not None
            headers["Cookie"] = f"{cookie}={jwt_token}"
        else:
            assert via == "frame", via
    options: dict[str, Any] = {}
    if local_host is not None:
        options["local_addr"] = (local_host, 0)
    ws = await connect(
        target,
        subprotocols=subprotocols,  # type: ignore[arg-type]
        additional_headers=headers,
        origin=origin,  # type: ignore[arg-type]
        proxy=None,
        open_timeout=WAIT,
        close_timeout=2,
        ping_interval=None,
        max_size=None,
        compression=None,
        **options,
    )
    peer = Peer(ws)
    if jwt_token is not None and via == "frame":
        reply = await peer.request({"type": "auth", "token": jwt_token})
        assert reply["type"] == "authenticated", reply
    return peer


async def refused(url: str, jwt_token: str | None = None, **kwargs: Any) -> Response:
    """The HTTP response of a handshake that must be refused."""
    try:
        peer = await open_peer(url, jwt_token, **kwargs)
    except InvalidStatus as exc:
        return exc.response
    await peer.close()
    raise AssertionError(f"handshake to {url} with {kwargs} was accepted")


class Peers:
    """The connections of one test, all closed at its end."""

    def __init__(self) -> None:
        self.peers: list[Peer] = []

    async def open(self, url: str, jwt_token: str | None = None, **kwargs: Any) -> Peer:
        peer = await open_peer(url, jwt_token, **kwargs)
        self.peers.append(peer)
        return peer

    async def close(self) -> None:
        await asyncio.gather(*(peer.close() for peer in self.peers))


@pytest.fixture
async def peers() -> Any:
    manager = Peers()
    try:
        yield manager
    finally:
        await manager.close()


async def stored_events(url: str, jwt_token: str, thread: str) -> tuple[Frame, list[Event]]:
    """Replay *thread* from the start through the gateway: its ``subscribed`` and every
    stored event (the ``subscribed`` offset is the newest one, so the list is complete)."""
    peer = await open_peer(url, jwt_token)
    try:
        reply = await peer.subscribe(thread, "start")
        assert reply["type"] == "subscribed", reply
        if reply["offset"] != "0-0":
            await peer.wait(
                lambda f: f.get("type") == "event" and f["offset"] == reply["offset"],
                f"replay of {thread} up to {reply['offset']}",
            )
        assert not any(f.get("type") == "snapshot" for f in peer.frames), peer.frames
        return reply, peer.events(thread)
    finally:
        await peer.close()


async def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, dict[str, str]]:
    """``GET path`` on the loopback port: (status, headers), within *timeout*."""

    async def get() -> tuple[int, dict[str, str]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
            writer.write(request.encode())
            head = await reader.readuntil(b"\r\n\r\n")
        finally:
            writer.transport.abort()
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        return status, headers

    return await asyncio.wait_for(get(), timeout)


# -- gateway processes -----------------------------------------------------------------------------


class Gateways(processes.Gateways):
    """Gateway processes of one test, with the test secret's file for JWT."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.secret_file = workdir / "jwt-secret"
        self.secret_file.write_text(SECRET + "\n")
        self.secret_file.chmod(0o600)

    def start(  # type: ignore[override]
        self,
        store: str | None = None,
        *args: str,
        auth: bool = True,
        env: dict[str, str] | None = None,
    ) -> GatewayProcess:
        argv = ["--jwt-secret-file", str(self.secret_file)] if auth else []
        return super().start(store, *argv, *args, env=env)


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    manager = Gateways(tmp_path)
    try:
        yield manager
    finally:
        manager.kill_all()


def redis_url(redis: RedisServer, **options: Any) -> str:
    query = "&".join(
        [f"prefix=sec-{uuid.uuid4().hex[:12]}"] + [f"{k}={v}" for k, v in options.items()]
    )
    return f"{redis.url}?{query}"


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """``None`` (the gateway's in-process memory store) or a Redis URL of a fresh prefix."""
    if request.param == "memory":
        return None
    return redis_url(request.getfixturevalue("redis_server"))


def low_file_limit_env(workdir: Path, limit: int) -> dict[str, str]:
    """An environment whose Python children start with an open-file limit (soft and
    hard) of *limit*, as under ``ulimit -n``: a ``sitecustomize`` sets it."""
    site = workdir / f"nofile-{limit}"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))\n"
    )
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": str(site) + (os.pathsep + path if path else "")}


def forbidden(reply: Frame, thread: str) -> bool:
    return (
        reply.get("type") == "error"
        and reply.get("code") == "forbidden"
        and reply.get("thread") == thread
    )


# -- 1. tenant isolation ---------------------------------------------------------------------------


async def test_tenant_cannot_read_or_write_another_tenants_threads(
    gateways: Gateways, store_url: str | None, peers: Peers
) -> None:
    gateway = gateways.start(store_url)
    url = gateway.url
    token_a = tenant_token("alice", "tenant-a")
    token_b = tenant_token("bob", "tenant-b")
    b_thread, b_new = "tenant-b/t1", "tenant-b/never"

    b = await peers.open(url, token_b)
    first = await b.publish(b_thread, [run_started(b_thread)], ["b-1"])
    assert first["type"] == "published", first
    b_offset = first["offsets"][0]
    b_epoch = (await b.subscribe(b_thread, "live"))["epoch"]
    assert b_epoch

    # Tenant A on every way a token travels, at the same time as its own work.
    for via in ("header", "subprotocol", "query", "frame"):
        a = await peers.open(url, token_a, via=via)
        own = f"tenant-a/{via}"
        assert (await a.subscribe(own, "live"))["type"] == "subscribed"
        starts: list[Any] = [
            "live",
            "start",
            "snapshot",
            {"offset": "0-0"},
            {"offset": b_offset, "epoch": b_epoch},
        ]
        for thread in (b_thread, b_new, "tenant-b", "tenant-a"):
            for start in starts:
                reply = await a.subscribe(thread, start)
                assert forbidden(reply, thread), (via, thread, start, reply)
        for thread, events in (
            (b_thread, [custom("from-a")]),
            (b_thread, [run_finished(b_thread)]),
            (b_new, [run_started(b_new)]),
            ("tenant-a", [run_started("tenant-a")]),
        ):
            reply = await a.publish(thread, events, [f"a-{uuid.uuid4().hex}" for _ in events])
            assert forbidden(reply, thread), (via, thread, reply)
        # Nor may it list the runs of B's threads.
        reply = await a.request({"type": "runs", "thread": b_thread})
        assert forbidden(reply, b_thread), (via, reply)
        # A's own thread works on the same connection.
        published = await a.publish(own, [run_started(own), custom(via)])
        assert published["type"] == "published" and len(published["offsets"]) == 2, published
        await a.event(own, lambda e, v=via: e.get("value") == v, f"own event on {own}")
        # A run announced in B's thread's name is refused, in its own thread.
        mismatch = await a.publish(own, [run_finished(b_thread)])
        assert mismatch["type"] == "error" and mismatch["code"] == "sequence_error", mismatch
        assert "thread_mismatch" in mismatch["message"] and mismatch["index"] == 0, mismatch
        assert not a.events(b_thread) and not a.events(b_new), a.frames

    other = f"tenant-a/mismatch-{uuid.uuid4().hex[:6]}"
    a = await peers.open(url, token_a)
    mismatch = await a.publish(other, [run_started(b_thread)])
    assert mismatch["type"] == "error" and mismatch["code"] == "sequence_error", mismatch
    assert "thread_mismatch" in mismatch["message"] and mismatch["index"] == 0, mismatch

    # B's live subscriber saw nothing of A; B's thread holds only B's event.
    end = await b.publish(b_thread, [custom("end-of-b")])
    assert end["type"] == "published", end
    await b.event(b_thread, lambda e: e.get("value") == "end-of-b", "B's own marker")
    assert b.events(b_thread) == [custom("end-of-b")], b.events(b_thread)
    reply, events = await stored_events(url, token_b, b_thread)
    assert reply["offset"] == end["offsets"][0]
    assert events == [run_started(b_thread), custom("end-of-b")], events
    reply, events = await stored_events(url, token_b, b_new)
    assert (reply["epoch"], reply["offset"], events) == (None, "0-0", []), reply
    reply, events = await stored_events(url, token_a, other)
    assert (reply["epoch"], reply["offset"], events) == (None, "0-0", []), reply

    if store_url is not None:
        store = open_store(store_url)
        try:
            entries = await store.read(b_thread)
            assert [e.offset for e in entries] == [b_offset, end["offsets"][0]], entries
            assert await store.epoch(b_new) is None
            assert await store.epoch("tenant-b") is None
            assert await store.epoch("tenant-a") is None
            assert await store.epoch(other) is None
            assert len(await store.read("tenant-a/header")) == 2
        finally:
            await store.close()


# -- 2. tokens: handshake, expiry, refresh, revocation ---------------------------------------------


async def test_bad_tokens_refused_at_handshake_and_tokenless_connections_wait_for_auth(
    gateways: Gateways, peers: Peers
) -> None:
    gateway = gateways.start(None, "--auth-timeout", "1.5", "--jwt-leeway", "0")
    url = gateway.url
    bad_tokens = {
        "expired": tenant_token("alice", "t", ttl=-5),
        "other secret": tenant_token("alice", "t", secret=OTHER_SECRET),
        "garbage": "not.a.jwt",
    }
    for name, bad in bad_tokens.items():
        for via in ("header", "subprotocol", "query"):
            response = await refused(url, bad, via=via)
            assert response.status_code == 401, (name, via, response.status_code, response.body)
            challenge = response.headers.get("WWW-Authenticate", "")
            assert challenge.startswith("Bearer "), (name, via, response.headers)
            assert response.headers.get("Server") == "agui-hub", response.headers
    status, headers = await http_get(gateway.port, "/healthz")
    assert (status, headers.get("server")) == (200, "agui-hub"), headers

    # Accepted with a good token: the Server header names no version either.
    alice = await peers.open(url, tenant_token("alice", "t"))
    assert alice.ws.response is not None
    assert alice.ws.response.headers.get("Server") == "agui-hub", alice.ws.response.headers
    await alice.ping()

    # Without a token: accepted, but only auth and ping until it authenticates.
    opened = time.monotonic()
    idle = await peers.open(url)
    late = await peers.open(url)
    await idle.ping()
    for command in (
        {"type": "subscribe", "thread": "t/1", "from": "start"},
        {"type": "publish", "thread": "t/1", "events": [run_started("t/1")]},
        {"type": "unsubscribe", "thread": "t/1"},
    ):
        reply = await idle.request(command)
        assert reply["type"] == "error" and reply["code"] == "unauthorized", (command, reply)
    reply = await late.request({"type": "auth", "token": bad_tokens["expired"]})
    assert reply["type"] == "error" and reply["code"] == "unauthorized", reply
    reply = await late.request({"type": "auth", "token": tenant_token("carol", "t")})
    assert reply["type"] == "authenticated" and reply["subject"] == "carol", reply
    assert reply["grants"] == {"subscribe": ["t/*"], "publish": ["t/*"]}, reply

    code = await idle.closed(timeout=5)
    waited = time.monotonic() - opened
    assert code == 4401, (code, idle.ws.close_reason)
    assert 1.2 <= waited <= 4.5, waited
    # The one that authenticated in time is still open and works.
    await late.ping()
    assert (await late.subscribe("t/1", "start"))["type"] == "subscribed"
    assert (await late.publish("t/1", [run_started("t/1")]))["type"] == "published"
    _, events = await stored_events(url, tenant_token("alice", "t"), "t/1")
    assert events == [run_started("t/1")], events


async def test_open_connection_closed_with_4401_at_token_expiry(
    gateways: Gateways, peers: Peers
) -> None:
    gateway = gateways.start(None, "--jwt-leeway", "0")
    short = tenant_token("dora", "t", ttl=2.5)
    expires = expiry_of(short)
    peer = await peers.open(gateway.url, short)
    assert (await peer.subscribe("t/expiry", "live"))["type"] == "subscribed"
    code = await peer.closed(timeout=6)
    closed_at = time.time()
    assert code == 4401, (code, peer.ws.close_reason)
    assert expires - 0.2 <= closed_at <= expires + 2.0, (expires, closed_at)
    # The same token is now refused at the handshake.
    assert (await refused(gateway.url, short)).status_code == 401


async def test_auth_refresh_keeps_connection_open_past_first_expiry(
    gateways: Gateways, peers: Peers
) -> None:
    gateway = gateways.start(None, "--jwt-leeway", "0")
    url = gateway.url
    first = token("erin", subscribe=["t/*"], ttl=2.5)
    first_expiry = expiry_of(first)
    viewer = await peers.open(url, first)
    publisher = await peers.open(url, token("agent", publish=["t/*"]))
    for thread in ("t/keep", "t/drop"):
        assert (await publisher.publish(thread, [run_started(thread)]))["type"] == "published"
        assert (await viewer.subscribe(thread, "live"))["type"] == "subscribed"

    # Another subject may not take the connection over; it stays erin's.
    reply = await viewer.request({"type": "auth", "token": token("mallory", subscribe=["*"])})
    assert reply["type"] == "error" and reply["code"] == "forbidden", reply
    # A new token of the same subject, with narrower grants, before the first expires.
    second = token("erin", subscribe=["t/keep"], ttl=120)
    reply = await viewer.request({"type": "auth", "token": second})
    assert reply["type"] == "authenticated" and reply["subject"] == "erin", reply
    assert reply["grants"]["subscribe"] == ["t/keep"], reply
    ended = await viewer.wait(
        lambda f: f.get("type") == "error" and f.get("thread") == "t/drop",
        "the end of the subscription no longer granted",
    )
    assert ended["code"] == "forbidden" and "id" not in ended, ended
    assert time.time() < first_expiry, "the refresh came too late for this test to mean much"

    while time.time() < first_expiry + 1.0:
        await asyncio.sleep(0.1)
    assert viewer.is_open, (viewer.ws.close_code, viewer.ws.close_reason)
    await viewer.ping()
    for thread in ("t/drop", "t/keep"):
        reply = await publisher.publish(thread, [custom(f"after-expiry-{thread}")])
        assert reply["type"] == "published", reply
    await viewer.event("t/keep", lambda e: e.get("value") == "after-expiry-t/keep", "t/keep event")
    reply = await viewer.request({"type": "unsubscribe", "thread": "t/drop"})
    assert reply["type"] == "error" and reply["code"] == "not_subscribed", reply
    assert forbidden(await viewer.subscribe("t/drop", "start"), "t/drop")
    assert not any(e.get("value") == "after-expiry-t/drop" for e in viewer.events("t/drop"))
    assert viewer.is_open


async def test_revoked_tokens_refused_and_open_connections_closed_4403(
    gateways: Gateways, peers: Peers, tmp_path: Path
) -> None:
    revocations = tmp_path / "revoked.txt"
    revocations.write_text("# revoked token ids and subjects\n")
    gateway = gateways.start(None, "--revocation-file", str(revocations))
    url = gateway.url
    frank_token = tenant_token("frank", "t", jti="frank-token-1")
    frank = await peers.open(url, frank_token)
    grace = await peers.open(url, tenant_token("grace", "t", jti="grace-token-1"))
    helen = await peers.open(url, tenant_token("helen", "t"))
    assert (await frank.subscribe("t/r", "live"))["type"] == "subscribed"

    # By token id, read at once on SIGHUP.
    revocations.write_text("# revoked\nfrank-token-1\n")
    gateway.signal(signal.SIGHUP)
    assert await frank.closed(timeout=3) == 4403, frank.ws.close_reason
    response = await refused(url, frank_token)
    assert response.status_code == 403, (response.status_code, response.body)
    await grace.ping()
    # Frank's other tokens (another jti) still work: the id was revoked, not the subject.
    await (await peers.open(url, tenant_token("frank", "t", jti="frank-token-2"))).ping()

    # By subject, read by the periodic check (every 5 s) without a signal.
    revocations.write_text("frank-token-1\ngrace\n")
    assert await grace.closed(timeout=8) == 4403, grace.ws.close_reason
    response = await refused(url, tenant_token("grace", "t", jti="grace-token-9"))
    assert response.status_code == 403, response.status_code
    await helen.ping()
    assert (await helen.publish("t/r", [run_started("t/r")]))["type"] == "published"


# -- 3. origins and the cookie token ---------------------------------------------------------------


async def test_origin_allow_list_and_cookie_token(gateways: Gateways, peers: Peers) -> None:
    gateway = gateways.start(
        None, "--allowed-origins", "https://app.example", "--jwt-cookie", "agui_token"
    )
    url = gateway.url
    jwt_token = tenant_token("ivan", "t")

    for origin in (
        "https://evil.example",
        "http://app.example",
        "https://app.example.evil",
        "null",
    ):
        response = await refused(url, jwt_token, origin=origin)
        assert response.status_code == 403, (origin, response.status_code, response.body)
        assert response.headers.get("Server") == "agui-hub"
    # A token in a cookie from a foreign page is what the allow-list is for.
    response = await refused(
        url, jwt_token, via="cookie", cookie="agui_token", origin="https://evil.example"
    )
    assert response.status_code == 403, response.status_code

    allowed = await peers.open(url, jwt_token, origin="https://app.example")
    no_origin = await peers.open(url, jwt_token)
    own = await peers.open(url, jwt_token, origin=f"http://127.0.0.1:{gateway.port}")
    cookie = await peers.open(
        url, jwt_token, via="cookie", cookie="agui_token", origin="https://app.example"
    )
    for peer in (allowed, no_origin, own, cookie):
        assert (await peer.subscribe("t/origin", "live"))["type"] == "subscribed"
    # The cookie's token is the connection's identity: its grants apply.
    assert forbidden(await cookie.subscribe("u/other", "live"), "u/other")
    reply = await cookie.publish("t/origin", [run_started("t/origin")])
    assert reply["type"] == "published", reply
    for peer in (allowed, no_origin, own, cookie):
        await peer.event("t/origin", lambda e: e["type"] == "RUN_STARTED", "the event")
    # Another cookie name carries nothing: the connection must authenticate first.
    stranger = await peers.open(
        url, jwt_token, via="cookie", cookie="other_cookie", origin="https://app.example"
    )
    reply = await stranger.subscribe("t/origin", "live")
    assert reply["type"] == "error" and reply["code"] == "unauthorized", reply


# -- 4. limits -------------------------------------------------------------------------------------


def is_error(code: str) -> Callable[[Frame], bool]:
    return lambda frame: frame.get("type") == "error" and frame.get("code") == code


async def test_rate_limits_pace_commands_and_events_and_others_are_served(
    gateways: Gateways, peers: Peers
) -> None:
    """Over its rates a connection is slowed down, in order (its next frame is
    read later); a command other than a publish that would wait over a second
    is refused with ``rate_limited``. Other connections are served meanwhile."""
    gateway = gateways.start(
        None, "--max-commands-per-second", "10", "--max-events-per-second", "20"
    )
    url = gateway.url
    jwt_token = tenant_token("jack", "t")
    other = await peers.open(url, jwt_token)

    # Commands: 30 pings at once; the bucket holds 10, then 10 a second.
    pinger = await peers.open(url, jwt_token)
    began = time.monotonic()
    for n in range(30):
        await pinger.send({"type": "ping", "id": n})
    await asyncio.sleep(0.5)
    served = time.monotonic()
    await other.ping()  # somebody else is served right away, while the pinger is paced
    assert time.monotonic() - served < 0.5
    replies = [await pinger.wait(lambda f, n=n: f.get("id") == n, f"reply {n}") for n in range(30)]
    elapsed = time.monotonic() - began
    assert [r["type"] for r in replies] == ["pong"] * 30, replies
    assert elapsed >= 1.5, elapsed  # 20 past the burst, at 10 a second

    # Publishes count against the events rate only, and are paced in order.
    writer = await peers.open(url, jwt_token)
    thread = "t/commands"
    frames: list[Frame] = [
        {"type": "publish", "id": 0, "thread": thread, "events": [run_started(thread)]}
    ] + [
        {"type": "publish", "id": n, "thread": thread, "events": [custom(n)]} for n in range(1, 40)
    ]
    began = time.monotonic()
    for frame in frames:
        await writer.send(frame)
    replies = [await writer.wait(lambda f, n=n: f.get("id") == n, f"reply {n}") for n in range(40)]
    elapsed = time.monotonic() - began
    assert [r["type"] for r in replies] == ["published"] * 40, replies
    assert elapsed >= 0.8, elapsed  # 20 past the burst, at 20 a second
    reply, events = await stored_events(url, jwt_token, thread)
    assert events == [run_started(thread)] + [custom(n) for n in range(1, 40)], events
    assert reply["offset"] == replies[-1]["offsets"][-1]

    # A large publish is let through in debt; the ones after it wait for it to
    # be paid, in order, never refused (a refusal would let later ones overtake).
    batcher = await peers.open(url, jwt_token)
    thread = "t/events"
    batches = [
        [run_started(thread)] + [custom(i) for i in range(14)],  # 15 of the 20
        [custom(f"1-{i}") for i in range(60)],  # let through, 55 in debt
        [custom(f"2-{i}") for i in range(5)],  # (55 + 1) / 20 s away: paced
    ]
    began = time.monotonic()
    for n, batch in enumerate(batches):
        await batcher.send({"type": "publish", "id": n, "thread": thread, "events": batch})
    replies = [await batcher.wait(lambda f, n=n: f.get("id") == n, f"reply {n}") for n in range(3)]
    assert [r["type"] for r in replies] == ["published"] * 3, replies
    assert time.monotonic() - began >= 2.5
    await other.ping()
    _, events = await stored_events(url, jwt_token, thread)
    assert events == [e for batch in batches for e in batch], events

    # Other commands are refused when they would wait over a second.
    slow = gateways.start(None, "--max-commands-per-second", "0.5")
    asker = await peers.open(slow.url, jwt_token)
    replies = [await asker.request({"type": "ping", "id": n}) for n in range(2)]
    assert replies[0]["type"] == "pong", replies
    assert is_error("rate_limited")(replies[1]) and replies[1]["retryAfter"] > 1, replies


async def test_event_size_and_subscription_limits(gateways: Gateways, peers: Peers) -> None:
    gateway = gateways.start(None, "--max-event-bytes", "1000", "--max-subscriptions", "3")
    url = gateway.url
    jwt_token = tenant_token("kate", "t")
    peer = await peers.open(url, jwt_token)

    thread = "t/big"
    big = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "x" * 2000}
    batch = [
        run_started(thread),
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        big,
    ]
    reply = await peer.publish(thread, batch)
    assert reply["type"] == "error" and reply["code"] == "payload_too_large", reply
    assert reply["index"] == 2 and reply["thread"] == thread, reply
    other = await peers.open(url, jwt_token)
    await other.ping()
    reply, events = await stored_events(url, jwt_token, thread)
    assert (reply["epoch"], events) == (None, []), (reply, events)
    small = [*batch[:2], {**big, "delta": "x" * 500}]
    assert (await peer.publish(thread, small))["type"] == "published"

    for n in range(3):
        assert (await peer.subscribe(f"t/s{n}", "live"))["type"] == "subscribed"
    reply = await peer.subscribe("t/s3", "start")
    assert reply["type"] == "error" and reply["code"] == "too_many_subscriptions", reply
    assert reply["thread"] == "t/s3", reply
    assert (await other.subscribe("t/s3", "live"))["type"] == "subscribed"
    # Subscribing again to a subscribed thread is no new subscription.
    assert (await peer.subscribe("t/s0", "start"))["type"] == "subscribed"
    assert (await peer.request({"type": "unsubscribe", "thread": "t/s1"}))["type"] == "unsubscribed"
    assert (await peer.subscribe("t/s3", "live"))["type"] == "subscribed"
    assert (await other.publish("t/s3", [run_started("t/s3")]))["type"] == "published"
    await peer.event("t/s3", lambda e: e["type"] == "RUN_STARTED", "an event of t/s3")
    await other.event("t/s3", lambda e: e["type"] == "RUN_STARTED", "an event of t/s3")


async def test_connection_limits_per_address_and_per_process(
    gateways: Gateways, peers: Peers
) -> None:
    gateway = gateways.start(None, "--max-connections", "4", "--max-connections-per-address", "2")
    url = gateway.url
    jwt_token = tenant_token("liam", "t")
    a1 = await peers.open(url, jwt_token, local_host="127.0.0.1")
    a2 = await peers.open(url, jwt_token, local_host="127.0.0.1")
    response = await refused(url, jwt_token, local_host="127.0.0.1")
    assert response.status_code == 429, (response.status_code, response.body)
    assert response.headers.get("Retry-After", "").isdigit(), response.headers
    # Another address is still served.
    b1 = await peers.open(url, jwt_token, local_host="127.0.0.2")
    b2 = await peers.open(url, jwt_token, local_host="127.0.0.2")
    response = await refused(url, jwt_token, local_host="127.0.0.3")
    assert response.status_code == 503, (response.status_code, response.body)
    assert response.headers.get("Retry-After", "").isdigit(), response.headers
    # A refused handshake costs nothing: the open ones are served, health checks answered.
    assert (await http_get(gateway.port, "/healthz"))[0] == 200
    assert (await b1.subscribe("t/full", "live"))["type"] == "subscribed"
    assert (await a1.publish("t/full", [run_started("t/full")]))["type"] == "published"
    await b1.event("t/full", lambda e: e["type"] == "RUN_STARTED", "the event on a full gateway")
    for peer in (a2, b2):
        await peer.ping()

    # A closed connection frees its place (per process, then per address).
    await b2.close()
    newcomer = await reopened(url, jwt_token, "127.0.0.3")
    await newcomer.ping()
    response = await refused(url, jwt_token, local_host="127.0.0.4")
    assert response.status_code == 503, response.status_code
    await a2.close()
    again = await reopened(url, jwt_token, "127.0.0.1")
    await again.ping()
    await again.close()


async def reopened(url: str, jwt_token: str, host: str, timeout: float = 5.0) -> Peer:
    """A connection from *host*, retried while the gateway has not yet seen a place freed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await open_peer(url, jwt_token, local_host=host)
        except InvalidStatus as exc:
            if exc.response.status_code not in (429, 503) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_store_tenant_thread_quota_and_byte_retention_on_redis(
    gateways: Gateways, peers: Peers, redis_server: RedisServer
) -> None:
    url_of_store = redis_url(redis_server, max_tenant_threads=2, max_bytes=4000)
    gateway = gateways.start(url_of_store)
    url = gateway.url
    jwt_token = token("mia", subscribe=["*"], publish=["*"])
    peer = await peers.open(url, jwt_token)
    for thread in ("tenant-q/1", "tenant-q/2"):
        assert (await peer.publish(thread, [run_started(thread)]))["type"] == "published"
    reply = await peer.publish("tenant-q/3", [run_started("tenant-q/3")])
    assert reply["type"] == "error" and reply["code"] == "too_many_threads", reply
    assert reply["thread"] == "tenant-q/3", reply
    # Other clients and tenants are served; existing threads of the tenant grow.
    other = await peers.open(url, jwt_token)
    assert (await other.publish("tenant-r/1", [run_started("tenant-r/1")]))["type"] == "published"
    assert (await other.publish("tenant-q/1", [custom(1)]))["type"] == "published"
    reply, events = await stored_events(url, jwt_token, "tenant-q/3")
    assert (reply["epoch"], events) == (None, []), (reply, events)

    # max_bytes trims the oldest events of a thread.
    thread = "tenant-r/big"
    offsets: list[str] = []
    batch = [run_started(thread)]
    for n in range(20):
        batch.append(custom({"n": n, "pad": "p" * 400}))
        reply = await peer.publish(thread, batch)
        assert reply["type"] == "published", reply
        offsets += reply["offsets"]
        batch = []
    store = open_store(url_of_store)
    try:
        assert await store.epoch("tenant-q/3") is None
        assert len(await store.read("tenant-q/1")) == 2
        available = await store.read_available(thread)
        kept = sum(len(entry.data) for entry in available.entries)
        assert available.gap and 0 < kept <= 4000, (available.gap, kept)
        assert available.entries[-1].offset == offsets[-1]
        assert len(available.entries) < len(offsets)
    finally:
        await store.close()


# -- 5. socket floods and the open-file limit ------------------------------------------------------


RAW_SOCKETS = 200
WEBSOCKETS = 150
EMFILE_SIGNS = ("Traceback", "Too many open files", "EMFILE", "out of system resource")


class Flood:
    """Sockets thrown at a gateway: raw TCP ones that say nothing, and WebSocket
    handshakes with a valid token (kept open when admitted)."""

    def __init__(self, port: int, url: str, jwt_token: str) -> None:
        self.port = port
        self.url = url
        self.jwt_token = jwt_token
        self.raw: list[asyncio.StreamWriter] = []
        self.peers: list[Peer] = []
        self.raw_results: list[str] = []
        self.ws_results: list[str | int] = []

    async def _raw_socket(self) -> str:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 3)
        except (OSError, TimeoutError) as exc:
            return type(exc).__name__
        self.raw.append(writer)  # connected, and says nothing
        return "open"

    async def _websocket(self) -> str | int:
        try:
            peer = await asyncio.wait_for(open_peer(self.url, self.jwt_token), 8)
        except InvalidStatus as exc:
            return exc.response.status_code
        except Exception as exc:  # a handshake cut short by a dropped socket
            return type(exc).__name__
        self.peers.append(peer)
        return "open"

    async def start(self, raw: int, websockets: int) -> None:
        began = time.monotonic()
        self.raw_results = await asyncio.gather(*(self._raw_socket() for _ in range(raw)))
        self.ws_results = await asyncio.gather(*(self._websocket() for _ in range(websockets)))
        assert time.monotonic() - began < 30

    async def stop(self) -> None:
        for writer in self.raw:
            writer.transport.abort()
        await asyncio.gather(*(peer.close() for peer in self.peers))


async def served_during_flood(gateway: GatewayProcess, viewer: Peer, publisher: Peer) -> None:
    """Health checks answer at once, and a subscriber gets a new event."""
    for _ in range(5):
        status, _ = await http_get(gateway.port, "/healthz", timeout=2.0)
        assert status == 200, status
    thread = "t/flood"
    reply = await publisher.publish(thread, [custom(f"during-{uuid.uuid4().hex[:6]}")])
    assert reply["type"] == "published", reply
    offset = reply["offsets"][0]
    await viewer.wait(
        lambda f: f.get("type") == "event" and f["offset"] == offset, "an event during the flood"
    )
    await viewer.ping()


async def viewer_and_publisher(peers: Peers, url: str, jwt_token: str) -> tuple[Peer, Peer]:
    """A viewer of ``t/flood`` (live) and a publisher into it, before a flood."""
    viewer = await peers.open(url, jwt_token)
    publisher = await peers.open(url, jwt_token)
    assert (await publisher.publish("t/flood", [run_started("t/flood")]))["type"] == "published"
    assert (await viewer.subscribe("t/flood", "live"))["type"] == "subscribed"
    return viewer, publisher


async def test_socket_flood_keeps_health_checks_and_subscribers_served(
    gateways: Gateways, peers: Peers
) -> None:
    gateway = gateways.start(None, "--max-connections", "50")
    url = gateway.url
    jwt_token = tenant_token("nora", "t")
    viewer, publisher = await viewer_and_publisher(peers, url, jwt_token)

    flood = Flood(gateway.port, url, jwt_token)
    try:
        await flood.start(RAW_SOCKETS, WEBSOCKETS)
        statuses = [r for r in flood.ws_results if isinstance(r, int)]
        assert set(statuses) <= {503}, flood.ws_results
        # 50 connections, less the viewer and the publisher.
        assert 1 <= len(flood.peers) <= 48, (len(flood.peers), flood.ws_results)
        assert statuses, flood.ws_results
        assert flood.raw_results.count("open") > 0, flood.raw_results
        await served_during_flood(gateway, viewer, publisher)
    finally:
        await flood.stop()

    # Once the flood is gone the places are free again.
    late = await reopened(url, jwt_token, "127.0.0.1", timeout=10)
    assert (await late.subscribe("t/flood", "start"))["type"] == "subscribed"
    await late.event("t/flood", lambda e: e["type"] == "RUN_STARTED", "the stored event")
    await late.close()
    log = gateway.log()
    for sign in EMFILE_SIGNS:
        assert sign not in log, log[-4000:]


FLOOD_FILE_LIMIT = 256
"""The gateway's open-file limit (soft and hard) in the flood test below."""


async def test_socket_flood_under_a_low_open_file_limit_never_runs_out_of_descriptors(
    gateways: Gateways, peers: Peers, tmp_path: Path
) -> None:
    """The gateway fits its connection cap under the limit itself (no --max-connections):
    400 sockets that say nothing, then handshakes, must not make it run out of files."""
    gateway = gateways.start(None, env=low_file_limit_env(tmp_path, FLOOD_FILE_LIMIT))
    log = gateway.log()
    assert f"open-file limit {FLOOD_FILE_LIMIT}" in log, log
    url = gateway.url
    jwt_token = tenant_token("nora", "t")
    viewer, publisher = await viewer_and_publisher(peers, url, jwt_token)

    flood = Flood(gateway.port, url, jwt_token)
    try:
        await flood.start(2 * RAW_SOCKETS, WEBSOCKETS // 3)
        assert set(r for r in flood.ws_results if isinstance(r, int)) <= {503}, flood.ws_results
        await served_during_flood(gateway, viewer, publisher)
    finally:
        await flood.stop()
    log = gateway.log()
    emfile = log.count("Too many open files")
    assert emfile == 0, (
        f"the gateway ran out of file descriptors ({emfile} 'Too many open files' in its log "
        f"under an open-file limit of {FLOOD_FILE_LIMIT}):\n{log[-3000:]}"
    )
    for sign in EMFILE_SIGNS:
        assert sign not in log, log[-4000:]


async def test_serve_logs_the_open_file_limit_and_fits_connections_under_it(
    gateways: Gateways, tmp_path: Path
) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard > 1024 and soft > 1024:
        # Children inherit the limit: start one with a low soft limit to raise.
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        try:
            raised = gateways.start(None)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert f"open-file limit raised from 1024 to {hard}" in raised.log(), raised.log()
    plain = gateways.start(None)
    assert re.search(
        r"INFO agui_hub\.server: open-file limit (raised from \d+ to )?\d+ \(", plain.log()
    )

    tight = gateways.start(None, env=low_file_limit_env(tmp_path, 256))
    log = tight.log()
    assert re.search(r"open-file limit 256 \(soft and hard", log), log
    assert "max_connections 10000 does not fit the open-file limit 256" in log, log
    serving = re.search(r"at most (\d+) connections", log)
    assert serving is not None and 0 < int(serving.group(1)) < 256, log


# -- 6. grants against a reference (property test, one in-process gateway) -------------------------


def reference_allows(patterns: list[str], thread: str) -> bool:
    return any(
        pattern == thread or (pattern.endswith("*") and thread.startswith(pattern[:-1]))
        for pattern in patterns
    )


def valid_thread(thread: str) -> bool:
    try:
        check_thread(thread)
    except InvalidEvent:
        return False
    return True


SEGMENTS = st.text(alphabet=st.sampled_from(list("ab1-*/xé🙂 _.")), min_size=1, max_size=4)
THREADS = st.lists(SEGMENTS, min_size=1, max_size=3).map("/".join).filter(
    valid_thread
) | st.sampled_from(["a", "a/b", "tenant-1/x*", "tenant-1/x", "tenant-10/x", "*", "a*b", "ä/ö"])
STARTS = st.sampled_from(["live", "start", "snapshot", {"offset": "0-0"}])


@st.composite
def grant_cases(draw: st.DrawFn) -> tuple[list[str], list[str], list[tuple[str, Any]]]:
    threads = draw(st.lists(THREADS, min_size=1, max_size=6, unique=True))
    related = st.sampled_from(threads)
    pattern = st.one_of(
        related,
        related.flatmap(lambda t: st.integers(0, len(t)).map(lambda n: t[:n] + "*")),
        st.just("*"),
        THREADS,
        THREADS.map(lambda t: t + "*"),
    ).filter(lambda p: "*" not in p[:-1])
    subscribe = draw(st.lists(pattern, max_size=4))
    publish = draw(st.lists(pattern, max_size=4))
    return subscribe, publish, [(thread, draw(STARTS)) for thread in threads]


class LoopThread:
    """An event loop in a thread of its own, with one gateway on it for a whole test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway: Gateway | None = None

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 3 * WAIT) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    async def start(self) -> Gateway:
        config = GatewayConfig(
            host="127.0.0.1", port=0, ping_interval=None, jwt_secret=SECRET, jwt_leeway=0
        )
        self.gateway = Gateway(config, store=MemoryStore())
        await self.gateway.start()
        return self.gateway

    def stop(self) -> None:
        try:
            if self.gateway is not None:
                self.run(self.gateway.drain())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def loop_gateway() -> Iterator[LoopThread]:
    runner = LoopThread()
    try:
        runner.run(runner.start())
        yield runner
    finally:
        runner.stop()


async def check_grants(
    gateway: Gateway, subscribe: list[str], publish: list[str], cases: list[tuple[str, Any]]
) -> None:
    url = f"ws://127.0.0.1:{gateway.config.port}"
    store = gateway.store
    jwt_token = token(f"prop-{uuid.uuid4().hex[:8]}", subscribe=subscribe, publish=publish)
    peer = await open_peer(url, jwt_token)
    try:
        refused_reads = []
        for thread, start in cases:
            may_read = reference_allows(subscribe, thread)
            reply = await peer.subscribe(thread, start)
            if may_read:
                assert reply["type"] == "subscribed", (subscribe, thread, start, reply)
            else:
                assert forbidden(reply, thread), (subscribe, thread, start, reply)
                refused_reads.append(thread)

            before = len(await store.read(thread))
            run = uuid.uuid4().hex[:8]
            reply = await peer.publish(
                thread, [run_started(thread, run), run_finished(thread, run)]
            )
            after = len(await store.read(thread))
            if reference_allows(publish, thread):
                assert reply["type"] == "published", (publish, thread, reply)
                assert after == before + 2, (thread, before, after)
            else:
                assert forbidden(reply, thread), (publish, thread, reply)
                assert after == before, (thread, before, after)
        await peer.ping()
        for thread in refused_reads:
            assert not peer.events(thread), (thread, peer.events(thread))
    finally:
        await peer.close()


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=grant_cases())
def test_grants_match_the_reference_for_any_thread_and_pattern(
    loop_gateway: LoopThread, case: tuple[list[str], list[str], list[tuple[str, Any]]]
) -> None:
    subscribe, publish, cases = case
    assert loop_gateway.gateway is not None
    loop_gateway.run(check_grants(loop_gateway.gateway, subscribe, publish, cases))


# -- 7. idempotency keys are the publisher's own ---------------------------------------------------


async def test_another_subject_cannot_squat_a_publishers_event_ids(
    gateways: Gateways, store_url: str | None, peers: Peers
) -> None:
    gateway = gateways.start(store_url)
    url = gateway.url
    thread = "shared/run-1"
    victim = await peers.open(url, token("victim", subscribe=["shared/*"], publish=["shared/*"]))
    attacker = await peers.open(url, token("mallory", subscribe=[], publish=["shared/*"]))

    first = await victim.publish(thread, [run_started(thread)], ["victim-0001"])
    assert first["type"] == "published", first
    # The attacker guesses the victim's next ids and publishes first with them.
    squat = await attacker.publish(thread, [custom("squatted")], ["victim-0002"])
    assert squat["type"] == "published", squat
    squat_both = await attacker.publish(
        thread, [custom("squat-a"), custom("squat-b")], ["victim-0003", "victim-0004"]
    )
    assert squat_both["type"] == "published", squat_both

    real = await victim.publish(thread, [custom("real-2")], ["victim-0002"])
    assert real["type"] == "published", real
    assert real["offsets"] != squat["offsets"], (real, squat)
    real_both = await victim.publish(
        thread, [custom("real-3"), custom("real-4")], ["victim-0003", "victim-0004"]
    )
    assert real_both["type"] == "published", real_both
    assert set(real_both["offsets"]).isdisjoint(squat_both["offsets"]), (real_both, squat_both)
    # Retries keep working for each publisher: the same offsets, nothing stored twice.
    assert (await victim.publish(thread, [custom("real-2")], ["victim-0002"]))["offsets"] == real[
        "offsets"
    ]
    assert (await attacker.publish(thread, [custom("squatted")], ["victim-0002"]))[
        "offsets"
    ] == squat["offsets"]
    assert (await victim.publish(thread, [run_started(thread)], ["victim-0001"]))[
        "offsets"
    ] == first["offsets"]

    reply, events = await stored_events(url, token("auditor", subscribe=["shared/*"]), thread)
    assert events == [
        run_started(thread),
        custom("squatted"),
        custom("squat-a"),
        custom("squat-b"),
        custom("real-2"),
        custom("real-3"),
        custom("real-4"),
    ], events
    assert reply["offset"] == real_both["offsets"][-1]


# -- 8. no anonymous gateway beyond loopback -------------------------------------------------------


def test_serve_on_a_public_address_without_auth_refuses_to_start(tmp_path: Path) -> None:
    for argv, env in (
        (["--host", "0.0.0.0"], {}),
        (["--host", "::"], {}),
        ([], {"AGUI_HUB_HOST": "0.0.0.0"}),
    ):
        environment = child_env()
        environment.update(env)
        try:
            done = subprocess.run(
                [*CLI, "serve", "--port", "0", *argv],
                cwd=ROOT,
                env=environment,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=20 * TIMEOUT_SCALE,
            )
        except subprocess.TimeoutExpired as exc:  # it listened: killed by subprocess.run
            raise AssertionError(f"serve {argv} {env} kept running: {exc.stderr!r}") from None
        assert done.returncode == 2, (argv, env, done.returncode, done.stderr)
        assert "--allow-anonymous" in done.stderr, done.stderr
        assert "without authentication" in done.stderr, done.stderr
        assert "listening on" not in done.stderr.replace("listening on 0.0.0.0 (not", "").replace(
            "listening on :: (not", ""
        ), done.stderr


def test_cookie_token_needs_an_origin_allow_list(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    for origins in ([], ["--allowed-origins", "*"]):
        done = subprocess.run(
            [*CLI, "serve", "--host", "127.0.0.1", "--port", "0", "--jwt-secret-file", str(secret),
             "--jwt-cookie", "agui_token", *origins],
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=20 * TIMEOUT_SCALE,
        )  # fmt: skip
        assert done.returncode == 2, (origins, done.returncode, done.stderr)
        assert "allowed_origins" in done.stderr, done.stderr


async def test_anonymous_access_on_loopback_without_jwt(gateways: Gateways, peers: Peers) -> None:
    gateway = gateways.start(None, auth=False)
    assert "authentication: none" in gateway.log(), gateway.log()
    peer = await peers.open(gateway.url)
    assert (await peer.subscribe("any/thread", "start"))["type"] == "subscribed"
    assert (await peer.publish("any/thread", [run_started("any/thread")]))["type"] == "published"
    await peer.event("any/thread", lambda e: e["type"] == "RUN_STARTED", "the event")


# -- found in review: races, rebinding, floods of auth, odd claims and headers -----------------


class SlowStore(MemoryStore):
    """A memory store whose channel start (the checkpoint read) takes a while: the
    window in which a subscribe waits on the store."""

    async def get_checkpoint(self, thread: str) -> Any:
        await asyncio.sleep(0.3)
        return await super().get_checkpoint(thread)


@pytest.fixture
async def in_process() -> Any:
    started: list[Gateway] = []

    async def start(store: Any = None, **config: Any) -> tuple[Gateway, str]:
        config.setdefault("jwt_secret", SECRET)
        gateway = Gateway(
            GatewayConfig(host="127.0.0.1", port=0, ping_interval=None, **config),
            store=store if store is not None else MemoryStore(),
        )
        await gateway.start()
        started.append(gateway)
        return gateway, f"ws://127.0.0.1:{gateway.config.port}"

    try:
        yield start
    finally:
        for gateway in started:
            await asyncio.wait_for(gateway.drain(), WAIT)


async def test_a_grant_taken_away_mid_subscribe_ends_it_and_frees_the_member(
    in_process: Any, peers: Peers
) -> None:
    """An auth with narrower grants arrives while a subscribe waits on the store: the
    subscription must not start afterwards, and nothing of it stays in the hub."""
    gateway, url = await in_process(store=SlowStore())
    wide = token("alice", subscribe=["tenant-a/*"], publish=["tenant-a/*"])
    narrow = token("alice", subscribe=["tenant-a/public"], publish=["tenant-a/*"])
    viewer = await peers.open(url, wide)
    await viewer.send({"type": "subscribe", "id": "s", "thread": "tenant-a/secret"})
    await asyncio.sleep(0.05)  # the subscribe is now waiting on the slow store
    reply = await viewer.request({"type": "auth", "token": narrow})
    assert reply["type"] == "authenticated", reply
    publisher = await peers.open(url, wide)
    await asyncio.sleep(0.5)  # the subscribe's store read is over
    await publisher.publish("tenant-a/secret", [run_started("tenant-a/secret")])
    await asyncio.sleep(0.3)
    assert viewer.events("tenant-a/secret") == []
    assert any(forbidden(f, "tenant-a/secret") for f in viewer.frames), viewer.frames
    await viewer.close()
    for _ in range(100):
        if gateway.hub.stats()["members"] == 0:
            break
        await asyncio.sleep(0.02)
    assert gateway.hub.stats()["members"] == 0


async def test_dns_rebinding_gets_no_own_origin(in_process: Any) -> None:
    """A page of evil.example rebound to 127.0.0.1 sends Origin and Host of its own
    name: it is not the gateway's own origin. Only loopback addresses are."""
    gateway, _ = await in_process(jwt_secret="", allowed_origins="https://App.Example")
    port = gateway.config.port
    for origin, host, admitted in [
        (f"http://evil.example:{port}", f"evil.example:{port}", False),
        (f"http://EVIL.example:{port}", f"evil.example:{port}", False),
        (f"http://127.0.0.1:{port}", f"127.0.0.1:{port}", True),
        (f"http://localhost:{port}", f"LOCALHOST:{port}", True),
        (f"http://127.0.0.1:{port + 1}", f"127.0.0.1:{port}", False),
        ("https://app.example", f"127.0.0.1:{port}", True),  # listed (any case)
    ]:
        status = await raw_handshake(port, {"Origin": origin, "Host": host})
        assert status == (101 if admitted else 403), (origin, host, status)


async def raw_handshake(port: int, headers: dict[str, str], extra: str = "") -> int:
    """The status line's code of a WebSocket handshake sent byte for byte."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [
            "GET / HTTP/1.1",
            "Upgrade: websocket",
            "Connection: Upgrade",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13",
            f"Sec-WebSocket-Protocol: {JSON_SUBPROTOCOL}",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode())
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), WAIT)
        return int(status.split()[1])
    finally:
        writer.close()


async def test_duplicate_credentials_or_origin_headers_are_a_bad_request(
    in_process: Any, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, _ = await in_process()
    port = gateway.config.port
    good = token("alice", subscribe=["*"])
    host = f"127.0.0.1:{port}"
    for extra in [
        f"Authorization: Bearer {good}\r\nAuthorization: Bearer {good}\r\n",
        f"Origin: http://{host}\r\nOrigin: http://{host}\r\n",
    ]:
        status = await raw_handshake(port, {"Host": host}, extra)
        assert status == 400
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert gateway.admitted == 0 and not gateway.per_address


async def test_auth_commands_are_few_and_failures_close(in_process: Any, peers: Peers) -> None:
    """Each auth costs a signature check: a connection gets a handful, then one per
    two seconds; three failures in a row close it."""
    _, url = await in_process()
    good = token("alice", subscribe=["*"])
    client = await peers.open(url, good)
    replies = [await client.request({"type": "auth", "token": good}) for _ in range(10)]
    assert [r["type"] for r in replies[:5]] == ["authenticated"] * 5
    limited = [r for r in replies if r.get("code") == "rate_limited"]
    assert len(limited) >= 4 and all(r["retryAfter"] > 1 for r in limited), replies
    stranger = await peers.open(url)  # no token: may only authenticate
    forged = token("mallory", subscribe=["*"], secret=OTHER_SECRET)
    for _ in range(2):
        reply = await stranger.request({"type": "auth", "token": forged})
        assert reply["code"] == "unauthorized"
    await stranger.send({"type": "auth", "token": forged})  # the third: answered by the close
    assert await stranger.closed() == 4401


async def test_a_numeric_string_exp_still_expires(in_process: Any, peers: Peers) -> None:
    import jwt as pyjwt

    _, url = await in_process(jwt_leeway=0)
    claims = {"sub": "alice", "exp": str(int(time.time()) + 2), "agui": {"subscribe": ["*"]}}
    odd = pyjwt.encode(claims, SECRET, algorithm="HS256")
    client = await peers.open(url, odd)
    await client.ping()
    assert await client.closed(timeout=6) == 4401


async def test_refusals_quote_nothing_in_www_authenticate(in_process: Any) -> None:
    _, url = await in_process()
    response = await refused(url, "not.a.token")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'


def test_ipv6_clients_are_counted_by_their_64() -> None:
    from agui_hub.gateway.admission import client_address as _address

    class Remote:
        def __init__(self, address: Any) -> None:
            self.remote_address = address

    assert _address(Remote(("2001:db8:1:2::5", 1, 0, 0))) == "2001:db8:1:2::/64"  # type: ignore[arg-type]
    assert _address(Remote(("2001:db8:1:2:ffff::9", 1, 0, 0))) == "2001:db8:1:2::/64"  # type: ignore[arg-type]
    assert _address(Remote(("::ffff:10.0.0.7", 1, 0, 0))) == "10.0.0.7"  # type: ignore[arg-type]
    assert _address(Remote(("10.0.0.7", 1))) == "10.0.0.7"  # type: ignore[arg-type]
