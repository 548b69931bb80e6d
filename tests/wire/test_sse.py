"""Tests of agui_hub/wire/sse.py, sans I/O: :class:`SseParser` against the WHATWG event stream
rules (line endings, fields, comments, the byte-order mark, cut-off events), its bounds
(:class:`~agui_hub.errors.PayloadTooLarge` before a buffer grows past the limit), and
:func:`encode_event` / :func:`encode_comment` read back through the parser, including a
property test over random data, ids, event names and chunkings; the parser's work staying
linear in the bytes fed (runs of blank lines, a long line in small chunks), and
:class:`~agui_hub.wire.sse.SseTooLarge` handing on the events a chunk completed before its bound."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agui_hub.errors import PayloadTooLarge
from agui_hub.wire.sse import SseEvent, SseParser, SseTooLarge, encode_comment, encode_event

pytestmark = pytest.mark.timeout(60)

BIG = 1 << 20
"""A limit no test stream here comes near (unless the test is about the limit)."""


def parse(data: bytes, *, chunk: int | None = None, limit: int = BIG) -> list[SseEvent]:
    """The events of *data* fed whole, or in pieces of *chunk* bytes."""
    parser = SseParser(max_event_bytes=limit)
    if chunk is None:
        return parser.feed(data)
    events: list[SseEvent] = []
    for start in range(0, len(data), chunk):
        events += parser.feed(data[start : start + chunk])
    return events


def feed_all(parser: SseParser, pieces: list[bytes]) -> list[SseEvent]:
    events: list[SseEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    return events


# -- line endings -------------------------------------------------------------------------

STREAM = 'event: greet\nid: 7\ndata: one\ndata: two\n\n: a comment\ndata: {"x": 1}\n\n'
EXPECTED = [
    SseEvent("one\ntwo", "greet", "7"),
    SseEvent('{"x": 1}', "message", "7"),
]


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 7], ids=lambda c: f"chunk={c}")
def test_every_line_ending_gives_the_same_events(ending: str, chunk: int | None) -> None:
    data = STREAM.replace("\n", ending).encode()
    assert parse(data, chunk=chunk) == EXPECTED


def test_mixed_line_endings_in_one_stream() -> None:
    data = b"data: a\r\ndata: b\rdata: c\n\r\n" + b"data: d\r\r"
    assert parse(data) == [SseEvent("a\nb\nc"), SseEvent("d")]


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    parser = SseParser(max_event_bytes=BIG)
    # The CR ends the line at once (it could be a line end on its own) ...
    assert parser.feed(b"data: a\r") == []
    # ... and the LF that starts the next chunk is its CRLF's, not a blank line.
    assert parser.feed(b"\ndata: b\r\n") == []
    assert parser.feed(b"\r") == [SseEvent("a\nb")]
    assert parser.feed(b"\n") == []  # the LF of that CRLF, again split
    assert parser.feed(b"data: c\n\n") == [SseEvent("c")]


def test_cr_at_the_end_of_a_chunk_then_a_blank_line_dispatches_once() -> None:
    parser = SseParser(max_event_bytes=BIG)
    assert parser.feed(b"data: a\r") == []
    # A CR then a LF-less blank line (CR): the second CR is the blank line.
    assert parser.feed(b"\r") == [SseEvent("a")]


def test_an_empty_chunk_between_the_cr_and_the_lf_of_a_crlf() -> None:
    # feed() takes the bytes as they arrive; an empty read is a chunk like another, and
    # must not make the LF of a split CRLF a blank line (which dispatches "a" early).
    parser = SseParser(max_event_bytes=BIG)
    events = feed_all(parser, [b"data: a\r", b"", b"\ndata: b\r\n\r\n"])
    assert events == [SseEvent("a\nb")]


def test_a_chunk_split_inside_a_utf8_character() -> None:
    text = "héllo wörld ✓ 😀"
    data = f"data: {text}\n\n".encode()
    for cut in range(1, len(data)):
        parser = SseParser(max_event_bytes=BIG)
        assert feed_all(parser, [data[:cut], data[cut:]]) == [SseEvent(text)], cut
    assert parse(data, chunk=1) == [SseEvent(text)]


def test_invalid_utf8_becomes_replacement_characters() -> None:
    assert parse(b"data: a\xffb\n\n") == [SseEvent("a\ufffdb")]


def test_unicode_line_separators_are_not_sse_line_ends() -> None:
    # U+2028, U+0085, U+000B, U+000C end lines for str.splitlines(), not for SSE.
    text = "a\u2028b\x85c\x0bd\x0ce"
    assert parse(f"data: {text}\n\n".encode()) == [SseEvent(text)]


# -- fields ---------------------------------------------------------------------------------


def test_data_lines_are_joined_with_newlines() -> None:
    assert parse(b"data: one\ndata:\ndata: three\n\n") == [SseEvent("one\n\nthree")]


def test_only_one_space_after_the_colon_is_dropped() -> None:
    events = parse(b"data:no space\n\ndata:  two spaces\n\ndata:\tTab\n\n")
    assert [e.data for e in events] == ["no space", " two spaces", "\tTab"]


def test_a_field_without_a_colon_has_an_empty_value() -> None:
    # "data" alone is a data line with an empty value: an event whose data is "".
    assert parse(b"data\n\n") == [SseEvent("")]
    assert parse(b"data\ndata\n\n") == [SseEvent("\n")]


def test_comments_and_unknown_fields_are_ignored() -> None:
    data = b": keepalive\ndata: a\n:another\nfoo: bar\nDATA: shouting\ndata: b\n\n:\n\n"
    assert parse(data) == [SseEvent("a\nb")]


def test_event_field_names_the_type_for_one_event_only() -> None:
    data = b"event: first\ndata: 1\n\ndata: 2\n\nevent: ignored\n\ndata: 3\n\n"
    assert parse(data) == [SseEvent("1", "first"), SseEvent("2"), SseEvent("3")]


def test_id_field_is_the_last_event_id_until_changed() -> None:
    parser = SseParser(max_event_bytes=BIG)
    data = b"id: a\ndata: 1\n\ndata: 2\n\nid\ndata: 3\n\nid: b\n\n"
    assert parser.feed(data) == [SseEvent("1", id="a"), SseEvent("2", id="a"), SseEvent("3", id="")]
    # An id without data dispatches nothing but still sets the last event id.
    assert parser.last_id == "b"
    assert parser.feed(b"data: 4\n\n") == [SseEvent("4", id="b")]


def test_an_id_holding_nul_is_ignored() -> None:
    parser = SseParser(max_event_bytes=BIG)
    events = parser.feed(b"id: good\ndata: 1\n\nid: ba\x00d\ndata: 2\n\n")
    assert events == [SseEvent("1", id="good"), SseEvent("2", id="good")]
    assert parser.last_id == "good"


def test_retry_field_takes_ascii_digits_only() -> None:
    parser = SseParser(max_event_bytes=BIG)
    assert parser.retry is None
    parser.feed(b"retry: 2500\n\n")
    assert parser.retry == 2500
    for bad in (
        b"retry: 12a\n",
        b"retry: -5\n",
        b"retry:\n",
        b"retry: \xd9\xa3\n",
        b"retry: 1.5\n",
    ):
        parser.feed(bad)
        assert parser.retry == 2500, bad
    assert parser.feed(b"retry: 10\ndata: x\n\n") == [SseEvent("x")]
    assert parser.retry == 10


def test_a_byte_order_mark_is_skipped_at_the_start_only() -> None:
    bom = b"\xef\xbb\xbf"
    assert parse(bom + b"data: a\n\n") == [SseEvent("a")]
    assert parse(bom + b"data: a\n\n", chunk=1) == [SseEvent("a")]
    # Later, it is part of the line: "\ufeffdata" is not a field the parser knows.
    assert parse(b"data: a\n" + bom + b"data: b\n\n") == [SseEvent("a")]
    # Only one is skipped.
    assert parse(bom + bom + b"data: a\n\ndata: b\n\n") == [SseEvent("b")]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert parse(b"\n\n\r\n\r\r\n") == []
    assert parse(b"event: x\nid: 3\n\n\n") == []
    assert parse(b": only a comment\n\n") == []


# -- the end of the body -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "cut_off"),
    [
        (b"data: a\n\n", False),
        (b"data: a\n\n: keepalive\n", False),
        (b"data: a\n\n\n\n", False),
        (b"", False),
        (b"data: a\n", True),  # data without its blank line
        (b"data: a\n\ndata: b", True),  # in the middle of a line
        (b'data: a\r\n\r\nevent: x\ndata: {"half":', True),
    ],
)
def test_close_reports_a_cut_off_event(body: bytes, cut_off: bool) -> None:
    parser = SseParser(max_event_bytes=BIG)
    parser.feed(body)
    assert parser.close() is cut_off


# -- bounds ------------------------------------------------------------------------------------


def test_a_line_at_the_limit_passes_one_over_it_does_not() -> None:
    limit = 100
    comment = b":" + b"c" * (limit - 1)
    assert len(comment) == limit
    parser = SseParser(max_event_bytes=limit)
    assert parser.feed(comment + b"\ndata: ok\n\n") == [SseEvent("ok")]
    with pytest.raises(PayloadTooLarge) as caught:
        SseParser(max_event_bytes=limit).feed(comment + b"c\n")
    assert caught.value.limit == limit
    assert caught.value.size > limit
    # A data line (counted with its line end) just under the limit passes.
    line = b"data: " + b"x" * (limit - 7)
    assert parse(line + b"\n\n", limit=limit) == [SseEvent("x" * (limit - 7))]
    for over in (line + b"xx", b"id: " + b"i" * limit, b"event: " + b"e" * limit):
        with pytest.raises(PayloadTooLarge):
            parse(over + b"\n\n", limit=limit)


def test_an_unfinished_line_over_the_limit_raises_before_its_end_arrives() -> None:
    parser = SseParser(max_event_bytes=100)
    parser.feed(b"data: " + b"x" * 90)
    with pytest.raises(PayloadTooLarge):
        parser.feed(b"x" * 20)  # no line end yet: the buffer alone is over the limit


def test_data_lines_that_together_exceed_the_limit_raise() -> None:
    limit = 100
    line = b"data: " + b"x" * 34 + b"\n"  # 40 bytes of line, each under the limit
    parser = SseParser(max_event_bytes=limit)
    assert parser.feed(line * 2) == []
    with pytest.raises(PayloadTooLarge):
        parser.feed(line)
    # The count is per event: many small events pass.
    parser = SseParser(max_event_bytes=limit)
    events = parser.feed((line * 2 + b"\n") * 50)
    assert len(events) == 50


@pytest.mark.parametrize(
    "stream",
    ["one_line", "many_lines", "crlf_lines"],
)
def test_ten_megabytes_raise_early_without_being_buffered(stream: str) -> None:
    limit = 1 << 20
    chunk_size = 64 * 1024
    total = 10 * (1 << 20)
    if stream == "one_line":
        line = b"data: " + b"x" * (total - 6)
        body = line
    else:
        ending = b"\r\n" if stream == "crlf_lines" else b"\n"
        one = b"data: " + b"y" * 1000 + ending
        body = one * (total // len(one))
    parser = SseParser(max_event_bytes=limit)
    fed = 0
    with pytest.raises(PayloadTooLarge) as caught:
        for start in range(0, len(body), chunk_size):
            fed += chunk_size
            parser.feed(body[start : start + chunk_size])
    assert caught.value.limit == limit
    # It stopped within a chunk of the limit, not at the end of the 10 MB.
    assert fed <= limit + 2 * chunk_size, fed


T = TypeVar("T")

LINEAR_BOUND = 2.0
"""Seconds a feed of a few MiB may take (it takes well under 0.2 s; quadratic work took
many seconds): generous for a slow box, far under what rescanning would cost."""


def timed(work: Callable[[], T]) -> tuple[float, T]:
    began = time.perf_counter()
    result = work()
    return time.perf_counter() - began, result


def test_a_mebibyte_of_blank_lines_in_one_chunk_is_linear() -> None:
    parser = SseParser(max_event_bytes=BIG)
    took, events = timed(lambda: parser.feed(b"\n" * (1 << 20)))
    assert events == []
    assert took < LINEAR_BOUND, f"{took:.2f} s for 1 MiB of blank lines"
    # The parser is still in step: the next event comes out whole.
    assert parser.feed(b"data: after\n\n") == [SseEvent("after")]
    assert parser.close() is False


def test_a_long_line_fed_in_small_chunks_is_linear() -> None:
    # A 2 MiB data line (under a 4 MiB limit) in 100-byte chunks: each chunk must not
    # rescan the part of the line already known to hold no line end.
    size = 2 << 20
    line = b"data: " + b"x" * (size - 6)
    parser = SseParser(max_event_bytes=4 << 20)

    def feed() -> list[SseEvent]:
        events: list[SseEvent] = []
        for start in range(0, len(line), 100):
            events += parser.feed(line[start : start + 100])
        return events

    took, events = timed(feed)
    assert events == []
    assert took < LINEAR_BOUND, f"{took:.2f} s for a 2 MiB line in 100-byte chunks"
    assert parser.close() is True  # in the middle of its event
    assert parser.feed(b"\n\n") == [SseEvent("x" * (size - 6))]
    assert parser.close() is False


@pytest.mark.parametrize("chunk", [None, 4096], ids=["one_chunk", "4k_chunks"])
def test_many_cr_lf_cr_triples_are_linear(chunk: int | None) -> None:
    # "\r\n\r" over and over: CRLF then CR, two blank lines each time (and, cut into
    # chunks, CRs at chunk ends whose LF starts the next chunk).
    body = b"data: before\n" + b"\r\n\r" * 300_000 + b"\ndata: after\n\n"
    took, events = timed(lambda: parse(body, chunk=chunk))
    # The first blank line dispatches "before", the 600,000 others nothing (the LF after
    # the last CR is that CR's CRLF); "after" comes out whole.
    assert events == [SseEvent("before"), SseEvent("after")]
    assert took < LINEAR_BOUND, f"{took:.2f} s for 300,000 CR LF CR triples"


@pytest.mark.parametrize(
    ("tail", "size"),
    [
        (b"x" * 200, 200),  # an unfinished line over the limit
        (b"data: " + b"y" * 200 + b"\n\n", 206),  # a whole line over the limit
        ((b"data: " + b"y" * 40 + b"\n") * 3, 141),  # data lines over it together
    ],
    ids=["unfinished_line", "long_line", "data_lines"],
)
def test_too_large_carries_the_events_completed_before_it(tail: bytes, size: int) -> None:
    parser = SseParser(max_event_bytes=100)
    with pytest.raises(SseTooLarge) as caught:
        parser.feed(b"id: 1\ndata: a\n\nevent: e\ndata: b\n\n" + tail)
    # Whole events that came in the same chunk as the overflow: handed on, not lost.
    assert caught.value.events == [SseEvent("a", id="1"), SseEvent("b", "e", "1")]
    assert isinstance(caught.value, PayloadTooLarge)  # callers catching the base still do
    assert caught.value.limit == 100
    assert caught.value.size == size
    # Nothing completed before it: an empty list, not None.
    with pytest.raises(SseTooLarge) as nothing:
        SseParser(max_event_bytes=100).feed(tail)
    assert nothing.value.events == []


# -- the encoder ------------------------------------------------------------------------------


def test_encode_event_is_the_documented_frame() -> None:
    assert encode_event('{"a": 1}') == b'data: {"a": 1}\n\n'
    assert encode_event("x", id="5-0", event="thread") == b"event: thread\nid: 5-0\ndata: x\n\n"
    assert encode_event("a\nb") == b"data: a\ndata: b\n\n"
    assert encode_event("") == b"data: \n\n"
    assert encode_comment() == b": \n\n"
    assert encode_comment("ping") == b": ping\n\n"


@pytest.mark.parametrize(
    ("data", "read_back"),
    [
        ("plain", "plain"),
        ("two\nlines", "two\nlines"),
        ("windows\r\nlines", "windows\nlines"),
        ("old mac\rlines", "old mac\nlines"),
        ("\n", "\n"),
        ("", ""),
        (" leading space", " leading space"),
        ("trailing\n", "trailing\n"),
        (": not a comment", ": not a comment"),
        ("data: nested", "data: nested"),
    ],
)
def test_encode_event_round_trips(data: str, read_back: str) -> None:
    encoded = encode_event(data, id="1-2", event="e")
    assert parse(encoded) == [SseEvent(read_back, "e", "1-2")]
    assert parse(encoded, chunk=1) == [SseEvent(read_back, "e", "1-2")]


def test_comments_between_events_are_invisible() -> None:
    body = encode_comment("hello") + encode_event("a") + encode_comment() + encode_event("b")
    assert parse(body) == [SseEvent("a"), SseEvent("b")]
    parser = SseParser(max_event_bytes=BIG)
    parser.feed(encode_comment("only"))
    assert parser.close() is False


_DATA = st.text(max_size=80)
_NAME = st.text(
    alphabet=st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]),
    min_size=1,
    max_size=12,
)
_ID = st.text(
    alphabet=st.characters(exclude_characters="\r\n", exclude_categories=["Cs"]),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(st.tuples(_DATA, st.none() | _ID, st.none() | _NAME), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
    bom=st.booleans(),
)
def test_encoded_events_read_back_whatever_the_chunking(
    events: list[tuple[str, str | None, str | None]], cuts: list[int], bom: bool
) -> None:
    body = (b"\xef\xbb\xbf" if bom else b"") + b"".join(
        encode_event(data, id=event_id, event=name) for data, event_id, name in events
    )
    # What a reader gets: newlines normalized, the last valid id carried over, and the
    # type "message" when none is given.
    expected: list[SseEvent] = []
    last_id: str | None = None
    for data, event_id, name in events:
        if event_id is not None and "\0" not in event_id:
            last_id = event_id
        normalized = data.replace("\r\n", "\n").replace("\r", "\n")
        expected.append(SseEvent(normalized, name or "message", last_id))
    bounds = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
    pieces = [body[a:b] for a, b in itertools.pairwise(bounds)]
    parser = SseParser(max_event_bytes=BIG)
    assert feed_all(parser, pieces) == expected
    assert parser.close() is False
