"""The gateway's plain-HTTP side for browsers: the viewer page and the JavaScript client.

Over real sockets, on in-process gateways and on ``agui-hub serve``
processes: every served path with its Content-Type, ETag (and ``304`` for
``If-None-Match``), caching and security headers, the page's
Content-Security-Policy; ``404`` for anything else; the ``viewer`` setting
(``--no-viewer``, ``AGUI_HUB_VIEWER``) switching the page off but not the
client; a WebSocket upgrade on ``/`` working as before; the page referring
to nothing but its own files; the files being package data.

The page's reducer (js/src/transcript.ts) is checked here too, without a
browser: folded by Node, the demo's runs, chunk, activity and snapshot
sequences and the hub's compact snapshots (taken at many points of a run)
give the same messages and state as agui_hub/agui/reducer.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.typing import Subprotocol

from agui_hub.agui.reducer import fold
from agui_hub.cli.demo import demo_run
from agui_hub.gateway import static_files
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.gateway.static_files import PAGE_POLICY, STATIC_PATHS
from agui_hub.store.memory import MemoryStore

from .conftest import TIMEOUT_SCALE
from .nodejs import STATIC_DIR, node_json, run_node
from .processes import Gateways

WAIT = 10 * TIMEOUT_SCALE

PAGE_PATHS = ["/", "/index.html"]
VIEWER_PATHS = ["/", "/index.html", "/viewer.js", "/viewer.css"]
CLIENT_PATHS = ["/agui-hub.js", "/agui-hub.d.ts"]
CONTENT_TYPES = {
    "/": "text/html; charset=utf-8",
    "/index.html": "text/html; charset=utf-8",
    "/viewer.js": "text/javascript; charset=utf-8",
    "/viewer.css": "text/css; charset=utf-8",
    "/agui-hub.js": "text/javascript; charset=utf-8",
    "/agui-hub.d.ts": "text/plain; charset=utf-8",
}
FILES = {
    "/": "index.html",
    "/index.html": "index.html",
    "/viewer.js": "viewer.js",
    "/viewer.css": "viewer.css",
    "/agui-hub.js": "agui-hub.js",
    "/agui-hub.d.ts": "agui-hub.d.ts",
}


class Answer:
    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        values = self.all(name)
        assert len(values) <= 1, f"{name} appears {len(values)} times"
        return values[0] if values else None

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


async def http_get(
    port: int, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> Answer:
    """One request (a GET unless *method*) over a fresh socket, read to the end (the
    gateway closes after answering); a HEAD's answer has no body, whatever its length."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    try:
        headers = {"Host": f"127.0.0.1:{port}", **(headers or {})}  # a Host given wins
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"{method} {path} HTTP/1.1\r\n{extra}Connection: close\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        parsed = [
            (name.strip(), value.strip())
            for name, _, value in (line.partition(":") for line in lines[1:] if line)
        ]
        length = int(next((v for k, v in parsed if k.lower() == "content-length"), "0"))
        if method == "HEAD":
            length = 0
        body = await asyncio.wait_for(reader.readexactly(length), WAIT)
        # Nothing after the announced body: one answer per connection.
        assert await asyncio.wait_for(reader.read(), WAIT) == b""
        return Answer(status, parsed, body)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def gateway(**config: Any) -> AsyncIterator[Gateway]:
    gw = Gateway(
        GatewayConfig(host="127.0.0.1", port=0, ping_interval=None, **config), store=MemoryStore()
    )
    await gw.start()
    try:
        yield gw
    finally:
        await asyncio.wait_for(gw.drain(), 15)


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async with gateway() as gw:
        yield gw.config.port


def policy(header: str) -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for part in header.split(";"):
        name, *values = part.split()
        assert name not in directives, f"{name} twice"
        directives[name] = values
    return directives


# -- what is served -----------------------------------------------------------------------


