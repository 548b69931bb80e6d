"""Unit tests of agui_hub.wire.protocol (docs/protocol.md), sans I/O: bytes in, frames out."""

from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agui_hub.errors import InvalidEvent
from agui_hub.wire.codec import DEFAULT_MAX_SIZE, Encoding, encode_msgpack
from agui_hub.wire.offsets import check_thread
from agui_hub.wire.protocol import (
    MAX_EVENTS_PER_PUBLISH,
    SUBPROTOCOL_JSON,
    SUBPROTOCOL_MSGPACK,
    SUBPROTOCOLS,
    CloseCode,
    CommandError,
    Ping,
    Position,
    Presence,
    Publish,
    StartKind,
    Subscribe,
    Unsubscribe,
    encode_frame,
    encoding_of,
    error_frame,
    event_frame,
    parse_command,
    pong_frame,
    presence_frame,
    published_frame,
    snapshot_frame,
    subscribed_frame,
    unsubscribed_frame,
)

ENCODINGS = [Encoding.JSON, Encoding.MSGPACK]
OFFSET = "1764700000123-0"
EPOCH = "9f2c0a1b3d4e5f60"


def wire(frame: Any, encoding: Encoding) -> bytes | str:
    """Encode a client frame the way a client of *encoding* sends it."""
    if encoding is Encoding.MSGPACK:
        return msgpack.packb(frame, use_bin_type=True)  # type: ignore[no-any-return]
    return json.dumps(frame)


def parse(frame: Any, encoding: Encoding = Encoding.JSON, **kwargs: Any) -> Any:
    return parse_command(wire(frame, encoding), encoding, **kwargs)


def rejected(
    data: bytes | str, encoding: Encoding, code: str, *, max_size: int | None = DEFAULT_MAX_SIZE
) -> CommandError:
    with pytest.raises(CommandError) as info:
        parse_command(data, encoding, max_size=max_size)
    assert info.value.code == code, str(info.value)
    assert str(info.value)  # a message a person can act on
    return info.value


def rejected_frame(frame: Any, encoding: Encoding, code: str) -> CommandError:
    return rejected(wire(frame, encoding), encoding, code)


# -- subprotocols and close codes ----------------------------------------------------------


def test_subprotocols() -> None:
    assert set(SUBPROTOCOLS) == {"agui-hub.v1.json", "agui-hub.v1.msgpack"}
    assert encoding_of(SUBPROTOCOL_JSON) is Encoding.JSON
    assert encoding_of(SUBPROTOCOL_MSGPACK) is Encoding.MSGPACK
    for other in (None, "", "agui-hub.v2.json", "json", "AGUI-HUB.V1.JSON"):
        with pytest.raises(ValueError):
            encoding_of(other)


@pytest.mark.parametrize(
    ("code", "value", "resumable"),
    [
        (CloseCode.NORMAL, 1000, False),
        (CloseCode.GOING_AWAY, 1001, True),
        (CloseCode.MESSAGE_TOO_BIG, 1009, True),
        (CloseCode.INTERNAL_ERROR, 1011, True),
        (CloseCode.SERVICE_RESTART, 1012, True),
        (CloseCode.TRY_AGAIN_LATER, 1013, True),
        (CloseCode.SLOW_CONSUMER, 4000, True),
        (CloseCode.IDLE_TIMEOUT, 4001, True),
        (CloseCode.UNAUTHORIZED, 4401, False),
        (CloseCode.FORBIDDEN, 4403, False),
    ],
)
def test_close_codes_and_resumable(code: CloseCode, value: int, resumable: bool) -> None:
    # The table in docs/protocol.md: only "stop" and "do not retry" are not resumable.
    assert int(code) == value
    assert CloseCode(value) is code
    assert code.resumable is resumable


def test_every_close_code_is_in_the_table() -> None:
    assert {int(c) for c in CloseCode} == {
        1000,
        1001,
        1009,
        1011,
        1012,
        1013,
        4000,
        4001,
        4401,
        4403,
    }


