"""The ``bls`` command's parser: ``run``, ``batch``, ``check``, ``replay``, ``worker``,
``serve``, ``keygen``, ``bench``, every flag with its range and its help (the bounds of
the two that serve, ``worker`` and ``serve``: :mod:`bls.server_flags`); the handlers are
:mod:`bls.commands`.

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
    origin,
    seconds,
)
from .journal import JournalError
from .policy import PolicyError
from .recording import RecordError
from .replay import Divergence
from .runtime import BindingError
from .server_flags import add_serve_limit_args, add_worker_call_args, add_worker_metrics_args

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bls",
        description="Run, check and serve bls pipeline scripts.",
    )
    parser.add_argument("--version", action="version", version=f"bls {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_run, _batch, _check, _replay, _worker, _serve, _keygen, _bench):
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
        "--record",
        metavar="FILE",
        help="write the request's stage calls (each request, item, error and when) to FILE, "
        "for bls replay",
    )
    _running(run, "the request")
    run.set_defaults(handler=commands.run)


def _batch(sub: Any) -> None:
    p = sub.add_parser(
        "batch",
        help="run an entry over every line of a JSONL file",
        description="Run an entry over every line of a JSONL file (one request per line), "
        "-c lines at a time, in this process (TARGET a script) or on a server (TARGET its "
        'URL). OUTPUT gets one JSON line per request, in input order: {"line": N, '
        '"result": ...} or {"line": N, "error": {...}}, the error as bls serve '
        "answers it. Progress is kept in OUTPUT.progress as lines finish: stopped (Ctrl-C, "
        "a crash, a server that cannot be reached), the same command again runs only the "
        "lines not done. Exits 0 once every line has its answer, errors included (count "
        "them with jq).",
    )
    p.add_argument("target", help="a script file, or the URL of a bls serve")
    p.add_argument("--entry", help="entrypoint name (optional when a script has one)")
    p.add_argument("--input", required=True, metavar="FILE", help="the requests, JSON lines")
    p.add_argument("--output", required=True, metavar="FILE", help="the answers, JSON lines")
    p.add_argument(
        "-c",
        "--concurrency",
        type=count(1, 10_000),
        default=8,
        metavar="N",
        help="lines run at once, 1 to 10000 (default 8)",
    )
    p.add_argument(
        "--retries",
        type=count(0, 100),
        default=None,
        metavar="N",
        help="with a URL: how many times a line refused for now (429, 503) or not "
        "connected is tried again, 0 to 100 (default 5); a server still not connected "
        "after them stops the batch, its progress kept",
    )
    _running(p, "each line")
    p.set_defaults(handler=commands.batch)


def _running(p: argparse.ArgumentParser, what: str) -> None:
    """The flags of the commands that run a script's entry here (run, batch)."""
    p.add_argument(
        "--timeout",
        type=seconds(zero_is_none=True),
        metavar="S",
        help=f"deadline for {what}, seconds (default and 0: none)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="bls's own messages on stderr, e.g. start-up progress (default info; "
        "libraries log warnings and up)",
    )
    add_verbose_arg(p)
    add_common_args(p)
    add_binding_args(p)
    add_backend_arg(p)
    add_connect_timeout_arg(p, "then the run fails naming the stage")
    add_discovery_args(p)


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
    p.add_argument(
        "file",
        help="the record: a .blsrec file (bls run --record), or a --record folder of bls "
        "serve or one of its .blsseg segments, with --id",
    )
    p.add_argument("script", help="path to the script file")
    p.add_argument(
        "--id",
        metavar="REQUEST_ID",
        help="the request whose record to replay, in a folder or segment (its X-Request-Id)",
    )
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
    add_worker_call_args(p)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="worker option (validated against the worker's Options type)",
    )
    p.add_argument(
        "--cache",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keep a result cache in this worker, shared by every caller (a unary stage): "
        "capacity_mb=N (default 256), items=FIELD with results=FIELD (see docs/models.md)",
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
    add_worker_metrics_args(p)
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
        "then exits 0. A request with 'Prefer: respond-async' is answered 202 at once and "
        "runs in the background, journaled (--runs): GET/DELETE /v1/runs/ID.",
    )
    p.add_argument("script", help="path to the script file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=count(0, 65535),
        default=8000,
        help="port to listen on; 0 picks a free one (default 8000)",
    )
    add_serve_limit_args(p)
    p.add_argument(
        "--server",
        choices=["auto", "uvicorn", "hypercorn"],
        default="auto",
        help="HTTP server (default: uvicorn on asyncio, bls's own on trio)",
    )
    p.add_argument(
        "--record",
        metavar="DIR",
        help="write each request's stage calls into DIR, appended to segment files "
        "(records-*.blsseg) under its request id (bls replay DIR --id ID SCRIPT replays one)",
    )
    p.add_argument(
        "--processes",
        default="1",
        metavar="N",
        help="serve with N frontend processes on the port (auto: one per CPU), started, "
        "restarted and drained by this one; --max-inflight and --max-queued are divided "
        "between them, /metrics is all of theirs (see docs/deploy.md; default 1)",
    )
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shared-metrics", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--share", metavar="I/N", help=argparse.SUPPRESS)
    p.add_argument(
        "--runs",
        metavar="URL",
        help="the store of background runs' journals: sqlite:///PATH, "
        "postgresql://USER@HOST/DB (frontends on several hosts), or 'off' (no "
        "background runs). Default: [runs] store in bls.toml, else "
        "$XDG_STATE_HOME/bls/runs.sqlite3 (see docs/runs.md)",
    )
    p.add_argument(
        "--model-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="another model name the chat route answers to (repeatable); a request naming "
        "a model not served is answered 404, as vllm serve does",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        type=origin,
        metavar="ORIGIN",
        help="an origin (https://app.example:8443) whose pages may call the server from a "
        "browser: CORS headers and preflights (repeatable; * for any). Default: none",
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
        "first item, and errors by status and kind; or, with --chat --turns T, multi-turn "
        "conversations. A progress bar goes to stderr; the summary (a table, or JSON with "
        "--json) to stdout.",
    )
    p.add_argument(
        "url",
        nargs="+",
        help="the server, e.g. http://127.0.0.1:8000; several: the connections spread over "
        "them (with --turns, each conversation's turns go to them in turn)",
    )
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
    p.add_argument(
        "--turns",
        type=count(1, 1000),
        metavar="T",
        help="with --chat: each connection holds conversations of T turns, each turn "
        "sending the conversation so far (the answers included) and a follow-up, and the "
        "summary gives the prefix-cache hit rate the server reports over the later turns",
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
    if isinstance(exc, (RecordError, JournalError)):
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
        parser.print_help(sys.stderr)  # (a mistake: not on stdout, which carries results)
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
