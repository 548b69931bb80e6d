"""The JavaScript client (js/src/client.ts, built to agui_hub/static/agui-hub.js).

* its unit tests under ``node --test`` (offsets past 2^53, the resume position
  table, backoff bounds, close codes and the liveness ping against a scripted
  WebSocket peer);
* ``tsc --noEmit`` over js/src, and the committed build outputs up to date;
* the BUILT client in Node (js/test/client-live.mjs) against real ``agui-hub
  serve`` processes, on the memory store and on a real redis-server: it
  receives exactly what a Python HubClient receives while ``agui-hub demo``
  publishes, in both encodings; it resumes across a cut connection (a real TCP
  proxy aborting it) with nothing lost or repeated; it gets a snapshot when its
  position was trimmed meanwhile; its pipelined publishes are stored once, in
  order, when a reply is lost and they are sent again; a revoked token (4403)
  and an expired one without a provider (4401) stop it with ConnectionRejected,
  a token provider keeps it connected across expiries; a slow iterator with a
  tiny buffer still gets every event exactly once.
"""

from __future__ import annotations

import asyncio
import filecmp
import json
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from agui_hub.client.hub_client import HubClient, ThreadEvent
from agui_hub.gateway.auth import encode_token

from .conftest import TIMEOUT_SCALE, RedisServer
from .nodejs import JS_DIR, STATIC_DIR, node, run_node
from .processes import CLI, ROOT, Gateways, child_env
from .proxy import FaultProxy

pytestmark = pytest.mark.timeout(60)

LIVE = "test/client-live.mjs"
SECRET = "js-client-test-secret-0123456789-abcdefgh"
WAIT = 30 * TIMEOUT_SCALE
Json = dict[str, Any]


def store_url(kind: str, request: pytest.FixtureRequest) -> str | None:
    if kind == "memory":
        return None
    redis: RedisServer = request.getfixturevalue("redis_server")
    return f"{redis.url}?prefix=jsclient-{uuid.uuid4().hex[:12]}"


def thread_name() -> str:
    return f"js-{uuid.uuid4().hex[:10]}"


# -- processes -------------------------------------------------------------------------------------


class NodeRun:
    """js/test/client-live.mjs running: its JSON lines as they come, then its result."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.lines: list[Json] = []
        self.stderr = b""
        self.process: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> NodeRun:
        self.process = await asyncio.create_subprocess_exec(
            node(),
            LIVE,
            *self.args,
            cwd=JS_DIR,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        self._stderr_task = asyncio.ensure_future(self._read_stderr())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self._stderr_task.cancel()

    async def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        self.stderr = await self.process.stderr.read()

    def _failure(self, what: str) -> str:
        shown = "\n".join(json.dumps(line) for line in self.lines[-30:])
        return (
            f"node {LIVE} {what}:\nstdout (last lines):\n{shown}\nstderr:\n{self.stderr.decode()}"
        )

    async def next_line(self, timeout: float) -> Json | None:
        assert self.process is not None and self.process.stdout is not None
        raw = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not raw:
            return None
        line: Json = json.loads(raw)
        self.lines.append(line)
        return line

    async def wait_for(self, predicate: Any, timeout: float = WAIT) -> Json:
        """The first line (from now on) for which *predicate* holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                line = await self.next_line(max(0.01, deadline - loop.time()))
            except TimeoutError:
                pytest.fail(self._failure(f"printed no line as awaited in {timeout} s"))
            if line is None:
                await asyncio.sleep(0.1)  # let stderr be read
                pytest.fail(self._failure("ended before the awaited line"))
            if predicate(line):
                return line

    async def result(self, timeout: float = WAIT) -> Json:
        line = await self.wait_for(lambda line: "result" in line, timeout)
        assert self.process is not None
        code = await asyncio.wait_for(self.process.wait(), timeout)
        if code != 0:
            await asyncio.sleep(0.1)
            pytest.fail(self._failure(f"exited {code}"))
        result: Json = line["result"]
        return result


