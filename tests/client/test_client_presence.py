"""Presence in agui_hub.client: ``HubClient.presence()``, ``subscribe(presence=True)``
and the ``client`` map, against real in-process gateways over real WebSockets.

Two gateways share one memory store (as gateways share a Redis), with a short
presence interval so that ``joined`` / ``left`` come within a fraction of a
second. Covered: a presence subscription yields the whole list first (its own
entry and connection id known), then who joins (with the client map they
announced) and who leaves (with what was known of them), and keeps
``sub.presence`` in step; a subscription that did not ask sees no presence
item; ``presence()`` lists everyone across gateways; after a reconnect the
list is replaced (a new own id); count-only and off gateways; a per-subscribe
``client``; ``authenticate()`` carries the client map; ``forbidden`` and
``presence_off`` raise ``CommandRejected``; maps the gateway would refuse raise
``ValueError`` before anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agui_hub.client import (
    HubClient,
    Item,
    PresenceChanged,
    Subscribed,
    Subscription,
    Watcher,
)
from agui_hub.errors import CommandRejected
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.connection import Connection
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.memory import MemoryStore
from agui_hub.wire.protocol import CloseCode

from ..conftest import TIMEOUT_SCALE

pytestmark = pytest.mark.timeout(30)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing to arrive."""
INTERVAL = 0.2
"""The gateways' presence interval: joined / left come within about this."""
SECRET = "presence-test-secret-0123456789-abcdefgh"
ENCODINGS = ["msgpack", "json"]


