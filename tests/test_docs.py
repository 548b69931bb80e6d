"""The documentation's Python, executed: every ```python block of README.md and
docs/*.md runs as a program of its own, against a real hub.

Each block is written to a file and run with a fresh interpreter, with a
deadline, in a directory of its own. Its world (each part started only for a
block that names it): a gateway process on a free loopback port (the
in-memory store) holding the walk-through's ``demo`` run; a gateway with JWT
authentication whose HS256 secret is the file ``secret`` in the block's
directory (as in the README's security section); a real redis-server, with a
key prefix of the block's own. The URLs the docs use stand for those:
``ws://127.0.0.1:8765`` (and ``ws://localhost:8765``) for the plain gateway,
``wss://hub.example`` and ``wss://relay.example`` for the JWT one,
``redis://localhost:6379/0`` for Redis. Nothing else is changed.

A block that is not meant to run (a fragment illustrating an API) says so
with the line ``<!-- not run: <reason> -->`` right before its fence, and is
listed in :data:`NOT_RUN`: a block is skipped only when both agree, so none
is skipped silently, and a Python block added without being runnable fails
here. Python in a block without a language fails too.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import re
import secrets
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agui_hub.client.hub_client import HubClient, ThreadEvent
from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.config import MIB, SETTING_GROUPS, GatewayConfig

from .conftest import TIMEOUT_SCALE, RedisServer, free_port, unusable
from .processes import CLI, GatewayProcess, Gateways, child_env

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_TIMEOUT = 60 * TIMEOUT_SCALE
"""Seconds one snippet may take (they take about one)."""

NEEDS_FRAMEWORKS = {"docs/agents.md"}
"""Documents whose snippets use agent frameworks (the ``frameworks`` extra): without them
the snippets are skipped with the command that installs them (failed under CI)."""
FRAMEWORK_MODULES = ("pydantic_ai", "langgraph", "ag_ui_langgraph", "fastapi")

FIXED_PORTS_IN = {"docs/agents.md"}
FIXED_PORTS = ("8001", "8002", "8780", "8781")
"""The loopback ports the recipes of FIXED_PORTS_IN serve on; each run takes free ones."""
FIXED_PORT = re.compile(r"\b(" + "|".join(FIXED_PORTS) + r")\b")

NOT_RUN: dict[str, set[str]] = {}
"""Per document, the reasons of its blocks marked ``<!-- not run: reason -->``:
exactly the marked ones (see :func:`test_not_run_blocks_are_listed`)."""

PYTHON_INFO = {"python", "python3", "py", "pycon", "py3"}
NOT_RUN_MARK = re.compile(r"^<!--\s*not run:\s*(?P<reason>.*?)\s*-->$")

PLAIN_URLS = ("ws://127.0.0.1:8765", "ws://localhost:8765")
JWT_URLS = ("wss://hub.example", "wss://relay.example")
REDIS_URL = re.compile(r"redis://localhost:6379/0(?P<query>\?)?")
UNRESOLVED = re.compile(r"(?:localhost|127\.0\.0\.1):(?:8765|6379)|hub\.example|relay\.example")
"""What must not be left in a snippet once its URLs are the test's."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    document: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    info: str  # the fence's info string ("python", "sh", "")
    code: str
    not_run: str | None  # the reason of a preceding <!-- not run: ... --> line

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""

    @property
    def is_python(self) -> bool:
        return self.language in PYTHON_INFO

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"


def fenced_blocks(text: str, document: str) -> list[Block]:
    """The fenced code blocks of a Markdown *text* (``` or ~~~ fences), in order."""
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        opening = re.match(r"^(`{3,}|~{3,})(.*)$", stripped)
        if opening is None:
            index += 1
            continue
        fence, info = opening.group(1), opening.group(2).strip()
        indent = len(lines[index]) - len(lines[index].lstrip())
        previous = next((lines[i].strip() for i in range(index - 1, -1, -1)
                         if lines[i].strip()), "")  # fmt: skip
        mark = NOT_RUN_MARK.match(previous)
        body: list[str] = []
        end = index + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence[0] * len(fence))
            and not lines[end].strip().strip(fence[0])
        ):
            body.append(lines[end][indent:] if lines[end][:indent].isspace() else lines[end])
            end += 1
        assert end < len(lines), f"{document}:{index + 1}: a code block is never closed"
        found.append(
            Block(document, index + 1, info, "\n".join(body) + "\n",
                  mark.group("reason") if mark else None)
        )  # fmt: skip
        index = end + 1
    return found


def document_blocks() -> list[Block]:
    blocks: list[Block] = []
    for path in DOCUMENTS:
        blocks += fenced_blocks(path.read_text(), str(path.relative_to(ROOT)))
    return blocks