@pytest.mark.parametrize("path", list(STATIC_PATHS))
async def test_each_file_with_its_type_and_headers(port: int, path: str) -> None:
    answer = await http_get(port, path)
    assert answer.status == 200
    assert answer.header("Content-Type") == CONTENT_TYPES[path]
    assert answer.body == (STATIC_DIR / FILES[path]).read_bytes()
    assert answer.body, "an empty file"
    etag = answer.header("ETag")
    assert etag is not None and re.fullmatch(r'"[0-9a-f]{16,}"', etag)
    assert answer.header("Cache-Control") == "no-cache"
    assert answer.header("X-Content-Type-Options") == "nosniff"
    assert answer.header("Referrer-Policy") == "no-referrer"
    csp = answer.header("Content-Security-Policy")
    assert (csp is not None) == (path in PAGE_PATHS), csp
    # The client may be imported by pages elsewhere; the viewer's files are its own.
    shared = answer.header("Access-Control-Allow-Origin")
    assert shared == ("*" if path in CLIENT_PATHS else None)
    # The query string (the page's ?hub=) does not change what is served.
    again = await http_get(port, path + "?hub=ws://127.0.0.1:1/")
    assert (again.status, again.body, again.header("ETag")) == (200, answer.body, etag)


async def test_the_page_policy_allows_only_its_own_files(port: int) -> None:
    answer = await http_get(port, "/")
    header = answer.header("Content-Security-Policy")
    assert header == PAGE_POLICY
    directives = policy(header)
    assert directives["default-src"] == ["'none'"]
    assert directives["script-src"] == ["'self'"]
    assert directives["style-src"] == ["'self'"]
    assert directives["img-src"] == ["'self'", "data:"]
    assert directives["connect-src"] == ["'self'", "ws:", "wss:"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert "unsafe-inline" not in header and "unsafe-eval" not in header
    assert "*" not in header


@pytest.mark.parametrize("path", list(STATIC_PATHS))
async def test_an_unchanged_file_is_answered_304(port: int, path: str) -> None:
    first = await http_get(port, path)
    etag = first.header("ETag")
    assert etag is not None
    for condition in (etag, f'"other", {etag}', f"W/{etag}", "*"):
        answer = await http_get(port, path, {"If-None-Match": condition})
        assert answer.status == 304, condition
        assert answer.body == b""
        assert answer.header("ETag") == etag
        assert answer.header("Cache-Control") == "no-cache"
        assert answer.header("Content-Type") is None
        assert answer.header("Content-Length") is None
    stale = await http_get(port, path, {"If-None-Match": '"0123456789abcdef0123"'})
    assert (stale.status, stale.body) == (200, first.body)


async def test_etags_differ_between_files(port: int) -> None:
    tags = {FILES[p]: (await http_get(port, p)).header("ETag") for p in STATIC_PATHS}
    assert len(set(tags.values())) == len(set(FILES.values())), tags
    expected = hashlib.sha256((STATIC_DIR / "viewer.js").read_bytes()).hexdigest()
    assert expected.startswith(tags["viewer.js"].strip('"'))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "path",
    [
        "/nope",
        "/favicon.ico",
        "/static/viewer.js",
        "/viewer.js/",
        "/VIEWER.JS",
        "/../agui_hub/server.py",
        "/%2e%2e/pyproject.toml",
        "/agui_hub/static/index.html",
        "//viewer.js",
        "/index.htm",
    ],
)
async def test_anything_else_is_404(port: int, path: str) -> None:
    answer = await http_get(port, path)
    assert answer.status == 404
    assert answer.header("Content-Type") == "text/plain; charset=utf-8"
    assert b"open a WebSocket here" in answer.body
    assert answer.header("ETag") is None


