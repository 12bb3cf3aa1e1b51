"""Reading raw sockets in tests without hanging: every read has a deadline, and a peer
that closes (``b""``) is an error that says what had arrived, never an endless loop."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import zmq


def receive_until(
    sock: socket.socket, done: Callable[[bytes], bool], timeout: float = 30, data: bytes = b""
) -> bytes:
    """Read from ``sock`` until ``done(everything read so far)`` (``data``: what was read
    before); AssertionError when the peer closes first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not done(data):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"not there within {timeout}s; read so far: {data[:300]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue  # the deadline check above says so
        if not chunk:
            raise AssertionError(f"the peer closed the connection; read so far: {data[:300]!r}")
        data += chunk
    return data


def http_response(sock: socket.socket, timeout: float = 30) -> bytes:
    """One whole HTTP/1.1 response with a Content-Length body."""
    data = receive_until(sock, lambda d: b"\r\n\r\n" in d, timeout)
    head = data.partition(b"\r\n\r\n")[0]
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    return receive_until(sock, lambda d: len(d.partition(b"\r\n\r\n")[2]) >= length, timeout, data)


def recv_frames(sock: zmq.Socket[Any], timeout: float = 10) -> list[bytes]:
    """The next message on a raw ZeroMQ socket; AssertionError after ``timeout`` s."""
    if not sock.poll(int(timeout * 1000)):
        raise AssertionError(f"no message within {timeout}s")
    return sock.recv_multipart()
