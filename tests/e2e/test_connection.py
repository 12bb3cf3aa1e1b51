"""The HTTP/1.1 connection of `bls serve`, on both drivers — asyncio
(bls/serve/asyncio_http.py under a real Uvicorn server) and trio (bls/serve/trio_http.py) —
over raw sockets: keep-alive on the shared timer (an idle connection closes
on time, never early; one that keeps asking stays open), pipelined requests answered in
order, the head that says how the body comes (a length, chunks, a close, HEAD), a body
that comes in pieces or after ``100 Continue`` or is taken whole, what does not parse,
an application that fails, a client that leaves, a client that reads slowly, and the
server serving new clients afterwards."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
import trio
import uvicorn

from bls.serve.asyncio_http import connection_class
from bls.serve.framing import BODY, WHOLE
from tests.e2e.rawio import http_response, receive_until

pytestmark = pytest.mark.parametrize("driver", ["asyncio", "trio"])

# Set when the application hears its client leave (by path).
left: dict[str, threading.Event] = {}
# Set when /take found no whole body to take (so it receives it instead).
untaken = threading.Event()


async def _echo_path(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A tiny ASGI app: answers the request's path (``/slow/S`` after S seconds), or its
    body (``/echo``); ``/fail`` fails before answering, ``/fail-held`` after sending
    its head (which waits for its body), ``/fail-late`` after a first piece of its body,
    ``/wait`` waits for its client to leave, ``/big/N`` answers N bytes, ``/whole`` answers
    in one message (the bls.response.whole extension), ``/whole/S`` with status S,
    ``/take`` takes its body whole (bls.request.body) where it can and says how it got it."""
    assert scope["type"] == "http"
    path = scope["path"]
    take = scope["extensions"][BODY]["take"]
    taken = take() if path == "/take" else None
    if taken is not None:
        assert take() is None  # (taken once)
        await send({"type": WHOLE, "status": 200, "head": b"", "body": b"taken " + taken})
        return
    if path == "/take":
        untaken.set()
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if path == "/take":
        body = b"received " + body
    if path.startswith("/big/"):
        body = b"x" * int(path.split("/")[2])
    elif path not in ("/echo", "/take"):
        body = path.encode()
    if path == "/fail":
        raise RuntimeError("failed on purpose")
    if path == "/wait":
        assert (await receive())["type"] == "http.disconnect"
        left[path].set()
        return
    if path.startswith("/slow/"):
        await anyio.sleep(float(path.split("/")[2]))
    if path.startswith("/whole"):
        assert WHOLE in scope["extensions"]  # (the connection offers it)
        status = int(path.split("/")[2]) if path.count("/") == 2 else 200
        head = b"content-type: text/plain\r\nx-request-id: r1\r\n"
        await send({"type": WHOLE, "status": status, "head": head, "body": body})
        return
    if path in ("/stream", "/fail-late"):  # no length: chunked, in two pieces
        start = {"type": "http.response.start", "status": 200, "headers": []}
        await send(start)
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        if path == "/fail-late":
            raise RuntimeError("failed on purpose, its answer begun")
        await send({"type": "http.response.body", "body": b"two"})
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    if path == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/fail-held":
        raise RuntimeError("failed on purpose, its head held back for its body")
    await send({"type": "http.response.body", "body": body})


@contextmanager
def serving(keep_alive: float, driver: str) -> Iterator[tuple[str, int]]:
    """The test app on ``driver``'s server, on a loop in a thread; its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    with (_asyncio if driver == "asyncio" else _trio)(listener, keep_alive):
        yield listener.getsockname()[:2]
    listener.close()


@contextmanager
def _asyncio(listener: socket.socket, keep_alive: float) -> Iterator[None]:
    """Uvicorn with bls's connection."""
    servers: list[uvicorn.Server] = []
    started = threading.Event()

    async def main() -> None:
        config = uvicorn.Config(
            _echo_path,
            http=connection_class(keep_alive, asyncio.get_running_loop()),
            lifespan="off",
            log_config=None,
            timeout_keep_alive=int(keep_alive),
        )
        server = uvicorn.Server(config)
        servers.append(server)
        started.set()
        await server.serve([listener])

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        deadline = time.monotonic() + 10
        while not servers[0].started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        yield
    finally:
        servers[0].should_exit = True
        thread.join(10)
        assert not thread.is_alive()