# -- parse_command: the commands ---------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(
    ("from_", "start"),
    [
        (None, StartKind.LIVE),
        ("live", StartKind.LIVE),
        ("start", StartKind.START),
        ("snapshot", StartKind.SNAPSHOT),
        ({"offset": OFFSET, "epoch": EPOCH}, Position(OFFSET, EPOCH)),
        ({"offset": "0-0", "epoch": EPOCH}, Position("0-0", EPOCH)),
        ({"offset": OFFSET}, Position(OFFSET, None)),
        ({"offset": OFFSET, "epoch": None}, Position(OFFSET, None)),
        ({"offset": "18446744073709551615-18446744073709551615"}, Position(
            "18446744073709551615-18446744073709551615", None
        )),
    ],
)  # fmt: skip
def test_subscribe_every_from_form(encoding: Encoding, from_: Any, start: Any) -> None:
    frame: dict[str, Any] = {"type": "subscribe", "id": 1, "thread": "t1"}
    if from_ is not None:
        frame["from"] = from_
    assert parse(frame, encoding) == Subscribe(1, "t1", start, None)


def test_subscribe_without_from_and_with_explicit_null_is_live() -> None:
    assert parse({"type": "subscribe", "thread": "t"}).start is StartKind.LIVE
    assert parse({"type": "subscribe", "thread": "t", "from": None}).start is StartKind.LIVE


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_subscribe_with_run(encoding: Encoding) -> None:
    frame = {"type": "subscribe", "id": "s", "thread": "t1", "from": "start", "run": "run-7"}
    assert parse(frame, encoding) == Subscribe("s", "t1", StartKind.START, "run-7")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_subscribe_with_presence_and_client(encoding: Encoding) -> None:
    client = {"name": "console", "device": "laptop", "tabs": 3, "beta": True, "note": None}
    frame = {"type": "subscribe", "id": 1, "thread": "t", "presence": True, "client": client}
    assert parse(frame, encoding) == Subscribe(1, "t", StartKind.LIVE, presence=True, client=client)
    auth = parse({"type": "auth", "token": "x", "client": {"name": "n"}}, encoding)
    assert auth.client == {"name": "n"}


@pytest.mark.parametrize(
    "client",
    [
        {"name": "x" * 250},  # past 256 bytes of JSON
        {"name": "é" * 130},  # 260 bytes of UTF-8, fewer characters
        {"nested": {}},
        {"list": []},
        {"big": 2**64},  # msgpack, and so the store, cannot carry it
        {"small": -(2**63) - 1},
        {"": 1},
        {"k" * 33: 1},
        "text",
        [],
        7,
    ],
)
def test_client_is_a_small_flat_map(client: Any) -> None:
    for kind in ("subscribe", "auth"):
        frame = {"type": kind, "id": 4, "thread": "t", "token": "x", "client": client}
        assert rejected_frame(frame, Encoding.JSON, "bad_command").command_id == 4
    with pytest.raises(CommandError, match="NaN"):  # refused as the frame is decoded
        parse({"type": "subscribe", "thread": "t", "client": {"n": float("nan")}},
              Encoding.MSGPACK)  # fmt: skip


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_presence(encoding: Encoding) -> None:
    assert parse({"type": "presence", "id": 2, "thread": "t"}, encoding) == Presence(2, "t", 100)
    assert parse({"type": "presence", "thread": "t", "limit": 1000}, encoding).limit == 1000
    for limit in (0, 1001, "5", True, 1.5, None):
        frame = {"type": "presence", "id": 3, "thread": "t", "limit": limit}
        assert "limit" in str(rejected_frame(frame, encoding, "bad_command"))
    frame = {"type": "subscribe", "thread": "t", "presence": 1}
    assert "presence" in str(rejected_frame(frame, encoding, "bad_command"))


