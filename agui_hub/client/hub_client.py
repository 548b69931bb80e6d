"""An asyncio client for the agui-hub gateway: follow threads, publish, resume.

.. code-block:: python

    from agui_hub.client import HubClient, ThreadEvent

    async with HubClient("ws://127.0.0.1:8765") as hub:
        async for item in hub.subscribe("t1", start="start"):
            if isinstance(item, ThreadEvent):
                print(item.offset, item.event)

One :class:`HubClient` holds one WebSocket connection (msgpack or JSON) and
multiplexes any number of :class:`Subscription` objects over it, one per
thread. When the connection drops (network, a gateway restart, a "slow
consumer" close) the client reconnects by itself with exponential backoff and
full jitter, and resubscribes every thread from the last offset and epoch it
received, so a consumer sees every event exactly once and in order. Each
(re)subscription yields a :class:`Subscribed` item whose ``recovered`` says
whether the resume was complete; when it was not (history trimmed, thread
re-created) a :class:`Snapshot` follows: reset what you built and start again
from its events.

A subscription can expand ``*_CHUNK`` events into START / CONTENT / END
(``expand_chunks=True``) and keep a live :class:`~agui_hub.agui.reducer.ThreadState`
of everything it yielded (``state=True``), for a UI that reads messages and
state at any moment. With ``presence=True`` it also keeps who else watches the
thread (:attr:`Subscription.presence`) and yields a :class:`PresenceChanged`
when someone joins or leaves; :meth:`HubClient.presence` asks once.

The client needs ``websockets``, ``msgpack`` and ``pydantic`` only; it never
imports redis.

Authentication: ``token=`` is a JWT, or a callable returning one (a token
provider, sync or async), sent as ``Authorization: Bearer`` on every
(re)connection. With a provider the client renews the credentials on the open
connection before they expire (an ``auth`` command) and reconnects with a new
token when the gateway closes with 4401; see :class:`HubClient`.

Errors: :class:`~agui_hub.errors.HubUnreachable` (cannot connect, or
reconnecting gave up), :class:`~agui_hub.errors.ConnectionRejected` (the
connection ended for good: the gateway refused the token at the handshake
(HTTP 401 / 403), closed it with 1000, 4403, or 4401 without a token provider,
or it cannot work as configured: a gateway frame over ``max_receive_bytes``,
see :data:`~agui_hub.client.closes.CLIENT_FAULTS`), :class:`~agui_hub.errors.CommandRejected`
(an error frame; ``forbidden`` also ends a subscription whose grant a token
refresh took away), :class:`~agui_hub.errors.RateLimited` (a command still
refused for the rate limit when its deadline came; before that it is sent
again by itself), and for :meth:`HubClient.publish` the same
:class:`~agui_hub.errors.InvalidEvent` / :class:`~agui_hub.errors.SequenceError`
a local publish raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from ..agui.events import validate_batch
from ..agui.runs import RunInfo, RunTree
from ..errors import ClientError
from ..wire.codec import Encoding
from ..wire.offsets import Offset, check_thread
from ..wire.protocol import Position
from .credentials import Authenticated, ClientCredentials, TokenProvider
from .link import ClientState, GatewayLink
from .presence import (
    ClientInfo,
    LivePresence,
    Presence,
    PresenceChanged,
    Watcher,
    check_client_info,
)
from .publishing import PublishPipeline
from .router import SubscriptionRouter
from .subscription import Item, Snapshot, StartFrom, Subscribed, Subscription, ThreadEvent

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
    "Snapshot",
    "StartFrom",
    "Subscribed",
    "Subscription",
    "ThreadEvent",
    "TokenProvider",
    "Watcher",
]

DEFAULT_MAX_QUEUE = 10_000
DEFAULT_MAX_RECEIVE_BYTES = 256 * 1024 * 1024
"""Largest frame a client accepts by default: a snapshot is one frame, as large as
the thread's folded content (tens of MB for a thread with long messages)."""


