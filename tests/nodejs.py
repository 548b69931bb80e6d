"""Node.js and Chromium for the tests of the JavaScript client, HubAgent and the viewer.

These tests need what ``.ci/run`` installs besides the Python packages:
``node``/``npm`` with ``npm ci --prefix js`` (the npm packages in
``js/package-lock.json``: the official ``@ag-ui/client``, esbuild, TypeScript,
``ws``), and Debian's ``chromium`` for the browser tests (driven by the Python
``playwright`` package pointed at the system browser: Playwright's own
browser download is not used).

Outside CI a missing piece skips the test with the command that installs it;
under CI (``CI`` set to ``true``) it fails the test instead, so that a CI
machine without them can never pass by skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .conftest import TIMEOUT_SCALE, unusable

ROOT = Path(__file__).resolve().parents[1]
JS_DIR = ROOT / "js"
STATIC_DIR = ROOT / "agui_hub" / "static"

CHROMIUM_ARGS = [
    # As root in a container, and on a machine with no network but loopback:
    # no sandbox, no GPU, nothing that phones home.
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def missing(what: str, install: str) -> None:
    """Skip (or, under CI, fail) a test that needs *what*, naming the *install* command."""
    unusable(f"{what} is missing: {install}")


def node() -> str:
    """The ``node`` binary, with ``js/node_modules`` installed."""
    path = shutil.which("node")
    if path is None:
        missing("node", "install Node.js 20 or newer (apt-get install nodejs npm)")
    assert path is not None
    if not (JS_DIR / "node_modules" / ".package-lock.json").exists():
        missing("js/node_modules", "npm ci --prefix js")
    return path


def chromium() -> str:
    """The system Chromium and the Python ``playwright`` package."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            break
    else:
        missing("chromium", "apt-get install chromium")
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing("the playwright package", "python3 -m pip install -e '.[test]'")
    assert path is not None
    return path


def run_node(
    script: Path | str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    cwd: Path = JS_DIR,
) -> subprocess.CompletedProcess[str]:
    """Run a Node script (a path, relative to ``js/`` unless absolute) to its end.

    The test fails with the script's output when it does not exit 0 in time.
    """
    environment = dict(os.environ)
    environment.update(env or {})
    try:
        done = subprocess.run(
            [node(), str(script), *args],
            cwd=cwd,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout * TIMEOUT_SCALE,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"node {script} did not finish in {timeout} s:\n"
            f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}"
        )
    if done.returncode != 0:
        pytest.fail(
            f"node {script} exited {done.returncode}:\nstdout:\n{done.stdout}\n"
            f"stderr:\n{done.stderr}"
        )
    return done


def node_json(script: Path | str, *args: str, **kwargs: Any) -> Any:
    """Run a Node script that prints one JSON document as its last stdout line."""
    done = run_node(script, *args, **kwargs)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, f"node {script} printed nothing:\nstderr:\n{done.stderr}"
    return json.loads(lines[-1])


def build_js(outdir: Path) -> Path:
    """``node build.mjs --outdir`` into *outdir* (under ``js/``, so that the built
    HubAgent finds ``@ag-ui/client`` and ``rxjs`` in ``js/node_modules``).

    The tests use what the sources build to now: ``js/dist`` is not committed,
    and a stale one must not be what is tested.
    """
    assert JS_DIR in outdir.parents, "build under js/: bare imports resolve from there"
    run_node("build.mjs", "--outdir", str(outdir), timeout=120)
    return outdir
