"""The Redis store on Redis Cluster (``redis+cluster://``, ``rediss+cluster://``).

:class:`~agui_hub.store.redis.store.RedisStore` talks to a cluster when its URL
says so::

    redis+cluster://10.0.0.1:7000,10.0.0.2:7000/?prefix=agui&ttl=86400

The hosts are seeds: any reachable one tells the store the whole cluster
(CLUSTER SLOTS), and the store follows the cluster's changes. What differs
from a single Redis is here (the client, :class:`ClusterOps`) and in
:mod:`agui_hub.store.redis.cluster_live` (the live reader); the key layout, scripts
and contracts are the same (docs/store.md), and docs/cluster.md says what a
failover costs.

- Every key of a thread carries the ``{thread}`` hash tag, so a thread lives
  in one slot, on one master: the append script, the read script and the
  rewind check each run on the thread's master (EVALSHA per master, the
  script loaded again on a master that does not know it, after a failover).
- Notifications are sharded pub/sub: the scripts SPUBLISH on the thread's
  ``notify`` channel (same slot), which reaches only the subscribers
  connected to that master (PUBLISH would be broadcast to every node).
- The live reader keeps one pub/sub connection per master (SSUBSCRIBE), not
  per thread, and moves a thread to its new master's connection when its
  slot moves (:mod:`agui_hub.store.redis.cluster_live`).
- ``max_tenant_threads`` is refused: the tenant's set of threads and its
  threads are in different slots, which one script cannot check atomically.

Needs Redis 7.0 or later (sharded pub/sub).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisError, SlotNotCoveredError

from ...wire.offsets import Offset
from ..contract import offset_key
from ..urls import CLUSTER_SCHEMES, redact_url
from . import scripts
from .keys import meta_key, notify_channel, stream_key
from .resp import MAX_OFFSET
from .scripts import Script

__all__ = ["ClusterOps", "cluster_options", "sharded"]

DEFAULT_PORT = 6379


# -- the URL --------------------------------------------------------------------------------


def cluster_options(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    """The seed nodes and redis-py options of a ``redis+cluster://`` URL.

    ``redis+cluster://[user[:password]@]host[:port][,host[:port]...][/0][?options]``;
    ``rediss+cluster://`` for TLS. The options are those of ``redis://`` that
    redis-py's cluster client takes (``ssl_*`` only with ``rediss+cluster``);
    a database other than 0 (a cluster has only 0), an empty host list or an
    option the cluster client does not take is a :class:`ValueError`.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES:
        raise ValueError(
            f"not a Redis Cluster URL (redis+cluster:// or rediss+cluster://): {scheme}"
        )
    userinfo, at, hosts = parts.netloc.rpartition("@")
    seeds = [_host_port(item) for item in hosts.split(",")]
    path = parts.path.strip("/")
    if path not in ("", "0"):
        raise ValueError(
            f"Redis Cluster has only database 0: drop /{path} from the store URL "
            "(use the prefix option to keep several hubs apart)"
        )
    first_host, first_port = seeds[0]
    host = f"[{first_host}]" if ":" in first_host else first_host
    single = (
        f"{scheme.removesuffix('+cluster')}://{userinfo + '@' if at else ''}"
        f"{host}:{first_port}/0" + (f"?{parts.query}" if parts.query else "")
    )
    options: dict[str, Any] = dict(parse_url(single))
    if options.pop("db", 0) not in (0, None):
        raise ValueError("Redis Cluster has only database 0: drop the db option from the URL")
    for name in ("host", "port"):
        options.pop(name, None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    accepted = inspect.signature(RedisCluster.__init__).parameters
    for name in options:
        if name not in accepted:
            raise ValueError(f"store URL option {name!r} does not apply to Redis Cluster")
    return seeds, options


def _host_port(item: str) -> tuple[str, int]:
    item = item.strip()
    if item.startswith("["):  # [IPv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(
            "a Redis Cluster URL needs host:port of at least one node, comma-separated"
        )
    if not port:
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad port {port!r} for {host} in the Redis Cluster URL")
    return host, int(port)


# -- scripts ----------------------------------------------------------------------------------


def sharded(script: Script) -> Script:
    """*script* with its notifications on sharded pub/sub (SPUBLISH: only the
    subscribers of the thread's master receive them)."""
    replaced = script.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
    assert "'PUBLISH'" not in replaced.source
    return replaced


# -- the client and what differs ------------------------------------------------------------


