"""deploy/'s topology as real processes on loopback, for tests/test_deploy.py.

:class:`DeployRedis` is a ``redis-server`` started from one of deploy/'s
Redis configurations, and :class:`Nginx` is Debian's nginx started from
``deploy/nginx/agui-hub.conf``. Each copies its deploy file into the test's
directory and replaces only what must differ on a test machine (addresses,
ports, the data directory), failing when a line it replaces is not there:
everything else runs as an operator would run it.

nginx runs in the foreground (``daemon off``) in a session of its own, with
every file it writes (pid, logs, temporary files) under the test's directory;
as root its workers switch to nginx's default unprivileged user and need
none of those files. Outside CI a missing nginx skips the test with the
command that installs it; under CI it fails the test (tests/nodejs.py's
:func:`~tests.nodejs.missing`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .conftest import TIMEOUT_SCALE, free_port
from .nodejs import missing
from .processes import ROOT, http_status

DEPLOY = ROOT / "deploy"
NGINX_CONF = DEPLOY / "nginx" / "agui-hub.conf"
REDIS_CONF = DEPLOY / "redis.conf"
NGINX_PATHS = ("/usr/sbin/nginx",)
"""Where Debian puts nginx (often not on an unprivileged user's PATH)."""


def nginx_binary() -> str:
    """The nginx binary; skips the test (fails it under CI) when there is none."""
    found = shutil.which("nginx") or next(
        (path for path in NGINX_PATHS if os.access(path, os.X_OK)), None
    )
    if found is None:
        missing("nginx", "apt-get install nginx (only the binary is used, never the service)")
    assert found is not None
    return found


def replace_once(text: str, pattern: str, replacement: str, what: str) -> str:
    """*text* with the one line matching *pattern* (a multiline regex) replaced.

    Fails the test when the deploy file has no such line, or several: the
    test must run the file as shipped, not a guess at it.
    """
    found = re.findall(pattern, text, flags=re.MULTILINE)
    assert len(found) == 1, f"{what}: expected one line matching {pattern!r}, found {found}"
    return re.sub(pattern, replacement, text, count=1, flags=re.MULTILINE)


# -- nginx ---------------------------------------------------------------------------------------


def upstream_servers(conf: str) -> list[str]:
    """The ``server`` addresses of the upstream block of an nginx config."""
    block = re.search(r"^\s*upstream\s+\S+\s*\{(.*?)^\s*\}", conf, re.MULTILINE | re.DOTALL)
    assert block is not None, "no upstream block"
    return re.findall(r"^\s*server\s+(\S+?)[\s;]", block.group(1), re.MULTILINE)


def nginx_site(conf: str, listen_port: int, gateway_ports: list[int]) -> str:
    """deploy's nginx config listening on 127.0.0.1:*listen_port*, its upstream
    servers (in order) replaced by gateways on *gateway_ports*."""
    servers = upstream_servers(conf)
    assert len(servers) == len(gateway_ports), (servers, gateway_ports)
    for server, port in zip(servers, gateway_ports, strict=True):
        conf = replace_once(
            conf,
            rf"^(\s*server\s+){re.escape(server)}(?=[\s;])",
            rf"\g<1>127.0.0.1:{port}",
            f"upstream server {server}",
        )
    return replace_once(
        conf, r"^(\s*)listen\s+[^;]+;", rf"\g<1>listen 127.0.0.1:{listen_port};", "listen"
    )


def _temp_paths(binary: str, workdir: Path) -> str:
    """Temporary-file directives for every module this nginx has, under *workdir*
    (the compiled-in ones are system directories)."""
    built = subprocess.run([binary, "-V"], capture_output=True, text=True, check=False).stderr
    lines = [
        f"client_body_temp_path {workdir / 'client_body'};",
        f"proxy_temp_path {workdir / 'proxy'};",
    ]
    for module in ("fastcgi", "uwsgi", "scgi"):
        if f"--without-http_{module}_module" not in built:
            lines.append(f"{module}_temp_path {workdir / module};")
    return "\n    ".join(lines)


def write_nginx_config(
    workdir: Path, listen_port: int, gateway_ports: list[int], binary: str
) -> Path:
    """A main nginx.conf in *workdir* that includes deploy's config (adapted by
    :func:`nginx_site`), as the official image's nginx.conf includes conf.d/."""
    workdir.mkdir(parents=True, exist_ok=True)
    site = workdir / "agui-hub.conf"
    site.write_text(nginx_site(NGINX_CONF.read_text(), listen_port, gateway_ports))
    main = workdir / "nginx.conf"
    main.write_text(
        f"""worker_processes 1;
events {{
    worker_connections 512;
}}
http {{
    access_log {workdir / "access.log"};
    {_temp_paths(binary, workdir)}
    include {site};
}}
"""
    )
    return main


def nginx_command(binary: str, workdir: Path, conf: Path, *extra: str) -> list[str]:
    """nginx with *conf*, its prefix, pid and error log in *workdir*."""
    return [
        binary,
        "-p", str(workdir),
        "-c", str(conf),
        "-e", str(workdir / "error.log"),
        "-g", f"daemon off; pid {workdir / 'nginx.pid'};",
        *extra,
    ]  # fmt: skip


class Nginx:
    """nginx in front of gateways on *gateway_ports*, on a free loopback port."""

    def __init__(self, workdir: Path, gateway_ports: list[int]) -> None:
        self.binary = nginx_binary()
        self.workdir = workdir
        self.gateway_ports = gateway_ports
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        path = self.workdir / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        """Start nginx and wait until ``/healthz`` answers 200 through it (three
        ports are tried, in case another process takes the first)."""
        for _attempt in range(3):
            self.port = free_port()
            conf = write_nginx_config(self.workdir, self.port, self.gateway_ports, self.binary)
            with (self.workdir / "stdout.log").open("ab") as out:
                # A session of its own: stop() can end the master and its workers
                # together even if the master does not shut them down.
                self.process = subprocess.Popen(
                    nginx_command(self.binary, self.workdir, conf),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._wait_serving():
                return
            self.stop()
        raise RuntimeError(f"nginx did not start:\n{self.error_log()}")

    def _wait_serving(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + 10 * TIMEOUT_SCALE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False  # e.g. the port was taken meanwhile
            if http_status(self.port, "/healthz") == 200:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Fast shutdown (SIGTERM); the whole session is killed if it lingers."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5 * TIMEOUT_SCALE)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # workers left behind, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)


# -- Redis -----------------------------------------------------------------------------------


def redis_config_for_test(conf: str, port: int, workdir: Path) -> str:
    """A deploy Redis configuration on 127.0.0.1:*port* with its data in *workdir*.

    Redis applies ``dir`` as it reads it (a missing ``/data`` is fatal), so the
    lines are replaced rather than overridden by flags.
    """
    conf = replace_once(conf, r"^bind\s.*$", "bind 127.0.0.1", "bind")
    conf = replace_once(conf, r"^port\s.*$", f"port {port}", "port")
    return replace_once(conf, r"^dir\s.*$", f"dir {workdir}", "dir")


class DeployRedis:
    """``redis-server`` running one of deploy/'s configurations (text *conf*)."""

    def __init__(self, workdir: Path, conf: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: apt-get install -y redis-server")
        self.binary = binary
        self.workdir = workdir
        self.conf = conf
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it and wait for PONG; fails with Redis's own message if the
        configuration is refused."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        path = self.workdir / "redis.conf"
        path.write_text(redis_config_for_test(self.conf, self.port, self.workdir))
        log = self.workdir / "redis.log"
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [self.binary, str(path)], stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 10 * TIMEOUT_SCALE
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server refused {path}:\n{log.read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer within 10 s:\n{log.read_text()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10 * TIMEOUT_SCALE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
