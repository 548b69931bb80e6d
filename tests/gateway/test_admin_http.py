"""The admin HTTP endpoints: ``/admin/threads`` and ``/admin/threads/<thread>``
(docs/metrics.md), and the admin grant they need.

On in-process gateways over real sockets, on the memory store and on a real
Redis: the list with each thread's counts, size and last activity, bounded
by ``limit``; one thread (its id percent-encoded or not), 404 and 400; a
``DELETE`` that removes the thread and tells its viewers; who may (a token
with the admin grant; nobody without authentication unless
``admin_anonymous``, which only a loopback host may have); refusals as JSON
with a message; and the grant itself as a JWT claim.
"""

from __future__ import annotations

# ruff: noqa: F811 (fixtures imported from test_server, taken as test arguments)
import json
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from websockets.asyncio.client import connect

from agui_hub.errors import Unauthorized
from agui_hub.gateway.auth import Grants, JWTAuthenticator, JWTSettings, encode_token
from agui_hub.gateway.config import GatewayConfig
from agui_hub.gateway.server import Gateway
from agui_hub.store.redis.store import RedisStore

from ..conftest import TIMEOUT_SCALE, RedisServer
from ..processes import CLI, Gateways, child_env, http_status
from ..test_viewer import Answer, http_get

# The gateway harness fixtures of test_server (memory and Redis): imported, so that
# tests here take them as arguments (which linters read as redefinitions).
from .test_server import (  # noqa: F401
    JSON,
    MSGPACK,
    Client,
    Harness,
    harness,
    mem,
    memory_store,
    store_factory,
    text_deltas,
)

pytestmark = pytest.mark.timeout(90)

WAIT = 10 * TIMEOUT_SCALE
SECRET = "admin-test-secret-" + "s" * 32


def token(*, admin: bool, subject: str = "ops") -> str:
    grants: dict[str, Any] = {"subscribe": ["*"], "publish": ["*"]}
    if admin:
        grants["admin"] = True
    return encode_token(SECRET, subject, extra={"agui": grants})


ADMIN = {"Authorization": f"Bearer {token(admin=True)}"}
VIEWER = {"Authorization": f"Bearer {token(admin=False, subject='viewer')}"}


def body(answer: Answer) -> Any:
    assert answer.header("Content-Type") == "application/json", answer.body
    assert answer.header("Cache-Control") == "no-store"
    return json.loads(answer.body)


def run(thread: str, deltas: int) -> list[dict[str, Any]]:
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        *text_deltas("m1", deltas),
    ]


async def jwt_gateway(h: Harness, **config: Any) -> Gateway:
    return await h.gateway(jwt_secret=SECRET, **config)


async def client(h: Harness, gateway: Gateway, protocol: str = JSON) -> Client:
    """A client of *gateway*, with an admin token where it takes tokens."""
    ws = await connect(
        f"ws://127.0.0.1:{gateway.config.port}/",
        subprotocols=[protocol],  # type: ignore[list-item]
        additional_headers=ADMIN if gateway.config.jwt_configured else None,
        proxy=None,
        open_timeout=WAIT,
        close_timeout=2,
    )
    c = Client(ws)
    h.clients.append(c)
    return c


# -- listing and showing threads -------------------------------------------------------------------


async def test_threads_are_listed_with_their_figures(harness: Harness) -> None:
    gateway = await jwt_gateway(harness)
    port = gateway.config.port
    publisher = await client(harness, gateway, MSGPACK)
    sizes = {"tenant-1/a": 3, "tenant-1/b": 6, "tenant-2/c": 1}
    offsets: dict[str, list[str]] = {}
    for thread, deltas in sizes.items():
        offsets[thread] = await publisher.publish(thread, run(thread, deltas))
        time.sleep(0.002)  # a later millisecond: a later last activity
    viewer = await client(harness, gateway, JSON)
    await viewer.subscribe("tenant-1/b")

    listed = body(await http_get(port, "/admin/threads", ADMIN))
    assert listed["limit"] == 100 and listed["truncated"] is False
    # The most recently active first.
    assert [t["thread"] for t in listed["threads"]] == ["tenant-2/c", "tenant-1/b", "tenant-1/a"]
    for record in listed["threads"]:
        thread = record["thread"]
        info = await gateway.store.info(thread)
        assert info is not None
        assert record["events"] == sizes[thread] + 2 == info.length
        assert record["bytes"] == info.bytes > 0
        assert record["epoch"] == info.epoch
        assert record["first"] == offsets[thread][0]
        assert record["last"] == offsets[thread][-1]
        assert record["runId"] == "r1"
        assert record["trimmed"] is None
        ms = int(offsets[thread][-1].split("-")[0])
        assert (
            record["lastActivity"]
            == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"
        )
        assert record["subscribers"] == (1 if thread == "tenant-1/b" else 0)
        assert record["ttl"] is None or record["ttl"] > 0

    # One thread, its id percent-encoded or as it is.
    for path in ("/admin/threads/tenant-1%2Fb", "/admin/threads/tenant-1/b"):
        shown = body(await http_get(port, path, ADMIN))
        same = dict(next(t for t in listed["threads"] if t["thread"] == "tenant-1/b"))
        assert shown.pop("ttl") <= same.pop("ttl")  # counting down
        assert shown == same

    # With ?runs, the index of its runs too.
    shown = body(await http_get(port, "/admin/threads/tenant-1%2Fb?runs=1", ADMIN))
    assert shown["runs"] == [
        {
            "runId": "r1",
            "parentRunId": None,
            "status": "running",  # not finished: its last offset is the thread's newest
            "first": offsets["tenant-1/b"][0],
            "last": offsets["tenant-1/b"][-1],
            "preview": "",
        }
    ]

    limited = body(await http_get(port, "/admin/threads?limit=2", ADMIN))
    assert len(limited["threads"]) == 2 and limited["truncated"] is True
    assert limited["limit"] == 2


