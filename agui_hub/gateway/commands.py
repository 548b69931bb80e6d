"""What a WebSocket connection's commands do: read, paced, authorized, carried out.

Each :class:`~agui_hub.gateway.connection.Connection` hands the frames it
reads to its :class:`CommandHandler`, which parses them
(:func:`~agui_hub.wire.protocol.parse_command`), holds the connection to its
rates (:class:`RateLimit`), carries out ``auth`` and ``ping`` at once and
starts every other command in a task of its own, in order per thread. The
replies go back through the connection's send queue; the handler never
touches the socket.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import OrderedDict
from typing import Any, Protocol

from ..agui.patch import WorkBudget
from ..errors import (
    AguiHubError,
    Forbidden,
    PresenceOff,
    ProtocolError,
    RateLimited,
    StoreUnavailable,
    Unauthorized,
)
from ..wire.protocol import (
    Auth,
    Cancel,
    CloseCode,
    Command,
    CommandError,
    ListRuns,
    Ping,
    Position,
    Presence,
    Publish,
    Run,
    Subscribe,
    Unsubscribe,
    authenticated_frame,
    cancelled_frame,
    error_frame,
    parse_command,
    pong_frame,
    presence_frame,
    published_frame,
    running_frame,
    runs_frame,
    unsubscribed_frame,
)
from .auth import (
    ANONYMOUS_SUBJECT,
    Action,
    Authenticator,
    Credentials,
    Identity,
    TokenSource,
    scoped_event_id,
)
from .config import GatewayConfig
from .fanout.channels import Hub, Subscriber
from .presence import PresenceMode, PresenceTracker
from .reporting import Counters
from .run_access import RunAccess, require_publish

__all__ = ["CommandHandler", "CommandHost", "RateLimit", "Session", "ThreadWorkRates"]

log = logging.getLogger("agui_hub.server")

PACE_LIMIT = 1.0
"""Longest a connection over its rates is paced for one frame; a frame that
would have to wait longer is refused with ``rate_limited`` instead.
Publishes are paced however long it takes (a refusal would let the
publishes after it overtake it)."""

OFF_LOOP_FRAME_BYTES = 32 * 1024
"""Client frames this large or larger are decoded and checked in a worker
thread, off the event loop (a 32 kB frame of empty arrays takes about 3 ms)."""

MAX_COMMANDS_IN_FLIGHT = 32
"""Commands one connection may have under way at once; its next frame is read
when one of them is done (the client's own backpressure)."""

AUTHS_PER_SECOND = 0.5
"""``auth`` commands a connection may send per second, after a burst of AUTH_BURST."""

AUTH_BURST = 5.0

MAX_FAILED_AUTHS = 3
"""Failed ``auth`` commands in a row after which a connection is closed (4401)."""


class RateLimit:
    """A token bucket: *rate* per second, a burst of *burst* (default: one second's worth).

    A request larger than the bucket (a publish of many events under a low
    limit) is let through when the bucket is not empty and leaves it in
    debt, so the average rate still holds and no request is refused for ever.
    """

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, *, burst: float | None = None) -> None:
        self.rate = rate
        self.burst = rate if burst is None else burst
        self._tokens = self.burst
        self._at = time.monotonic()

    def take(self, count: int) -> float:
        """Take *count* tokens: 0.0, or the seconds to wait before there are some.

        ``take(0)`` takes nothing: it says whether the bucket is in debt.
        """
        self._refill()
        if self._tokens <= 0:
            return max(0.001, -self._tokens / self.rate + 1 / self.rate)
        self._tokens -= count
        return 0.0

    def spend(self, count: int) -> None:
        """Take *count* tokens that were spent already (work known once it is
        done), into debt if need be: the next :meth:`take` waits for it."""
        self._refill()
        self._tokens -= count

    def full(self) -> bool:
        """Whether the bucket holds its whole burst (a new one would be the same)."""
        self._refill()
        return self._tokens >= self.burst

    def _refill(self) -> None:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now


MAX_THREAD_BUCKETS = 10_000
"""Threads whose state work a gateway remembers (:class:`ThreadWorkRates`); past
it, the one charged longest ago with no publish waiting is forgotten."""


class _ThreadWork:
    """One thread's work bucket, and the line of publishes waiting for it."""

    __slots__ = ("bucket", "line", "waiting")

    def __init__(self, bucket: RateLimit) -> None:
        self.bucket = bucket
        self.line: asyncio.Lock | None = None
        """Made when a publish has to wait; the next ones wait behind it (FIFO)."""
        self.waiting = 0
        """Publishes in :attr:`line` (waiting or passing): while any, the entry stays."""