def python_blocks() -> list[Block]:
    return [block for block in document_blocks() if block.is_python]


# -- the blocks' world -----------------------------------------------------------------------


@dataclass
class World:
    """What one snippet runs against."""

    directory: Path
    gateways: Gateways
    redis_url: str
    """The shared redis-server with a key prefix of this snippet's own."""
    _plain: GatewayProcess | None = None
    _jwt: GatewayProcess | None = None

    @property
    def plain(self) -> GatewayProcess:
        """The gateway without authentication, holding the demo's run in ``demo``;
        started on first use."""
        if self._plain is None:
            self._plain = self.gateways.start()
            demo = subprocess.run(
                [*CLI, "demo", "--speed", "0", "--url", self._plain.url],
                env=child_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT,
            )  # fmt: skip
            assert demo.returncode == 0, demo.stderr
        return self._plain

    @property
    def jwt(self) -> GatewayProcess:
        """The gateway with JWT authentication, started on first use."""
        if self._jwt is None:
            secret = self.directory / "secret"
            self._jwt = self.gateways.start(None, "--jwt-secret-file", str(secret))
        return self._jwt

    def token(self, **grants: list[str]) -> str:
        """A token the JWT gateway accepts, with *grants* (subscribe=, publish=)."""
        secret = (self.directory / "secret").read_text().strip()
        return encode_token(secret, "docs-test", ttl=600, **grants)

    def substitute(self, code: str) -> str:
        for url in PLAIN_URLS:
            if url in code:
                code = code.replace(url, self.plain.url)
        for url in JWT_URLS:
            if url in code:
                code = code.replace(url, self.jwt.url)

        def redis(match: re.Match[str]) -> str:
            return self.redis_url + ("&" if match.group("query") else "")

        return REDIS_URL.sub(redis, code)

    def run(self, block: Block) -> subprocess.CompletedProcess[str]:
        code = self.substitute(block.code)
        if block.document in FIXED_PORTS_IN:
            # The recipes serve on fixed loopback ports, as a reader would: each
            # run here takes free ones instead, so that a busy port fails nothing.
            ports = {fixed: str(free_port()) for fixed in FIXED_PORTS}
            code = FIXED_PORT.sub(lambda m: ports[m.group(1)], code)
        left = UNRESOLVED.findall(code)
        assert not left, f"{block.name}: {left} is not a URL this test stands in for"
        path = self.directory / "snippet.py"
        path.write_text(code)
        try:
            return subprocess.run(
                [sys.executable, path.name],
                cwd=self.directory,
                env=child_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{block.name} did not finish within {RUN_TIMEOUT:g} s (a snippet must end)\n"
                f"stdout:\n{exc.stdout!r}\nstderr:\n{exc.stderr!r}"
            ) from None


@pytest.fixture
def world(tmp_path: Path, redis_server: RedisServer) -> Iterator[World]:
    gateways = Gateways(tmp_path)
    directory = tmp_path / "snippet"
    directory.mkdir()
    secret = directory / "secret"
    secret.write_text(base64.b64encode(secrets.token_bytes(48)).decode() + "\n")
    try:
        prefix = f"docs-{uuid.uuid4().hex}"
        yield World(directory, gateways, f"{redis_server.url}?prefix={prefix}")
    finally:
        gateways.kill_all()


def read_thread(url: str, thread: str, token: str | None = None) -> list[dict[str, Any]]:
    """Every event stored in *thread* of the gateway at *url*."""

    async def read() -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with HubClient(url, token=token) as hub, hub.subscribe(thread, "start") as sub:
            newest = None
            async with asyncio.timeout(RUN_TIMEOUT):
                async for item in sub:
                    if newest is None and hasattr(item, "recovered"):
                        newest = item.offset  # type: ignore[union-attr]
                        if newest == "0-0":
                            break
                    if isinstance(item, ThreadEvent):
                        events.append(item.event)
                        if item.offset == newest:
                            break
        return events

    return asyncio.run(read())


# -- what some snippets must have done, besides ending well -------------------------------------


def _client_example(world: World, output: str) -> None:
    # The demo's final answer, folded from the events.
    assert output.startswith("Paris is sunny"), output


def _publisher_example(world: World, output: str) -> None:
    events = read_thread(world.plain.url, "t1")
    assert [e["type"] for e in events] == [
        "RUN_STARTED",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ]
    assert events[0] == {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}


