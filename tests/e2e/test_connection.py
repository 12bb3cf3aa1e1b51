"""The HTTP connection `bls serve` runs on asyncio (bls/serve/protocol.py), on a real
Uvicorn server and raw sockets: keep-alive on the shared timer (an idle connection closes
on time, never early; one that keeps asking stays open), pipelined requests answered in
order, the head that says how the body comes (a length, chunks, a close, HEAD), and the
server serving new clients afterwards."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from bls.serve.protocol import connection_class
from tests.e2e.rawio import http_response, receive_until


async def _echo_path(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A tiny ASGI app: answers the request's path (``/slow/S`` after S seconds)."""
    assert scope["type"] == "http"
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path.startswith("/slow/"):
        await asyncio.sleep(float(path.split("/")[2]))
    body = path.encode()
    if path == "/stream":  # no length: chunked, in two pieces
        start = {"type": "http.response.start", "status": 200, "headers": []}
        await send(start)
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await send({"type": "http.response.body", "body": b"two"})
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    if path == "/close":
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def serving(keep_alive: float) -> Iterator[tuple[str, int]]:
    """Uvicorn with bls's connection on a loop in a thread; its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    servers: list[uvicorn.Server] = []
    started = threading.Event()

    async def main() -> None:
        config = uvicorn.Config(
            _echo_path,
            http=connection_class(keep_alive),
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
        yield listener.getsockname()[:2]
    finally:
        servers[0].should_exit = True
        thread.join(10)
        listener.close()
        assert not thread.is_alive()


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


def test_pipelined_requests_are_answered_in_order_on_one_connection() -> None:
    with serving(keep_alive=5) as address, socket.create_connection(address) as sock:
        sock.sendall(_request("/one") + _request("/two") + _request("/three"))
        assert _responses(sock, 3) == [b"/one", b"/two", b"/three"]
        sock.sendall(_request("/four"))
        assert _responses(sock, 1) == [b"/four"]


def test_an_idle_connection_closes_after_keep_alive_and_an_active_one_stays_open() -> None:
    keep_alive = 1.0
    with serving(keep_alive) as address:
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
        with socket.create_connection(address) as sock:  # and it still serves
            sock.sendall(_request("/after"))
            assert http_response(sock).endswith(b"/after")


def test_the_head_says_how_the_body_comes_and_whether_the_connection_stays() -> None:
    with serving(keep_alive=5) as address:
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
        with socket.create_connection(address) as sock:
            sock.sendall(_request("/after"))
            assert http_response(sock).endswith(b"/after")
