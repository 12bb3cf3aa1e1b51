"""Where a relative path is looked for, and where else a missing file is.

One rule: a path written in a file is relative to that file's folder (``inline =
"workers.py:shout"`` in ``examples/interfaces/bls.toml`` is
``examples/interfaces/workers.py``); a path given on the command line (SCRIPT,
``--config``, ``--bind``, ``--input @FILE``, ``bls worker TARGET``) is relative to the
current directory. When a file is not where the rule puts it, the error says so and names
the files of that name below the current directory, if there are any.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["missing"]

_SKIP = {".git", ".venv", "venv", "node_modules", "__pycache__", "site-packages", ".tox"}
_MAX_DIRS = 5000  # the look below the current directory stops here (a big home folder)
_MAX_DEPTH = 5


def missing(given: str | Path, looked: Path | None = None, what: str = "file") -> str:
    """``no such file: GIVEN (looked for LOOKED; there is ELSEWHERE)``: ``looked`` is the
    resolved path (said when it differs from ``given``), ``ELSEWHERE`` the files of that
    name below the current directory."""
    given = str(given)
    notes = [f"looked for {looked}"] if looked is not None and str(looked) != given else []
    found = _elsewhere(Path(given), looked)
    if found:
        notes.append(f"there is {' and '.join(found)}")
    return f"no such {what}: {given}" + (f" ({'; '.join(notes)})" if notes else "")


def _elsewhere(given: Path, looked: Path | None) -> list[str]:
    """Up to three files below the current directory whose path ends as ``given`` does."""
    tail = tuple(p for p in given.parts if p not in ("..", ".", "/"))
    if not tail:
        return []
    cwd = Path.cwd()
    found: list[str] = []
    visited = 0
    for top, dirs, files in os.walk(cwd):
        visited += 1
        depth = len(Path(top).relative_to(cwd).parts)
        dirs[:] = sorted(d for d in dirs if d not in _SKIP and not d.startswith("."))
        if depth >= _MAX_DEPTH:
            dirs.clear()
        if tail[-1] in files:
            candidate = Path(top) / tail[-1]
            if candidate.parts[-len(tail) :] == tail and candidate != looked:
                found.append(os.path.relpath(candidate, cwd))
                if len(found) == 3:
                    break
        if visited >= _MAX_DIRS:
            break
    return found
