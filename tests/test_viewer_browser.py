"""The viewer page in a real browser: Debian's Chromium, headless, driven by Playwright.

Each test runs a real ``agui-hub serve`` process and opens the page it serves
(``/#thread=…``); agents publish with ``agui-hub demo`` or the Python client:

* two pages, one on msgpack and one on JSON, follow a demo run: they end with
  the same transcript, and their messages and state are the Python reducer's
  for the thread; each page's frames were of its encoding;
* a page whose connection goes through :class:`~tests.proxy.FaultProxy` loses
  it mid-run: the indicator shows the reconnect, the resume is complete, and
  the page ends with the transcript of a page that never lost it;
* event text that is markup (``<img onerror=…>``, ``<script>``) in every place
  the page shows is shown as text: no element made of it, no script run;
* the page makes no request but to the gateway, for its own files, and logs
  no error (a Content-Security-Policy violation would be one);
* a screenshot mid-run (tool call, reasoning, state), at 1280x800: saved under
  the test's tmp_path, and to ``$AGUI_HUB_SCREENSHOT`` when that is set
  (docs/viewer.png is made so); and at 360 px wide nothing overflows;
* a token typed for one gateway is offered to that one only, not to the
  gateway of a ``?hub=`` link opened in the same tab;
* a thread the token does not grant: the indicator says ``not following``
  (not ``live``) until a thread it may read is chosen;
* a thread that branches: each "2 of 3" switch is in the transcript, at
  the message where the versions differ, and flips between them without a
  reload, live events and all;
* who watches: the header says "1 watching", "2 watching" while a Python
  client is subscribed too (named in the tooltip with its client map), then
  "1 watching" again; the count alone on a count-only gateway, nothing on
  one without presence.
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from agui_hub.agui.reducer import fold
from agui_hub.cli.demo import demo_run
from agui_hub.client.hub_client import HubClient, ThreadEvent

from .conftest import TIMEOUT_SCALE
from .nodejs import CHROMIUM_ARGS, chromium
from .processes import CLI, ROOT, GatewayProcess, Gateways, child_env
from .proxy import FaultProxy
from .upstream_agent import serve_agent

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, WebSocket

pytestmark = pytest.mark.timeout(40 * TIMEOUT_SCALE)

WAIT = 15 * TIMEOUT_SCALE
WAIT_MS = WAIT * 1000
PAGE_FILES = {"/", "/viewer.js", "/viewer.css", "/agui-hub.js"}  # viewer.js imports the client


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = chromium()  # skips (or fails under CI) without Chromium and playwright
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


class Viewer:
    """One page of the viewer, with what it requested, logged and received."""

    def __init__(self, page: Page, *ports: int) -> None:
        self.page = page
        self.ports = ports
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.frame_kinds: set[type] = set()
        page.on("request", lambda request: self.requests.append(request.url))
        page.on("websocket", self._websocket)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        page.on(
            "console",
            lambda message: (
                self.errors.append(f"console {message.type}: {message.text}")
                if message.type in ("error", "warning")
                else None
            ),
        )

    def _websocket(self, ws: WebSocket) -> None:
        self.requests.append(ws.url)
        ws.on("framereceived", lambda payload: self.frame_kinds.add(type(payload)))

    @classmethod
    async def open(
        cls,
        browser: Browser,
        port: int,
        thread: str,
        *,
        encoding: str = "msgpack",
        start: str = "start",
        hub: int | None = None,
        **page: Any,
    ) -> Viewer:
        """The page from the gateway on *port*, following *hub*'s (``?hub=``) if given."""
        viewer = cls(await browser.new_page(**page), port, *([hub] if hub else []))
        fragment = f"thread={thread}" + ("&encoding=json" if encoding == "json" else "")
        fragment += "&from=snapshot" if start == "snapshot" else ""
        query = f"?hub=ws://127.0.0.1:{hub}/" if hub else ""
        await viewer.page.goto(f"http://127.0.0.1:{port}/{query}#{fragment}")
        await viewer.page.wait_for_function(
            "() => window.aguiViewer && window.aguiViewer.model().connection.subscribed"
            " && document.querySelector('[data-testid=status]').textContent === 'live'",
            timeout=WAIT_MS,
        )
        return viewer

    async def model(self) -> dict[str, Any]:
        model: dict[str, Any] = await self.page.evaluate("window.aguiViewer.model()")
        return model

    async def transcript(self) -> str:
        text: str = await self.page.evaluate("window.aguiViewer.transcriptText()")
        return text

    async def text(self, test_id: str) -> str:
        return await self.page.locator(f"[data-testid={test_id}]").inner_text()

    async def wait_runs_ended(self, count: int = 1) -> None:
        await self.page.wait_for_function(
            """(count) => {
                const runs = window.aguiViewer.model().runs;
                return runs.length >= count && runs.every((r) => r.status !== "running");
            }""",
            arg=count,
            timeout=WAIT_MS,
        )

    def check_clean(self) -> None:
        """Nothing logged, and nothing requested but the page's own files from the gateway."""
        assert not self.errors, self.errors
        assert self.requests, "no request recorded?"
        for url in self.requests:
            parts = urlsplit(url)
            if parts.scheme == "data":
                continue
            assert parts.scheme in ("http", "ws"), url
            assert parts.netloc in {f"127.0.0.1:{port}" for port in self.ports}, url
            assert parts.path in PAGE_FILES, url


