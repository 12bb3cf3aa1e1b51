"""`bls serve` for real: a server subprocess, `bls worker` subprocesses, httpx and raw sockets."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from .procs import Proc, serving, start, stop, wait_for, worker
from .rawio import receive_until

SERVED = "tests/e2e/served/served.py"
STAGES = "tests/e2e/pipelines/remote_stages.py"


def serve(*extra: str, backend: str = "asyncio") -> AbstractContextManager[Proc]:
    """``bls serve`` of the served script on a free port for the duration of the block."""
    return serving(SERVED, *extra, backend=backend)


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, Proc]]:
    """One real worker for each of the stages the served script calls."""
    with (
        worker(f"{STAGES}:whoami") as who,
        worker(f"{STAGES}:slow") as slow,
        worker(f"{STAGES}:ticks") as ticks,
    ):
        yield {"whoami": who, "slow": slow, "ticks": ticks}


def _binds(workers: dict[str, Proc]) -> list[str]:
    return [arg for name, proc in workers.items() for arg in ("--bind", f"{name}={proc.address}")]


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def server(request: pytest.FixtureRequest, workers: dict[str, Proc]) -> Iterator[Proc]:
    """``bls serve`` with every stage but ``boom`` remote, on each backend."""
    with serve(*_binds(workers), backend=request.param) as proc:
        yield proc


@pytest.fixture
def http(server: Proc) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.address, timeout=30) as client:
        yield client


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) pairs of an SSE body."""
    events = []
    for block in text.strip().split("\n\n"):
        event, data = "message", ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        events.append((event, data))
    return events


# -- answering ------------------------------------------------------------------------


