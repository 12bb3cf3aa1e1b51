"""What each ``bls`` command does, once :mod:`bls.cli` has parsed its flags: ``run``,
``batch``, ``check``, ``worker``, ``serve``, ``keygen``, ``bench``. Each takes the parsed arguments
and returns the exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from .config import Config, ConfigError
from .console import claim_stdout, counted, emit, read_input, ready_line, setup_logging
from .recording import Recorder, dump
from .replay import read, replay_file
from .scope import RequestScope

if TYPE_CHECKING:
    from .batchfile import Call
    from .bindings import Binding
    from .scriptfile import ScriptFile

__all__ = ["batch", "bench", "check", "keygen", "replay", "run", "serve", "worker"]


def run(args: argparse.Namespace) -> int:
    """``bls run``: one request through a script; its result (or items) as JSON lines."""
    from .scriptfile import ScriptFile

    claim_stdout()
    setup_logging(args.log_level, libraries="warning", verbose=args.verbose)
    record = bool(args.record)
    app = ScriptFile(args.script, config_file=args.config, binds=args.bind, record=record)
    _apply_connect_timeout(app.config, args.connect_timeout)
    _apply_discovery(app.config, args)
    entry = app.entry(args.entry)
    req = entry.decode(read_input(args.input))
    recorder = Recorder(app.path) if record else None
    _log_bindings(app, logging.DEBUG)  # (`bls check` says it; a run's stderr stays one error)

    async def main() -> None:
        async with app.runtime() as rt, RequestScope("run", record=recorder):
            if entry.streaming:
                async with rt.run_stream(entry, req, timeout=args.timeout) as items:
                    async for item in items:
                        _write_line(item)
            else:
                _write_line(await rt.run(entry, req, timeout=args.timeout))

    try:
        anyio.run(main, backend=args.backend)
    finally:
        if recorder is not None:  # a failed request's record too
            Path(args.record).write_bytes(dump(recorder.finish()))
    return 0


def batch(args: argparse.Namespace) -> int:
    """``bls batch``: an entry over every line of a JSONL file, into another in input
    order (:mod:`bls.batchfile`); after a stop, the lines not done yet."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .batchfile import Progress as Done
    from .batchfile import Unreachable, check_files, run_batch, survey

    claim_stdout()
    setup_logging(args.log_level, libraries="warning", verbose=args.verbose)
    check_files(args.input, args.output)
    source, output = Path(args.input), Path(args.output)
    ident, requests, lines = survey(source)
    enter = _batch_call(args)
    done = Done(output, ident, lines)
    console = Console(stderr=True)
    columns = [TextColumn("[bold]bls batch"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn()]
    bar = Progress(*columns, console=console, transient=True, disable=not console.is_terminal)
    task = bar.add_task("lines", total=requests, errors=0)

    def tick(finished: int, errors: int) -> None:
        bar.update(task, completed=finished, errors=errors)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            call = await enter(stack)
            await run_batch(call, source, done, requests, args.concurrency, tick)

    def stopped(level: int, why: str) -> None:
        done.close()
        logging.getLogger("bls").log(
            level,
            "%sstopped: %d of %d lines done, in %s; run the same command again to go on",
            why,
            len(done.done),
            requests,
            done.path,
        )

    try:
        with bar:
            anyio.run(main, backend=args.backend)
    except KeyboardInterrupt:
        stopped(logging.WARNING, "")
        return 130
    except Unreachable as exc:
        stopped(logging.ERROR, f"{exc}; ")
        return 1
    except BaseException:
        done.close()
        raise
    done.finish()
    answered = f"{counted(requests, 'line')} answered ({done.errors} with an error)"
    print(f"bls batch: {answered}, into {output}", file=sys.stderr)
    return 0


def _batch_call(args: argparse.Namespace) -> Callable[[contextlib.AsyncExitStack], Awaitable[Call]]:
    """What runs a batch's lines, entered on the batch's event loop: the script with its
    runtime, or a client of the server at the URL."""
    from .batchfile import RETRIES, BatchError, script_call, url_call

    if args.target.startswith(("http://", "https://")):
        import httpx

        if not args.entry:
            raise BatchError("name the server's entry to run with --entry NAME")
        if args.bind or args.config:
            raise BatchError("--bind and --config are for a script: a server binds its own")
        try:
            host = httpx.URL(args.target).host
        except httpx.InvalidURL as exc:
            raise BatchError(f"{args.target} is not a URL: {exc}") from None
        if not host:
            raise BatchError(f"{args.target} names no host")
        retries = RETRIES if args.retries is None else args.retries
        read = None if args.timeout is None else args.timeout + 30  # (the server's bound)
        timeout = httpx.Timeout(10.0, read=read, write=60.0, pool=None)
        limits = httpx.Limits(max_connections=args.concurrency)

        async def client(stack: contextlib.AsyncExitStack) -> Call:
            http = httpx.AsyncClient(timeout=timeout, limits=limits)
            await stack.enter_async_context(http)
            return url_call(http, args.target, args.entry, args.timeout, retries)

        return client
    if args.retries is not None:
        raise BatchError("--retries is for a URL: a script's lines run in this process")
    from .scriptfile import ScriptFile

    app = ScriptFile(args.target, config_file=args.config, binds=args.bind)
    _apply_connect_timeout(app.config, args.connect_timeout)
    _apply_discovery(app.config, args)
    entry = app.entry(args.entry)

    async def script(stack: contextlib.AsyncExitStack) -> Call:
        runtime = await stack.enter_async_context(app.runtime())
        return script_call(runtime, entry, args.timeout)

    return script


def replay(args: argparse.Namespace) -> int:
    """``bls replay``: a record's request through a script again; its result as JSON lines
    (exit 0 when it replays as recorded, a request that failed failing the same way)."""
    claim_stdout()
    setup_logging("warning", libraries="warning", verbose=False)
    for answer in replay_file(args.file, args.script, args.entry, args.id):
        _write_line(answer)
    failed = read(args.file, args.id).error
    if failed is not None:
        logging.getLogger("bls").warning(
            "the request failed as recorded: %s from stage %r: %s",
            failed.kind,
            failed.stage,
            failed.message,
        )
    return 0


def check(args: argparse.Namespace) -> int:
    """``bls check``: every stage bound, in the right mode, with fitting types (1 if not)."""
    from .scriptfile import ScriptFile

    app = ScriptFile(args.script, config_file=args.config, binds=args.bind)
    _apply_admission(app, None)

    async def main() -> list[str]:
        rt = app.runtime()
        try:
            return await rt.open()
        finally:
            await rt.aclose()

    problems = anyio.run(main)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    names = sorted({u.name for u in app.uses} | set(app.bindings))
    emit(f"ok: {len(app.entries)} entrypoint(s), {len(names)} stage(s) bound: {', '.join(names)}")
    for line in app.where_bound():
        emit(f"  {line}")
    return 0


def worker(args: argparse.Namespace) -> int:
    """``bls worker``: serve one stage over ZeroMQ until SIGTERM/SIGINT."""
    from bls.transport.worker_process import WorkerOptions, run_worker

    from .bindings import InlineBinding
    from .check import typed_handles
    from .config import load_config, make_bindings
    from .entry import Script
    from .runtime import Runtime
    from .targets import load_target

    claim_stdout()
    setup_logging(args.log_level, verbose=args.verbose)
    _check_worker_flags(args)
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
    served: Binding = binding
    if args.cache:
        served = _cached(binding, args)
    config = load_config(script_file, args.config, args.bind)
    if args.max_frame_bytes is not None:
        config.transport.max_frame_bytes = args.max_frame_bytes
    _apply_connect_timeout(config, args.connect_timeout)
    _apply_discovery(config, args)
    declared = typed_handles(binding.script_module) if isinstance(obj, Script) else []
    runtime = Runtime(make_bindings(config), declared=declared, start_unreachable=True)
    options = WorkerOptions(
        stage=stage,
        strict_name=bool(args.stage),
        max_inflight=args.max_inflight,
        max_running=args.max_running,
        max_inflight_per_caller=args.max_inflight_per_caller,
        grace=args.grace,
        transport=config.transport,
        curve_secret=args.curve_secret,
        curve_allow=args.curve_allow,
        register_at=args.discovery,
        advertise=args.advertise,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )
    return anyio.run(
        lambda: run_worker(
            served,
            args.listen,
            options,
            runtime=runtime,
            on_ready=lambda address, down: emit(ready_line(address, down)),
        ),
        backend=args.backend,
    )


def _check_worker_flags(args: argparse.Namespace) -> None:
    """``bls worker``'s flags that only make sense together, or not at all: ConfigError."""
    if args.curve_allow and not args.curve_secret:
        raise ConfigError("--curve-allow needs --curve-secret")
    if args.advertise and not args.discovery:
        raise ConfigError("--advertise needs --discovery")
    if args.max_running is not None and args.max_running > args.max_inflight:
        raise ConfigError(
            f"--max-running {args.max_running} is more than --max-inflight {args.max_inflight}: "
            "a worker runs no more calls than it holds"
        )
    if args.discovery and not args.advertise:
        host = args.listen.partition("://")[2].rpartition(":")[0]
        if host in ("0.0.0.0", "*", "[::]", "::"):
            raise ConfigError(
                f"--listen {args.listen} listens on every interface: give --advertise "
                "tcp://THIS_HOST:PORT, the address callers reach this worker at"
            )


def serve(args: argparse.Namespace) -> int:
    """``bls serve``: serve a script over HTTP until SIGTERM/SIGINT."""
    from .scriptfile import ScriptFile
    from .serve.intake import Limits
    from .serve.server import serve

    claim_stdout()
    setup_logging(args.log_level, verbose=args.verbose)
    if args.no_access_log:
        logging.getLogger("bls.access").setLevel(logging.WARNING)
    processes = _processes(args.processes)
    if processes > 1:
        return _supervise(args, processes)
    if args.server == "uvicorn" and args.backend == "trio":
        raise ConfigError("--server uvicorn runs on asyncio only: use --server hypercorn with trio")
    # Stages record when asked to, and for background runs' journals.
    record = bool(args.record) or args.runs != "off"
    app = ScriptFile(args.script, config_file=args.config, binds=args.bind, record=record)
    if args.runs is not None:
        app.config.runs.store = args.runs
    _apply_connect_timeout(app.config, args.connect_timeout)
    _apply_discovery(app.config, args)
    if args.share is not None:  # one of the processes of --processes N: its share
        from .serve.processes import divide_limits

        divide_limits(app.config, args.share, args.max_inflight)
    _apply_admission(app, args.max_queued, args.max_inflight)
    _log_bindings(app)
    limits = Limits(
        max_inflight=args.max_inflight,
        request_timeout=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
        max_header_bytes=args.max_header_bytes,
        body_timeout=args.body_timeout,
        send_timeout=args.send_timeout,
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
            record_to=args.record,
            reuse_port=args.reuse_port,
            shared_metrics=args.shared_metrics,
            cors_origins=args.cors_origin,
            on_ready=lambda url, down: emit(ready_line(url, down)),
        ),
        backend=args.backend,
        backend_options=options,
    )