async def demo(url: str, thread: str, speed: float, run_id: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *CLI, "demo", thread, "--speed", str(speed), "--url", url, "--run-id", run_id,
        cwd=ROOT, env=child_env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


async def finished(process: asyncio.subprocess.Process) -> None:
    output, _ = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode == 0, output.decode(errors="replace")


async def reference(url: str, thread: str, runs: int = 1) -> Any:
    """The Python reducer's fold of the thread, read back from the gateway."""
    events: list[dict[str, Any]] = []
    ended = 0
    async with (
        asyncio.timeout(WAIT),
        HubClient(url, encoding="json") as hub,
        hub.subscribe(thread, "start") as sub,
    ):
        async for item in sub:
            if isinstance(item, ThreadEvent):
                events.append(item.event)
                if item.event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                    ended += 1
                    if ended == runs:
                        break
    return fold(events)


def gateway(gateways: Gateways) -> GatewayProcess:
    return gateways.start(None)


# -- (a, c) two pages, msgpack and JSON, and the Python reducer ------------------------------------


async def test_two_pages_show_the_same_run_as_the_python_reducer(
    browser: Browser, gateways: Gateways
) -> None:
    hub = gateway(gateways)
    thread = "viewer-two-pages"
    first = await Viewer.open(browser, hub.port, thread)
    second = await Viewer.open(browser, hub.port, thread, encoding="json")
    await finished(await demo(hub.url, thread, 4, "run-two-pages"))
    for viewer in (first, second):
        await viewer.wait_runs_ended()
    expected = await reference(hub.url, thread)
    text = await first.transcript()
    assert text == await second.transcript()
    for viewer, encoding, kind in ((first, "msgpack", bytes), (second, "json", str)):
        model = await viewer.model()
        assert model["messages"] == expected.messages
        assert model["state"] == expected.state
        assert [r["status"] for r in model["runs"]] == ["finished"]
        connection = model["connection"]
        assert (connection["encoding"], connection["reconnects"], connection["resumes"]) == (
            encoding,
            0,
            [],
        )
        assert viewer.frame_kinds == {kind}, f"{encoding} page got {viewer.frame_kinds}"
        viewer.check_clean()
    # A late viewer that asks for the compact snapshot: the same messages and state.
    late = await Viewer.open(browser, hub.port, thread, start="snapshot")
    await late.wait_runs_ended()
    model = await late.model()
    assert (model["messages"], model["state"]) == (expected.messages, expected.state)
    assert (model["connection"]["from"], model["connection"]["snapshots"]) == ("snapshot", 1)
    assert "Pack sunglasses for Paris" in await late.transcript()
    late.check_clean()
    # What a person sees: every message, the tool calls with their results, the steps.
    for shown in (
        "What's the weather like in Paris and Berlin today?",
        "get_weather",
        '"chanceOfRain": 0.6',
        "Pack sunglasses for Paris",
        "fetch_weather",
        "finished",
    ):
        assert shown in text, shown
    assert await first.text("status") == "live"


# -- (b) a connection cut mid-run ------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
async def test_a_page_that_loses_its_connection_resumes_without_a_gap(
    browser: Browser, gateways: Gateways, encoding: str
) -> None:
    # Any origin: the steady page comes from the proxy but connects to the gateway.
    hub = gateways.start(None, "--allowed-origins", "*")
    thread = f"viewer-cut-{encoding}"
    async with FaultProxy("127.0.0.1", hub.port) as proxy:
        cut = await Viewer.open(browser, proxy.port, thread, encoding=encoding)
        # Served through the proxy too, but ?hub= sends its WebSocket around it.
        steady = await Viewer.open(browser, proxy.port, thread, encoding=encoding, hub=hub.port)
        await cut.page.evaluate(
            """() => {
                window.statuses = [];
                const status = document.querySelector("[data-testid=status]");
                new MutationObserver(() => window.statuses.push(status.textContent))
                    .observe(status, {childList: true, characterData: true, subtree: true});
            }"""
        )
        run = await demo(hub.url, thread, 2, f"run-cut-{encoding}")
        # Mid-run: some of its 107 events are in, the run is still going.
        await cut.page.wait_for_function(
            "() => window.aguiViewer.model().connection.items > 30", timeout=WAIT_MS
        )
        model = await cut.model()
        assert [r["status"] for r in model["runs"]] == ["running"], "not mid-run"
        assert proxy.cut_all() >= 1
        await finished(run)
        for viewer in (cut, steady):
            await viewer.wait_runs_ended()
        await cut.page.wait_for_function(
            "() => window.aguiViewer.model().connection.state === 'live'", timeout=WAIT_MS
        )
        expected = await reference(hub.url, thread)
        assert await cut.transcript() == await steady.transcript()
        model = await cut.model()
        assert model["messages"] == expected.messages
        assert model["state"] == expected.state
        connection = model["connection"]
        assert connection["reconnects"] == 1
        assert [resume["complete"] for resume in connection["resumes"]] == [True]
        assert connection["snapshots"] == 0
        assert await cut.text("reconnects") == "1"
        assert await cut.text("resume") == "resumed, nothing missed"
        statuses = await cut.page.evaluate("window.statuses")
        assert any(s.startswith("reconnecting (attempt ") for s in statuses), statuses
        assert statuses[-1] == "live", statuses
        assert (await steady.model())["connection"]["reconnects"] == 0
        assert f"ws://127.0.0.1:{hub.port}/" in steady.requests
        assert await steady.text("hub") == f"hub 127.0.0.1:{hub.port}"  # shown: not its own
        assert not await cut.page.locator("[data-testid=hub]").is_visible()
        assert await steady.text("resume") == ""
        # The page's errors: none (a dropped connection is not one).
        for viewer in (cut, steady):
            viewer.check_clean()


# -- (d) markup in events is text ------------------------------------------------------------------


MARKUP = [
    '<img src=x onerror="window.pwned=1">',
    "<script>window.pwned = 2</script>",
    "<svg onload=window.pwned=3>",
    '"><iframe src="javascript:window.pwned=4">',
    "<style>body{display:none}</style>",
    "<b onmouseover=window.pwned=5>bold</b>",
]


def hostile_run(thread: str) -> list[dict[str, Any]]:
    run = "run-<i>x</i>"
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": run},
        {"type": "TEXT_MESSAGE_START", "messageId": "m<1>", "role": "user"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m<1>", "delta": MARKUP[0]},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m<1>", "delta": MARKUP[1]},
        {"type": "TEXT_MESSAGE_END", "messageId": "m<1>"},
        {"type": "STEP_STARTED", "stepName": MARKUP[5]},
        {"type": "REASONING_START", "messageId": "r"},
        {"type": "REASONING_MESSAGE_START", "messageId": "rm", "role": "reasoning"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "rm", "delta": MARKUP[2]},
        {"type": "REASONING_MESSAGE_END", "messageId": "rm"},
        {"type": "REASONING_END", "messageId": "r"},
        {"type": "STEP_FINISHED", "stepName": MARKUP[5]},
        {"type": "TEXT_MESSAGE_START", "messageId": "a", "role": "assistant", "name": MARKUP[4]},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a", "delta": MARKUP[3]},
        {"type": "TEXT_MESSAGE_END", "messageId": "a"},
        {
            "type": "TOOL_CALL_START",
            "toolCallId": "c",
            "toolCallName": MARKUP[1],
            "parentMessageId": "a",
        },
        {
            "type": "TOOL_CALL_ARGS",
            "toolCallId": "c",
            "delta": '{"html": "<img src=y onerror=a()>"}',
        },
        {"type": "TOOL_CALL_END", "toolCallId": "c"},
        {
            "type": "TOOL_CALL_RESULT",
            "messageId": "t",
            "toolCallId": "c",
            "content": MARKUP[0],
            "role": "tool",
        },
        {"type": "STATE_SNAPSHOT", "snapshot": {MARKUP[0]: MARKUP[1], "list": [MARKUP[2]]}},
        {
            "type": "ACTIVITY_SNAPSHOT",
            "messageId": "act",
            "activityType": MARKUP[3],
            "content": {"html": MARKUP[4]},
        },
        {"type": "RUN_ERROR", "message": MARKUP[0], "code": MARKUP[2]},
    ]