def _protocol_core(world: World, output: str) -> None:
    # What the comments say it prints.
    assert output.splitlines() == [
        "[{'id': 'm1', 'role': 'assistant', 'content': 'Hello'}]",
        "['RUN_STARTED', 'MESSAGES_SNAPSHOT', 'STATE_SNAPSHOT', 'TEXT_MESSAGE_START']",
    ], output


def _resume_example(world: World, output: str) -> None:
    # The resume from the saved position recovered everything.
    assert "recovered=True" in output.splitlines()[-1], output


def _publisher_retried(world: World, output: str) -> None:
    # "run it again: the same ids, the same offsets, nothing stored twice"
    block = next(b for b in python_blocks() if b.document == "docs/client.md"
                 and "async with Publisher(" in b.code)  # fmt: skip
    again = world.run(block)
    assert again.returncode == 0, again.stderr
    assert again.stdout == output


def _agent_with_token(world: World, output: str) -> None:
    token = world.token(subscribe=["tenant-42/*"])
    events = read_thread(world.jwt.url, "tenant-42/run-1", token)
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_FINISHED"], events


def _pydantic_ai_behind_the_bridge(world: World, output: str) -> None:
    # Two runs through the hub, each to its end, the answer streamed both times.
    lines = [line.rstrip() for line in output.splitlines()]
    runs = [line for line in lines if line.startswith("RUN_")]
    assert runs == ["RUN_STARTED", "RUN_FINISHED"] * 2, output
    assert lines.count("TEXT_MESSAGE_CONTENT 42.") == 2
    assert "REASONING_ENCRYPTED_VALUE" in lines and "TOOL_CALL_RESULT" in lines


def _langgraph_behind_the_bridge(world: World, output: str) -> None:
    lines = [line.rstrip() for line in output.splitlines()]
    assert lines[0] == "RUN_STARTED" and lines[-1] == "RUN_FINISHED", output
    assert "TEXT_MESSAGE_CONTENT 42." in lines
    raws = [line for line in lines if line.startswith("RAW")]
    assert raws and all(line == "RAW  None" for line in raws), raws  # stored stripped


def _pydantic_ai_publishing(world: World, output: str) -> None:
    events = read_thread(world.plain.url, "t2")
    assert events[0]["type"] == "RUN_STARTED" and events[-1]["type"] == "RUN_FINISHED"
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Paris is sunny."