def _processes(given: str) -> int:
    from .serve.processes import auto

    if given == "auto":
        return auto()
    try:
        n = int(given)
    except ValueError:
        n = 0
    if not 1 <= n <= 256:
        raise ConfigError(f"--processes {given!r}: expected 1 to 256, or auto")
    return n


def _supervise(args: argparse.Namespace, processes: int) -> int:
    """``bls serve --processes N``: N children of this command (:mod:`.serve.processes`)."""
    from .serve.processes import child_args, supervise

    argv = sys.argv[1:]
    argv = argv[argv.index("serve") + 1 :] if "serve" in argv else argv
    limits = {"--max-inflight": args.max_inflight, "--max-queued": args.max_queued}
    if args.max_inflight < processes:
        raise ConfigError(f"--max-inflight {args.max_inflight}: fewer than --processes {processes}")
    return supervise(
        child_args(argv),
        processes,
        args.host,
        args.port,
        args.grace,
        limits,
        on_ready=lambda url: emit(ready_line(url, [])),
    )


def keygen(args: argparse.Namespace) -> int:
    """``bls keygen``: write a CURVE key pair."""
    from bls.transport.keys import generate

    public, secret = generate(args.dir, args.name)
    emit(f"public {public}")
    emit(f"secret {secret}")
    return 0