@pytest.mark.parametrize("path", ["/", "/viewer.js", "/healthz", "/readyz", "/nothing"])
async def test_head_is_the_get_without_its_body(port: int, path: str) -> None:
    get = await http_get(port, path)
    head = await http_get(port, path, method="HEAD")  # asserts that nothing follows the head
    assert head.status == get.status
    assert head.body == b""
    for name in ("Content-Length", "Content-Type", "ETag", "Content-Security-Policy"):
        assert head.header(name) == get.header(name), name


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
@pytest.mark.parametrize("path", ["/", "/agui-hub.js", "/healthz", "/nothing"])
async def test_other_methods_are_405(port: int, method: str, path: str) -> None:
    answer = await http_get(port, path, method=method)
    assert answer.status == 405
    assert answer.header("Allow") == "GET, HEAD"
    assert f"{method} is not served here".encode() in answer.body
    assert answer.header("ETag") is None


async def test_only_a_get_opens_a_websocket(port: int) -> None:
    handshake = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Protocol": "agui-hub.v1.json",
    }
    for method in ("HEAD", "POST"):
        answer = await http_get(port, "/", handshake, method=method)
        assert answer.status == 405, method
    async with connect(f"ws://127.0.0.1:{port}/", subprotocols=[Subprotocol("agui-hub.v1.json")]):
        pass  # and a GET still does


async def test_health_endpoints_are_unchanged(port: int) -> None:
    assert (await http_get(port, "/healthz")).body == b"ok\n"
    assert (await http_get(port, "/readyz")).status == 200


# -- the viewer setting ------------------------------------------------------------------------


async def test_viewer_off_serves_the_client_but_not_the_page() -> None:
    async with gateway(viewer=False) as gw:
        port = gw.config.port
        for path in VIEWER_PATHS:
            answer = await http_get(port, path)
            assert answer.status == 404, path
            assert b"GET / for the viewer" not in answer.body
        for path in CLIENT_PATHS:
            answer = await http_get(port, path)
            assert answer.status == 200, path
            assert answer.body == (STATIC_DIR / FILES[path]).read_bytes()
        assert (await http_get(port, "/healthz")).status == 200


