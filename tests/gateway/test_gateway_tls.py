"""TLS, secrets in logs, and settings that cannot be served.

- ``serve --tls-cert/--tls-key`` serves ``wss://``: a client that trusts the
  certificate subscribes and publishes; a plain ``ws://`` client gets nothing.
- Tokens never reach the gateway's log, even at DEBUG where websockets logs
  every handshake header and frame.
- Settings out of range are usage errors (exit 2, one line), never tracebacks.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import logging
import re
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from websockets.asyncio.client import connect

from agui_hub.gateway.auth import encode_token
from agui_hub.gateway.server import Gateway, GatewayConfig
from agui_hub.store.memory import MemoryStore

from ..conftest import TIMEOUT_SCALE
from ..processes import CLI, ROOT, child_env

pytestmark = pytest.mark.timeout(60)

WAIT = 10 * TIMEOUT_SCALE
SECRET = "x" * 40


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_serves_wss(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    gateway = Gateway(
        GatewayConfig(port=0, ping_interval=None, tls_cert=str(cert), tls_key=str(key)),
        store=MemoryStore(),
    )
    await gateway.start()
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        async with connect(
            f"wss://127.0.0.1:{gateway.config.port}",
            subprotocols=["agui-hub.v1.json"],  # type: ignore[list-item]
            ssl=trust,
            open_timeout=WAIT,
        ) as ws:
            await ws.send(json.dumps({"type": "ping", "id": 1}))
            assert json.loads(await asyncio.wait_for(ws.recv(), WAIT)) == {
                "type": "pong",
                "id": 1,
            }
        # Plain ws:// to a TLS port: the handshake never completes.
        with pytest.raises(Exception):  # noqa: B017 - any failure to open will do
            async with connect(
                f"ws://127.0.0.1:{gateway.config.port}",
                subprotocols=["agui-hub.v1.json"],  # type: ignore[list-item]
                open_timeout=2,
            ):
                pass
    finally:
        await gateway.drain()


async def test_unusable_tls_files_refuse_to_start(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    gateway = Gateway(
        GatewayConfig(
            port=0, tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "cert.pem")
        ),
        store=MemoryStore(),
    )
    with pytest.raises(ValueError, match="TLS certificate"):
        await gateway.start()


async def test_tokens_never_reach_the_gateway_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = Gateway(
        GatewayConfig(port=0, ping_interval=None, jwt_secret=SECRET), store=MemoryStore()
    )
    await gateway.start()
    tokens = [encode_token(SECRET, f"user-{n}", subscribe=["*"], ttl=60) for n in range(4)]
    refreshed = [encode_token(SECRET, f"user-{n}", subscribe=["*"], ttl=90) for n in range(4)]
    base = f"ws://127.0.0.1:{gateway.config.port}"
    try:
        ways = [
            (base, ["agui-hub.v1.json"], {"Authorization": f"Bearer {tokens[0]}"}),
            (base, ["agui-hub.v1.json", f"agui-hub.bearer.{tokens[1]}"], {}),
            (f"{base}/?access_token={tokens[2]}", ["agui-hub.v1.json"], {}),
            (f"{base}/?x=1&access%5Ftoken={tokens[3]}", ["agui-hub.v1.json"], {}),
        ]
        for (url, protocols, headers), again in zip(ways, refreshed, strict=True):
            async with connect(
                url, subprotocols=protocols, additional_headers=headers, open_timeout=WAIT
            ) as ws:
                # JSON escapes in the names: the frame is logged by size, whatever it says.
                await ws.send(f'{{"type": "\\u0061uth", "id": 1, "t\\u006fken": "{again}"}}')
                reply = json.loads(await asyncio.wait_for(ws.recv(), WAIT))
                assert reply["type"] == "authenticated", reply
    finally:
        await gateway.drain()
    server_lines = [
        r.getMessage() for r in caplog.records if not r.name.startswith("websockets.client")
    ]
    logged = "\n".join(server_lines)
    assert "Authorization: [redacted]" in logged  # the header was logged, redacted
    assert "access_token=[redacted]" in logged
    assert "agui-hub.bearer.[redacted]" in logged
    for token in tokens + refreshed:
        signature = token.rsplit(".", 1)[1]
        assert signature not in logged


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--port", "99999"], {}, "99999 is not a TCP port"),
        (["--port", "-5"], {}, "not a TCP port"),
        (["--port", "abc"], {}, "'abc' is not an integer"),
        (["--log-level", "verbose"], {}, "--log-level 'verbose'"),
        ([], {"AGUI_HUB_PORT": "abc"}, "AGUI_HUB_PORT='abc' is not an integer"),
        (["--max-events-per-second", "0"], {}, "max_events_per_second must be a positive"),
        (["--tls-cert", "x.pem"], {}, "TLS needs both"),
        (["--jwt-secret", "short"], {}, "at least 32 bytes"),
        (["--jwt-cookie", "session"], {}, "need a JWT key"),
        (["--host", "0.0.0.0"], {}, "--allow-anonymous"),
        (["--config", "/nonexistent/agui-hub.toml"], {}, "cannot read config file"),
    ],
)
def test_settings_that_cannot_be_served_are_usage_errors(
    args: list[str], env: dict[str, str], message: str
) -> None:
    # --port 0 where the port is not what is tested: nothing may listen on a fixed port.
    if not any(a.startswith("--port") for a in args) and "AGUI_HUB_PORT" not in env:
        args = [*args, "--port", "0"]
    result = subprocess.run(
        [*CLI, "serve", *args],
        cwd=ROOT,
        env={**child_env(), **env},
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_failed_accepts_are_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """asyncio logs a traceback per failed accept; the gateway's handler, one line
    per interval with a count (the old bug: 40,482 tracebacks in 23 s)."""
    from agui_hub.gateway.admission import AcceptFailures as _AcceptFailures

    passed: list[dict[str, object]] = []
    handler = _AcceptFailures(lambda loop, context: passed.append(context))
    loop = asyncio.new_event_loop()
    try:
        error = OSError(24, "Too many open files")
        with caplog.at_level(logging.ERROR, logger="agui_hub.server"):
            for _ in range(1000):
                handler(loop, {"message": "socket.accept() out of system resource",
                               "exception": error})  # fmt: skip
            handler(loop, {"message": "something else"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "agui_hub.server"]
    assert len(lines) == 1 and "out of file descriptors" in lines[0]
    assert passed == [{"message": "something else"}]  # other errors go on as before


async def test_connections_and_a_summary_are_logged_at_info(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An INFO line per connection opened and closed (close code, duration), and a
    summary line per interval: what an operator reads without turning on DEBUG."""
    import agui_hub.gateway.reporting as reporting

    monkeypatch.setattr(reporting, "SUMMARY_INTERVAL", 0.3)
    caplog.set_level(logging.INFO, logger="agui_hub.server")
    gateway = Gateway(GatewayConfig(port=0, ping_interval=None), store=MemoryStore())
    await gateway.start()
    try:
        async with connect(
            f"ws://127.0.0.1:{gateway.config.port}",
            subprotocols=["agui-hub.v1.json"],  # type: ignore[list-item]
            open_timeout=WAIT,
        ) as ws:
            events = [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}]
            await ws.send(json.dumps({"type": "publish", "thread": "t", "events": events}))
            assert json.loads(await asyncio.wait_for(ws.recv(), WAIT))["type"] == "published"
            await asyncio.sleep(0.5)  # a summary interval passes
        for _ in range(100):
            if any("closed" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.02)
    finally:
        await gateway.drain()
    lines = [r.getMessage() for r in caplog.records if r.name == "agui_hub.server"]
    assert any(
        re.fullmatch(r"connection 1 from 127\.0\.0\.1 opened: anonymous, json", line)
        for line in lines
    ), lines
    assert any(
        re.fullmatch(r"connection 1 from 127\.0\.0\.1 closed: 1000 after \d+\.\d s", line)
        for line in lines
    ), lines
    summaries = [line for line in lines if line.startswith("last 0 s:")]
    assert summaries, lines
    assert "1 connections (1 opened, 0 closed)" in summaries[0]
    assert "1 events published" in " ".join(summaries), summaries
