"""Gateway processes for the tests that are about processes.

:class:`GatewayProcess` runs ``python -m agui_hub.cli serve`` on a loopback
port with its output in a log file; :func:`child_env` is the environment of
every child the tests start (only their own flags configure it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .conftest import TIMEOUT_SCALE, free_port

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "agui_hub.cli"]


def child_env(url: str | None = None) -> dict[str, str]:
    """Our environment without AGUI_HUB_* and NO_COLOR; *url* as AGUI_HUB_URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGUI_HUB_") and k != "NO_COLOR"}
    env["PYTHONUNBUFFERED"] = "1"
    if url is not None:
        env["AGUI_HUB_URL"] = url
    return env


def http_status(port: int, path: str, timeout: float = 0.5) -> int | None:
    """The status of ``GET path`` on the loopback port, or None if nothing answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            head = sock.recv(64).decode("latin-1")
    except OSError:
        return None
    parts = head.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return None
    return int(parts[1])


class GatewayProcess:
    """One ``agui-hub serve`` process on 127.0.0.1:*port*, its output in *log_path*."""

    def __init__(
        self,
        log_path: Path,
        port: int,
        store: str | None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """*args*: more ``serve`` flags; *env*: more environment variables."""
        self.port = port
        self.store = store
        self.log_path = log_path
        argv = [*CLI, "serve", "--host", "127.0.0.1", "--port", str(port)]
        if store is not None:
            argv += ["--store", store]
        argv += args or []
        environment = child_env()
        environment.update(env or {})
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_healthy(self, timeout: float = 20.0, path: str = "/healthz") -> bool:
        """Wait until *path* answers 200; False if the process exited (e.g. the port
        was taken), RuntimeError after *timeout* seconds."""
        # The log line too: an answer alone could come from another process
        # that got the port first.
        ready = f"agui-hub listening on ws://127.0.0.1:{self.port}"
        deadline = time.monotonic() + timeout * TIMEOUT_SCALE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if ready in self.log() and http_status(self.port, path) == 200:
                return True
            time.sleep(0.05)
        raise RuntimeError(f"gateway on port {self.port}: {path} not 200 in time:\n{self.log()}")

    def signal(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def logged_errors(self) -> bool:
        log = self.log()
        return "Traceback" in log or " ERROR " in log


def start_gateway(
    workdir: Path,
    store: str | None,
    port: int | None = None,
    *,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    ready_path: str = "/healthz",
    started: list[GatewayProcess] | None = None,
) -> GatewayProcess:
    """A gateway that answers *ready_path*, on a free port (three attempts, in
    case another process took the port first) or on *port* (one attempt).

    Every process started is appended to *started*, the failed ones too. Each
    gets a log of its own: a restart on the same port must not find the
    previous process's "listening" line.
    """
    gateway = None
    for _attempt in range(1 if port else 3):
        chosen = port or free_port()
        log_path = workdir / f"gateway-{chosen}-{uuid.uuid4().hex[:8]}.log"
        gateway = GatewayProcess(log_path, chosen, store, args, env)
        if started is not None:
            started.append(gateway)
        if gateway.wait_healthy(path=ready_path):
            return gateway
    assert gateway is not None
    raise RuntimeError(f"gateway exited at start:\n{gateway.log()}")


class Gateways:
    """Gateway processes of one test: :meth:`kill_all` is its finalizer, and fails
    the test when a gateway's log holds a traceback or an ERROR line."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[GatewayProcess] = []

    def start(
        self,
        store: str | None = None,
        *args: str,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> GatewayProcess:
        """Start a gateway with *args* and wait until it is healthy (on a free
        port unless *port*)."""
        return start_gateway(
            self.workdir, store, port, args=list(args), env=env, started=self.started
        )

    def kill_all(self) -> None:
        for gateway in self.started:
            gateway.kill()
        failures = []
        for gateway in self.started:
            log = gateway.log()
            # Shown by pytest only when the test failed.
            print(f"---- gateway port {gateway.port} (exit {gateway.process.returncode}) ----")
            print(log[-4000:])
            if gateway.logged_errors():
                failures.append(f"gateway on port {gateway.port} logged an error:\n{log[-4000:]}")
        assert not failures, "\n".join(failures)
