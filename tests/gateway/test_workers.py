"""``agui-hub serve --workers N`` and ``--loop``: the settings, the supervisor, and
real gateway processes on a real redis-server.

Which worker holds a connection is read from the kernel: the server side of
each loopback connection is found in /proc/net/tcp by the client's port, and
its socket inode in the workers' /proc/PID/fd. Every parent started here is
killed by the ``workers`` fixture, and so is every worker of its port, even one
whose parent is already gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from agui_hub.cli.parser import build_parser
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.config import SETTING_GROUPS, GatewayConfig
from agui_hub.gateway.workers import WORKER_FLAG

from ..conftest import TIMEOUT_SCALE, RedisServer, free_port
from ..processes import CLI, ROOT, GatewayProcess, Gateways, child_env, http_status

pytestmark = pytest.mark.timeout(90)

WAIT = 15 * TIMEOUT_SCALE
SUBPROTOCOL = "agui-hub.v1.json"
SECRET = "0123456789abcdef0123456789abcdef-workers"


# -- processes -------------------------------------------------------------------------------


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after "(comm)", which may hold spaces
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def workers_of_port(port: int) -> list[int]:
    """Worker processes serving *port*, whoever their parent is now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in argv]
        if WORKER_FLAG in words and any(
            a == "--port" and b == str(port) for a, b in itertools.pairwise(words)
        ):
            found.append(int(entry.name))
    return found


def listening(gateway: GatewayProcess) -> int:
    return gateway.log().count(f"agui-hub listening on ws://127.0.0.1:{gateway.port}")


class Workers(Gateways):
    """Gateways, and at the end every worker of their ports killed too."""

    def start_workers(self, store: str | None, *args: str, count: int = 2) -> GatewayProcess:
        gateway = self.start(store, "--workers", str(count), *args)
        wait_until(lambda: listening(gateway) >= count, f"{count} workers listening")
        wait_until(lambda: len(children_of(gateway.process.pid)) == count, "the workers")
        return gateway

    def kill_all(self) -> None:
        try:
            for gateway in self.started:
                gateway.kill()
            # Orphans drain and exit by themselves; a test does not wait for that.
            for _attempt in range(50):
                left = [pid for g in self.started for pid in workers_of_port(g.port)]
                if not left:
                    break
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
            else:
                pytest.fail(f"workers left running: {left}")
        finally:
            super().kill_all()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    manager = Workers(tmp_path)
    try:
        yield manager
    finally:
        manager.kill_all()


def store_url(redis: RedisServer) -> str:
    return f"{redis.url}?prefix=workers-{uuid.uuid4().hex[:12]}"


def serve(*args: str, env: dict[str, str] | None = None, timeout: float = WAIT) -> tuple[int, str]:
    """``agui-hub serve ARGS`` that must exit by itself: its status and stderr."""
    environment = child_env()
    environment.update(env or {})
    try:
        proc = subprocess.run(
            [*CLI, "serve", *args], cwd=ROOT, env=environment, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"agui-hub serve {' '.join(args)} did not exit within {timeout:.0f} s")
    return proc.returncode, proc.stderr.decode(errors="replace")


# -- which worker holds a connection -------------------------------------------------------------


def connection_owners(port: int, pids: list[int]) -> dict[int, int]:
    """Client port -> pid of the worker holding the server side of that connection."""
    by_inode: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01":  # ESTABLISHED
                    by_inode[inode] = int(remote.rsplit(":", 1)[1], 16)
    owners = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    inode = target.removeprefix("socket:[").removesuffix("]")
                    if target.startswith("socket:[") and inode in by_inode:
                        owners[by_inode[inode]] = pid
    return owners


