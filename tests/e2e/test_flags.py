"""Every number a command takes, at 0 and at very large values, on real processes: each
works as its --help says (0 is "no limit" where documented) or is refused at start-up."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from .cli import run_bls
from .procs import Proc, serving, wait_for, worker
from .rawio import receive_until

SERVED = "tests/e2e/served/served.py"
STAGES = "tests/e2e/pipelines/remote_stages.py"
HUGE_S = "1e12"  # seconds: past anything a frame carries (sent as no deadline)


@pytest.fixture(scope="module")
def slow() -> Iterator[Proc]:
    """A worker started with every number it takes at its largest."""
    with worker(
        f"{STAGES}:slow",
        "--max-inflight", "1000000",
        "--max-inflight-per-caller", "1000000",
        "--max-frame-bytes", str(2**62),
        "--grace", HUGE_S,
        "--connect-timeout", HUGE_S,
    ) as proc:  # fmt: skip
        yield proc


def _wait(server: Proc, seconds: float, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.address}/v1/scripts/wait",
        json={"text": "", "seconds": seconds},
        headers=headers,
        timeout=30,
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("value", ["0", HUGE_S])
def test_no_request_deadline_serves_every_request(slow: Proc, backend: str, value: str) -> None:
    """--request-timeout 0 (none) and one too large to carry: requests run to the end,
    remote calls included; a client's X-Request-Timeout still bounds its own request."""
    with serving(
        SERVED, "--bind", f"slow={slow.address}", "--request-timeout", value, "--body-timeout",
        value, backend=backend,
    ) as server:  # fmt: skip
        answer = _wait(server, 0.3)
        assert answer.status_code == 200, answer.text
        assert answer.json()["text"] == "waited"
        bounded = _wait(server, 5, **{"X-Request-Timeout": "0.2"})
        assert bounded.status_code == 504, bounded.text


def _trickle(server: Proc, pause: float) -> bytes:
    """A request whose body arrives in two parts, ``pause`` seconds apart."""
    url = urlsplit(server.address)
    body = json.dumps({"text": "", "seconds": 0}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/scripts/wait HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:5])
        )
        time.sleep(pause)  # the slow client under test, not a wait for the server
        try:
            sock.sendall(body[5:])
        except OSError:
            pass  # the server answered and closed already
        return receive_until(sock, lambda d: b"\r\n\r\n" in d)


def test_body_timeout_0_bounds_a_body_by_the_request_deadline_only(slow: Proc) -> None:
    binds = ["--bind", f"slow={slow.address}", "--body-timeout", "0"]
    with serving(SERVED, *binds, "--request-timeout", "0") as server:
        assert _trickle(server, 1.2).startswith(b"HTTP/1.1 200")
    with serving(SERVED, *binds, "--request-timeout", "0.5") as server:
        answer = _trickle(server, 1.5)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_largest_values_serve(slow: Proc, backend: str) -> None:
    with serving(
        SERVED, "--bind", f"slow={slow.address}",
        "--max-inflight", "1000000", "--max-body-bytes", str(10**15),
        "--trace-keep", str(10**9), "--grace", HUGE_S, "--connect-timeout", HUGE_S,
        backend=backend,
    ) as server:  # fmt: skip
        assert _wait(server, 0).status_code == 200
        server.signal(signal.SIGTERM)  # nothing in flight: a huge grace does not delay it
        assert server.wait(15) == 0


def test_grace_0_cancels_what_is_in_flight_at_once(tmp_path: Path) -> None:
    with worker(f"{STAGES}:slow", "--grace", "0") as slow_worker:
        with serving(SERVED, "--bind", f"slow={slow_worker.address}", "--grace", "0") as server:
            results: list[httpx.Response] = []
            marker = tmp_path / "m"
            thread = threading.Thread(
                target=lambda: results.append(
                    httpx.post(
                        f"{server.address}/v1/scripts/wait",
                        json={"text": "", "marker": str(marker), "seconds": 30},
                        timeout=30,
                    )
                )
            )
            thread.start()
            wait_for(lambda: (tmp_path / "m.started").exists())
            server.signal(signal.SIGTERM)
            thread.join(20)
            assert results[0].status_code == 503
            assert results[0].json()["error"]["type"] == "draining"
            assert server.wait(15) == 0
        wait_for(lambda: marker.exists() and marker.read_text().startswith("cancelled"))
        slow_worker.signal(signal.SIGTERM)
        assert slow_worker.wait(15) == 0


@pytest.mark.parametrize("value", ["0", HUGE_S])
def test_bls_run_timeout_0_and_huge_are_no_deadline(slow: Proc, value: str) -> None:
    out = run_bls(
        "run", SERVED, "--entry", "wait", "--input", '{"text": "", "seconds": 0.2}',
        "--bind", f"slow={slow.address}", "--timeout", value, "--connect-timeout", HUGE_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["text"] == "waited"


@pytest.mark.parametrize(
    ("command", "flag", "value", "says"),
    [
        ("serve", "--max-inflight", "0", "from 1 to 1000000"),
        ("serve", "--max-inflight", "10000000", "from 1 to 1000000"),
        ("serve", "--port", "70000", "from 0 to 65535"),
        ("serve", "--max-body-bytes", "0", "1 or more"),
        ("serve", "--trace-keep", "-1", "0 or more"),
        ("serve", "--request-timeout", "-1", "0 or more seconds"),
        ("serve", "--body-timeout", "nan", "0 or more seconds"),
        ("serve", "--grace", "-0.5", "0 or more seconds"),
        ("serve", "--connect-timeout", "0", "more than 0 seconds"),
        ("worker", "--max-inflight", "0", "from 1 to 1000000"),
        ("worker", "--max-inflight-per-caller", "0", "from 1 to 1000000"),
        ("worker", "--max-frame-bytes", "0", "from 1 to"),
        ("worker", "--max-frame-bytes", str(2**63), "from 1 to"),
        ("worker", "--grace", "-1", "0 or more seconds"),
        ("run", "--timeout", "-1", "0 or more seconds"),
        ("run", "--connect-timeout", "0", "more than 0 seconds"),
        ("bench", "--concurrency", "0", "from 1 to 10000"),
        ("bench", "--concurrency", "100000", "from 1 to 10000"),
        ("bench", "--requests", "0", "1 or more"),
        ("bench", "--duration", "0", "more than 0 seconds"),
    ],
)
def test_a_number_out_of_range_is_refused_at_start_up_naming_the_flag(
    command: str, flag: str, value: str, says: str
) -> None:
    target = {
        "serve": [SERVED],
        "worker": [f"{STAGES}:slow", "--listen", "tcp://127.0.0.1:0"],
        "run": [SERVED, "--input", "{}"],
        "bench": ["http://127.0.0.1:1", "--entry", "x", "--input", "{}"],
    }[command]
    out = run_bls(command, *target, f"{flag}={value}", timeout=30)
    assert out.returncode == 2, out.stderr
    assert f"argument {flag}" in out.stderr and says in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
