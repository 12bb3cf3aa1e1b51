"""HTTP load of one class of clients (its own headers), in a process of its own: each
keep-alive connection sends the next request as soon as the last is answered, whatever
its status, or (``rate``: requests a second per connection) no sooner than its turn. For
the admission benchmarks, where a flood of one class runs beside the class measured, and
for bench/frontend.py (one class, on uvloop, after a short warm-up)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from typing import Any
from urllib.parse import urlsplit


async def _connection(
    host: str,
    port: int,
    request: bytes,
    until: float,
    out: list[tuple[float, int]],
    rate: float | None,
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    perf = time.perf_counter
    turn = perf()
    try:
        while perf() < until:
            if rate is not None:
                turn += 1 / rate
                if turn > perf():
                    await asyncio.sleep(turn - perf())
                else:
                    turn = perf()  # late (the last answer took longer): no catching up
            t0 = perf()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            out.append((perf() - t0, status))
    finally:
        writer.close()


async def _load(
    url: str,
    path: str,
    headers: dict[str, str],
    connections: int,
    seconds: float,
    rate: float | None,
    body: bytes,
    warm: float,
) -> list[tuple[float, int]]:
    parts = urlsplit(url)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    out: list[tuple[float, int]] = []
    host, port = parts.hostname or "", parts.port or 80
    if warm:  # connections, first-call paths: one connection, not measured
        await _connection(host, port, request, time.perf_counter() + warm, [], None)
    until = time.perf_counter() + seconds
    await asyncio.gather(
        *(_connection(host, port, request, until, out, rate) for _ in range(connections))
    )
    return out


def _main(
    queue: multiprocessing.Queue[list[tuple[float, int]]], uvloop: bool, nice: int, *args: Any
) -> None:
    if nice:
        os.nice(nice)
    if uvloop:
        try:
            import uvloop as loop

            loop.install()
        except ImportError:
            pass
    queue.put(asyncio.run(_load(*args)))


class Load:
    """``with Load(url, path, headers, connections, seconds) as load:`` ... ``load.result()``:
    (seconds, status) per request. ``body``: what each POSTs; ``warm``: seconds of one
    connection's requests first, not measured; ``uvloop``: run on it when installed;
    ``nice``: the process's niceness added (a flood that must not take the CPU from the
    server and the client measured beside it, as clients on other machines would not)."""

    def __init__(
        self,
        url: str,
        path: str,
        headers: dict[str, str],
        connections: int,
        seconds: float,
        rate: float | None = None,
        *,
        body: bytes = b'{"n": 1}',
        warm: float = 0.0,
        uvloop: bool = False,
        nice: int = 0,
    ) -> None:
        self.seconds = seconds + warm
        self._queue: multiprocessing.Queue[list[tuple[float, int]]] = multiprocessing.Queue()
        args = (url, path, headers, connections, seconds, rate, body, warm)
        self._proc = multiprocessing.Process(target=_main, args=(self._queue, uvloop, nice, *args))

    def __enter__(self) -> Load:
        self._proc.start()
        return self

    def result(self) -> list[tuple[float, int]]:
        out = self._queue.get(timeout=self.seconds + 60)
        self._proc.join()
        return out

    def __exit__(self, *exc: object) -> None:
        if self._proc.is_alive():
            self._proc.terminate()
        self._proc.join()
