"""The operator commands, ``threads``, ``info``, ``delete`` and ``check``, as real
processes against real redis-server processes.

Every command is ``python -m agui_hub.cli ...`` in a subprocess. The threads
they look at are published with :class:`~agui_hub.client.publisher.Publisher` into the
shared ``redis_server`` under a key prefix of each test's own; ``check`` runs
against redis-servers of its own, started with the settings under test
(:class:`ConfiguredRedis`), and against a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agui_hub.client.publisher import Publisher
from agui_hub.store import open_store
from agui_hub.store.contract import Checkpoint, ThreadInfo
from agui_hub.wire.offsets import offset_key

from ..conftest import TIMEOUT_SCALE, RedisServer, free_port
from ..processes import CLI, ROOT, child_env

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
LEVELS = ("OK", "WARN", "FAIL")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store_url(redis_server: RedisServer) -> str:
    """A store of the test's own on the shared redis-server: a key prefix nobody else uses."""
    return f"{redis_server.url}?prefix={unique('admin')}"


# -- running the command line ------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return self.out.splitlines()


def cli(
    *args: str,
    stdin: bytes | int = b"",
    env: dict[str, str] | None = None,
    program: list[str] | None = None,
) -> Result:
    """Run one command to its end (killed after WAIT s: a hang fails the test).

    *stdin*: bytes to pipe in, or a file descriptor (a pty's) to read from.
    """
    environment = child_env()
    environment.update(env or {})
    feed: dict[str, Any] = {"input": stdin} if isinstance(stdin, bytes) else {"stdin": stdin}
    try:
        proc = subprocess.run(
            [*(program or CLI), *args],
            capture_output=True,
            cwd=ROOT,
            env=environment,
            timeout=WAIT,
            **feed,
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed the child
        err = (exc.stderr or b"").decode(errors="replace")
        pytest.fail(f"agui-hub {' '.join(args)} did not exit within {WAIT:.0f} s: {err}")
    result = Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert "Traceback" not in result.err, result.err
    return result


def ok(*args: str, env: dict[str, str] | None = None) -> Result:
    result = cli(*args, env=env)
    assert result.code == 0, f"agui-hub {' '.join(args)} exited {result.code}: {result.err}"
    return result


# -- threads to look at -------------------------------------------------------------------------


def run_events(thread: str, runs: int) -> list[dict[str, Any]]:
    events = []
    for _ in range(runs):
        run_id = unique("run")
        events += [
            {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
            {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id},
        ]
    return events


def publish(url: str, thread: str, runs: int) -> list[str]:
    """Publish *runs* runs (two events each) into *thread*; their offsets."""

    async def main() -> list[str]:
        async with Publisher(url) as publisher:
            offsets: list[str] = await publisher.publish_batch(thread, run_events(thread, runs))
            return offsets

    return asyncio.run(main())


def stored(url: str, thread: str) -> ThreadInfo | None:
    async def main() -> ThreadInfo | None:
        store = open_store(url)
        try:
            return await store.info(thread)
        finally:
            await store.close()

    return asyncio.run(main())


def next_millisecond(offset: str) -> None:
    """Wait until the clock is past *offset*'s millisecond: the next event is later."""
    ms = offset_key(offset)[0]
    deadline = time.monotonic() + 1
    while time.time() * 1000 <= ms + 1 and time.monotonic() < deadline:
        time.sleep(0.002)


def iso_ms(text: str) -> int:
    moment = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


# -- threads -----------------------------------------------------------------------------------


def test_threads_lists_counts_sizes_offsets_newest_activity_first(store_url: str):
    empty = ok("threads", "--store", store_url)
    assert empty.out == "" and "no threads in" in empty.err, empty

    # Published a, b, c, then a again: a is the most recently active, b the least,
    # which neither the names' order nor the order of creation gives.
    a, b, c = (unique(name) for name in ("a", "b", "c"))
    offsets: dict[str, list[str]] = {a: [], b: [], c: []}
    for thread, runs in ((a, 1), (b, 3), (c, 2), (a, 1)):
        offsets[thread] += publish(store_url, thread, runs)
        next_millisecond(offsets[thread][-1])
    expected = [a, c, b]

    listed = ok("threads", "--json", "--store", store_url)
    records = [json.loads(line) for line in listed.lines()]
    assert [r["thread"] for r in records] == expected, listed.out
    assert "3 threads in" in listed.err, listed.err
    for record in records:
        thread = record["thread"]
        info = stored(store_url, thread)
        assert info is not None
        assert record["events"] == len(offsets[thread]) == info.length
        assert record["bytes"] == info.bytes > 0
        assert (record["first"], record["last"]) == (offsets[thread][0], offsets[thread][-1])
        assert record["epoch"] == info.epoch
        assert record["trimmed"] is None
        assert 0 < record["ttl"] <= 7 * 24 * 3600
        assert iso_ms(record["lastActivity"]) == offset_key(offsets[thread][-1])[0]
    assert [r["events"] for r in records] == [4, 4, 6]

    # The table: a header, then one row per thread in the same order.
    table = ok("threads", "--store", store_url)
    header, *rows = table.lines()
    assert header.split()[:5] == ["THREAD", "EVENTS", "BYTES", "FIRST", "LAST"], table.out
    assert [row.split()[0] for row in rows] == expected, table.out
    for row, record in zip(rows, records, strict=True):
        cells = row.split()
        assert cells[1] == str(record["events"])
        assert record["first"] in cells and record["last"] in cells and record["epoch"] in cells
        assert record["lastActivity"][:19] + "Z" in cells

    # --limit keeps the most recently active; the store may come from the environment.
    limited = ok("threads", "--json", "--limit", "2", env={"AGUI_HUB_STORE": store_url})
    assert [json.loads(line)["thread"] for line in limited.lines()] == expected[:2]
    assert "the 2 most recently active of 3 threads" in limited.err, limited.err
    # --scan bounds how many are looked at, and says that it did.
    scanned = ok("threads", "--json", "--scan", "2", "--store", store_url)
    assert len(scanned.lines()) == 2
    assert "more than 2 threads" in scanned.err, scanned.err


# -- info --------------------------------------------------------------------------------------


def test_info_shows_one_thread_with_its_checkpoint(store_url: str):
    thread = unique("info")
    offsets = publish(store_url, thread, 2)
    info = stored(store_url, thread)
    assert info is not None

    shown = ok("info", thread, "--json", "--store", store_url)
    (line,) = shown.lines()
    record = json.loads(line)
    assert record["thread"] == thread and record["epoch"] == info.epoch
    assert (record["events"], record["bytes"]) == (4, info.bytes)
    assert (record["first"], record["last"]) == (offsets[0], offsets[-1])
    assert record["runId"] == info.run_id is not None
    assert record["checkpoint"] is None

    async def checkpoint() -> None:
        store = open_store(store_url)
        try:
            await store.put_checkpoint(thread, Checkpoint(offsets[-1], info.epoch, b"\x90"))
        finally:
            await store.close()

    asyncio.run(checkpoint())
    again = json.loads(ok("info", thread, "--json", "--store", store_url).out)
    assert again["checkpoint"] == {
        "offset": offsets[-1],
        "epoch": info.epoch,
        "complete": True,
        "bytes": 1,
        "current": True,
    }

    text = ok("info", thread, "--store", store_url)
    # "name  value", the values lined up after the longest name.
    fields = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in text.lines())
    assert fields["thread"] == thread and fields["epoch"] == info.epoch, text.out
    assert fields["events"] == "4" and fields["first"] == offsets[0], text.out
    assert fields["checkpoint"].startswith(f"at {offsets[-1]}"), text.out
    assert fields["trimmed"] == "nothing" and fields["expires"].startswith("in 6 d 23 h")
    assert fields["last"] == offsets[-1] and fields["last activity"] == record["lastActivity"]

    missing = cli("info", unique("nothing"), "--store", store_url)
    assert missing.code == 1 and missing.out == "", missing
    assert "does not exist" in missing.err, missing.err


# -- delete ------------------------------------------------------------------------------------


def test_runs_reads_the_tree_from_the_store(store_url: str):
    thread = unique("runs")
    publish(store_url, thread, 3)
    listed = [
        json.loads(x) for x in ok("runs", thread, "--json", "--store", store_url).out.splitlines()
    ]
    assert [r["status"] for r in listed] == ["finished"] * 3
    # Each continues the run before it: one straight branch.
    assert [r["parentRunId"] for r in listed] == [None, listed[0]["runId"], listed[1]["runId"]]
    text = ok("runs", thread, "--store", store_url, "--limit", "2")
    assert text.out.splitlines() == [
        f"{listed[1]['runId']}  finished",
        f"└─ {listed[2]['runId']}  finished",
    ], text.out
    assert "older ones left out" in text.err
    nothing = ok("runs", unique("empty"), "--store", store_url)
    assert nothing.out == "" and "has no runs" in nothing.err


def test_delete_with_yes_deletes_and_says_what(store_url: str):
    thread, other = unique("doomed"), unique("kept")
    offsets = publish(store_url, thread, 2)
    publish(store_url, other, 1)
    info = stored(store_url, thread)
    assert info is not None

    done = ok("delete", thread, "--yes", "--store", store_url)
    assert done.out.startswith(f"deleted thread {thread!r} from "), done.out
    assert f"4 events ({info.bytes} B), offsets {offsets[0]} to {offsets[-1]}" in done.out
    assert f"epoch {info.epoch}" in done.out
    assert stored(store_url, thread) is None
    assert stored(store_url, other) is not None
    listed = ok("threads", "--json", "--store", store_url)
    assert [json.loads(line)["thread"] for line in listed.lines()] == [other]

    again = cli("delete", thread, "--yes", "--store", store_url)
    assert again.code == 1 and again.out == "", again
    assert f"thread {thread!r} does not exist" in again.err, again.err


def test_delete_without_a_terminal_refuses_unless_told_yes(store_url: str):
    thread = unique("kept")
    publish(store_url, thread, 1)
    for stdin in (b"", f"{thread}\n".encode()):  # not even when the id is piped in
        refused = cli("delete", thread, "--store", store_url, stdin=stdin)
        assert refused.code == 2 and refused.out == "", refused
        assert "stdin is not a terminal" in refused.err and "--yes" in refused.err
    info = stored(store_url, thread)
    assert info is not None and info.length == 2


def test_delete_on_a_terminal_asks_for_the_thread_id(store_url: str):
    thread = unique("asked")
    publish(store_url, thread, 1)

    def answer(text: str) -> Result:
        # The answer is typed ahead: the terminal keeps the line until it is read.
        controller, terminal = os.openpty()
        try:
            os.write(controller, text.encode() + b"\n")
            return cli("delete", thread, "--store", store_url, stdin=terminal)
        finally:
            os.close(terminal)
            os.close(controller)

    wrong = answer(thread[:-1])
    assert wrong.code == 1 and wrong.out == "", wrong
    assert f"Type the thread id ({thread}) to delete it" in wrong.err, wrong.err
    assert "2 events" in wrong.err and "not deleted" in wrong.err, wrong.err
    assert stored(store_url, thread) is not None

    right = answer(thread)
    assert right.code == 0, right
    assert right.out.startswith(f"deleted thread {thread!r}"), right.out
    assert stored(store_url, thread) is None


# -- bad input, unreachable stores -------------------------------------------------------------


def test_a_memory_store_is_refused_as_out_of_reach():
    for command in (["threads"], ["info", "t"], ["delete", "t", "--yes"], ["check"]):
        memory = cli(*command, "--store", "memory://")
        assert memory.code == 2 and memory.out == "", (command, memory)
        assert "memory:// store lives inside the one gateway process" in memory.err
        assert "it needs a shared store: --store redis://HOST:PORT/DB" in memory.err


def test_store_urls_and_limits_that_cannot_work_are_usage_errors():
    for command in (["threads"], ["check"]):
        gateway = cli(*command, "--store", "ws://127.0.0.1:8765")
        assert gateway.code == 2 and "is a gateway" in gateway.err, (command, gateway)
        nothing = cli(*command)
        assert nothing.code == 2 and "AGUI_HUB_STORE" in nothing.err, (command, nothing)
        option = cli(*command, "--store", "redis://127.0.0.1:1/0?maxlen=5")
        assert option.code == 2 and "unknown store URL option 'maxlen'" in option.err
    for flag in ("--limit", "--scan"):
        zero = cli("threads", flag, "0", "--store", "redis://127.0.0.1:1/0")
        assert zero.code == 2 and f"{flag} must be at least 1" in zero.err


def test_an_unreachable_store_exits_1_and_check_exits_2():
    url = f"redis://127.0.0.1:{free_port()}/0"
    for command in (["threads"], ["info", "t"], ["delete", "t", "--yes"]):
        result = cli(*command, "--store", url)
        assert result.code == 1 and result.out == "", (command, result)
        assert f"Redis at {url} is unavailable" in result.err, result.err
    check = cli("check", "--store", url)
    assert check.code == 2, check
    (line,) = check.lines()
    assert line.startswith("FAIL reachable: ") and "nothing else was checked" in line


def test_without_the_redis_package_threads_exits_1_and_check_2():
    program = [sys.executable, "-c", "import sys; sys.modules['redis'] = None; "
               "from agui_hub.cli import main; sys.exit(main())"]  # fmt: skip
    url = f"redis://127.0.0.1:{free_port()}/0"
    threads = cli("threads", "--store", url, program=program)
    assert threads.code == 1 and "pip install 'agui-hub[redis]'" in threads.err, threads
    check = cli("check", "--store", url, program=program)
    assert check.code == 2 and "pip install 'agui-hub[redis]'" in check.err, check


# -- check -------------------------------------------------------------------------------------


class ConfiguredRedis:
    """redis-server processes started with the flags a test gives, on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *flags: str) -> str:
        """A redis-server with *flags* (on top of Redis's defaults); its URL."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: apt-get install -y redis-server")
        for _attempt in range(3):  # another process may take the port first
            port = free_port()
            workdir = self.workdir / f"redis-{port}"
            workdir.mkdir(parents=True)
            process = subprocess.Popen(
                [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
                 "--loglevel", "warning", *flags],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self.processes.append(process)
            if self._answers(process, port):
                return f"redis://127.0.0.1:{port}/0"
        pytest.fail(f"redis-server {' '.join(flags)} did not start")

    @staticmethod
    def _answers(process: subprocess.Popen[bytes], port: int) -> bool:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    # NOAUTH: it answers, and wants a password.
                    if sock.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop_all(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(timeout=WAIT)


@pytest.fixture
def redis_with(tmp_path: Path) -> Iterator[ConfiguredRedis]:
    servers = ConfiguredRedis(tmp_path)
    try:
        yield servers
    finally:
        servers.stop_all()


def verdicts(result: Result) -> dict[str, tuple[str, str]]:
    """The check's lines by name: ``{"appendonly": ("OK", "yes: ...")}``."""
    found = {}
    for line in result.lines():
        level, _, rest = line.partition(" ")
        name, _, text = rest.strip().partition(": ")
        assert level in LEVELS and name and text, line
        assert name not in found, f"{name} checked twice: {result.out}"
        found[name] = (level, text)
    return found


def durability_warnings(url: str) -> list[str]:
    async def main() -> list[str]:
        store = open_store(url)
        try:
            return await store.durability_warnings()
        finally:
            await store.close()

    return asyncio.run(main())


LOSES_EVENTS = "loses every acknowledged event"


@pytest.mark.parametrize(
    ("flags", "query", "failed", "phrases"),
    [
        pytest.param(
            ["--appendonly", "yes", "--maxmemory-policy", "noeviction"], "", set(), [], id="aof"
        ),
        pytest.param([], "", {"appendonly"}, ["RDB snapshots only", LOSES_EVENTS], id="defaults"),
        pytest.param(["--save", ""], "", {"appendonly"}, ["persists nothing"], id="no-persistence"),
        pytest.param(
            ["--maxmemory-policy", "allkeys-lru"],
            "",
            {"appendonly", "maxmemory-policy"},
            ["allkeys-lru (maxmemory 0: no limit)", "as soon as a maxmemory is set"],
            id="allkeys-lru",
        ),
        pytest.param(
            ["--appendonly", "yes", "--appendfsync", "no"],
            "",
            {"appendfsync"},
            ["~30 s"],
            id="appendfsync-no",
        ),
        pytest.param(
            ["--appendonly", "yes", "--maxmemory-policy", "volatile-lru"],
            "",
            {"maxmemory-policy"},
            ["gives every thread's keys one"],
            id="volatile-lru-ttl",
        ),
        # ... which is fine for a store URL whose threads never expire.
        pytest.param(
            ["--appendonly", "yes", "--maxmemory-policy", "volatile-lru"],
            "?ttl=0",
            set(),
            [],
            id="volatile-lru-no-ttl",
        ),
    ],
)
def test_check_reports_each_setting_and_exits_1_when_a_promise_breaks(
    redis_with: ConfiguredRedis, flags: list[str], query: str, failed: set[str], phrases: list[str]
):
    url = redis_with.start(*flags) + query
    result = cli("check", "--store", url)
    found = verdicts(result)
    assert set(found) == {"reachable", "appendonly", "appendfsync", "maxmemory-policy", "memory"}
    assert found["reachable"][0] == "OK" and "Redis 7" in found["reachable"][1]
    assert {name for name, (level, _) in found.items() if level == "FAIL"} == failed, result.out
    assert not any(level == "WARN" for level, _ in found.values()), result.out
    for name in failed:
        setting = {"appendonly": "appendonly yes", "appendfsync": "appendfsync everysec",
                   "maxmemory-policy": "maxmemory-policy noeviction"}[name]  # fmt: skip
        # The change to make, at once and in the configuration file.
        assert f"CONFIG SET {setting} (at once) and `{setting}` in redis.conf" in found[name][1]
    for phrase in phrases:
        assert phrase in result.out, (phrase, result.out)
    if failed:
        assert result.code == 1 and "failed" in result.err, result
    else:
        assert result.code == 0 and "keeps the hub's promises" in result.err, result
    # The same verdict as the warnings `serve` logs (and --require-durable-store obeys).
    assert bool(durability_warnings(url)) == bool(failed)


def test_check_warns_when_memory_is_nearly_full(redis_with: ConfiguredRedis):
    # An empty Redis uses nearly 1 MB: more than this maxmemory already.
    url = redis_with.start("--appendonly", "yes", "--maxmemory", "512kb")
    result = cli("check", "--store", url)
    found = verdicts(result)
    assert found["memory"][0] == "WARN" and "refuses appends" in found["memory"][1], result.out
    assert found["maxmemory-policy"][0] == "OK" and "maxmemory 512.0 KiB" in result.out
    assert result.code == 0, result  # a warning, not a broken promise


def test_check_fails_when_redis_hides_its_settings(redis_with: ConfiguredRedis):
    """Managed Redis services often refuse CONFIG: nothing can be promised then."""
    url = redis_with.start("--appendonly", "yes", "--rename-command", "CONFIG", "")
    result = cli("check", "--store", url)
    found = verdicts(result)
    assert list(found) == ["reachable", "settings"], result.out
    level, text = found["settings"]
    assert level == "FAIL" and "check by hand that appendonly is yes" in text, result.out
    assert result.code == 1, result


def test_a_wrong_password_is_refused_without_showing_it(redis_with: ConfiguredRedis):
    url = redis_with.start("--appendonly", "yes", "--requirepass", "right-secret")
    wrong = url.replace("redis://", "redis://:wrong-secret@")
    check = cli("check", "--store", wrong)
    assert check.code == 2 and check.lines()[0].startswith("FAIL reachable: "), check
    threads = cli("threads", "--store", wrong)
    assert threads.code == 1 and "unavailable" in threads.err, threads
    for result in (check, threads):
        assert "wrong-secret" not in result.out + result.err, result
        assert ":***@127.0.0.1" in result.out + result.err, result
    right = cli("check", "--store", url.replace("redis://", "redis://:right-secret@"))
    assert right.code == 0 and "right-secret" not in right.out + right.err, right
