"""HTTP load of one class of clients (its own headers), in a process of its own: each
keep-alive connection sends the next request as soon as the last is answered, whatever
its status, or (``rate``: requests a second per connection) no sooner than its turn. For
the admission benchmarks, where a flood of one class runs beside the class measured."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
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
) -> list[tuple[float, int]]:
    parts = urlsplit(url)
    body = b'{"n": 1}'
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    out: list[tuple[float, int]] = []
    until = time.perf_counter() + seconds
    host, port = parts.hostname or "", parts.port or 80
    await asyncio.gather(
        *(_connection(host, port, request, until, out, rate) for _ in range(connections))
    )
    return out


def _main(
    url: str,
    path: str,
    headers: dict[str, str],
    connections: int,
    seconds: float,
    rate: float | None,
    queue: multiprocessing.Queue[list[tuple[float, int]]],
) -> None:
    queue.put(asyncio.run(_load(url, path, headers, connections, seconds, rate)))


class Load:
    """``with Load(url, path, headers, connections, seconds) as load:`` ... ``load.result()``:
    (seconds, status) per request."""

    def __init__(
        self,
        url: str,
        path: str,
        headers: dict[str, str],
        connections: int,
        seconds: float,
        rate: float | None = None,
    ) -> None:
        self.seconds = seconds
        self._queue: multiprocessing.Queue[list[tuple[float, int]]] = multiprocessing.Queue()
        self._proc = multiprocessing.Process(
            target=_main, args=(url, path, headers, connections, seconds, rate, self._queue)
        )

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