def test_presence_frames() -> None:
    entries = [{"connection": "g-1", "subject": "alice", "joined": 1}]
    assert presence_frame(5, "t", 3, entries) == {
        "type": "presence", "id": 5, "thread": "t", "count": 3, "more": True, "entries": entries,
    }  # fmt: skip
    hidden = presence_frame(None, "t", 3, [], hidden=True)
    assert hidden == {"type": "presence", "thread": "t", "count": 3, "more": False,
                      "entries": [], "hidden": True}  # fmt: skip


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_unsubscribe(encoding: Encoding) -> None:
    assert parse({"type": "unsubscribe", "id": 6, "thread": "t1"}, encoding) == Unsubscribe(6, "t1")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_publish(encoding: Encoding) -> None:
    events = [
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hi ✓"},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
    ]
    frame = {
        "type": "publish",
        "id": 7,
        "thread": "t1",
        "events": events,
        "eventIds": ["agent-42-0001", "agent-42-0002"],
    }
    assert parse(frame, encoding) == Publish(7, "t1", events, ["agent-42-0001", "agent-42-0002"])
    # eventIds are optional.
    del frame["eventIds"]
    assert parse(frame, encoding) == Publish(7, "t1", events, None)
    # A msgpack frame's values were checked as it was decoded; a JSON frame's were not.
    assert parse(frame, encoding).values_checked == (encoding is Encoding.MSGPACK)


def test_publish_does_not_validate_events_itself() -> None:
    # Event validation is the hub's job (invalid_event); the parser passes them on.
    command = parse({"type": "publish", "thread": "t", "events": [{"type": "NOPE"}, 5]})
    assert isinstance(command, Publish)
    assert command.events == [{"type": "NOPE"}, 5]


def test_publish_at_most_the_limit_of_events() -> None:
    events = [{"type": "CUSTOM", "name": "n", "value": i} for i in range(MAX_EVENTS_PER_PUBLISH)]
    command = parse({"type": "publish", "thread": "t", "events": events})
    assert isinstance(command, Publish)
    assert len(command.events) == MAX_EVENTS_PER_PUBLISH


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ping(encoding: Encoding) -> None:
    assert parse({"type": "ping", "id": 8}, encoding) == Ping(8)
    assert parse({"type": "ping"}, encoding) == Ping(None)
    assert parse({"type": "ping", "id": None}, encoding) == Ping(None)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("command_id", ["x", "", 0, -5, 2**63 - 1, "é" * 128, "a" * 128])
def test_valid_ids_are_kept(encoding: Encoding, command_id: Any) -> None:
    assert parse({"type": "ping", "id": command_id}, encoding) == Ping(command_id)


def test_unknown_fields_are_ignored() -> None:
    frame = {"type": "subscribe", "id": 1, "thread": "t", "from": "live", "extra": [1, {}]}
    assert parse(frame) == Subscribe(1, "t", StartKind.LIVE, None)


def test_thread_names() -> None:
    assert parse({"type": "unsubscribe", "thread": "x" * 256}).thread == "x" * 256
    assert parse({"type": "unsubscribe", "thread": "thread ✓ 𝄞"}).thread == "thread ✓ 𝄞"
    # Whitespace inside a name is part of it; only around it is refused.
    assert parse({"type": "unsubscribe", "thread": "a  b"}).thread == "a  b"


@pytest.mark.parametrize(
    ("thread", "says"),
    [
        ("demo ", "thread name 'demo ' begins or ends with whitespace: remove it (did you "
                  "mean 'demo'?)"),
        (" demo", "begins or ends with whitespace"),
        ("\u2003x", "begins or ends with whitespace"),
        (" ", "thread name ' ' is only whitespace: give a name"),
        ("   ", "is only whitespace"),
        ("", "a thread name is a string of 1 to 256 characters"),
        ("a\tb", "contains control characters"),
        (" \t", "contains control characters"),
    ],
)  # fmt: skip
def test_check_thread_refuses_names_that_cannot_be_told_apart(thread: str, says: str) -> None:
    with pytest.raises(InvalidEvent) as caught:
        check_thread(thread)
    assert says in str(caught.value)


