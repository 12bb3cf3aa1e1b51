"""The console: stdout for results, stderr for everything else; the flags every command shares.

``claim_stdout`` keeps the real stdout for :func:`emit` and points file descriptor 1 at
stderr, so nothing a library, a C extension or a child process prints can land between
the results a user pipes into ``jq``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .paths import missing

__all__ = [
    "BACKENDS",
    "UsageError",
    "add_backend_arg",
    "add_binding_args",
    "add_common_args",
    "add_connect_timeout_arg",
    "add_discovery_args",
    "add_verbose_arg",
    "apply_connect_timeout",
    "apply_discovery",
    "claim_stdout",
    "count",
    "emit",
    "read_input",
    "ready_line",
    "seconds",
    "setup_logging",
]

BACKENDS = ("asyncio", "trio")

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


def emit(line: bytes | str) -> None:
    """Write one result line to stdout (see :func:`claim_stdout`)."""
    out = _results if _results is not None else sys.stdout.buffer
    out.write((line.encode() if isinstance(line, str) else line) + b"\n")
    out.flush()


def ready_line(address: str, unreachable: list[str]) -> str:
    """The line ``bls serve`` and ``bls worker`` print once they take work: ``ready ADDR``,
    and while some stage this process calls has no replica answering yet, which ones
    (it started anyway; their calls fail fast with 'unavailable' until one answers)."""
    if not unreachable:
        return f"ready {address}"
    return f"ready {address} (not reachable yet: {', '.join(unreachable)})"


def add_verbose_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show everything libraries and engines print, their known-harmless warnings "
        "included (also: BLS_VERBOSE=1)",
    )


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


def add_common_args(p: argparse.ArgumentParser) -> None:
    """What every command takes."""
    p.add_argument(
        "--traceback",
        action="store_true",
        help="show the full traceback of an error (also: BLS_TRACEBACK=1)",
    )


def add_binding_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bind",
        action="append",
        default=[],
        metavar="NAME=TARGET",
        help="bind a stage: module:attr, file.py:attr, or tcp://HOST:PORT[,tcp://...] "
        "(repeatable; wins over bls.toml and --config)",
    )
    p.add_argument(
        "--config", metavar="FILE", help="a bls.toml to apply over the one beside the script"
    )


def add_connect_timeout_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--connect-timeout",
        type=seconds(positive=True),
        metavar="S",
        help=f"how long to wait for each remote stage's first replica to answer; {what} "
        "(default: [transport] connect_timeout_s in bls.toml, 5)",
    )


def apply_connect_timeout(config: object, value: float | None) -> None:
    """``--connect-timeout`` over the configuration's ``[transport]`` setting."""
    if value is not None:
        config.transport.connect_timeout_s = value  # type: ignore[attr-defined]


def add_discovery_args(p: argparse.ArgumentParser, *, worker: bool = False) -> None:
    what = (
        "register this worker in etcd (etcd://HOST:2379) under its stage name; also where "
        "its own stages bound to etcd:NAME are found"
        if worker
        else 'etcd://HOST:2379, where stages bound to etcd:NAME (or discover = "NAME" in '
        "bls.toml) find their workers"
    )
    p.add_argument("--discovery", metavar="URL", help=what)
    p.add_argument(
        "--namespace",
        metavar="NS",
        help="the etcd namespace: keys under /NS/stages/ (default: bls)",
    )
    if worker:
        p.add_argument(
            "--advertise",
            metavar="ADDR",
            help="the address callers reach this worker at, as registered in etcd "
            "(default: the --listen address, unless it listens on all interfaces)",
        )


def apply_discovery(config: object, args: argparse.Namespace) -> None:
    """``--discovery``/``--namespace`` over the configuration's ``[transport]``."""
    transport = config.transport  # type: ignore[attr-defined]
    if args.discovery:
        transport.discovery = args.discovery
    if args.namespace:
        transport.namespace = args.namespace


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", choices=BACKENDS, default="asyncio", help="event loop (default: asyncio)"
    )


# -- numbers on the command line: each flag's range is checked as it is parsed, so a
# value out of range is refused at start-up (argparse's usage line, exit 2) naming the
# flag, never found out at the first request.


def seconds(*, zero_is_none: bool = False, positive: bool = False) -> Callable[[str], float | None]:
    """A number of seconds: finite or ``inf``, never negative or NaN. ``zero_is_none``:
    0 means no limit (None); ``positive``: 0 is refused."""

    def parse(text: str) -> float | None:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isnan(value) or value < 0 or (positive and value == 0):
            least = "more than 0" if positive else "0 or more"
            raise argparse.ArgumentTypeError(f"expected {least} seconds, got {text!r}")
        if zero_is_none and value == 0:
            return None
        return value

    return parse


def count(least: int, most: int | None = None) -> Callable[[str], int]:
    """A whole number from ``least`` to ``most`` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least or (most is not None and value > most):
            wanted = f"from {least} to {most}" if most is not None else f"{least} or more"
            raise argparse.ArgumentTypeError(f"expected a whole number {wanted}, got {text!r}")
        return value

    return parse


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
