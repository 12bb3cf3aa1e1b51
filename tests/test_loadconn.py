"""bls bench's answer parser: HTTP/1.1 framing however the bytes are split."""

from __future__ import annotations

import time

import pytest

from bls.loadconn import Answer

SSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b'f\r\ndata: {"a":1}\n\n\r\n'
    b'f\r\ndata: {"a":2}\n\n\r\n'
    b"0\r\n\r\n"
)


def _fed(answer: Answer, data: bytes, step: int) -> list[bool]:
    return [answer.feed(data[i : i + step]) for i in range(0, len(data), step)]


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
def test_a_chunked_stream_is_whole_only_at_its_last_chunk(step: int) -> None:
    answer = Answer(time.perf_counter())
    whole = _fed(answer, SSE, step)
    assert whole[-1] and not any(whole[:-1])
    assert answer.status == 200 and answer.stream and answer.keeps_alive
    assert bytes(answer.body) == b'data: {"a":1}\n\ndata: {"a":2}\n\n'
    assert answer.first is not None and answer.first >= 0


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_a_sized_answer_is_whole_at_its_length(step: int) -> None:
    data = b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 12\r\n\r\n" + b'{"error":{}}'
    answer = Answer(time.perf_counter())
    whole = _fed(answer, data, step)
    assert whole[-1] and not any(whole[:-1])
    assert answer.status == 422 and bytes(answer.body) == b'{"error":{}}'
    assert not answer.stream and answer.first is None


def test_an_answer_without_length_ends_with_the_connection() -> None:
    answer = Answer(time.perf_counter())
    assert not answer.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nsome")
    assert not answer.feed(b" text")
    assert not answer.keeps_alive
    assert answer.end() and bytes(answer.body) == b"some text"


def test_a_204_has_no_body_and_a_cut_answer_is_not_whole() -> None:
    assert Answer(0.0).feed(b"HTTP/1.1 204 No Content\r\n\r\n")
    cut = Answer(0.0)
    assert not cut.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    assert not cut.end()  # the peer closed before the whole body: an error, not an answer
    closing = Answer(0.0)
    assert closing.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    assert not closing.keeps_alive


def test_a_head_that_is_not_http_raises() -> None:
    with pytest.raises(ValueError):
        Answer(0.0).feed(b"SSH-2.0-OpenSSH\r\n\r\n")
