"""What installing agui-hub brings: redis only with the ``redis`` extra.

The client, the publisher (through a gateway), the command line and a gateway
on the in-memory store must work where the redis package is not installed.
The check runs in a child interpreter in which importing ``redis`` fails, as
it would on such a machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from .conftest import TIMEOUT_SCALE

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[1]

WITHOUT_REDIS = """
import importlib.abc, sys

class NoRedis(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("redis", "hiredis"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoRedis())
"""


def run_without_redis(code: str) -> subprocess.CompletedProcess[str]:
    program = WITHOUT_REDIS + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30 * TIMEOUT_SCALE,
    )


def test_redis_is_an_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = project["dependencies"]
    assert not [d for d in core if d.lower().startswith(("redis", "hiredis"))], core
    assert any(d.startswith("redis[hiredis]") for d in project["optional-dependencies"]["redis"])
    assert "agui-hub[redis]" in project["optional-dependencies"]["test"]


def test_client_publisher_and_memory_gateway_run_without_redis() -> None:
    result = run_without_redis(
        """
        import asyncio, sys
        from agui_hub.client.hub_client import HubClient, ThreadEvent
        from agui_hub.client.publisher import Publisher
        from agui_hub.gateway.server import Gateway, GatewayConfig
        from agui_hub import cli  # the command line imports too

        async def main():
            gateway = Gateway(GatewayConfig(host="127.0.0.1", port=0))
            server = await gateway.start()
            url = "ws://127.0.0.1:%d" % server.sockets[0].getsockname()[1]
            async with Publisher(url) as publisher, HubClient(url) as hub:
                offset = await publisher.publish(
                    "t", {"type": "RUN_STARTED", "threadId": "t", "runId": "r"})
                async with hub.subscribe("t", "start") as sub:
                    async with asyncio.timeout(10):
                        async for item in sub:
                            if isinstance(item, ThreadEvent):
                                assert item.offset == offset
                                break
            server.close()
            await server.wait_closed()
            assert "redis" not in sys.modules, "redis was imported"
            print("ok")

        asyncio.run(main())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_redis_url_without_redis_says_what_to_install() -> None:
    result = run_without_redis(
        """
        from agui_hub.store import open_store
        try:
            open_store("redis://127.0.0.1:6379/0")
        except ValueError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'agui-hub[redis]'" in result.stdout
    cli = run_without_redis(
        """
        import sys
        from agui_hub.cli import main
        sys.exit(main(["replay", "t", "--url", "redis://127.0.0.1:6379/0"]))
        """
    )
    assert cli.returncode == 1
    assert "pip install 'agui-hub[redis]'" in cli.stderr
    assert "Traceback" not in cli.stderr


@pytest.mark.timeout(180)
def test_the_wheel_carries_the_browser_client_and_the_viewer(tmp_path: Path) -> None:
    """`pip install` alone serves the viewer: the built JS, page and styles are package
    data (and so are the Redis store's Lua scripts)."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=150 * TIMEOUT_SCALE,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("agui_hub-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    static = sorted(p.name for p in (ROOT / "agui_hub" / "static").iterdir() if p.is_file())
    assert {"index.html", "viewer.js", "viewer.css", "agui-hub.js", "agui-hub.d.ts"} <= set(static)
    missing = [name for name in static if f"agui_hub/static/{name}" not in names]
    assert not missing, f"not in the wheel: {missing}"
    # The Redis store reads its Lua scripts from the package at import.
    lua = sorted(p.name for p in (ROOT / "agui_hub" / "store" / "redis" / "lua").glob("*.lua"))
    assert {"append.lua", "check_position.lua", "checkpoint.lua", "read.lua"} <= set(lua)
    missing = [name for name in lua if f"agui_hub/store/redis/lua/{name}" not in names]
    assert not missing, f"not in the wheel: {missing}"
