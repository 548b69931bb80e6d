"""Calls to Redis as the store makes them: each bounded by ``op_timeout``, each
failure turned into a store error.

:class:`RedisCalls` holds the redis-py client (a single Redis's, or a Redis
Cluster's made by :class:`~agui_hub.store.redis.cluster.ClusterOps`) and is what the
store's parts share: the appends, the reads and the live reader. A caller
gets an answer or a :class:`~agui_hub.errors.StoreUnavailable` /
:class:`~agui_hub.errors.StoreError` within the deadline, whatever Redis
does (:func:`bounded`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AskError,
    ClusterCrossSlotError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    RedisClusterException,
    RedisClusterUnreachableError,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...errors import StoreError, StoreUnavailable
from .resp import raw_reply

if TYPE_CHECKING:
    from .cluster import ClusterOps

__all__ = ["MAYBE_STORED", "Deadlines", "RedisCalls", "bounded", "single_node_client"]

T = TypeVar("T")

MAYBE_STORED = "; the events may or may not be stored: retry with the same event ids"
"""What an append's failure adds when the append may have happened."""


def single_node_client(url: str, max_connections: int, socket_timeout: float) -> aioredis.Redis:
    """The redis-py client of a single Redis (``redis://``, ``rediss://``) at *url*.

    A bounded, blocking pool: concurrency waits for a connection instead of
    opening more, so the connection count does not grow with the load.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        health_check_interval=15,
        # Values are msgpack bytes: decode_responses must stay off.
        decode_responses=False,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
    )
    return aioredis.Redis(connection_pool=pool)


class RedisCalls:
    """The store's redis-py client, and the deadline and error mapping of its calls.

    *client* is redis-py's ``Redis`` or ``RedisCluster`` (the calls both take
    are the ones used); *cluster* is ``None`` on a single Redis. *url* is
    the store's URL without its password: the only one any message shows.
    """

    def __init__(
        self, client: Any, url: str, op_timeout: float, cluster: ClusterOps | None = None
    ) -> None:
        self.client = client
        self.url = url
        self.op_timeout = op_timeout
        self.cluster = cluster
        """What differs on Redis Cluster (``redis+cluster://``); ``None`` on a single Redis."""
        self._limit = cluster.limit if cluster is not None else None
        """Bounds the commands in flight on Redis Cluster (its client does not wait
        for a free connection); ``None`` on a single Redis, whose pool does."""
        # Entries are parsed once, straight into Entry tuples (see parse_entry), not
        # first into redis-py's (id, dict) pairs: catch-up reads are hot.
        client.set_response_callback("XRANGE", raw_reply)

    def timed_out(self, what: str = "a command") -> StoreUnavailable:
        """The error for *what* not answered within ``op_timeout``."""
        return StoreUnavailable(
            f"Redis at {self.url} is unavailable: no answer to {what} within {self.op_timeout:g} s"
        )

    async def call(self, awaitable: Awaitable[T], what: str = "a command") -> T:
        """Await one store command within ``op_timeout``; Redis failures become
        :class:`StoreUnavailable` (unreachable, too slow) or :class:`StoreError`."""
        try:
            if self._limit is not None:
                awaitable = _limited(self._limit, awaitable)
            return await bounded(awaitable, self.op_timeout)
        except TimeoutError:  # the deadline (a builtin TimeoutError, unlike redis-py's)
            raise self.timed_out(what) from None
        except (RedisError, RedisClusterException, OSError) as exc:
            raise self.failure(exc) from exc

    def unavailable(self, exc: BaseException) -> bool:
        """Whether *exc* means Redis (on a cluster: the thread's master) cannot
        answer now, rather than a wrong command."""
        return _unavailable(exc, cluster=self.cluster is not None)

    def failure(self, exc: BaseException, *, retry_hint: str = "") -> StoreError:
        """The store error for a redis-py failure: :class:`StoreUnavailable` when
        Redis (or a cluster master) cannot answer now, else :class:`StoreError`."""
        if self.unavailable(exc):
            return StoreUnavailable(f"Redis at {self.url} is unavailable: {exc}{retry_hint}")
        return StoreError(f"Redis error: {exc}{self.cluster_hint(exc)}")

    def cluster_hint(self, exc: BaseException) -> str:
        """What to do when a ``redis://`` URL names a node of a Redis Cluster."""
        if self.cluster is None and isinstance(
            exc, (AskError, ClusterError, ClusterCrossSlotError)
        ):
            return (
                f" (the Redis at {self.url} is a node of a Redis Cluster: open the store "
                "with redis+cluster://host:port,host:port/, see docs/cluster.md)"
            )
        return ""

    async def load_script(self, source: str) -> None:
        """SCRIPT LOAD *source* (on every master of a cluster). Not bounded: call
        it through :meth:`call`."""
        if self.cluster is not None:
            await self.cluster.load_script(source)
        else:
            await self.client.script_load(source)

    async def close(self) -> None:
        """Close the client and its connections."""
        await self.client.aclose()
        if self.cluster is None:
            await self.client.connection_pool.disconnect()


# -- deadlines ------------------------------------------------------------------------------


class Deadlines:
    """Futures that fail *timeout* seconds after they were added, unless done by
    then, with one timer at a time instead of one per future.

    A timer per call (``asyncio.timeout``) costs a heap entry whose ordering
    runs Python code, and the heap holds every call of the last ``op_timeout``
    seconds: at a few thousand appends a second it was about a seventh of a
    gateway's CPU. Every future here has the same timeout, so they wait in the
    order of their deadlines: a call costs a deque append, done futures leave
    from the front as soon as they are there (memory holds what is in flight,
    not every call of the last *timeout* seconds), and the one timer is set for
    the front's deadline, at most :attr:`GRAIN` late.
    """

    GRAIN = 0.1
    """Seconds a deadline may fire late (the timer is not set again sooner)."""

    def __init__(self, timeout: float, error: Callable[[], BaseException]) -> None:
        self.timeout = timeout
        self._error = error
        self._waiting: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, future: asyncio.Future[Any]) -> None:
        """Fail *future* with ``error()`` :attr:`timeout` seconds from now, unless it is done."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a timer set in another loop is that loop's
            self._loop, self._waiting, self._timer = loop, deque(), None
        waiting = self._waiting
        while waiting and waiting[0][1].done():
            waiting.popleft()
        waiting.append((loop.time() + self.timeout, future))
        if self._timer is None:
            self._timer = loop.call_at(waiting[0][0] + self.GRAIN, self._expire)

    def _expire(self) -> None:
        self._timer = None
        loop, waiting = self._loop, self._waiting
        assert loop is not None
        now = loop.time()
        while waiting and (waiting[0][1].done() or waiting[0][0] <= now):
            _, future = waiting.popleft()
            if not future.done():
                future.set_exception(self._error())
        if waiting:
            self._timer = loop.call_at(max(waiting[0][0], now) + self.GRAIN, self._expire)


_abandoned: set[asyncio.Future[Any]] = set()
"""Cancelled work that has not finished yet (kept referenced until it has)."""


def _abandon(task: asyncio.Future[Any]) -> None:
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_forget_abandoned)


def _forget_abandoned(task: asyncio.Future[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" noise


async def bounded(awaitable: Awaitable[T], timeout: float) -> T:
    """*awaitable*'s result, or a builtin :class:`TimeoutError` after *timeout* seconds.

    On the deadline the work is cancelled but not waited for: redis-py may
    take a while to wind down a cancelled command (it can even take the
    cancellation for a failure to retry), and the caller must be answered on
    time. The abandoned work finishes in the background and returns its
    connection to the pool.
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        _abandon(task)
        raise
    if not done:
        _abandon(task)
        raise TimeoutError
    return task.result()


async def _limited(limit: asyncio.Semaphore, awaitable: Awaitable[T]) -> T:
    async with limit:
        return await awaitable


# -- failures -------------------------------------------------------------------------------

_UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, OSError)
"""Failures that mean Redis cannot answer now (worth a retry), not a wrong command."""

_CLUSTER_UNAVAILABLE = (
    # A master down, its slots without an owner for now, slots moving
    # (redirections beyond redis-py's retries, keys split mid-migration).
    ClusterError,
    TryAgainError,
    AskError,
    SlotNotCoveredError,
    RedisClusterUnreachableError,
)
"""What else means "not now" on Redis Cluster."""


def _unavailable(exc: BaseException, *, cluster: bool) -> bool:
    """Whether *exc* means Redis (on a *cluster*: the thread's master) cannot
    answer now, rather than a wrong command."""
    if isinstance(exc, _UNAVAILABLE):
        return True
    if not cluster:
        return False
    # The cluster client's own errors: no node reachable, nodes that disagree on
    # the slots... All but a programming error (several slots in one transaction).
    return isinstance(exc, _CLUSTER_UNAVAILABLE) or (
        isinstance(exc, RedisClusterException)
        and not isinstance(exc, (CrossSlotTransactionError, InvalidPipelineStack))
    )