async def demo(url: str, thread: str, *, speed: float, runs: int = 1) -> None:
    """``agui-hub demo`` publishing *runs* runs into *thread*, to its end."""
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "demo",
        thread,
        "--url",
        url,
        "--speed",
        str(speed),
        "--runs",
        str(runs),
        "--timeout",
        "20",
        cwd=ROOT,
        env=child_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), WAIT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()


async def python_events(url: str, thread: str, encoding: str, runs: int) -> list[Json]:
    """What a Python HubClient following *thread* from its start receives, up to the end
    of its *runs*-th run."""
    events: list[Json] = []
    finished = 0
    async with HubClient(url, encoding=encoding) as hub, hub.subscribe(thread, "start") as sub:
        async for item in sub:
            if isinstance(item, ThreadEvent):
                events.append({"offset": item.offset, "event": item.event})
                if item.event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                    finished += 1
                    if finished == runs:
                        return events
    raise AssertionError("the subscription ended early")


async def stored(url: str, thread: str) -> list[Json]:
    """Every stored event of *thread*, read by a Python HubClient up to its newest one."""
    events: list[Json] = []
    async with HubClient(url, encoding="json") as hub, hub.subscribe(thread, "start") as sub:
        newest = None
        async for item in sub:
            if newest is None:
                newest = item.offset  # the first subscribed's offset: the newest event
                if newest == "0-0":
                    return events
            elif isinstance(item, ThreadEvent):
                events.append({"offset": item.offset, "event": item.event})
                if item.offset == newest:
                    return events
    raise AssertionError("the subscription ended early")


def events_of(items: list[Json]) -> list[Json]:
    return [{"offset": i["offset"], "event": i["event"]} for i in items if i["kind"] == "event"]


def offset_key(offset: str) -> tuple[int, int]:
    ms, seq = offset.split("-")
    return int(ms), int(seq)


def assert_exactly_once_in_order(received: list[Json], expected: list[Json]) -> None:
    offsets = [e["offset"] for e in received]
    assert len(set(offsets)) == len(offsets), "an event was handed out twice"
    assert offsets == sorted(offsets, key=offset_key), "events out of order"
    assert received == expected


# -- node --test, typecheck, build -----------------------------------------------------------------


def test_unit_tests_pass() -> None:
    files = sorted(str(p.relative_to(JS_DIR)) for p in (JS_DIR / "test").glob("client*.test.mjs"))
    assert files, "no js/test/client*.test.mjs"
    done = run_node("--test", *files, timeout=60)
    assert "# fail 0" in done.stdout, done.stdout


def test_typecheck_passes() -> None:
    # `npm run typecheck`, without needing npm: tsc over all of js/src.
    run_node("node_modules/typescript/bin/tsc", "--noEmit", "-p", ".", timeout=90)


def test_committed_build_is_up_to_date(tmp_path: Path) -> None:
    run_node("build.mjs", "--outdir", str(tmp_path), timeout=60)
    built = tmp_path / "agui_hub" / "static"
    names = ["agui-hub.js", "agui-hub.d.ts"]
    if (JS_DIR / "src" / "viewer.ts").exists():
        names.append("viewer.js")
    stale = [
        name
        for name in names
        if not (STATIC_DIR / name).exists()
        or not filecmp.cmp(built / name, STATIC_DIR / name, shallow=False)
    ]
    assert not stale, f"agui_hub/static/{stale} differ from js/src: run `npm run build` in js/"
    text = (STATIC_DIR / "agui-hub.js").read_text()
    assert str(ROOT) not in text and "sourceMappingURL" not in text