def bench(args: argparse.Namespace) -> int:
    """``bls bench``: load-test a served script or the chat route (:mod:`bls.loadreport`)."""
    from . import loadreport

    return loadreport.main(args)


# -- shared by several commands ------------------------------------------------------


def _cached(binding: Binding, args: argparse.Namespace) -> Binding:
    """``bls worker --cache``: the stage behind a result cache of its own (bls/cache.py),
    which every frontend's calls share (with affinity by content, each request's one)."""
    from .cache import CachedBinding, CacheOptions

    if binding.signature.streaming:
        raise ConfigError(f"--cache: stage {binding.name!r} streams; a cache is for unary stages")
    try:
        options = msgspec.convert(_parse_options(args.cache, "--cache"), CacheOptions)
        identity = {"stage": binding.name, "target": args.target, "options": args.option}
        return CachedBinding(binding, options, identity)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"--cache: {exc}") from None


def _parse_options(specs: list[str], flag: str = "--option") -> dict[str, Any]:
    """``KEY=VALUE`` pairs; VALUE is JSON when it parses as JSON, else a string."""
    options: dict[str, Any] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {spec!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def _log_bindings(app: ScriptFile, level: int = logging.INFO) -> None:
    """Where each stage is bound, on stderr: a stage left inline by a forgotten --bind
    shows here, not as a worker that gets no calls."""
    log = logging.getLogger("bls")
    for line in app.where_bound():
        log.log(level, "stage %s", line)


def _write_line(value: Any) -> None:
    emit(msgspec.json.encode(value))


def _apply_connect_timeout(config: Config, value: float | None) -> None:
    """``--connect-timeout`` over the configuration's ``[transport]`` setting."""
    if value is not None:
        config.transport.connect_timeout_s = value


def _apply_discovery(config: Config, args: argparse.Namespace) -> None:
    """``--discovery``/``--namespace`` over the configuration's ``[transport]``."""
    transport = config.transport
    if args.discovery:
        transport.discovery = args.discovery
    if args.namespace:
        transport.namespace = args.namespace


def _apply_admission(
    app: ScriptFile, max_queued: int | None, max_inflight: int | None = None
) -> None:
    """``--max-queued`` over ``[admission]``; its entries must be the script's, its
    reserved slots fewer than ``--max-inflight``, and its tenant function one that loads."""
    admission = app.config.admission
    if max_queued is not None:
        admission.max_queued = max_queued
    from .serve.admission import check

    # Before anything starts (the frontend checks again, once the runtime has started).
    check(admission, max_inflight or admission.reserved + 1, app.entries)
