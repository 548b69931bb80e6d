"""The README, executed: every ``agui-hub`` command in it.

The walk-through ("one run, two viewers, nothing lost") runs as real
processes, with the README's command lines passed to ``bash`` verbatim; only
``AGUI_HUB_PORT`` / ``AGUI_HUB_URL`` point them at a free loopback port (and
the Redis variant's port 6379 becomes a free one). A command added to the
README without being run here fails :func:`test_every_readme_command_is_exercised`.
The README's Python examples run in tests/test_docs.py, with those of docs/.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import TIMEOUT_SCALE, free_port

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
WAIT = 20 * TIMEOUT_SCALE

# Commands this module runs, checked against the README at the end.
EXERCISED: set[str] = set()


def blocks(language: str) -> list[str]:
    """The README's fenced code blocks of one language, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", README, flags=re.S | re.M)


def command_lines(block: str) -> list[str]:
    """The ``agui-hub`` command lines of a shell block, without their comments."""
    found = []
    for line in block.splitlines():
        line = line.split("  #", 1)[0].strip()
        if "agui-hub " in line:
            found.append(line[line.index("agui-hub ") :] if " && " in line else line)
    return found


def walkthrough() -> tuple[list[str], list[str], list[str]]:
    """The three shell blocks of the walk-through: the four terminals, then
    replay/publish, then Redis and the hub on it (comments removed)."""
    section = README.split("## Try it", 1)[1].split("\n## ", 1)[0]
    shells = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    assert len(shells) == 3, "the walk-through has three shell blocks"
    redis = [line.split("  #", 1)[0].strip() for line in shells[2].splitlines() if line.strip()]
    return command_lines(shells[0]), command_lines(shells[1]), redis