def test_unary_entry_answers_json_from_a_remote_stage(
    http: httpx.Client, workers: dict[str, Proc]
) -> None:
    r = http.post("/v1/scripts/greet", json={"text": "ada"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {"text": "hello ada", "pid": workers["whoami"].pid}
    assert len(r.headers["x-request-id"]) >= 8


def test_request_id_is_the_clients_when_given(http: httpx.Client) -> None:
    r = http.post("/v1/scripts/greet", json={"text": "x"}, headers={"X-Request-Id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = http.post("/v1/scripts/nope", json={}, headers={"X-Request-Id": "abc-124"})
    assert r.headers["x-request-id"] == "abc-124"


def test_streaming_entry_answers_sse_then_end(http: httpx.Client) -> None:
    r = http.post("/v1/scripts/count", json={"text": "", "n": 4})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[:-1] == [
        ("message", json.dumps({"i": i}, separators=(",", ":"))) for i in range(4)
    ]
    assert events[-1][0] == "end"


def test_streaming_entry_answers_ndjson_when_asked(http: httpx.Client) -> None:
    r = http.post(
        "/v1/scripts/count",
        json={"text": "", "n": 3},
        headers={"Accept": "application/x-ndjson"},
    )
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line) for line in r.text.splitlines()] == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_items_arrive_as_they_are_produced(http: httpx.Client, tmp_path: Path) -> None:
    """The first event is readable while the worker is still producing the rest."""
    marker = tmp_path / "count"
    body = {"text": "", "n": 3, "seconds": 1.0, "marker": str(marker)}
    with http.stream("POST", "/v1/scripts/count", json=body) as r:
        first = next(r.iter_lines())
        assert first == 'data: {"i":0}'
        # The worker has not produced its third item yet: nothing was held back for it.
        produced = int(Path(str(marker) + ".produced").read_text().split()[0])
        assert produced < 3 and not marker.exists()


# -- bad input ------------------------------------------------------------------------

BAD_INPUT = [
    ("greet", b'{"text": "unterminated', 422, "$"),
    ("greet", b"not json at all", 422, "$"),
    ("greet", b"{}", 422, "$"),
    ("greet", b'{"text": 5}', 422, "$.text"),
    ("greet", b'["text"]', 422, "$"),
    (
        "total",
        b'{"customer": "x", "parts": [{"name": "a", "n": 1}, {"name": "b", "n": "2"}]}',
        422,
        "$.parts[1].n",
    ),
    ("total", b'{"customer": "x", "parts": [{"name": "a"}]}', 422, "$.parts[0]"),
    ("nope", b"{}", 404, None),
]


@pytest.mark.parametrize(("entry", "body", "status", "path"), BAD_INPUT)
def test_bad_input_gets_a_clear_error_with_the_field_path(
    http: httpx.Client, entry: str, body: bytes, status: int, path: str | None
) -> None:
    r = http.post(f"/v1/scripts/{entry}", content=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["path"] == path
    assert error["message"]
    assert "Traceback" not in r.text
    if status == 422:
        assert error["type"] == "invalid_request"
        assert error["entry"] == entry and error["stage"] is None


def test_missing_field_is_named(http: httpx.Client) -> None:
    error = http.post("/v1/scripts/greet", json={}).json()["error"]
    assert "text" in error["message"]


def test_an_empty_body_says_so_and_what_the_entry_expects(http: httpx.Client) -> None:
    for body in (b"", b"  \n"):
        r = http.post("/v1/scripts/greet", content=body)
        assert r.status_code == 422
        assert r.json()["error"]["message"] == (
            "the body is empty: entry 'greet' expects a JSON object (required fields: `text`)"
        )


def test_huge_body_gets_413_before_it_is_read(server: Proc) -> None:
    """The declared length is refused at once; the server does not wait for the body."""
    url = urlsplit(server.address)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/scripts/greet HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n{"
        )
        head = receive_until(sock, lambda d: b"\r\n" in d, timeout=10).decode()
    assert head.startswith("HTTP/1.1 413"), head


def test_streamed_body_over_the_limit_gets_413(workers: dict[str, Proc]) -> None:
    with serve("--max-body-bytes", "1000") as proc:

        def chunks() -> Iterator[bytes]:
            yield b'{"text": "'
            for _ in range(50):
                yield b"x" * 100
            yield b'"}'

        r = httpx.post(f"{proc.address}/v1/scripts/greet", content=chunks(), timeout=10)
        assert r.status_code == 413
        assert r.json()["error"]["type"] == "too_large"


def test_wrong_method_and_unknown_route(http: httpx.Client) -> None:
    wrong = http.get("/v1/scripts/greet")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert http.head("/v1/scripts/greet").status_code == 405
    health = http.post("/health")
    assert health.status_code == 405 and health.headers["allow"] == "GET, HEAD"
    r = http.get("/nowhere")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found"
    page = http.post("/debug/requests/x")  # a prefix route with another method
    assert page.status_code == 405 and page.headers["allow"] == "GET, HEAD"


def test_a_get_route_answers_head_with_its_head_alone(http: httpx.Client) -> None:
    for path in ("/health", "/metrics", "/v1/scripts"):
        got = http.get(path)
        head = http.head(path)  # (on the same connection: no body may follow the head)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-type"] == got.headers["content-type"]
    assert http.head("/health").headers["content-length"] == str(len(b'{"status":"ok"}'))
    assert http.get("/health").json() == {"status": "ok"}  # the connection still in step


# -- stage failures and deadlines -----------------------------------------------------


def test_stage_error_is_502_naming_the_stage(http: httpx.Client) -> None:
    r = http.post("/v1/scripts/fail", json={"text": "zz"})
    assert r.status_code == 502
    error = r.json()["error"]
    assert error == {
        "type": "stage_error",
        "message": "bad marker 'zz'",
        "stage": "boom",
        "path": None,
        "kind": "ValueError",
        "code": 502,
        "entry": "fail",
    }


def test_a_script_that_raises_is_a_500_without_its_traceback(
    http: httpx.Client, server: Proc
) -> None:
    r = http.post("/v1/scripts/oops", json={"text": "x"})
    assert r.status_code == 500
    error = r.json()["error"]
    assert error["type"] == "internal"
    assert error["message"] == "the script failed: RuntimeError: a bug in the script"
    assert "Traceback" not in r.text
    rid = r.headers["x-request-id"]
    wait_for(lambda: any(f"request {rid}" in line for line in server.lines))
    assert "Traceback" in server.log()  # the log has it


def test_an_error_naming_a_file_that_is_not_utf8_is_answered_escaped(
    http: httpx.Client,
) -> None:
    # Python holds a file name that is not UTF-8 with a lone surrogate, which no UTF-8
    # encoder takes; an error message naming one is answered with it escaped, whether
    # the script raised it (500), a stage (502) or a stream after its first item.
    named = "cannot read photo-\\udce9.jpg"
    r = http.post("/v1/scripts/oops", json={"text": "latin-1"})
    assert r.status_code == 500
    assert r.json()["error"]["message"] == f"the script failed: RuntimeError: {named}"
    r = http.post("/v1/scripts/fail", json={"text": "latin-1"})
    assert r.status_code == 502
    assert (r.json()["error"]["kind"], r.json()["error"]["message"]) == ("ValueError", named)
    r = http.post("/v1/scripts/count", json={"text": "latin-1", "n": 3, "seconds": 0})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[0] == ("message", '{"i":0}') and events[-1][0] == "error"
    assert (
        json.loads(events[-1][1])["error"]["message"] == f"the script failed: RuntimeError: {named}"
    )


def test_a_worker_whose_stage_names_a_file_that_is_not_utf8_answers_and_lives(
    workers: dict[str, Proc],
) -> None:
    with (
        worker(f"{STAGES}:boom") as remote,
        serve(*_binds(workers), "--bind", f"boom={remote.address}") as proc,
    ):
        for _ in range(2):  # (the second from a new client)
            with httpx.Client(base_url=proc.address, timeout=30) as client:
                r = client.post("/v1/scripts/fail", json={"text": "latin-1"})
            assert r.status_code == 502
            assert r.json()["error"]["message"] == "cannot read photo-\\udce9.jpg"
        r = httpx.post(f"{proc.address}/v1/scripts/fail", json={"text": "zz"}, timeout=30)
        assert r.json()["error"]["message"] == "bad marker 'zz'"
        assert remote.popen.poll() is None


def test_deadline_header_reaches_the_remote_worker(http: httpx.Client, tmp_path: Path) -> None:
    marker = tmp_path / "slow"
    started = time.monotonic()
    r = http.post(
        "/v1/scripts/wait",
        json={"text": "", "marker": str(marker), "seconds": 30},
        headers={"X-Request-Timeout": "0.5"},
    )
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "deadline_exceeded"
    assert time.monotonic() - started < 5
    wait_for(lambda: marker.exists() and marker.read_text().startswith("cancelled"))


def test_bad_deadline_header_is_400(http: httpx.Client) -> None:
    r = http.post("/v1/scripts/greet", json={"text": "x"}, headers={"X-Request-Timeout": "soon"})
    assert r.status_code == 400
    assert r.json()["error"]["path"] == "X-Request-Timeout"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_request_timeout_flag_bounds_the_header(
    workers: dict[str, Proc], tmp_path: Path, backend: str
) -> None:
    with serve(*_binds(workers), "--request-timeout", "0.3", backend=backend) as proc:
        started = time.monotonic()
        r = httpx.post(
            f"{proc.address}/v1/scripts/wait",
            json={"text": "", "seconds": 30},
            headers={"X-Request-Timeout": "60"},
            timeout=30,
        )
        assert r.status_code == 504
        assert time.monotonic() - started < 5


def test_error_after_the_stream_started_ends_it_with_an_error_event(
    http: httpx.Client,
) -> None:
    r = http.post(
        "/v1/scripts/count",
        json={"text": "", "n": 100, "seconds": 0.2},
        headers={"X-Request-Timeout": "0.5"},
    )
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[0] == ("message", '{"i":0}')
    assert events[-1][0] == "error"
    assert json.loads(events[-1][1])["error"]["type"] == "deadline_exceeded"
    assert _metric(http.get("/metrics").text, "bls_cancellations_total", reason="deadline") >= 1


def test_an_ndjson_stream_ends_an_error_with_an_error_line(http: httpx.Client) -> None:
    r = http.post(
        "/v1/scripts/count",
        json={"text": "", "n": 100, "seconds": 0.2},
        headers={"X-Request-Timeout": "0.5", "Accept": "application/x-ndjson"},
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[0] == {"i": 0}
    assert lines[-1]["error"]["type"] == "deadline_exceeded"


# -- disconnect = cancel --------------------------------------------------------------


def _raw_post(address: str, path: str, body: dict[str, object]) -> socket.socket:
    url = urlsplit(address)
    data = json.dumps(body).encode()
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_disconnect_mid_stream_cancels_the_remote_handler(server: Proc, tmp_path: Path) -> None:
    marker = tmp_path / "ticks"
    sock = _raw_post(
        server.address,
        "/v1/scripts/count",
        {"text": "", "marker": str(marker), "seconds": 0.05, "n": 100000},
    )
    received = receive_until(sock, lambda d: d.count(b"data: ") >= 3)
    assert received.startswith(b"HTTP/1.1 200")
    sock.close()
    wait_for(lambda: marker.exists(), timeout=10)
    # The marker is written as the handler ends: by then it produced all it ever will.
    assert marker.read_text().split()[0] in ("cancelled", "closed")
    assert int((tmp_path / "ticks.produced").read_text().split()[0]) < 100000
    # A stream the client dropped is a 499 like any dropped request, though its headers
    # went out as 200: in the timeline, the metrics and the access log.
    rid = received.split(b"x-request-id: ")[1].split(b"\r\n")[0].decode()
    with httpx.Client(base_url=server.address) as http:
        wait_for(lambda: _status_of(http, rid) == 499)
        assert _metric(http.get("/metrics").text, "bls_requests_total", entry="count", status="499")
    wait_for(lambda: any(rid in line and " 499 " in line for line in server.lines))


def _status_of(http: httpx.Client, rid: str) -> int:
    listing = http.get("/debug/requests", headers={"Accept": "application/json"}).json()
    return next((t["status"] for t in listing if t["id"] == rid), 0)


def test_a_stream_left_by_break_closes_its_span_and_counts(http: httpx.Client) -> None:
    before = _metric(http.get("/metrics").text, "bls_stage_calls_total", 0.0, stage="ticks")
    r = http.post("/v1/scripts/first", json={"text": "", "n": 1000, "seconds": 0.01})
    assert r.status_code == 200 and r.json() == {"i": 0}
    rid = r.headers["x-request-id"]
    spans = http.get(f"/debug/requests/{rid}", headers={"Accept": "application/json"})
    (ticks,) = [s for s in spans.json()["spans"] if s["name"] == "ticks" and not s["remote"]]
    assert ticks["outcome"] == "cancelled" and ticks["end"] >= ticks["start"] > 0
    after = _metric(http.get("/metrics").text, "bls_stage_calls_total", stage="ticks")
    assert after == before + 1


def test_an_unknown_request_field_is_a_422_naming_it(http: httpx.Client) -> None:
    r = http.post("/v1/scripts/greet", json={"text": "hi", "txet": "typo"})
    assert r.status_code == 422
    assert "unknown field `txet`" in r.json()["error"]["message"]


def test_disconnect_mid_request_cancels_the_remote_handler(server: Proc, tmp_path: Path) -> None:
    marker = tmp_path / "slow"
    sock = _raw_post(
        server.address, "/v1/scripts/wait", {"text": "", "marker": str(marker), "seconds": 30}
    )
    wait_for(lambda: (tmp_path / "slow.started").exists())
    sock.close()
    wait_for(lambda: marker.exists() and marker.read_text().startswith("cancelled"), timeout=10)
    # The request is recorded as cancelled by the disconnect (499: client closed request).
    with httpx.Client(base_url=server.address) as http:
        wait_for(
            lambda: any(
                t["entry"] == "wait" and t["status"] == 499
                for t in http.get("/debug/requests", headers={"Accept": "application/json"}).json()
            )
        )
        assert (
            _metric(http.get("/metrics").text, "bls_cancellations_total", reason="disconnect") >= 1
        )


# -- admission control and drain ------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_burst_over_max_inflight_gets_429(
    workers: dict[str, Proc], tmp_path: Path, backend: str
) -> None:
    with serve(*_binds(workers), "--max-inflight", "2", backend=backend) as proc:
        socks = []
        for i in range(2):
            socks.append(
                _raw_post(
                    proc.address,
                    "/v1/scripts/wait",
                    {"text": "", "marker": str(tmp_path / f"m{i}"), "seconds": 30},
                )
            )
        wait_for(lambda: all((tmp_path / f"m{i}.started").exists() for i in range(2)))
        statuses = [
            httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "x"}, timeout=10)
            for _ in range(5)
        ]
        assert {r.status_code for r in statuses} == {429}
        assert statuses[0].headers["retry-after"] == "1"
        assert statuses[0].json()["error"]["type"] == "overloaded"
        for sock in socks:
            sock.close()
        # Capacity comes back once the two are cancelled by their disconnects.
        wait_for(
            lambda: (
                httpx.post(
                    f"{proc.address}/v1/scripts/greet", json={"text": "x"}, timeout=10
                ).status_code
                == 200
            )
        )


@pytest.mark.parametrize(
    ("backend", "signum"),
    [("asyncio", signal.SIGTERM), ("trio", signal.SIGTERM), ("asyncio", signal.SIGINT)],
)
def test_sigterm_drains_in_flight_requests(
    workers: dict[str, Proc], tmp_path: Path, backend: str, signum: int
) -> None:
    with serve(*_binds(workers), "--grace", "20", backend=backend) as proc:
        results: list[httpx.Response] = []

        def call(i: int) -> None:
            results.append(
                httpx.post(
                    f"{proc.address}/v1/scripts/wait",
                    json={"text": "", "marker": str(tmp_path / f"d{i}"), "seconds": 1.5},
                    timeout=30,
                )
            )

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: all((tmp_path / f"d{i}.started").exists() for i in range(4)))
        proc.signal(signum)
        wait_for(lambda: httpx.get(f"{proc.address}/ready").status_code == 503, timeout=5)
        late = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "x"})
        assert late.status_code == 503
        assert late.json()["error"]["type"] == "draining"
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results] == [200] * 4
        assert proc.wait(15) == 0


