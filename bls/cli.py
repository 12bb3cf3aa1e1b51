"""The ``bls`` command's parser: ``run``, ``check``, ``worker``, ``serve``, ``keygen``,
``bench``, every flag with its range and its help; the handlers are :mod:`bls.commands`.

Every failure a user can cause prints one ``error: ...`` line on stderr and exits 1 (a flag
out of its range is argparse's usage line, exit 2); tracebacks are for bugs
(``--traceback``, on every command, or ``BLS_TRACEBACK=1`` shows them). Stdout carries
results only: JSON lines from ``run``, ``ready`` lines from ``serve``/``worker``; anything
else written there (library progress bars, C-level prints, child processes) is sent to
stderr by :func:`bls.console.claim_stdout`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__, commands
from .config import ConfigError
from .console import UsageError
from .errors import DeadlineExceeded, InvalidRequest, StageError, StageNotBound
from .flags import (
    add_backend_arg,
    add_binding_args,
    add_common_args,
    add_connect_timeout_arg,
    add_discovery_args,
    add_verbose_arg,
    count,
    seconds,
)
from .policy import PolicyError
from .recording import RecordError
from .replay import Divergence
from .runtime import BindingError

__all__ = ["main"]

MAX_INFLIGHT = 1_000_000  # calls or requests at once: more is a typo, not a plan
MAX_FRAME_BYTES = 2**62  # what ZeroMQ's message size limit (a signed 64-bit) takes


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bls",
        description="Run, check and serve bls pipeline scripts.",
    )
    parser.add_argument("--version", action="version", version=f"bls {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_run, _check, _replay, _worker, _serve, _keygen, _bench):
        add(sub)
    return parser


def _run(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="run one request through a script",
        description="Run one request through a script entrypoint. A unary entry prints its "
        "result as one JSON line; a streaming entry prints one JSON line per item.",
    )
    run.add_argument("script", help="path to the script file")
    run.add_argument("--entry", help="entrypoint name (optional when the script has one)")
    run.add_argument(
        "--input",
        metavar="JSON",
        help="the request as JSON, or @FILE to read it from a file (default: stdin)",
    )
    run.add_argument(
        "--timeout",
        type=seconds(zero_is_none=True),
        metavar="S",
        help="deadline for the request, seconds (default and 0: none)",
    )
    run.add_argument(
        "--record",
        metavar="FILE",
        help="write the request's stage calls (each request, item, error and when) to FILE, "
        "for bls replay",
    )
    run.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="bls's own messages on stderr, e.g. start-up progress (default info; "
        "libraries log warnings and up)",
    )
    add_verbose_arg(run)
    add_common_args(run)
    add_binding_args(run)
    add_backend_arg(run)
    add_connect_timeout_arg(run, "then the run fails naming the stage")
    add_discovery_args(run)
    run.set_defaults(handler=commands.run)


def _replay(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="run a script again on a recorded request, every stage answered from the record",
        description="Run SCRIPT on the request recorded in FILE (bls run --record, bls serve "
        "--record), every stage answered as it was then: no worker, model or bls.toml is "
        "needed. Prints the result as bls run does. Exits 1 naming the first divergence "
        "(which call, which field, what the record has and what the script gave) when the "
        "script now calls or answers differently.",
    )
    p.add_argument("file", help="the record")
    p.add_argument("script", help="path to the script file")
    p.add_argument("--entry", help="the entry to run (default: the one the record names)")
    add_common_args(p)
    p.set_defaults(handler=commands.replay)


def _check(sub: Any) -> None:
    check = sub.add_parser(
        "check",
        help="check that every stage a script uses is bound and type-compatible",
        description="Exit 0 when every stage name the script uses is bound, called in the "
        "right mode (unary/streaming) and type-compatible with its worker; otherwise print "
        "each problem and exit 1. Workers are not set up (no models load).",
    )
    check.add_argument("script", help="path to the script file")
    add_common_args(check)
    add_binding_args(check)
    check.set_defaults(handler=commands.check)


def _worker(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="serve one stage over ZeroMQ",
        description="Serve TARGET (module:attr, file.py:attr, a bls.Worker, or a script "
        "entrypoint) as a remote stage. Prints 'ready ADDR' once it accepts calls; on "
        "SIGTERM/SIGINT it stops accepting, lets in-flight calls finish within --grace, "
        "then exits 0.",
    )
    p.add_argument("target", help="what to serve: module:attr or path/file.py:attr")
    p.add_argument(
        "--listen",
        required=True,
        metavar="ADDR",
        help="tcp://HOST:PORT (port 0 picks a free one) or ipc:///path",
    )
    p.add_argument("--stage", help="the stage name to serve; callers expecting another are refused")
    _worker_calls(p)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="worker option (validated against the worker's Options type)",
    )
    p.add_argument(
        "--curve-secret",
        metavar="FILE",
        help="serve with CURVE encryption using this secret key (bls keygen)",
    )
    p.add_argument(
        "--curve-allow",
        metavar="DIR",
        help="with --curve-secret: only accept callers whose public key is in DIR",
    )
    _worker_metrics(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_verbose_arg(p)
    add_common_args(p)
    add_binding_args(p)
    add_connect_timeout_arg(p, "the worker starts anyway and takes the stage once one answers")
    add_discovery_args(p, worker=True)
    add_backend_arg(p)
    p.set_defaults(handler=commands.worker)


def _serve(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a script over HTTP",
        description="Serve SCRIPT's entrypoints over HTTP: POST /v1/scripts/ENTRY (JSON in; "
        "JSON, SSE or NDJSON out), POST /v1/chat/completions for an entry declared "
        "openai='chat', GET /v1/scripts, /openapi.json, /health, /ready, /metrics and "
        "/debug/requests. It waits up to --connect-timeout for each remote stage before it "
        "prints 'ready URL', and starts even if one has no replica yet: /ready answers 503 "
        "naming it, and its calls fail fast with 503, until a replica answers. On "
        "SIGTERM/SIGINT it stops accepting, lets in-flight requests finish within --grace, "
        "then exits 0.",
    )
    p.add_argument("script", help="path to the script file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=count(0, 65535),
        default=8000,
        help="port to listen on; 0 picks a free one (default 8000)",
    )
    _serve_limits(p)
    p.add_argument(
        "--server",
        choices=["auto", "uvicorn", "hypercorn"],
        default="auto",
        help="HTTP server (default: uvicorn on asyncio, bls's own on trio)",
    )
    p.add_argument(
        "--record",
        metavar="DIR",
        help="write each request's stage calls into DIR, one file per request (ID.blsrec), "
        "for bls replay",
    )
    p.add_argument(
        "--model-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another model name the chat route answers to (repeatable); a request naming "
        "a model not served is answered 404, as vllm serve does",
    )
    p.add_argument("--no-access-log", action="store_true", help="no line per request on stderr")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_verbose_arg(p)
    add_common_args(p)
    add_binding_args(p)
    add_connect_timeout_arg(p, "the server starts anyway (see above)")
    add_discovery_args(p)
    add_backend_arg(p)
    p.set_defaults(handler=commands.serve)


def _worker_calls(p: argparse.ArgumentParser) -> None:
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


def _worker_metrics(p: argparse.ArgumentParser) -> None:
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


def _serve_limits(p: argparse.ArgumentParser) -> None:
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


def _keygen(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="write a CURVE key pair",
        description="Write NAME.key (public: give it to peers) and NAME.key_secret (keep it) "
        "into DIR.",
    )
    p.add_argument("name", help="key name, e.g. worker or client")
    p.add_argument("--dir", default=".", help="where to write the files (default: .)")
    add_common_args(p)
    p.set_defaults(handler=commands.keygen)


def _bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="load-test a served script or the chat endpoint",
        description="Send the same request to a bls serve endpoint over N keep-alive "
        "connections and report requests/s, latency percentiles, a stream's time to its "
        "first item, and errors by status and kind. A progress bar goes to stderr; the "
        "summary (a table, or JSON with --json) to stdout.",
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--entry", metavar="NAME", help="the script entry (POST /v1/scripts/NAME)")
    p.add_argument(
        "--chat", action="store_true", help="POST to /v1/chat/completions instead of an entry"
    )
    p.add_argument("--input", metavar="JSON|@FILE", help="the request body (default: read stdin)")
    p.add_argument(
        "--concurrency",
        "-c",
        type=count(1, 10_000),
        default=1,
        metavar="N",
        help="connections, 1 to 10000 (default 1)",
    )
    amount = p.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests",
        "-n",
        type=count(1),
        metavar="M",
        help="requests in all (default 100)",
    )
    amount.add_argument(
        "--duration", "-d", type=seconds(positive=True), metavar="S", help="seconds to run"
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help='ask for a stream (Accept: text/event-stream; with --chat, "stream": true) '
        "and measure the time to its first item",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw latency over time and its histogram")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_common_args(p)
    p.set_defaults(handler=commands.bench)


# -- running a command ---------------------------------------------------------------


def _describe_error(exc: BaseException) -> str | None:
    """The one-line message for an error a user caused, or None for a bug."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe_error(exc.exceptions[0])
    if isinstance(exc, DeadlineExceeded):  # before OSError: it is a TimeoutError
        return f"deadline exceeded: {exc}"
    if isinstance(
        exc,
        (InvalidRequest, StageError, StageNotBound, ConfigError, PolicyError, UsageError, OSError),
    ):
        return str(exc)
    if isinstance(exc, BindingError):
        return "\nerror: ".join(exc.problems)
    if isinstance(exc, Divergence):
        return f"the script no longer does what the record says: {exc}"
    if isinstance(exc, RecordError):
        return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bls`` console script."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`bls run ... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (SystemExit, BrokenPipeError):
        raise
    except BaseException as exc:
        message = _describe_error(exc)
        if args.traceback or os.environ.get("BLS_TRACEBACK"):
            traceback.print_exception(exc, file=sys.stderr)
        elif message is None:
            message = f"{type(exc).__name__}: {exc} (use --traceback for details)"
        print(f"error: {message or f'{type(exc).__name__}: {exc}'}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
