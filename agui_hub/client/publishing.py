"""Publishing through the gateway: pipelined per thread, in call order, retried safely.

:class:`PublishPipeline` carries :meth:`HubClient.publish
<agui_hub.client.HubClient.publish>` (whose docstring states the ordering
guarantees) over the client's :class:`~agui_hub.client.link.GatewayLink`:
one :class:`~agui_hub.client.lanes.PublishLane` per thread keeps concurrent
calls in call order, and a publish whose reply was lost goes again with the
same event ids, so it is never stored twice.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Iterable
from typing import Any

from ..errors import ClientError, HubUnreachable, PayloadTooLarge, RateLimited, StoreUnavailable
from ..wire.codec import encode
from ..wire.offsets import Offset
from ..wire.protocol import MAX_EVENTS_PER_PUBLISH, check_event_ids
from .lanes import Outgoing, PublishLane
from .link import ConnectionLost, GatewayLink
from .retry import Backoff, rate_limited_pause
from .settings import ClientSettings

__all__ = ["PublishPipeline"]

_LONGEST_ID = 2**63 - 1


class PublishPipeline:
    """The publishes of one client over its *link*; *settings* give the frame limit,
    the default deadline and the backoff between attempts."""

    def __init__(self, link: GatewayLink, settings: ClientSettings) -> None:
        self._link = link
        self._settings = settings
        self.lanes: dict[str, PublishLane] = {}
        """Per thread, its unanswered publishes (sent in call order)."""
        self._event_ids = itertools.count(1)
        self._id_prefix = secrets.token_hex(8)

    def new_event_ids(self, count: int) -> list[str]:
        """Fresh event ids, unique to this client: ``<random prefix>-<counter>``."""
        return [f"{self._id_prefix}-{next(self._event_ids)}" for _ in range(count)]

    async def publish(
        self,
        wires: list[dict[str, Any]],
        thread: str,
        event_ids: Iterable[str] | None,
        timeout: float | None,
    ) -> list[Offset]:
        """Publish events already validated; returns one offset per event (see
        :meth:`HubClient.publish <agui_hub.client.HubClient.publish>`)."""
        if not wires:
            return []
        if len(wires) > MAX_EVENTS_PER_PUBLISH:
            raise ValueError(f"at most {MAX_EVENTS_PER_PUBLISH} events per publish")
        ids = check_event_ids(None if event_ids is None else list(event_ids), len(wires))
        if ids is None:
            ids = self.new_event_ids(len(wires))
        settings = self._settings
        command = {"type": "publish", "thread": thread, "events": wires, "eventIds": ids}
        # Measured with the longest id this client could send: the gateway closes
        # the whole connection (1009) for a frame over its limit.
        size = len(encode({**command, "id": _LONGEST_ID}, settings.encoding))
        if size > settings.max_frame_bytes:
            raise PayloadTooLarge(size, settings.max_frame_bytes)
        loop = asyncio.get_running_loop()
        limit = timeout if timeout is not None else settings.give_up_after
        deadline = None if limit is None else loop.time() + limit
        backoff = Backoff(settings.backoff_min, settings.backoff_max)
        # In line before the first await: calls made in this order are sent in it.
        lane = self.lanes.get(thread)
        if lane is None:
            lane = self.lanes[thread] = PublishLane()
        entry = Outgoing()
        lane.entries.append(entry)
        try:
            while True:
                try:
                    reply = await self.send_once(lane, entry, command, deadline)
                except (ConnectionLost, StoreUnavailable) as exc:
                    # The batch may or may not be stored: the same ids make the retry safe.
                    delay = backoff.next_delay()
                    if deadline is not None and loop.time() + delay > deadline:
                        if isinstance(exc, StoreUnavailable):
                            raise
                        raise HubUnreachable(f"publish to {settings.url} gave up: {exc}") from None
                    await asyncio.sleep(delay)
                    continue
                except RateLimited as exc:
                    await asyncio.sleep(rate_limited_pause(exc, deadline))
                    continue
                offsets = reply.get("offsets")
                if not isinstance(offsets, list) or len(offsets) != len(wires):
                    raise ClientError(f"the gateway answered a publish with {reply!r}")
                return offsets
        finally:
            lane.remove(entry)
            if not lane.entries and self.lanes.get(thread) is lane:
                del self.lanes[thread]

    async def send_once(
        self,
        lane: PublishLane,
        entry: Outgoing,
        command: dict[str, Any],
        deadline: float | None,
    ) -> dict[str, Any]:
        """Send a publish once the ones before it in *lane* are sent; await its reply."""
        loop = asyncio.get_running_loop()
        while True:
            ws = await self._link.wait_connected(deadline)
            if lane.may_send(entry, ws):
                break
            try:
                await lane.wait_turn(entry, None if deadline is None else deadline - loop.time())
            except TimeoutError:
                raise HubUnreachable(
                    f"publish to {self._settings.url} gave up: the publishes before it to "
                    "the same thread were not sent in time"
                ) from None
        # Marked before the send: the next publish in the lane may send as soon
        # as this one yields, and by then this frame is in the socket's buffer.
        lane.sent(entry, ws)
        try:
            return await self._link.exchange(ws, command, deadline)
        except ConnectionLost:
            lane.lost(ws)
            lane.again(entry)
            raise
        except (RateLimited, StoreUnavailable):
            lane.again(entry)
            raise
