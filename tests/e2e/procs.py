"""Starting real ``bls worker`` / ``bls serve`` processes for tests, and always stopping them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .cli import BLS, ROOT, bls_env


class Proc:
    """A running ``bls`` process; ``address`` is what it printed after ``ready``."""

    def __init__(
        self, popen: subprocess.Popen[str], ready_line: str, lines: list[str], out: list[str]
    ) -> None:
        self.popen = popen
        self.ready_line = ready_line  # "ready ADDR [(not reachable yet: ...)]"
        self.address = ready_line.split()[1]
        self.lines = lines  # stderr lines, collected as they come
        self.out = out  # stdout lines after the ready line

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def wait(self, timeout: float = 15) -> int:
        return self.popen.wait(timeout)

    def log(self) -> str:
        return "".join(self.lines)

    def stats(self) -> dict[str, int]:
        """The counters a worker logs when it stops (after SIGTERM and wait())."""
        for line in reversed(self.lines):
            if "stopped ({" in line:
                return json.loads(line[line.index("({") + 1 : line.rindex("})") + 1])
        raise AssertionError(f"no stats line in the worker's log:\n{self.log()}")


def start(
    args: list[str],
    *,
    ready_timeout: float = 30,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    program: list[str] | None = None,
) -> Proc:
    """Start ``bls ARGS`` (or ``program ARGS``) and wait (bounded) for its ``ready ADDR``
    line."""
    argv = [*(program or [BLS]), *args]
    popen = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        env=env or bls_env(),
        start_new_session=True,
    )
    lines: list[str] = []
    assert popen.stderr is not None and popen.stdout is not None
    threading.Thread(target=lambda: lines.extend(popen.stderr), daemon=True).start()  # type: ignore[arg-type]
    ready: list[str] = []
    out: list[str] = []
    got = threading.Event()

    def read_stdout() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            if line.startswith("ready ") and not got.is_set():
                ready.append(line.rstrip("\n"))
                got.set()
            else:
                out.append(line)
        got.set()  # (its output ended: it exited, ready or not)

    threading.Thread(target=read_stdout, daemon=True).start()
    if not got.wait(ready_timeout) or not ready:
        stop(popen)
        raise RuntimeError(f"{' '.join(argv)} did not become ready:\n{''.join(lines)}")
    return Proc(popen, ready[0], lines, out)


def stop(popen: subprocess.Popen[str]) -> None:
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    popen.wait(10)


def drain(procs: list[Proc], timeout: float = 40) -> None:
    """SIGTERM each process, the last started first, and let it drain for up to
    ``timeout`` seconds (an engine shuts down cleanly); whatever is left is killed."""
    for proc in reversed(procs):
        proc.signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        finally:
            stop(proc.popen)


@contextmanager
def worker(
    target: str, *extra: str, listen: str = "tcp://127.0.0.1:0", env: dict[str, str] | None = None
) -> Iterator[Proc]:
    """A ``bls worker TARGET`` process for the duration of the block."""
    proc = start(["worker", target, "--listen", listen, *extra], env=env)
    try:
        yield proc
    finally:
        stop(proc.popen)


@contextmanager
def serving(
    script: str, *extra: str, backend: str = "asyncio", ready_timeout: float = 30
) -> Iterator[Proc]:
    """A ``bls serve SCRIPT`` process on a free port for the duration of the block."""
    proc = start(
        ["serve", script, "--port", "0", "--backend", backend, *extra], ready_timeout=ready_timeout
    )
    try:
        yield proc
    finally:
        stop(proc.popen)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01) -> float:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until true; return the seconds it took. AssertionError on timeout."""
    start_t = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start_t
        if time.monotonic() - start_t > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def last_spans(url: str) -> list[dict[str, object]]:
    """The spans of the most recent request a `bls serve` at ``url`` finished, as
    ``/debug/requests`` gives them, the caller's own (not those its workers reported)."""
    import httpx

    accept = {"accept": "application/json"}
    trace = httpx.get(f"{url}/debug/requests", headers=accept).json()[0]
    spans = httpx.get(f"{url}/debug/requests/{trace['id']}", headers=accept).json()["spans"]
    return [span for span in spans if not span["remote"]]


def free_port() -> int:
    """A loopback TCP port free now (for a server that must be started on a known one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
