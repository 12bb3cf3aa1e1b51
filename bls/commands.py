"""The commands that live beside their subsystems: ``worker``, ``serve``, ``keygen``.

:data:`PARSERS` add their parsers to the ``bls`` command (:mod:`bls.cli`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

import anyio

from . import console
from .config import ConfigError

MAX_INFLIGHT = 1_000_000  # calls or requests at once: more is a typo, not a plan
MAX_FRAME_BYTES = 2**62  # what ZeroMQ's message size limit (a signed 64-bit) takes


def _parse_options(specs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; VALUE is JSON when it parses as JSON, else a string."""
    options: dict[str, Any] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {spec!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


# -- bls worker ------------------------------------------------------------------------


def _add_worker(sub: Any) -> None:
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
    p.add_argument(
        "--max-inflight-per-caller",
        type=console.count(1, MAX_INFLIGHT),
        metavar="N",
        help="calls one caller may have running at once (default: --max-inflight)",
    )
    p.add_argument(
        "--max-inflight",
        type=console.count(1, MAX_INFLIGHT),
        default=256,
        metavar="N",
        help="calls served at once, 1 to 1000000; more are refused as 'overloaded' (default 256)",
    )
    p.add_argument(
        "--grace",
        type=console.seconds(),
        default=10.0,
        metavar="S",
        help="seconds in-flight calls get to finish on SIGTERM; 0 cancels them at once "
        "(default 10)",
    )
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
    p.add_argument(
        "--max-frame-bytes",
        type=console.count(1, MAX_FRAME_BYTES),
        metavar="N",
        help="largest request accepted, in bytes (default: [transport] max_frame_bytes, 256 MiB)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    console.add_verbose_arg(p)
    console.add_common_args(p)
    console.add_binding_args(p)
    console.add_connect_timeout_arg(
        p, "the worker starts anyway and takes the stage once one answers"
    )
    console.add_discovery_args(p, worker=True)
    console.add_backend_arg(p)
    p.set_defaults(handler=_cmd_worker)


def _cmd_worker(args: argparse.Namespace) -> int:
    from bls.transport.worker_process import WorkerOptions, run_worker

    from .bindings import InlineBinding, load_target
    from .check import typed_handles
    from .config import load_config, make_bindings
    from .entry import Script
    from .runtime import Runtime

    console.claim_stdout()
    console.setup_logging(args.log_level, verbose=args.verbose)
    if args.curve_allow and not args.curve_secret:
        raise ConfigError("--curve-allow needs --curve-secret")
    if args.advertise and not args.discovery:
        raise ConfigError("--advertise needs --discovery")
    if args.discovery and not args.advertise:
        host = args.listen.partition("://")[2].rpartition(":")[0]
        if host in ("0.0.0.0", "*", "[::]", "::"):
            raise ConfigError(
                f"--listen {args.listen} listens on every interface: give --advertise "
                "tcp://THIS_HOST:PORT, the address callers reach this worker at"
            )
    try:
        obj = load_target(args.target, Path.cwd())
    except (ImportError, ValueError, FileNotFoundError, SyntaxError) as exc:
        raise ConfigError(f"cannot load {args.target!r}: {exc}") from exc
    default_name = obj.name if isinstance(obj, Script) else args.target.rpartition(":")[2]
    stage = args.stage or default_name
    try:
        binding = InlineBinding(
            stage, obj, options=_parse_options(args.option), description=args.target
        )
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
    # A script served as a stage calls stages of its own: bind them as its bls.toml says.
    script_file = binding.script_file if isinstance(obj, Script) else None
    config = load_config(script_file, args.config, args.bind)
    if args.max_frame_bytes is not None:
        config.transport.max_frame_bytes = args.max_frame_bytes
    console.apply_connect_timeout(config, args.connect_timeout)
    console.apply_discovery(config, args)
    declared = typed_handles(binding.script_module) if isinstance(obj, Script) else []
    runtime = Runtime(make_bindings(config), declared=declared, start_unreachable=True)
    options = WorkerOptions(
        stage=stage,
        strict_name=bool(args.stage),
        max_inflight=args.max_inflight,
        max_inflight_per_caller=args.max_inflight_per_caller,
        grace=args.grace,
        transport=config.transport,
        curve_secret=args.curve_secret,
        curve_allow=args.curve_allow,
        register_at=args.discovery,
        advertise=args.advertise,
    )
    return anyio.run(
        lambda: run_worker(
            binding,
            args.listen,
            options,
            runtime=runtime,
            on_ready=lambda address, down: console.emit(console.ready_line(address, down)),
        ),
        backend=args.backend,
    )


# -- bls serve -------------------------------------------------------------------------


def _add_serve(sub: Any) -> None:
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
        type=console.count(0, 65535),
        default=8000,
        help="port to listen on; 0 picks a free one (default 8000)",
    )
    p.add_argument(
        "--max-inflight",
        type=console.count(1, MAX_INFLIGHT),
        default=64,
        metavar="N",
        help="requests handled at once, 1 to 1000000; more are answered 429 with "
        "Retry-After (default 64)",
    )
    p.add_argument(
        "--request-timeout",
        type=console.seconds(zero_is_none=True),
        default=300.0,
        metavar="S",
        help="deadline of every request, and the most an X-Request-Timeout header may ask "
        "for (default 300; 0 = none)",
    )
    p.add_argument(
        "--body-timeout",
        type=console.seconds(zero_is_none=True),
        default=10.0,
        metavar="S",
        help="seconds a request body may take to arrive; a slower one gets 408 (default 10; "
        "0 = no bound but the request's deadline)",
    )
    p.add_argument(
        "--grace",
        type=console.seconds(),
        default=30.0,
        metavar="S",
        help="seconds in-flight requests get to finish on SIGTERM; 0 cancels them at once "
        "(default 30)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=console.count(1),
        default=16 * 1024 * 1024,
        metavar="N",
        help="largest request body accepted; larger ones get 413 (default 16 MiB)",
    )
    p.add_argument(
        "--trace-keep",
        type=console.count(0),
        default=100,
        metavar="N",
        help="recent requests whose stage timelines /debug/requests keeps (default 100)",
    )
    p.add_argument(
        "--server",
        choices=["auto", "uvicorn", "hypercorn"],
        default="auto",
        help="HTTP server (default: uvicorn on asyncio, hypercorn on trio)",
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
    console.add_verbose_arg(p)
    console.add_common_args(p)
    console.add_binding_args(p)
    console.add_connect_timeout_arg(p, "the server starts anyway (see above)")
    console.add_discovery_args(p)
    console.add_backend_arg(p)
    p.set_defaults(handler=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .scriptfile import ScriptFile
    from .serve.intake import Limits
    from .serve.server import serve

    console.claim_stdout()
    console.setup_logging(args.log_level, verbose=args.verbose)
    if args.no_access_log:
        logging.getLogger("bls.access").setLevel(logging.WARNING)
    if args.server == "uvicorn" and args.backend == "trio":
        raise ConfigError("--server uvicorn runs on asyncio only: use --server hypercorn with trio")
    app = ScriptFile(args.script, config_file=args.config, binds=args.bind)
    console.apply_connect_timeout(app.config, args.connect_timeout)
    console.apply_discovery(app.config, args)
    limits = Limits(
        max_inflight=args.max_inflight,
        request_timeout=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        body_timeout=args.body_timeout,
        grace=args.grace,
        trace_keep=args.trace_keep,
    )
    options: dict[str, Any] = {}
    if args.backend == "asyncio" and importlib.util.find_spec("uvloop") is not None:
        options["use_uvloop"] = True  # what Uvicorn itself picks when it is installed
    return anyio.run(
        lambda: serve(
            app,
            args.host,
            args.port,
            limits,
            server=args.server,
            model_aliases=args.model_alias,
            on_ready=lambda url, down: console.emit(console.ready_line(url, down)),
        ),
        backend=args.backend,
        backend_options=options,
    )


# -- bls keygen ------------------------------------------------------------------------


def _add_keygen(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="write a CURVE key pair",
        description="Write NAME.key (public: give it to peers) and NAME.key_secret (keep it) "
        "into DIR.",
    )
    p.add_argument("name", help="key name, e.g. worker or client")
    p.add_argument("--dir", default=".", help="where to write the files (default: .)")
    console.add_common_args(p)
    p.set_defaults(handler=_cmd_keygen)


def _cmd_keygen(args: argparse.Namespace) -> int:
    from bls.transport.keys import generate

    public, secret = generate(args.dir, args.name)
    console.emit(f"public {public}")
    console.emit(f"secret {secret}")
    return 0


def _add_bench(sub: Any) -> None:
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
        type=console.count(1, 10_000),
        default=1,
        metavar="N",
        help="connections, 1 to 10000 (default 1)",
    )
    amount = p.add_mutually_exclusive_group()
    amount.add_argument(
        "--requests",
        "-n",
        type=console.count(1),
        metavar="M",
        help="requests in all (default 100)",
    )
    amount.add_argument(
        "--duration", "-d", type=console.seconds(positive=True), metavar="S", help="seconds to run"
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help='ask for a stream (Accept: text/event-stream; with --chat, "stream": true) '
        "and measure the time to its first item",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw latency over time and its histogram")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    console.add_common_args(p)
    p.set_defaults(handler=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import loadgen

    return loadgen.main(args)


PARSERS = [_add_worker, _add_serve, _add_keygen, _add_bench]