class ThreadWorkRates:
    """The state work of each thread, whoever publishes into it: a bucket per
    thread of *rate* units per second, shared by every connection of the gateway.

    A publish waits in :meth:`wait` while its thread is in debt, behind the
    publishes that came to wait before it (first come, first served; never
    refused), and what it cost is charged (:meth:`charge`) once it is judged. At most
    *max_threads* threads are remembered, plus those with a publish waiting
    (each is a command under way, bounded per connection): an entry costs
    about 250 bytes and its thread's name, and the one charged longest ago is forgotten first,
    debt and all. A bucket that is full again is forgotten as soon as it is
    the oldest, so memory follows the threads being published into.
    """

    __slots__ = ("_threads", "burst", "max_threads", "rate")

    def __init__(
        self, rate: float, *, burst: float | None = None, max_threads: int = MAX_THREAD_BUCKETS
    ) -> None:
        self.rate = rate
        self.burst = rate if burst is None else burst
        self.max_threads = max_threads
        self._threads: OrderedDict[str, _ThreadWork] = OrderedDict()

    def __len__(self) -> int:
        return len(self._threads)

    async def wait(self, thread: str) -> None:
        """Return once *thread* is out of debt and the publishes that waited
        before this one have passed; at once (without awaiting) when nobody
        waits and the thread is not in debt.

        Cancelled while it waits (its connection gone), it leaves the line
        and the next publish in it goes on.
        """
        entry = self._threads.get(thread)
        if entry is None or (entry.line is None and entry.bucket.take(0) == 0.0):
            return
        if entry.line is None:
            entry.line = asyncio.Lock()  # asyncio's lock wakes its waiters in order
        entry.waiting += 1
        try:
            async with entry.line:
                # The bucket is read again after every sleep: others charged it meanwhile.
                while wait := entry.bucket.take(0):
                    await asyncio.sleep(wait)
        finally:
            entry.waiting -= 1
            if entry.waiting == 0:
                entry.line = None

    def charge(self, thread: str, units: int) -> None:
        """Spend *units* of *thread*'s bucket (work already done), into debt if need be."""
        threads = self._threads
        entry = threads.get(thread)
        if entry is None:
            if units <= 0:
                return  # nothing to remember: a new bucket is full
            entry = threads[thread] = _ThreadWork(RateLimit(self.rate, burst=self.burst))
        else:
            threads.move_to_end(thread)
        entry.bucket.spend(units)
        self._forget(thread)

    def _forget(self, charged: str) -> None:
        # The oldest entries go when full again (a new one would be the same),
        # or past max_threads whatever they owe; one with a publish waiting
        # stays (it moves to the end). A few at most per charge: bounded work,
        # and still faster than one new entry per charge fills the table.
        threads = self._threads
        for _ in range(4):
            oldest, entry = next(iter(threads.items()))
            if oldest == charged:
                return  # the only one
            if entry.waiting:
                if len(threads) <= self.max_threads:
                    return
                threads.move_to_end(oldest)
            elif len(threads) > self.max_threads or entry.bucket.full():
                del threads[oldest]
            else:
                return


class Session(Subscriber, Protocol):
    """The connection a :class:`CommandHandler` acts for
    (a :class:`~agui_hub.gateway.connection.Connection`): a subscriber of the hub
    with an identity, its subscribed threads and a way to reply."""

    identity: Identity | None
    """Who it is (``None``: not yet; only ``auth`` and ``ping`` are answered)."""
    threads: set[str]
    """The threads it is subscribed to."""
    client: dict[str, Any] | None
    """What it told others about itself (``auth``'s ``client``; presence)."""

    @property
    def remote(self) -> str:
        """The client's address (for the log)."""
        ...

    def reply(self, frame: dict[str, Any]) -> None:
        """Queue a reply (counted when it is an error)."""
        ...

    def start_clock(self) -> None:
        """Arm the deadline of the session's identity (its expiry)."""
        ...


class CommandHost(Protocol):
    """What a :class:`CommandHandler` needs of its gateway
    (a :class:`~agui_hub.gateway.server.Gateway`)."""

    @property
    def config(self) -> GatewayConfig: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def hub(self) -> Hub: ...
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def runs(self) -> RunAccess: ...
    @property
    def thread_work(self) -> ThreadWorkRates:
        """The state work rate of each thread, shared by the gateway's connections."""
        ...

    @property
    def presence(self) -> PresenceTracker:
        """Who watches each thread, on every gateway of the store."""
        ...