async def open_many(
    url: str, count: int, headers: dict[str, str] | None = None
) -> list[ClientConnection]:
    opened = await asyncio.gather(
        *(
            connect(url, subprotocols=[SUBPROTOCOL], proxy=None,  # type: ignore[list-item]
                    open_timeout=WAIT, close_timeout=2, additional_headers=headers)
            for _ in range(count)
        ),
        return_exceptions=True,
    )  # fmt: skip
    sockets = [ws for ws in opened if isinstance(ws, ClientConnection)]
    failed = [exc for exc in opened if not isinstance(exc, ClientConnection)]
    if failed:
        close_all(sockets)
        pytest.fail(f"{len(failed)} of {count} connections failed: {failed[:3]}")
    return sockets


def close_all(sockets: list[ClientConnection]) -> None:
    for ws in sockets:
        with contextlib.suppress(Exception):
            ws.transport.abort()


def by_worker(
    sockets: list[ClientConnection], port: int, pids: list[int]
) -> dict[int, list[ClientConnection]]:
    """The connections, by the pid of the worker that holds them (all of them found)."""
    mine = {ws.local_address[1]: ws for ws in sockets}

    def every_one_found() -> dict[int, int] | None:
        owners = connection_owners(port, pids)
        return owners if set(mine) <= set(owners) else None

    owners = wait_until(every_one_found, "every connection in a worker's descriptors", 5)
    grouped: dict[int, list[ClientConnection]] = {pid: [] for pid in pids}
    for client_port, ws in mine.items():
        grouped[owners[client_port]].append(ws)
    return grouped


# -- frames ------------------------------------------------------------------------------------


async def request(ws: ClientConnection, frame: dict[str, Any]) -> dict[str, Any]:
    """Send *frame*; its reply (frames without its id are skipped)."""
    await ws.send(json.dumps(frame))
    async with asyncio.timeout(WAIT):
        while True:
            reply: dict[str, Any] = json.loads(await ws.recv())
            if reply.get("id") == frame["id"]:
                return reply


def small_run(thread: str) -> list[dict[str, Any]]:
    message = f"{thread}-m1"
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": "hello from another"},
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]


async def round_trip(viewer: ClientConnection, publisher: ClientConnection) -> None:
    """A run published through *publisher* reaches *viewer*, whole and in order."""
    thread = f"w-{uuid.uuid4().hex[:10]}"
    reply = await request(viewer, {"type": "subscribe", "id": 1, "thread": thread, "from": "start"})
    assert reply["type"] == "subscribed", reply
    events = small_run(thread)
    reply = await request(
        publisher,
        {"type": "publish", "id": 2, "thread": thread, "events": events,
         "eventIds": [f"{thread}-{i}" for i in range(len(events))]},
    )  # fmt: skip
    assert reply["type"] == "published", reply
    received: list[dict[str, Any]] = []
    async with asyncio.timeout(WAIT):
        while len(received) < len(events):
            frame = json.loads(await viewer.recv())
            if frame["type"] == "event":
                received.append(frame)
            else:  # the epoch the first event created, announced
                assert frame["type"] == "subscribed" and "id" not in frame, frame
    assert [f["offset"] for f in received] == reply["offsets"]
    assert [f["event"] for f in received] == events


async def close_code(ws: ClientConnection) -> int | None:
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        async with asyncio.timeout(WAIT):
            while True:
                await ws.recv()
    return ws.close_code


# -- settings --------------------------------------------------------------------------------


