"""Tests of agui_hub.wire.codec: msgpack and JSON encodings, size limits, bad bytes."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_hub.errors import DecodeError, InvalidEvent, PayloadTooLarge, ProtocolError
from agui_hub.wire.codec import (
    DEFAULT_MAX_SIZE,
    Encoding,
    decode,
    decode_event,
    decode_json,
    decode_msgpack,
    encode,
    encode_event,
)

EVENT = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "héllo ✓", "x-extra": None}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_event_round_trip(encoding: Encoding) -> None:
    data = encode_event(EVENT, encoding)
    assert decode_event(data, encoding) == EVENT


def test_json_is_compact_utf8() -> None:
    data = encode_event(EVENT, Encoding.JSON)
    assert data == json.dumps(EVENT, ensure_ascii=False, separators=(",", ":")).encode()


@pytest.mark.parametrize("encoding", list(Encoding))
def test_encoding_is_deterministic(encoding: Encoding) -> None:
    first = encode_event(dict(EVENT), encoding)
    assert all(encode_event(dict(EVENT), encoding) == first for _ in range(5))


def test_encode_event_validates() -> None:
    with pytest.raises(InvalidEvent, match="messageId"):
        encode_event({"type": "TEXT_MESSAGE_CONTENT", "delta": "x"})


@pytest.mark.parametrize("encoding", list(Encoding))
def test_size_limit(encoding: Encoding) -> None:
    big = {**EVENT, "delta": "x" * 2000}
    data = encode(big, encoding)
    with pytest.raises(PayloadTooLarge) as info:
        decode_event(data, encoding, max_size=1000)
    assert info.value.size == len(data) and info.value.limit == 1000
    assert "exceeds the limit of 1000 bytes" in str(info.value)
    assert decode_event(data, encoding, max_size=None)["delta"] == "x" * 2000
    assert DEFAULT_MAX_SIZE == 1024 * 1024


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xc1", "invalid type byte"),
        (b"\x92\x01", "incomplete input"),
        (b"\x01\x02", "extra bytes"),
        (b"\x91" * 5000, "nested too deeply"),
        (msgpack.packb({"a": b"bin"}, use_bin_type=True), "binary strings are not allowed"),
        (msgpack.packb({1: "x"}), "not a string"),
        (msgpack.packb({"a": float("nan")}), "NaN"),
        (msgpack.packb({"a": msgpack.ExtType(5, b"x")}), "extension type 5"),
    ],
)
def test_malformed_msgpack(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_msgpack(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{", "malformed JSON"),
        (b'{"a": NaN}', "NaN is not valid JSON"),
        (b'{"a": Infinity}', "Infinity is not valid JSON"),
        (b"\xff\xfe", "not valid UTF-8"),
        (b"[" * 100000, "nested too deeply"),
        (b"", "malformed JSON"),
    ],
)
def test_malformed_json(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_json(data)


def test_msgpack_given_text_is_an_error() -> None:
    with pytest.raises(DecodeError, match="binary"):
        decode("{}", Encoding.MSGPACK)


@pytest.mark.parametrize("encoding", list(Encoding))
def test_decoded_non_event_is_invalid_event(encoding: Encoding) -> None:
    with pytest.raises(InvalidEvent, match="mapping"):
        decode_event(encode([1, 2], encoding), encoding)


def test_encode_rejects_values_json_cannot_express() -> None:
    with pytest.raises(ValueError, match="JSON"):
        encode({"a": float("inf")}, Encoding.JSON)
    with pytest.raises(ValueError, match="msgpack"):
        encode({"a": object()}, Encoding.MSGPACK)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from(list(Encoding)))
def test_json_values_round_trip(value: Any, encoding: Encoding) -> None:
    assert decode(encode(value, encoding), encoding, max_size=None) == value


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(list(Encoding)))
def test_random_bytes_never_raise_anything_else(data: bytes, encoding: Encoding) -> None:
    with contextlib.suppress(ProtocolError):
        decode_event(data, encoding)