async def test_a_thread_name_with_any_character_is_reachable(mem: Harness) -> None:
    gateway = await jwt_gateway(mem)
    publisher = await client(mem, gateway, JSON)
    thread = "été / ? # % +&=;x"
    await publisher.publish(thread, run(thread, 1))
    shown = body(await http_get(gateway.config.port, "/admin/threads/" + quote(thread, ""), ADMIN))
    assert shown["thread"] == thread and shown["events"] == 3
    listed = body(await http_get(gateway.config.port, "/admin/threads", ADMIN))
    assert [t["thread"] for t in listed["threads"]] == [thread]


async def test_missing_and_bad_threads(mem: Harness) -> None:
    gateway = await jwt_gateway(mem)
    port = gateway.config.port
    missing = await http_get(port, "/admin/threads/nothing-here", ADMIN)
    assert missing.status == 404
    assert body(missing) == {
        "error": "not_found",
        "message": "no thread 'nothing-here' in the store",
    }
    for path, message in [
        ("/admin/threads/%20padded", "begins or ends with whitespace"),
        ("/admin/threads/", "1 to 256 characters"),
        ("/admin/threads/" + "x" * 300, "1 to 256 characters"),
        ("/admin/threads/%FF%FE", "not percent-encoded UTF-8"),
        ("/admin/threads/a%0Ab", "control characters"),
        ("/admin/threads/csi%C2%9B2J", "control characters"),  # C1 as C0
    ]:
        answer = await http_get(port, path, ADMIN)
        assert answer.status == 400, path
        refusal = body(answer)
        assert refusal["error"] == "bad_request" and message in refusal["message"], refusal
    for query in (
        "limit=0",
        "limit=1001",
        "limit=abc",
        "limit=",
        "limit=1&limit=2",
        "limit=" + "9" * 5000,  # past int()'s digit limit: still a 400, not a 500
        "limit=%D9%A3",
    ):
        answer = await http_get(port, f"/admin/threads?{query}", ADMIN)
        assert answer.status == 400, query
        assert "limit" in body(answer)["message"]
    unknown = await http_get(port, "/admin/nothing", ADMIN)
    assert unknown.status == 404 and "/admin/threads" in body(unknown)["message"]
    empty = body(await http_get(port, "/admin/threads?limit=1000", ADMIN))
    assert empty == {"threads": [], "limit": 1000, "truncated": False}


async def test_head_is_the_get_without_its_body(mem: Harness) -> None:
    gateway = await jwt_gateway(mem)
    publisher = await client(mem, gateway, JSON)
    await publisher.publish("t", run("t", 1))
    for path in ("/admin/threads", "/admin/threads/t", "/admin/threads/none"):
        get = await http_get(gateway.config.port, path, ADMIN)
        head = await http_get(gateway.config.port, path, ADMIN, method="HEAD")
        assert head.status == get.status and head.body == b""
        assert head.header("Content-Type") == get.header("Content-Type")
        # The length of the body it would have had (the thread's ttl counts down
        # between the two: a digit more or less).
        assert abs(int(head.header("Content-Length") or 0) - len(get.body)) <= 2


# -- deleting --------------------------------------------------------------------------------------