async def test_markup_in_events_is_shown_as_text(browser: Browser, gateways: Gateways) -> None:
    hub = gateway(gateways)
    thread = "viewer-<script>alert(1)</script>"
    viewer = await Viewer.open(browser, hub.port, thread.replace("<", "%3C").replace(">", "%3E"))
    async with HubClient(hub.url) as client:
        await client.publish(thread, hostile_run(thread))
    await viewer.wait_runs_ended()
    # Every reasoning block open, so that what is inside is laid out too.
    await viewer.page.evaluate(
        "document.querySelectorAll('details').forEach((d) => { d.open = true; })"
    )
    await viewer.page.wait_for_timeout(200)
    assert await viewer.page.evaluate("window.pwned") is None
    made = await viewer.page.evaluate(
        "document.querySelectorAll('main img, main script, main svg, main iframe, main style,"
        " main b, main i, [onerror], [onload], [onmouseover]').length"
    )
    assert made == 0
    text = await viewer.transcript()
    for markup in MARKUP:
        assert markup in text or markup in await viewer.text("state"), markup
    assert await viewer.page.locator("main").is_visible()  # the <style> did not apply
    model = await viewer.model()
    assert model["connection"]["thread"] == thread
    assert model["runs"][0]["status"] == "error"
    assert "error: " + MARKUP[0] in text
    viewer.check_clean()


