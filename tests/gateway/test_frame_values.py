"""One frame of many tiny values does not stall the gateway.

A 1 MiB msgpack frame can hold a million empty arrays: its cost is in its
values, not its bytes. Over real WebSocket connections to an in-process
gateway, on the memory store and on Redis: such a frame is refused
(``payload_too_large``) and the fullest frame the value limit allows is
stored and relayed to a JSON viewer, while another client pings the gateway
every 5 ms and times every pong.
"""

# ruff: noqa: F811 (fixtures imported from test_server, taken as test arguments)

from __future__ import annotations

import time
from typing import Any

import pytest

from agui_hub.gateway.commands import OFF_LOOP_FRAME_BYTES
from agui_hub.wire.codec import MAX_VALUES

from .test_server import (  # noqa: F401
    JSON,
    MSGPACK,
    WAIT,
    Harness,
    harness,
    store_factory,
    url,
)
from .test_work_budget import PONG_WITHIN, Pinger

pytestmark = pytest.mark.timeout(120)


def custom(values: int) -> dict[str, Any]:
    return {"type": "CUSTOM", "name": "x", "value": [[] for _ in range(values)]}


async def test_a_frame_of_a_million_values_is_refused_without_a_stall(harness: Harness) -> None:
    gateway = await harness.gateway()
    publisher = await harness.client(gateway, MSGPACK)
    json_publisher = await harness.client(gateway, JSON)
    viewer = await harness.client(gateway, JSON)
    thread = "frame-values"
    assert (await viewer.request({"type": "subscribe", "thread": thread}))["type"] == "subscribed"
    run = {"type": "RUN_STARTED", "threadId": thread, "runId": "r"}
    # As many empty arrays as the frame limit allows in each encoding (one
    # byte each in msgpack, four in the test client's JSON), and the fullest frame accepted.
    most = gateway.config.max_frame_bytes - 300
    fullest = MAX_VALUES - 20  # the publish's own maps take the rest (9)
    reply = await publisher.request({"type": "publish", "thread": thread, "events": [run]})
    assert reply["type"] == "published", reply
    # Encoded beforehand: the test's clients share the gateway's event loop, and
    # building a million lists there would stall it too.
    refused = [
        (client, client.encode({"type": "publish", "thread": thread, "events": [custom(count)]}))
        for client, count in [(publisher, most), (json_publisher, most // 4)]
    ]
    accepted = publisher.encode(
        {"type": "publish", "id": "full", "thread": thread, "events": [custom(fullest)]}
    )
    with Pinger(url(gateway)) as pinger:
        started = time.monotonic()
        rounds = 0
        while rounds < 2 or time.monotonic() - started < 1.0:
            for client, data in refused:
                # A frame refused before it is read has no command id to answer to.
                await client.ws.send(data)
                reply = await client.recv(WAIT * 3)
                assert (reply["type"], reply.get("code")) == ("error", "payload_too_large"), reply
                assert f"more than {MAX_VALUES} JSON values" in reply["message"]
            await publisher.ws.send(accepted)
            reply = await publisher.recv(WAIT * 3)
            assert (reply["type"], reply.get("id")) == ("published", "full"), reply
            rounds += 1
            if rounds >= 10:
                break
    longest = pinger.longest()
    assert longest < PONG_WITHIN, f"a ping waited {longest:.3f} s"
    seen = 0

    def last_custom(frame: dict[str, Any]) -> bool:
        nonlocal seen
        seen += frame.get("type") == "event" and frame["event"]["type"] == "CUSTOM"
        return seen == rounds

    frames = await viewer.collect(last_custom, timeout=WAIT * 3)
    # The viewer got the run and the accepted events whole, nothing of the refused ones.
    events = [f["event"] for f in frames if f.get("type") == "event"]
    assert [e["type"] for e in events] == ["RUN_STARTED"] + ["CUSTOM"] * rounds
    assert all(e["value"] == custom(fullest)["value"] for e in events[1:])


async def test_the_value_limit_is_a_setting(harness: Harness) -> None:
    """``max_frame_values`` lowers (or raises) the limit; its reply names the limit."""
    gateway = await harness.gateway(max_frame_values=1_000)
    client = await harness.client(gateway, JSON)
    thread = "frame-values-setting"
    run = {"type": "RUN_STARTED", "threadId": thread, "runId": "r"}
    reply = await client.request({"type": "publish", "thread": thread, "events": [run]})
    assert reply["type"] == "published", reply
    small = {"type": "publish", "thread": thread, "events": [custom(900)]}
    assert (await client.request(small))["type"] == "published"
    await client.ws.send(
        client.encode({"type": "publish", "thread": thread, "events": [custom(1_500)]})
    )
    reply = await client.recv(WAIT)
    assert (reply["type"], reply.get("code")) == ("error", "payload_too_large"), reply
    assert "more than 1000 JSON values" in reply["message"]
    # The connection goes on.
    assert (await client.request(small))["type"] == "published"


def test_a_client_reads_its_gateway_s_frames_whatever_their_values() -> None:
    """The limit guards the gateway's input; a client decoding a snapshot of a long
    thread (any number of values, bounded by its max_receive_bytes) is not limited."""
    from agui_hub.wire.codec import Encoding, decode, encode

    frame = {"type": "snapshot", "events": [custom(MAX_VALUES * 2)]}
    for encoding in (Encoding.JSON, Encoding.MSGPACK):
        assert decode(encode(frame, encoding), encoding, max_size=None, max_values=None) == frame


async def test_frames_decoded_off_the_loop_keep_their_order(harness: Harness) -> None:
    """Large frames are decoded in a worker thread: the publishes a connection
    sends into a thread are still stored, and answered, in the order sent."""
    gateway = await harness.gateway()
    publisher = await harness.client(gateway, MSGPACK)
    viewer = await harness.client(gateway, JSON)
    thread = "off-loop-order"
    await viewer.subscribe(thread)
    run = {"type": "RUN_STARTED", "threadId": thread, "runId": "r"}
    big = {"type": "CUSTOM", "name": "big", "value": "x" * (OFF_LOOP_FRAME_BYTES * 2)}
    events = [run] + [
        big if n % 2 else {"type": "CUSTOM", "name": "small", "value": n} for n in range(1, 21)
    ]
    frames = [
        publisher.encode({"type": "publish", "id": n, "thread": thread, "events": [e]})
        for n, e in enumerate(events)
    ]
    assert max(len(f) for f in frames) >= OFF_LOOP_FRAME_BYTES > min(len(f) for f in frames)
    for data in frames:  # sent back to back, not waiting for replies
        await publisher.ws.send(data)
    replies = [await publisher.recv(WAIT) for _ in range(len(frames))]
    assert [(r["type"], r.get("id")) for r in replies] == [
        ("published", n) for n in range(len(frames))
    ]
    offsets = [r["offsets"][0] for r in replies]
    got = await viewer.until_offset(thread, offsets[-1])
    assert [(f["offset"], f["event"]) for f in got if f["type"] == "event"] == list(
        zip(offsets, events, strict=True)
    )
