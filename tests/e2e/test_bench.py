"""`bls bench` against a real `bls serve`: counts, latencies, streams, errors, the plot."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cli import run_bls
from .procs import Proc, serving

SERVED = "tests/e2e/served/served.py"


@pytest.fixture(scope="module")
def server() -> Iterator[Proc]:
    with serving(SERVED) as proc:
        yield proc


def bench(*args: str) -> tuple[int, dict[str, object], str]:
    out = run_bls("bench", *args, "--json", timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout + out.stderr  # stdout: the summary only
    return out.returncode, json.loads(lines[0]), out.stderr


def test_counts_every_request_and_its_latency(server: Proc) -> None:
    rc, summary, _ = bench(
        server.address, "--entry", "greet", "--input", '{"text": "hi"}', "-c", "4", "-n", "200"
    )
    assert rc == 0
    assert summary["requests"] == summary["ok"] == 200
    assert summary["errors"] == {}
    latency = summary["latency_ms"]
    assert isinstance(latency, dict)
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
    assert summary["first_item_ms"] is None  # a unary entry has no stream
    assert summary["requests_per_s"] > 0


def test_a_stream_reports_its_first_item_before_its_end(server: Proc) -> None:
    body = json.dumps({"text": "", "n": 3, "seconds": 0.05})
    rc, summary, _ = bench(
        server.address, "--entry", "count", "--input", body, "--stream", "-n", "5"
    )
    assert rc == 0 and summary["ok"] == 5
    first, whole = summary["first_item_ms"], summary["latency_ms"]
    assert isinstance(first, dict) and isinstance(whole, dict)
    # Three items 50 ms apart: the first arrives about 100 ms before the end.
    assert whole["p50"] - first["p50"] > 60


def test_errors_are_counted_by_status_and_kind(server: Proc) -> None:
    rc, summary, _ = bench(server.address, "--entry", "greet", "--input", '{"txt": 1}', "-n", "7")
    assert rc == 1  # nothing succeeded
    assert summary["errors"] == {"422 invalid_request": 7}
    rc, summary, _ = bench(server.address, "--entry", "nope", "--input", "{}", "-n", "2")
    assert summary["errors"] == {"404 not_found": 2}


def test_a_duration_run_and_its_plot(server: Proc, tmp_path: Path) -> None:
    plot = tmp_path / "latency.png"
    rc, summary, _ = bench(
        server.address, "--entry", "greet", "--input", '{"text": "hi"}', "-d", "0.5",
        "--plot", str(plot),
    )  # fmt: skip
    assert rc == 0 and summary["ok"] > 0
    assert 0.5 <= summary["elapsed_s"] < 5  # type: ignore[operator]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary["plot"] == str(plot)


def test_the_table_goes_to_stdout_and_bad_flags_are_named(server: Proc) -> None:
    out = run_bls(
        "bench", server.address, "--entry", "greet", "--input", '{"text": "x"}', "-n", "3"
    )
    assert out.returncode == 0
    assert "requests/s" in out.stdout and "latency p50" in out.stdout
    out = run_bls("bench", server.address, "--input", "{}")
    assert out.returncode == 1 and "--entry NAME" in out.stderr
    out = run_bls("bench", "127.0.0.1:8000", "--entry", "greet", "--input", "{}")
    assert out.returncode == 1 and "http://HOST:PORT" in out.stderr
    out = run_bls("bench", server.address, "--entry", "greet", "--input", "{nope")
    assert out.returncode == 1 and "--input is not JSON" in out.stderr


def test_a_server_that_is_not_there_is_named_and_stops_the_run() -> None:
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
    out = run_bls("bench", url, "--entry", "greet", "--input", "{}", "-c", "4", "-n", "50")
    assert out.returncode == 1 and out.stdout == ""
    assert f"cannot connect to {url}: connection refused" in out.stderr
