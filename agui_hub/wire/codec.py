"""msgpack and JSON encodings of AG-UI events (and of any JSON value).

Both encodings carry the same data model: JSON values (objects with string
keys, arrays, strings, finite numbers, booleans, null). msgpack input that
holds something JSON cannot express (binary strings, extension types,
non-string map keys, NaN or infinity) is rejected, so that every stored event
can be sent to a JSON subscriber too.

Encoding is deterministic: equal input (same keys in the same order) gives
equal bytes, so the gateway encodes an event once per encoding and sends the
same bytes to every subscriber.

Every decoding failure is a :class:`~agui_hub.errors.DecodeError`, an input
over the size limit a :class:`~agui_hub.errors.PayloadTooLarge`, and an
object that is not an AG-UI event an :class:`~agui_hub.errors.InvalidEvent`.
"""

from __future__ import annotations

import enum
import gc
import json
import re
import threading
from collections.abc import Iterable
from typing import Any

import msgpack

from ..agui.events import MAX_DEPTH, ValuesExhausted, check_json_value, validate_wire
from ..errors import DecodeError, PayloadTooLarge

__all__ = [
    "DEFAULT_MAX_SIZE",
    "MAX_VALUES",
    "Encoding",
    "count_json_values",
    "decode",
    "decode_event",
    "decode_json",
    "decode_msgpack",
    "encode",
    "encode_event",
    "encode_json",
    "encode_msgpack",
    "unpack_stored",
]

KIB = 1024
MIB = 1024 * KIB
DEFAULT_MAX_SIZE = 1 * MIB
"""Default limit for one encoded event or frame."""


class Encoding(enum.StrEnum):
    """The two wire encodings."""

    MSGPACK = "msgpack"
    """msgpack, carried in binary WebSocket frames."""
    JSON = "json"
    """UTF-8 JSON, carried in text WebSocket frames."""


# -- encoding --------------------------------------------------------------------

_local = threading.local()


def _packer() -> Any:
    # A Packer per thread, reused: building one per call costs more than packing
    # a token delta.
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    return packer


def encode_msgpack(value: Any) -> bytes:
    """Encode a JSON value as msgpack.

    Raises :class:`ValueError` for values JSON cannot express (the caller
    passed something other than a validated wire dict).
    """
    try:
        return _packer().pack(value)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"cannot encode as msgpack: {exc}") from exc


def encode_json(value: Any) -> bytes:
    """Encode a JSON value as compact UTF-8 JSON (no NaN, no infinity)."""
    try:
        return json.dumps(
            value, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"cannot encode as JSON: {exc}") from exc


def encode(value: Any, encoding: Encoding) -> bytes:
    """Encode a JSON value in *encoding*."""
    if encoding is Encoding.MSGPACK:
        return encode_msgpack(value)
    return encode_json(value)


def encode_event(event: Any, encoding: Encoding = Encoding.MSGPACK) -> bytes:
    """Validate *event* (wire mapping or model) and encode its canonical wire dict.

    Raises :class:`~agui_hub.errors.InvalidEvent`.
    """
    return encode(validate_wire(event), encoding)


# -- decoding --------------------------------------------------------------------

MAX_VALUES = 100_000
"""Most JSON values one decoded frame may hold (each array item and object
entry counts one). It protects the relay, not the protocol: the cost of
decoding and checking a frame grows with its values, not its bytes, and a
1 MiB msgpack frame can hold a million empty arrays. Real events hold far
fewer (the largest of the test corpus holds 154)."""


def count_json_values(value: Any, limit: int = MAX_VALUES) -> int:
    """The values *value* holds (array items and object entries, nested), counted
    up to *limit*: a result over *limit* means "more than *limit*", and the
    caller refuses the value (:class:`PayloadTooLarge`, unit ``JSON values``).

    One step per array or object, not per value: cheap even at the limit.
    Call it on a decoded frame before anything walks it value by value.
    """
    left = [limit]
    _count(value, left, 0)
    return limit - left[0]


def _count(value: Any, left: list[int], depth: int) -> None:
    kind = type(value)
    if kind is list:
        items: Iterable[Any] = value
    elif kind is dict:
        items = value.values()
    else:
        return
    left[0] -= len(value)
    if left[0] < 0 or depth >= MAX_DEPTH:  # deeper values are refused by check_json_value
        return
    for item in items:
        t = type(item)
        if t is list or t is dict:
            _count(item, left, depth + 1)
            if left[0] < 0:
                return


def _check_size(data: bytes | bytearray | memoryview | str, max_size: int | None) -> None:
    if max_size is not None and len(data) > max_size:
        raise PayloadTooLarge(len(data), max_size)


def _reject_ext(code: int, data: bytes) -> Any:
    raise DecodeError(f"msgpack extension type {code} is not allowed: send plain JSON values")


