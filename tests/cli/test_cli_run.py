"""``agui-hub run`` and ``agui-hub cancel`` (docs/bridge.md), with real processes.

Every gateway is an ``agui-hub serve --http-port 0 --agents NAME=URL,...`` process
(the ``gateways`` fixture of tests/processes.py), on the memory store or on the
session Redis under a key prefix of the test; every command is
``python -m agui_hub.cli ...`` in a subprocess; the upstream agent is the real one
of tests/upstream_agent.py, served over HTTP in this test process, so the tests
see what the gateway POSTed to it (``agent.inputs``) and when it hung up
(``agent.disconnects``). What a thread holds is read back with ``replay --json``
and compared with the agent's script.

Covered: a run's transcript on stdout and the next run's input (history,
``parentRunId``); ``--detach`` then ``cancel``; a failing agent and an unknown one
(exit 1, the reason on stderr); ``token --run`` and its use against a JWT gateway;
runs outlive their follower (``--detach``, and a follower SIGKILLed mid-run); the
serve log (HTTP port, agents, credentials redacted); SIGTERM of a gateway with a
run going (RUN_ERROR AGUI_HUB_GATEWAY_STOPPING, read through another gateway).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jwt
import pytest

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import CLI, ROOT, GatewayProcess, Gateways, child_env, http_status
from ..upstream_agent import UpstreamAgent, ok_transcript_text, serve_agent

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing."""
SECRET = "cli-run-test-secret-0123456789-abcdefghij"
PASSWORD = "s3cr3t-pw-9f41"
"""The password in a credentialed agent URL: never to be seen in a log or a thread."""
BRIEF_DELTAS = 60

Event = dict[str, Any]


@pytest.fixture(scope="module")
def agent() -> Iterator[UpstreamAgent]:
    """One upstream agent for the module; tests tell their inputs apart by thread."""
    with serve_agent() as served:
        yield served


def agents_of(agent: UpstreamAgent) -> str:
    """The ``--agents`` of the gateways."""
    return ",".join(
        [
            f"ok={agent.url('ok')}",
            # 40 s: only a cancel, or the gateway stopping, ends it within a test.
            f"slow={agent.url('slow', count=2000, delay=0.02)}",
            # About 2 s: long enough to interrupt its follower, short enough to wait for.
            f"brief={agent.url('slow', count=BRIEF_DELTAS, delay=0.03)}",
            f"boom={agent.url('status', code=500)}",
        ]
    )


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
        time.sleep(0.03)


def inputs_of(agent: UpstreamAgent, thread: str) -> list[dict[str, Any]]:
    """The RunAgentInputs the agent received for *thread*, in order."""
    return [i for i in list(agent.inputs) if i.get("threadId") == thread]


# -- running commands -----------------------------------------------------------------------


@dataclass
class Result:
    code: int
    out: str
    err: str