def test_defaults_and_where_the_settings_come_from(tmp_path: Path) -> None:
    config = GatewayConfig.from_env({})
    assert (config.loop, config.workers) == ("asyncio", 1)
    config.check_processes()

    redis = "redis://127.0.0.1:6379/0"
    config = GatewayConfig.from_env(
        {"AGUI_HUB_LOOP": "uvloop", "AGUI_HUB_WORKERS": "3", "AGUI_HUB_STORE": redis}
    )
    assert (config.loop, config.workers) == ("uvloop", 3)
    config.check_processes()

    path = tmp_path / "gateway.toml"
    path.write_text(f'loop = "uvloop"\nworkers = 4\nstore = "{redis}"\n')
    config = GatewayConfig.from_env({}, config_file=str(path))
    assert (config.loop, config.workers) == ("uvloop", 4)
    # A flag (an override) beats the variable, which beats the file.
    config = GatewayConfig.from_env({"AGUI_HUB_WORKERS": "5"}, config_file=str(path), workers=2)
    assert config.workers == 2

    path.write_text('workers = "2"\n')
    with pytest.raises(ValueError, match="workers = '2' is not an integer"):
        GatewayConfig.from_env({}, config_file=str(path))
    with pytest.raises(ValueError, match="AGUI_HUB_WORKERS='two' is not an integer"):
        GatewayConfig.from_env({"AGUI_HUB_WORKERS": "two"})
    for workers in (0, -1):
        with pytest.raises(ValueError, match="workers must be at least 1"):
            GatewayConfig(workers=workers)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"loop": "trio"}, "loop 'trio' is not an event loop: use asyncio or uvloop"),
        ({"loop": "UVLOOP"}, "loop 'UVLOOP' is not an event loop"),
        ({"workers": 2}, "workers 2 needs a shared store (redis:// or rediss://)"),
        ({"workers": 2, "store": "memory://"}, "on the memory:// store each process"),
        ({"workers": 2, "store": "redis://127.0.0.1:1/0", "port": 0}, "needs a fixed port"),
    ],
)
def test_settings_serve_cannot_run_are_refused(settings: dict[str, Any], message: str) -> None:
    config = GatewayConfig(**settings)  # check() is for any Gateway: these pass it
    with pytest.raises(ValueError, match=re.escape(message)):
        config.check_processes()


