"""Conformance with the official AG-UI client's rules (issue 17).

- Chunk streams are checked before anything is stored, per thread and per
  subagent lane, across publishes: a first chunk without its id, a chunk that
  changes its stream's role or name, is refused with ``chunk_error`` and the
  event's ``index``; nothing of the batch is stored.
- A property test: for generated event sequences, valid and broken, the
  writer refuses exactly those the protocol core's chunk expansion and
  sequence rules refuse (run in order, as the official client runs its chunk
  transform and then its verifier), at the same index.
- Every event of every snapshot validates against the official ``ag_ui.core``
  1.0 models with no field they do not have, at every join point of realistic
  runs (chunk streams mid-way included); the snapshot's RUN_STARTED keeps the
  run's ``input``.
"""

from __future__ import annotations

import copy
from typing import Any

import ag_ui.core as official
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

from agui_hub.agui.chunks import ChunkExpander
from agui_hub.agui.reducer import ThreadState, fold
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.cli.demo import demo_run
from agui_hub.errors import ChunkError, ProtocolError
from agui_hub.gateway.writer import ThreadWriter
from agui_hub.store.memory import MemoryStore

from ..runs import realistic_run
from ..streams import valid_streams

pytestmark = pytest.mark.timeout(120)

Event = dict[str, Any]
OFFICIAL = TypeAdapter(official.Event)


def run(thread: str, *events: Event) -> list[Event]:
    return [
        {"type": "RUN_STARTED", "threadId": thread, "runId": "r1"},
        *events,
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]


async def stored(writer: ThreadWriter, thread: str) -> list[Event]:
    import msgpack

    return [msgpack.unpackb(e.data, raw=False) for e in await writer.store.read(thread)]


# -- 1. chunk rules on publish ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("events", "index", "words"),
    [
        # The two reproductions.
        ([{"type": "TEXT_MESSAGE_CHUNK", "delta": "who am I?"}], 1, "messageId"),
        (
            [
                {
                    "type": "TEXT_MESSAGE_CHUNK",
                    "messageId": "c1",
                    "role": "assistant",
                    "delta": "a",
                },
                {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "role": "user", "delta": "b"},
            ],
            2,
            "role",
        ),
        ([{"type": "TOOL_CALL_CHUNK", "delta": "{}"}], 1, "toolCallId"),
        (
            [
                {"type": "TOOL_CALL_CHUNK", "toolCallId": "t1", "toolCallName": "f", "delta": ""},
                {"type": "TOOL_CALL_CHUNK", "toolCallId": "t1", "toolCallName": "g", "delta": ""},
            ],
            2,
            "toolCallName",
        ),
        ([{"type": "REASONING_MESSAGE_CHUNK", "delta": "hm"}], 1, "messageId"),
    ],
)
async def test_chunks_the_official_client_refuses_are_refused(
    events: list[Event], index: int, words: str
) -> None:
    writer = ThreadWriter(MemoryStore())
    with pytest.raises(ChunkError) as info:
        await writer.publish("A", run("A", *events))
    assert info.value.code == "chunk_error" and info.value.index == index
    assert words in str(info.value)
    assert await stored(writer, "A") == []