def _sdk_events_publishing(world: World, output: str) -> None:
    events = read_thread(world.plain.url, "t3")
    assert [e["type"] for e in events] == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "STATE_SNAPSHOT", "RUN_FINISHED",
    ]  # fmt: skip
    assert events[2] == {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hi!"}


CHECKS: dict[tuple[str, str], Callable[[World, str], None]] = {
    ("README.md", "async with HubClient("): _client_example,
    ("README.md", "async with Publisher("): _publisher_example,
    ("README.md", "SequenceVerifier("): _protocol_core,
    ("docs/client.md", "Position.from_json("): _resume_example,
    ("docs/client.md", "async with Publisher("): _publisher_retried,
    ("docs/security.md", "HubClient("): _agent_with_token,
    ("docs/agents.md", "AGUIAdapter.dispatch_request("): _pydantic_ai_behind_the_bridge,
    ("docs/agents.md", "add_langgraph_fastapi_endpoint("): _langgraph_behind_the_bridge,
    ("docs/agents.md", "adapter.run_stream()"): _pydantic_ai_publishing,
    ("docs/agents.md", 'publisher.publish_batch("t3"'): _sdk_events_publishing,
}
"""Checks of particular snippets: (document, a string only that snippet of the
document holds) -> check of its output, run after it ended well."""


@pytest.mark.parametrize("block", python_blocks(), ids=lambda block: block.name)
def test_snippet_runs(block: Block, request: pytest.FixtureRequest) -> None:
    """The snippet runs as a file to the end, without an error, and does what it shows."""
    if block.not_run is not None:
        assert block.not_run in NOT_RUN.get(block.document, set()), (
            f"{block.name} is marked not run ({block.not_run!r}) but NOT_RUN does not list it"
        )
        pytest.skip(f"not run: {block.not_run}")
    if block.document in NEEDS_FRAMEWORKS:
        missing = [m for m in FRAMEWORK_MODULES if importlib.util.find_spec(m) is None]
        if missing:
            unusable(f"{block.name} needs {', '.join(missing)}: pip install -e '.[frameworks]'")
    world: World = request.getfixturevalue("world")
    result = world.run(block)
    assert result.returncode == 0, (
        f"{block.name} exited with {result.returncode}\n--- code:\n{world.substitute(block.code)}"
        f"\n--- stdout:\n{result.stdout}\n--- stderr:\n{result.stderr}"
    )
    assert "Traceback" not in result.stderr, result.stderr
    for (document, marker), check in CHECKS.items():
        if document == block.document and marker in block.code:
            check(world, result.stdout)


# -- the rules about blocks --------------------------------------------------------------------


def test_documents_have_python_blocks() -> None:
    """The extraction finds the snippets (a broken parser would run nothing)."""
    blocks = python_blocks()
    documents = {block.document for block in blocks}
    assert {"README.md", "docs/client.md", "docs/store.md"} <= documents, documents
    assert len(blocks) >= 8


def test_checks_name_one_snippet_each() -> None:
    """Each of :data:`CHECKS` finds exactly one snippet: a stale key fails."""
    blocks = python_blocks()
    for document, marker in CHECKS:
        matching = [b.name for b in blocks if b.document == document and marker in b.code]
        assert len(matching) == 1, f"{(document, marker)} matches {matching}"


def test_not_run_blocks_are_listed() -> None:
    """A block marked not run is listed in NOT_RUN with the same reason, and the
    other way round: nobody skips a snippet silently, and no listing goes stale."""
    marked: dict[str, set[str]] = {}
    for block in document_blocks():
        if block.not_run is not None:
            assert block.is_python, f"{block.name}: only Python blocks are run or not run"
            assert block.not_run, f"{block.name}: say why it is not run"
            marked.setdefault(block.document, set()).add(block.not_run)
    assert marked == NOT_RUN


def test_no_untagged_python() -> None:
    """Python in a fenced block without a language would escape the run: tag it."""
    looks_like_python = re.compile(
        r"^\s*(?:from agui_hub|import agui_hub|async def |asyncio\.run\(|async with )", re.M
    )
    untagged = [b.name for b in document_blocks()
                if not b.is_python and looks_like_python.search(b.code)]  # fmt: skip
    assert not untagged, f"Python in blocks not tagged ```python: {untagged}"


def test_serve_help_shows_every_default() -> None:
    """Every setting's line in ``serve --help`` gives its default, and the numbers
    it gives are the defaults :class:`GatewayConfig` has."""
    defaults = GatewayConfig()
    for group in SETTING_GROUPS.values():
        for name, text in group.items():
            assert "default" in text, f"--{name.replace('_', '-')}: {text!r} gives no default"
            value = getattr(defaults, name)
            if isinstance(value, bool) or value is None or value == "":
                continue
            if isinstance(value, int) and value >= MIB and value % MIB == 0:
                shown = f"{value // MIB} MiB"
            elif isinstance(value, float):
                shown = f"{value:g}"
            else:
                shown = str(value)
            assert f"default {shown}" in text, f"--{name}: {text!r}, default {shown}"


def test_the_extraction_itself() -> None:
    """Fences, indentation, the not-run mark and the language are read as meant."""
    text = (
        "Intro\n\n```python\nprint(1)\n```\n\n<!-- not run: a fragment -->\n"
        "```python\nhub.subscribe(...)\n```\n\n- item\n\n  ```py\n  x = 1\n  ```\n"
        "~~~sh\nls\n~~~\n```\nplain\n```\n"
    )
    blocks = fenced_blocks(text, "x.md")
    assert [(b.line, b.language, b.code, b.not_run) for b in blocks] == [
        (3, "python", "print(1)\n", None),
        (8, "python", "hub.subscribe(...)\n", "a fragment"),
        (14, "py", "x = 1\n", None),
        (17, "sh", "ls\n", None),
        (20, "", "plain\n", None),
    ]
    assert [b.is_python for b in blocks] == [True, True, True, False, False]


def test_the_substitution_itself(tmp_path: Path) -> None:
    """The URLs the docs use become the test's, a query kept; nothing else changes."""

    class Fake:
        def __init__(self, port: int) -> None:
            self.url = f"ws://127.0.0.1:{port}"

    world = World(tmp_path, Gateways(tmp_path), "redis://127.0.0.1:3/0?prefix=p")
    world._plain, world._jwt = Fake(1), Fake(2)  # type: ignore[assignment]
    code = (
        'a = "ws://127.0.0.1:8765"; b = "ws://localhost:8765"; c = "wss://hub.example"\n'
        'd = "redis://localhost:6379/0"; e = "redis://localhost:6379/0?max_len=5"\n'
    )
    assert world.substitute(code) == (
        'a = "ws://127.0.0.1:1"; b = "ws://127.0.0.1:1"; c = "ws://127.0.0.1:2"\n'
        'd = "redis://127.0.0.1:3/0?prefix=p"; e = "redis://127.0.0.1:3/0?prefix=p&max_len=5"\n'
    )
    assert not UNRESOLVED.search(world.substitute(code))