@pytest.mark.parametrize(
    ("args", "env"),
    [
        ([], {}),
        (["--no-viewer"], {}),
        ([], {"AGUI_HUB_VIEWER": "0"}),
        ([], {"AGUI_HUB_VIEWER": "1"}),
    ],
    ids=["default", "flag", "env-off", "env-on"],
)
async def test_serve_flag_and_variable(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    gateways = Gateways(tmp_path)
    try:
        process = gateways.start(None, *args, env=env)
        on = not args and env.get("AGUI_HUB_VIEWER", "1") == "1"
        for path in VIEWER_PATHS:
            assert (await http_get(process.port, path)).status == (200 if on else 404), path
        for path in CLIENT_PATHS:
            assert (await http_get(process.port, path)).status == 200, path
        assert ("viewer: http://127.0.0.1:" in process.log()) == on
    finally:
        gateways.kill_all()


async def test_a_file_missing_from_the_package_is_a_404_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A package whose static folder lacks viewer.js (npm run build never ran).
    (tmp_path / "static").mkdir()
    for name in ("index.html", "viewer.css", "agui-hub.js"):
        (tmp_path / "static" / name).write_bytes((STATIC_DIR / name).read_bytes())
    monkeypatch.setattr(static_files, "static_folder", lambda: tmp_path / "static")
    async with gateway() as gw:
        port = gw.config.port
        for path, name in (("/viewer.js", "viewer.js"), ("/agui-hub.d.ts", "agui-hub.d.ts")):
            answer = await http_get(port, path)
            assert answer.status == 404
            assert f"built without {name}".encode() in answer.body
            assert b"npm run build" in answer.body
        assert (await http_get(port, "/")).status == 200
        assert (await http_get(port, "/agui-hub.js")).status == 200


# -- WebSockets are as before ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/index.html", "/viewer.js", "/anything"])
@pytest.mark.parametrize("viewer", [True, False])
async def test_a_websocket_upgrade_on_any_path_still_works(path: str, viewer: bool) -> None:
    async with gateway(viewer=viewer) as gw:
        url = f"ws://127.0.0.1:{gw.config.port}{path}"
        async with connect(url, subprotocols=["agui-hub.v1.json"], open_timeout=WAIT) as ws:  # type: ignore[list-item]
            assert ws.subprotocol == "agui-hub.v1.json"
            await ws.send(json.dumps({"type": "ping", "id": 1}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
            assert reply == {"type": "pong", "id": 1}


# -- the page -------------------------------------------------------------------------------------


class _References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.inline_scripts = 0
        self.styles = 0
        self.handlers: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for name in ("src", "href", "action", "srcset", "poster", "data"):
            if values.get(name) is not None:
                self.urls.append((tag, name, values[name] or ""))
        self.handlers += [name for name, _ in attrs if name.startswith("on")]
        if "style" in values:
            self.styles += 1
        if tag == "style":
            self.styles += 1
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_scripts += 1


def test_the_page_refers_only_to_its_own_files() -> None:
    page = _References()
    page.feed((STATIC_DIR / "index.html").read_text())
    assert page.urls, "the page loads nothing?"
    for tag, attribute, url in page.urls:
        assert not re.match(r"(?i)^\s*([a-z][a-z0-9+.-]*:|//)", url) or url.startswith("data:"), (
            f"<{tag} {attribute}={url!r}> leaves the gateway"
        )
    local = {url for _, _, url in page.urls if not url.startswith("data:")}
    assert local == {"viewer.js", "viewer.css"}
    assert all("/" + url in STATIC_PATHS for url in local)
    # What the page's policy would refuse anyway: nothing inline.
    assert page.inline_scripts == 0 and page.styles == 0 and page.handlers == []
    css = (STATIC_DIR / "viewer.css").read_text()
    assert not re.search(r"(?i)url\(|@import", css), "the styles load something"


def test_the_files_are_package_data() -> None:
    folder = resources.files("agui_hub") / "static"
    for name in sorted(set(FILES.values())):
        data = (folder / name).read_bytes()
        assert data, name
    viewer = (folder / "viewer.js").read_text()
    assert "aguiViewer" in viewer and "HubClient" in viewer
    assert "innerHTML" not in viewer and "insertAdjacentHTML" not in viewer
    assert "document.write" not in viewer


def test_the_page_imports_the_client_the_gateway_serves() -> None:
    # viewer.js holds no copy of the client: it imports /agui-hub.js, relative to its own
    # URL (a path prefix in front of the gateway keeps working), which the gateway serves
    # with the page's files and without them.
    viewer = (STATIC_DIR / "viewer.js").read_text()
    imports = re.findall(r'^import\s*\{[^}]*\}\s*from\s*"([^"]+)";$', viewer, re.MULTILINE)
    assert imports == ["./agui-hub.js"]
    assert not re.search(r"(?m)^\s*(var|class) HubClient\b", viewer)
    assert "src/client.ts" not in viewer and "@msgpack/msgpack" not in viewer
    assert "/agui-hub.js" in STATIC_PATHS and "/agui-hub.js" in CLIENT_PATHS


# -- the page's reducer against agui_hub/agui/reducer.py --------------------------------------


def _cases() -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(name, input for the Node script, every event: what the Python reducer folds)."""
    two_runs = [e for _, e in demo_run("t", "r1")] + [e for _, e in demo_run("t", "r2")]
    yield "demo, two runs", {"events": two_runs}, two_runs
    # The hub's compact snapshot at many points of a run (mid-message, mid-tool call,
    # mid-reasoning), then the rest of the events: as a page that resumed from it.
    for cut in range(0, len(two_runs), 7):
        head, tail = two_runs[:cut], two_runs[cut:]
        yield (
            f"snapshot after {cut} events",
            {"snapshot": fold(head).compact(), "events": tail},
            two_runs,
        )
    mixed: list[dict[str, Any]] = [
        {
            "type": "RUN_STARTED",
            "threadId": "t",
            "runId": "r",
            "input": {
                "threadId": "t",
                "runId": "r",
                "messages": [{"id": "u0", "role": "user", "content": "hi"}],
                "tools": [],
                "context": [],
                "state": {},
                "forwardedProps": {},
            },
        },
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "delta": "a", "metadata": {"x": 1}},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": "b", "extra": 2},
        {
            "type": "TOOL_CALL_CHUNK",
            "toolCallId": "c1",
            "toolCallName": "f",
            "parentMessageId": "m1",
            "delta": "{",
        },
        {"type": "TOOL_CALL_CHUNK", "delta": "}"},
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": "re", "delta": "hmm"},
        {"type": "TOOL_CALL_RESULT", "messageId": "res", "toolCallId": "c1", "content": "x"},
        {"type": "TOOL_CALL_RESULT", "messageId": "res2", "toolCallId": "zz", "content": "y"},
        {
            "type": "ACTIVITY_SNAPSHOT",
            "messageId": "a1",
            "activityType": "plan",
            "content": {"steps": []},
        },
        {
            "type": "ACTIVITY_DELTA",
            "messageId": "a1",
            "activityType": "plan",
            "patch": [{"op": "add", "path": "/steps/-", "value": "s"}],
        },
        {
            "type": "ACTIVITY_DELTA",
            "messageId": "a1",
            "activityType": "plan",
            "patch": [{"op": "remove", "path": "/nope"}],
        },
        {
            "type": "MESSAGES_SNAPSHOT",
            "messages": [
                {"id": "m1", "role": "assistant", "content": "replaced"},
                {"id": "new", "role": "user", "content": "n"},
            ],
        },
        {"type": "STATE_SNAPSHOT", "snapshot": {"a": [1, 2]}},
        {
            "type": "STATE_DELTA",
            "delta": [
                {"op": "move", "from": "/a/0", "path": "/b"},
                {"op": "test", "path": "/b", "value": 1},
            ],
        },
        {"type": "STATE_DELTA", "delta": [{"op": "test", "path": "/b", "value": 2}]},
        {
            "type": "TEXT_MESSAGE_START",
            "messageId": "m2",
            "role": "assistant",
            "metadata": {"k": 1},
        },
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "x", "metadata": {"j": 2}},
        {
            "type": "REASONING_ENCRYPTED_VALUE",
            "subtype": "message",
            "entityId": "m2",
            "encryptedValue": "e",
        },
        {"type": "RUN_ERROR", "message": "boom"},
    ]
    yield "chunks, activities, snapshots, bad patches", {"events": mixed}, mixed


def test_the_page_folds_events_as_the_hub_does(tmp_path: Path) -> None:
    cases = list(_cases())
    path = tmp_path / "cases.json"
    path.write_text(json.dumps({"cases": {name: data for name, data, _ in cases}}))
    results = node_json("test/viewer-transcript.test.mjs", str(path))
    for name, _, events in cases:
        expected = fold(events)
        got = results[name]
        assert got["messages"] == expected.messages, name
        assert got["state"] == expected.state, name
        assert [(r["runId"], r["status"]) for r in got["runs"]] == [
            (run.run_id, run.status.value) for run in expected.runs
        ], name
        assert got["problems"] == len(expected.rejected), name
        assert got["open"] == {
            "messages": list(expected.open_messages),
            "toolCalls": list(expected.open_tool_calls),
            "reasoning": list(expected.open_reasoning_messages),
        }, name
    # One bad patch in the state: marked, the state kept as it was.
    assert results["chunks, activities, snapshots, bad patches"]["stateProblem"]


def test_the_page_reducers_unit_tests() -> None:
    done = run_node("--test", "test/viewer-transcript.test.mjs", timeout=60)
    assert "# fail 0" in done.stdout and "# pass" in done.stdout, done.stdout