def test_check_thread_keeps_a_good_name() -> None:
    for thread in ("demo", "a b", "tenant-42/run 7", "é" * 256, "x"):
        assert check_thread(thread) == thread


# -- parse_command: errors ------------------------------------------------------------------


def test_bad_frame_wrong_frame_kind() -> None:
    ping = {"type": "ping", "id": 1}
    # A JSON connection gets binary frames, a msgpack connection text frames.
    error = rejected(json.dumps(ping).encode(), Encoding.JSON, "bad_frame")
    assert error.command_id is None
    error = rejected(json.dumps(ping), Encoding.MSGPACK, "bad_frame")
    assert error.command_id is None
    rejected(msgpack.packb(ping), Encoding.JSON, "bad_frame")


@pytest.mark.parametrize(
    "data", ["", "nope", "{", '{"type": "ping",}', "{'type': 'ping'}", "NaN", '{"a": NaN}', "[1"]
)
def test_bad_frame_malformed_json(data: str) -> None:
    assert rejected(data, Encoding.JSON, "bad_frame").command_id is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never used
        b"\x81\xa4type",  # truncated map
        msgpack.packb({"type": "ping"}) + b"\x00",  # extra bytes
        msgpack.packb({"type": "ping", "id": b"binary"}, use_bin_type=True),
        msgpack.packb({1: "ping"}),  # non-string key
        msgpack.packb({"type": "ping", "x": float("nan")}),
        msgpack.packb({"type": "ping", "x": msgpack.ExtType(5, b"x")}),
        b"\x91" * 5000 + b"\xc0",  # nested too deeply
    ],
)
def test_bad_frame_malformed_msgpack(data: bytes) -> None:
    assert rejected(data, Encoding.MSGPACK, "bad_frame").command_id is None


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("value", [[], [{"type": "ping"}], "ping", 5, None, True, 1.5])
def test_bad_frame_not_a_map(encoding: Encoding, value: Any) -> None:
    error = rejected_frame(value, encoding, "bad_frame")
    assert error.command_id is None
    assert "map" in str(error)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("kind", ["subcribe", "SUBSCRIBE", "Ping", "pong", "", "event", 5, ["x"]])
def test_unknown_command_echoes_the_id(encoding: Encoding, kind: Any) -> None:
    error = rejected_frame({"type": kind, "id": 42}, encoding, "unknown_command")
    assert error.command_id == 42
    error = rejected_frame({"type": kind, "id": "abc"}, encoding, "unknown_command")
    assert error.command_id == "abc"


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_missing_type_is_bad_command(encoding: Encoding) -> None:
    error = rejected_frame({"id": 3, "thread": "t"}, encoding, "bad_command")
    assert error.command_id == 3
    assert "type" in str(error)
    assert rejected_frame({"type": None, "id": 4}, encoding, "bad_command").command_id == 4


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(
    "command_id", [1.5, True, False, [1], {"a": 1}, "x" * 129, 10**130], ids=repr
)
def test_bad_id_is_bad_command_without_an_id(encoding: Encoding, command_id: Any) -> None:
    if encoding is Encoding.MSGPACK and isinstance(command_id, int) and command_id > 2**64:
        pytest.skip("msgpack has no integers that large")
    error = rejected_frame({"type": "ping", "id": command_id}, encoding, "bad_command")
    assert error.command_id is None  # an id that cannot be echoed is not echoed
    assert "id" in str(error)


