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
import json
import re
import threading
from typing import Any

import msgpack

from ..agui.events import check_json_value, validate_wire
from ..errors import DecodeError, PayloadTooLarge

__all__ = [
    "DEFAULT_MAX_SIZE",
    "Encoding",
    "decode",
    "decode_event",
    "decode_json",
    "decode_msgpack",
    "encode",
    "encode_event",
    "encode_json",
    "encode_msgpack",
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


def _check_size(data: bytes | bytearray | memoryview | str, max_size: int | None) -> None:
    if max_size is not None and len(data) > max_size:
        raise PayloadTooLarge(len(data), max_size)


def _reject_ext(code: int, data: bytes) -> Any:
    raise DecodeError(f"msgpack extension type {code} is not allowed: send plain JSON values")


def decode_msgpack(data: bytes, *, max_size: int | None = DEFAULT_MAX_SIZE) -> Any:
    """Decode one msgpack value made of JSON values only.

    Raises :class:`PayloadTooLarge` or :class:`DecodeError`.
    """
    _check_size(data, max_size)
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,  # checked below, with a clearer message
            ext_hook=_reject_ext,
            timestamp=0,
        )
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
    check_json_value(value, DecodeError)
    return value


def _reject_constant(name: str) -> Any:
    raise DecodeError(f"{name} is not valid JSON")


# One decoder for all calls: json.loads() with any option builds a new one each time.
_JSON_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def decode_json(data: bytes | str, *, max_size: int | None = DEFAULT_MAX_SIZE) -> Any:
    """Decode one JSON value (UTF-8 bytes or text).

    Raises :class:`PayloadTooLarge` or :class:`DecodeError`.
    """
    _check_size(data, max_size)
    try:
        # JSON on the wire is UTF-8 (RFC 8259); json.loads would also guess UTF-16/32.
        text = data.decode() if isinstance(data, bytes | bytearray) else data
        value = _JSON_DECODER.decode(text)
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
    data: bytes | str, encoding: Encoding, *, max_size: int | None = DEFAULT_MAX_SIZE
) -> Any:
    """Decode one value in *encoding*."""
    if encoding is Encoding.MSGPACK:
        if isinstance(data, str):
            raise DecodeError("msgpack payloads are binary; got text")
        return decode_msgpack(data, max_size=max_size)
    return decode_json(data, max_size=max_size)


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