async def test_raw_events_are_counted_listed_or_hidden(
    browser: Browser, gateways: Gateways
) -> None:
    """RAW and CUSTOM events (an agent framework's own, 1 to 3 kB each from
    LangGraph) are counted on the events line by default, listed whole with
    #raw=full, and not mentioned with #raw=hide; the transcript is the same."""
    hub = gateway(gateways)
    thread = "viewer-raw"
    raw = {"type": "RAW", "source": "langchain", "event": {"chunk": "x" * 1500}}
    events: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        raw,
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "The answer is 42."},
        raw,
        {"type": "CUSTOM", "name": "progress", "value": {"done": 1}},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]
    async with HubClient(hub.url) as client:
        await client.publish(thread, events)
    pages = {}
    for mode in ("short", "full", "hide"):
        viewer = await Viewer.open(
            browser, hub.port, thread + ("" if mode == "short" else f"&raw={mode}")
        )
        await viewer.wait_runs_ended()
        await viewer.page.wait_for_timeout(100)  # one more frame: the events line
        pages[mode] = (viewer, await viewer.text("events"), await viewer.transcript())
    short, full, hide = (pages[m][1] for m in ("short", "full", "hide"))
    assert "8 events" in short and "3 RAW/CUSTOM (3.2 kB) not shown" in short, short
    assert "RAW/CUSTOM" not in full and "RAW/CUSTOM" not in hide
    assert pages["short"][2] == pages["full"][2] == pages["hide"][2]
    assert "The answer is 42." in pages["short"][2] and "x" * 100 not in pages["short"][2]
    listed = pages["full"][0].page.locator("[data-testid=raw-events] li")
    assert await listed.count() == 3
    assert '"name":"progress"' in await listed.nth(2).inner_text()
    assert "x" * 1500 in await listed.nth(0).inner_text()
    for mode in ("short", "hide"):
        assert not await pages[mode][0].page.locator("[data-testid=raw-events]").is_visible()
    for viewer, _, _ in pages.values():
        viewer.check_clean()


# -- (f) how it looks ------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_a_screenshot_mid_run(browser: Browser, gateways: Gateways, tmp_path: Path) -> None:
    hub = gateway(gateways)
    thread = "demo"
    events = [event for _, event in demo_run(thread, "run-7f3a9c2e")]
    # Mid-answer: both tool calls have their results, the state has filled in,
    # the reasoning is done (and opened below), the answer is streaming.
    answer = next(
        i
        for i, e in enumerate(events)
        if e["type"] == "TEXT_MESSAGE_START" and e["messageId"].endswith("answer")
    )
    shown, rest = events[: answer + 14], events[answer + 14 :]
    viewer = await Viewer.open(
        browser, hub.port, thread, viewport={"width": 1280, "height": 800}, color_scheme="light"
    )
    async with HubClient(hub.url) as client:
        await client.publish(thread, shown)
        await viewer.page.wait_for_function(
            f"() => window.aguiViewer.model().connection.items > {len(shown)}", timeout=WAIT_MS
        )
        await viewer.page.locator(".msg.reasoning summary").click()  # open the thinking
        await viewer.page.wait_for_timeout(300)  # the frame after
        text = await viewer.transcript()
        assert '"conditions": "cloudy"' in text and "Paris is sunny" in text
        assert "Pack sunglasses" not in text
        assert await viewer.page.locator('.msg[data-streaming="true"]').count() == 1
        image = await viewer.page.screenshot(animations="disabled")
        assert png_size(image) == (1280, 800)
        (tmp_path / "viewer.png").write_bytes(image)
        target = os.environ.get("AGUI_HUB_SCREENSHOT")
        if target:
            Path(target).write_bytes(image)
        print(f"screenshot: {tmp_path / 'viewer.png'}", file=sys.stderr)

        # Narrow: a phone's width, nothing wider than the screen.
        await viewer.page.set_viewport_size({"width": 360, "height": 740})
        await viewer.page.wait_for_timeout(100)
        width = await viewer.page.evaluate("document.documentElement.scrollWidth")
        assert width <= 360
        narrow = await viewer.page.screenshot(full_page=True, animations="disabled")
        assert png_size(narrow)[0] == 360
        (tmp_path / "viewer-360.png").write_bytes(narrow)

        await client.publish(thread, rest)
    await viewer.wait_runs_ended()
    assert (await viewer.model())["runs"][0]["status"] == "finished"
    viewer.check_clean()


