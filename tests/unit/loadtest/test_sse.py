"""The SSE parser: events split anywhere across reads, CRLF, comments, named events, EOF."""

from __future__ import annotations

from loadtest.sse import SSEEvent, SSEParser

STREAM = (
    b": ping\n\n"
    b'data: {"a": 1}\n\n'
    b"event: error\r\ndata: line one\r\ndata: line two\r\n\r\n"
    b"data: caf\xc3\xa9\r\r"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent("message", '{"a": 1}'),
    SSEEvent("error", "line one\nline two"),
    SSEEvent("message", "café"),
    SSEEvent("message", "[DONE]"),
]


def test_whole_stream_at_once() -> None:
    parser = SSEParser()
    assert parser.feed(STREAM) == EXPECTED
    assert parser.close() == []


def test_every_split_point_gives_the_same_events() -> None:
    for cut in range(1, len(STREAM)):
        parser = SSEParser()
        events = parser.feed(STREAM[:cut]) + parser.feed(STREAM[cut:]) + parser.close()
        assert events == EXPECTED, cut


def test_byte_by_byte() -> None:
    parser = SSEParser()
    events = [e for i in range(len(STREAM)) for e in parser.feed(STREAM[i : i + 1])]
    assert events + parser.close() == EXPECTED


def test_last_event_without_blank_line_is_dispatched_at_close() -> None:
    parser = SSEParser()
    assert parser.feed(b'data: {"x": 2}\n\ndata: [DONE]') == [SSEEvent("message", '{"x": 2}')]
    assert parser.close() == [SSEEvent("message", "[DONE]")]


def test_field_without_space_and_unknown_fields() -> None:
    parser = SSEParser()
    assert parser.feed(b"id: 7\nretry: 10\ndata:tight\n\n") == [SSEEvent("message", "tight")]
