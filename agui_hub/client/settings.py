"""What the client's collaborators read from its configuration.

:class:`~agui_hub.client.HubClient` keeps its options as plain attributes
(documented there); the connection, the subscriptions and the publish
pipeline are handed the client itself as a :class:`ClientSettings` and read
them when they need them, so an option changed on the client applies to the
next attempt as it always did.
"""

from __future__ import annotations

from typing import Protocol

from ..wire.codec import Encoding

__all__ = ["ClientSettings"]


class ClientSettings(Protocol):
    """The options of one client (see :class:`~agui_hub.client.HubClient` for each)."""

    url: str
    encoding: Encoding
    headers: dict[str, str]
    open_timeout: float
    backoff_min: float
    backoff_max: float
    give_up_after: float | None
    max_frame_bytes: int
    max_receive_bytes: int | None
    refresh: bool
