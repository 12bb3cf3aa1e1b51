"""The ``bls`` command: ``run``, ``check``, ``worker``, ``serve``, ``keygen``, ``bench``.

Every failure a user can cause prints one ``error: ...`` line on stderr and exits 1;
tracebacks are for bugs (``--traceback``, on every command, or ``BLS_TRACEBACK=1`` shows
them). Stdout carries results only: JSON lines from ``run``, ``ready`` lines from
``serve``/``worker``; anything else written there (library progress bars, C-level prints,
child processes) is sent to stderr by :func:`claim_stdout`.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec

from . import __version__, commands
from .config import ConfigError
from .console import (
    UsageError,
    add_backend_arg,
    add_binding_args,
    add_common_args,
    add_connect_timeout_arg,
    add_discovery_args,
    add_verbose_arg,
    apply_connect_timeout,
    apply_discovery,
    claim_stdout,
    emit,
    read_input,
    seconds,
    setup_logging,
)
from .errors import DeadlineExceeded, InvalidRequest, StageError, StageNotBound
from .runtime import BindingError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bls",
        description="Run, check and serve bls pipeline scripts.",
    )
    parser.add_argument("--version", action="version", version=f"bls {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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

    for register in commands.PARSERS:
        register(sub)
    return parser


def _write_line(value: Any) -> None:
    emit(msgspec.json.encode(value))


def _cmd_run(args: argparse.Namespace) -> int:
    from .scriptfile import ScriptFile

    claim_stdout()
    setup_logging(args.log_level, libraries="warning", verbose=args.verbose)
    app = ScriptFile(args.script, config_file=args.config, binds=args.bind)
    apply_connect_timeout(app.config, args.connect_timeout)
    apply_discovery(app.config, args)
    entry = app.entry(args.entry)
    req = entry.decode(read_input(args.input))

    async def main() -> None:
        async with app.runtime() as rt:
            if entry.streaming:
                async with rt.run_stream(entry, req, timeout=args.timeout) as items:
                    async for item in items:
                        _write_line(item)
            else:
                _write_line(await rt.run(entry, req, timeout=args.timeout))

    anyio.run(main, backend=args.backend)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from .scriptfile import ScriptFile

    app = ScriptFile(args.script, config_file=args.config, binds=args.bind)

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
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"run": _cmd_run, "check": _cmd_check}


def _describe_error(exc: BaseException) -> str | None:
    """The one-line message for an error a user caused, or None for a bug."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _describe_error(exc.exceptions[0])
    if isinstance(exc, DeadlineExceeded):  # before OSError: it is a TimeoutError
        return f"deadline exceeded: {exc}"
    if isinstance(
        exc, (InvalidRequest, StageError, StageNotBound, ConfigError, UsageError, OSError)
    ):
        return str(exc)
    if isinstance(exc, BindingError):
        return "\nerror: ".join(exc.problems)
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
    handler = _COMMANDS.get(args.command) or args.handler
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
