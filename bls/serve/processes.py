"""``bls serve --processes N``: N frontend processes on one port, and this one, which
starts, watches and drains them.

Each child is ``bls serve`` with the same arguments, on the same port with
``SO_REUSEPORT`` (the kernel spreads new connections over them), its ``/metrics`` all of
theirs (:mod:`.metrics_share`, a folder this process makes and removes), and its share of
``--max-inflight`` and ``--max-queued``: the limit divided exactly, the remainder to the
first children, so that N processes admit what one would. This process holds the port
(bound, not listening: it takes no connection) from the start, prints one ``ready URL``
once every child is ready, and:

- a child that exits while serving is logged and started again (after
  :data:`RESTART_S`), without its siblings noticing;
- SIGTERM or SIGINT is passed to every child, which drains (``--grace``); it exits 0 once
  all have exited (a child still there ``--grace`` + :data:`EXIT_S` later is killed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence

import anyio
import anyio.abc

from ..config import Config, ConfigError, Limit
from .server import bound

__all__ = ["EXIT_S", "RESTART_S", "auto", "child_args", "divide_limits", "shares", "supervise"]

log = logging.getLogger("bls.serve")

RESTART_S = 1.0  # between a child's death and its replacement
EXIT_S = 10.0  # past --grace, how long a draining child has before it is killed
_READY_S = 600.0  # how long a child may take to start (its stages connected, its models)


def shares(total: int | None, parts: int) -> list[int | None]:
    """``total`` divided exactly over ``parts`` (the first ones get the remainder);
    None stays None."""
    if total is None:
        return [None] * parts
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def divide_limits(config: Config, share: str, max_inflight: int) -> None:
    """Make ``config``'s per-process limits those of child ``I`` of ``N`` (``share`` is
    ``"I/N"``; ``max_inflight``: the child's own ``--max-inflight``): ``[admission]``
    ``max_queued`` and ``reserved``; each entry's and tenant's ``max_inflight`` and
    ``burst`` (divided as :func:`shares` does, at least 1) and ``rate`` (divided by N);
    ``[runs]`` ``max_running`` (at least 1) and ``max_event_streams``. (``[runs]
    max_queued`` counts the runs waiting in the store, all processes' already.)"""
    try:
        index, count = (int(part) for part in share.split("/"))
    except ValueError:
        index = count = -1
    if not 0 <= index < count:
        raise ConfigError(f"--share {share!r}: expected I/N, 0 <= I < N")

    def part(total: int, least: int = 0) -> int:
        return max(least, shares(total, count)[index] or 0)

    admission = config.admission
    admission.processes = count
    admission.max_queued = part(admission.max_queued)
    admission.reserved = min(part(admission.reserved), max_inflight - 1)
    for limits in (admission.entries, admission.tenants):
        for name, limit in limits.items():
            limits[name] = Limit(
                max_inflight=None if limit.max_inflight is None else part(limit.max_inflight, 1),
                rate=None if limit.rate is None else limit.rate / count,
                burst=None if limit.burst is None else part(limit.burst, 1),
                weight=limit.weight,
            )
    runs = config.runs
    runs.max_running = part(runs.max_running, 1)
    runs.max_event_streams = part(runs.max_event_streams)


def supervise(
    argv: Sequence[str],
    processes: int,
    host: str,
    port: int,
    grace: float,
    limits: dict[str, int | None],
    on_ready: Callable[[str], None],
) -> int:
    """Run ``processes`` children of ``bls serve ARGV`` (see the module's docstring);
    ``limits``: ``--max-inflight`` and ``--max-queued`` as given, to divide."""
    held = bound(host, port, reuse_port=True)  # (the port held, not listening)
    folder = tempfile.mkdtemp(prefix="bls-metrics-")
    try:
        port = held.getsockname()[1]
        children = _Children(argv, processes, port, folder, limits)
        return anyio.run(children.run, grace, on_ready)
    finally:
        held.close()
        shutil.rmtree(folder, ignore_errors=True)


# The flags a child gets a value of its own for, instead of the one given.
_OWN = ("--processes", "--port", "--max-inflight", "--max-queued", "--share")


def child_args(argv: Sequence[str]) -> list[str]:
    """``bls serve``'s arguments (after ``serve``) less the flags each child is given
    its own value of."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _OWN:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in _OWN)):
            out.append(arg)
    return out


class _Children:
    def __init__(
        self,
        argv: Sequence[str],
        processes: int,
        port: int,
        folder: str,
        limits: dict[str, int | None],
    ) -> None:
        self.argvs = []
        divided = {flag: shares(total, processes) for flag, total in limits.items()}
        for i in range(processes):
            own = [*argv, "--port", str(port), "--reuse-port", "--shared-metrics", folder]
            own += ["--share", f"{i}/{processes}"]
            for flag, parts in divided.items():
                if parts[i] is not None:
                    own += [flag, str(parts[i])]
            self.argvs.append([sys.argv[0], "serve", *own])
        self.live: dict[int, anyio.abc.Process] = {}
        self.stopping = False
        self.exited = anyio.Event()  # set as a child exits (a drain waits for them all)

    async def run(self, grace: float, on_ready: Callable[[str], None]) -> int:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:
                ready = []
                for i in range(len(self.argvs)):
                    ready.append(await tg.start(self._keep, i))
                on_ready(ready[0])
                log.info("serving with %d processes: %s", len(self.argvs), list(self.pids()))
                async for signum in signals:
                    log.info(
                        "%s: draining %d processes", signal.Signals(signum).name, len(self.live)
                    )
                    self.stopping = True
                    for child in list(self.live.values()):
                        with contextlib.suppress(ProcessLookupError):
                            child.send_signal(signal.SIGTERM)
                    with anyio.move_on_after(grace + EXIT_S):
                        while self.live:
                            self.exited = anyio.Event()
                            await self.exited.wait()
                    for child in list(self.live.values()):
                        log.warning("process %d did not exit; killing it", child.pid)
                        with contextlib.suppress(ProcessLookupError):
                            child.kill()
                    tg.cancel_scope.cancel()
                    break
        return 0

    def pids(self) -> list[int]:
        return [child.pid for child in self.live.values()]

    async def _keep(
        self, i: int, *, task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Child ``i``: started, its ready line reported (the first time), started again
        whenever it exits before a drain."""
        first = True
        while True:
            child = await anyio.open_process(self.argvs[i], stdout=-1, stderr=None)
            self.live[i] = child
            try:
                line = await _ready_line(child)
                if first:
                    if line is None:
                        raise OSError(f"frontend process {i} did not become ready")
                    task_status.started(line)
                    first = False
                code = await child.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    if child.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            child.kill()
                        await child.wait()
                    await child.aclose()
                self.live.pop(i, None)
                self.exited.set()
            if self.stopping:
                return
            log.warning("frontend process %d exited (%s); starting another", child.pid, _how(code))
            await anyio.sleep(RESTART_S)


async def _ready_line(child: anyio.abc.Process) -> str | None:
    """The URL of the child's ``ready URL`` line (None: it exited first, or took too
    long); its stdout is read on, and dropped, after it."""
    assert child.stdout is not None
    buffered = b""
    with anyio.move_on_after(_READY_S):
        async for chunk in child.stdout:
            buffered += chunk
            while b"\n" in buffered:
                line, _, buffered = buffered.partition(b"\n")
                if line.startswith(b"ready "):
                    return line.decode().split()[1]
            buffered = buffered[-4096:]
    return None


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {-code}"
    return f"exit status {code}"


def auto() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1