def test_grace_over_cancels_the_rest_with_an_answer(
    workers: dict[str, Proc], tmp_path: Path
) -> None:
    with serve(*_binds(workers), "--grace", "0.5") as proc:
        results: list[httpx.Response] = []
        marker = tmp_path / "g"
        thread = threading.Thread(
            target=lambda: results.append(
                httpx.post(
                    f"{proc.address}/v1/scripts/wait",
                    json={"text": "", "marker": str(marker), "seconds": 30},
                    timeout=30,
                )
            )
        )
        thread.start()
        wait_for(lambda: (tmp_path / "g.started").exists())
        proc.signal(signal.SIGTERM)
        thread.join(20)
        assert results[0].status_code == 503
        assert proc.wait(15) == 0
        wait_for(lambda: marker.exists() and marker.read_text().startswith("cancelled"))


def test_ready_flips_when_a_worker_dies(tmp_path: Path) -> None:
    with worker(f"{STAGES}:whoami") as who, serve("--bind", f"whoami={who.address}") as proc:
        assert httpx.get(f"{proc.address}/ready").status_code == 200
        assert httpx.get(f"{proc.address}/health").status_code == 200
        who.signal(signal.SIGKILL)
        wait_for(lambda: httpx.get(f"{proc.address}/ready").status_code == 503, timeout=10)
        error = httpx.get(f"{proc.address}/ready").json()["error"]
        assert error["stage"] == "whoami"
        r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "x"})
        assert r.status_code == 503
        assert r.json()["error"]["stage"] == "whoami"
        assert httpx.get(f"{proc.address}/health").status_code == 200


