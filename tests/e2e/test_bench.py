"""`bls bench` against a real `bls serve`: counts, latencies, streams, errors, the plot;
and against an HTTPS server (the standard library's, over TLS)."""

from __future__ import annotations

import json
import resource
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .cli import BLS, bls_env, run_bls
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
    assert f"{server.address}, 1 connection " in out.stdout  # (the default: one)
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


class _Answers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    connections: list[str] = []

    def setup(self) -> None:
        super().setup()
        self.connections.append(self.client_address[0])

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "11")
        self.end_headers()
        self.wfile.write(b'{"ok":true}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on a self-signed certificate for 127.0.0.1: its URL, the cert."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Answers.connections.clear()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_https_server_is_driven_over_tls_and_its_certificate_checked(
    https_server: tuple[str, Path],
) -> None:
    url, cert = https_server
    args = ("bench", url, "--entry", "x", "--input", "{}", "-c", "3", "-n", "60", "--json")
    out = run_bls(*args, env=bls_env(SSL_CERT_FILE=str(cert)))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["requests"] == summary["ok"] == 60 and summary["errors"] == {}
    assert len(_Answers.connections) == 3  # one TLS connection each, kept alive
    # The certificate is not trusted: a short run counts the failures and says why; a
    # longer one stops once its first requests have all failed the same way.
    out = run_bls("bench", url, "--entry", "x", "--input", "{}", "-n", "5", "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["errors"] == {"connection": 5}
    assert "bls bench: 5 connection errors: [SSL: CERTIFICATE_VERIFY_FAILED]" in out.stderr
    out = run_bls(*args)
    assert out.returncode == 1 and out.stdout == ""
    assert "stopped: the first 20 requests all failed to connect: [SSL: CERTIFICATE_VERIFY" in (
        out.stderr
    )


def test_the_open_file_limit_is_raised_for_the_connections_or_named(server: Proc) -> None:
    def bench_with_files(soft: int, hard: int, concurrency: int) -> subprocess.CompletedProcess:
        args = ["bench", server.address, "--entry", "greet", "--input", '{"text": "hi"}']
        return subprocess.run(
            [BLS, *args, "-c", str(concurrency), "-n", "300", "--json"],
            capture_output=True, text=True, timeout=120, env=bls_env(),
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
        )  # fmt: skip

    out = bench_with_files(60, 1000, 100)  # 100 connections do not fit in 60 files
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["ok"] == 300 and summary["errors"] == {}
    out = bench_with_files(100, 100, 200)
    assert out.returncode == 1 and out.stdout == ""
    assert "--concurrency 200 needs 264 open files, and this process may open 100" in out.stderr


class _HalfAnswering:
    """A server that reads each request, then answers it (and closes) on every other
    connection and closes the others without a word."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        accepted = 0
        while not self.closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                data = b""
                while not data.endswith(b"{}"):  # the head, then the two-byte body
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                if accepted % 2 == 0:
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
                    )
            accepted += 1


def test_a_connection_that_fails_is_counted_with_its_reason_and_retried_after_a_pause() -> None:
    flaky = _HalfAnswering()
    flaky.thread.start()
    try:
        out = run_bls(
            "bench", flaky.url, "--entry", "x", "--input", "{}", "-c", "2", "-d", "1", "--json"
        )
    finally:
        flaky.closing.set()
        flaky.thread.join(timeout=10)
        flaky.listener.close()
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    failed = summary["errors"]["connection"]
    assert summary["ok"] > 0 and abs(summary["ok"] - failed) <= 2  # every other one
    assert f"bls bench: {failed} connection errors: the server closed the connection" in (
        out.stderr
    )
    # Each failure makes its connection wait 10 ms before it connects again.
    assert failed <= 2 * (summary["elapsed_s"] / 0.01 + 1)
