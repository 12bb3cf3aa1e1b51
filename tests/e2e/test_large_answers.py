"""Large answers against clients that do not read them, on a real `bls serve`: the bytes
being sent at once are bounded (past the bound, 503 with Retry-After), a client that takes
nothing for `--send-timeout` is disconnected, and the server then serves the same large
answer whole to a new client."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .procs import Proc, drain, start, wait_for

SCRIPT = """
import bls


@bls.script
async def big(req):
    for _ in range(req["n"]):
        yield "x" * 65536
"""
ITEMS = 256  # a 16 MiB result: sixteen fit in the 256 MiB sent at once


@pytest.fixture(params=["asyncio", "trio"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Proc]:
    script = tmp_path / "big.py"
    script.write_text(SCRIPT)
    store = f"sqlite://{tmp_path / 'runs.sqlite3'}"
    argv = ["serve", str(script), "--port", "0", "--runs", store, "--send-timeout", "2"]
    proc = start([*argv, "--backend", request.param])
    try:
        yield proc
    finally:
        drain([proc])


def _stalled(address: str, path: str, n: int) -> list[socket.socket]:
    """``n`` connections that ask for ``path`` and read nothing (a tiny receive buffer)."""
    host, port = address.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(sock)
    return socks


def _head(sock: socket.socket) -> tuple[int, bytes]:
    """The status and what came with it (the whole answer of a small one)."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    return int(data[9:12]), data


def test_large_answers_to_clients_that_do_not_read_are_bounded_then_dropped(
    server: Proc,
) -> None:
    url = server.address
    made = httpx.post(
        f"{url}/v1/scripts/big", json={"n": ITEMS}, headers={"prefer": "respond-async"}
    )
    path = made.headers["location"]
    wait_for(lambda: httpx.get(f"{url}{path}").json()["status"] == "succeeded", 30, 0.1)

    socks = _stalled(url, path, 24)
    try:
        heads = [_head(sock) for sock in socks]
        statuses = sorted(status for status, _ in heads)
        assert statuses.count(200) == 15, statuses  # 15 of 16 MiB fit in 256 MiB
        assert statuses.count(503) == 9, statuses
        refused = next(data for status, data in heads if status == 503)
        assert b"retry-after: 1\r\n" in refused.lower()
        assert b'"type":"too_many_large_answers"' in refused
        # (Meanwhile the server answers small requests at once.)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        # Those that took nothing are dropped after --send-timeout: the bytes are free.
        wait_for(lambda: server.log().count("took none of an answer for 2s") == 15, 30)
    finally:
        for sock in socks:
            sock.close()
    whole = httpx.get(f"{url}{path}", timeout=30)
    assert whole.status_code == 200
    assert json.loads(whole.content)["result"] == ["x" * 65536] * ITEMS
