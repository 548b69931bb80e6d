"""HubClient authentication against a real in-process gateway with JWT (docs/client.md).

Tokens are HS256 JWTs minted with :func:`agui_hub.gateway.auth.encode_token`; the
gateway runs with ``jwt_leeway=0`` so that a token of a few seconds expires
when its ``exp`` says. Covered: a token in the handshake, a connection
authenticated afterwards with ``auth``, a token provider asked again on the
reconnect after 4401 (the subscription resumes, nothing lost or repeated),
the automatic refresh that keeps a connection open past its first token,
narrower grants ending one subscription, ``rate_limited`` commands sent again,
and the refusals (HTTP 401 / 429 at the handshake, 4401, 4403).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from agui_hub.client.hub_client import (
    Authenticated,
    HubClient,
    Item,
    Subscribed,
    Subscription,
    ThreadEvent,
)
from agui_hub.client.publisher import Publisher
from agui_hub.errors import (
    CommandRejected,
    ConnectionRejected,
    HubUnreachable,
    RateLimited,
)
from agui_hub.gateway.auth import Action, encode_token
from agui_hub.gateway.commands import CommandHandler
from agui_hub.gateway.connection import Connection
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.protocol import SUBPROTOCOL_MSGPACK, CloseCode

from ..conftest import TIMEOUT_SCALE

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing to arrive."""
SECRET = "test-secret-of-at-least-32-bytes-0123456789"
OTHER_SECRET = "another-secret-of-at-least-32-bytes-98765"

Event = dict[str, Any]


def token(
    subject: str = "alice",
    *,
    ttl: float = 60,
    subscribe: tuple[str, ...] = ("t/*",),
    publish: tuple[str, ...] = ("t/*",),
    secret: str = SECRET,
) -> str:
    return encode_token(secret, subject, subscribe=subscribe, publish=publish, ttl=ttl)


def opening(thread: str, message: str = "m1") -> list[Event]:
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
    ]


def deltas(count: int, *, start: int = 0, message: str = "m1") -> list[Event]:
    return [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": f"w{i} "}
        for i in range(start, start + count)
    ]


class Provider:
    """A token provider that counts its calls; *tokens* picks the token of call n (0-based)."""

    def __init__(self, tokens: Callable[[int], str], *, asynchronous: bool = False) -> None:
        self.tokens = tokens
        self.calls = 0
        self.asynchronous = asynchronous

    def __call__(self) -> str | Awaitable[str]:
        value = self.tokens(self.calls)
        self.calls += 1
        if self.asynchronous:

            async def later() -> str:
                await asyncio.sleep(0)
                return value

            return later()
        return value


# -- gateways and clients -------------------------------------------------------------------------


class Env:
    """The gateways and clients of one test, torn down at its end."""

    def __init__(self) -> None:
        self.gateways: list[Gateway] = []
        self.clients: list[HubClient] = []

    async def gateway(self, **config: Any) -> Gateway:
        config.setdefault("ping_interval", None)
        config.setdefault("jwt_secret", SECRET)
        config.setdefault("jwt_leeway", 0)
        gateway = Gateway(GatewayConfig(host="127.0.0.1", port=0, **config), store=MemoryStore())
        await asyncio.wait_for(gateway.start(), WAIT)
        self.gateways.append(gateway)
        return gateway

    def client(self, gateway: Gateway, **kwargs: Any) -> HubClient:
        """A client of *gateway*, not connected yet."""
        kwargs.setdefault("open_timeout", WAIT)
        kwargs.setdefault("backoff_min", 0.02)
        kwargs.setdefault("backoff_max", 0.2)
        client = HubClient(url(gateway), **kwargs)
        self.clients.append(client)
        return client

    async def connected(self, gateway: Gateway, **kwargs: Any) -> HubClient:
        client = self.client(gateway, **kwargs)
        await asyncio.wait_for(client.connect(), WAIT)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), WAIT)
        for gateway in self.gateways:
            if not gateway._draining:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(gateway.drain(), WAIT)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    try:
        yield e
    finally:
        await e.close()


def url(gateway: Gateway) -> str:
    return f"ws://127.0.0.1:{gateway.config.port}"


