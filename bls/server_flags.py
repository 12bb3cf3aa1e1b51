"""The bounds and knobs of the two commands that serve, ``bls worker`` (its calls, its
metrics endpoint) and ``bls serve`` (each request, and the server), each with its range
and its help; :mod:`bls.cli` adds them to those commands' parsers."""

from __future__ import annotations

import argparse

from .flags import count, seconds

__all__ = ["add_serve_limit_args", "add_worker_call_args", "add_worker_metrics_args"]

MAX_INFLIGHT = 1_000_000  # calls or requests at once: more is a typo, not a plan
MAX_FRAME_BYTES = 2**62  # what ZeroMQ's message size limit (a signed 64-bit) takes


def add_worker_call_args(p: argparse.ArgumentParser) -> None:
    """``bls worker``'s bounds on the calls it takes."""
    p.add_argument(
        "--max-inflight-per-caller",
        type=count(1, MAX_INFLIGHT),
        metavar="N",
        help="calls one caller may have running at once (default: --max-inflight)",
    )
    p.add_argument(
        "--max-inflight",
        type=count(1, MAX_INFLIGHT),
        default=256,
        metavar="N",
        help="calls held at once (running or waiting), 1 to 1000000; more are refused as "
        "'overloaded' (default 256)",
    )
    p.add_argument(
        "--max-running",
        type=count(1, MAX_INFLIGHT),
        metavar="N",
        help="calls run at once; the rest of --max-inflight wait, highest priority first, and "
        "when all are held a call of higher priority displaces the waiting call of lowest "
        "(default: --max-inflight: none wait)",
    )
    p.add_argument(
        "--grace",
        type=seconds(),
        default=10.0,
        metavar="S",
        help="seconds in-flight calls get to finish on SIGTERM; 0 cancels them at once "
        "(default 10)",
    )
    p.add_argument(
        "--max-frame-bytes",
        type=count(1, MAX_FRAME_BYTES),
        metavar="N",
        help="largest request accepted, in bytes (default: [transport] max_frame_bytes, 256 MiB)",
    )


def add_worker_metrics_args(p: argparse.ArgumentParser) -> None:
    """``bls worker``'s load, for an autoscaler."""
    p.add_argument(
        "--metrics-port",
        type=count(0, 65535),
        metavar="PORT",
        help="serve Prometheus /metrics on this port: calls in flight and queued, busy "
        "fraction, for an autoscaler (0 picks a free one, logged; default: none)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --metrics-port listens on (default 127.0.0.1; 0.0.0.0 in a pod)",
    )


def add_serve_limit_args(p: argparse.ArgumentParser) -> None:
    """``bls serve``'s bounds on each request and on the server."""
    p.add_argument(
        "--max-inflight",
        type=count(1, MAX_INFLIGHT),
        default=64,
        metavar="N",
        help="requests handled at once, 1 to 1000000; more wait (--max-queued) or are "
        "answered 429 with Retry-After (default 64)",
    )
    p.add_argument(
        "--max-queued",
        type=count(0, MAX_INFLIGHT),
        default=None,
        metavar="N",
        help="requests that wait for a slot when --max-inflight are running, highest "
        "X-Priority first and tenants in fair turns; more get 429 (default: [admission] "
        "max_queued in bls.toml, else 0)",
    )
    p.add_argument(
        "--request-timeout",
        type=seconds(zero_is_none=True),
        default=300.0,
        metavar="S",
        help="deadline of every request, and the most an X-Request-Timeout header may ask "
        "for (default 300; 0 = none)",
    )
    p.add_argument(
        "--body-timeout",
        type=seconds(zero_is_none=True),
        default=10.0,
        metavar="S",
        help="seconds a request body may take to arrive; a slower one gets 408 (default 10; "
        "0 = no bound but the request's deadline)",
    )
    p.add_argument(
        "--send-timeout",
        type=seconds(positive=True),
        default=60.0,
        metavar="S",
        help="seconds a client may take none of an answer's bytes (its connection's buffer "
        "full) before it is disconnected, and the answer dropped (default 60, as nginx's "
        "send_timeout; Hypercorn keeps its own rules)",
    )
    p.add_argument(
        "--grace",
        type=seconds(),
        default=30.0,
        metavar="S",
        help="seconds in-flight requests get to finish on SIGTERM; 0 cancels them at once "
        "(default 30)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=count(1),
        default=16 * 1024 * 1024,
        metavar="N",
        help="largest request body accepted; larger ones get 413 (default 16 MiB)",
    )
    p.add_argument(
        "--max-header-bytes",
        type=count(1024),
        default=16 * 1024,
        metavar="N",
        help="largest request headers accepted (names and values); more get 431 and the "
        "connection is closed (default 16 KiB; a URL over 8 KiB gets 414)",
    )
    p.add_argument(
        "--trace-keep",
        type=count(0),
        default=100,
        metavar="N",
        help="recent requests whose stage timelines /debug/requests keeps (default 100)",
    )
