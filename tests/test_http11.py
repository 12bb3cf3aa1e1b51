"""The HTTP/1.1 rules without a socket (bls/serve/http11.py): bytes in, events out; an
answer's parts in, bytes out — compared byte for byte."""

from __future__ import annotations

import pytest

from bls.serve.http11 import (
    END,
    MAX_URL_BYTES,
    UPGRADE,
    Answer,
    Head,
    Refusal,
    RequestParser,
    default_lines,
    refusal,
)

POST = b"POST /v1/scripts/x?q=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"


def test_a_request_in_one_piece_is_a_head_its_body_and_its_end() -> None:
    head, body, end = RequestParser().feed(POST)
    assert isinstance(head, Head) and body == b"hello" and end is END
    assert (head.method, head.version, head.raw_path, head.query) == (
        "POST",
        "1.1",
        b"/v1/scripts/x",
        b"q=1",
    )
    assert head.headers == [(b"host", b"a"), (b"content-length", b"5")]
    assert head.keep_alive and not head.expect_continue


def test_a_request_in_pieces_gives_its_events_as_they_complete() -> None:
    parser = RequestParser()
    assert parser.feed(POST[:20]) == []
    events = parser.feed(POST[20:-3])
    assert len(events) == 2 and isinstance(events[0], Head) and events[1] == b"he"
    assert parser.feed(POST[-3:]) == [b"llo", END]


def test_pipelined_requests_come_out_in_order() -> None:
    get = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n"
    events = RequestParser().feed(get + POST + get.replace(b"/a", b"/b"))
    heads = [e.raw_path for e in events if isinstance(e, Head)]
    assert heads == [b"/a", b"/v1/scripts/x", b"/b"]
    assert events.count(END) == 3


def test_the_path_is_decoded_values_trimmed_and_expect_and_keep_alive_read() -> None:
    raw = b"PUT /a%20b HTTP/1.0\r\nExpect: 100-Continue\r\nX-Y: v \t\r\nContent-Length: 0\r\n\r\n"
    (head, end) = RequestParser().feed(raw)
    assert isinstance(head, Head) and end is END
    assert head.path == "/a b" and head.raw_path == b"/a%20b"
    assert head.expect_continue and not head.keep_alive  # (HTTP/1.0)
    assert (b"x-y", b"v") in head.headers


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"NOT HTTP\r\n\r\n", 400),
        (b"GET /" + b"u" * MAX_URL_BYTES + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(3000)) + b"\r\n", 431),
    ],
)
def test_what_cannot_be_served_is_a_refusal(data: bytes, status: int) -> None:
    *_, last = RequestParser().feed(data)
    assert isinstance(last, Refusal) and last.status == status


def test_a_header_value_that_never_ends_is_refused_as_it_grows() -> None:
    parser = RequestParser(max_header_bytes=1024)
    assert parser.feed(b"GET / HTTP/1.1\r\nX: ") == []
    events: list[object] = []
    for _ in range(20):  # 20 pieces of 1 KiB: a refusal before all of them are buffered
        events = parser.feed(b"a" * 1024)
        if events:
            break
    assert isinstance(events[-1], Refusal) and events[-1].status == 431


def test_an_upgrade_is_answered_as_http_1_1_and_ends_the_input() -> None:
    raw = b"GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /next"
    events = RequestParser().feed(raw)
    assert isinstance(events[0], Head) and events[-1] is UPGRADE


def test_a_refusals_bytes() -> None:
    assert refusal(431, "too big", b"date: d\r\n") == (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ndate: d\r\n"
        b"content-type: text/plain; charset=utf-8\r\ncontent-length: 7\r\n"
        b"connection: close\r\n\r\ntoo big"
    )


# -- answers -----------------------------------------------------------------------------


def _answer(head_only: bool = False, keep_alive: bool = True, expect: bool = False) -> Answer:
    return Answer(head_only, keep_alive, expect, b"date: d\r\n")


def test_a_head_with_a_length_waits_for_its_body_and_goes_out_with_it() -> None:
    answer = _answer()
    assert answer.start(200, [(b"Content-Length", b"2")]) == b""
    assert answer.body(b"ok", False) == (
        b"HTTP/1.1 200 OK\r\ndate: d\r\ncontent-length: 2\r\n\r\nok"
    )
    assert answer.complete and answer.keep_alive


