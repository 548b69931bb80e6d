"""Shared fixtures: real redis-server processes on free loopback ports, gateway
processes, the JavaScript build."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .processes import Gateways

TIMEOUT_SCALE = float(os.environ.get("AGUI_HUB_TEST_TIMEOUT_SCALE", "1"))
"""Multiply every wait in the tests by this on slow machines."""


def in_ci() -> bool:
    """Whether this is CI (``CI=true``), where .ci/run installed every tool the tests need."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def unusable(message: str) -> None:
    """Skip the test, which cannot run here for the reason *message* gives; under CI fail
    it instead: a tool CI should have installed is missing, and a skip would hide that."""
    if in_ci():
        pytest.fail(message + " (.ci/run should have done this)")
    pytest.skip(message)


def free_port() -> int:
    """A free loopback port below the ephemeral range.

    Not an ephemeral port: a client reconnecting to a stopped server on an
    ephemeral port can end up connected to itself (TCP simultaneous open).
    """
    low, _high = (
        int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    )
    for _ in range(200):
        port = random.randrange(10_000, max(10_001, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port found")


class RedisServer:
    """A redis-server process on 127.0.0.1, started and stopped by a test."""

    def __init__(self, workdir: Path, *, appendonly: bool = False) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: apt-get install -y redis-server")
        self.binary = binary
        self.workdir = workdir
        self.appendonly = appendonly
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--protected-mode", "yes",
            "--loglevel", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10 * TIMEOUT_SCALE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise RuntimeError(f"redis-server exited at start: {err}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer within 10 s")

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=10 * TIMEOUT_SCALE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole session; tests isolate by key prefix."""
    server = RedisServer(tmp_path_factory.mktemp("redis-shared"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (to restart or kill), no persistence."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis_aof(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own with AOF persistence (fsync always)."""
    server = RedisServer(tmp_path / "redis-aof", appendonly=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def built_js() -> Iterator[Path]:
    """js/src built once per session into js/.test-build/<pid> (removed afterwards):
    ``<it>/agui_hub/static/agui-hub.js``, ``<it>/js/dist/agent.js``, ..."""
    from .nodejs import JS_DIR, build_js

    outdir = JS_DIR / ".test-build" / str(os.getpid())
    shutil.rmtree(outdir, ignore_errors=True)
    try:
        yield build_js(outdir)
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Gateways]:
    """Gateway processes of one test (tests/processes.py), all killed at its end; the
    test fails when one of them logged an error."""
    from .processes import Gateways  # it imports this module: imported when used

    manager = Gateways(tmp_path)
    try:
        yield manager
    finally:
        manager.kill_all()