def cli(*args: str, timeout: float = WAIT, env: dict[str, str] | None = None) -> Result:
    """Run one command to its end (killed after *timeout* s: a hang fails the test)."""
    environment = child_env()
    environment.update(env or {})
    try:
        proc = subprocess.run(
            [*CLI, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            cwd=ROOT,
            env=environment,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:  # run() has killed the child
        err = (exc.stderr or b"").decode(errors="replace")
        pytest.fail(f"agui-hub {' '.join(args)} did not exit within {timeout:.0f} s: {err}")
    return Result(
        proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8", "replace")
    )


def ok(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run a command that must succeed."""
    result = cli(*args, env=env)
    assert result.code == 0, f"agui-hub {' '.join(args)} exited {result.code}: {result.err}"
    assert "Traceback" not in result.err, result.err
    return result


def replay(thread: str, url: str) -> list[Event]:
    """Every stored event of *thread*, read through the gateway at *url*."""
    result = ok("replay", thread, "--json", "--url", url)
    records = [json.loads(line) for line in result.out.splitlines()]
    for record in records:
        assert record["eventId"] == f"{thread}@{record['offset']}", record
    return [record["event"] for record in records]


def finished(thread: str, url: str) -> list[Event] | None:
    """The thread's events once its last one ends a run; None before."""
    events = replay(thread, url)
    if events and events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"):
        return events
    return None


def deltas(events: list[Event]) -> list[str]:
    return [e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT"]


class Background:
    """A command running in the background, its output in files the test can watch."""

    def __init__(self, workdir: Path, name: str, args: list[str]) -> None:
        self.name = name
        self.out_path = workdir / f"{name}.out"
        self.err_path = workdir / f"{name}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.process = subprocess.Popen(
                [*CLI, *args],
                cwd=ROOT,
                env=child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=WAIT)


@pytest.fixture
def background(tmp_path: Path) -> Iterator[Callable[..., Background]]:
    """Starts background commands; every one is killed at the end of the test."""
    started: list[Background] = []

    def start(name: str, *args: str) -> Background:
        proc = Background(tmp_path, f"{len(started):02d}-{name}", list(args))
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


def serve(
    gateways: Gateways, agent: UpstreamAgent, store: str = "memory://", *args: str
) -> GatewayProcess:
    """A gateway process with the HTTP listener and the module's agents."""
    return gateways.start(store, "--http-port", "0", "--agents", agents_of(agent), *args)


def redis_store(redis: RedisServer) -> str:
    return f"{redis.url}?prefix={unique('cli-run')}"


# -- run: the transcript, the next run --------------------------------------------------------


def test_run_prints_the_transcript_and_the_next_run_has_the_thread(
    gateways: Gateways, agent: UpstreamAgent
) -> None:
    gateway = serve(gateways, agent)
    thread = unique("talk")
    result = ok(
        "run", "--agent", "ok", "--thread", thread, "--message", "hello",
        "--url", gateway.url, "--color", "never",
    )  # fmt: skip
    [sent] = inputs_of(agent, thread)
    run_id = sent["runId"]
    assert [(m["role"], m["content"]) for m in sent["messages"]] == [("user", "hello")]
    assert "parentRunId" not in sent
    # The transcript: the agent's answer to the message, its tool call, and the run's end.
    answer = ok_transcript_text(sent["messages"])
    assert answer == "You said: 'hello'; I saw 1 messages."
    assert f"assistant: {answer}\n" in result.out, result.out
    assert 'tool lookup({"q": "hello"})' in result.out, result.out
    assert result.out.rstrip().endswith(f"run {run_id} finished"), result.out
    assert f"run {run_id} of ok" in result.err, result.err

    second = ok(
        "run", "--agent", "ok", "--thread", thread, "--message", "and again",
        "--url", gateway.url, "--color", "never",
    )  # fmt: skip
    first_input, sent2 = inputs_of(agent, thread)
    assert first_input == sent
    assert sent2["parentRunId"] == run_id
    contents = [(m["role"], m.get("content")) for m in sent2["messages"]]
    # The thread's history (the first message, the first run's answer and tool result),
    # then the new message.
    assert contents[0] == ("user", "hello")
    assert ("assistant", answer) in contents
    assert ("tool", "42") in contents
    assert contents[-1] == ("user", "and again")
    answer2 = ok_transcript_text(sent2["messages"])
    assert f"assistant: {answer2}\n" in second.out, second.out
    assert f"run {sent2['runId']} of ok" in second.err, second.err

    events = replay(thread, gateway.url)
    starts = [e for e in events if e["type"] == "RUN_STARTED"]
    assert [s["runId"] for s in starts] == [run_id, sent2["runId"]]
    assert starts[1]["parentRunId"] == run_id
    assert [e["type"] for e in events].count("RUN_FINISHED") == 2

    # The runs as a tree: the second continues the first; previews are the messages.
    tree = ok("runs", thread, "--url", gateway.url)
    assert tree.out.splitlines() == [
        f"{run_id}  finished  'hello'",
        f"└─ {sent2['runId']}  finished  'and again'",
    ], tree.out
    listed = [
        json.loads(line)
        for line in ok("runs", thread, "--json", "--url", gateway.url).out.splitlines()
    ]
    assert [(r["runId"], r["parentRunId"], r["status"], r["preview"]) for r in listed] == [
        (run_id, None, "finished", "hello"),
        (sent2["runId"], run_id, "finished", "and again"),
    ]
    records = [
        json.loads(x) for x in ok("replay", thread, "--json", "--url", gateway.url).out.splitlines()
    ]
    started_at = [r["offset"] for r in records if r["event"]["type"] == "RUN_STARTED"]
    assert [r["first"] for r in listed] == started_at

    # A regenerate of the second answer: a run from the first run's branch.
    third = ok(
        "run", "--agent", "ok", "--thread", thread, "--message", "and again",
        "--parent-run-id", run_id, "--url", gateway.url, "--color", "never",
    )  # fmt: skip
    sent3 = inputs_of(agent, thread)[-1]
    assert sent3["parentRunId"] == run_id
    assert sent3["messages"][:-1] == sent2["messages"][:-1]
    assert f"run {sent3['runId']} of ok" in third.err, third.err
    assert ok("runs", thread, "--url", gateway.url).out.splitlines() == [
        f"{run_id}  finished  'hello'",
        f"├─ {sent2['runId']}  finished  'and again'",
        f"└─ {sent3['runId']}  finished  'and again'",
    ]
    unknown = cli("run", "--agent", "ok", "--thread", thread, "--parent-run-id", "nope",
                  "--url", gateway.url)  # fmt: skip
    assert (unknown.code == 1 and "unknown_run" in unknown.err) or "no run 'nope'" in unknown.err


def test_detach_then_cancel(gateways: Gateways, agent: UpstreamAgent) -> None:
    gateway = serve(gateways, agent)
    thread = unique("detached")
    disconnects = agent.disconnects
    result = ok("run", "--agent", "slow", "--thread", thread, "--detach", "--url", gateway.url)
    run_id = result.out.strip()
    assert result.out == run_id + "\n" and re.fullmatch(r"[0-9a-f-]{36}", run_id), result.out
    assert run_id in result.err and f"agui-hub tail {thread}" in result.err, result.err
    # The command is gone; the run goes on.
    wait_until(lambda: len(deltas(replay(thread, gateway.url))) >= 5, "the run to go on")
    assert [i["runId"] for i in inputs_of(agent, thread)] == [run_id]
    assert agent.disconnects == disconnects

    cancel = ok("cancel", thread, "--url", gateway.url)
    assert f"run {run_id} of slow" in cancel.err and "cancelled" in cancel.err, cancel.err
    assert agent.wait_disconnects(disconnects + 1, WAIT), "the upstream request stayed open"

    tail = cli("tail", thread, "--until-finished", "--url", gateway.url, "--color", "never")
    assert tail.code == 0, tail.err
    assert "AGUI_HUB_RUN_CANCELLED" in tail.out, tail.out
    events = replay(thread, gateway.url)
    assert events[0]["type"] == "RUN_STARTED" and events[0]["runId"] == run_id
    end = events[-1]
    assert end["type"] == "RUN_ERROR" and end["code"] == "AGUI_HUB_RUN_CANCELLED", end
    assert deltas(events) == [f"{i} " for i in range(len(deltas(events)))]
    # Nothing left to cancel.
    again = cli("cancel", thread, "--url", gateway.url)
    assert again.code == 1 and "no bridged" in again.err, again


def test_a_failing_agent_and_an_unknown_agent_exit_1(
    gateways: Gateways, agent: UpstreamAgent
) -> None:
    gateway = serve(gateways, agent)
    thread = unique("boom")
    result = cli("run", "--agent", "boom", "--thread", thread, "--message", "hi",
                 "--url", gateway.url, "--color", "never")  # fmt: skip
    assert result.code == 1, result
    assert "RUN_ERROR AGUI_HUB_UPSTREAM_STATUS" in result.err, result.err
    assert "HTTP 500" in result.err and "agent exploded" in result.err, result.err
    assert "Traceback" not in result.err
    assert len(inputs_of(agent, thread)) == 1
    # The thread holds the failed run, and takes the next one.
    events = replay(thread, gateway.url)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    ok("run", "--agent", "ok", "--thread", thread, "--url", gateway.url)

    before = len(agent.inputs)
    result = cli("run", "--agent", "nope", "--thread", unique("nope"), "--url", gateway.url)
    assert result.code == 1, result
    assert "no upstream agent named 'nope' (agents: boom, brief, ok, slow)" in result.err, result
    assert "Traceback" not in result.err
    assert len(agent.inputs) == before


def test_token_run_grant(gateways: Gateways, agent: UpstreamAgent, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    minted = ok("token", "alice", "--subscribe", "*", "--publish", "cli-*", "--run", "ok",
                "--run", "team-*", "--secret-file", str(secret_file)).out.strip()  # fmt: skip
    claims = jwt.decode(minted, SECRET, algorithms=["HS256"])
    assert claims["sub"] == "alice"
    assert claims["agui"] == {"subscribe": ["*"], "publish": ["cli-*"], "run": ["ok", "team-*"]}
    plain = ok("token", "bob", "--subscribe", "*", "--publish", "*",
               "--secret-file", str(secret_file)).out.strip()  # fmt: skip
    assert "run" not in jwt.decode(plain, SECRET, algorithms=["HS256"])["agui"]

    gateway = serve(gateways, agent, "memory://", "--jwt-secret-file", str(secret_file))
    thread = unique("cli")
    ok("run", "--agent", "ok", "--thread", thread, "--token", minted, "--url", gateway.url)
    assert len(inputs_of(agent, thread)) == 1
    before = len(agent.inputs)
    for tok, name, where in [(minted, "slow", unique("cli")), (minted, "ok", unique("other")),
                             (plain, "ok", unique("cli"))]:  # fmt: skip
        result = cli("run", "--agent", name, "--thread", where, "--token", tok,
                     "--url", gateway.url)  # fmt: skip
        assert result.code == 1, result
        assert "may not" in result.err, result.err
    assert len(agent.inputs) == before


# -- runs belong to the gateway, not to their follower ---------------------------------------------


def test_runs_outlive_their_follower(
    gateways: Gateways, agent: UpstreamAgent, background: Callable[..., Background]
) -> None:
    gateway = serve(gateways, agent)
    detached, followed = unique("detached"), unique("followed")
    disconnects = agent.disconnects
    result = ok("run", "--agent", "brief", "--thread", detached, "--detach", "--url", gateway.url)
    detached_run = result.out.strip()
    follower = background("follower", "run", "--agent", "brief", "--thread", followed,
                          "--url", gateway.url, "--color", "never")  # fmt: skip
    # SIGKILL the follower once it printed some of the run, well before its end.
    wait_until(lambda: "assistant: 0 1 2 3 " in follower.out(), "the follower to print deltas")
    follower.process.send_signal(signal.SIGKILL)
    assert follower.process.wait(WAIT) == -signal.SIGKILL
    assert "finished" not in follower.out()

    runs: dict[str, str] = {}
    for thread in (detached, followed):
        events = wait_until(partial(finished, thread, gateway.url), f"{thread} to finish")
        [sent] = inputs_of(agent, thread)
        runs[thread] = sent["runId"]
        assert events[0]["type"] == "RUN_STARTED" and events[0]["runId"] == sent["runId"]
        assert events[-1]["type"] == "RUN_FINISHED", events[-1]
        # Every delta of the agent's script, once, in order.
        assert deltas(events) == [f"{i} " for i in range(BRIEF_DELTAS)]
        assert [e["type"] for e in events] == [
            "RUN_STARTED",
            "TEXT_MESSAGE_START",
            *["TEXT_MESSAGE_CONTENT"] * BRIEF_DELTAS,
            "TEXT_MESSAGE_END",
            "RUN_FINISHED",
        ]
    assert runs[detached] == detached_run
    assert agent.disconnects == disconnects, "a run's upstream request was closed"


# -- the gateway process -------------------------------------------------------------------


def test_serve_log_names_the_http_port_and_the_agents_without_credentials(
    gateways: Gateways, agent: UpstreamAgent
) -> None:
    credentialed = f"http://robot:{PASSWORD}@127.0.0.1:{agent.port}/ok"
    gateway = gateways.start(
        "memory://", "--http-port", "0", "--agents", f"ok={agent.url('ok')},private={credentialed}"
    )
    log = gateway.log()
    found = re.search(r"HTTP bridge: http://127\.0\.0\.1:(\d+) ", log)
    assert found, log
    port = int(found.group(1))
    assert port not in (0, gateway.port)
    assert http_status(port, "/healthz") == 200, "nothing answers on the logged HTTP port"
    agents_line = next(line for line in log.splitlines() if "upstream agents:" in line)
    assert f"ok ({agent.url('ok')})" in agents_line, agents_line
    # The URL's credentials became an Authorization header: the URL shown has none.
    assert f"private (http://127.0.0.1:{agent.port}/ok)" in agents_line, agents_line
    assert PASSWORD not in log


def test_agent_credentials_stay_out_of_the_log_and_the_thread(
    gateways: Gateways, agent: UpstreamAgent
) -> None:
    """An agent URL with user:pass: its password is in no log line and no stored event,
    neither for a run that works nor for one that fails (the RUN_ERROR message names the
    agent's URL, and every viewer of the thread reads it)."""
    working = f"http://robot:{PASSWORD}@127.0.0.1:{agent.port}/ok"
    failing = f"http://robot:{PASSWORD}@127.0.0.1:{agent.port}/status"
    gateway = gateways.start("memory://", "--agents", f"private={working},broken={failing}")
    good, bad = unique("private"), unique("broken")
    ok("run", "--agent", "private", "--thread", good, "--url", gateway.url)
    result = cli("run", "--agent", "broken", "--thread", bad, "--url", gateway.url)
    assert result.code == 1 and "AGUI_HUB_UPSTREAM_STATUS" in result.err, result
    assert len(inputs_of(agent, good)) == 1 and len(inputs_of(agent, bad)) == 1
    stored = json.dumps([replay(good, gateway.url), replay(bad, gateway.url)])
    leaks = [line for line in gateway.log().splitlines() if PASSWORD in line]
    assert PASSWORD not in result.err, f"the password reached a viewer: {result.err}"
    assert PASSWORD not in stored, "the password is stored in the thread"
    assert not leaks, "the password is in the gateway's log:\n" + "\n".join(leaks)


def test_sigterm_with_a_run_going_ends_it_gateway_stopping(
    gateways: Gateways, agent: UpstreamAgent, redis_server: RedisServer
) -> None:
    store = redis_store(redis_server)
    first = serve(gateways, agent, store)
    thread = unique("stopping")
    disconnects = agent.disconnects
    run_id = ok("run", "--agent", "slow", "--thread", thread, "--detach",
                "--url", first.url).out.strip()  # fmt: skip
    wait_until(lambda: len(deltas(replay(thread, first.url))) >= 5, "the run to go on")

    first.signal(signal.SIGTERM)
    assert first.wait(WAIT) == 0, first.log()[-3000:]
    log = first.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    assert "AGUI_HUB_GATEWAY_STOPPING" in log  # the run's end, said once, at INFO
    assert agent.wait_disconnects(disconnects + 1, WAIT), "the upstream request stayed open"

    second: GatewayProcess = serve(gateways, agent, store)
    events = replay(thread, second.url)
    assert events[0]["type"] == "RUN_STARTED" and events[0]["runId"] == run_id
    end = events[-1]
    assert end["type"] == "RUN_ERROR" and end["code"] == "AGUI_HUB_GATEWAY_STOPPING", end
    assert deltas(events) == [f"{i} " for i in range(len(deltas(events)))]
    assert [e["type"] for e in events].count("RUN_ERROR") == 1
    # The run is over: the thread takes a new one, on the gateway still up.
    ok("run", "--agent", "ok", "--thread", thread, "--url", second.url)
    assert inputs_of(agent, thread)[-1]["parentRunId"] == run_id
