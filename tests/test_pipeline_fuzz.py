"""Fuzz the whole protocol pipeline: parse, verify, expand, reduce.

Whatever a producer sends, each stage either accepts the event or raises one
of the project's own ProtocolError subclasses; nothing else escapes.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_hub.agui.chunks import ChunkExpander
from agui_hub.agui.events import validate_wire
from agui_hub.agui.reducer import ThreadState, fold
from agui_hub.agui.sequence import SequenceVerifier
from agui_hub.errors import ProtocolError

CORPUS = [
    entry["event"]
    for entry in json.loads((Path(__file__).parent / "corpus" / "events.json").read_text())
]
IDS = st.sampled_from(["a", "b", "c"])
ID_FIELDS = (
    "messageId",
    "toolCallId",
    "stepName",
    "subagentRunId",
    "runId",
    "entityId",
    "parentMessageId",
)
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def events(draw: st.DrawFn) -> Any:
    """Mostly corpus events with ids from a tiny alphabet (so they collide), some junk."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JUNK)
    event = copy.deepcopy(draw(st.sampled_from(CORPUS)))
    for field in ID_FIELDS:
        if field in event and draw(st.booleans()):
            event[field] = draw(IDS)
    if draw(st.integers(0, 5)) == 0:
        event[draw(st.sampled_from(sorted(event)))] = draw(JUNK)
    if event.get("type") == "STATE_DELTA" and draw(st.booleans()):
        event["delta"] = [{"op": "replace", "path": "/" + draw(IDS), "value": 1}]
    return event


FUZZ_EXAMPLES = int(os.environ.get("AGUI_HUB_FUZZ_EXAMPLES", "300"))
"""Raise for a longer fuzzing session, e.g. AGUI_HUB_FUZZ_EXAMPLES=5000."""


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), max_size=40))
def test_pipeline_raises_only_protocol_errors(stream: list[Any]) -> None:
    verifier, expander, state = SequenceVerifier(thread="fuzz"), ChunkExpander(), ThreadState()
    accepted = 0
    for raw in stream:
        try:
            wire = validate_wire(raw)
            verifier.verify(wire)
            for event in expander.expand(wire):
                state.apply(event)
            accepted += 1
        except ProtocolError:
            continue
    try:
        for event in expander.flush():
            state.apply(event)
    except ProtocolError:
        pass
    # Whatever got through can be rendered compactly and rebuilt identically.
    compact = state.compact()
    assert [validate_wire(event) for event in compact] == compact
    assert fold(compact) == state, f"{accepted} events accepted"


def packed(state: ThreadState, share_messages: bool) -> bytes | str:
    """The msgpack of ``state.compact()`` (key order included), or what failed."""
    try:
        return bytes(msgpack.packb(state.compact(share_messages=share_messages)))
    except Exception as exc:  # compared, not judged: both ways must fail alike
        return type(exc).__name__


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), max_size=40))
def test_a_snapshot_that_shares_the_messages_encodes_as_one_that_copies_them(
    stream: list[Any],
) -> None:
    # Folded as a channel folds stored events, unvalidated (a producer may have
    # written to the store directly): checkpoints and snapshot frames encode
    # the state's own messages, and must send what copies of them would.
    state = ThreadState()
    for raw in stream:
        try:
            state.apply(raw)
        except ProtocolError:
            continue
    assert packed(state, share_messages=True) == packed(state, share_messages=False)