def _paused_gc(build: Any, *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)`` with the cyclic garbage collector paused.

    A decoder creating a million lists triggers about 1,400 collections, a
    few of them over the whole heap: 90% of the time a 1 MiB msgpack frame of
    empty arrays takes to decode (0.43 s against 0.05 s paused). Paused, the
    new containers are looked at once by the next collection. Decoding runs
    no code of ours that could build cycles in the meantime.
    """
    if not gc.isenabled():
        return build(*args, **kwargs)
    gc.disable()
    try:
        return build(*args, **kwargs)
    finally:
        gc.enable()


def unpack_stored(data: bytes) -> Any:
    """Decode the msgpack of a stored entry (no checks: the writer checked it
    before storing), with the collector paused as for a frame."""
    return _paused_gc(msgpack.unpackb, data, raw=False)


def _unpack_checked(data: bytes, max_values: int | None) -> Any:
    value = msgpack.unpackb(
        data,
        raw=False,
        strict_map_key=False,  # checked by check_json_value, with a clearer message
        ext_hook=_reject_ext,
        timestamp=0,
    )
    # Checked and counted in one walk, before the collector runs again, which
    # stops at the limit: a refused frame is freed here, before any
    # collection looks at it (and not kept alive by a traceback).
    left = None if max_values is None else [max_values]
    exhausted = False
    try:
        check_json_value(value, DecodeError, 0, left)
    except ValuesExhausted:
        exhausted = True
    if exhausted:
        assert max_values is not None
        del value
        raise _too_many_values(max_values)
    return value


def _too_many_values(limit: int) -> PayloadTooLarge:
    exc = PayloadTooLarge(limit + 1, limit, "JSON values")
    exc.args = (
        f"payload of more than {limit} JSON values (array items and object entries, "
        "nested): split it over several publishes",
    )
    return exc


def decode_msgpack(
    data: bytes, *, max_size: int | None = DEFAULT_MAX_SIZE, max_values: int | None = MAX_VALUES
) -> Any:
    """Decode one msgpack value made of JSON values only, holding at most
    *max_values* values (:func:`count_json_values`; ``None``: not counted, for
    a client reading its own gateway's frames). What it returns passed
    :func:`~agui_hub.agui.events.check_json_value`: validate its events with
    ``values_checked=True``.

    Raises :class:`PayloadTooLarge` or :class:`DecodeError`.
    """
    _check_size(data, max_size)
    try:
        value = _paused_gc(_unpack_checked, data, max_values)
    except DecodeError:
        raise
    except msgpack.StackError:
        raise DecodeError("malformed msgpack: value nested too deeply") from None
    except msgpack.FormatError:
        raise DecodeError("malformed msgpack: invalid type byte") from None
    except msgpack.ExtraData:
        raise DecodeError("malformed msgpack: extra bytes after the value") from None
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise DecodeError(f"malformed msgpack: {str(exc) or type(exc).__name__}") from None
    return value


def _reject_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not valid JSON")


# One decoder for all calls: json.loads() with any option builds a new one each time.
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _decode_counted(text: str, max_values: int | None) -> Any:
    value = _JSON_DECODER.decode(text)
    if max_values is None:
        return value
    # Counted past that bound only (each item but the first of its array or
    # object follows a comma), so that common frames are not walked again.
    bound = text.count(",") + text.count("[") + text.count("{")
    if bound > max_values and count_json_values(value, max_values) > max_values:
        del value
        raise _too_many_values(max_values)
    return value


def decode_json(
    data: bytes | str,
    *,
    max_size: int | None = DEFAULT_MAX_SIZE,
    max_values: int | None = MAX_VALUES,
) -> Any:
    """Decode one JSON value (UTF-8 bytes or text) holding at most *max_values*
    values (:func:`count_json_values`).

    Raises :class:`PayloadTooLarge` or :class:`DecodeError`.
    """
    _check_size(data, max_size)
    try:
        # JSON on the wire is UTF-8 (RFC 8259); json.loads would also guess UTF-16/32.
        text = data.decode() if isinstance(data, bytes | bytearray) else data
        value = _paused_gc(_decode_counted, text, max_values)
    except DecodeError:
        raise
    except UnicodeDecodeError as exc:
        raise DecodeError(f"JSON payload is not valid UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise DecodeError(
            f"malformed JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise DecodeError("JSON value nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"malformed JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        # "\ud800" is valid JSON but not text: it could not be encoded again.
        _reject_surrogates(value)
    return value


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _reject_surrogates(value: Any, depth: int = 0) -> None:
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            raise DecodeError(
                "JSON string with a lone surrogate (\\ud800-\\udfff): not valid Unicode text"
            ) from None
    elif isinstance(value, dict) and depth < 300:
        for key, item in value.items():
            _reject_surrogates(key, depth + 1)
            _reject_surrogates(item, depth + 1)
    elif isinstance(value, list) and depth < 300:
        for item in value:
            _reject_surrogates(item, depth + 1)


def decode(
    data: bytes | str,
    encoding: Encoding,
    *,
    max_size: int | None = DEFAULT_MAX_SIZE,
    max_values: int | None = MAX_VALUES,
) -> Any:
    """Decode one value in *encoding* (see :func:`decode_msgpack`, :func:`decode_json`)."""
    if encoding is Encoding.MSGPACK:
        if isinstance(data, str):
            raise DecodeError("msgpack payloads are binary; got text")
        return decode_msgpack(data, max_size=max_size, max_values=max_values)
    return decode_json(data, max_size=max_size, max_values=max_values)


def decode_event(
    data: bytes | str,
    encoding: Encoding = Encoding.MSGPACK,
    *,
    max_size: int | None = DEFAULT_MAX_SIZE,
) -> dict[str, Any]:
    """Decode and validate one event; return its canonical wire dict.

    Raises :class:`PayloadTooLarge`, :class:`DecodeError` or
    :class:`~agui_hub.errors.InvalidEvent`.
    """
    return validate_wire(decode(data, encoding, max_size=max_size))