# -- (g) credentials and a thread it may not read -----------------------------------------------

SECRET = "viewer-test-secret-0123456789-abcdefgh"


class Recorder:
    """A WebSocket endpoint that only records the subprotocols each handshake offers, then
    refuses it: what a gateway at another ``?hub=`` would learn from the page."""

    def __init__(self) -> None:
        self.offers: list[list[str]] = []
        self.port = 0

    async def __aenter__(self) -> Recorder:
        from websockets.asyncio.server import serve

        def record(connection: Any, request: Any) -> Any:
            offered = request.headers.get_all("Sec-WebSocket-Protocol")
            self.offers.append([p.strip() for value in offered for p in value.split(",")])
            return connection.respond(403, "recorded\n")

        self._server = await serve(lambda ws: ws.close(), "127.0.0.1", 0, process_request=record)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def handshakes(self, count: int = 1) -> list[list[str]]:
        async with asyncio.timeout(WAIT):
            while len(self.offers) < count:
                await asyncio.sleep(0.02)
        return self.offers


def bearers(offers: list[list[str]]) -> set[str]:
    return {p for offer in offers for p in offer if p.startswith("agui-hub.bearer.")}


async def test_a_token_goes_only_to_the_gateway_it_was_typed_for(
    browser: Browser, gateways: Gateways
) -> None:
    hub = gateway(gateways)
    page = await browser.new_page()
    async with Recorder() as mine, Recorder() as other:
        # Typed while following the gateway at ?hub=mine: sent there.
        await page.goto(f"http://127.0.0.1:{hub.port}/?hub=ws://127.0.0.1:{mine.port}/#thread=t")
        await mine.handshakes()
        await page.evaluate(
            """() => {
                document.getElementById("token").value = "header.payload.signature";
                document.getElementById("token-form").requestSubmit();
            }"""
        )
        offers = await mine.handshakes(len(mine.offers) + 1)
        assert bearers(offers[-1:]) == {"agui-hub.bearer.header.payload.signature"}

        # A link in the same tab (same sessionStorage) to another gateway: not sent there.
        await page.goto(f"http://127.0.0.1:{hub.port}/?hub=ws://127.0.0.1:{other.port}/#thread=t")
        offers = await other.handshakes(2)  # the first attempt and a retry
        assert all("agui-hub.v1.msgpack" in offer for offer in offers)
        assert bearers(offers) == set()
        assert await page.evaluate('document.getElementById("token").value') == ""

        # Back to the first: its token is still kept for it.
        seen = len(mine.offers)
        await page.goto(f"http://127.0.0.1:{hub.port}/?hub=ws://127.0.0.1:{mine.port}/#thread=t")
        offers = await mine.handshakes(seen + 1)
        assert bearers(offers[seen:]) == {"agui-hub.bearer.header.payload.signature"}
    await page.close()