class Terminal:
    """One README command line running in ``bash``, as a user's terminal would."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str], name: str) -> None:
        self.command = command
        self.out_path = cwd / f"{name}.out"
        self.err_path = cwd / f"{name}.err"
        EXERCISED.add(command)
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def errors(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, predicate: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if predicate(self.output()):
                return
            if self.process.poll() is not None and not predicate(self.output()):
                break
            time.sleep(0.02)
        raise AssertionError(
            f"{self.command}: {what} did not happen\nstdout:\n{self.output()}\n"
            f"stderr:\n{self.errors()}"
        )

    def signal(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def wait(self) -> int:
        return self.process.wait(timeout=WAIT)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for terminal in opened:
        terminal.kill()


def environment(port: int, store: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGUI_HUB_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["AGUI_HUB_PORT"] = str(port)
    env["AGUI_HUB_URL"] = f"ws://127.0.0.1:{port}"
    env["PYTHONUNBUFFERED"] = "1"
    if store is not None:
        env["AGUI_HUB_STORE"] = store
    return env


def wait_listening(terminal: Terminal, port: int) -> None:
    deadline = time.monotonic() + WAIT
    ready = f"agui-hub listening on ws://127.0.0.1:{port}"
    while time.monotonic() < deadline:
        if ready in terminal.errors() + terminal.output():
            return
        assert terminal.process.poll() is None, f"the hub exited:\n{terminal.errors()}"
        time.sleep(0.02)
    raise AssertionError(f"the hub did not start:\n{terminal.errors()}")


def matches_sample(transcript: str) -> None:
    """The README's sample transcript is what tail really prints: line for line,
    none left out (a line ending in `` ...`` stands for the lines starting so)."""
    section = README.split("## Try it", 1)[1]
    sample = re.search(r"^```text\n(.*?)^```", section, flags=re.S | re.M)
    assert sample is not None
    patterns = []
    for expected in sample.group(1).splitlines():
        shortened = expected.endswith(" ...")
        pattern = re.escape(expected.removesuffix(" ..."))
        pattern = pattern.replace("run\\-3f2a9c1e", "run-[0-9a-f]{8}")
        patterns.append(re.compile(pattern + (".*" if shortened else "")))
    lines = transcript.splitlines()
    for start in range(len(lines) - len(patterns) + 1):
        window = lines[start : start + len(patterns)]
        if all(p.fullmatch(line) for p, line in zip(patterns, window, strict=True)):
            return
    raise AssertionError(
        f"the README's sample transcript:\n{sample.group(1)}\nis not what tail printed:\n"
        f"{transcript}"
    )


def wait_redis(terminal: Terminal, port: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        assert terminal.process.poll() is None, f"redis-server exited:\n{terminal.errors()}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"redis-server did not answer:\n{terminal.output()}")


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_walkthrough(backend: str, tmp_path: Path, terminals: list[Terminal]) -> None:
    """Hub, two viewers, the demo agent; viewer 3 is killed mid-run and started again.

    On Redis, the README's Redis (AOF) and hub commands; afterwards Redis is
    killed with SIGKILL and started again, and the thread is all there."""
    four, after, (start_redis, serve_on_redis) = walkthrough()
    serve, viewer, keeper, demo = four
    assert serve == "agui-hub serve" and demo == "agui-hub demo"
    port = free_port()
    env = environment(port, None)
    redis = None
    if backend == "redis":
        assert "--port 6379" in start_redis and "redis://localhost:6379/0" in serve_on_redis
        redis_port = free_port()
        redis_command = start_redis.replace("--port 6379", f"--port {redis_port}")
        redis = Terminal(redis_command, tmp_path, env, "redis")
        terminals.append(redis)
        wait_redis(redis, redis_port)
        serve = serve_on_redis.replace(":6379/", f":{redis_port}/")
        EXERCISED.add(serve_on_redis)

    hub = Terminal(serve, tmp_path, env, "hub")
    terminals.append(hub)
    wait_listening(hub, port)
    # The README's Redis has the settings the store needs: no warning about them.
    assert "Redis at" not in hub.errors(), hub.errors()
    viewer_a = Terminal(viewer, tmp_path, env, "viewer-a")
    viewer_b = Terminal(keeper, tmp_path, env, "viewer-b1")
    terminals += [viewer_a, viewer_b]
    time.sleep(0.3)  # both viewers subscribed before the first event, as in the README
    agent = Terminal(demo, tmp_path, env, "demo")
    terminals.append(agent)

    # Kill viewer 3 in the middle of the run, with SIGKILL: no chance to tidy up.
    viewer_b.wait_for(lambda out: out.count("\n") >= 6, "six lines in viewer 3")
    viewer_b.signal(signal.SIGKILL)
    viewer_b.wait()
    first_part = viewer_b.output()
    assert "finished" not in first_part, "the kill came too late to mean anything"
    viewer_b2 = Terminal(keeper, tmp_path, env, "viewer-b2")  # the same command again
    terminals.append(viewer_b2)

    assert agent.wait() == 0, agent.errors()
    finished = re.compile(r"── run run-[0-9a-f]{8} finished\n")
    viewer_a.wait_for(finished.search, "the end of the run in viewer 2")
    viewer_b2.wait_for(finished.search, "the end of the run in viewer 3")
    for terminal in (viewer_a, viewer_b2):
        terminal.signal(signal.SIGINT)
        assert terminal.wait() == 130
    transcript = viewer_a.output()
    assert first_part + viewer_b2.output() == transcript
    assert "Traceback" not in viewer_a.errors() + viewer_b2.errors() + hub.errors()
    matches_sample(transcript)
    saved = json.loads((tmp_path / "viewer.pos").read_text())
    assert saved["thread"] == "demo"

    # Replay the thread as NDJSON, publish it into another thread.
    replay, publish = after
    replayed = Terminal(replay, tmp_path, env, "replay")
    assert replayed.wait() == 0, replayed.errors()
    records = [json.loads(line) for line in (tmp_path / "run.ndjson").read_text().splitlines()]
    assert records[0]["event"]["type"] == "RUN_STARTED"
    assert records[-1]["event"]["type"] == "RUN_FINISHED"
    assert saved["offset"] == records[-1]["offset"]
    published = Terminal(publish, tmp_path, env, "publish")
    assert published.wait() == 0, published.errors()
    offsets = published.output().split()
    assert len(offsets) == len(records)
    assert offsets == sorted(offsets, key=lambda o: tuple(int(x) for x in o.split("-")))
    copy = replay_events(port, "demo-copy")
    # The copy's run markers name the thread they are in; nothing else changes.
    assert copy == [
        {**r["event"], "threadId": "demo-copy"}
        if r["event"]["type"] in ("RUN_STARTED", "RUN_FINISHED")
        else r["event"]
        for r in records
    ]
    if redis is not None:
        operate(redis_port, tmp_path, env)
        # "Restarting ... Redis (even with kill -9) then loses nothing": AOF.
        redis.signal(signal.SIGKILL)
        redis.wait()
        restarted = Terminal(redis_command, tmp_path, env, "redis-2")
        terminals.append(restarted)
        wait_redis(restarted, redis_port)
        assert replay_events(port, "demo") == [r["event"] for r in records]
        assert "Traceback" not in hub.errors()
    hub.signal(signal.SIGTERM)
    assert hub.wait() == 0


def operate(redis_port: int, tmp_path: Path, env: dict[str, str]) -> None:
    """The README's operator commands against the walk-through's Redis (AOF): it keeps
    the hub's promises, and the two threads are listed, the newest first."""
    section = README.split("## Deploying and operating", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    check, threads = command_lines(block)
    assert check.startswith("agui-hub check") and threads.startswith("agui-hub threads")
    for name, command in (("check", check), ("threads", threads)):
        terminal = Terminal(command.replace(":6379/", f":{redis_port}/"), tmp_path, env, name)
        EXERCISED.add(command)
        assert terminal.wait() == 0, terminal.output() + terminal.errors()
        if name == "check":
            assert "FAIL" not in terminal.output() and "appendonly" in terminal.output()
        else:
            listed = [line.split()[0] for line in terminal.output().splitlines()[1:] if line]
            assert listed[:2] == ["demo-copy", "demo"], terminal.output()


def replay_events(port: int, thread: str) -> list[dict[str, Any]]:
    """Every event stored in *thread* of the gateway on *port*."""
    from .test_docs import read_thread

    return read_thread(f"ws://127.0.0.1:{port}", thread)


def test_security_section(tmp_path: Path, terminals: list[Terminal]) -> None:
    """The README's security commands, verbatim: a JWT gateway, a token per party, a
    run published and replayed with them; and the same replay without a token refused."""
    section = README.split("## Security", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]
    setup, serve, mint, demo, replay = lines
    port = free_port()
    env = environment(port, None)
    subprocess.run(["bash", "-c", setup], cwd=tmp_path, env=env, check=True, timeout=WAIT)
    assert len((tmp_path / "secret").read_text().strip()) >= 32
    hub = Terminal(serve, tmp_path, env, "serve")
    terminals.append(hub)
    wait_listening(hub, port)
    assert "authentication: JWT" in hub.errors()
    for name, command in (("token", mint), ("demo", demo)):
        terminal = Terminal(command, tmp_path, env, name)
        terminals.append(terminal)
        assert terminal.wait() == 0, terminal.errors()
    assert (tmp_path / "agent.jwt").read_text().count(".") == 2  # a JWT
    viewer = Terminal(replay, tmp_path, env, "replay")
    terminals.append(viewer)
    assert viewer.wait() == 0, viewer.errors()
    assert "run finished" in viewer.output() or "finished" in viewer.output(), viewer.output()
    # Without a token, or with one for another tenant, nothing is shown.
    anonymous = subprocess.run(
        ["agui-hub", "replay", "tenant-42/run-1"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=WAIT,
    )  # fmt: skip
    assert anonymous.returncode == 1 and "pass --token" in anonymous.stderr, anonymous.stderr
    stranger = subprocess.run(
        ["bash", "-c", replay.replace("tenant-42/*", "tenant-7/*")], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=WAIT,
    )  # fmt: skip
    assert stranger.returncode == 1, stranger.stderr
    assert "does not grant this thread" in stranger.stderr, stranger.stderr
    assert "Traceback" not in hub.errors()
    EXERCISED.update(command_lines(block))


def test_bridge_section(tmp_path: Path, terminals: list[Terminal]) -> None:
    """The README's bridge commands, verbatim but for the agent's URL (a real AG-UI agent
    of the tests') and the ports: the run prints the agent's answer and exits 0, and the
    thread is there as SSE on the HTTP port, with an id per event."""
    import httpx

    from .upstream_agent import ok_transcript_text, serve_agent

    section = README.split("## Existing AG-UI agents", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```sh\n(.*?)^```", section, flags=re.S | re.M)
    serve, run = command_lines(block)
    assert "http://127.0.0.1:8000/" in serve and "--http-port 8766" in serve
    port, http_port = free_port(), free_port()
    env = environment(port, None)
    with serve_agent() as agent:
        command = serve.replace("http://127.0.0.1:8000/", agent.url("ok"))
        hub = Terminal(command.replace("8766", str(http_port)), tmp_path, env, "hub")
        EXERCISED.add(serve)
        terminals.append(hub)
        wait_listening(hub, port)
        runner = Terminal(run, tmp_path, env, "run")
        terminals.append(runner)
        assert runner.wait() == 0, runner.errors()
        (received,) = agent.inputs
        assert received["threadId"] == "ticket-42"
        assert received["messages"][-1]["content"] == "Where is my order?"
        # The transcript streams the answer in pieces; the text is all there.
        answer = ok_transcript_text(received["messages"])
        assert answer in runner.output().replace("\n", ""), runner.output()
        with httpx.stream(
            "GET", f"http://127.0.0.1:{http_port}/threads/ticket-42/events", timeout=WAIT
        ) as response:
            assert response.status_code == 200
            ids, events = [], []
            for line in response.iter_lines():
                if line.startswith("id: "):
                    ids.append(line[4:])
                elif line.startswith("data: ") and ids:
                    events.append(json.loads(line[6:]))
                    if events[-1]["type"] == "RUN_FINISHED":
                        break
        assert len(ids) == len(events) and events[0]["type"] == "RUN_STARTED"
        assert events[0]["input"]["messages"][0]["content"] == "Where is my order?"
    hub.signal(signal.SIGTERM)
    assert hub.wait() == 0
    assert "Traceback" not in hub.errors()


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with the README's test command, verbatim."""
    first = blocks("sh")[0]
    (command,) = [line.split("  #", 1)[0].strip() for line in first.splitlines()
                  if "pytest" in line]  # fmt: skip
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == command, f".ci/run ends with {ci[-1]!r}; the README says {command!r}"


def test_every_readme_command_is_exercised() -> None:
    """Every ``agui-hub`` command line in a README shell block is run by this module."""
    if not EXERCISED:
        pytest.skip("run with the rest of this module")
    documented = {line for block in blocks("sh") for line in command_lines(block)}
    missing = documented - EXERCISED
    assert not missing, f"README commands no test runs: {sorted(missing)}"
