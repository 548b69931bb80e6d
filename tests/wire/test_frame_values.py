"""The codec's limit on the JSON values of one frame (counted, not walked)."""

from __future__ import annotations

import gc
import json
from typing import Any

import msgpack
import pytest

from agui_hub.agui.events import MAX_DEPTH
from agui_hub.errors import PayloadTooLarge
from agui_hub.wire.codec import MAX_VALUES, Encoding, count_json_values, decode, unpack_stored

pytestmark = pytest.mark.timeout(60)


def nested(width: int, depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value] * width
    return value


@pytest.mark.parametrize(
    ("value", "count"),
    [
        (1, 0),
        ([], 0),
        ({}, 0),
        ([1, "a", None], 3),
        ({"a": [1, 2], "b": {"c": {}}}, 5),
        (nested(3, 4), 3 + 9 + 27 + 81),
    ],
)
def test_every_item_and_entry_counts(value: Any, count: int) -> None:
    assert count_json_values(value, 10_000) == count


def test_counting_stops_past_the_limit() -> None:
    assert count_json_values(nested(10, 5), 50) == 51 + 9  # the first level and one more
    assert count_json_values(list(range(100)), 99) == 100
    assert count_json_values(list(range(100)), 100) == 100


@pytest.mark.parametrize("encoding", [Encoding.MSGPACK, Encoding.JSON])
def test_a_frame_at_the_limit_is_decoded_and_one_past_it_refused(encoding: Encoding) -> None:
    def data(value: Any) -> Any:
        return msgpack.packb(value) if encoding is Encoding.MSGPACK else json.dumps(value)

    at = {"events": [{"v": [[0, {}]] * ((MAX_VALUES - 2) // 3)}]}
    assert count_json_values(at, MAX_VALUES + 10) <= MAX_VALUES
    assert decode(data(at), encoding, max_size=None) == at
    past: dict[str, Any] = {"events": [{"v": [[]] * MAX_VALUES}]}
    with pytest.raises(PayloadTooLarge, match=f"more than {MAX_VALUES} JSON values"):
        decode(data(past), encoding, max_size=None)
    # Values inside strings do not count (the JSON bound is only a bound).
    text = {"s": "[{," * MAX_VALUES}
    assert decode(data(text), encoding, max_size=None) == text
    # A lower limit is honoured, and the collector is running again afterwards.
    with pytest.raises(PayloadTooLarge):
        decode(data([1, 2, 3]), encoding, max_values=2)
    assert gc.isenabled()


def test_the_collector_stays_off_when_it_was_off() -> None:
    gc.disable()
    try:
        assert decode(msgpack.packb([[]] * 10), Encoding.MSGPACK) == [[]] * 10
        assert unpack_stored(msgpack.packb({"a": [1]})) == {"a": [1]}
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_values_deeper_than_the_depth_limit_are_left_to_the_check() -> None:
    deep = nested(1, MAX_DEPTH + 5)
    assert count_json_values(deep, MAX_VALUES) == MAX_DEPTH + 1