async def test_the_indicator_says_when_a_thread_is_not_followed(
    browser: Browser, gateways: Gateways, tmp_path: Path
) -> None:
    from agui_hub.gateway.auth import encode_token

    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    hub = gateways.start(None, "--jwt-secret-file", str(secret_file))
    token = encode_token(SECRET, "viewer", subscribe=["open-*"], ttl=300)
    viewer = Viewer(await browser.new_page(), hub.port)
    page = viewer.page
    await page.goto(f"http://127.0.0.1:{hub.port}/#thread=closed-1")
    await page.evaluate(
        """(token) => {
            document.getElementById("token").value = token;
            document.getElementById("token-form").requestSubmit();
        }""",
        token,
    )
    # Connected, but the thread is refused: the dot must not say "live".
    status = page.locator("[data-testid=status]")
    await page.wait_for_function(
        "() => document.querySelector('[data-testid=status]').textContent === 'not following'",
        timeout=WAIT_MS,
    )
    assert await page.locator("#connection").get_attribute("data-state") == "stopped"
    assert "not allowed to read this thread" in await page.locator("#notice").inner_text()
    model = await viewer.model()
    assert model["connection"]["state"] == "live"
    assert "forbidden" in model["connection"]["stopped"]

    # A thread it may read: live again, on the same connection.
    await page.evaluate("() => { location.hash = '#thread=open-1'; }")
    await page.wait_for_function(
        "() => window.aguiViewer.model().connection.subscribed"
        " && document.querySelector('[data-testid=status]').textContent === 'live'",
        timeout=WAIT_MS,
    )
    assert await page.locator("#connection").get_attribute("data-state") == "live"
    assert await status.inner_text() == "live"
    assert (await viewer.model())["connection"]["reconnects"] == 0
    await page.close()


# -- branches: regenerated answers and an edited question ------------------------------------