BAD_COMMANDS: list[tuple[dict[str, Any], str]] = [
    # thread: missing, not a string, empty, too long, control characters
    ({"type": "subscribe"}, "thread"),
    ({"type": "subscribe", "thread": None}, "thread"),
    ({"type": "subscribe", "thread": 5}, "thread"),
    ({"type": "subscribe", "thread": ["t"]}, "thread"),
    ({"type": "subscribe", "thread": ""}, "thread"),
    ({"type": "subscribe", "thread": "x" * 257}, "thread"),
    ({"type": "subscribe", "thread": "a\nb"}, "thread"),
    ({"type": "subscribe", "thread": "a\x7fb"}, "thread"),
    # C1 controls, refused like C0 and DEL: U+009B is a terminal's CSI, U+0085 NEL
    ({"type": "subscribe", "thread": "csi\x9b2J"}, "control characters"),
    ({"type": "publish", "thread": "nel\x85x", "events": [{"type": "CUSTOM"}]}, "control"),
    ({"type": "unsubscribe", "thread": "a\x80b"}, "control characters"),
    # whitespace around the name, or nothing but whitespace
    ({"type": "subscribe", "thread": "demo "}, "begins or ends with whitespace"),
    ({"type": "subscribe", "thread": " demo"}, "begins or ends with whitespace"),
    ({"type": "subscribe", "thread": "demo\u3000"}, "begins or ends with whitespace"),
    ({"type": "subscribe", "thread": " "}, "only whitespace"),
    ({"type": "publish", "thread": "\u00a0", "events": [{"type": "CUSTOM"}]}, "only whitespace"),
    ({"type": "unsubscribe", "thread": "t "}, "whitespace"),
    ({"type": "unsubscribe"}, "thread"),
    ({"type": "unsubscribe", "thread": 1}, "thread"),
    ({"type": "publish", "events": [{"type": "CUSTOM"}]}, "thread"),
    ({"type": "publish", "thread": "", "events": [{"type": "CUSTOM"}]}, "thread"),
    # from: not one of the forms
    ({"type": "subscribe", "thread": "t", "from": "later"}, "from"),
    ({"type": "subscribe", "thread": "t", "from": "LIVE"}, "from"),
    ({"type": "subscribe", "thread": "t", "from": 5}, "from"),
    ({"type": "subscribe", "thread": "t", "from": ["start"]}, "from"),
    ({"type": "subscribe", "thread": "t", "from": {}}, "from"),
    ({"type": "subscribe", "thread": "t", "from": {"epoch": EPOCH}}, "from"),
    ({"type": "subscribe", "thread": "t", "from": {"offset": OFFSET, "epoch": 5}}, "epoch"),
    ({"type": "subscribe", "thread": "t", "from": {"offset": OFFSET, "epoch": [EPOCH]}}, "epoch"),
    # run: not a string
    ({"type": "subscribe", "thread": "t", "run": 7}, "run"),
    ({"type": "subscribe", "thread": "t", "run": ["r"]}, "run"),
    # events: missing, empty, not a list, too many
    ({"type": "publish", "thread": "t"}, "events"),
    ({"type": "publish", "thread": "t", "events": []}, "events"),
    ({"type": "publish", "thread": "t", "events": {"type": "CUSTOM"}}, "events"),
    ({"type": "publish", "thread": "t", "events": "CUSTOM"}, "events"),
    ({"type": "publish", "thread": "t", "events": None}, "events"),
    (
        {"type": "publish", "thread": "t", "events": [{}] * (MAX_EVENTS_PER_PUBLISH + 1)},
        str(MAX_EVENTS_PER_PUBLISH),
    ),
    # eventIds: not a list, wrong length, empty / too long / non-string ids
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": "e1"}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": []}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": ["a", "b"]}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}, {}], "eventIds": ["a"]}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": [""]}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": [1]}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}, {}], "eventIds": ["a", "a"]}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": [None]}, "eventIds"),
    ({"type": "publish", "thread": "t", "events": [{}], "eventIds": ["x" * 257]}, "eventIds"),
]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(("frame", "says"), BAD_COMMANDS)
def test_bad_command_echoes_the_id_and_names_the_field(
    encoding: Encoding, frame: dict[str, Any], says: str
) -> None:
    error = rejected_frame({**frame, "id": "cmd-9"}, encoding, "bad_command")
    assert error.command_id == "cmd-9"
    assert says in str(error)
    # Without an id, the error has none either.
    assert rejected_frame(frame, encoding, "bad_command").command_id is None


