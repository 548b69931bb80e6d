"""``agui-hub presence THREAD``: who watches a thread, from a real ``agui-hub serve``
process, with real viewers (Python clients subscribed to the thread) and the command
run as ``python -m agui_hub.cli`` in a subprocess.

Covered: the text listing (the count, then one line per viewer: subject, connection
id, when it joined in local time, its client map) and ``--json`` (the reply); a
cut list (``--limit``) says so on stderr; a gateway with presence off fails with
exit 1 and says why; a bad ``--limit`` is a usage error (exit 2).
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime
from typing import NamedTuple

import pytest

from agui_hub.client import HubClient, Subscribed

from ..conftest import TIMEOUT_SCALE
from ..processes import CLI, ROOT, Gateways, child_env

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
"""Longest wait for any one thing."""


class Done(NamedTuple):
    code: int
    out: str
    err: str


async def presence(*args: str) -> Done:
    """``agui-hub presence ARGS`` in a subprocess, to its end."""
    process = await asyncio.create_subprocess_exec(
        *CLI, "presence", *args,
        cwd=ROOT, env=child_env(), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(process.communicate(), WAIT)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Done(process.returncode, out.decode(), err.decode())


async def viewer(url: str, thread: str, client: dict[str, str] | None) -> HubClient:
    """A client subscribed to *thread* (confirmed), announcing *client*."""
    hub = HubClient(url, client=client, open_timeout=WAIT)
    await hub.connect()
    sub = await hub.subscribe(thread).open()
    assert isinstance(await asyncio.wait_for(anext(sub), WAIT), Subscribed)
    return hub


async def test_presence_lists_who_watches_in_text_and_json(gateways: Gateways) -> None:
    gateway = gateways.start(None, "--presence-interval", "0.2")
    thread = "presence-cli"
    first = await viewer(gateway.url, thread, {"name": "web", "device": "my laptop"})
    second = await viewer(gateway.url, thread, None)
    try:
        listed = await first.presence(thread)
        text = await presence(thread, "--url", gateway.url)
        assert text.code == 0, text.err
        head, *lines = text.out.splitlines()
        assert head == f"2 watching {thread}"
        assert len(lines) == 2 and text.err == ""
        for line, watcher in zip(lines, listed.entries, strict=True):
            assert watcher.joined is not None
            local = datetime.fromtimestamp(watcher.joined / 1000).astimezone()
            expected = (
                rf"anonymous  {re.escape(watcher.connection)}  joined {local:%Y-%m-%d %H:%M:%S}"
            )
            assert re.match(expected, line), (expected, line)
        assert lines[0].endswith('  name=web device="my laptop"'), lines[0]
        assert re.search(r"joined \S+ \S+$", lines[1]), lines[1]  # no client map: nothing after

        as_json = await presence(thread, "--json", "--url", gateway.url)
        assert as_json.code == 0, as_json.err
        assert json.loads(as_json.out) == {"thread": thread, **listed.as_json()}
        assert json.loads(as_json.out)["entries"][0]["client"] == {
            "name": "web",
            "device": "my laptop",
        }

        cut = await presence(thread, "--limit", "1", "--url", gateway.url)
        assert cut.code == 0 and len(cut.out.splitlines()) == 2
        assert "the first 1 of 2 are listed (--limit)" in cut.err

        refused = await presence(thread, "--limit", "0", "--url", gateway.url)
        assert refused.code == 2 and "--limit must be from 1 to 1000" in refused.err
    finally:
        await first.close()
        await second.close()


async def test_presence_off_fails_and_says_why(gateways: Gateways) -> None:
    gateway = gateways.start(None, "--presence", "off")
    done = await presence("t", "--url", gateway.url)
    assert done.code == 1 and done.out == ""
    assert done.err.startswith("agui-hub presence: this gateway keeps no presence"), done.err