def test_an_answer_without_a_length_is_chunked() -> None:
    answer = _answer()
    assert answer.start(200, []) == (
        b"HTTP/1.1 200 OK\r\ndate: d\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    assert answer.body(b"one", True) == b"3\r\none\r\n"
    assert answer.body(b"two", False) == b"3\r\ntwo\r\n0\r\n\r\n"
    assert answer.complete


def test_head_204_and_304_carry_no_body() -> None:
    head = _answer(head_only=True)
    assert head.start(200, [(b"content-length", b"5")]).endswith(b"content-length: 5\r\n\r\n")
    assert head.body(b"hello", False) == b""
    for status in (204, 304):
        answer = _answer()
        assert answer.start(status, []) == b"%s" % (
            b"HTTP/1.1 %d %s\r\ndate: d\r\n\r\n"
            % (status, b"No Content" if status == 204 else b"Not Modified")
        )


def test_a_connection_that_will_close_says_so_once() -> None:
    closing = _answer(keep_alive=False)
    out = closing.start(200, [(b"content-length", b"0")])
    assert out.count(b"connection: close") == 1
    told = _answer()
    out = told.start(200, [(b"connection", b"close"), (b"content-length", b"0")])
    assert out.count(b"connection: close") == 1 and not told.keep_alive


def test_a_whole_answer_gets_its_length_the_default_lines_and_a_close() -> None:
    assert _answer(keep_alive=False).whole(201, b"x-a: b\r\n", b"body") == (
        b"HTTP/1.1 201 Created\r\ndate: d\r\nx-a: b\r\ncontent-length: 4\r\n"
        b"connection: close\r\n\r\nbody"
    )
    assert _answer(head_only=True).whole(200, b"", b"body").endswith(b"content-length: 4\r\n\r\n")
    with pytest.raises(RuntimeError, match="a 204 answer has no body"):
        _answer().whole(204, b"", b"")


def test_100_continue_is_owed_once_and_not_after_the_answer_began() -> None:
    answer = _answer(expect=True)
    assert answer.continue_() == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.continue_() == b""
    late = _answer(expect=True)
    late.whole(200, b"", b"")
    assert late.continue_() == b""


def test_parts_out_of_order_or_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(RuntimeError, match="body came before its head"):
        _answer().body(b"x", False)
    long = _answer()
    long.start(200, [(b"content-length", b"1")])
    with pytest.raises(RuntimeError, match="longer than its content-length"):
        long.body(b"xx", False)
    short = _answer()
    short.start(200, [(b"content-length", b"3")])
    with pytest.raises(RuntimeError, match="shorter than its content-length"):
        short.body(b"x", False)
    bad = _answer()
    with pytest.raises(RuntimeError, match="invalid HTTP header value"):
        bad.start(200, [(b"x", b"a\r\nb")])


def test_a_held_head_can_be_dropped_for_another_answer() -> None:
    answer = _answer()
    answer.start(200, [(b"content-length", b"2")])
    assert answer.drop_held()  # nothing went out: a 500 may go instead
    assert answer.start(500, [(b"content-length", b"0")]).startswith(b"HTTP/1.1 500")
    sent = _answer()
    sent.start(200, [])
    assert not sent.drop_held()


def test_default_lines_are_checked() -> None:
    assert default_lines([(b"Date", b"d"), (b"server", b"s")]) == b"date: d\r\nserver: s\r\n"
    with pytest.raises(RuntimeError):
        default_lines([(b"bad name", b"v")])


# -- a request its scope ended: one table from the reason to the answer ----------------


def test_each_reason_a_request_was_cut_short_has_its_answer() -> None:
    from bls.errors import DeadlineExceeded
    from bls.scope import Reason
    from bls.serve.framing import HttpError, cut_short

    assert cut_short(Reason.CLIENT_GONE, False, "e", 5, 10) is None  # nobody to tell
    drain = cut_short(Reason.DRAIN, False, "e", 5, 10)
    assert isinstance(drain, HttpError) and (drain.status, drain.type) == (503, "draining")
    slow = cut_short(Reason.BODY_TOO_SLOW, True, "e", 30, 10)
    assert isinstance(slow, HttpError) and slow.status == 408
    assert slow.message == "the request body did not arrive within 10s"
    late_body = cut_short(Reason.DEADLINE, True, "e", 2, 2)  # the deadline, mid-body
    assert isinstance(late_body, HttpError) and late_body.status == 408
    late = cut_short(Reason.DEADLINE, False, "e", 2, 10)
    assert isinstance(late, DeadlineExceeded)
    assert str(late) == "request to 'e' exceeded its 2s deadline"