async def test_chunk_streams_are_followed_across_publishes_and_a_new_writer() -> None:
    store = MemoryStore()
    first = ThreadWriter(store)
    opening = {"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "role": "assistant", "delta": "a"}
    await first.publish("A", [{"type": "RUN_STARTED", "threadId": "A", "runId": "r1"}, opening])
    # A continuation without its id continues the open stream: fine.
    await first.publish("A", [{"type": "TEXT_MESSAGE_CHUNK", "delta": "b"}])
    # Another writer (another gateway) reads the thread and knows the stream too.
    second = ThreadWriter(store)
    with pytest.raises(ChunkError) as info:
        await second.publish(
            "A", [{"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "role": "user", "delta": "c"}]
        )
    assert info.value.index == 0
    await second.publish("A", [{"type": "TEXT_MESSAGE_CHUNK", "messageId": "c1", "delta": "c"}])
    # A subagent's lane is its own: its first chunk needs its own id.
    with pytest.raises(ChunkError):
        await second.publish(
            "A", [{"type": "TEXT_MESSAGE_CHUNK", "delta": "x", "subagentRunId": "s1"}]
        )
    assert [e.get("delta") for e in await stored(second, "A")][1:] == ["a", "b", "c"]


async def test_a_refused_chunk_through_the_gateway_is_a_chunk_error_frame() -> None:
    import json

    from websockets.asyncio.client import connect

    from agui_hub.gateway.server import Gateway, GatewayConfig

    gateway = Gateway(GatewayConfig(port=0, ping_interval=None), store=MemoryStore())
    await gateway.start()
    try:
        async with connect(
            f"ws://127.0.0.1:{gateway.config.port}",
            subprotocols=["agui-hub.v1.json"],  # type: ignore[list-item]
        ) as ws:
            events = run("A", {"type": "TEXT_MESSAGE_CHUNK", "delta": "who am I?"})
            await ws.send(json.dumps({"type": "publish", "id": 1, "thread": "A", "events": events}))
            reply = json.loads(await ws.recv())
        assert reply["code"] == "chunk_error" and reply["index"] == 1, reply
        assert await gateway.store.last_offset("A") == "0-0"
    finally:
        await gateway.drain()


# -- 2. the writer refuses what the protocol core refuses -----------------------------------------


def reference(events: list[Event]) -> int | None:
    """The index of the first event the official order of checks refuses: the chunk
    transform, then the verifier on what it gives (raw chunks verified as the hub
    stores them)."""
    chunks, verifier = ChunkExpander("t"), SequenceVerifier(thread="t")
    for index, event in enumerate(events):
        try:
            chunks.expand(event)
            verifier.verify(event)
        except ProtocolError:
            return index
    return None


@st.composite
def maybe_broken(draw: st.DrawFn) -> list[Event]:
    events = [dict(e) for e in draw(valid_streams(max_actions=30))]
    for event in events:
        event.pop("threadId", None) if event["type"] not in (
            "RUN_STARTED",
            "RUN_FINISHED",
        ) else event.update(threadId="t")
    # Chunk streams of every kind, whole or broken, somewhere in the run.
    if len(events) > 1 and draw(st.booleans()):
        at = draw(st.integers(1, len(events) - 1))
        events[at:at] = draw(chunk_streams())
    for _ in range(draw(st.integers(1, 3))):
        if not events:
            break
        at = draw(st.integers(0, len(events) - 1))
        how = draw(st.sampled_from(["drop_id", "role", "duplicate", "remove"]))
        event = events[at]
        if how == "drop_id":
            for key in ("messageId", "toolCallId"):
                event.pop(key, None)
        elif how == "role" and "role" in event:
            event["role"] = "user" if event["role"] != "user" else "assistant"
        elif how == "duplicate":
            events.insert(at, copy.deepcopy(event))
        elif how == "remove":
            del events[at]
    return events


@st.composite
def chunk_streams(draw: st.DrawFn) -> list[Event]:
    kind = draw(
        st.sampled_from(["TEXT_MESSAGE_CHUNK", "TOOL_CALL_CHUNK", "REASONING_MESSAGE_CHUNK"])
    )
    key = "toolCallId" if kind == "TOOL_CALL_CHUNK" else "messageId"
    first: Event = {"type": kind, key: draw(st.sampled_from(["k1", "k2"])), "delta": "a"}
    if kind == "TEXT_MESSAGE_CHUNK":
        first["role"] = "assistant"
    if kind == "TOOL_CALL_CHUNK":
        first["toolCallName"] = "f"
    rest = [{"type": kind, "delta": "b"} for _ in range(draw(st.integers(0, 3)))]
    lane = draw(st.sampled_from([None, "s1"]))
    out = [first, *rest]
    if lane is not None:
        for event in out:
            event["subagentRunId"] = lane
    return out


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(events=maybe_broken())
def test_the_writer_refuses_what_the_rules_refuse_at_the_same_index(events: list[Event]) -> None:
    import asyncio

    from agui_hub.agui.events import validate_wire

    try:
        wires = [validate_wire(e) for e in events]
    except ProtocolError:
        return  # not valid events: refused before any rule, not this test's subject
    if not wires:
        return
    expected = reference(copy.deepcopy(wires))

    async def publish() -> int | None:
        writer = ThreadWriter(MemoryStore())
        try:
            await writer.publish("t", copy.deepcopy(wires))
        except (ChunkError, ProtocolError) as exc:
            if exc.code in ("patch_error", "limit_exceeded"):
                return -1  # the state rules: not the sequence or chunk rules
            return exc.index
        return None

    got = asyncio.run(publish())
    if got == -1:
        return
    assert got == expected, (expected, got, wires)


# -- 3. snapshots validate against the official models ------------------------------------------


def extras(model: Any, where: str = "event") -> list[str]:
    """Fields of *model* (and of the models in it) that its official class does not have."""
    found: list[str] = []
    if isinstance(model, BaseModel):
        for key in model.model_extra or {}:
            found.append(f"{where}.{key}")
        for name in type(model).model_fields:
            found += extras(getattr(model, name), f"{where}.{name}")
    elif isinstance(model, list):
        for n, item in enumerate(model):
            found += extras(item, f"{where}[{n}]")
    return found


def chunky_run(thread: str) -> list[Event]:
    return [
        {
            "type": "RUN_STARTED",
            "threadId": thread,
            "runId": "r1",
            "input": {
                "threadId": thread,
                "runId": "r1",
                "state": {},
                "messages": [{"id": "u1", "role": "user", "content": "weather?"}],
                "tools": [{"name": "get_weather", "description": "w", "parameters": {}}],
                "context": [{"description": "city", "value": "Paris"}],
                "forwardedProps": {"locale": "fr"},
            },
        },
        {"type": "REASONING_START", "messageId": "rs1"},
        {"type": "REASONING_MESSAGE_CHUNK", "messageId": "r1", "delta": "think"},
        {"type": "REASONING_MESSAGE_CHUNK", "delta": "ing"},
        {"type": "REASONING_END", "messageId": "rs1"},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m1", "role": "assistant", "delta": "Let"},
        {"type": "TEXT_MESSAGE_CHUNK", "delta": " me"},
        {
            "type": "TOOL_CALL_CHUNK",
            "toolCallId": "t1",
            "toolCallName": "get_weather",
            "parentMessageId": "m1",
            "delta": '{"city":',
        },
        {"type": "TOOL_CALL_CHUNK", "delta": '"Paris"}'},
        {"type": "TOOL_CALL_RESULT", "messageId": "t1r", "toolCallId": "t1", "content": "sun"},
        {"type": "RUN_FINISHED", "threadId": thread, "runId": "r1"},
    ]


@pytest.mark.parametrize(
    "events",
    [
        chunky_run("c"),
        realistic_run("r", "r1", turns=2, deltas=3, args=2),
        [event for _, event in demo_run("d", "r1")],
    ],
    ids=["chunks", "realistic", "demo"],
)
def test_every_snapshot_event_is_an_official_event_with_nothing_extra(
    events: list[Event],
) -> None:
    for cut in range(len(events) + 1):
        state = ThreadState()
        for event in events[:cut]:
            state.apply(event)
        snapshot = state.compact()
        for event in snapshot:
            model = OFFICIAL.validate_python(event)
            assert extras(model) == [], (cut, event)
        assert fold(snapshot).messages == state.messages


def test_the_snapshot_keeps_the_latest_runs_input() -> None:
    events = chunky_run("c")
    state = ThreadState()
    for event in events[:3]:
        state.apply(event)
    started = state.compact()[0]
    assert started["type"] == "RUN_STARTED"
    # All of it, but the messages, which the MESSAGES_SNAPSHOT holds in thread order.
    assert started["input"] == {**events[0]["input"], "messages": []}
    assert state.compact()[1]["messages"][0]["content"] == "weather?"
    # A later run's snapshot carries its own input; the earlier one's is dropped.
    for event in events[3:]:
        state.apply(event)
    second = {"type": "RUN_STARTED", "threadId": "c", "runId": "r2", "input": {"threadId": "c",
              "runId": "r2", "state": {}, "messages": [], "tools": [], "context": [],
              "forwardedProps": {"n": 2}}}  # fmt: skip
    state.apply(second)
    runs = [e for e in state.compact() if e["type"] == "RUN_STARTED"]
    assert "input" not in runs[0] and runs[1]["input"] == second["input"]
