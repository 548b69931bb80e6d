"""The ``agui-hub`` command line as real processes against real gateway processes.

Every command here is ``python -m agui_hub.cli ...`` in a subprocess, and
every hub is an ``agui-hub serve`` subprocess on a free loopback port, on the
memory store or on Redis (the ``redis_server`` fixture, one key prefix per
gateway or test). Background processes write their stdout and stderr to files
in the test's directory, so a test can watch a ``tail`` print while it runs
and SIGKILL it at a chosen moment; every process a test starts is killed in a
finalizer whatever happens.

The central property (docs/client.md, ``tail --offset-file``): a ``tail``
SIGKILLed at any moment and started again with the same offset file prints
exactly the events it had not printed yet, so the outputs of its successive
lives, concatenated, are byte for byte the transcript of an uninterrupted
``tail`` and of a fresh ``replay`` (which renders the same events with the same
renderer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agui_hub.cli.demo import demo_run

from ..conftest import TIMEOUT_SCALE, RedisServer, free_port
from ..processes import CLI, ROOT, GatewayProcess, Gateways, child_env, start_gateway

pytestmark = pytest.mark.timeout(120)

WAIT = 10 * TIMEOUT_SCALE
Event = dict[str, Any]


def retarget(event: dict[str, Any], thread: str) -> dict[str, Any]:
    """*event* as `publish` stores it in *thread*: run markers name that thread."""
    if event["type"] in ("RUN_STARTED", "RUN_FINISHED"):
        return {**event, "threadId": thread}
    return event


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll *predicate* until it returns a true value; fail the test after *timeout* s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


# -- running the command line ------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8")


def cli(
    *args: str, stdin: bytes | None = None, url_env: str | None = None, timeout: float = WAIT
) -> Result:
    """Run one command to its end (killed after *timeout* s: a hang fails the test)."""
    try:
        proc = subprocess.run(
            [*CLI, *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            cwd=ROOT,
            env=child_env(url_env),
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed the child
        err = (exc.stderr or b"").decode(errors="replace")
        pytest.fail(f"agui-hub {' '.join(args)} did not exit within {timeout:.0f} s: {err}")
    return Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def ok(*args: str, stdin: bytes | None = None, url_env: str | None = None) -> Result:
    """Run a command that must succeed."""
    result = cli(*args, stdin=stdin, url_env=url_env)
    assert result.code == 0, f"agui-hub {' '.join(args)} exited {result.code}: {result.err}"
    assert "Traceback" not in result.err, result.err
    return result


class Proc:
    """A background command; its stdout and stderr go to files that the test can watch."""

    def __init__(self, workdir: Path, name: str, args: list[str]) -> None:
        self.name = name
        self.args = args
        self.out_path = workdir / f"{name}.out"
        self.err_path = workdir / f"{name}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.process = subprocess.Popen(
                args, cwd=ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )

    def out(self) -> bytes:
        return self.out_path.read_bytes()

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def text_out(self) -> str:
        return self.out().decode("utf-8")

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float = WAIT) -> int:
        """Wait for the process to exit by itself; fail the test if it does not."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{self.name} did not exit within {timeout:.0f} s; stdout {self.out()[-300:]!r}; "
                f"stderr {self.err()[-500:]!r}"
            )

    def wait_for(self, predicate: Callable[[bytes], Any], what: str) -> None:
        """Wait until the output satisfies *predicate*; fail if the process exits first."""

        def check() -> bool:
            if predicate(self.out()):
                return True
            if not self.running() and not predicate(self.out()):
                pytest.fail(
                    f"{self.name} exited {self.process.returncode} before {what}; "
                    f"stdout {self.out()[-300:]!r}; stderr {self.err()[-500:]!r}"
                )
            return False

        wait_until(check, f"{self.name}: {what}")

    def kill(self) -> None:
        if self.running():
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=WAIT)


class Procs:
    """The background commands of one test; :meth:`kill_all` is its finalizer."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Proc] = []

    def start(self, name: str, *args: str) -> Proc:
        proc = Proc(self.workdir, f"{len(self.started):02d}-{name}", [*CLI, *args])
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    manager = Procs(tmp_path)
    try:
        yield manager
    finally:
        manager.kill_all()


# -- gateway processes -----------------------------------------------------------------------


@contextlib.contextmanager
def gateway_process(workdir: Path, store: str, port: int | None = None) -> Iterator[GatewayProcess]:
    workdir.mkdir(parents=True, exist_ok=True)
    gateway = start_gateway(workdir, store, port, ready_path="/readyz")
    try:
        yield gateway
    finally:
        gateway.kill()
    print(gateway.log()[-3000:])  # shown when the test failed
    assert not gateway.logged_errors(), gateway.log()[-4000:]


def redis_url(redis: RedisServer, prefix: str | None = None) -> str:
    return f"{redis.url}?prefix={prefix or unique('cli')}"


@pytest.fixture(scope="module")
def memory_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway on the memory store for the module; tests use threads of their own."""
    with gateway_process(tmp_path_factory.mktemp("gw-memory"), "memory://") as gateway:
        yield gateway


