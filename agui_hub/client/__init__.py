"""Python clients of the hub: :class:`HubClient` for front ends (subscribe,
resume, snapshots, publish), :class:`~agui_hub.client.publisher.Publisher` for
agents, and :mod:`~agui_hub.client.transcript`, the terminal view of a thread.

    from agui_hub.client import HubClient, Publisher

Everything here talks to a gateway over WebSocket (``ws://``/``wss://``);
``Publisher`` can also write straight into a store (``memory://``,
``redis://``), through the same checks as the gateway.
"""

from .hub_client import (
    Authenticated,
    ClientInfo,
    ClientState,
    HubClient,
    Item,
    LivePresence,
    Position,
    Presence,
    PresenceChanged,
    Snapshot,
    StartFrom,
    Subscribed,
    Subscription,
    ThreadEvent,
    TokenProvider,
    Watcher,
)
from .publisher import Publisher

__all__ = [
    "Authenticated",
    "ClientInfo",
    "ClientState",
    "HubClient",
    "Item",
    "LivePresence",
    "Position",
    "Presence",
    "PresenceChanged",
    "Publisher",
    "Snapshot",
    "StartFrom",
    "Subscribed",
    "Subscription",
    "ThreadEvent",
    "TokenProvider",
    "Watcher",
]
