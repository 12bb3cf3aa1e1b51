"""The terminal: stdout for results, stderr for everything else, and the request a
command reads (``--input``).

``claim_stdout`` keeps the real stdout for :func:`emit` and points file descriptor 1 at
stderr, so nothing a library, a C extension or a child process prints can land between
the results a user pipes into ``jq``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import BinaryIO

from .paths import missing

__all__ = [
    "UsageError",
    "claim_stdout",
    "counted",
    "emit",
    "loggable",
    "read_input",
    "ready_line",
    "setup_logging",
]

_results: BinaryIO | None = None


def claim_stdout() -> None:
    """Keep the real stdout for results and point file descriptor 1 at stderr.

    Libraries print progress to stdout (the tokenizer trainer, C extensions, engine
    subprocesses that inherit the descriptor); after this, all of that lands on stderr
    and only :func:`emit` writes to what the user pipes into ``jq``.
    """
    global _results
    if _results is not None:
        return
    sys.stdout.flush()
    _results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)


def loggable(text: str, limit: int = 2048) -> str:
    """``text`` (a request's path, say) as a log line may hold it: control and other
    unprintable characters escaped (``\\r``, ``\\x1b``), so that a client cannot write a
    line of its own into the log, and cut to ``limit`` characters."""
    if text.isprintable() and len(text) <= limit:
        return text
    if len(text) > limit:
        text = text[:limit]
        cut = "..."
    else:
        cut = ""
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return escaped + cut


def emit(line: bytes | str) -> None:
    """Write one result line to stdout (see :func:`claim_stdout`)."""
    out = _results if _results is not None else sys.stdout.buffer
    out.write((line.encode() if isinstance(line, str) else line) + b"\n")
    out.flush()


def counted(n: int, thing: str) -> str:
    """``n`` and ``thing``, plural but for one (``1 line``, ``3 lines``)."""
    return f"{n} {thing}{'s' * (n != 1)}"


def ready_line(address: str, unreachable: list[str]) -> str:
    """The line ``bls serve`` and ``bls worker`` print once they take work: ``ready ADDR``,
    and while some stage this process calls has no replica answering yet, which ones
    (it started anyway; their calls fail fast with 'unavailable' until one answers)."""
    if not unreachable:
        return f"ready {address}"
    return f"ready {address} (not reachable yet: {', '.join(unreachable)})"


def setup_logging(level: str, *, libraries: str | None = None, verbose: bool = False) -> None:
    """Log to stderr: ``level`` for bls, ``libraries`` (default the same) for the rest.
    ``verbose`` lets engines print everything (:mod:`bls.models.noise` reads it from the
    environment, as the engines' own processes do)."""
    if verbose:
        os.environ["BLS_VERBOSE"] = "1"
    logging.basicConfig(
        level=getattr(logging, (libraries or level).upper()),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("bls").setLevel(getattr(logging, level.upper()))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per etcd call otherwise


class UsageError(Exception):
    """Bad command-line input (not a stage failure): one ``error:`` line, exit 1."""


def read_input(spec: str | None) -> bytes:
    """The request body ``--input`` names: JSON itself, ``@FILE``, or stdin when absent."""
    if spec is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no input: pass --input JSON, --input @FILE, or pipe JSON on stdin")
        data = sys.stdin.buffer.read()
    elif spec.startswith("@"):
        try:
            data = Path(spec[1:]).read_bytes()
        except FileNotFoundError:
            raise UsageError(missing(spec[1:], what="input file")) from None
        except OSError as exc:
            raise UsageError(f"cannot read input file {spec[1:]!r}: {exc.strerror}") from None
    else:
        data = spec.encode()
        if _names_a_file(spec):
            raise UsageError(
                f"--input takes JSON or @FILE; {spec!r} is not JSON but names a file: "
                f"did you mean --input @{spec}?"
            )
    if not data.strip():
        raise UsageError("empty input: the request must be a JSON value")
    return data


def _names_a_file(text: str) -> bool:
    """Whether ``text`` is not JSON but the name of a file (``--input request.json``)."""
    try:
        json.loads(text)
    except ValueError:
        return Path(text).is_file()
    return False