def test_event_ids_at_the_length_limits_are_accepted() -> None:
    frame = {"type": "publish", "thread": "t", "events": [{}, {}], "eventIds": ["x" * 256, "y"]}
    assert parse(frame).event_ids == ["x" * 256, "y"]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize(
    "offset",
    [5, None, ["1-0"], "", "zz", "1", "1-", "-1", "1-0-0", " 1-0", "a-b", "1.5-0", "1-0 ", "\n1-0"],
)
def test_invalid_offset_echoes_the_id(encoding: Encoding, offset: Any) -> None:
    frame = {"type": "subscribe", "id": 4, "thread": "t1", "from": {"offset": offset}}
    error = rejected_frame(frame, encoding, "invalid_offset")
    assert error.command_id == 4


@pytest.mark.parametrize("offset", ["1-0\n", "99999999999999999999-0", "1-18446744073709551616"])
def test_offsets_that_are_not_stream_ids_are_invalid(offset: str) -> None:
    frame = {"type": "subscribe", "id": 4, "thread": "t1", "from": {"offset": offset}}
    assert rejected_frame(frame, Encoding.JSON, "invalid_offset").command_id == 4


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_payload_too_large(encoding: Encoding) -> None:
    frame = {"type": "ping", "id": 1, "pad": "x" * 200}
    data = wire(frame, encoding)
    error = rejected(data, encoding, "payload_too_large", max_size=100)
    assert error.command_id is None  # not parsed, so no id to echo
    assert str(len(data)) in str(error) and "100" in str(error)
    # At the limit exactly it is fine, and no limit means no limit.
    assert parse_command(data, encoding, max_size=len(data)) == Ping(1)
    assert parse_command(data, encoding, max_size=None) == Ping(1)


def test_payload_too_large_is_checked_before_decoding() -> None:
    rejected("x" * 101, Encoding.JSON, "payload_too_large", max_size=100)
    rejected(b"\xc1" * 101, Encoding.MSGPACK, "payload_too_large", max_size=100)


def test_default_size_limit() -> None:
    frame = {"type": "ping", "pad": "x" * DEFAULT_MAX_SIZE}
    rejected(wire(frame, Encoding.JSON), Encoding.JSON, "payload_too_large")
    rejected(wire(frame, Encoding.MSGPACK), Encoding.MSGPACK, "payload_too_large")


def test_command_error_is_a_protocol_error() -> None:
    from agui_hub.errors import AguiHubError, ProtocolError

    error = CommandError("bad_command", "msg", 5)
    assert isinstance(error, ProtocolError) and isinstance(error, AguiHubError)
    assert (error.code, error.command_id, str(error)) == ("bad_command", 5, "msg")


@pytest.mark.parametrize(
    "data",
    [
        '{"type": "ping", "id": "\\ud800"}',
        '{"type": "unsubscribe", "id": 1, "thread": "t\\udfff"}',
    ],
)
def test_whatever_is_accepted_can_be_echoed(data: str) -> None:
    # Everything parse_command accepts is echoed in a reply frame (id, thread);
    # a command whose reply cannot be encoded must be rejected as a CommandError.
    try:
        command = parse_command(data, Encoding.JSON)
    except CommandError:
        return
    if isinstance(command, Ping):
        frame = pong_frame(command.id)
    else:
        assert isinstance(command, Unsubscribe)
        frame = unsubscribed_frame(command.id, command.thread)
    encode_frame(frame, Encoding.JSON)
    encode_frame(frame, Encoding.MSGPACK)


# -- fuzz: parse_command raises CommandError and nothing else -------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=12,
)

command_like = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["subscribe", "unsubscribe", "publish", "ping"]) | json_values,
        "id": st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=140), json_values),
        "thread": st.one_of(st.text(max_size=300), json_values),
        "from": st.one_of(
            st.sampled_from(["live", "start", "snapshot"]),
            st.fixed_dictionaries(
                {},
                optional={
                    "offset": st.one_of(st.from_regex(r"\A[0-9]{1,22}-[0-9]{1,22}\Z"), json_values),
                    "epoch": st.one_of(st.text(max_size=20), json_values),
                },
            ),
            json_values,
        ),
        "run": json_values,
        "events": st.one_of(st.lists(json_values, max_size=3), json_values),
        "event": json_values,
        "eventIds": st.one_of(st.lists(st.text(max_size=4), max_size=3), json_values),
    },
)


