"""Starting the processes a benchmark measures (`bls worker`, `bls serve`, floors), and
reading what they used from /proc."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

CLOCK = os.sysconf("SC_CLK_TCK")
BLS = str(Path(sys.executable).with_name("bls"))
SERVING_APP = str(Path(__file__).resolve().parent / "serving" / "app.py")


def spawn(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """Start ``args`` (with ``env`` added to the environment) and wait for its ``ready
    ADDR`` line; (process, ADDR)."""
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **env} if env else None,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready "):
            return proc, line.split()[1]
    raise RuntimeError(f"{args} did not start")


def serve_app(echo: str, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """``bls serve bench/serving/app.py`` with its stages bound (``echo`` at the address
    given, ``local`` and ``tick`` inline), quiet; (process, URL)."""
    app = SERVING_APP
    binds = ["--bind", f"echo={echo}", "--bind", f"local={app}:echo", "--bind", f"tick={app}:tick"]
    quiet = ["--no-access-log", "--log-level", "warning"]
    return spawn([BLS, "serve", app, "--port", "0", *binds, *quiet, *flags])


def stop_all(procs: Iterable[subprocess.Popen[str]]) -> None:
    """SIGTERM every process, then wait for each."""
    procs = list(procs)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(10)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK


def rss_bytes(pid: int) -> int:
    """The process's resident memory now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def spread(values: list[float], fmt: str = ".2f") -> str:
    """``median [min-max]``, for ratios taken over rounds."""
    low, mid, high = (format(v, fmt) for v in (min(values), statistics.median(values), max(values)))
    return f"{mid} [{low}-{high}]"
