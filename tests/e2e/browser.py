"""A real headless Chromium for the tests of what a browser sees (Debian's `chromium`;
tests that need it skip without it, unless $BLS_REQUIRE_CHROMIUM says it must be there)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["CHROMIUM", "chromium", "needs_chromium"]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

if CHROMIUM is None and os.environ.get("BLS_REQUIRE_CHROMIUM"):
    raise RuntimeError("BLS_REQUIRE_CHROMIUM is set but no chromium is installed")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


def chromium(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Chromium run headless with ``args`` (a profile of its own under ``tmp_path``),
    to its end (``timeout`` s at most: subprocess.TimeoutExpired past it)."""
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