class HubClient:
    """One connection to a gateway, shared by subscriptions and publishes.

    *url* is the gateway's ``ws://`` or ``wss://`` URL. *encoding* picks the
    subprotocol (``"msgpack"``, the default, or ``"json"``). After a lost
    connection the client retries with backoff between *backoff_min* and
    *backoff_max* seconds (full jitter) and gives up after *give_up_after*
    seconds without a connection (``None``: never). The backoff keeps growing
    over connections that fail early; it starts again from *backoff_min* only
    once a connection proved healthy: a subscription was confirmed
    (``subscribed``), a command was answered, or the connection lasted
    *backoff_max* seconds. So a gateway that accepts connections and then
    fails them is not hammered. *headers* go into the opening handshake.

    *max_frame_bytes* is the largest frame this client sends (match the
    gateway's limit) and *max_receive_bytes* the largest it accepts
    (``None``: no limit). The latter must hold a whole snapshot, which is one
    frame as large as the thread's folded content; a larger frame ends the
    client with :class:`~agui_hub.errors.ConnectionRejected` (close code
    1009) instead of reconnecting into the same frame.

    *token* authenticates the client: a JWT (``str``), or a
    :data:`TokenProvider` (a callable returning a token or an awaitable of
    one), sent as ``Authorization: Bearer <token>`` on every connection
    attempt; a provider is asked for each attempt. With a provider and
    *refresh* (the default) the client renews the credentials before the
    token's ``exp``: when a fifth of its remaining lifetime is left (at most
    60 s before), it asks the provider for a new token and sends it in an
    ``auth`` command on the open connection, so the gateway never has to
    close it. A refresh that fails is logged and tried again shortly; should
    the token expire anyway, the gateway closes with 4401 and the client
    reconnects with a new token and resumes. Without a provider a 4401 is
    final (:class:`~agui_hub.errors.ConnectionRejected`): give a provider to
    a client that lives longer than its token. The token is never logged nor
    put in a repr or an exception message.

    What the gateway's refusals become: HTTP 401 / 403 at the handshake,
    :class:`~agui_hub.errors.ConnectionRejected` (``close_code`` 4401 /
    4403; while reconnecting, a provider gets one more try after a 401);
    HTTP 429 / 503 (too many connections, gateway full or draining),
    :class:`~agui_hub.errors.HubUnreachable` from :meth:`connect`, and while
    reconnecting a retry no earlier than their ``Retry-After``. A
    ``rate_limited`` answer to a command is sent again by itself after the
    gateway's ``retryAfter``, within the call's timeout.

    *client* is what this client tells the others watching a thread about
    itself (presence, :meth:`presence`): a flat map such as ``{"name": "web",
    "device": "laptop"}`` (keys of at most 32 characters; values strings,
    numbers, booleans or ``None``; at most 256 bytes of JSON, else
    :class:`ValueError`). It goes with every subscribe, so reconnects keep it,
    and with :meth:`authenticate`; :meth:`subscribe` takes another one per
    thread.
    """

    def __init__(
        self,
        url: str,
        *,
        encoding: Encoding | str = Encoding.MSGPACK,
        headers: Mapping[str, str] | None = None,
        open_timeout: float = 10.0,
        backoff_min: float = 0.05,
        backoff_max: float = 5.0,
        give_up_after: float | None = None,
        max_frame_bytes: int = 1024 * 1024,
        max_receive_bytes: int | None = DEFAULT_MAX_RECEIVE_BYTES,
        token: str | TokenProvider | None = None,
        refresh: bool = True,
        client: ClientInfo | None = None,
    ) -> None:
        self.url = url
        self.encoding = Encoding(encoding)
        self.headers = dict(headers or {})
        if token is not None:
            if any(name.lower() == "authorization" for name in self.headers):
                raise ValueError("pass the token either as token= or in an Authorization "
                                 "header, not both")  # fmt: skip
            if not callable(token) and not (isinstance(token, str) and token):
                raise TypeError("token is a non-empty string or a callable that returns one")
        self.refresh = refresh
        """Renew the credentials before they expire (with a token provider only)."""
        self.client_info = check_client_info(client)
        """What this client tells the others watching a thread about itself (``client=``)."""
        self.open_timeout = open_timeout
        self.backoff_min = backoff_min
        self.backoff_max = backoff_max
        self.give_up_after = give_up_after
        self.max_frame_bytes = max_frame_bytes
        """Largest frame this client sends (the gateway's limit, 1 MiB by default)."""
        self.max_receive_bytes = max_receive_bytes
        """Largest frame this client accepts (a snapshot is one frame; ``None``: no limit)."""
        # One object per concern; each reads the options above from this client when
        # it needs them. The token is the credentials' alone: it is a credential, never
        # formatted into a message.
        self._credentials = ClientCredentials(self, token)  # the token, and its renewal
        self._link = GatewayLink(self, self._credentials)  # (re)connecting, commands
        self._subscriptions = SubscriptionRouter(self._link, self)  # one per thread
        self._link.threads = self._subscriptions  # frames about threads go there
        self._publishes = PublishPipeline(self._link, self)  # in call order per thread

    @property
    def state(self) -> ClientState:
        """Where the client is in its life."""
        return self._link.state

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-established."""
        return self._link.reconnects

    @property
    def close_code(self) -> int | None:
        """The close code of the last lost connection (``None`` before any): the gateway's,
        the one this client sent when it failed the connection (see
        :data:`~agui_hub.client.closes.CLIENT_FAULTS`), or 1006 when it ended without a
        close frame."""
        return self._link.close_code

    @property
    def connected(self) -> bool:
        return self._link.connected

    # -- life cycle -----------------------------------------------------------------------

    async def __aenter__(self) -> HubClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the connection. Raises :class:`~agui_hub.errors.HubUnreachable` at once
        when the gateway cannot be reached (check the URL and that it runs) or is
        busy (HTTP 429 / 503: try again later), or
        :class:`~agui_hub.errors.ConnectionRejected` when it refuses the client
        (HTTP 401: no token, or one it does not accept: the message says why;
        403: the credentials were revoked or the Origin is not allowed). What a
        token provider raises propagates unchanged."""
        await self._link.connect()
        self._credentials.start_renewing(self._link, self.authenticate)

    async def close(self) -> None:
        """Close the connection and end every subscription (their iteration stops)."""
        if self._link.state is ClientState.CLOSED:
            return
        await self._link.close()
        self._subscriptions.end_all()

    # -- commands ---------------------------------------------------------------------------

    def subscribe(
        self,
        thread: str,
        start: StartFrom = "live",
        *,
        run: str | None = None,
        branch: str | None = None,
        expand_chunks: bool = False,
        state: bool = False,
        max_queue: int = DEFAULT_MAX_QUEUE,
        presence: bool = False,
        client: ClientInfo | None = None,
    ) -> Subscription:
        """Follow *thread* from *start*; iterate the result for its items.

        *run* keeps only that run's events. *branch* (a run id) keeps only the
        branch that ends with that run, then the runs that continue it as they
        start (snapshots fold that branch only; :attr:`Subscription.branch`
        follows its latest run, and a resume asks for it): one version of a
        conversation with regenerated or edited turns (docs/protocol.md).
        *expand_chunks* turns chunk events
        into START / CONTENT / END; *state* keeps :attr:`Subscription.state`
        folded. At most *max_queue* items wait for the consumer; past that the
        subscription stops taking frames and resubscribes from where it
        stopped once the consumer caught up (nothing is lost). One
        subscription per thread and client.

        *presence* keeps who watches the thread in :attr:`Subscription.presence`
        (a :class:`LivePresence`: ``count``, ``entries`` by connection id, this
        connection's own id) and yields a :class:`PresenceChanged` item for each
        change: the whole list first (again after each reconnect: replace what you
        had), then who ``joined`` and who ``left``, at most once a second (the
        gateway's ``--presence-interval``). On a gateway that keeps no presence the
        one such item has ``off=True``. *client* replaces the client's ``client=``
        map for this thread.
        """
        check_thread(thread)
        if start not in ("live", "start", "snapshot") and not isinstance(start, Position):
            raise ValueError('start is "live", "start", "snapshot" or a Position')
        if thread in self._subscriptions:
            raise ValueError(f"already subscribed to thread {thread!r} on this client")
        if run is not None and branch is not None:
            raise ValueError("run and branch do not go together")
        if max_queue < 2:
            raise ValueError("max_queue must be at least 2")
        client_info = self.client_info if client is None else check_client_info(client)
        return Subscription(
            self, thread, start, host=self._subscriptions, run=run, branch=branch,
            expand_chunks=expand_chunks, state=state, max_queue=max_queue,
            presence=presence, client_info=client_info,
        )  # fmt: skip

    async def publish(
        self,
        thread: str,
        events: Iterable[Any],
        event_ids: Iterable[str] | None = None,
        *,
        timeout: float | None = None,
    ) -> list[Offset]:
        """Publish events through the gateway; returns one offset per event.

        Events are wire dicts or event models (ours or ``ag_ui.core``'s),
        checked locally first (:class:`~agui_hub.errors.InvalidEvent`). At most
        1000 per call, stored all or nothing. Without *event_ids* the client
        makes some up, so that when the connection drops before the reply the
        retry (after reconnecting, with the same ids) never stores twice. The
        gateway's verdicts raise as locally: :class:`~agui_hub.errors.SequenceError`,
        :class:`~agui_hub.errors.InvalidEvent`. Gives up after *timeout* seconds
        (default: the client's *give_up_after*) with
        :class:`~agui_hub.errors.HubUnreachable`.

        Publishes may be pipelined: calls about one thread that run
        concurrently (tasks, ``asyncio.gather``) are sent without waiting for
        each other's replies, in the order the calls were made (the order
        their coroutines start), and the gateway stores and answers them in
        that order. Those not answered when the connection drops are sent
        again after the reconnect, with the same event ids, in the same
        order and before any later one: a drop never reorders a thread's
        events. A publish the gateway refuses raises in its own call; the
        ones after it are judged as if it had never been sent. One caveat: a
        publish answered ``rate_limited`` or ``store_unavailable`` is sent
        again before the later ones not sent yet, but later ones already
        sent may be stored before it (or refused, when they continue it);
        await each publish (or send one batch) where even that must not
        happen.
        """
        check_thread(thread)
        return await self._publish(validate_batch(events), thread,
                                   event_ids, timeout)  # fmt: skip

    async def _publish(
        self,
        wires: list[dict[str, Any]],
        thread: str,
        event_ids: Iterable[str] | None,
        timeout: float | None,
    ) -> list[Offset]:
        """:meth:`publish` of events already validated (the Publisher's path)."""
        return await self._publishes.publish(wires, thread, event_ids, timeout)

    async def ping(self, *, timeout: float | None = None) -> float:
        """Round trip of a protocol ping, in seconds."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        deadline = began + (timeout if timeout is not None else self.open_timeout)
        await self._link.request({"type": "ping"}, deadline)
        return loop.time() - began

    async def authenticate(self, token: str, *, timeout: float | None = None) -> Authenticated:
        """Send *token* in an ``auth`` command: authenticate a connection opened
        without a token, or renew its credentials before they expire.

        Returns who the connection is now, until when, and its grants; a
        subscription the new grants no longer cover ends with
        :class:`~agui_hub.errors.CommandRejected` (``forbidden``). Raises
        :class:`~agui_hub.errors.CommandRejected` with ``code``
        ``unauthorized`` (the token is invalid or expired: the connection keeps
        its previous credentials; get another token) or ``forbidden`` (a token
        for another subject than the connection's: use another client for it),
        and :class:`~agui_hub.errors.HubUnreachable` without an answer within
        *timeout* seconds (default: *open_timeout*). A client without a token
        provider sends *token* on its later reconnections too. (With a
        provider the client does this by itself, see :class:`HubClient`.)
        """
        if not isinstance(token, str) or not token:
            raise ValueError("the token is a non-empty string")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if timeout is not None else self.open_timeout)
        command: dict[str, Any] = {"type": "auth", "token": token}
        if self.client_info is not None:
            command["client"] = self.client_info
        reply = await self._link.request(command, deadline)
        if reply.get("type") != "authenticated":
            raise ClientError(f"the gateway answered auth with a {reply.get('type')!r} frame")
        result = Authenticated.from_reply(reply)
        self._credentials.authenticated(token, result.expires)
        return result

    async def run(
        self,
        thread: str,
        agent: str,
        *,
        messages: Iterable[Any] = (),
        state: Any = None,
        tools: Iterable[Any] = (),
        context: Iterable[Any] = (),
        forwarded_props: Any = None,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Ask the gateway to run upstream agent *agent* in *thread* (docs/bridge.md).

        The gateway builds the run's input from the thread (its messages, then
        *messages*; its state, unless *state* is given; ``parentRunId`` its
        latest run) and relays the agent's events into the thread: subscribe
        to follow them. With *parent_run_id*, from the branch that ends with
        that run instead, as of its end: regenerate an answer with the parent
        of the run that gave it (and that run's user message in *messages*),
        edit a message with the parent of the run that carried it (and the
        edited message). Returns the ``running`` reply (``thread``, ``agent``,
        ``runId``, ``parentRunId``) once the run is going. Raises
        :class:`~agui_hub.errors.CommandRejected` with ``code``
        ``unknown_agent``, ``unknown_run``, ``run_active``, ``too_many_runs``,
        ``forbidden`` or ``invalid_event`` (a message that is not AG-UI). Not sent again after a
        dropped connection (pass *run_id* and check the thread before retrying).
        """
        check_thread(thread)
        command: dict[str, Any] = {
            "type": "run",
            "thread": thread,
            "agent": agent,
            "messages": [_wire_message(m) for m in messages],
            "tools": list(tools),
            "context": list(context),
        }
        if state is not None:
            command["state"] = state
        if forwarded_props is not None:
            command["forwardedProps"] = forwarded_props
        if run_id is not None:
            command["runId"] = run_id
        if parent_run_id is not None:
            command["parentRunId"] = parent_run_id
        deadline = asyncio.get_running_loop().time() + (
            timeout if timeout is not None else self.open_timeout
        )
        return await self._link.request(command, deadline)

    async def cancel(
        self,
        thread: str,
        run_id: str | None = None,
        *,
        abandoned: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Cancel the bridged run going in *thread* (only *run_id*, when given).

        Returns the ``cancelled`` reply once the run has ended (its RUN_ERROR
        ``AGUI_HUB_RUN_CANCELLED`` is stored). Raises
        :class:`~agui_hub.errors.CommandRejected` ``no_active_run`` when the
        gateway runs none there (runs are cancelled on the gateway that started
        them) or ``forbidden``.

        With *abandoned*: end a run that the thread holds open and that no
        gateway relays any more (its gateway crashed): a RUN_ERROR
        ``AGUI_HUB_RUN_ABANDONED`` is appended (docs/bridge.md).
        """
        check_thread(thread)
        command: dict[str, Any] = {"type": "cancel", "thread": thread}
        if abandoned:
            command["abandoned"] = True
        if run_id is not None:
            command["runId"] = run_id
        deadline = asyncio.get_running_loop().time() + (
            timeout if timeout is not None else max(self.open_timeout, 30.0)
        )
        return await self._link.request(command, deadline)

    async def runs(
        self, thread: str, *, limit: int = 1000, timeout: float | None = None
    ) -> RunTree:
        """The runs of *thread* as a tree (its newest *limit* runs; the tree's
        ``more`` says whether older ones were left out): each run's id, the run
        it continues, status, first and last offsets and input preview
        (docs/protocol.md, ``runs``). Raises
        :class:`~agui_hub.errors.CommandRejected` ``forbidden`` without the
        read grant."""
        check_thread(thread)
        command: dict[str, Any] = {"type": "runs", "thread": thread, "limit": limit}
        deadline = asyncio.get_running_loop().time() + (
            timeout if timeout is not None else self.open_timeout
        )
        reply = await self._link.request(command, deadline)
        return RunTree(
            (RunInfo.from_json(run) for run in reply.get("runs", [])),
            more=bool(reply.get("more")),
        )

    async def presence(
        self, thread: str, limit: int = 100, *, timeout: float | None = None
    ) -> Presence:
        """Who watches *thread* now, on every gateway of the store: ``count``, the
        first *limit* (1 to 1000) ``entries`` by the time they joined (each a
        :class:`Watcher`: ``connection``, ``subject``, ``joined``, ``client``),
        ``more`` when some were left out, ``hidden`` when the gateway shows the
        count only. A subscription of this client to the thread is in it too. To
        follow the changes, subscribe with ``presence=True`` instead.

        Raises :class:`~agui_hub.errors.CommandRejected` with ``code``
        ``presence_off`` (the gateway keeps no presence: ``--presence off``) or
        ``forbidden`` (no read grant for the thread), and
        :class:`~agui_hub.errors.HubUnreachable` without an answer within
        *timeout* seconds (default: *open_timeout*).
        """
        check_thread(thread)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= 1000:
            raise ValueError("limit is an integer from 1 to 1000")
        command: dict[str, Any] = {"type": "presence", "thread": thread, "limit": limit}
        deadline = asyncio.get_running_loop().time() + (
            timeout if timeout is not None else self.open_timeout
        )
        reply = await self._link.request(command, deadline)
        return Presence.from_reply(reply)

    def new_event_ids(self, count: int) -> list[str]:
        """Fresh event ids, unique to this client: ``<random prefix>-<counter>``."""
        return self._publishes.new_event_ids(count)


def _wire_message(message: Any) -> Any:
    """A message model (ours or ``ag_ui.core``'s) as its wire dict; a dict as it is."""
    dump = getattr(message, "model_dump", None)
    if dump is not None:
        return dump(mode="json", by_alias=True, exclude_none=True)
    return message