# -- live: the demo, as the Python client sees it --------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "redis"])
@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_receives_what_the_python_client_receives(
    gateways: Gateways, request: pytest.FixtureRequest, store: str, encoding: str
) -> None:
    gateway = gateways.start(store_url(store, request))
    thread = thread_name()
    async with NodeRun(
        "follow", "--url", gateway.url, "--thread", thread, "--encoding", encoding
    ) as js:
        await js.wait_for(lambda line: "ready" in line)  # subscribed before the first event
        python = asyncio.ensure_future(python_events(gateway.url, thread, encoding, runs=1))
        await demo(gateway.url, thread, speed=4)
        result = await js.result()
        expected = await asyncio.wait_for(python, WAIT)
    assert len(expected) > 50
    assert_exactly_once_in_order(events_of(result["items"]), expected)
    first, announced = result["items"][0], result["items"][1]
    # An empty thread: its first event created the epoch, announced before it.
    assert first == {
        "kind": "subscribed",
        "thread": thread,
        "epoch": None,
        "offset": "0-0",
        "recovered": True,
        "resumed": False,
    }
    assert announced["kind"] == "subscribed" and announced["epoch"] and announced["recovered"]
    assert result["position"] == {"offset": expected[-1]["offset"], "epoch": announced["epoch"]}
    assert [s["state"] for s in result["statuses"]] == ["connecting", "open", "closed"]


async def test_runs_lists_what_the_python_client_lists(gateways: Gateways) -> None:
    gateway = gateways.start(None)
    thread = thread_name()
    events = []
    for run, parent in (("r1", None), ("r2", None), ("r3", "r1")):
        started = {"type": "RUN_STARTED", "threadId": thread, "runId": run}
        if parent is not None:
            started["parentRunId"] = parent
        events += [started, {"type": "RUN_FINISHED", "threadId": thread, "runId": run}]
    async with HubClient(gateway.url) as hub:
        await hub.publish(thread, events)
        tree = await hub.runs(thread)
        newest = await hub.runs(thread, limit=1)
    assert [(r.run_id, r.parent_run_id) for r in tree.runs] == [
        ("r1", None),
        ("r2", "r1"),
        ("r3", "r1"),
    ]
    assert [r.run_id for r in tree.children("r1")] == ["r2", "r3"]
    assert [r.run_id for r in newest.runs] == ["r3"] and newest.more and not tree.more
    async with NodeRun("runs", "--url", gateway.url, "--thread", thread) as js:
        listed = await js.result()
    assert listed == {"runs": [r.as_json() for r in tree.runs], "more": False, "agents": []}
    async with NodeRun("runs", "--url", gateway.url, "--thread", thread, "--limit", "0") as js:
        refused = await js.result()
    assert refused["error"]["code"] == "bad_command", refused


async def test_presence_follows_who_joins_and_leaves(gateways: Gateways) -> None:
    gateway = gateways.start(None, "--presence-interval", "0.2")
    thread = thread_name()
    args = ("--url", gateway.url, "--thread", thread, "--client", '{"name": "js"}')
    async with NodeRun("presence", *args) as js:
        first = await js.wait_for(lambda line: "presence" in line)
        assert first["change"]["change"] == "presence" and first["state"]["count"] == 1
        (own,) = first["state"]["entries"]
        assert first["state"]["self"] == own["connection"] and own["client"] == {"name": "js"}
        async with (
            HubClient(gateway.url, client={"name": "py"}) as hub,
            hub.subscribe(thread) as sub,
        ):
            await asyncio.wait_for(anext(sub), WAIT)  # subscribed: it is in the presence
            listed = await hub.presence(thread)
            joined = await js.wait_for(lambda line: "presence" in line)
        result = await js.result()
    python = listed.entries[1].as_json()
    assert [w.as_json() for w in listed.entries] == [own, python]
    assert python["client"] == {"name": "py"}
    assert joined["change"] == {"change": "joined", "count": 2, "entries": [python]}
    assert joined["state"]["entries"] == [own, python]
    # The left frame names connection and subject; the client kept the rest.
    assert result["changes"][-1] == {"change": "left", "count": 1, "entries": [python]}
    assert result["presence"] == {
        "count": 1, "entries": [own], "more": False, "hidden": False,
        "self": own["connection"], "off": False, "known": True,
    }  # fmt: skip
    assert result["listed"] == {"count": 1, "entries": [own], "more": False, "hidden": False}