async def test_delete_removes_the_thread_and_tells_its_viewers(harness: Harness) -> None:
    gateway = await jwt_gateway(harness)
    port = gateway.config.port
    publisher = await client(harness, gateway, MSGPACK)
    offsets = await publisher.publish("doomed", run("doomed", 2))
    await publisher.publish("kept", run("kept", 2))
    viewer = await client(harness, gateway, JSON)
    await viewer.subscribe("doomed", "start")
    await viewer.until_offset("doomed", offsets[-1])

    refused = await http_get(port, "/admin/threads/doomed", VIEWER, method="DELETE")
    assert refused.status == 403 and body(refused)["error"] == "forbidden"
    assert await gateway.store.info("doomed") is not None

    deleted = await http_get(port, "/admin/threads/doomed", ADMIN, method="DELETE")
    assert deleted.status == 200
    assert body(deleted) == {"thread": "doomed", "deleted": True}
    assert await gateway.store.info("doomed") is None
    assert await gateway.store.info("kept") is not None
    # Its viewer is told: the thread it follows was reset (nothing to resume from).
    frames = await viewer.collect(lambda f: f["type"] == "snapshot")
    assert any(f["type"] == "subscribed" and f["recovered"] is False for f in frames), frames
    assert (await http_get(port, "/admin/threads/doomed", ADMIN)).status == 404
    again = await http_get(port, "/admin/threads/doomed", ADMIN, method="DELETE")
    assert again.status == 404 and "nothing deleted" in body(again)["message"]
    listed = body(await http_get(port, "/admin/threads", ADMIN))
    assert [t["thread"] for t in listed["threads"]] == ["kept"]


async def test_methods(mem: Harness) -> None:
    gateway = await jwt_gateway(mem)
    port = gateway.config.port
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        answer = await http_get(port, "/admin/threads", ADMIN, method=method)
        assert answer.status == 405, method
        assert answer.header("Allow") == "GET, HEAD"
        assert body(answer)["error"] == "method_not_allowed"
    for method in ("POST", "PUT", "OPTIONS"):
        answer = await http_get(port, "/admin/threads/x", ADMIN, method=method)
        assert answer.status == 405, method
        assert answer.header("Allow") == "GET, HEAD, DELETE"
    # Elsewhere, DELETE is what it was.
    assert (await http_get(port, "/", method="DELETE")).status == 405


# -- who may ---------------------------------------------------------------------------------------


async def test_only_an_admin_token_in_the_header_is_let_in(mem: Harness) -> None:
    gateway = await jwt_gateway(mem)
    port = gateway.config.port
    missing = await http_get(port, "/admin/threads")
    assert missing.status == 401
    assert missing.header("WWW-Authenticate") == 'Bearer realm="agui-hub"'
    assert body(missing)["error"] == "unauthorized"
    assert "Authorization: Bearer" in body(missing)["message"]
    forged = encode_token("another-secret-" + "x" * 32, "ops", extra={"agui": {"admin": True}})
    bad = await http_get(port, "/admin/threads", {"Authorization": f"Bearer {forged}"})
    assert bad.status == 401 and "signature" in body(bad)["message"]
    basic = await http_get(port, "/admin/threads", {"Authorization": "Basic b3BzOm9wcw=="})
    assert basic.status == 401 and "Bearer" in body(basic)["message"]
    viewer = await http_get(port, "/admin/threads/x", VIEWER)
    assert viewer.status == 403
    assert "'viewer' does not grant admin" in body(viewer)["message"]
    query = await http_get(port, f"/admin/threads?access_token={token(admin=True)}")
    assert query.status == 401
    twice = await http_get(
        port, "/admin/threads", {**ADMIN, "authorization": ADMIN["Authorization"]}
    )
    assert twice.status == 400
    assert (await http_get(port, "/admin/threads", ADMIN)).status == 200


async def test_anonymous_admin_is_off_without_authentication(mem: Harness) -> None:
    gateway = await mem.gateway()
    answer = await http_get(gateway.config.port, "/admin/threads")
    assert answer.status == 403
    refusal = body(answer)
    assert refusal["error"] == "forbidden"
    assert "admin_anonymous" in refusal["message"] and "JWT" in refusal["message"]
    # A token changes nothing where nobody authenticates.
    assert (await http_get(gateway.config.port, "/admin/threads", ADMIN)).status == 403


async def test_admin_anonymous_on_loopback(mem: Harness) -> None:
    gateway = await mem.gateway(admin_anonymous=True)
    publisher = await client(mem, gateway, JSON)
    await publisher.publish("t", run("t", 1))
    listed = body(await http_get(gateway.config.port, "/admin/threads"))
    assert [t["thread"] for t in listed["threads"]] == ["t"]


