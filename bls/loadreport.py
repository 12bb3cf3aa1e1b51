"""``bls bench``, the command: its flags checked, the run (:mod:`bls.loadgen`) driven
under a progress bar on stderr, and its summary printed to stdout, as a table or one JSON
object (``--json``); ``--plot FILE.png`` draws latency over time and its histogram
(needs matplotlib: ``pip install 'bls-pipelines[plot]'``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from .console import counted, emit, read_input
from .loadgen import BenchError, Result, input_json, run_bench

__all__ = ["main", "plot", "table"]


def table(summary: dict[str, Any]) -> Any:
    from rich.table import Table

    urls = summary["urls"]
    more = f" and {len(urls) - 1} more" if len(urls) > 1 else ""
    title = f"{summary['url']}{more}, {counted(summary['concurrency'], 'connection')}"
    out = Table(title=title, min_width=len(title) + 4)
    out.add_column("measure")
    out.add_column("value", justify="right")
    out.add_row("requests", f"{summary['requests']} ({summary['ok']} ok)")
    out.add_row("elapsed", f"{summary['elapsed_s']:.2f} s")
    out.add_row("requests/s", f"{summary['requests_per_s']:,.1f}")
    for label, key in (("latency", "latency_ms"), ("first item", "first_item_ms")):
        values = summary.get(key)
        if values:
            for q in ("p50", "p90", "p99"):
                out.add_row(f"{label} {q}", f"{values[q]:.2f} ms")
    talks = summary.get("conversations")
    if talks:
        out.add_row(
            "conversations",
            f"{talks['started']} ({talks['finished']} of all {talks['turns']} turns)",
        )
        rate = talks["hit_rate"]
        out.add_row("prefix-cache hit rate, later turns", "-" if rate is None else f"{rate:.3f}")
        for label, key in (("latency", "later_latency_ms"), ("first item", "later_first_item_ms")):
            values = talks.get(key)
            if values:
                for q in ("p50", "p90"):
                    out.add_row(f"later turns' {label} {q}", f"{values[q]:.2f} ms")
    for what, count in sorted(summary["errors"].items()):
        out.add_row(f"errors: {what}", str(count))
    return out


def plot(result: Result, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [s for s in result.samples if not s.kind]
    bad = [s for s in result.samples if s.kind]
    fig, (over_time, histogram) = plt.subplots(1, 2, figsize=(12, 4.5))
    over_time.scatter([s.start for s in ok], [s.latency * 1000 for s in ok], s=4, label="ok")
    if bad:
        over_time.scatter(
            [s.start for s in bad], [s.latency * 1000 for s in bad], s=8, c="red", label="error"
        )
    firsts = [s for s in ok if s.first is not None]
    if firsts:
        over_time.scatter(
            [s.start for s in firsts],
            [(s.first or 0) * 1000 for s in firsts],
            s=4,
            label="first item",
        )
    over_time.set_xlabel("time since start (s)")
    over_time.set_ylabel("latency (ms)")
    over_time.set_title("latency over time")
    over_time.legend(loc="upper right")
    histogram.hist([s.latency * 1000 for s in ok], bins=50)
    histogram.set_xlabel("latency (ms)")
    histogram.set_ylabel("requests")
    histogram.set_title(
        f"{counted(len(ok), 'request')}, {counted(result.concurrency, 'connection')}"
    )
    fig.suptitle(result.url)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _request(args: Any) -> tuple[str, bytes]:
    """The route and the body ``bls bench`` sends."""
    if args.chat:
        path = "/v1/chat/completions"
    elif args.entry:
        path = f"/v1/scripts/{args.entry}"
    else:
        raise BenchError("name the script's entry with --entry NAME (or --chat for the chat route)")
    if args.turns is not None and not args.chat:
        raise BenchError("--turns holds chat conversations: give --chat with it")
    body = read_input(args.input)
    decoded = input_json(body)
    if args.chat and args.stream and isinstance(decoded, dict):
        decoded["stream"] = True
        body = json.dumps(decoded).encode()
    return path, body


def main(args: Any) -> int:
    """``bls bench`` (its flags are in :mod:`bls.cli`): run, then print the summary."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if (args.requests is None) == (args.duration is None):
        if args.duration is None:
            args.requests = 100
        else:
            raise BenchError("give --requests or --duration, not both")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise BenchError("--plot needs matplotlib: pip install 'bls-pipelines[plot]'") from None
    path, body = _request(args)
    turns = args.turns
    console = Console(stderr=True)
    total = args.requests
    columns = [
        TextColumn("[bold]bls bench"),
        BarColumn(),
        MofNCompleteColumn() if total else TextColumn("{task.completed} done"),
        TextColumn("{task.fields[errors]} errors"),
        TimeElapsedColumn(),
    ]
    with Progress(
        *columns, console=console, transient=True, disable=not console.is_terminal
    ) as bar:
        task = bar.add_task("load", total=total or args.duration, errors=0)
        began = time.perf_counter()

        def progress(done: int, errors: int) -> None:
            if total:
                bar.update(task, completed=done, errors=errors)
            else:
                bar.update(
                    task, completed=min(args.duration, time.perf_counter() - began), errors=errors
                )

        result = run_bench(
            [url.rstrip("/") for url in args.url],
            path,
            body,
            concurrency=args.concurrency,
            requests=args.requests,
            duration=args.duration,
            stream=args.stream,
            progress=progress,
            turns=turns,
        )
    for reason, count in result.failures.most_common():
        print(f"bls bench: {count} connection errors: {reason}", file=sys.stderr)
    summary = result.summary()
    if args.plot:
        plot(result, args.plot)
        summary["plot"] = os.path.abspath(args.plot)
    if args.json:
        emit(json.dumps(summary).encode())
    else:
        out = Console(file=sys.stdout, width=100)
        out.print(table(summary))
        if args.plot:
            out.print(f"plot: {summary['plot']}")
    return 0 if summary["ok"] else 1