# -- live: a cut connection ------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_resumes_after_a_cut_without_loss_or_repeat(
    gateways: Gateways, encoding: str
) -> None:
    gateway = gateways.start()
    thread = thread_name()
    async with (
        FaultProxy("127.0.0.1", gateway.port) as proxy,
        NodeRun(
            "follow",
            "--url",
            f"ws://127.0.0.1:{proxy.port}",
            "--thread",
            thread,
            "--encoding",
            encoding,
        ) as js,
    ):
        await js.wait_for(lambda line: "ready" in line)
        publishing = asyncio.ensure_future(demo(gateway.url, thread, speed=2))
        try:
            await js.wait_for(lambda line: isinstance(line.get("progress"), int)
                              and line["progress"] >= 15)  # fmt: skip
            assert proxy.cut_all() == 1
            result = await js.result()
        finally:
            await asyncio.wait_for(publishing, WAIT)
    expected = await stored(gateway.url, thread)
    assert_exactly_once_in_order(events_of(result["items"]), expected)
    resumed = [i for i in result["items"] if i["kind"] == "subscribed" and i["resumed"]]
    assert len(resumed) == 1 and resumed[0]["recovered"] is True
    assert not any(i["kind"] == "snapshot" for i in result["items"])
    states = [s["state"] for s in result["statuses"]]
    assert states.index("reconnecting") < len(states) - 1 - states[::-1].index("open")
    reconnecting = next(s for s in result["statuses"] if s["state"] == "reconnecting")
    assert reconnecting["closeCode"] == 1006
    assert result["reconnects"] == 1 and result["recovered"] is True


# -- live: resuming into a trimmed thread ----------------------------------------------------------


async def test_resume_into_trimmed_history_yields_a_snapshot(gateways: Gateways) -> None:
    gateway = gateways.start("memory://?max_len=20")
    thread = thread_name()
    async with (
        FaultProxy("127.0.0.1", gateway.port) as proxy,
        NodeRun(
            "follow",
            "--url",
            f"ws://127.0.0.1:{proxy.port}",
            "--thread",
            thread,
            "--until",
            "snapshot",
        ) as js,
    ):
        await js.wait_for(lambda line: "ready" in line)
        await demo(gateway.url, thread, speed=0)
        last = await js.wait_for(lambda line: line.get("type") == "RUN_FINISHED")
        # While the client cannot connect, a second run pushes its position out of the store.
        proxy.refusing = True
        proxy.cut_all()
        await js.wait_for(lambda line: line.get("status", {}).get("state") == "reconnecting")
        await demo(gateway.url, thread, speed=0)
        proxy.refusing = False
        result = await js.result()
    items = result["items"]
    resumed = next(i for i in items if i["kind"] == "subscribed" and i["resumed"])
    snapshot = items[-1]
    assert resumed["recovered"] is False and items.index(resumed) == len(items) - 2
    assert snapshot["kind"] == "snapshot" and snapshot["epoch"] == resumed["epoch"]
    assert offset_key(snapshot["offset"]) > offset_key(last["offset"])
    assert snapshot["offset"] == resumed["offset"]  # the newest event: the run is over
    types = [e["type"] for e in snapshot["events"]]
    assert "MESSAGES_SNAPSHOT" in types and types[0] == "RUN_STARTED"
    assert result["position"] == {"offset": snapshot["offset"], "epoch": snapshot["epoch"]}
    assert result["recovered"] is False


# -- live: publishing ------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_pipelined_publishes_survive_a_lost_reply(gateways: Gateways, encoding: str) -> None:
    gateway = gateways.start()
    thread = thread_name()
    marker = f"marker-{uuid.uuid4().hex}"
    async with FaultProxy("127.0.0.1", gateway.port, websocket=True) as proxy:
        # The publish holding the marker is stored, its reply lost, the connection aborted:
        # it and the ones after it are sent again, with the same event ids.
        proxy.drop_reply_after(marker.encode())
        async with NodeRun(
            "publish",
            "--url",
            f"ws://127.0.0.1:{proxy.port}",
            "--thread",
            thread,
            "--encoding",
            encoding,
            "--count",
            "40",
            "--marker",
            marker,
        ) as js:
            result = await js.result()
        assert proxy.dropped == 1
    assert result["reconnects"] == 1
    offsets = result["offsets"]
    assert len(offsets) == len(result["events"]) == 44
    assert offsets == sorted(offsets, key=offset_key) and len(set(offsets)) == len(offsets)
    events = await stored(gateway.url, thread)
    # Each event stored once, in call order, at the offset its publish was answered with.
    assert events == [
        {"offset": offset, "event": event}
        for offset, event in zip(offsets, result["events"], strict=True)
    ]