class Env:
    """Gateways on one memory store, and clients, all closed at the end of a test."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.gateways: list[Gateway] = []
        self.clients: list[HubClient] = []

    async def gateway(self, **config: Any) -> Gateway:
        config.setdefault("ping_interval", None)
        config.setdefault("presence_interval", INTERVAL)
        gateway = Gateway(GatewayConfig(host="127.0.0.1", port=0, **config), store=self.store)
        await asyncio.wait_for(gateway.start(), WAIT)
        self.gateways.append(gateway)
        return gateway

    async def client(self, gateway: Gateway, *, connect: bool = True, **kwargs: Any) -> HubClient:
        kwargs.setdefault("open_timeout", WAIT)
        client = HubClient(f"ws://127.0.0.1:{gateway.config.port}", **kwargs)
        self.clients.append(client)
        if connect:
            await asyncio.wait_for(client.connect(), WAIT)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), WAIT)
        for gateway in self.gateways:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(gateway.drain(), WAIT)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    e = Env()
    try:
        yield e
    finally:
        await e.close()


def server_side(gateway: Gateway, client: HubClient) -> Connection:
    """The gateway's end of *client*'s current connection."""
    assert client._link.ws is not None
    port = client._link.ws.local_address[1]
    (conn,) = [c for c in gateway.connections if c.ws.remote_address[1] == port]
    return conn


async def next_item(sub: Subscription) -> Item:
    return await asyncio.wait_for(anext(sub), WAIT)


async def next_presence(sub: Subscription) -> PresenceChanged:
    """The next PresenceChanged item of *sub* (events and Subscribed items skipped)."""
    async with asyncio.timeout(WAIT):
        while True:
            item = await anext(sub)
            if isinstance(item, PresenceChanged):
                return item


@pytest.mark.parametrize("encoding", ENCODINGS)
async def test_a_presence_subscription_sees_others_join_and_leave(env: Env, encoding: str) -> None:
    first, second = await env.gateway(), await env.gateway()
    alice = await env.client(first, encoding=encoding, client={"name": "A", "device": "laptop"})
    sub = await alice.subscribe("t", presence=True).open()
    subscribed = await next_item(sub)
    assert isinstance(subscribed, Subscribed) and not subscribed.resumed
    listing = await next_item(sub)
    assert isinstance(listing, PresenceChanged)
    assert (listing.kind, listing.count, listing.more, listing.hidden, listing.off) == (
        "presence", 1, False, False, False,
    )  # fmt: skip
    (own,) = listing.entries
    assert listing.connection == own.connection
    assert own.subject == "anonymous" and own.client == {"name": "A", "device": "laptop"}
    assert own.joined is not None and own.joined_at is not None
    assert sub.presence is not None and sub.presence.known
    assert sub.presence.connection == own.connection and sub.presence.me == own
    assert sub.presence.count == 1 and sub.presence.others() == []

    # Bob, on the other gateway of the store, does not ask for presence.
    bob = await env.client(second, encoding=encoding, client={"name": "B"})
    bob_sub = await bob.subscribe("t").open()
    assert isinstance(await next_item(bob_sub), Subscribed)
    joined = await next_presence(sub)
    assert (joined.kind, joined.count) == ("joined", 2)
    (newcomer,) = joined.entries
    assert newcomer.subject == "anonymous" and newcomer.client == {"name": "B"}
    assert newcomer.connection != own.connection
    assert sub.presence.count == 2 and sub.presence.others() == [newcomer]

    # The command lists both, by the time they joined; either client may ask.
    for asker in (alice, bob):
        listed = await asker.presence("t")
        assert (listed.count, listed.more, listed.hidden) == (2, False, False)
        assert [w.connection for w in listed.entries] == [own.connection, newcomer.connection]
        assert listed.entries[1].client == {"name": "B"}
    assert (await alice.presence("t", limit=1)).more is True
    assert (await alice.presence("nobody-here")).count == 0

    # Bob's subscription has no presence item waiting: he did not ask.
    assert not bob_sub._queue
    assert bob_sub.presence is None

    await bob.close()
    left = await next_presence(sub)
    assert (left.kind, left.count) == ("left", 1)
    # The frame names connection and subject only: the rest is what alice knew.
    assert left.entries == (newcomer,)
    assert sub.presence.count == 1 and list(sub.presence.entries) == [own.connection]
    await sub.close()


async def test_after_a_reconnect_the_list_is_replaced(env: Env) -> None:
    gateway = await env.gateway()
    watcher = await env.client(gateway, backoff_min=0.02, backoff_max=0.2)
    other = await env.client(gateway)
    other_sub = await other.subscribe("t").open()
    assert isinstance(await next_item(other_sub), Subscribed)
    sub = await watcher.subscribe("t", presence=True).open()
    first = await next_presence(sub)
    assert first.kind == "presence" and first.count == 2
    before = sub.presence.connection if sub.presence else None

    server_side(gateway, watcher).close_soon(CloseCode.SERVICE_RESTART, "restart")
    resumed = await next_item(sub)
    assert isinstance(resumed, Subscribed) and resumed.resumed
    again = await next_presence(sub)
    assert again.kind == "presence" and again.count == 2
    assert sub.presence is not None and sub.presence.connection not in (None, before)
    assert before not in sub.presence.entries  # the old connection's entry went with it
    assert len(sub.presence.entries) == 2 and sub.presence.me is not None
    assert watcher.reconnects == 1


async def test_a_count_only_gateway_shows_how_many_not_who(env: Env) -> None:
    gateway = await env.gateway(presence="count")
    watcher = await env.client(gateway, client={"name": "A"})
    sub = await watcher.subscribe("t", presence=True).open()
    first = await next_presence(sub)
    assert (first.kind, first.count, first.hidden, first.entries, first.connection) == (
        "presence", 1, True, (), None,
    )  # fmt: skip
    other = await env.client(gateway)
    await other.subscribe("t").open()
    # No joined / left in this mode: the whole (empty) list again, with the new count.
    changed = await next_presence(sub)
    assert (changed.kind, changed.count, changed.hidden) == ("presence", 2, True)
    assert sub.presence is not None and sub.presence.hidden and sub.presence.entries == {}
    assert not sub.presence.more  # nobody is named: that is not "more"
    listed = await watcher.presence("t")
    assert (listed.count, listed.entries, listed.more, listed.hidden) == (2, (), False, True)


async def test_a_gateway_without_presence_says_so(env: Env) -> None:
    gateway = await env.gateway(presence="off")
    client = await env.client(gateway)
    with pytest.raises(CommandRejected) as refused:
        await client.presence("t")
    assert refused.value.code == "presence_off"
    sub = await client.subscribe("t", presence=True).open()
    assert isinstance(await next_item(sub), Subscribed)
    off = await next_item(sub)
    assert isinstance(off, PresenceChanged) and off.off and off.count == 0
    assert sub.presence is not None and sub.presence.off and sub.presence.known
    # The subscription itself works as ever.
    await client.publish("t", [{"type": "RUN_STARTED", "threadId": "t", "runId": "r1"}])
    event = await next_item(sub)
    assert not isinstance(event, PresenceChanged)


async def test_a_subscribe_can_announce_another_client_map(env: Env) -> None:
    gateway = await env.gateway()
    client = await env.client(gateway, client={"name": "default"})
    await client.subscribe("a").open()
    await client.subscribe("b", client={"name": "tab 2", "pinned": True, "n": 2}).open()
    plain = await env.client(gateway)
    await plain.subscribe("a").open()
    for thread, expected in (
        ("a", [{"name": "default"}, None]),
        ("b", [{"name": "tab 2", "pinned": True, "n": 2}]),
    ):
        listed = await client.presence(thread)
        assert [w.client for w in listed.entries] == expected


async def test_authenticate_carries_the_client_map_and_grants_apply(env: Env) -> None:
    gateway = await env.gateway(jwt_secret=SECRET, jwt_leeway=0)
    token = encode_token(SECRET, "alice", subscribe=["open/*"], ttl=60)
    # Opened without a token: the auth command authenticates it, with the client map.
    client = await env.client(gateway, client={"name": "cli"})
    await client.authenticate(token)
    assert [c.client for c in gateway.connections] == [{"name": "cli"}]
    await client.subscribe("open/1").open()
    listed = await client.presence("open/1")
    assert [(w.subject, w.client) for w in listed.entries] == [("alice", {"name": "cli"})]
    with pytest.raises(CommandRejected) as refused:
        await client.presence("closed/1")
    assert refused.value.code == "forbidden"


@pytest.mark.parametrize(
    "client",
    [
        {"nested": {"a": 1}},
        {"list": [1]},
        {"": "empty key"},
        {"k" * 33: "long key"},
        {"big": "x" * 300},
        {"nan": float("nan")},
        ["not", "a", "map"],
    ],
)
async def test_a_client_map_the_gateway_would_refuse_raises_value_error(
    env: Env, client: Any
) -> None:
    with pytest.raises(ValueError):
        HubClient("ws://127.0.0.1:1", client=client)
    gateway = await env.gateway()
    hub = await env.client(gateway)
    with pytest.raises(ValueError):
        hub.subscribe("t", client=client)
    with pytest.raises(ValueError):
        await hub.presence("t", limit=0)


def test_watcher_and_presence_read_what_the_gateway_sends() -> None:
    frame = {
        "type": "presence",
        "thread": "t",
        "count": 3,
        "more": True,
        "entries": [
            {"connection": "g-1", "subject": "alice", "joined": 1764700000123,
             "client": {"name": "web"}},
            {"connection": "g-2", "subject": "bob", "joined": 1764700000456},
            {"subject": "no connection id: left out"},
        ],
        "connection": "g-2",
    }  # fmt: skip
    change = PresenceChanged.from_frame("t", frame)
    assert change is not None and change.connection == "g-2" and change.more
    assert change.entries == (
        Watcher("g-1", "alice", 1764700000123, {"name": "web"}),
        Watcher("g-2", "bob", 1764700000456),
    )
    assert change.entries[0].joined_at is not None
    assert change.entries[0].joined_at.timestamp() == 1764700000.123
    assert change.entries[0].as_json() == frame["entries"][0]  # type: ignore[index]
    assert PresenceChanged.from_frame("t", {"type": "event"}) is None