def test_shared_stores_pass() -> None:
    for store in ("redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "REDIS://h:1/0"):
        GatewayConfig(workers=8, store=store, loop="uvloop").check_processes()


def test_serve_help_lists_the_settings_and_hides_the_worker_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert {"loop", "workers"} <= set(SETTING_GROUPS["serving"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    assert "--loop {asyncio,uvloop}" in text and "--workers N" in text, text
    assert "agui-hub[speed]" in text
    assert WORKER_FLAG not in text


# -- usage errors ------------------------------------------------------------------------------


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agui-hub serve: "), err
    assert "Traceback" not in err
    return lines[0]


def test_workers_on_the_memory_store_exit_2_with_the_reason() -> None:
    port = str(free_port())
    for args, env in (
        (["--workers", "2"], {}),
        (["--workers", "2", "--store", "memory://"], {}),
        ([], {"AGUI_HUB_WORKERS": "3"}),
    ):
        code, err = serve("--port", port, *args, env=env)
        assert code == 2, (args, env, err)
        line = one_line(err)
        assert "needs a shared store (redis:// or rediss://)" in line, line
        assert "viewers connected to one would not see" in line, line


def test_unknown_loop_exits_2() -> None:
    port = str(free_port())
    for args, env in ((["--loop", "trio"], {}), ([], {"AGUI_HUB_LOOP": "curio"})):
        code, err = serve("--port", port, *args, env=env)
        assert code == 2, err
        assert "is not an event loop: use asyncio or uvloop" in one_line(err)


def test_uvloop_not_installed_is_a_usage_error_with_the_install_line() -> None:
    program = "import sys; sys.modules['uvloop'] = None; from agui_hub.cli import main; " \
              "sys.exit(main())"  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", program, "serve", "--port", str(free_port()), "--loop", "uvloop"],
        cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=WAIT,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "pip install 'agui-hub[speed]'" in one_line(err)


def test_workers_on_a_taken_port_exit_1(
    workers: Workers, redis_server: RedisServer, tmp_path: Path
) -> None:
    taken = workers.start(None)  # a single gateway: no SO_REUSEPORT to share with
    code, err = serve(
        "--port", str(taken.port), "--workers", "2", "--store", store_url(redis_server)
    )
    assert code == 1, err
    assert f"cannot listen on 127.0.0.1:{taken.port}" in one_line(err)
    assert workers_of_port(taken.port) == []


# -- the loop ----------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_event_loop_serves_a_round_trip_and_is_logged(workers: Workers, loop: str) -> None:
    args = ["--loop", loop] if loop == "uvloop" else []  # asyncio: the default
    gateway = await asyncio.to_thread(workers.start, None, *args)
    expected = "event loop: uvloop " if loop == "uvloop" else "event loop: asyncio ("
    assert expected in gateway.log(), gateway.log()
    sockets = await open_many(gateway.url, 2)
    try:
        await round_trip(*sockets)
    finally:
        close_all(sockets)
    gateway.signal(signal.SIGTERM)
    assert await asyncio.to_thread(gateway.wait, WAIT) == 0, gateway.log()


# -- workers -----------------------------------------------------------------------------------


async def test_workers_share_the_port_and_the_store_and_stop_on_sigterm(
    workers: Workers, redis_server: RedisServer
) -> None:
    gateway = await asyncio.to_thread(workers.start_workers, store_url(redis_server))
    pids = children_of(gateway.process.pid)
    log = gateway.log()
    for pid in pids:
        assert f"[{pid}] agui_hub.server: event loop: asyncio" in log, log
    sockets = await open_many(gateway.url, 40)
    try:
        held = by_worker(sockets, gateway.port, pids)
        assert all(held[pid] for pid in pids), {pid: len(held[pid]) for pid in pids}
        one, other = (held[pid] for pid in pids)
        await round_trip(one[0], other[0])
        await round_trip(other[1 % len(other)], one[1 % len(one)])
        assert http_status(gateway.port, "/readyz") == 200

        gateway.signal(signal.SIGTERM)
        codes = await asyncio.gather(*(close_code(ws) for ws in sockets))
        assert set(codes) == {1012}, codes  # each worker drained as one gateway does
    finally:
        close_all(sockets)
    assert await asyncio.to_thread(gateway.wait, WAIT) == 0, gateway.log()
    assert not any(alive(pid) for pid in pids)
    log = gateway.log()
    for pid in pids:
        assert f"[{pid}] agui_hub.server: agui-hub stopped" in log, log
    assert "exit status 0" in log and "restarting" not in log, log


async def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(
    workers: Workers, redis_server: RedisServer
) -> None:
    gateway = await asyncio.to_thread(workers.start_workers, store_url(redis_server))
    killed, survivor = children_of(gateway.process.pid)
    os.kill(killed, signal.SIGKILL)
    await asyncio.to_thread(
        wait_until,
        lambda: f"(pid {killed}) was killed by SIGKILL: restarting it" in gateway.log(),
        "the restart",
    )
    # Whichever worker a health check lands on answers it.
    for _ in range(20):
        assert http_status(gateway.port, "/healthz", timeout=2) == 200
    await asyncio.to_thread(wait_until, lambda: listening(gateway) >= 3, "the new worker")
    pids = children_of(gateway.process.pid)
    assert survivor in pids and killed not in pids and len(pids) == 2, pids
    (restarted,) = set(pids) - {survivor}
    assert not alive(killed)

    sockets = await open_many(gateway.url, 40)
    try:
        held = by_worker(sockets, gateway.port, pids)
        assert held[restarted] and held[survivor], {pid: len(held[pid]) for pid in pids}
        await round_trip(held[restarted][0], held[survivor][0])
    finally:
        close_all(sockets)

    gateway.signal(signal.SIGTERM)  # a restart that worked is no failure
    assert await asyncio.to_thread(gateway.wait, WAIT) == 0, gateway.log()
    assert not any(alive(pid) for pid in pids)


async def test_sighup_reaches_every_worker(
    workers: Workers, redis_server: RedisServer, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    revoked = tmp_path / "revoked.txt"
    revoked.write_text("# nobody yet\n")
    gateway = await asyncio.to_thread(
        workers.start_workers, store_url(redis_server),
        "--jwt-secret-file", str(secret), "--revocation-file", str(revoked),
    )  # fmt: skip
    pids = children_of(gateway.process.pid)
    token = encode_token(SECRET, "frank", subscribe=["*"], publish=["*"], ttl=600)
    sockets = await open_many(gateway.url, 30, {"Authorization": f"Bearer {token}"})
    try:
        held = by_worker(sockets, gateway.port, pids)
        assert all(held[pid] for pid in pids), {pid: len(held[pid]) for pid in pids}
        revoked.write_text("frank\n")
        gateway.signal(signal.SIGHUP)
        # Sooner than the periodic check (every 5 s) would notice the file.
        async with asyncio.timeout(2 * TIMEOUT_SCALE):
            codes = await asyncio.gather(*(close_code(ws) for ws in sockets))
        assert set(codes) == {4403}, codes
    finally:
        close_all(sockets)
    # Nobody died of it: SIGHUP's default action would end a process.
    assert children_of(gateway.process.pid) == pids
    assert "restarting" not in gateway.log() and "SIGHUP: passed on" in gateway.log()
    gateway.signal(signal.SIGTERM)
    assert await asyncio.to_thread(gateway.wait, WAIT) == 0, gateway.log()


async def test_workers_drain_and_exit_when_their_parent_is_killed(
    workers: Workers, redis_server: RedisServer
) -> None:
    gateway = await asyncio.to_thread(workers.start_workers, store_url(redis_server))
    pids = children_of(gateway.process.pid)
    sockets = await open_many(gateway.url, 4)
    try:
        gateway.signal(signal.SIGKILL)
        codes = await asyncio.gather(*(close_code(ws) for ws in sockets))
        assert set(codes) == {1012}, codes
    finally:
        close_all(sockets)
    await asyncio.to_thread(
        wait_until, lambda: not any(alive(pid) for pid in pids), "the orphaned workers' exit"
    )
    assert gateway.log().count("parent process of this worker is gone: draining") == 2


# -- the supervisor with stand-in workers ---------------------------------------------------


def supervise(
    worker_program: str, *options: str, signal_after: str | None = None
) -> tuple[int, str]:
    """Run a Supervisor of two ``python -c worker_program`` workers: its status and log.

    With *signal_after*, SIGTERM it once its log says that.
    """
    program = (
        "import logging, sys\n"
        "from agui_hub.gateway.workers import Supervisor\n"
        "logging.basicConfig(level='INFO', format='%(levelname)s %(message)s')\n"
        f"command = [sys.executable, '-c', {worker_program!r}]\n"
        f"sys.exit(Supervisor(command, 2, {', '.join(options)}).run())\n"
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", program], cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        if signal_after is not None:
            assert proc.stderr is not None
            seen = ""
            deadline = time.monotonic() + WAIT
            while signal_after not in seen and time.monotonic() < deadline:
                line = proc.stderr.readline()
                if not line:
                    break  # it exited: the assertions below say how
                seen += line
            proc.send_signal(signal.SIGTERM)
            _, rest = proc.communicate(timeout=WAIT)
            return proc.returncode, seen + rest
        _, err = proc.communicate(timeout=WAIT)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_that_keeps_dying_stops_everything_with_status_1() -> None:
    started = time.monotonic()
    code, log = supervise("import sys; sys.exit(1)", "restart_limit=3")
    assert code == 1, log
    assert log.count("exited with status 1: restarting it") == 3, log
    assert "after 3 restarts in 60 s: stopping every worker" in log, log
    assert time.monotonic() - started < 10 * TIMEOUT_SCALE


def test_a_worker_refusing_its_settings_is_not_restarted() -> None:
    code, log = supervise("import sys; sys.exit(2)")
    assert code == 2, log
    assert "restarting" not in log and "its settings cannot be served" in log, log


# The stand-in ignores SIGTERM and leaves when its parent is gone (end of file
# on the pipe the parent hands it): it never outlives the test.
STUBBORN = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])\n"
    "os.read(int(sys.argv[-1]), 1)\n"
)


def test_workers_that_do_not_drain_in_time_are_killed_and_the_status_is_1() -> None:
    code, log = supervise(STUBBORN, "stop_timeout=0.5", signal_after="worker 2 of 2 started")
    assert code == 1, log
    assert log.count("did not stop within 0.5 s: killing it") == 2, log
    assert log.count("was killed by SIGKILL") == 2 and "restarting" not in log, log
