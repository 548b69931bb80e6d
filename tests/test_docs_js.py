"""The documentation's JavaScript, executed: every ```js block of README.md and
docs/*.md runs in Node against a real gateway holding the walk-through's
``demo`` run.

A block says where it runs with a line right before its fence:
``<!-- js: node -->`` or ``<!-- js: browser -->`` (run in Node too, with the
``ws`` package as the global ``WebSocket`` a browser has), or that it is not
run: ``<!-- js: fragment (reason) -->``. A ```js block without one fails
:func:`test_every_js_block_says_where_it_runs`.

What the blocks import stands for the files the docs name: ``/agui-hub.js``
and ``./agui-hub.js`` for the client the gateway serves (the committed
``agui_hub/static/agui-hub.js``), ``./agent.js`` for HubAgent built from
``js/src``; ``ws://127.0.0.1:8765`` for the test's gateway. Nothing else is
changed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import TIMEOUT_SCALE
from .nodejs import JS_DIR, STATIC_DIR, node, run_node
from .processes import CLI, ROOT, GatewayProcess, Gateways, child_env

pytestmark = pytest.mark.timeout(120)

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<info>\S*)\n(?P<code>.*?)^```", re.M | re.S)
MARK = re.compile(r"<!--\s*js:\s*(?P<where>node|browser|fragment)\b.*-->\s*$")
JS_INFO = {"js", "javascript", "mjs", "ts", "typescript"}
DOC_URL = "ws://127.0.0.1:8765"


def js_blocks() -> Iterator[tuple[str, int, str | None, str]]:
    """(document, line, where or None, code) of every JavaScript block."""
    for path in DOCUMENTS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match["info"] not in JS_INFO:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            line = text.count("\n", 0, match.start()) + 1
            yield (
                path.relative_to(ROOT).as_posix(),
                line,
                mark["where"] if mark else None,
                match["code"],
            )


BLOCKS = [block for block in js_blocks() if block[2] in ("node", "browser")]


def test_every_js_block_says_where_it_runs() -> None:
    unmarked = [f"{doc}:{line}" for doc, line, where, _ in js_blocks() if where is None]
    assert not unmarked, f"```js blocks without <!-- js: node|browser|fragment -->: {unmarked}"
    assert BLOCKS, "docs/browser.md's examples are gone?"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, built_js: Path) -> Iterator[GatewayProcess]:
    """A gateway (memory store) whose thread ``demo`` holds one finished demo run."""
    node()
    gateways = Gateways(tmp_path_factory.mktemp("docs-js"))
    try:
        gateway = gateways.start()
        subprocess.run(
            [*CLI, "demo", "demo", "--speed", "0"],
            env=child_env(gateway.url),
            check=True,
            capture_output=True,
            timeout=60 * TIMEOUT_SCALE,
        )
        yield gateway
    finally:
        gateways.kill_all()


def program(code: str, where: str, gateway: GatewayProcess, built_js: Path) -> str:
    client = (STATIC_DIR / "agui-hub.js").as_uri()
    agent = (built_js / "js" / "dist" / "agent.js").as_uri()
    code = re.sub(r"""(from\s+)(["'])(?:/|\./)agui-hub\.js\2""", rf'\1"{client}"', code)
    code = re.sub(r"""(from\s+)(["'])\./agent\.js\2""", rf'\1"{agent}"', code)
    code = code.replace(DOC_URL, gateway.url)
    if where == "browser":
        code = 'import { WebSocket as __Ws } from "ws";\nglobalThis.WebSocket = __Ws;\n' + code
    # A block that forgot to close its client would keep Node alive: the
    # deadline of run_node catches that.
    return code


@pytest.mark.parametrize(
    ("document", "line", "where", "code"),
    BLOCKS,
    ids=[f"{doc}:{line}" for doc, line, _, _ in BLOCKS],
)
def test_js_block_runs(
    document: str, line: int, where: str, code: str, hub: GatewayProcess, built_js: Path
) -> None:
    folder = JS_DIR / ".test-build" / f"docs-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True)
    try:
        script = folder / "block.mjs"
        script.write_text(program(code, where, hub, built_js))
        done = run_node(script, timeout=30)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert "Error" not in done.stderr, done.stderr
    assert done.stdout.strip(), f"{document}:{line} printed nothing"