def wake(future: asyncio.Future[None] | None) -> None:
    """Wake whoever awaits *future* (a writer's or a drain's waiter), once; a
    future already done, or none, is left alone. Connections, commands and SSE
    streams all wake their waiters with it."""
    if future is not None and not future.done():
        future.set_result(None)


class CommandHandler:
    """One connection's commands, from the frame read to the reply queued.

    Commands run concurrently, each in a task of its own, in order per thread:
    a command about a thread starts when the previous command about the same
    thread is done (a publish behind a publish: once that one is in the
    writer's queue, so that the writer can store them together; its reply
    still comes after the previous one), so publishes to one thread are
    stored and answered in the order sent, and a ``ping`` (or a command about
    another thread) is never stuck behind a slow publish.

    The connection calls :meth:`receive` for each frame it reads (in order,
    one at a time), and :meth:`cancel` once it is gone.
    """

    # Slots, and task bookkeeping made only on the first command that awaits:
    # an idle connection stays small.
    __slots__ = (
        "_auths",
        "_commands",
        "_events",
        "_failed_auths",
        "_lanes",
        "_tasks",
        "_work",
        "host",
        "session",
    )

    def __init__(self, session: Session, host: CommandHost) -> None:
        self.session = session
        self.host = host
        config = host.config
        self._commands = RateLimit(config.max_commands_per_second)
        self._events = RateLimit(config.max_events_per_second)
        # What publishes cost in state work is known once they are judged: it
        # is spent afterwards, and the next publish waits while it is in debt.
        # A burst of one publish's budget at least, so that a publish the
        # limits allow never waits on an idle connection.
        self._work = RateLimit(
            config.max_state_work_per_second,
            burst=max(config.max_state_work_per_second, float(config.state_max_work)),
        )
        # A signature check costs ~0.1 ms of CPU: an unauthenticated client
        # gets a handful, not a thousand a second.
        self._auths = RateLimit(AUTHS_PER_SECOND, burst=AUTH_BURST)
        self._failed_auths = 0
        self._tasks: set[asyncio.Task[None]] | None = None
        """Commands under way (made on the first command that awaits)."""
        self._lanes: dict[str, tuple[asyncio.Task[None], asyncio.Future[None] | None]] | None = None
        """Per thread, the last command task about it (the next one waits for it)
        and, for a publish, the future resolved once it is in the writer's queue
        (a publish right behind it waits only for that)."""

    @property
    def under_way(self) -> bool:
        """Whether a command is under way (the connection is not idle)."""
        return bool(self._tasks)

    def cancel(self) -> None:
        """Cancel every command under way (the connection is gone)."""
        if self._tasks:
            for task in list(self._tasks):
                task.cancel()

    # Reading and pacing ----------------------------------------------------------------------

    async def receive(self, data: bytes | str) -> None:
        """Take one client frame: answer it now, or start its command.

        Returns when the command is started (or answered), not when it is
        done; waits first while :data:`MAX_COMMANDS_IN_FLIGHT` are under way.
        An ``auth`` is carried out before the next frame is read, so the
        commands after it are judged by the identity it gave.
        """
        session = self.session
        counters = self.host.counters
        try:
            config = self.host.config
            parse = functools.partial(
                parse_command,
                data,
                session.encoding,
                max_size=config.max_frame_bytes,
                max_values=config.max_frame_values,
            )
            if len(data) < OFF_LOOP_FRAME_BYTES:
                command = parse()
            else:
                # Decoding and checking a large frame takes milliseconds per
                # 100 kB: in a worker thread, the event loop gets the
                # interpreter back every few milliseconds meanwhile (this
                # connection reads its next frame only once it is done).
                command = await asyncio.to_thread(parse)
        except CommandError as exc:
            # Malformed frames count too: what a client sends is bounded in
            # the work it causes, not only in its size.
            counters.command_types[CommandError] += 1
            await self._paced(self._commands, 1)
            session.reply(error_frame(exc.code, str(exc), exc.command_id))
            return
        counters.commands += 1
        counters.command_types[type(command)] += 1
        if isinstance(command, Auth):
            # A signature check each: refused past the rate, never paced (and
            # failures are counted towards the close).
            wait = self._commands.take(1) or self._auths.take(1)
        elif isinstance(command, Publish):
            # As much work as its events: a publish counts against the events
            # rate only, so that single-event publishes can be pipelined. Paced
            # however long it takes, never refused: a refusal in the middle of
            # a pipeline would let the publishes after it overtake it.
            wait = await self._paced(self._events, len(command.events), limit=math.inf)
            wait = wait or await self._paced(self._work, 0, limit=math.inf)
        else:
            wait = await self._paced(self._commands, 1)
        if wait:
            session.reply(self._rate_limited(command, wait))
            return
        if not session.is_open:
            return  # closed while it was paced
        if isinstance(command, Ping):
            session.reply(pong_frame(command.id))
            return
        if isinstance(command, Auth):
            await self.authenticate(command)
            return
        if session.identity is None:
            if isinstance(command, Publish):
                counters.publish_errors["unauthorized"] += 1
            session.reply(
                error_frame(
                    "unauthorized",
                    'authenticate first: send {"type": "auth", "token": "<token>"}',
                    command.id,
                    command.thread,
                )
            )
            return
        if self._tasks is None:
            self._tasks = set()
            self._lanes = {}
        assert self._lanes is not None
        while len(self._tasks) >= MAX_COMMANDS_IN_FLIGHT:
            await asyncio.wait(list(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        thread = command.thread
        before = self._lanes.get(thread)
        entered = (
            asyncio.get_running_loop().create_future() if isinstance(command, Publish) else None
        )
        task = asyncio.create_task(self._run(command, before, entered))
        self._tasks.add(task)
        self._lanes[thread] = (task, entered)
        task.add_done_callback(self._finished)

    async def _paced(self, bucket: RateLimit, count: int, *, limit: float = PACE_LIMIT) -> float:
        """Wait until *bucket* has *count* tokens and take them: 0.0. Past
        *limit* seconds it does not wait: the seconds it would have waited.

        Pacing, not refusing, keeps a pipelining client's commands in order:
        the connection's next frame is read only once this one is within the
        rates (the client is slowed down by its own socket), where a refusal
        in the middle of a pipeline would let the publishes after it overtake
        it.
        """
        while True:
            wait = bucket.take(count)
            if wait == 0.0 or wait > limit:
                return wait
            await asyncio.sleep(wait)

    def _rate_limited(self, command: Command, wait: float) -> dict[str, Any]:
        config = self.host.config
        thread = getattr(command, "thread", None)
        return error_frame(
            "rate_limited",
            f"over this connection's limit of {config.max_commands_per_second:g} commands "
            f"and {config.max_events_per_second:g} published events per second: send it "
            f"again in {wait:.3f} s",
            command.id,
            thread,
            retry_after=wait,
        )

    # Identity -------------------------------------------------------------------------------

    async def authenticate(self, command: Auth) -> None:
        """Carry out an ``auth``: take the token's identity, or say why not."""
        session = self.session
        try:
            identity = await self.host.authenticator.authenticate(
                Credentials(command.token, TokenSource.FRAME)
            )
            current = session.identity
            if (
                current is not None
                and not current.anonymous
                and (identity.subject != current.subject)
            ):
                raise Forbidden(
                    f"this connection is {current.subject!r}: a new token must be for the "
                    "same subject (open another connection for another one)"
                )
        except AguiHubError as exc:
            code = exc.code if isinstance(exc, Unauthorized | Forbidden) else "unauthorized"
            session.reply(error_frame(code, str(exc), command.id))
            self._failed_auths += 1
            if self._failed_auths >= MAX_FAILED_AUTHS:
                session.close_soon(
                    CloseCode.UNAUTHORIZED,
                    f"{MAX_FAILED_AUTHS} failed auth commands: connect again with a valid token",
                )
            return
        if not session.is_open:
            return
        self._failed_auths = 0
        session.identity = identity
        if command.client is not None:
            session.client = command.client  # for the subscriptions made from now on
        self.host.presence.resubject(session, identity.subject)
        session.start_clock()
        session.reply(
            authenticated_frame(
                command.id,
                identity.subject,
                identity.expires,
                identity.grants.as_json(),
            )
        )
        self.drop_ungranted()

    def drop_ungranted(self) -> None:
        """End the subscriptions the session's identity no longer grants."""
        session = self.session
        identity = session.identity
        for thread in list(session.threads):
            if identity is None or not identity.allows(Action.SUBSCRIBE, thread):
                self.host.hub.unsubscribe(session, thread)
                self.host.presence.leave(session, thread)
                session.threads.discard(thread)
                session.reply(
                    error_frame(
                        "forbidden",
                        f"subscription to thread {thread!r} ended: this connection's "
                        "credentials no longer grant it",
                        None,
                        thread,
                    )
                )

    def _allowed(self, action: Action, thread: str) -> bool:
        identity = self.session.identity
        return identity is not None and identity.allows(action, thread)

    # Commands under way ------------------------------------------------------------------------

    def _finished(self, task: asyncio.Task[None]) -> None:
        if self._tasks is not None:
            self._tasks.discard(task)
        if self._lanes is not None:
            for thread, (last, _entered) in list(self._lanes.items()):
                if last is task:
                    del self._lanes[thread]
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, StoreUnavailable):
                self.session.close_soon(
                    CloseCode.TRY_AGAIN_LATER, "store unavailable, resume later"
                )
            else:
                log.error("connection %s: command failed", self.session.remote, exc_info=exc)
                self.session.close_soon(CloseCode.INTERNAL_ERROR, "internal error, resume")

    async def _run(
        self,
        command: Command,
        before: tuple[asyncio.Task[None], asyncio.Future[None] | None] | None,
        entered: asyncio.Future[None] | None,
    ) -> None:
        after = None
        try:
            if before is not None:
                previous, queued = before
                if entered is not None and queued is not None:
                    # A publish behind a publish: once that one is in the writer's
                    # queue this one may join it there (the writer stores what
                    # queued up together, in queue order), and replies after it.
                    after = previous
                    if not queued.done():
                        await asyncio.wait([queued])
                else:
                    # In order per thread; how the one before ended is its own business.
                    await asyncio.wait([previous])
            if self.session.is_open:
                await self.handle(command, entered, after)
        finally:
            wake(entered)

    async def handle(
        self,
        command: Command,
        entered: asyncio.Future[None] | None = None,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        """Carry out one parsed command. Errors become error frames.

        For a publish, *entered* is resolved once its events are in the
        writer's queue, and its reply waits until *after* (the publish before
        it on the thread) is done: replies keep the order of the commands.
        """
        session = self.session
        host = self.host
        command_id = command.id
        thread = None
        try:
            if isinstance(command, Ping):
                session.reply(pong_frame(command.id))
            elif isinstance(command, Auth):
                await self.authenticate(command)
            elif isinstance(command, Subscribe):
                thread = command.thread
                await self._subscribe(command)
            elif isinstance(command, Unsubscribe):
                thread = command.thread
                if host.hub.unsubscribe(session, command.thread):
                    host.presence.leave(session, command.thread)
                    session.threads.discard(command.thread)
                    session.reply(unsubscribed_frame(command.id, command.thread))
                else:
                    session.reply(
                        error_frame(
                            "not_subscribed",
                            f"not subscribed to thread {command.thread!r}",
                            command.id,
                            command.thread,
                        )
                    )
            elif isinstance(command, Publish):
                thread = command.thread
                identity = require_publish(session.identity, thread)
                ids = command.event_ids
                if ids is not None:
                    ids = [scoped_event_id(identity, i) for i in ids]
                # A thread in debt (whoever ran it into debt): wait in line. The
                # publish behind this one on this connection waits for
                # *entered*, so it cannot pass it here.
                await host.thread_work.wait(thread)
                if not session.is_open:
                    return  # gone while it waited: nothing stored
                # The writer queues the events before it first awaits, and the
                # next publish cannot run before this task awaits: resolved
                # now, that one still queues behind this one.
                wake(entered)
                work = WorkBudget(host.hub.limits.max_work)
                try:
                    offsets = await host.hub.publish(
                        thread,
                        command.events,
                        ids,
                        work=work,
                        values_checked=command.values_checked,
                    )
                finally:
                    # Refused or stored, judging it cost this much, to the
                    # connection and to the thread.
                    self._work.spend(work.spent)
                    host.thread_work.charge(thread, work.spent)
                host.counters.events_in += len(offsets)
                if after is not None and not after.done():
                    await asyncio.wait([after])
                session.reply(published_frame(command.id, thread, offsets))
            elif isinstance(command, ListRuns):
                thread = command.thread
                if not self._allowed(Action.SUBSCRIBE, thread):
                    raise Forbidden(f"this connection may not read thread {thread!r}")
                runs = await host.hub.store.runs(thread)
                listed = runs[-command.limit :]
                session.reply(
                    runs_frame(
                        command.id,
                        thread,
                        [r.as_json() for r in listed],
                        len(listed) < len(runs),
                        host.runs.runnable(session.identity, thread),
                    )
                )
            elif isinstance(command, Presence):
                thread = command.thread
                await self._presence(command)
            elif isinstance(command, Run):
                thread = command.thread
                run = await host.runs.start(session.identity, command)
                session.reply(running_frame(command.id, run.as_json()))
            elif isinstance(command, Cancel):
                thread = command.thread
                if command.abandoned:
                    run_id = await host.runs.end_abandoned(session.identity, thread, command.run_id)
                    record = {"thread": thread, "runId": run_id, "status": "ended"}
                    session.reply(cancelled_frame(command.id, record))
                else:
                    run = host.runs.cancel(session.identity, thread, command.run_id)
                    await run.done.wait()
                    session.reply(cancelled_frame(command.id, run.as_json()))
        except AguiHubError as exc:
            if isinstance(command, Publish):
                host.counters.publish_errors[exc.code] += 1
            index = exc.index if isinstance(exc, ProtocolError) else None
            retry = exc.retry_after if isinstance(exc, RateLimited) else None
            if after is not None and not after.done():
                await asyncio.wait([after])
            session.reply(error_frame(exc.code, str(exc), command_id, thread, index,
                                      retry_after=retry))  # fmt: skip

    async def _subscribe(self, command: Subscribe) -> None:
        session = self.session
        host = self.host
        hub = host.hub
        counters = host.counters
        thread = command.thread
        if thread in session.threads:
            # Subscribing again restarts the subscription from the new position.
            hub.unsubscribe(session, thread)
            host.presence.leave(session, thread)
            session.threads.discard(thread)
        if not self._allowed(Action.SUBSCRIBE, thread):
            raise Forbidden(f"this connection may not read thread {thread!r}")
        if len(session.threads) >= host.config.max_subscriptions:
            session.reply(self._too_many(command.id, thread))
            return
        session.threads.add(thread)
        try:
            recovered = await hub.subscribe(
                session, thread, command.id, command.start, command.run, command.branch
            )
        except BaseException:
            session.threads.discard(thread)
            hub.unsubscribe(session, thread)
            raise
        if isinstance(command.start, Position) and session.is_open and thread in session.threads:
            # A client resuming (and still here): did it get every event after its position?
            if recovered:
                counters.resumes_complete += 1
            else:
                counters.resumes_incomplete += 1
        if not session.is_open:
            # Gone while it subscribed: forget() ran before the thread was ours.
            hub.unsubscribe(session, thread)
            session.threads.discard(thread)
        elif thread not in session.threads:
            # An auth took the grant away while it subscribed, and was told so
            # (drop_ungranted) before the hub had the member: remove it now.
            hub.unsubscribe(session, thread)
        elif not self._allowed(Action.SUBSCRIBE, thread):
            self.drop_ungranted()
        else:
            self._present(command)

    def _present(self, command: Subscribe) -> None:
        """Enter a new subscription in the thread's presence (and watch it, when asked)."""
        session = self.session
        presence = self.host.presence
        identity = session.identity
        subject = identity.subject if identity is not None else ANONYMOUS_SUBJECT
        client = command.client if command.client is not None else session.client
        presence.join(session, command.thread, subject, client)
        if not command.presence:
            return
        if presence.enabled:
            presence.watch(session, command.thread)
        else:
            session.reply({"type": "presence", "thread": command.thread, "off": True})

    async def _presence(self, command: Presence) -> None:
        thread = command.thread
        if not self._allowed(Action.SUBSCRIBE, thread):
            raise Forbidden(f"this connection may not read thread {thread!r}")
        presence = self.host.presence
        if not presence.enabled:
            raise PresenceOff("this gateway keeps no presence (--presence off)")
        page = await presence.page(thread, command.limit)
        hidden = presence.mode is PresenceMode.COUNT
        entries = [] if hidden else [e.as_json() for e in page.entries]
        self.session.reply(presence_frame(command.id, thread, page.count, entries, hidden=hidden))

    def _too_many(self, command_id: Any, thread: str) -> dict[str, Any]:
        limit = self.host.config.max_subscriptions
        return error_frame(
            "too_many_subscriptions",
            f"at most {limit} subscriptions per connection",
            command_id,
            thread,
        )