def assert_only_command_errors(data: bytes | str, encoding: Encoding) -> None:
    try:
        command = parse_command(data, encoding, max_size=4096)
    except CommandError as exc:
        assert exc.code in {
            "bad_frame",
            "unknown_command",
            "bad_command",
            "invalid_offset",
            "payload_too_large",
        }
    else:
        assert isinstance(command, Subscribe | Unsubscribe | Publish | Ping)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(data=st.binary(max_size=200), encoding=st.sampled_from(ENCODINGS))
def test_fuzz_random_bytes(data: bytes, encoding: Encoding) -> None:
    assert_only_command_errors(data, encoding)


@FUZZ
@given(data=st.text(max_size=200), encoding=st.sampled_from(ENCODINGS))
def test_fuzz_random_text(data: str, encoding: Encoding) -> None:
    assert_only_command_errors(data, encoding)


@FUZZ
@given(frame=command_like, encoding=st.sampled_from(ENCODINGS))
def test_fuzz_command_shaped_frames(frame: dict[str, Any], encoding: Encoding) -> None:
    assert_only_command_errors(wire(frame, encoding), encoding)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=command_like, cut=st.integers(0, 50), flip=st.integers(0, 255))
def test_fuzz_corrupted_msgpack(frame: dict[str, Any], cut: int, flip: int) -> None:
    data = bytearray(wire(frame, Encoding.MSGPACK))
    if data:
        data[cut % len(data)] ^= flip
    assert_only_command_errors(bytes(data[: len(data) - cut % 3]), Encoding.MSGPACK)


# -- frame builders -------------------------------------------------------------------------


def test_subscribed_frame() -> None:
    assert subscribed_frame(4, "t1", EPOCH, OFFSET, True) == {
        "type": "subscribed",
        "id": 4,
        "thread": "t1",
        "epoch": EPOCH,
        "offset": OFFSET,
        "recovered": True,
    }
    # No id: no id key; a thread without events has a null epoch and offset 0-0.
    assert subscribed_frame(None, "t1", None, "0-0", False) == {
        "type": "subscribed",
        "thread": "t1",
        "epoch": None,
        "offset": "0-0",
        "recovered": False,
    }


def test_snapshot_frame() -> None:
    events = [{"type": "RUN_STARTED", "threadId": "t1", "runId": "r1"}]
    assert snapshot_frame("t1", OFFSET, EPOCH, events, False) == {
        "type": "snapshot",
        "thread": "t1",
        "offset": OFFSET,
        "epoch": EPOCH,
        "complete": False,
        "events": events,
    }


def test_reply_frames() -> None:
    assert unsubscribed_frame(6, "t1") == {"type": "unsubscribed", "id": 6, "thread": "t1"}
    assert unsubscribed_frame(None, "t1") == {"type": "unsubscribed", "thread": "t1"}
    assert published_frame(7, "t1", ["1-0", "1-1"]) == {
        "type": "published",
        "id": 7,
        "thread": "t1",
        "offsets": ["1-0", "1-1"],
    }
    assert published_frame(None, "t1", []) == {"type": "published", "thread": "t1", "offsets": []}
    assert pong_frame(8) == {"type": "pong", "id": 8}
    assert pong_frame("p") == {"type": "pong", "id": "p"}
    assert pong_frame(None) == {"type": "pong"}
    # An id of 0 or "" is an id: echoed.
    assert pong_frame(0) == {"type": "pong", "id": 0}
    assert pong_frame("") == {"type": "pong", "id": ""}