def server_connection(gateway: Gateway, client: HubClient) -> Connection:
    """The gateway's side of *client*'s current connection."""
    assert client._link.ws is not None
    port = client._link.ws.local_address[1]
    (conn,) = [c for c in gateway.connections if c.ws.remote_address[1] == port]
    return conn


async def wait_for(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    """Poll *condition* until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def take(sub: Subscription, count: int, timeout: float = WAIT) -> list[Item]:
    async with asyncio.timeout(timeout):
        return [await anext(sub) for _ in range(count)]


async def until_offset(sub: Subscription, offset: str, timeout: float = WAIT) -> list[Item]:
    """Items of *sub* up to the event at *offset*, inclusive."""
    items: list[Item] = []
    async with asyncio.timeout(timeout):
        while True:
            item = await anext(sub)
            items.append(item)
            if isinstance(item, ThreadEvent) and item.offset == offset:
                return items


def thread_events(items: list[Item]) -> list[tuple[str, Event]]:
    return [(i.offset, i.event) for i in items if isinstance(i, ThreadEvent)]


# -- a token in the handshake, auth on an open connection -------------------------------------


async def test_a_token_is_accepted_and_never_logged(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # websockets logs handshake headers and frames at DEBUG
    gateway = await env.gateway()
    secret = token()
    client = await env.connected(gateway, token=secret)
    thread = "t/hello"
    async with client.subscribe(thread, "live") as sub:
        [subscribed] = await take(sub, 1)
        assert isinstance(subscribed, Subscribed)
        events = opening(thread) + deltas(3)
        offsets = await asyncio.wait_for(client.publish(thread, events), WAIT)
        items = await until_offset(sub, offsets[-1])
    assert thread_events(items) == list(zip(offsets, events, strict=True))
    # The same token again in an auth command: who the connection is, until when.
    answer = await client.authenticate(secret)
    assert answer.subject == "alice"
    assert answer.expires is not None and answer.expires > time.time() + 30
    assert answer.grants.allows(Action.PUBLISH, "t/x")
    assert not answer.grants.allows(Action.SUBSCRIBE, "u/x")
    assert server_connection(gateway, client).identity.subject == "alice"  # type: ignore[union-attr]
    signature = secret.rsplit(".", 1)[1]
    # The client's side only (the gateway's websockets logger is the gateway's business).
    logged = "\n".join(
        r.getMessage() for r in caplog.records if r.name in ("websockets.client", "agui_hub.client")
    )
    assert "Authorization: [redacted]" in logged  # the handshake header was logged, redacted
    assert re.search(r"> BINARY \[\d+ bytes\]", logged)  # frames: their size only
    assert signature not in logged
    assert signature not in repr(client) and signature not in repr(answer)


async def test_a_publisher_passes_its_token_provider_on(env: Env) -> None:
    gateway = await env.gateway()
    provider = Provider(lambda n: token(), asynchronous=True)
    thread = "t/published"
    async with Publisher(url(gateway), token=provider) as publisher:
        offsets = await asyncio.wait_for(publisher.publish_batch(thread, opening(thread)), WAIT)
    assert len(offsets) == 2 and provider.calls == 1


async def test_a_connection_without_a_token_authenticates_with_auth(env: Env) -> None:
    gateway = await env.gateway()
    client = await env.connected(gateway)  # no token: the gateway waits for an auth
    thread = "t/later"
    with pytest.raises(CommandRejected) as refused:
        await asyncio.wait_for(client.publish(thread, opening(thread), timeout=WAIT), WAIT)
    assert refused.value.code == "unauthorized"
    answer = await client.authenticate(token(publish=("t/later",)))
    assert answer == Authenticated("alice", answer.expires, answer.grants)
    assert answer.grants.publish == ("t/later",)
    offsets = await asyncio.wait_for(client.publish(thread, opening(thread)), WAIT)
    assert len(offsets) == 2
    # A bad token changes nothing: the connection keeps its identity.
    with pytest.raises(CommandRejected) as bad:
        await client.authenticate(token(secret=OTHER_SECRET))
    assert bad.value.code == "unauthorized"
    with pytest.raises(CommandRejected) as other:
        await client.authenticate(token("bob"))
    assert other.value.code == "forbidden"
    assert len(await asyncio.wait_for(client.publish(thread, deltas(1)), WAIT)) == 1
    assert client.reconnects == 0


async def test_no_auth_in_time_ends_a_client_without_provider(env: Env) -> None:
    gateway = await env.gateway(auth_timeout=0.3)
    client = await env.connected(gateway)
    with pytest.raises(ConnectionRejected) as ended:
        async with asyncio.timeout(WAIT):
            while True:  # a ping needs no identity: it works until the gateway closes
                await client.ping()
                await asyncio.sleep(0.05)
    assert ended.value.close_code == CloseCode.UNAUTHORIZED
    assert "4401" in str(ended.value) and "token=" in str(ended.value)
    await asyncio.sleep(0.2)  # time enough for several reconnects, were there any
    assert client.reconnects == 0


# -- expiry: reconnect with a new token, or refresh before it ---------------------------------


async def test_the_provider_is_asked_again_after_4401_and_the_subscription_resumes(
    env: Env,
) -> None:
    gateway = await env.gateway()
    # The first token expires in 1-2 s; the ones after it last.
    provider = Provider(lambda n: token(ttl=2 if n == 0 else 60))
    client = await env.connected(gateway, token=provider, refresh=False)
    thread = "t/resume"
    writer = ThreadWriter(gateway.store)  # publishes straight into the store, connected or not
    sub = await client.subscribe(thread, "start").open()
    [first] = await take(sub, 1)
    assert isinstance(first, Subscribed)
    published = list(zip(await writer.publish(thread, opening(thread)), opening(thread),
                         strict=True))  # fmt: skip
    # Events keep coming while the gateway closes the connection (4401) and the
    # client reconnects, and a few more after.
    n = 0
    async with asyncio.timeout(WAIT):
        while client.reconnects == 0 or n < 5:
            if client.reconnects:
                n += 1
            events = deltas(1, start=len(published))
            published += zip(await writer.publish(thread, events), events, strict=True)
            await asyncio.sleep(0.05)
    items = await until_offset(sub, published[-1][0])
    assert thread_events(items) == published  # nothing lost, nothing twice, in order
    resumed = [i for i in items if isinstance(i, Subscribed) and i.resumed]
    assert [(i.resumed, i.recovered) for i in resumed] == [(True, True)]
    assert client.close_code == CloseCode.UNAUTHORIZED
    assert client.reconnects == 1 and provider.calls == 2
    await sub.close()


async def test_the_refresh_keeps_the_connection_open_past_the_first_expiry(env: Env) -> None:
    gateway = await env.gateway()
    provider = Provider(lambda n: token(ttl=3), asynchronous=True)
    client = await env.connected(gateway, token=provider)
    first = server_connection(gateway, client).identity
    assert first is not None and first.expires is not None
    thread = "t/refresh"
    async with client.subscribe(thread, "live") as sub:
        await take(sub, 1)
        await asyncio.sleep(max(0.0, first.expires - time.time()) + 1.0)
        # Past the first token's exp: the connection is the same one, renewed.
        assert client.reconnects == 0 and client.close_code is None
        assert provider.calls >= 2
        identity = server_connection(gateway, client).identity
        assert identity is not None and identity.expires is not None
        assert identity.expires > first.expires
        offsets = await asyncio.wait_for(client.publish(thread, opening(thread)), WAIT)
        items = await until_offset(sub, offsets[-1])
    assert [i.offset for i in items if isinstance(i, ThreadEvent)] == offsets
    assert client.reconnects == 0


async def test_a_refresh_with_narrower_grants_ends_that_subscription_only(env: Env) -> None:
    gateway = await env.gateway()
    client = await env.connected(gateway, token=token())
    keep = await client.subscribe("t/keep").open()
    drop = await client.subscribe("t/drop").open()
    assert isinstance((await take(keep, 1))[0], Subscribed)
    assert isinstance((await take(drop, 1))[0], Subscribed)
    answer = await client.authenticate(token(subscribe=("t/keep",)))
    assert answer.grants.subscribe == ("t/keep",)
    with pytest.raises(CommandRejected) as ended:
        await take(drop, 1)
    assert (ended.value.code, ended.value.thread) == ("forbidden", "t/drop")
    offsets = await asyncio.wait_for(client.publish("t/keep", opening("t/keep")), WAIT)
    created, *items = await take(keep, 3)  # the thread's epoch announced, then its events
    assert isinstance(created, Subscribed) and not created.resumed
    assert [i.offset for i in items if isinstance(i, ThreadEvent)] == offsets
    # A reconnect (with the narrower token, the last one that proved the
    # connection) resubscribes the thread that is still granted only.
    server_connection(gateway, client).close_soon(CloseCode.SERVICE_RESTART, "restart")
    [resumed] = await take(keep, 1)
    assert isinstance(resumed, Subscribed) and resumed.resumed and resumed.recovered
    assert client.reconnects == 1
    assert server_connection(gateway, client).threads == {"t/keep"}
    more = await asyncio.wait_for(client.publish("t/keep", deltas(1)), WAIT)
    assert [i.offset for i in await take(keep, 1) if isinstance(i, ThreadEvent)] == more


# -- rate limits ------------------------------------------------------------------------------


async def test_publishes_over_the_events_rate_are_paced_in_order(env: Env) -> None:
    gateway = await env.gateway(max_events_per_second=20)
    client = await env.connected(gateway, token=token())
    refused = 0
    publish_once = client._publishes.send_once

    async def counting(*args: Any) -> dict[str, Any]:
        nonlocal refused
        try:
            return await publish_once(*args)
        except RateLimited:
            refused += 1
            raise

    client._publishes.send_once = counting  # type: ignore[method-assign]
    thread = "t/limited"
    events = opening(thread) + deltas(98)
    began = time.monotonic()
    # Batches of 25 at 20 a second, all sent at once: the gateway reads each
    # when the one before it is paid for, so they are stored in order and
    # none is refused.
    calls = [
        client.publish(thread, events[i : i + 25], [f"e-{i + j}" for j in range(25)])
        for i in range(0, len(events), 25)
    ]
    results = await asyncio.wait_for(asyncio.gather(*calls), WAIT)
    offsets = [o for r in results for o in r]
    assert refused == 0
    assert time.monotonic() - began >= 2.5  # 100 events at 20 per second, a burst of 20
    assert len(set(offsets)) == len(events)
    async with client.subscribe(thread, "start") as sub:
        items = await until_offset(sub, offsets[-1])
    assert thread_events(items) == list(zip(offsets, events, strict=True))  # once each, in order


async def test_rate_limited_subscribes_are_sent_again(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At half a command a second, each one after the first would wait over a
    # second: refused, and sent again by the client after retryAfter.
    refused = 0
    rate_limited = CommandHandler._rate_limited

    def counting(self: Any, *args: Any) -> dict[str, Any]:
        nonlocal refused
        refused += 1
        return rate_limited(self, *args)

    monkeypatch.setattr(CommandHandler, "_rate_limited", counting)
    gateway = await env.gateway(max_commands_per_second=0.5)
    client = await env.connected(gateway, token=token())
    subs = [await client.subscribe(f"t/s{i}").open() for i in range(3)]
    for sub in subs:
        [item] = await asyncio.wait_for(take(sub, 1), WAIT)
        assert isinstance(item, Subscribed) and not item.resumed
    assert refused >= 1
    assert server_connection(gateway, client).threads == {f"t/s{i}" for i in range(3)}
    # Past its deadline the call raises, with the gateway's wait.
    with pytest.raises(RateLimited) as limited:
        await client.ping(timeout=0.3)
    assert limited.value.retry_after > 0.3


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bad signature", "expired"])
async def test_401_at_the_handshake_is_final(env: Env, kind: str) -> None:
    gateway = await env.gateway()
    bad = token(secret=OTHER_SECRET) if kind == "bad signature" else token(ttl=-60)
    provider = Provider(lambda n: bad)
    client = env.client(gateway, token=provider)
    with pytest.raises(ConnectionRejected) as refused:
        await asyncio.wait_for(client.connect(), WAIT)
    assert refused.value.close_code == CloseCode.UNAUTHORIZED
    message = str(refused.value)
    assert message.startswith("the gateway refused the token (HTTP 401: ")
    assert ("signature" if kind == "bad signature" else "expired") in message
    assert bad.rsplit(".", 1)[1] not in message
    assert provider.calls == 1 and client.reconnects == 0 and not gateway.connections


async def test_a_provider_gets_one_more_try_after_a_401_while_reconnecting(env: Env) -> None:
    gateway = await env.gateway()
    # A token that expires soon, then tokens the gateway never accepts.
    provider = Provider(lambda n: token(ttl=2) if n == 0 else token(secret=OTHER_SECRET))
    client = await env.connected(gateway, token=provider, refresh=False)
    sub = await client.subscribe("t/x").open()
    await take(sub, 1)
    with pytest.raises(ConnectionRejected) as refused:
        await take(sub, 1, timeout=WAIT)
    assert refused.value.close_code == CloseCode.UNAUTHORIZED
    assert "refused the token" in str(refused.value)
    assert provider.calls == 3  # the handshake, then two tokens refused in a row


async def test_revoked_credentials_end_the_client_for_good(env: Env, tmp_path: Path) -> None:
    revoked = tmp_path / "revoked"
    revoked.write_text("# revoked subjects and token ids\n")
    gateway = await env.gateway(revocation_file=str(revoked))
    provider = Provider(lambda n: token())
    client = await env.connected(gateway, token=provider)
    sub = await client.subscribe("t/x").open()
    await take(sub, 1)
    revoked.write_text("alice\n")
    assert gateway.check_revocations() == 1
    with pytest.raises(ConnectionRejected) as ended:
        await take(sub, 1)
    assert ended.value.close_code == CloseCode.FORBIDDEN
    assert "revoked" in str(ended.value)
    await asyncio.sleep(0.2)  # time enough for several reconnects, were there any
    assert client.reconnects == 0 and provider.calls == 1
    # A new connection with those credentials is refused at the handshake.
    again = env.client(gateway, token=token())
    with pytest.raises(ConnectionRejected) as refused:
        await asyncio.wait_for(again.connect(), WAIT)
    assert refused.value.close_code == CloseCode.FORBIDDEN  # HTTP 403: revoked


async def test_too_many_connections_at_connect_is_unreachable_for_now(env: Env) -> None:
    gateway = await env.gateway(max_connections_per_address=1)
    await env.connected(gateway, token=token())
    second = env.client(gateway, token=token())
    with pytest.raises(HubUnreachable) as busy:
        await asyncio.wait_for(second.connect(), WAIT)
    assert "HTTP 429" in str(busy.value) and "try again in 5 s" in str(busy.value)
    assert getattr(busy.value, "retry_after", None) == 5.0


async def test_a_reconnect_waits_at_least_retry_after() -> None:
    # A stand-in gateway: a real one answers 429 / 503 with Retry-After 5 s,
    # too long for a test; this one says 1 s, once.
    loop = asyncio.get_running_loop()
    attempts: list[tuple[float, int]] = []
    sockets: list[ServerConnection] = []
    busy = False

    def process_request(ws: ServerConnection, request: Request) -> Response | None:
        nonlocal busy
        assert request.headers.get("Authorization") == "Bearer not-a-jwt"
        if busy:
            busy = False
            attempts.append((loop.time(), 503))
            return Response(503, "Service Unavailable", Headers({"Retry-After": "1"}),
                            b"draining\n")  # fmt: skip
        attempts.append((loop.time(), 101))
        return None

    async def handler(ws: ServerConnection) -> None:
        sockets.append(ws)
        await ws.wait_closed()

    async with serve(
        handler,
        "127.0.0.1",
        0,
        subprotocols=[Subprotocol(SUBPROTOCOL_MSGPACK)],
        process_request=process_request,
    ) as server:
        port = server.sockets[0].getsockname()[1]
        client = HubClient(f"ws://127.0.0.1:{port}", token="not-a-jwt", backoff_min=0.01,
                           backoff_max=0.05)  # fmt: skip
        await asyncio.wait_for(client.connect(), WAIT)
        try:
            busy = True
            await sockets[0].close(CloseCode.SERVICE_RESTART, "restart")
            await wait_for(lambda: client.reconnects == 1)
            assert client.close_code == CloseCode.SERVICE_RESTART
        finally:
            await client.close()
    assert [status for _, status in attempts] == [101, 503, 101]
    assert attempts[2][0] - attempts[1][0] >= 1.0


def test_a_token_and_an_authorization_header_do_not_mix() -> None:
    with pytest.raises(ValueError):
        HubClient("ws://127.0.0.1:1", token="x", headers={"authorization": "Bearer y"})
    with pytest.raises(TypeError):
        HubClient("ws://127.0.0.1:1", token="")