def test_a_stage_without_replicas_is_reported_at_start_and_serving_starts() -> None:
    # (tests/e2e/test_start_order.py follows the worker arriving later.)
    with serve("--bind", "whoami=tcp://127.0.0.1:1", "--connect-timeout", "0.2") as proc:
        log = proc.log()
        assert "stage 'whoami': no replica answered" in log and "starting without it" in log
        assert httpx.get(f"{proc.address}/ready").status_code == 503


# -- metrics, listing, OpenAPI --------------------------------------------------------


def _metric(text: str, name: str, missing: float | None = None, **labels: str) -> float:
    """A sample's value; a sample that is not there fails, unless ``missing`` stands in
    for it (a counter before its first event)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    assert missing is not None, f"no {name}{{{want}}} in the metrics"
    return missing


def test_metrics_counters_move(http: httpx.Client) -> None:
    before = http.get("/metrics").text
    for _ in range(3):
        assert http.post("/v1/scripts/greet", json={"text": "m"}).status_code == 200
    http.post("/v1/scripts/fail", json={"text": "m"})
    after = http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text

    def moved(name: str, **labels: str) -> float:
        return _metric(text, name, **labels) - _metric(before, name, 0.0, **labels)

    assert moved("bls_requests_total", entry="greet", status="200") == 3
    assert moved("bls_requests_total", entry="fail", status="502") == 1
    assert moved("bls_stage_calls_total", stage="whoami") == 3
    assert moved("bls_stage_errors_total", stage="boom", kind="ValueError") == 1
    assert moved("bls_request_duration_seconds_count", entry="greet") == 3
    assert moved("bls_stage_duration_seconds_count", stage="whoami") == 3
    assert _metric(text, "bls_requests_in_flight") == 0


def test_scripts_listing_and_openapi(http: httpx.Client) -> None:
    listing = {s["name"]: s for s in http.get("/v1/scripts").json()["scripts"]}
    assert set(listing) == {
        "greet",
        "wait",
        "count",
        "first",
        "fail",
        "oops",
        "total",
        "fanout",
        "chat",
    }
    assert listing["count"]["streaming"] is True
    assert listing["chat"]["openai"] == "chat"
    assert "text" in json.dumps(listing["greet"]["request"])
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    op = doc["paths"]["/v1/scripts/total"]["post"]
    ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    order = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert set(order["required"]) == {"customer", "parts"}
    assert "422" in op["responses"] and "429" in op["responses"]
    assert (
        "text/event-stream"
        in doc["paths"]["/v1/scripts/count"]["post"]["responses"]["200"]["content"]
    )


# -- OpenAI-compatible chat -----------------------------------------------------------


def test_openai_client_chat_completion(server: Proc, workers: dict[str, Proc]) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.address}/v1", api_key="unused", max_retries=0)
    done = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello there"}]
    )
    assert done.choices[0].message.content == "HELLO THERE (hi)"
    assert done.choices[0].message.role == "assistant"
    assert done.model == "tiny"

    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "one two"}], stream=True
    )
    deltas = [c.choices[0].delta.content or "" for c in stream]
    assert "".join(deltas) == "ONE TWO (hi)"
    assert deltas[1:3] == ["ONE ", "TWO "]


def test_openai_client_sees_bad_requests_as_errors(server: Proc) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.address}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="tiny", messages=[{"content": "no role"}])  # type: ignore[misc,list-item]
    assert "role" in str(info.value)
    assert info.value.body["path"] == "$.messages[0]"  # type: ignore[index]


# -- traces ---------------------------------------------------------------------------


def test_request_trace_has_a_span_per_stage_call_including_remote_ones(
    http: httpx.Client, workers: dict[str, Proc], tmp_path: Path
) -> None:
    r = http.post("/v1/scripts/fanout", json={"text": "", "marker": str(tmp_path / "race")})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    trace = http.get(f"/debug/requests/{rid}", headers={"Accept": "application/json"}).json()
    assert trace["entry"] == "fanout" and trace["status"] == 200
    spans = trace["spans"]
    root = next(s for s in spans if s["parent"] == 0)
    assert (root["name"], root["outcome"]) == ("fanout", "ok")
    calls = [s for s in spans if s["parent"] == root["id"]]
    assert sorted(s["name"] for s in calls) == ["slow", "slow", "slow", "whoami"]
    (slow,) = [s for s in calls if s["name"] == "slow" and s["outcome"] == "cancelled"]
    whoami = [s for s in calls if s["name"] == "whoami"]
    assert all(s["outcome"] == "ok" and s["replica"] == workers["whoami"].address for s in whoami)
    assert all(s["bytes_out"] > 0 and s["bytes_in"] > 0 for s in whoami)
    # The gathered pair (50 ms each) ran side by side.
    pair = [s for s in calls if s["name"] == "slow" and s["outcome"] == "ok"]
    first, second = sorted(pair, key=lambda s: s["start"])
    assert second["start"] < first["end"]
    # Each remote call carries the worker's own span, reported back over the wire.
    remote = [s for s in spans if s["remote"]]
    assert {s["parent"] for s in remote if s["name"] == "whoami"} >= {s["id"] for s in whoami}
    assert {s["parent"] for s in remote if s["name"] == "slow"} >= {s["id"] for s in pair}

    # The cancelled call's worker span comes back with the cancel's acknowledgement.
    def worker_span_of_the_loser() -> list[dict[str, object]]:
        spans = http.get(f"/debug/requests/{rid}", headers={"Accept": "application/json"})
        return [s for s in spans.json()["spans"] if s["remote"] and s["parent"] == slow["id"]]

    wait_for(lambda: bool(worker_span_of_the_loser()))
    assert worker_span_of_the_loser()[0]["outcome"] == "cancelled"
    listing = http.get("/debug/requests", headers={"Accept": "application/json"}).json()
    assert rid in [t["id"] for t in listing]
    assert http.get("/debug/requests/nope").status_code == 404


def test_traces_export_through_opentelemetry_when_configured(workers: dict[str, Proc]) -> None:
    from .cli import bls_env

    proc = start(
        ["serve", SERVED, "--port", "0", *_binds(workers)],
        env=bls_env(OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="served"),
    )
    try:
        r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "o"}, timeout=10)
        assert r.status_code == 200
        proc.signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        stop(proc.popen)
    assert proc.out == []  # stdout is for the ready line only; spans are diagnostics
    exported = proc.log()
    assert '"name": "request greet"' in exported
    assert '"name": "stage whoami"' in exported
    assert r.headers["x-request-id"] in exported
    assert '"service.name": "served"' in exported


def test_a_cached_stage_reports_hits_and_misses_in_metrics(
    workers: dict[str, Proc], tmp_path: Path
) -> None:
    config = tmp_path / "cache.toml"
    config.write_text("[stages.whoami]\ninline = 'x:y'\ncache = { capacity_mb = 1 }\n")
    # --bind moves the stage to the remote worker and keeps the cache in front of it.
    with serve("--config", str(config), "--bind", f"whoami={workers['whoami'].address}") as proc:
        for _ in range(3):
            r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "c"}, timeout=10)
            assert r.json() == {"text": "hello c", "pid": workers["whoami"].pid}
        text = httpx.get(f"{proc.address}/metrics").text
    assert _metric(text, "bls_cache_misses_total", stage="whoami") == 1
    assert _metric(text, "bls_cache_hits_total", stage="whoami") == 2
    assert _metric(text, "bls_cache_entries", stage="whoami") == 1
    assert _metric(text, "bls_cache_bytes", stage="whoami") > 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_hypercorn_still_serves_when_asked(workers: dict[str, Proc], backend: str) -> None:
    with serve(*_binds(workers), "--server", "hypercorn", backend=backend) as proc:
        r = httpx.post(f"{proc.address}/v1/scripts/greet", json={"text": "ada"}, timeout=30)
        assert r.status_code == 200 and r.json()["text"] == "hello ada"
        streamed = httpx.post(f"{proc.address}/v1/scripts/count", json={"text": "x", "n": 3})
        assert streamed.status_code == 200 and streamed.text.count("data:") >= 3
    assert "with hypercorn/" in proc.log()
