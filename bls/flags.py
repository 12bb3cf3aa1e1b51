"""The flags several ``bls`` commands share, and the argument types that check numbers as
they are parsed (a value out of range is refused at start-up naming the flag, never
found out at the first request)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

__all__ = [
    "BACKENDS",
    "add_backend_arg",
    "add_binding_args",
    "add_common_args",
    "add_connect_timeout_arg",
    "add_discovery_args",
    "add_verbose_arg",
    "count",
    "origin",
    "seconds",
]

BACKENDS = ("asyncio", "trio")


def add_verbose_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verbose",
        action="store_true",
        help="show everything libraries and engines print, their known-harmless warnings "
        "included (also: BLS_VERBOSE=1)",
    )


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


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend", choices=BACKENDS, default="asyncio", help="event loop (default: asyncio)"
    )


# Numbers: each flag's range is checked as it is parsed, so a value out of range is
# refused at start-up (argparse's usage line, exit 2) naming the flag, never found out at
# the first request.


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


# An origin as a browser sends it: scheme://host[:port], nothing after.
_ORIGIN = re.compile(r"https?://([a-z0-9.\-]+|\[[0-9a-f:.]+\])(:[0-9]{1,5})?")


def origin(text: str) -> str:
    """``*``, or a web origin (``https://app.example:8443``; lower-cased, a trailing
    slash dropped): ``--cors-origin``'s value."""
    if text == "*":
        return text
    value = text.strip().lower().removesuffix("/")
    if not _ORIGIN.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"expected * or an origin, scheme://host[:port] (http or https, no path) as a "
            f"browser sends it, got {text!r}"
        )
    return value