def test_error_frame() -> None:
    assert error_frame("sequence_error", "[rule] msg", 7, "t1") == {
        "type": "error",
        "id": 7,
        "code": "sequence_error",
        "thread": "t1",
        "message": "[rule] msg",
    }
    assert error_frame("bad_frame", "not JSON") == {
        "type": "error",
        "code": "bad_frame",
        "message": "not JSON",
    }


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_encode_frame(encoding: Encoding) -> None:
    frame = subscribed_frame("é", "thread ✓", EPOCH, OFFSET, True)
    data = encode_frame(frame, encoding)
    if encoding is Encoding.JSON:
        assert isinstance(data, str)  # a text frame
        assert json.loads(data) == frame
        assert "✓" in data  # UTF-8, not \u escapes
    else:
        assert isinstance(data, bytes)  # a binary frame
        assert msgpack.unpackb(data, raw=False) == frame


def test_encode_frame_round_trips_through_parse_for_commands() -> None:
    # The client side of a test can reuse encode_frame: parse what it makes.
    frame = {"type": "subscribe", "id": 1, "thread": "t", "from": {"offset": OFFSET}}
    for encoding in ENCODINGS:
        assert parse_command(encode_frame(frame, encoding), encoding) == Subscribe(
            1, "t", Position(OFFSET, None), None
        )


# -- event frames --------------------------------------------------------------------------

EVENTS = [
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Hi"},
    {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": 'héllo ✓ 𝄞 "q" \\ \n\t'},
    {"type": "RUN_STARTED", "threadId": "t1", "runId": "r1", "x-unknown": [1, 2.5, None, True]},
    {"type": "STATE_DELTA", "delta": [{"op": "add", "path": "/a", "value": {"b": [1, {}]}}]},
    {"type": "CUSTOM", "name": "big", "value": "x" * 70_000},
    {"type": "CUSTOM", "name": "many", "value": {str(i): i for i in range(40)}},
]
THREADS = ["t1", "thread ✓", 'q"uote\\slash', "x" * 256, "é" * 40]
OFFSETS = ["0-0", OFFSET, "18446744073709551615-18446744073709551615"]


def equivalent(thread: str, offset: str, event: Any) -> dict[str, Any]:
    return {"type": "event", "thread": thread, "offset": offset, "event": event}


def check_event_frame(thread: str, offset: str, event: Any) -> None:
    data = encode_msgpack(event)
    expected = equivalent(thread, offset, event)
    packed = event_frame(thread, offset, data, Encoding.MSGPACK)
    assert isinstance(packed, bytes)
    assert packed == msgpack.packb(expected, use_bin_type=True)
    assert msgpack.unpackb(packed, raw=False) == expected
    text = event_frame(thread, offset, data, Encoding.JSON)
    assert isinstance(text, str)
    assert text == json.dumps(expected, ensure_ascii=False, separators=(",", ":"))
    assert json.loads(text) == expected


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e["type"])
@pytest.mark.parametrize("thread", THREADS)
@pytest.mark.parametrize("offset", OFFSETS)
def test_event_frame_both_encodings(event: Any, thread: str, offset: str) -> None:
    check_event_frame(thread, offset, event)


def test_event_frame_splices_the_stored_bytes_unchanged() -> None:
    event = EVENTS[1]
    data = encode_msgpack(event)
    packed = event_frame("t1", OFFSET, data, Encoding.MSGPACK)
    assert isinstance(packed, bytes)
    assert packed.endswith(data)


event_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    event=st.dictionaries(st.text(max_size=10), event_values, max_size=20).map(
        lambda d: {"type": "CUSTOM", **d}
    ),
    thread=st.text(
        alphabet=st.characters(codec="utf-8", exclude_categories=("Cc", "Cs")),
        min_size=1,
        max_size=256,
    ),
    ms=st.integers(0, 2**64 - 1),
    seq=st.integers(0, 2**64 - 1),
)
def test_event_frame_fuzz(event: dict[str, Any], thread: str, ms: int, seq: int) -> None:
    check_event_frame(thread, f"{ms}-{seq}", event)