@contextmanager
def _trio(listener: socket.socket, keep_alive: float) -> Iterator[None]:
    """bls's own server on trio."""
    from bls.serve import trio_http

    started = threading.Event()
    stopper: list[tuple[trio.lowlevel.TrioToken, anyio.Event]] = []

    async def main() -> None:
        stop = anyio.Event()
        stopper.append((trio.lowlevel.current_trio_token(), stop))
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: trio_http.serve(
                    _echo_path, listener, stop, keep_alive=keep_alive, task_status=task_status
                )
            )
            started.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    try:
        assert started.wait(10), "the server did not start"
        yield
    finally:
        if stopper:
            token, stop = stopper[0]
            trio.from_thread.run_sync(stop.set, trio_token=token)
        thread.join(10)
        assert not thread.is_alive()


def _serves_on(address: tuple[str, int]) -> None:
    """A new client is served (whatever the last one did)."""
    with socket.create_connection(address) as sock:
        sock.sendall(_request("/after"))
        assert http_response(sock).endswith(b"/after")


def _request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: test\r\n\r\n".encode()


def _responses(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` whole responses (Content-Length bodies), in the order they came."""
    data = b""
    bodies = []
    for _ in range(count):
        data = receive_until(sock, lambda d: b"\r\n\r\n" in d, 10, data)
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        data = receive_until(sock, lambda d, n=length: len(d) >= n, 10, rest)
        bodies.append(data[:length])
        data = data[length:]
    assert data == b""
    return bodies


def test_pipelined_requests_are_answered_in_order_on_one_connection(driver: str) -> None:
    with serving(5, driver) as address, socket.create_connection(address) as sock:
        sock.sendall(_request("/one") + _request("/two") + _request("/three"))
        assert _responses(sock, 3) == [b"/one", b"/two", b"/three"]
        sock.sendall(_request("/four"))
        assert _responses(sock, 1) == [b"/four"]


def test_an_idle_connection_closes_after_keep_alive_and_an_active_one_stays_open(
    driver: str,
) -> None:
    keep_alive = 1.0
    with serving(keep_alive, driver) as address:
        with socket.create_connection(address) as sock:
            # After an answer, a request that runs longer than the keep-alive time is not
            # idle time.
            sock.sendall(_request("/first"))
            assert _responses(sock, 1) == [b"/first"]
            sock.sendall(_request("/slow/1.5"))
            assert _responses(sock, 1) == [b"/slow/1.5"]
            # Each request comes 0.6 s after the last answer: within the keep-alive time,
            # but the three span more than it, so each one restarts the idle clock.
            for n in range(3):
                if n:
                    time.sleep(0.6)
                sock.sendall(_request(f"/{n}"))
                assert _responses(sock, 1) == [f"/{n}".encode()]
            answered = time.monotonic()
            sock.settimeout(10)
            assert sock.recv(1) == b""  # the server closed it: idle for keep_alive seconds
            idle = time.monotonic() - answered
        assert keep_alive - 0.05 <= idle < keep_alive + 5, idle
        _serves_on(address)


def test_the_head_says_how_the_body_comes_and_whether_the_connection_stays(driver: str) -> None:
    with serving(5, driver) as address:
        with socket.create_connection(address) as sock:
            sock.sendall(_request("/stream"))
            data = receive_until(sock, lambda d: d.endswith(b"0\r\n\r\n"), 10)
            head, _, body = data.partition(b"\r\n\r\n")
            assert b"transfer-encoding: chunked" in head.lower()
            assert body == b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
            sock.sendall(b"HEAD /head HTTP/1.1\r\nhost: test\r\n\r\n")
            head = receive_until(sock, lambda d: b"\r\n\r\n" in d, 10)
            assert head.startswith(b"HTTP/1.1 200") and b"content-length: 5" in head
            assert head.endswith(b"\r\n\r\n")  # and no body
            sock.sendall(_request("/close"))
            answer = http_response(sock)
            assert b"connection: close" in answer.lower() and answer.endswith(b"/close")
            sock.settimeout(10)
            assert sock.recv(1) == b""  # closed after the answer, as its head said
        _serves_on(address)


def test_a_whole_answer_in_one_message_gets_its_length_the_default_headers_and_a_close(
    driver: str,
) -> None:
    with serving(5, driver) as address:
        with socket.create_connection(address) as sock:
            sock.sendall(_request("/whole") * 2)  # pipelined: both answered, in order
            assert _responses(sock, 2) == [b"/whole", b"/whole"]
            sock.sendall(_request("/whole"))
            head, _, body = http_response(sock).partition(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            assert lines[0] == b"HTTP/1.1 200 OK" and body == b"/whole"
            assert lines[1].startswith(b"date: ")  # the server's default header
            assert b"content-type: text/plain" in lines and b"x-request-id: r1" in lines
            assert b"content-length: 6" in lines and b"connection: close" not in lines
            sock.sendall(b"HEAD /whole HTTP/1.1\r\nhost: test\r\n\r\n")
            head = receive_until(sock, lambda d: b"\r\n\r\n" in d, 10)
            assert b"content-length: 6\r\n" in head and head.endswith(b"\r\n\r\n")
            sock.sendall(b"GET /whole HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
            answer = _closed(sock)  # the connection closes after it, as its head says
            assert b"\r\nconnection: close\r\n" in answer and answer.endswith(b"/whole")
        with socket.create_connection(address) as sock:  # a 204 has no body to send whole
            sock.sendall(_request("/whole/204"))
            assert _closed(sock).startswith(b"HTTP/1.1 500 ")
        _serves_on(address)


def _closed(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        left_s = deadline - time.monotonic()
        assert left_s > 0, f"still open after {timeout}s; read: {data[:300]!r}"
        sock.settimeout(left_s)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return data
        data += chunk


def _post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: test", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_a_body_in_pieces_and_after_100_continue_reaches_the_application_whole(driver: str) -> None:
    with serving(5, driver) as address, socket.create_connection(address) as sock:
        request = _post("/echo", b"0123456789" * 1000)
        head, _, body = request.partition(b"\r\n\r\n")
        sock.sendall(head + b"\r\n\r\n")
        for n in range(0, len(body), 1000):  # each piece in its own segment
            sock.sendall(body[n : n + 1000])
            time.sleep(0.01)
        assert http_response(sock).endswith(b"0123456789" * 1000)
        # A chunked body.
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        )
        assert http_response(sock).endswith(b"\r\n\r\nabcde")
        # Expect: 100-continue: the body is sent once the server asks for it.
        sock.sendall(
            _post("/echo", b"", "expect: 100-continue").replace(
                b"content-length: 0", b"content-length: 4"
            )
        )
        assert receive_until(sock, lambda d: b"\r\n\r\n" in d, 10) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        sock.sendall(b"body")
        assert http_response(sock).endswith(b"\r\n\r\nbody")


def test_a_body_all_there_is_taken_whole_and_one_still_coming_is_received(driver: str) -> None:
    with serving(5, driver) as address, socket.create_connection(address) as sock:
        sock.sendall(_post("/take", b"all of it") * 2)
        assert _responses(sock, 2) == [b"taken all of it", b"taken all of it"]
        # Its second half not sent yet: nothing to take; it is received when it comes.
        untaken.clear()
        request = _post("/take", b"half and half")
        sock.sendall(request[:-8])
        assert untaken.wait(10)
        sock.sendall(request[-8:])
        assert _responses(sock, 1) == [b"received half and half"]
        # Expect: 100-continue: nothing was sent to take; it is asked for and received.
        untaken.clear()
        sock.sendall(_post("/take", b"", "expect: 100-continue").replace(b": 0", b": 4"))
        assert receive_until(sock, lambda d: b"\r\n\r\n" in d, 10) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        assert untaken.is_set()
        sock.sendall(b"body")
        assert _responses(sock, 1) == [b"received body"]
        _serves_on(address)


def test_what_does_not_parse_gets_400_and_a_close_and_the_server_serves_on(driver: str) -> None:
    with serving(5, driver) as address:
        with socket.create_connection(address) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            answer = _closed(sock)
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
            assert b"connection: close" in answer
        with socket.create_connection(address) as sock:
            # A request asking to switch protocols is answered as HTTP/1.1, then closed.
            sock.sendall(
                b"GET /plain HTTP/1.1\r\nhost: test\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
            )
            answer = _closed(sock)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"/plain"), answer
        with socket.create_connection(address) as sock:  # HTTP/1.0: closed after it
            sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
            answer = _closed(sock)
            assert b"connection: close" in answer and answer.endswith(b"/old"), answer
        _serves_on(address)


def test_an_application_that_fails_gets_500_or_a_close_and_the_server_serves_on(
    driver: str,
) -> None:
    with serving(5, driver) as address:
        with socket.create_connection(address) as sock:
            sock.sendall(_request("/fail"))
            answer = _closed(sock)
            assert answer.startswith(b"HTTP/1.1 500") and b"connection: close" in answer
        with socket.create_connection(address) as sock:
            # Its head had not gone out yet (it goes with the body): a 500 still can.
            sock.sendall(_request("/fail-held"))
            answer = _closed(sock)
            assert answer.startswith(b"HTTP/1.1 500") and b"connection: close" in answer
            assert b"200" not in answer, answer
        with socket.create_connection(address) as sock:
            # Its answer had begun: the connection's close ends it, unfinished.
            sock.sendall(_request("/fail-late"))
            answer = _closed(sock)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"3\r\none\r\n")
        _serves_on(address)


def test_a_client_that_leaves_is_seen_by_the_application(driver: str) -> None:
    left["/wait"] = threading.Event()
    with serving(5, driver) as address:
        with socket.create_connection(address) as sock:
            sock.sendall(_request("/wait"))
            time.sleep(0.05)  # (it may leave before or after the request starts: both count)
        assert left["/wait"].wait(10), "the application never heard the client leave"
        # The same with a pipelined request waiting behind it.
        left["/wait"] = threading.Event()
        with socket.create_connection(address) as sock:
            sock.sendall(_request("/wait") + _request("/next"))
            time.sleep(0.05)
        assert left["/wait"].wait(10), "a pipelining client's leaving was not heard"
        _serves_on(address)


def test_a_client_that_reads_slowly_gets_every_byte_in_order(driver: str) -> None:
    size = 32 * 1024 * 1024  # more than the socket buffers hold: writing must wait
    with serving(5, driver) as address, socket.create_connection(address) as sock:
        sock.sendall(_request(f"/big/{size}") + _request("/next"))
        time.sleep(0.3)  # the server fills the buffers, then waits for the reader
        data = bytearray(receive_until(sock, lambda d: b"\r\n\r\n" in d, 10))
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: %d" % size in head
        data = bytearray(body)
        deadline = time.monotonic() + 30
        while True:  # the big body, then the next answer
            assert time.monotonic() < deadline, f"{len(data)} bytes of the body after 30s"
            sock.settimeout(max(deadline - time.monotonic(), 0.01))
            chunk = sock.recv(65536)
            assert chunk, f"closed after {len(data)} bytes of the body"
            data += chunk
            if data.endswith(b"/next"):
                break
        assert data[:size] == b"x" * size
        assert bytes(data[size:]).startswith(b"HTTP/1.1 200") and data.endswith(b"/next")