# -- live: the gateway says stop -------------------------------------------------------------------


async def test_revoked_token_stops_with_connection_rejected(
    gateways: Gateways, tmp_path: Path
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    revoked = tmp_path / "revoked"
    revoked.write_text("")
    gateway = gateways.start(
        None, "--jwt-secret-file", str(secret_file), "--revocation-file", str(revoked)
    )
    token = encode_token(SECRET, "js-viewer", subscribe=["*"], ttl=300)
    async with NodeRun(
        "follow", "--url", gateway.url, "--thread", thread_name(), "--token", token,
        "--until", "error",
    ) as js:  # fmt: skip
        ready = await js.wait_for(lambda line: "ready" in line)
        assert ready["ready"]["recovered"] is True  # the token, as a subprotocol, was taken
        revoked.write_text("js-viewer\n")
        gateway.signal(signal.SIGHUP)  # re-read the revocation file now
        result = await js.result()
    assert result["error"]["name"] == "ConnectionRejected"
    assert result["error"]["closeCode"] == 4403
    assert result["status"]["state"] == "closed" and result["reconnects"] == 0
    assert [s["state"] for s in result["statuses"]][-1] == "closed"


async def test_expiry_without_provider_stops_and_provider_refreshes(
    gateways: Gateways, tmp_path: Path
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    # A second of leeway: a token minted on a busy machine is not stale at its handshake.
    gateway = gateways.start(None, "--jwt-secret-file", str(secret_file), "--jwt-leeway", "1")
    thread = thread_name()
    fixed = encode_token(SECRET, "js-viewer", subscribe=["*"], ttl=2)
    async with (
        NodeRun(
            "follow", "--url", gateway.url, "--thread", thread, "--token", fixed,
            "--until", "error",
        ) as expiring,
        NodeRun(
            "follow", "--url", gateway.url, "--thread", thread, "--secret-file",
            str(secret_file), "--ttl", "3", "--until", "time:7000",
        ) as refreshing,
    ):  # fmt: skip
        stopped = await expiring.result()
        kept = await refreshing.result()
    assert stopped["error"]["name"] == "ConnectionRejected"
    assert stopped["error"]["closeCode"] == 4401
    # The provider's tokens were renewed in band (auth) before each expiry: one connection.
    assert kept["error"] is None and kept["reconnects"] == 0 and kept["pingMs"] is not None
    minted = [line for line in refreshing.lines if line.get("progress") == "token"]
    assert len(minted) >= 3
    assert [s["state"] for s in kept["statuses"]] == ["connecting", "open", "closed"]


# -- live: a slow iterator with a tiny buffer ------------------------------------------------------


async def test_slow_iterator_with_tiny_buffer_gets_every_event_once(gateways: Gateways) -> None:
    gateway = gateways.start()
    thread = thread_name()
    await demo(gateway.url, thread, speed=0)
    expected = await stored(gateway.url, thread)
    async with NodeRun(
        "follow", "--url", gateway.url, "--thread", thread, "--max-buffer", "4",
        "--slow", "5",
    ) as js:  # fmt: skip
        result = await js.result()
    assert_exactly_once_in_order(events_of(result["items"]), expected)
    # The buffer overflowed again and again: each time it resubscribed where it stopped.
    resumed = [i for i in result["items"] if i["kind"] == "subscribed" and i["resumed"]]
    assert len(resumed) >= 5 and all(i["recovered"] for i in resumed)
    assert result["reconnects"] == 0
