"""Publish AG-UI events from Python: straight into a store, or through a gateway.

.. code-block:: python

    from agui_hub.client.publisher import Publisher

    async with Publisher("redis://localhost:6379/0") as publisher:  # or ws://host:8765
        await publisher.publish("t1", {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"})

One API, two transports, picked by the URL's scheme:

* ``redis://``, ``rediss://``, ``memory://``: the publisher opens the store and
  writes through a :class:`~agui_hub.gateway.writer.ThreadWriter`, exactly as the
  gateway does. An agent next to the Redis the gateways share needs no
  gateway round trip. (``memory://`` is this process's own store: useful in
  tests, invisible to any other process.)
* ``ws://``, ``wss://``: the publisher sends the gateway's publish command.
  This is how an agent in another process reaches a hub that runs on the
  embedded in-memory store.

Events may be wire dicts, this package's event models, or the official
``ag_ui.core`` event objects as they are. Each is validated, and each batch is
checked against its thread's sequence rules before anything is stored
(:class:`~agui_hub.errors.InvalidEvent`, :class:`~agui_hub.errors.SequenceError`,
nothing stored). Every event gets an id (yours, or one the publisher makes
up), so a retry after a lost reply never stores an event twice: the publisher
retries by itself while the store or gateway is unreachable, for up to
*retry_for* seconds.

Publishes may be pipelined: calls about one thread that run concurrently
(tasks, ``asyncio.gather``) are stored in the order the calls were made, the
next one not waiting for the reply to the one before. Through a gateway they
share one connection (:meth:`HubClient.publish <agui_hub.client.HubClient.publish>`
has the details: what a reconnect, a refusal or a ``rate_limited`` answer
does to the order); into a store, a call retried after a store failure is
retried before the calls behind it. Connect first (``async with``) so that
the calls made while the connection opens are not overtaken by later ones.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..agui.events import validate_batch
from ..errors import HubUnreachable, ProtocolError, StoreUnavailable
from ..gateway.writer import SequenceCheck, ThreadWriter
from ..store import open_store
from ..store.contract import ThreadStore
from ..wire.codec import Encoding
from ..wire.offsets import Offset, check_thread
from ..wire.protocol import MAX_EVENTS_PER_PUBLISH, check_event_ids
from .credentials import TokenProvider
from .hub_client import HubClient
from .lanes import Outgoing, PublishLane

__all__ = ["Publisher", "SequenceCheck"]

GATEWAY_SCHEMES = frozenset({"ws", "wss"})


class Publisher:
    """Publishes events into threads of a store or a gateway (see the module docstring).

    *sequence* (store URLs only) is :attr:`SequenceCheck.STRICT` (the default)
    or :attr:`SequenceCheck.OFF`; a gateway always checks strictly.
    *retry_for* bounds how long one call keeps retrying while the backend is
    unreachable before it raises :class:`~agui_hub.errors.StoreUnavailable`
    or :class:`~agui_hub.errors.HubUnreachable`. *headers* go into a gateway's
    handshake. *token* (gateway URLs only; ignored for a store) authenticates
    the publisher as for :class:`~agui_hub.client.HubClient`: a JWT, or a
    callable that returns one (sync or async), asked again to renew the
    credentials before they expire and for each reconnection.
    *strict_patches* (store URLs only; a gateway has its own setting) refuses
    a STATE_DELTA or ACTIVITY_DELTA whose patch does not apply
    (:class:`~agui_hub.errors.PatchError`); by default it is stored and
    changes nothing, as the official client takes it (a logged warning).

    Concurrent calls about one thread keep their call order (pipelining: see
    the module docstring).
    """

    def __init__(
        self,
        url: str,
        *,
        sequence: SequenceCheck | str = SequenceCheck.STRICT,
        retry_for: float = 30.0,
        headers: dict[str, str] | None = None,
        encoding: Encoding | str = Encoding.MSGPACK,
        token: str | TokenProvider | None = None,
        strict_patches: bool = False,
    ) -> None:
        self.url = url
        self.sequence = SequenceCheck(sequence)
        self.strict_patches = strict_patches
        self.retry_for = retry_for
        scheme = urlsplit(url).scheme.lower()
        self.via_gateway = scheme in GATEWAY_SCHEMES
        if self.via_gateway and self.sequence is not SequenceCheck.STRICT:
            raise ValueError("a gateway always checks sequences strictly; use a store URL")
        self._headers = headers
        self._token = token  # a credential: private, never in a message
        self._encoding = Encoding(encoding)
        self._client: HubClient | None = None
        self._connecting: asyncio.Future[None] | None = None
        """While a connection is being opened: what every publish waits for."""
        self._lanes: dict[str, PublishLane] = {}
        """Per thread, the calls under way on a store URL (retried in call order)."""
        self._store: ThreadStore | None = None
        self._writer: ThreadWriter | None = None
        if not self.via_gateway:
            self._store = open_store(url)  # ValueError for an unknown scheme
            self._writer = ThreadWriter(
                self._store, sequence=self.sequence, strict_patches=self.strict_patches
            )
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count(1)

    async def __aenter__(self) -> Publisher:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect to the gateway (a store connects on first use).

        Retries for up to *retry_for* seconds while the gateway cannot be
        reached or is busy (no sooner than its ``Retry-After``), then raises
        :class:`~agui_hub.errors.HubUnreachable`; raises
        :class:`~agui_hub.errors.ConnectionRejected` at once when the gateway
        refuses this client (HTTP 401 / 403: the message says why).
        """
        if not self.via_gateway or self._client is not None:
            return
        # One connection for all: concurrent first publishes share it, and
        # go on in the order they were called (the futures' callback order).
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(self._connect_done)
        await asyncio.shield(self._connecting)

    def _connect_done(self, task: asyncio.Future[None]) -> None:
        self._connecting = None
        if not task.cancelled():
            task.exception()  # raised to whoever waited; nobody else must be warned

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_for
        delay = 0.05
        while True:
            # A client that lost its connection reconnects by itself, for ever:
            # each publish is bounded by retry_for instead.
            client = HubClient(
                self.url,
                encoding=self._encoding,
                headers=self._headers,
                give_up_after=None,
                token=self._token,
            )
            try:
                await client.connect()
            except HubUnreachable as exc:
                # A busy gateway (HTTP 429 / 503) says when to come back.
                pause = max(delay, getattr(exc, "retry_after", 0.0))
                if loop.time() + pause > deadline:
                    raise
                await asyncio.sleep(pause)
                delay = min(delay * 2, 2.0)
                continue
            self._client = client
            return

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._store is not None:
            await self._store.close()

    def new_event_id(self) -> str:
        """A fresh event id, unique to this publisher: ``<random prefix>-<counter>``."""
        return f"{self._prefix}-{next(self._counter)}"

    async def publish(self, thread: str, event: Any, *, event_id: str | None = None) -> Offset:
        """Publish one event; returns its offset.

        Pass *event_id* to make the call idempotent across processes (an agent
        that restarts and publishes the same event again); otherwise the
        publisher picks one, which protects its own retries.
        """
        offsets = await self.publish_batch(
            thread, [event], None if event_id is None else [event_id]
        )
        return offsets[0]

    async def publish_batch(
        self, thread: str, events: Iterable[Any], event_ids: Sequence[str] | None = None
    ) -> list[Offset]:
        """Publish several events in order; returns one offset per event.

        A batch of up to 1000 events is stored all or nothing; a longer one
        is sent as consecutive batches of 1000 (each all or nothing, in
        order). Much faster than one call per event when events are ready
        together. An :class:`~agui_hub.errors.InvalidEvent` or
        :class:`~agui_hub.errors.SequenceError` names the event at fault by its
        ``index`` in *events*.
        """
        check_thread(thread)
        wires = validate_batch(events)
        ids = check_event_ids(event_ids, len(wires))
        if ids is None:
            ids = [self.new_event_id() for _ in wires]
        offsets: list[Offset] = []
        for begin in range(0, len(wires), MAX_EVENTS_PER_PUBLISH):
            end = begin + MAX_EVENTS_PER_PUBLISH
            try:
                offsets += await self._publish(thread, wires[begin:end], ids[begin:end])
            except ProtocolError as exc:
                if exc.index is not None:
                    exc.index += begin  # a position in the caller's events
                raise
        return offsets

    async def _publish(
        self, thread: str, wires: list[dict[str, Any]], ids: list[str]
    ) -> list[Offset]:
        if self.via_gateway:
            if self._client is None:
                await self.connect()
            assert self._client is not None
            return await self._client._publish(wires, thread, ids, self.retry_for)
        writer = self._writer
        assert writer is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.retry_for
        delay = 0.05
        # The writer judges calls in the order they reach it; a retry after a
        # store failure waits for the calls before it to be retried first, so
        # that concurrent publishes to a thread keep their order.
        lane = self._lanes.get(thread)
        if lane is None:
            lane = self._lanes[thread] = PublishLane()
        entry = Outgoing()
        lane.entries.append(entry)
        try:
            while True:
                while not lane.may_send(entry, writer):
                    try:
                        await lane.wait_turn(entry, max(0.0, deadline - loop.time()))
                    except TimeoutError:
                        raise StoreUnavailable(
                            f"publish to thread {thread!r} gave up: the publishes before it "
                            f"could not be stored within {self.retry_for:g} s"
                        ) from None
                lane.sent(entry, writer)
                try:
                    return await writer.publish(thread, wires, ids)
                except StoreUnavailable:
                    # The batch may or may not be stored: the same ids make the retry safe.
                    lane.again(entry)
                    if loop.time() + delay > deadline:
                        raise
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
        finally:
            lane.remove(entry)
            if not lane.entries and self._lanes.get(thread) is lane:
                del self._lanes[thread]