class ClusterOps:
    """What :class:`~agui_hub.store.redis.store.RedisStore` does differently on a cluster.

    Owns the redis-py cluster client (:attr:`client`). Each method returns
    what the store's single-node code gets from its own calls, so the store
    keeps one code path around them (bounded by ``op_timeout``, errors
    mapped to :class:`~agui_hub.errors.StoreUnavailable` / ``StoreError``:
    see :class:`~agui_hub.store.redis.calls.RedisCalls`, which takes this).
    *prefix* is the store's key prefix.
    """

    def __init__(
        self, url: str, *, prefix: str, max_connections: int, socket_timeout: float
    ) -> None:
        seeds, options = cluster_options(url)
        self.url = redact_url(url)
        """The cluster's URL without its password (safe to show)."""
        self.prefix = prefix
        # The store bounds the commands in flight to max_connections (the
        # cluster client fails instead of waiting for a free connection); the
        # slack covers commands abandoned on their deadline still winding down.
        self.max_connections = int(options.pop("max_connections", max_connections))
        self.limit = asyncio.Semaphore(self.max_connections)
        """Bounds the store's commands in flight (taken by
        :class:`~agui_hub.store.redis.calls.RedisCalls` and :meth:`run_scripts`)."""
        settings: dict[str, Any] = {
            "max_connections": 2 * self.max_connections,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_timeout,
            "health_check_interval": 15,
            "decode_responses": False,
            "retry": Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        }
        settings.update(options)
        if settings.get("decode_responses"):
            raise ValueError("decode_responses must stay off: event payloads are msgpack bytes")
        self.client = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in seeds], **settings
        )
        try:
            # A thread's epoch is made in a MULTI on its slot: older redis-py cluster
            # clients refuse transactions outright (before any network I/O).
            self.client.pipeline(transaction=True)
        except RedisError as exc:
            raise ValueError(
                f"this redis-py ({redis.__version__}) has no transactions on Redis Cluster "
                f"({exc}): the cluster store needs a newer one, pip install -U 'redis[hiredis]'"
            ) from None

    def scripts(self, append: Script, check: Script) -> tuple[Script, Script]:
        """The append and rewind-check scripts as they run on a cluster."""
        return sharded(append), sharded(check)

    async def load_script(self, script: str) -> None:
        """SCRIPT LOAD on every master (a replica promoted by a failover may not
        have the scripts the old master had)."""
        await self.client.execute_command(
            "SCRIPT LOAD", script, target_nodes=RedisCluster.PRIMARIES
        )

    async def run_scripts(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """EVALSHA *script* for each (keys, args) in *calls*, on the master of its
        keys' slot; each reply in order, an error as its exception.

        One pipeline: redis-py sends each master its calls at once, follows
        MOVED / ASK per call and retries connection errors after refreshing
        the slot map (safe: the scripts are idempotent, see the store). Calls
        a master answers NOSCRIPT to are sent again after loading *script*.
        """
        async with self.limit:
            return await self._run_scripts(script, calls)

    async def eval_each(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        """What :meth:`run_scripts` does, for a caller that awaits it through the
        store's ``call``: that takes :attr:`limit` already (taking it twice could
        wait for ever)."""
        return await self._run_scripts(script, calls)

    async def _run_scripts(
        self, script: Script, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        sha = script.sha
        replies = await self._evalsha(sha, calls)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            await self.load_script(script.source)
            again = await self._evalsha(sha, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _evalsha(
        self, sha: str, calls: Sequence[tuple[Sequence[Any], Sequence[Any]]]
    ) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    async def read_pages(
        self, cursors: Sequence[tuple[str, Offset]], limit: int | None
    ) -> list[Any]:
        """For each (thread, after): ``[epoch, trimmed, raw entries]`` (or the
        exception), read atomically on the thread's master. (Called through the
        store's ``call``, which bounds it.)"""
        prefix = self.prefix
        calls = []
        for thread, after in cursors:
            keys = [stream_key(prefix, thread), meta_key(prefix, thread)]
            tail = offset_key(after) == MAX_OFFSET  # nothing can follow it
            calls.append((keys, ["" if tail else after, limit or 0]))
        return await self._run_scripts(scripts.READ, calls)

    async def scan(self, pattern: str, limit: int) -> list[bytes]:
        """Keys matching *pattern* (streams) on every master, up to about *limit*."""
        found: list[bytes] = []
        async for key in self.client.scan_iter(
            match=pattern, count=1000, _type="stream", target_nodes=RedisCluster.PRIMARIES
        ):
            found.append(key)
            if len(found) >= limit:
                break
        return found

    async def ping(self) -> None:
        """PING every master of the current slot map."""
        await self.client.execute_command("PING", target_nodes=RedisCluster.PRIMARIES)

    async def config_get(self, names: Sequence[str]) -> dict[str, list[Any]]:
        """CONFIG GET *names* on every master: replies per master (a dict, or the
        exception), keyed by how the store names it in a warning."""
        if not self.client.get_primaries():
            await self.client.initialize()
        out: dict[str, list[Any]] = {}
        for node in self.client.get_primaries():
            try:
                reply: Any = await self.client.config_get(*names, target_nodes=node)
            except Exception as exc:
                reply = exc
            out[f"{self.url} (master {node.name})"] = [reply]
        return out

    def owner(self, thread: str) -> ClusterNode:
        """The master of *thread*'s slot in the client's slot map (SlotNotCoveredError
        before the client knows the cluster)."""
        slot = key_slot(notify_channel(self.prefix, thread).encode())
        return self.client.nodes_manager.get_node_from_slot(slot)

    def lane(self, thread: str) -> str:
        """Which appends *thread*'s share a round trip with: its master's (host:port),
        or ``""`` before the client knows the cluster."""
        try:
            return self.owner(thread).name
        except SlotNotCoveredError:
            return ""

    def node_options(self) -> dict[str, Any]:
        """Connection options of a connection of ours to one node (pub/sub)."""
        options = dict(self.client.get_connection_kwargs())
        for name in ("max_connections", "response_callbacks", "redis_connect_func"):
            options.pop(name, None)
        return options
