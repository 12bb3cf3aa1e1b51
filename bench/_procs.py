"""Starting the processes a benchmark measures (`bls worker`, `bls serve`, floors)."""

from __future__ import annotations

import subprocess


def spawn(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    """Start ``args`` and wait for its ``ready ADDR`` line; (process, ADDR)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("ready "):
            return proc, line.split()[1]
    raise RuntimeError(f"{args} did not start")