async def test_admin_anonymous_refuses_web_pages_and_other_names(mem: Harness) -> None:
    """DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1
    sends that name as Host; a page of another origin sends its Origin."""
    gateway = await mem.gateway(admin_anonymous=True)
    publisher = await client(mem, gateway, JSON)
    await publisher.publish("victim", run("victim", 1))
    port = gateway.config.port
    for headers in (
        {"Host": f"evil.example:{port}"},
        {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"},
        {"Origin": "http://evil.example"},
    ):
        for method in ("GET", "DELETE"):
            answer = await http_get(port, "/admin/threads/victim", headers, method=method)
            assert answer.status == 403, (headers, method)
            assert body(answer)["error"] == "forbidden"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}"):
        shown = await http_get(port, "/admin/threads/victim", {"Host": host})
        assert shown.status == 200 and body(shown)["thread"] == "victim", host
    # The page the gateway serves itself, from its loopback address, may.
    own = {"Origin": f"http://127.0.0.1:{port}"}
    assert (await http_get(port, "/admin/threads", own)).status == 200


def test_admin_anonymous_is_refused_off_loopback_and_next_to_jwt() -> None:
    with pytest.raises(ValueError, match="only for a loopback host"):
        GatewayConfig(host="0.0.0.0", allow_anonymous=True, admin_anonymous=True)
    with pytest.raises(ValueError, match="admin_anonymous is for gateways without authentication"):
        GatewayConfig(jwt_secret=SECRET, admin_anonymous=True)
    assert GatewayConfig(host="::1", admin_anonymous=True).admin_anonymous


async def test_store_unavailable_is_a_503_with_the_reason(own_redis: RedisServer) -> None:
    h = Harness(lambda retention=None: RedisStore(own_redis.url, prefix="down", op_timeout=1))
    try:
        gateway = await jwt_gateway(h)
        own_redis.stop()
        answer = await http_get(gateway.config.port, "/admin/threads", ADMIN)
        assert answer.status == 503
        assert answer.header("Retry-After") == "5"
        refusal = body(answer)
        assert refusal["error"] == "store_unavailable" and refusal["message"], refusal
    finally:
        await h.close()


# -- the grant -------------------------------------------------------------------------------------


def test_the_admin_grant_is_a_claim() -> None:
    assert Grants.from_claim({"admin": True}).admin is True
    assert Grants.from_claim({"subscribe": ["a"]}).admin is False
    assert bool(Grants.from_claim({"admin": True}))  # grants something
    for value in ("true", 1, None, ["x"]):
        with pytest.raises(ValueError, match="admin grant is true or false"):
            Grants.from_claim({"admin": value})
    assert Grants(("a",), (), admin=True).as_json() == {
        "subscribe": ["a"],
        "publish": [],
        "admin": True,
    }
    # Without the grant, what identities are told of their grants is as it was.
    assert Grants(("a",), ()).as_json() == {"subscribe": ["a"], "publish": []}
    verifier = JWTAuthenticator(JWTSettings(secret=SECRET))
    assert verifier.verify(token(admin=True)).grants.admin is True
    assert verifier.verify(token(admin=False)).grants.admin is False
    with pytest.raises(Unauthorized, match="admin grant is true or false"):
        verifier.verify(encode_token(SECRET, "ops", extra={"agui": {"admin": "yes"}}))


def test_agui_hub_token_admin_mints_the_grant(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    verifier = JWTAuthenticator(JWTSettings(secret=SECRET))
    for flags, admin in ((["--admin"], True), ([], False)):
        done = subprocess.run(
            [*CLI, "token", "prometheus", *flags, "--secret-file", str(secret_file)],
            env=child_env(), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        identity = verifier.verify(done.stdout.strip())
        assert identity.subject == "prometheus"
        assert identity.grants.admin is admin
        assert identity.grants.subscribe == () and identity.grants.publish == ()


async def test_an_admin_token_on_a_websocket_is_told_its_grant(mem: Harness) -> None:
    gateway = await jwt_gateway(mem)
    c = await client(mem, gateway, JSON)
    await c.send({"type": "auth", "id": 1, "token": token(admin=True)})
    reply = await c.recv()
    assert reply["type"] == "authenticated", reply
    assert reply["grants"] == {"subscribe": ["*"], "publish": ["*"], "admin": True}


# -- agui-hub serve --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_serve_admin_anonymous_flag(gateways: Gateways) -> None:
    on = gateways.start(None, "--admin-anonymous")
    assert http_status(on.port, "/admin/threads") == 200
    assert "/admin/threads open (admin_anonymous, loopback)" in on.log()
    off = gateways.start()
    assert http_status(off.port, "/admin/threads") == 403
    jwt = gateways.start(None, "--jwt-secret", SECRET)
    assert http_status(jwt.port, "/admin/threads") == 401