def branch_run(
    thread: str, run: str, question: str, answer: str, parent: str | None, asked: str | None = None
) -> list[Any]:
    """A run answering *question* (message id *asked*: a regenerate asks an earlier one)."""
    started: dict[str, Any] = {
        "type": "RUN_STARTED",
        "threadId": thread,
        "runId": run,
        "input": {
            "threadId": thread,
            "runId": run,
            "messages": [{"id": asked or f"q-{run}", "role": "user", "content": question}],
            "state": {},
            "tools": [],
            "context": [],
        },
    }
    if parent is not None:
        started["parentRunId"] = parent
    return [
        started,
        {"type": "TEXT_MESSAGE_START", "messageId": f"a-{run}", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": f"a-{run}", "delta": answer},
        {"type": "TEXT_MESSAGE_END", "messageId": f"a-{run}"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": run},
    ]


# Where each fork's switch is in the transcript: the run section it is in, the message of
# that section it is on (the run's question), or the first message it is over, and the
# answers of that run.
FORKS_SHOWN = """() => {
    const transcript = document.querySelector("[data-testid=transcript]");
    const text = (m) => m && `${m.dataset.role}: ${m.querySelector(".content").textContent}`;
    return [...document.querySelectorAll("[data-testid=fork]")].map((fork) => {
        const run = fork.closest(".run");
        if (!transcript.contains(fork) || !run) {
            const top = fork.parentElement.parentElement === transcript
                && fork.parentElement === transcript.firstElementChild;
            return {at: transcript.contains(fork) ? (top ? "top" : "elsewhere") : "outside"};
        }
        const body = run.querySelector(":scope > .run-body");
        const on = fork.parentElement.closest(".msg");
        return {
            label: fork.querySelector(".fork-label").textContent,
            run: run.querySelector(".run-title").textContent,
            on: on && on.parentElement === body ? text(on) : null,
            over: fork.nextElementSibling === body ? text(body.firstElementChild) : null,
            answers: [...body.querySelectorAll(".msg[data-role=assistant] > .content")]
                .map((content) => content.textContent),
        };
    });
}"""


async def forks_shown(viewer: Viewer, expected: list[dict[str, Any]]) -> None:
    """Wait until the page shows its fork switches as *expected* (see FORKS_SHOWN)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while (shown := await viewer.page.evaluate(FORKS_SHOWN)) != expected:
        assert asyncio.get_running_loop().time() < deadline, shown
        await asyncio.sleep(0.05)


def fork_at(
    label: str, run: str, answer: str, *, on: str | None = None, over: str | None = None
) -> dict[str, Any]:
    return {"label": label, "run": run, "on": on, "over": over, "answers": [answer]}


async def test_the_page_flips_between_versions_of_an_answer(
    browser: Browser, gateways: Gateways
) -> None:
    hub = gateway(gateways)
    thread = "viewer-branches"
    async with HubClient(hub.url) as client:
        await client.publish(thread, branch_run(thread, "r1", "hello", "hi there", None))
        await client.publish(thread, branch_run(thread, "r2", "two plus two?", "four", "r1"))
        # A regenerate of that answer, then an edit of its question.
        await client.publish(thread, branch_run(thread, "r3", "two plus two?", "it is 4", "r1"))
        await client.publish(thread, branch_run(thread, "r4", "three plus three?", "six", "r1"))
    viewer = await Viewer.open(browser, hub.port, thread)
    forks = "window.aguiViewer.model().forks"
    await viewer.page.wait_for_function(f"() => {forks}.length === 1", timeout=WAIT_MS)
    [fork] = (await viewer.model())["forks"]
    assert (fork["run"], fork["versions"], fork["index"]) == ("r4", ["r2", "r3", "r4"], 2)
    # On the edited question, in the transcript: where this version begins to differ.
    edited = "user: three plus three?"
    await forks_shown(viewer, [fork_at("3 of 3", "run r4 (from r1)", "six", on=edited)])

    async def flip(button: str, run: str, shows: str, hides: list[str]) -> None:
        await viewer.page.locator(f"[data-testid={button}]").click()
        await viewer.page.wait_for_function(
            f"""() => {{
                const m = window.aguiViewer.model();
                return m.connection.branch === {run!r} && m.connection.subscribed
                    && m.forks.length === 1 && m.forks[0].run === {run!r}
                    && window.aguiViewer.transcriptText().includes({shows!r});
            }}""",
            timeout=WAIT_MS,
        )
        text = await viewer.transcript()
        assert "hi there" in text  # the shared beginning, on every version
        for other in hides:
            assert other not in text, (run, other, text)

    asked = "user: two plus two?"
    await flip("fork-previous", "r3", "it is 4", ["four", "six", "three plus three?"])
    await forks_shown(viewer, [fork_at("2 of 3", "run r3 (from r1)", "it is 4", on=asked)])
    await flip("fork-previous", "r2", "four", ["it is 4", "six"])
    await forks_shown(viewer, [fork_at("1 of 3", "run r2 (from r1)", "four", on=asked)])
    await flip("fork-next", "r3", "it is 4", ["four", "six"])
    await forks_shown(viewer, [fork_at("2 of 3", "run r3 (from r1)", "it is 4", on=asked)])
    await flip("fork-next", "r4", "six", ["four", "it is 4", "two plus two?"])
    await forks_shown(viewer, [fork_at("3 of 3", "run r4 (from r1)", "six", on=edited)])
    assert "three plus three?" in await viewer.transcript()  # the edited question
    assert "#" in viewer.page.url and "branch=r4" in viewer.page.url  # no reload, a link
    viewer.check_clean()


async def test_a_regenerated_answer_has_its_switch_over_it(
    browser: Browser, gateways: Gateways
) -> None:
    """A regenerate asks the question of the version before it again: on the whole
    thread, that question is shown with that version, so the switch goes over the
    regenerated answer; it stays there as the thread goes on live; on a branch, the
    question is the version's own and the switch is on it."""
    hub = gateway(gateways)
    thread = "viewer-regenerated"
    async with HubClient(hub.url) as client:
        await client.publish(thread, branch_run(thread, "r1", "hello", "hi there", None))
        await client.publish(thread, branch_run(thread, "r2", "two plus two?", "four", "r1"))
        await client.publish(
            thread, branch_run(thread, "r3", "two plus two?", "it is 4", "r1", asked="q-r2")
        )
        viewer = await Viewer.open(browser, hub.port, thread)
        regenerated = fork_at("2 of 2", "run r3 (from r1)", "it is 4", over="assistant: it is 4")
        await forks_shown(viewer, [regenerated])

        await client.publish(thread, branch_run(thread, "r4", "and three?", "three", "r3"))
        await viewer.page.wait_for_function(
            "() => window.aguiViewer.transcriptText().includes('three')", timeout=WAIT_MS
        )
        await viewer.wait_runs_ended(4)
        await forks_shown(viewer, [regenerated])

    asked = "user: two plus two?"
    for button, run, label, answer, hidden in [
        ("fork-previous", "r2", "1 of 2", "four", "it is 4"),
        ("fork-next", "r3", "2 of 2", "it is 4", "four"),
    ]:
        await viewer.page.locator(f"[data-testid={button}]").click()
        await viewer.page.wait_for_function(
            f"() => window.aguiViewer.model().connection.branch === {run!r}", timeout=WAIT_MS
        )
        await forks_shown(viewer, [fork_at(label, f"run {run} (from r1)", answer, on=asked)])
        text = await viewer.transcript()
        assert answer in text and hidden not in text, text
    assert "three" in await viewer.transcript()  # r3's branch goes on with r4
    viewer.check_clean()


async def test_regenerate_and_edit_from_the_page(browser: Browser, gateways: Gateways) -> None:
    """With an agent the page may run: "regenerate" and "edit" start new versions of the
    latest answer through the gateway's bridge, and the page follows each."""
    with serve_agent() as agent:
        hub = gateways.start(None, "--http-port", "0", "--agents", f"ok={agent.url('ok')}")
        thread = "viewer-regenerate"
        async with HubClient(hub.url) as client:
            await client.publish(thread, branch_run(thread, "r0", "start", "welcome", None))
            first = await client.run(
                thread, "ok", messages=[{"id": "q1", "role": "user", "content": "hello"}]
            )
        viewer = await Viewer.open(browser, hub.port, thread)
        regenerate = viewer.page.locator("[data-testid=regenerate]")
        await regenerate.wait_for(timeout=WAIT_MS)
        await regenerate.click()
        await viewer.page.wait_for_function(
            f"""() => {{
                const m = window.aguiViewer.model();
                return m.connection.branch && m.connection.branch !== {first["runId"]!r}
                    && m.forks.length === 1 && m.forks[0].versions.length === 2
                    && m.runs.length > 0 && m.runs.every((r) => r.status === "finished");
            }}""",
            timeout=WAIT_MS,
        )
        model = await viewer.model()
        second = model["connection"]["branch"]
        assert model["forks"][0]["versions"] == [first["runId"], second]
        regenerated = agent.inputs[-1]
        assert regenerated["runId"] == second and regenerated["parentRunId"] == "r0"
        # The branch up to r0 (its question), then the question again.
        asked = [m["content"] for m in regenerated["messages"] if m["role"] == "user"]
        assert asked == ["start", "hello"]

        viewer.page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept("bonjour")))
        await viewer.page.locator("[data-testid=edit]").click()
        await viewer.page.wait_for_function(
            """() => {
                const m = window.aguiViewer.model();
                return m.forks.length === 1 && m.forks[0].versions.length === 3
                    && m.forks[0].index === 2
                    && window.aguiViewer.transcriptText().includes("You said: 'bonjour'");
            }""",
            timeout=WAIT_MS,
        )
        text = await viewer.transcript()
        assert "bonjour" in text and "welcome" in text and "hello" not in text, text
        edited = agent.inputs[-1]
        assert edited["parentRunId"] == "r0"
        asked = [m["content"] for m in edited["messages"] if m["role"] == "user"]
        assert asked == ["start", "bonjour"]
        viewer.check_clean()