@pytest.fixture(scope="module")
def redis_gateway(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[GatewayProcess]:
    """One gateway on the shared redis-server (a key prefix of its own) for the module."""
    store = redis_url(redis_server)
    with gateway_process(tmp_path_factory.mktemp("gw-redis"), store) as gateway:
        yield gateway


@pytest.fixture(params=["memory", "redis"])
def gateway(request: pytest.FixtureRequest) -> GatewayProcess:
    gw: GatewayProcess = request.getfixturevalue(f"{request.param}_gateway")
    return gw


# -- events and what the commands print ----------------------------------------------------------


def finished_line(run_id: str) -> bytes:
    return f"── run {run_id} finished\n".encode()


def ndjson(items: list[Any]) -> bytes:
    return "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items).encode()


def small_run(thread: str, run_id: str, text: str = "Hello, wörld ✓") -> list[Event]:
    """A valid run: a step and an assistant message streamed in three deltas."""
    message = f"{run_id}-m"
    words = [text[:3], text[3:7], text[7:]]
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
        {"type": "STEP_STARTED", "stepName": "answer"},
        {"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
        *({"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": w} for w in words),
        {"type": "TEXT_MESSAGE_END", "messageId": message},
        {"type": "STEP_FINISHED", "stepName": "answer"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id},
    ]


def envelopes(events: list[Event], id_prefix: str) -> list[dict[str, Any]]:
    return [{"event": e, "eventId": f"{id_prefix}-{i}"} for i, e in enumerate(events)]


def offset_key(offset: str) -> tuple[int, int]:
    ms, seq = offset.split("-")
    return int(ms), int(seq)


def parse_offsets(out: bytes) -> list[str]:
    offsets = out.decode().splitlines()
    for offset in offsets:
        assert re.fullmatch(r"\d+-\d+", offset), offsets
    keys = [offset_key(o) for o in offsets]
    assert keys == sorted(keys) and len(set(keys)) == len(keys), f"not increasing: {offsets}"
    return offsets


def replay_json(thread: str, url: str) -> list[dict[str, Any]]:
    """Every stored record of *thread*, checked: offsets strictly increasing, no snapshot,
    each with the eventId derived from the thread and the offset."""
    result = ok("replay", thread, "--url", url, "--json")
    records = [json.loads(line) for line in result.text.splitlines()]
    keys = [offset_key(r["offset"]) for r in records]
    assert keys == sorted(keys) and len(set(keys)) == len(keys), "offsets not increasing"
    for record in records:
        assert set(record) == {"offset", "event", "eventId"}, record
        assert record["eventId"] == f"{thread}@{record['offset']}", record
    return records


def replay_transcript(thread: str, url: str) -> bytes:
    return ok("replay", thread, "--url", url).out


def read_position(path: Path) -> dict[str, Any] | None:
    """The record of an offset file, or None while it is empty or being written."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None


def position_is(path: Path, offset: str) -> bool:
    record = read_position(path)
    return record is not None and record.get("offset") == offset


# == tail --offset-file: SIGKILL and resume =======================================================


def test_demo_two_tails_one_killed_three_times(
    gateway: GatewayProcess, procs: Procs, tmp_path: Path
):
    """Tail A follows a demo run; tail B is SIGKILLed three times during it and resumed.

    concat(B1..B4) == A == a fresh replay transcript, byte for byte: every
    event of the run printed exactly once, the interrupted lines continued.
    """
    thread, run_id = unique("demo"), unique("run")
    pos = tmp_path / "b.pos"
    tail_b = ("tail", thread, "--url", gateway.url, "--offset-file", str(pos), "--until-finished")
    tail_a = procs.start("tail-a", "tail", thread, "--url", gateway.url, "--until-finished")
    b = procs.start("tail-b1", *tail_b)
    demo = procs.start("demo", "demo", thread, "--url", gateway.url, "--run-id", run_id,
                       "--speed", "1.5")  # fmt: skip
    done = finished_line(run_id)

    # Kill moments: after a few lines, after one more line, after any new byte.
    conditions: list[Callable[[bytes], bool]] = [
        lambda out: out.count(b"\n") >= 3,
        lambda out: out.count(b"\n") >= 1,
        lambda out: len(out) > 0,
    ]
    outputs: list[bytes] = []
    kills = 0
    for life, condition in enumerate(conditions, start=1):
        b.wait_for(lambda out, c=condition: c(out) or done in out, f"output to kill life {life}")
        if not b.running() or done in b.out():
            break  # the run finished first: no more kills
        b.process.send_signal(signal.SIGKILL)
        b.process.wait(timeout=WAIT)
        kills += 1
        outputs.append(b.out())
        assert outputs[-1], f"life {life} printed nothing"
        b = procs.start(f"tail-b{life + 1}", *tail_b)
    assert b.wait() == 0, b.err()
    outputs.append(b.out())
    assert demo.wait() == 0, demo.err()
    assert tail_a.wait() == 0, tail_a.err()

    # Enough kills landed during the run to mean something (two of them at least).
    print("KILLS", kills, [len(o) for o in outputs])
    assert kills >= 2, f"only {kills} kill(s) before the run finished"
    assert all(done not in out for out in outputs[:-1])
    a_out = tail_a.out()
    assert a_out.startswith(f"── run {run_id} started\n".encode())
    assert a_out.endswith(done) and a_out.count(done) == 1
    assert b"".join(outputs) == a_out
    assert outputs[-1].endswith(done)

    # Exactly the stored events, once each: the same renderer over a fresh replay.
    assert replay_transcript(thread, gateway.url) == a_out
    records = replay_json(thread, gateway.url)
    assert [r["event"] for r in records] == [event for _, event in demo_run(thread, run_id)]
    saved = read_position(pos)
    assert saved is not None and saved["thread"] == thread
    assert saved["offset"] == records[-1]["offset"]


def test_tail_killed_then_restarted_after_the_run_finished(
    memory_gateway: GatewayProcess, procs: Procs, tmp_path: Path
):
    thread, run_id = unique("late"), unique("run")
    pos = tmp_path / "late.pos"
    args = ("tail", thread, "--url", memory_gateway.url, "--offset-file", str(pos),
            "--until-finished")  # fmt: skip
    first = procs.start("tail-1", *args)
    demo = procs.start("demo", "demo", thread, "--url", memory_gateway.url, "--run-id", run_id,
                       "--speed", "2")  # fmt: skip
    first.wait_for(lambda out: out.count(b"\n") >= 2, "two lines")
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=WAIT)
    assert demo.wait() == 0, demo.err()  # the gateway kept running; the run is over
    assert finished_line(run_id) not in first.out(), "killed too late to mean anything"

    second = procs.start("tail-2", *args)
    assert second.wait() == 0, second.err()  # --until-finished: it ends by itself
    full = replay_transcript(thread, memory_gateway.url)
    assert full.endswith(finished_line(run_id))
    assert first.out() and second.out()
    assert first.out() + second.out() == full


def test_offset_file_continues_the_interrupted_line(
    memory_gateway: GatewayProcess, procs: Procs, tmp_path: Path
):
    """Kills at chosen moments: mid reasoning, mid tool arguments (events published while
    the tail was dead), mid answer; each life continues the line where the last stopped."""
    url = memory_gateway.url
    thread, run_id = unique("midline"), unique("run")
    events = [event for _, event in demo_run(thread, run_id)]
    types = [e["type"] for e in events]
    cut1 = types.index("REASONING_MESSAGE_START") + 6
    cut2 = types.index("TOOL_CALL_START") + 3
    cut3 = len(events) - 12  # inside the streamed answer
    assert types[cut1 - 1] == "REASONING_MESSAGE_CONTENT"
    assert types[cut2 - 1] == "TOOL_CALL_ARGS"
    assert types[cut3 - 1] == "TEXT_MESSAGE_CONTENT"
    pieces = [events[:cut1], events[cut1:cut2], events[cut2:cut3], events[cut3:]]
    stored: list[str] = []
    for number, piece in enumerate(pieces):
        path = tmp_path / f"piece{number}.ndjson"
        begin = sum(len(p) for p in pieces[:number])
        path.write_bytes(ndjson([{"event": e, "eventId": f"{run_id}-{begin + i}"}
                                 for i, e in enumerate(piece)]))  # fmt: skip

    def publish(number: int) -> list[str]:
        offsets = parse_offsets(ok("publish", thread, str(tmp_path / f"piece{number}.ndjson"),
                                   "--url", url).out)  # fmt: skip
        assert len(offsets) == len(pieces[number])
        stored.extend(offsets)
        return offsets

    pos = tmp_path / "mid.pos"
    args = ("tail", thread, "--url", url, "--offset-file", str(pos), "--until-finished")
    publish(0)
    life1 = procs.start("tail-1", *args)
    wait_until(lambda: position_is(pos, stored[-1]), "life 1 to print piece 0")
    life1.kill()
    publish(1)  # while no tail runs
    life2 = procs.start("tail-2", *args)
    wait_until(lambda: position_is(pos, stored[-1]), "life 2 to catch up with piece 1")
    publish(2)  # live
    wait_until(lambda: position_is(pos, stored[-1]), "life 2 to print piece 2")
    life2.kill()
    publish(3)
    life3 = procs.start("tail-3", *args)
    assert life3.wait() == 0, life3.err()

    outs = [life1.out(), life2.out(), life3.out()]
    # Killed mid-line; the next life continues that line, without a new header.
    assert b"\nthinking: " in outs[0] and outs[0].endswith(events[cut1 - 1]["delta"].encode())
    assert outs[1].startswith(events[cut1]["delta"].encode())
    assert not outs[1].endswith(b"\n") and not outs[2].startswith(b"assistant")
    full = replay_transcript(thread, url)
    assert b"".join(outs) == full
    assert full.endswith(finished_line(run_id)) and b"(cont.)" not in full
    assert [r["offset"] for r in replay_json(thread, url)] == stored


# == tail: starts, offset files, waiting for the gateway ===========================================


def test_tail_from_live(memory_gateway: GatewayProcess, procs: Procs, tmp_path: Path):
    url = memory_gateway.url
    thread = unique("live")
    (tmp_path / "r1.ndjson").write_bytes(ndjson(small_run(thread, "r1")))
    ok("publish", thread, str(tmp_path / "r1.ndjson"), "--url", url)
    tail = procs.start("tail-live", "tail", thread, "--url", url, "--from", "live",
                       "--until-finished")  # fmt: skip
    # Nothing can tell when the tail has subscribed: publish short runs (one batch
    # each) until it shows one, and it must show exactly that one.
    published = []
    deadline = time.monotonic() + WAIT
    for number in range(2, 40):
        if tail.out() or not tail.running() or time.monotonic() > deadline:
            break
        run_id = f"r{number}"
        path = tmp_path / f"{run_id}.ndjson"
        path.write_bytes(ndjson([
            {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
            {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id},
        ]))  # fmt: skip
        ok("publish", thread, str(path), "--url", url)
        published.append(run_id)
        time.sleep(0.1)
    assert tail.wait() == 0, tail.err()
    match = re.fullmatch(r"── run (r\d+) started\n── run \1 finished\n", tail.text_out())
    assert match, tail.out()
    assert match.group(1) in published  # not r1, which was there before the tail


def test_tail_from_snapshot_then_live_then_sigint(memory_gateway: GatewayProcess, procs: Procs,
                                                  tmp_path: Path):  # fmt: skip
    url = memory_gateway.url
    thread = unique("snap")
    (tmp_path / "r1.ndjson").write_bytes(ndjson(small_run(thread, "r1")))
    ok("publish", thread, str(tmp_path / "r1.ndjson"), "--url", url)
    full = replay_transcript(thread, url)
    assert b"\xe2\x96\xb8 step answer\n" in full  # "▸ step answer": the stream shows steps

    tail = procs.start("tail-snap", "tail", thread, "--url", url, "--from", "snapshot")
    tail.wait_for(lambda out: finished_line("r1") in out, "the snapshot")
    snap = tail.out()
    assert snap.startswith(b"\xe2\x94\x80\xe2\x94\x80 run r1 started\n")
    assert "assistant: Hello, wörld ✓\n".encode() in snap
    assert snap.endswith(finished_line("r1"))
    assert "▸ step".encode() not in snap and snap != full  # compacted, not replayed

    # It keeps following: a new run shows up live.
    (tmp_path / "r2.ndjson").write_bytes(ndjson(small_run(thread, "r2", "second run")))
    ok("publish", thread, str(tmp_path / "r2.ndjson"), "--url", url)
    tail.wait_for(lambda out: finished_line("r2") in out, "the live run r2")
    assert tail.out() == snap + replay_transcript(thread, url)[len(full) :]
    tail.process.send_signal(signal.SIGINT)
    assert tail.wait() == 130  # interrupted
    assert "Traceback" not in tail.err()


def test_tail_from_offset_and_epoch(memory_gateway: GatewayProcess, procs: Procs, tmp_path: Path):
    url = memory_gateway.url
    thread, run_id = unique("offset"), unique("run")
    ok("demo", thread, "--url", url, "--run-id", run_id, "--speed", "0")
    records = replay_json(thread, url)
    full = replay_transcript(thread, url)

    # A plain tail from the start prints the whole transcript; its file gives the epoch.
    pos = tmp_path / "epoch.pos"
    whole = ok("tail", thread, "--url", url, "--offset-file", str(pos), "--until-finished")
    assert whole.out == full
    saved = read_position(pos)
    assert saved is not None and saved["offset"] == records[-1]["offset"]
    epoch = saved["epoch"]
    assert isinstance(epoch, str) and epoch

    # From the offset of "step plan done": exactly the rest, as a fresh view renders it.
    index = next(
        i for i, r in enumerate(records)
        if r["event"] == {"type": "STEP_FINISHED", "stepName": "plan"}
    )  # fmt: skip
    offset = records[index]["offset"]
    marker = "▸ step plan done\n".encode()
    rest = full[full.index(marker) + len(marker) :]
    assert rest.startswith(b"assistant: Let me check")
    for start in (f"{offset}@{epoch}", offset):
        result = ok("tail", thread, "--url", url, "--from", start, "--until-finished")
        assert result.out == rest, start

    # In an epoch the thread never had: said so, and a snapshot instead.
    tail = procs.start("tail-epoch", "tail", thread, "--url", url,
                       "--from", f"{offset}@ffffffffffffffff")  # fmt: skip
    tail.wait_for(lambda out: finished_line(run_id) in out, "the snapshot")
    out = tail.out().decode()
    notice = "events were lost to retention or a reset: a snapshot follows"
    assert out.startswith(f"── {notice}\n── run {run_id} started\n"), out[:300]
    assert "assistant: Paris is sunny" in out


def test_tail_offset_file_of_another_thread_or_corrupt(
    memory_gateway: GatewayProcess, tmp_path: Path
):
    url = memory_gateway.url
    thread = unique("owner")
    (tmp_path / "run.ndjson").write_bytes(ndjson(small_run(thread, "r1")))
    ok("publish", thread, str(tmp_path / "run.ndjson"), "--url", url)
    pos = tmp_path / "owner.pos"
    ok("tail", thread, "--url", url, "--offset-file", str(pos), "--until-finished")
    before = pos.read_bytes()
    other = unique("other")
    result = cli("tail", other, "--url", url, "--offset-file", str(pos))
    assert result.code == 2, result
    assert f"thread {thread!r}, not {other!r}" in result.err and "another file" in result.err
    assert "Traceback" not in result.err and result.out == b""
    assert pos.read_bytes() == before  # left alone

    saved = read_position(pos)
    assert saved is not None
    corrupt = {
        "garbage": b"garbage\n",
        "truncated": before[: len(before) // 3],
        "a list": b"[1, 2]\n",
        "a bad offset": json.dumps({**saved, "offset": "twelve"}).encode(),
        "a bad epoch": json.dumps({**saved, "epoch": 12}).encode(),
        "a bad view": json.dumps({**saved, "view": "open"}).encode(),
        "an unknown view version": json.dumps({**saved, "view": {"version": 99}}).encode(),
    }
    for what, data in corrupt.items():
        bad = tmp_path / "corrupt.pos"
        bad.write_bytes(data)
        # Unreachable URL: had the file been accepted, the tail would wait, not exit.
        result = cli("tail", thread, "--url", f"ws://127.0.0.1:{free_port()}",
                     "--offset-file", str(bad))  # fmt: skip
        assert result.code == 2, (what, result)
        assert str(bad) in result.err, (what, result.err)
        assert "Traceback" not in result.err and result.out == b"", (what, result)
        assert bad.read_bytes() == data, what


def test_tail_and_publish_started_before_the_gateway_wait_for_it(procs: Procs, tmp_path: Path):
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    thread = unique("early")
    events = small_run(thread, "r1")
    path = tmp_path / "early.ndjson"
    path.write_bytes(ndjson(events))
    tail = procs.start("tail-early", "tail", thread, "--url", url, "--until-finished")
    publish = procs.start("publish-early", "publish", thread, str(path), "--url", url)
    wait_until(lambda: "retrying" in tail.err(), "the tail to say it is retrying")
    assert tail.running() and tail.out() == b""
    assert f"cannot connect to {url}" in tail.err()
    assert publish.running() and publish.out() == b""
    with gateway_process(tmp_path / "late-gw", "memory://", port=port) as gateway:
        assert publish.wait() == 0, publish.err()
        assert tail.wait() == 0, tail.err()
        records = replay_json(thread, gateway.url)
        assert [r["event"] for r in records] == events  # stored once
        assert parse_offsets(publish.out()) == [r["offset"] for r in records]
        assert tail.out() == replay_transcript(thread, gateway.url)
        assert tail.out().endswith(finished_line("r1"))


# == publish =======================================================================================


def replay_into(source: str, copy: str, url: str) -> subprocess.CompletedProcess[bytes]:
    """``replay SOURCE --json | publish COPY -``, a real pipe between two processes."""
    env = child_env()
    with subprocess.Popen([*CLI, "replay", source, "--url", url, "--json"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as replay:  # fmt: skip
        try:
            assert replay.stdout is not None
            publish = subprocess.run([*CLI, "publish", copy, "-", "--url", url], cwd=ROOT,
                                     env=env, stdin=replay.stdout, capture_output=True,
                                     timeout=WAIT)  # fmt: skip
            replay.stdout.close()
            assert replay.wait(timeout=WAIT) == 0
        finally:
            replay.kill()
    return publish


def test_publish_file_then_pipe(memory_gateway: GatewayProcess, tmp_path: Path):
    url = memory_gateway.url
    thread = unique("pub")
    first, second = small_run(thread, "r1"), small_run(thread, "r2", "second ✓")
    path = tmp_path / "r1.ndjson"
    path.write_bytes(ndjson(first) + b"\n")  # a blank line is skipped
    offsets = parse_offsets(ok("publish", thread, str(path), "--url", url).out)
    assert len(offsets) == len(first)
    # From a pipe, and the URL from AGUI_HUB_URL.
    piped = parse_offsets(ok("publish", thread, "-", stdin=ndjson(second), url_env=url).out)
    assert len(piped) == len(second)
    assert offset_key(piped[0]) > offset_key(offsets[-1])
    records = replay_json(thread, url)
    assert [r["offset"] for r in records] == offsets + piped
    assert [r["event"] for r in records] == first + second


def test_publish_replay_json_roundtrip_and_idempotent_envelopes(
    memory_gateway: GatewayProcess, procs: Procs, tmp_path: Path
):
    url = memory_gateway.url
    source, copy = unique("src"), unique("copy")
    ok("demo", source, "--url", url, "--speed", "0")
    original = replay_json(source, url)
    assert len(original) == len(demo_run(source, "x"))

    # replay --json | publish copy -  (a real pipe between the two processes), twice:
    # the eventIds replay prints make the second copy store nothing.
    outputs = [replay_into(source, copy, url) for _ in range(2)]
    for publish in outputs:
        assert publish.returncode == 0, publish.stderr
    offsets = parse_offsets(outputs[0].stdout)
    assert parse_offsets(outputs[1].stdout) == offsets  # where they are: stored once
    copied = replay_json(copy, url)
    assert [r["offset"] for r in copied] == offsets
    # The copy's run markers name the thread they are in now; nothing else changed.
    assert [r["event"] for r in copied] == [retarget(r["event"], copy) for r in original]
    publish = outputs[0]
    assert "published into" in publish.stderr.decode() and copy in publish.stderr.decode()
    assert replay_transcript(copy, url) == replay_transcript(source, url)

    # Envelopes with eventIds, twice: the second run stores nothing and says where they are.
    thread = unique("idem")
    path = tmp_path / "envelopes.ndjson"
    events = small_run(thread, "r1")
    path.write_bytes(ndjson(envelopes(events, "idem")))
    once = parse_offsets(ok("publish", thread, str(path), "--url", url).out)
    twice = parse_offsets(ok("publish", thread, str(path), "--url", url).out)
    assert len(once) == len(events) and twice == once
    records = replay_json(thread, url)
    assert [r["offset"] for r in records] == once
    assert [r["event"] for r in records] == events


@pytest.mark.parametrize("via", ["gateway", "redis"])
def test_publish_refuses_a_broken_sequence_and_stores_nothing(
    via: str, redis_gateway: GatewayProcess, tmp_path: Path
):
    """docs/client.md: the error names the line and the rule; nothing of the file is stored."""
    url = redis_gateway.url if via == "gateway" else redis_gateway.store
    thread = unique("broken")
    path = tmp_path / "broken.ndjson"
    path.write_bytes(ndjson([
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m9", "delta": "x"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    ]))  # fmt: skip
    result = cli("publish", thread, str(path), "--url", url)
    assert result.code == 1, result
    assert result.out == b"" and "Traceback" not in result.err
    assert "[message_not_open]" in result.err, result.err
    assert re.search(r"\bline 3: ", result.err), result.err
    empty = cli("replay", thread, "--url", redis_gateway.url, "--json")
    assert (empty.code, empty.out) == (0, b"")


def test_publish_refuses_a_line_that_is_not_json(memory_gateway: GatewayProcess, tmp_path: Path):
    url = memory_gateway.url
    thread = unique("nojson")
    good = small_run(thread, "r1")
    path = tmp_path / "nojson.ndjson"
    path.write_bytes(ndjson(good[:2]) + b"{not json\n" + ndjson(good[2:]))
    result = cli("publish", thread, str(path), "--url", url)
    assert result.code == 1, result
    assert "line 3: not JSON" in result.err and "Traceback" not in result.err
    assert result.out == b""
    # Not a JSON object / not an event: the same, with the line.
    path.write_bytes(ndjson(good[:1]) + b"[1, 2]\n")
    result = cli("publish", thread, str(path), "--url", url)
    assert result.code == 1 and "line 2:" in result.err, result
    path.write_bytes(ndjson([good[0], {"type": "NO_SUCH_EVENT"}]))
    result = cli("publish", thread, str(path), "--url", url)
    assert result.code == 1 and "line 2:" in result.err, result
    empty = cli("replay", thread, "--url", url, "--json")
    assert (empty.code, empty.out) == (0, b"")
    assert "has no events" in empty.err


def test_publish_into_redis_and_replay_from_redis_and_gateway(
    redis_gateway: GatewayProcess, redis_server: RedisServer, tmp_path: Path
):
    # Straight into a Redis of its own prefix, read back from there.
    store = redis_url(redis_server)
    thread = unique("direct")
    events = small_run(thread, "r1")
    path = tmp_path / "direct.ndjson"
    path.write_bytes(ndjson(events))
    offsets = parse_offsets(ok("publish", thread, str(path), "--url", store).out)
    records = replay_json(thread, store)
    assert [r["offset"] for r in records] == offsets
    assert [r["event"] for r in records] == events

    # The gateway's Redis: the store and the gateway replay the same thing.
    thread = unique("shared")
    ok("demo", thread, "--url", redis_gateway.store, "--speed", "0", "--run-id", "r-shared")
    via_gateway = ok("replay", thread, "--url", redis_gateway.url, "--json").out
    via_store = ok("replay", thread, "--url", redis_gateway.store, "--json").out
    assert via_gateway == via_store
    assert len(via_gateway.splitlines()) == len(demo_run(thread, "r-shared"))
    assert replay_transcript(thread, redis_gateway.url) == replay_transcript(
        thread, redis_gateway.store
    )


# == replay and demo ===============================================================================


@pytest.mark.parametrize("where", ["gateway", "redis"])
def test_replay_of_an_empty_thread(where: str, redis_gateway: GatewayProcess):
    url = redis_gateway.url if where == "gateway" else redis_gateway.store
    thread = unique("empty")
    for args in (["--json"], []):
        result = cli("replay", thread, "--url", url, *args)
        assert result.code == 0, result
        assert result.out == b""
        assert f"thread {thread!r} has no events" in result.err


def test_demo_with_the_same_run_id_twice_stores_it_once(memory_gateway: GatewayProcess):
    url = memory_gateway.url
    thread, run_id = unique("twice"), unique("run")
    first = ok("demo", thread, "--url", url, "--run-id", run_id, "--speed", "0")
    records = replay_json(thread, url)
    assert len(records) == len(demo_run(thread, run_id))
    second = ok("demo", thread, "--url", url, "--run-id", run_id, "--speed", "0")
    assert replay_json(thread, url) == records
    end = f"run {run_id} finished at offset {records[-1]['offset']}"
    assert end in first.err and end in second.err


# == usage errors and unreachable hubs ============================================================


USAGE_ERRORS = {
    "tail needs a gateway": (["tail", "t", "--url", "redis://127.0.0.1:1/0"], "ws://"),
    "publish into memory://": (["publish", "t", "--url", "memory://"], "gateway"),
    "replay of memory://": (["replay", "t", "--url", "memory://"], "gateway"),
    "thread with a control char": (["tail", "a\x01b", "--url", "ws://127.0.0.1:1"], "control"),
    "empty thread": (["publish", "", "--url", "ws://127.0.0.1:1"], "thread name"),
    "long thread": (["replay", "x" * 257, "--url", "ws://127.0.0.1:1"], "256"),
    "bad --from": (["tail", "t", "--from", "yesterday", "--url", "ws://127.0.0.1:1"], "--from"),
    "no such file": (["publish", "t", "/nonexistent/x.ndjson", "--url", "ws://127.0.0.1:1"],
                     "cannot read"),
    "negative speed": (["demo", "t", "--speed", "-1", "--url", "ws://127.0.0.1:1"], "--speed"),
    "negative timeout": (["publish", "t", "--timeout", "-1", "--url", "ws://127.0.0.1:1"],
                         "--timeout"),
    "thread with a trailing space": (["demo", "demo ", "--url", "ws://127.0.0.1:1"],
                                     "thread name 'demo ' begins or ends with whitespace"),
    "thread with a leading space": (["publish", " t", "--url", "ws://127.0.0.1:1"],
                                    "did you mean 't'?"),
    "thread of spaces only": (["tail", " ", "--url", "ws://127.0.0.1:1"],
                              "thread name ' ' is only whitespace"),
    "replay of a spaced thread": (["replay", "t\u00a0", "--url", "ws://127.0.0.1:1"],
                                  "whitespace"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_usage_errors_exit_2(case: str):
    args, words = USAGE_ERRORS[case]
    result = cli(*args)
    assert result.code == 2, result
    assert words in result.err and result.err.startswith("agui-hub "), result.err
    assert "Traceback" not in result.err and result.out == b""


def test_unreachable_hub_is_said_at_once_then_given_up_after_timeout(procs: Procs, tmp_path: Path):
    """All four commands say at once that the hub cannot be reached, in one line with
    the URL and the reason; with --timeout they keep trying that long, then exit 1
    with one more line, no traceback."""
    url = f"ws://127.0.0.1:{free_port()}"
    path = tmp_path / "run.ndjson"
    path.write_bytes(ndjson(small_run("t", "r1")))
    timeout = f"{5 * TIMEOUT_SCALE:g}"
    started = time.monotonic()
    waiting = {
        "publish": procs.start("publish", "publish", "t", str(path), "--url", url,
                               "--timeout", timeout),
        "demo": procs.start("demo", "demo", "t", "--url", url, "--speed", "0",
                            "--timeout", timeout),
        "tail": procs.start("tail", "tail", "t", "--url", url, "--timeout", timeout),
        "replay": procs.start("replay", "replay", "t", "--url", url, "--timeout", timeout),
    }  # fmt: skip
    first = f"cannot connect to {url}: [Errno 111]"
    for name, proc in waiting.items():
        wait_until(lambda proc=proc: proc.err(), f"{name} to say something")
        # At once: long before it gives up (it used to say nothing for 30 s).
        assert proc.running(), (name, proc.err())
        line = proc.err().splitlines()[0]
        assert line.startswith(f"agui-hub {name}: {first}"), line
        assert line.endswith(f"; retrying for up to {timeout} s (--timeout)"), line
    assert time.monotonic() - started < float(timeout)
    for name, proc in waiting.items():
        assert proc.wait() == 1, (name, proc.err())
        lines = proc.err().splitlines()
        assert len(lines) == 2, (name, lines)
        gave_up = f"agui-hub {name}: gave up after {timeout} s without a connection (--timeout): "
        assert lines[1].startswith(gave_up + first), lines[1]
        assert proc.out() == b""
    assert time.monotonic() - started >= float(timeout)

    # replay fails at once by default (one line, no retry); publish and demo wait 30 s.
    for args in (["--json"], []):
        result = cli("replay", "t", "--url", url, *args)
        assert result.code == 1, result
        assert result.err.startswith(f"agui-hub replay: {first}"), result.err
        assert "Traceback" not in result.err and len(result.err.splitlines()) == 1
        assert result.out == b""
    publish = procs.start("publish-default", "publish", "t", str(path), "--url", url)
    wait_until(publish.err, "publish to say it is retrying")
    assert publish.err().rstrip("\n").endswith("retrying for up to 30 s (--timeout)")
    assert "default 30" in " ".join(ok("publish", "--help").text.split())
    assert "default 30" in " ".join(ok("demo", "--help").text.split())


def test_publish_into_a_redis_that_is_down_says_so_at_once(procs: Procs):
    store = f"redis://127.0.0.1:{free_port()}/0"
    run = ndjson(small_run("t", "r1"))
    result = cli("publish", "t", "-", "--url", store, "--timeout", "1", stdin=run)
    assert result.code == 1, result
    lines = result.err.splitlines()
    assert len(lines) == 2 and "Traceback" not in result.err, lines
    assert lines[0].startswith("agui-hub publish: ") and store in lines[0], lines
    assert lines[0].endswith("retrying for up to 1 s (--timeout)"), lines
    assert lines[1].startswith("agui-hub publish: gave up after 1 s"), lines


def test_retry_says_the_first_failure_then_every_ten_seconds():
    """One line for the first failure, then one every NOTICE_EVERY seconds, not one per
    attempt; one when the hub answers again; given up after the timeout (a fake clock)."""
    from agui_hub.cli.retry import NOTICE_EVERY
    from agui_hub.cli.retry import Retry as _Retry
    from agui_hub.errors import HubUnreachable

    assert NOTICE_EVERY == 10
    now = [0.0]
    said: list[str] = []
    retry = _Retry("publish", "ws://h:1", 25, clock=lambda: now[0], say=said.append)
    refused = HubUnreachable("cannot connect to ws://h:1: refused")
    for moment in (0, 0.1, 0.3, 0.7, 5, 9.9, 10.0, 12, 19.9, 20.2, 24.9):
        now[0] = moment
        pause = retry.failed(refused)
        assert 0 <= pause <= 25 - moment + 1e-9, (moment, pause)
    assert said == [
        "cannot connect to ws://h:1: refused; retrying for up to 25 s (--timeout)",
        "still retrying ws://h:1 (10 s so far): cannot connect to ws://h:1: refused",
        "still retrying ws://h:1 (20 s so far): cannot connect to ws://h:1: refused",
    ]
    now[0] = 25.0
    with pytest.raises(HubUnreachable) as caught:
        retry.failed(refused)
    assert str(caught.value) == (
        "gave up after 25 s without a connection (--timeout): cannot connect to ws://h:1: refused"
    )

    # The hub answers: said once; the next outage starts afresh.
    said.clear()
    now[0] = 3.0
    retry = _Retry("demo", "ws://h:1", 25, clock=lambda: now[0], say=said.append)
    retry.failed(refused)
    now[0] = 6.4
    retry.succeeded()
    retry.succeeded()
    now[0] = 100.0
    retry.failed(HubUnreachable("no connection to ws://h:1 in time"))
    assert said == [
        "cannot connect to ws://h:1: refused; retrying for up to 25 s (--timeout)",
        "connected to ws://h:1 after 3 s",
        "no connection to ws://h:1 in time; retrying for up to 25 s (--timeout)",
    ]
    # An attempt that waited for the connection a while: the outage began with it.
    said.clear()
    late = _Retry("demo", "ws://h:1", 2, clock=lambda: now[0], say=said.append)
    with pytest.raises(HubUnreachable, match="gave up after 2 s"):
        late.failed(HubUnreachable("lost the connection to ws://h:1"), now[0] - 2.5)
    assert said == ["lost the connection to ws://h:1; retrying for up to 2 s (--timeout)"]
    # No timeout: never gives up; 0: the error itself, at once, nothing said.
    forever = _Retry("tail", "ws://h:1", None, clock=lambda: now[0], say=said.append)
    forever.failed(refused)
    assert said[-1].endswith("retrying until it answers (--timeout)")
    now[0] = 1e9
    assert forever.failed(refused) > 0
    said.clear()
    with pytest.raises(HubUnreachable) as at_once:
        _Retry("replay", "ws://h:1", 0, say=said.append).failed(refused)
    assert at_once.value is refused and said == []


def test_demo_cut_short_says_how_to_finish_the_run_and_that_works(
    redis_server: RedisServer, procs: Procs, tmp_path: Path
):
    """The gateway goes away mid-run for longer than --timeout: demo says so at once,
    gives up, and names the command that finishes the run; run once the gateway is
    back, that command stores the rest, and every event of the run is stored once."""
    gateways = Gateways(tmp_path)
    try:
        store = redis_url(redis_server)  # outlives the gateway: the run's start is kept
        gateway = gateways.start(store)
        url = gateway.url
        thread, run_id = unique("cut"), unique("run")
        demo = procs.start("demo", "demo", thread, "--url", url, "--run-id", run_id,
                           "--speed", "1", "--timeout", "3")  # fmt: skip
        tail = procs.start("tail", "tail", thread, "--url", url, "--timeout", "2")
        wait_until(lambda: stored(thread, url) >= 8, "the demo's first events")
        tail.wait_for(lambda out: b"\n" in out, "the tail's first line")
        gateway.kill()
        assert demo.wait() == 1, demo.err()
        # The tail says the same: lost, then given up after its --timeout.
        assert tail.wait() == 1, tail.err()
        assert tail.err().splitlines()[-2:] == [
            f"agui-hub tail: lost the connection to {url} (code 1006); reconnecting",
            f"agui-hub tail: gave up after 2 s without a connection (--timeout): "
            f"lost the connection to {url}",
        ], tail.err()
        assert stored(thread, store) < len(demo_run(thread, run_id)), "cut too late"
        lines = demo.err().splitlines()
        assert lines[0].startswith(f"agui-hub demo: streaming run {run_id}"), lines
        assert "retrying for up to 3 s (--timeout)" in lines[1], lines
        assert len(lines) == 3 and "Traceback" not in demo.err(), lines
        assert lines[2].startswith("agui-hub demo: gave up after 3 s without a connection"), lines
        command = f"agui-hub demo {thread} --url {url} --run-id {run_id}"
        assert lines[2].endswith(
            f"; run {run_id} is unfinished: finish it, once the hub is back, with: {command}"
        ), lines[2]

        gateways.start(store, port=gateway.port)
        finish = ok(*shlex.split(command)[1:], "--speed", "0")
        assert f"run {run_id} finished" in finish.err
        records = replay_json(thread, url)
        assert [r["event"] for r in records] == [e for _, e in demo_run(thread, run_id)]
    finally:
        gateways.kill_all()


def stored(thread: str, url: str) -> int:
    """How many events *thread* has (0 while the hub cannot be reached)."""
    result = cli("replay", thread, "--url", url, "--json")
    return len(result.out.splitlines()) if result.code == 0 else 0


def test_demo_and_tail_across_a_hub_restart_on_the_memory_store(procs: Procs, tmp_path: Path):
    """The restarted hub has forgotten the thread: demo says it was reset and how to go
    on (not "[run_not_started] ... send RUN_STARTED first"), and that way works; tail
    says it lost the connection, got it back, and that events were lost."""
    gateways = Gateways(tmp_path)
    try:
        gateway = gateways.start("memory://")
        url = gateway.url
        thread, run_id = unique("reset"), unique("run")
        tail = procs.start("tail", "tail", thread, "--url", url)
        demo = procs.start("demo", "demo", thread, "--url", url, "--run-id", run_id,
                           "--speed", "1")  # fmt: skip
        tail.wait_for(lambda out: b"thinking: " in out, "the demo's reasoning")
        gateway.kill()
        gateways.start("memory://", port=gateway.port)
        assert demo.wait() == 1, demo.err()
        err = demo.err()
        assert "[run_not_started]" not in err and "Traceback" not in err, err
        said = err.splitlines()[-1]
        assert said.startswith(
            f"agui-hub demo: thread {thread!r} was reset while run {run_id} was streaming "
        ), said
        assert "its earlier events are gone" in said, said
        new_run = f"agui-hub demo {thread} --url {url}"
        again = f"{new_run} --run-id {run_id}"
        assert f"Start a new run: {new_run} (or" in said and said.endswith(f": {again})"), said

        ok(*shlex.split(again)[1:], "--speed", "0")
        records = replay_json(thread, url)
        assert [r["event"] for r in records] == [e for _, e in demo_run(thread, run_id)]
        tail.wait_for(lambda out: finished_line(run_id) in out, "the run again")
        out = tail.text_out()
        notice = "── events were lost to retention or a reset: a snapshot follows\n"
        assert out.count(notice) == 1, out
        assert out.index("thinking: ") < out.index(notice) < out.index(f"── run {run_id} finished")
        err = tail.err()
        assert f"lost the connection to {url}" in err and "reconnected" in err, err
        assert err.index("lost the connection") < err.index("reconnected"), err
    finally:
        gateways.kill_all()


# == tail: waiting, resets =========================================================================


def test_tail_of_an_empty_thread_says_it_waits(memory_gateway: GatewayProcess, procs: Procs,
                                               tmp_path: Path):  # fmt: skip
    url = memory_gateway.url
    thread = unique("empty")
    tail = procs.start("tail", "tail", thread, "--url", url, "--until-finished")
    wait_until(tail.err, "tail to say something")
    assert tail.err() == (
        f"agui-hub tail: thread {thread!r} has no events yet; waiting for its first event\n"
    )
    assert tail.running() and tail.out() == b""
    (tmp_path / "r1.ndjson").write_bytes(ndjson(small_run(thread, "r1")))
    ok("publish", thread, str(tmp_path / "r1.ndjson"), "--url", url)
    assert tail.wait() == 0, tail.err()
    assert tail.out() == replay_transcript(thread, url)
    # A thread with events: nothing to wait for, nothing said.
    again = ok("tail", thread, "--url", url, "--until-finished")
    assert again.err == "" and again.out == tail.out()


def test_tail_says_so_when_its_thread_is_reset_while_it_follows(
    redis_gateway: GatewayProcess, procs: Procs, tmp_path: Path
):
    """Redis loses the thread under a live tail (no reconnection): the same notice as
    after a reconnection, then the new thread."""
    from agui_hub.store import open_store

    url = redis_gateway.url
    thread = unique("lost")
    for run_id in ("r1", "r2"):
        (tmp_path / f"{run_id}.ndjson").write_bytes(ndjson(small_run(thread, run_id)))
    ok("publish", thread, str(tmp_path / "r1.ndjson"), "--url", url)
    tail = procs.start("tail", "tail", thread, "--url", url)
    tail.wait_for(lambda out: finished_line("r1") in out, "run r1")

    async def delete() -> bool:
        store = open_store(redis_gateway.store)
        try:
            return await store.delete(thread)
        finally:
            await store.close()

    assert asyncio.run(delete())
    ok("publish", thread, str(tmp_path / "r2.ndjson"), "--url", url)
    tail.wait_for(lambda out: finished_line("r2") in out, "run r2")
    out = tail.text_out()
    notice = "── events were lost to retention or a reset: a snapshot follows\n"
    assert out.count(notice) == 1, out
    assert out.index("── run r1 finished") < out.index(notice) < out.index("── run r2 finished")
    assert "reconnected" not in tail.err() and "lost the connection" not in tail.err()


# == wss:// to a plain hub, publish input, the redis extra, thread names ==========================


def test_wss_to_a_hub_without_tls_says_what_happened(memory_gateway: GatewayProcess):
    plain = memory_gateway.url
    url = plain.replace("ws://", "wss://", 1)
    for args in (["replay", "t"], ["tail", "t", "--timeout", "0"]):
        result = cli(*args, "--url", url)
        assert result.code == 1, result
        assert result.err.startswith(f"agui-hub {args[0]}: cannot connect to {url}: TLS "
                                     "handshake failed ("), result.err  # fmt: skip
        assert result.err.rstrip("\n").endswith(
            f"): is the hub serving TLS? For a hub without TLS use {plain}"
        ), result.err
        assert len(result.err.splitlines()) == 1 and result.out == b""


def test_publish_names_both_lines_of_a_repeated_event_id(
    memory_gateway: GatewayProcess, tmp_path: Path
):
    url = memory_gateway.url
    thread = unique("dup")
    items = envelopes(small_run(thread, "r1"), "id")
    items[5]["eventId"] = items[2]["eventId"]  # lines 3 and 7 (line 5 is blank)
    data = ndjson(items[:4]) + b"\n" + ndjson(items[4:])
    path = tmp_path / "dup.ndjson"
    path.write_bytes(data)
    said = "line 7: eventId 'id-2' is also the id of line 3: give each event an id of its own"
    result = cli("publish", thread, str(path), "--url", url)
    assert result.code == 1 and result.out == b"", result
    assert result.err == f"agui-hub publish: {said} (nothing was published)\n", result.err
    empty = cli("replay", thread, "--url", url, "--json")
    assert (empty.code, empty.out) == (0, b"")
    # From a pipe the lines before the batch that holds the repeat may be stored.
    piped = cli("publish", thread, "-", "--url", url, stdin=data)
    assert piped.code == 1 and said in piped.err, piped
    assert "Traceback" not in piped.err
    assert stored(thread, url) < 6


def test_publish_of_no_events_says_so_and_exits_0(memory_gateway: GatewayProcess, tmp_path: Path):
    url = memory_gateway.url
    thread = unique("none")
    path = tmp_path / "blank.ndjson"
    path.write_bytes(b"\n  \n")
    result = ok("publish", thread, str(path), "--url", url)
    assert result.out == b""
    assert result.err == f"agui-hub publish: no events in {path}: nothing published\n"
    piped = ok("publish", thread, "-", "--url", url, stdin=b"")
    assert piped.err == "agui-hub publish: no events in stdin: nothing published\n"
    # replay --json of an empty thread, piped into publish: the same, exit 0.
    copy = replay_into(thread, unique("copy"), url)
    assert copy.returncode == 0 and copy.stdout == b"", copy
    assert b"no events in stdin" in copy.stderr
    assert cli("replay", thread, "--url", url).err.endswith("has no events\n")


def test_a_redis_url_without_the_redis_extra_exits_1_everywhere_with_one_message():
    """As after `pip install -e .` without [redis]: importing redis fails."""
    store = f"redis://127.0.0.1:{free_port()}/0"
    program = "import sys; sys.modules['redis'] = None; from agui_hub.cli import main; " \
              "sys.exit(main())"  # fmt: skip
    messages = {}
    for args in (
        ["serve", "--host", "127.0.0.1", "--port", str(free_port()), "--store", store],
        ["replay", "t", "--url", store],
        ["publish", "t", "-", "--url", store],
        ["demo", "t", "--url", store],
    ):
        proc = subprocess.run([sys.executable, "-c", program, *args], cwd=ROOT, env=child_env(),
                              input=b"", capture_output=True, timeout=WAIT)  # fmt: skip
        err = proc.stderr.decode()
        assert proc.returncode == 1, (args, err)
        assert "Traceback" not in err, err
        line = next(x for x in err.splitlines() if x.startswith(f"agui-hub {args[0]}: "))
        messages[args[0]] = line.removeprefix(f"agui-hub {args[0]}: ")
    assert len(set(messages.values())) == 1, messages
    assert "pip install 'agui-hub[redis]'" in messages["serve"], messages


def test_serve_runs_the_collector_less_often_and_freezes_what_start_up_made() -> None:
    import gc

    from agui_hub.cli import serve

    threshold = gc.get_threshold()
    try:
        serve._tune_collector()
        assert gc.get_threshold() == serve.GC_THRESHOLD
        assert serve.GC_THRESHOLD[0] > threshold[0]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
