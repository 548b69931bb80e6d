"""A real Redis Cluster on loopback for the tests: three masters and three replicas.

:class:`RedisCluster` starts ``redis-server --cluster-enabled yes`` processes
on free loopback ports (AOF on, no RDB), joins them with ``redis-cli
--cluster create … --cluster-replicas 1`` and waits until every node reports
``cluster_state:ok`` and agrees on the slot map. Tests kill a master or fail
over to a replica through it and wait for the cluster to settle again.

Outside CI a redis-server without cluster support (or older than 7.0, which
has no sharded pub/sub) skips the tests that need a cluster, saying why; under
CI (``CI=true``) it fails them.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.crc import key_slot

from agui_hub.store.redis.keys import stream_key

from .conftest import TIMEOUT_SCALE, free_port, unusable

NODE_TIMEOUT_MS = 1000
"""``cluster-node-timeout``: how long a master may be silent before its replica
takes over (plus an election of about a second). Low, so that a failover in a
test takes seconds."""


def command(port: int, *args: str, timeout: float = 5.0) -> str:
    """One command to the node on *port* through redis-cli; its reply as text."""
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        timeout=timeout * TIMEOUT_SCALE,
        check=False,
    )
    return done.stdout.decode(errors="replace")


@dataclass
class ClusterNode:
    """One redis-server of the cluster."""

    port: int
    workdir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def info(self, section: str) -> dict[str, str]:
        """``INFO section`` (or ``CLUSTER INFO`` for "cluster-info") as a dict."""
        args = ["CLUSTER", "INFO"] if section == "cluster-info" else ["INFO", section]
        fields = {}
        for line in command(self.port, *args).splitlines():
            name, sep, value = line.strip().partition(":")
            if sep:
                fields[name] = value
        return fields

    def role(self) -> str:
        return self.info("replication").get("role", "")

    def command(self, *args: str) -> str:
        """One command to this node (through redis-cli); its reply as text."""
        return command(self.port, *args)


class RedisCluster:
    """Three masters, each with one replica, on 127.0.0.1."""

    def __init__(
        self, workdir: Path, *, masters: int = 3, replicas: int = 1, full_coverage: bool = False
    ) -> None:
        """*full_coverage*: ``cluster-require-full-coverage`` (Redis's default is yes;
        docs/cluster.md recommends no, so that a failover stalls only the
        threads of the failing master)."""
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            unusable("redis-server and redis-cli are not installed: apt-get install redis-server")
        version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, check=False
        ).stdout.decode()
        number = version.partition("v=")[2].split()[0] if "v=" in version else "0"
        if tuple(int(p) for p in number.split(".")[:2] if p.isdigit()) < (7, 0):
            unusable(f"Redis Cluster tests need redis-server 7.0 or later, found {number}")
        self.workdir = workdir
        self.full_coverage = full_coverage
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[ClusterNode] = []
        ports: set[int] = set()
        while len(ports) < masters * (1 + replicas):
            # The cluster bus listens on port + 10000: both must be free.
            port = free_port()
            if port + 10_000 < 65_536 and _port_free(port + 10_000):
                ports.add(port)
        for port in sorted(ports):
            self.nodes.append(ClusterNode(port, workdir / f"node-{port}"))

    # -- processes -----------------------------------------------------------------------

    def start_node(self, node: ClusterNode) -> None:
        node.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            "redis-server",
            "--bind", "127.0.0.1",
            "--port", str(node.port),
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{node.port}.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--repl-diskless-sync-delay", "0",
            "--cluster-require-full-coverage", "yes" if self.full_coverage else "no",
            "--dir", str(node.workdir),
            "--appendonly", "yes",
            "--save", "",
            "--protected-mode", "yes",
            "--loglevel", "warning",
        ]  # fmt: skip
        log = (node.workdir / "redis.log").open("ab")
        node.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10 * TIMEOUT_SCALE
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                output = (node.workdir / "redis.log").read_text(errors="replace")
                if "cluster" in output.lower():
                    unusable(f"redis-server has no cluster support here: {output[-500:]}")
                raise RuntimeError(f"redis-server exited at start: {output[-2000:]}")
            if command(node.port, "PING").strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"cluster node {node.name} did not answer within 10 s")

    def start(self) -> None:
        for node in self.nodes:
            self.start_node(node)
        argv = [
            "redis-cli", "--cluster", "create",
            *(node.name for node in self.nodes),
            "--cluster-replicas", str(self.replicas),
            "--cluster-yes",
        ]  # fmt: skip
        create = subprocess.run(
            argv,
            capture_output=True,
            timeout=60 * TIMEOUT_SCALE,
            check=False,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout.decode()}")
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            self.kill(node)

    def kill(self, node: ClusterNode, sig: signal.Signals = signal.SIGKILL) -> None:
        if node.process is None:
            return
        if node.process.poll() is None:
            node.process.send_signal(sig)
        try:
            node.process.wait(timeout=10 * TIMEOUT_SCALE)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
        node.process = None

    def pause(self, node: ClusterNode) -> None:
        """SIGSTOP *node*: it keeps its connections but answers nothing."""
        assert node.process is not None
        node.process.send_signal(signal.SIGSTOP)

    def resume(self, node: ClusterNode) -> None:
        assert node.process is not None
        node.process.send_signal(signal.SIGCONT)

    # -- topology ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store URL: every node as a seed."""
        return "redis+cluster://" + ",".join(node.name for node in self.nodes) + "/"

    @property
    def live_nodes(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.alive]

    def node(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def slot_ranges(self, via: ClusterNode | None = None) -> list[tuple[int, int, int]]:
        """(first slot, last slot, master port) of each range, as *via* (or any live
        node) sees the cluster."""
        asking = via or self.live_nodes[0]
        ranges = []
        for line in command(asking.port, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            if len(fields) < 8 or "master" not in fields[2] or "fail" in fields[2]:
                continue
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for part in fields[8:]:
                if part.startswith("["):
                    continue  # a slot being migrated
                low, _, high = part.partition("-")
                ranges.append((int(low), int(high or low), port))
        return sorted(ranges)

    def master_of(self, key: str, ranges: list[tuple[int, int, int]] | None = None) -> ClusterNode:
        """The master that serves *key*'s slot now (or in *ranges*)."""
        slot = key_slot(key.encode())
        for low, high, port in ranges if ranges is not None else self.slot_ranges():
            if low <= slot <= high:
                return self.node(port)
        raise LookupError(f"no master serves slot {slot}")

    def threads_on_every_master(self, per_master: int = 2) -> list[str]:
        """Thread ids whose slots cover every master: *per_master* of them on each."""
        ranges = self.slot_ranges()
        chosen: dict[int, list[str]] = {port: [] for _, _, port in ranges}
        for n in range(10_000):
            thread = f"thread-{n}"
            port = self.master_of(stream_key("agui", thread), ranges).port
            if len(chosen[port]) < per_master:
                chosen[port].append(thread)
            if all(len(threads) == per_master for threads in chosen.values()):
                return [t for port in sorted(chosen) for t in chosen[port]]
        raise RuntimeError("could not find threads on every master")

    def masters_now(self) -> list[ClusterNode]:
        return [node for node in self.live_nodes if node.role() == "master"]

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        """A live replica of *master*."""
        for node in self.live_nodes:
            info = node.info("replication")
            if info.get("role") == "slave" and info.get("master_port") == str(master.port):
                return node
        raise LookupError(f"{master.name} has no live replica")

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok``, all agree on the masters,
        and every live replica is in sync with its master (a replica that never
        synced cannot take over)."""
        deadline = time.monotonic() + timeout * TIMEOUT_SCALE
        last = ""
        while time.monotonic() < deadline:
            nodes = self.live_nodes
            states = [node.info("cluster-info").get("cluster_state") for node in nodes]
            maps = [self.slot_ranges(node) for node in nodes]
            covered = bool(maps) and sum(high - low + 1 for low, high, _ in maps[0]) == 16384
            links = [
                info.get("master_link_status", "up")
                for info in (node.info("replication") for node in nodes)
                if info.get("role") == "slave"
            ]
            if (
                all(s == "ok" for s in states)
                and covered
                and all(m == maps[0] for m in maps)
                and all(link == "up" for link in links)
            ):
                return
            last = f"states {states}, replica links {links}"
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not settle within {timeout} s: {last}")

    def failover(self, replica: ClusterNode, timeout: float = 30.0) -> None:
        """``CLUSTER FAILOVER`` on *replica* (no data lost), until it is master."""
        reply = command(replica.port, "CLUSTER", "FAILOVER").strip()
        if reply != "OK":
            raise RuntimeError(f"CLUSTER FAILOVER on {replica.name}: {reply}")
        self.wait_master(replica, timeout)

    def move_slot(self, slot: int, target: ClusterNode) -> None:
        """Migrate *slot* (its keys included) to the master *target*, as
        ``redis-cli --cluster reshard`` does, and wait until every node agrees."""
        source = next(
            self.node(port) for low, high, port in self.slot_ranges() if low <= slot <= high
        )
        ids = {node.port: node.command("CLUSTER", "MYID").strip() for node in self.live_nodes}
        slot_arg = str(slot)
        target.command("CLUSTER", "SETSLOT", slot_arg, "IMPORTING", ids[source.port])
        source.command("CLUSTER", "SETSLOT", slot_arg, "MIGRATING", ids[target.port])
        for _ in range(1000):
            keys = source.command("CLUSTER", "GETKEYSINSLOT", slot_arg, "100").split()
            if not keys:
                break
            reply = source.command(
                "MIGRATE", "127.0.0.1", str(target.port), "", "0", "5000", "KEYS", *keys
            ).strip()
            if reply != "OK":
                raise RuntimeError(f"MIGRATE of slot {slot}: {reply}")
        for node in [target, source, *self.masters_now()]:
            node.command("CLUSTER", "SETSLOT", slot_arg, "NODE", ids[target.port])
        self.wait_ok()

    def wait_master(self, node: ClusterNode, timeout: float = 30.0) -> None:
        """Until *node* is a master that every live node knows as one."""
        deadline = time.monotonic() + timeout * TIMEOUT_SCALE
        while time.monotonic() < deadline:
            owners = {port for _, _, port in self.slot_ranges()}
            if node.role() == "master" and node.port in owners:
                self.wait_ok(timeout)
                return
            time.sleep(0.05)
        raise RuntimeError(f"{node.name} did not become a master within {timeout} s")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A cluster of 3 masters + 3 replicas shared by a test module (whose tests may
    fail over: they wait until it is ok again)."""
    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """A cluster of this test's own (to kill a master of)."""
    cluster = RedisCluster(tmp_path / "cluster")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