# -- presence: "N watching" --------------------------------------------------------------------


async def watching(viewer: Viewer, text: str) -> None:
    """Wait until the header says *text* ("2 watching")."""
    await viewer.page.wait_for_function(
        "(text) => { const node = document.querySelector('[data-testid=watching]');"
        " return !node.hidden && node.textContent === text; }",
        arg=text,
        timeout=WAIT_MS,
    )


async def test_the_header_says_how_many_are_watching(browser: Browser, gateways: Gateways) -> None:
    hub = gateways.start(None, "--presence-interval", "0.2")
    thread = "viewer-presence"
    viewer = await Viewer.open(browser, hub.port, thread)
    badge = viewer.page.locator("[data-testid=watching]")
    await watching(viewer, "1 watching")
    assert await badge.get_attribute("title") == "anonymous (viewer) — this page"

    async with (
        HubClient(hub.url, client={"name": "py", "device": "test"}) as client,
        client.subscribe(thread) as sub,
    ):
        await asyncio.wait_for(anext(sub), WAIT)
        await watching(viewer, "2 watching")
        title = await badge.get_attribute("title")
        assert title == "anonymous (viewer) — this page\nanonymous (py · test)", title
        model = await viewer.model()
        assert model["presence"] == {
            "shown": True,
            "count": 2,
            "subjects": ["anonymous", "anonymous"],
            "hidden": False,
            "off": False,
        }
    await watching(viewer, "1 watching")
    assert (await viewer.model())["presence"]["count"] == 1
    viewer.check_clean()


async def test_count_only_and_presence_off(browser: Browser, gateways: Gateways) -> None:
    counting = gateways.start(None, "--presence", "count", "--presence-interval", "0.2")
    off = gateways.start(None, "--presence", "off")
    counted = await Viewer.open(browser, counting.port, "counted")
    await watching(counted, "1 watching")
    title = await counted.page.locator("[data-testid=watching]").get_attribute("title")
    assert title == "this hub shows how many, not who"
    assert (await counted.model())["presence"]["subjects"] == []
    unseen = await Viewer.open(browser, off.port, "unseen")
    await unseen.page.wait_for_function(
        "() => window.aguiViewer.model().presence.off", timeout=WAIT_MS
    )
    assert await unseen.page.locator("[data-testid=watching]").is_hidden()
    for viewer in (counted, unseen):
        viewer.check_clean()
