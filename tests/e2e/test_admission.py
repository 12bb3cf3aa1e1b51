"""Admission under `bls serve`, from real HTTP clients: queued requests run highest
X-Priority first and tenants in fair turns; a full queue refuses the request that would
run last; per-entry and per-tenant limits answer 429 with Retry-After; the priority
reaches the stage, inline and in a `bls worker`, and `bls.priority` changes it."""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from .cli import ROOT, run_bls
from .procs import Proc, serving, start, stop, wait_for

SCRIPT = "tests/e2e/pipelines/admission/held.py"
STAGES = str(ROOT / "tests/e2e/pipelines/admission/stages.py")


def _queued(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("bls_requests_queued "):
            return float(line.split()[1])
    raise AssertionError("no bls_requests_queued in /metrics")


class Clients:
    """Requests sent from threads, each waited for in the queue before the next."""

    def __init__(self, server: Proc) -> None:
        self.http = httpx.Client(base_url=server.address, timeout=30)
        self.pool = concurrent.futures.ThreadPoolExecutor(16)

    def send(
        self, tag: str, ms: int, *, queued: int | None = None, entry: str = "held", **headers: str
    ) -> concurrent.futures.Future[httpx.Response]:
        def post() -> httpx.Response:
            with httpx.Client(base_url=self.http.base_url, timeout=30) as http:
                body = {"ms": ms, "tag": tag}
                return http.post(f"/v1/scripts/{entry}", json=body, headers=headers)

        future = self.pool.submit(post)
        if queued is not None:
            wait_for(lambda: _queued(self.http) == queued, timeout=10)
        return future

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.http.close()


@pytest.fixture
def clients() -> Iterator[Any]:
    made: list[Clients] = []

    def make(server: Proc) -> Clients:
        made.append(Clients(server))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _running(http: httpx.Client, n: int) -> None:
    def inflight() -> bool:
        text = http.get("/metrics").text
        return f"bls_requests_in_flight {float(n)}" in text

    wait_for(inflight, timeout=10)


def test_queued_requests_run_highest_priority_first(clients: Any) -> None:
    with serving(SCRIPT, "--max-inflight", "1", "--max-queued", "8") as server:
        c = clients(server)
        first = c.send("first", 1500)
        _running(c.http, 1)
        later = [
            c.send("p0", 50, queued=1),
            c.send("p5", 50, queued=2, **{"X-Priority": "5"}),
            c.send("p-1", 50, queued=3, **{"X-Priority": "-1"}),
            c.send("p5b", 50, queued=4, **{"X-Priority": "5"}),
        ]
        done = [f.result() for f in [first, *later]]
    assert all(r.status_code == 200 for r in done), [r.text for r in done]
    order = [r.json()["tag"] for r in sorted(done, key=lambda r: r.json()["done"])]
    assert order == ["first", "p5", "p5b", "p0", "p-1"]
    assert {r.json()["tag"]: r.json()["priority"] for r in done}["p5"] == 5  # it reached the stage


def test_a_full_queue_refuses_the_request_that_would_run_last(clients: Any) -> None:
    with serving(SCRIPT, "--max-inflight", "1", "--max-queued", "2") as server:
        c = clients(server)
        first = c.send("first", 1500)
        _running(c.http, 1)
        a = c.send("a", 10, queued=1)
        b = c.send("b", 10, queued=2)
        urgent = c.send("urgent", 10, queued=2, **{"X-Priority": "3"})  # b gives way
        b_refused = b.result()
        low = c.send("low", 10, **{"X-Priority": "-3"}).result()  # the last of all: refused
        served = [f.result() for f in (first, a, urgent)]
    for refused in (b_refused, low):
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "overloaded"
        assert "1 requests in flight and 2 waiting" in error["message"]
    assert [r.status_code for r in served] == [200, 200, 200]


def test_a_flooding_tenant_waits_behind_its_own_requests(clients: Any) -> None:
    with serving(SCRIPT, "--max-inflight", "1", "--max-queued", "16") as server:
        c = clients(server)
        first = c.send("first", 2000, **{"X-Tenant": "flood"})
        _running(c.http, 1)
        flood = [c.send(f"f{i}", 50, queued=i + 1, **{"X-Tenant": "flood"}) for i in range(6)]
        quiet = c.send("quiet", 50, queued=7, **{"X-Tenant": "quiet"})
        done = [f.result() for f in [first, *flood, quiet]]
    assert all(r.status_code == 200 for r in done)
    order = [r.json()["tag"] for r in sorted(done, key=lambda r: r.json()["done"])]
    # The quiet tenant's one request goes ahead of all but the flood's first queued one.
    assert order.index("quiet") <= 2, order


def test_entry_and_tenant_limits_answer_429_with_retry_after(clients: Any, tmp_path: Path) -> None:
    config = tmp_path / "limits.toml"
    config.write_text(
        "[admission.entries.held]\nmax_inflight = 1\n\n"
        '[admission.tenants."*"]\nrate = 1\nburst = 2\n\n'
        "[admission.tenants.big]\nmax_inflight = 100\n"
    )
    with serving(SCRIPT, "--config", str(config)) as server:
        c = clients(server)
        busy = c.send("busy", 400, **{"X-Tenant": "big"})
        _running(c.http, 1)
        second = c.http.post(
            "/v1/scripts/held", json={"tag": "second"}, headers={"X-Tenant": "big"}
        )
        assert second.status_code == 429 and second.headers["retry-after"] == "1"
        error = second.json()["error"]
        assert error["type"] == "rate_limited" and error["entry"] == "held"
        assert error["message"] == "entry 'held' is at its limit of 1 requests"
        assert busy.result().status_code == 200

        # A tenant not named gets the "*" limits: a burst of 2, then 1 a second.
        answers = [
            c.http.post("/v1/scripts/background", json={}, headers={"X-Tenant": "t1"})
            for _ in range(3)
        ]
        assert [r.status_code for r in answers] == [200, 200, 429]
        assert answers[2].headers["retry-after"] == "1"
        assert answers[2].json()["error"]["message"] == (
            "tenant 't1' is over its rate of 1 requests a second"
        )
        other = c.http.post("/v1/scripts/background", json={}, headers={"X-Tenant": "t2"})
        assert other.status_code == 200  # each tenant its own bucket


def test_bad_priority_and_tenant_headers_are_400(clients: Any) -> None:
    with serving(SCRIPT) as server, httpx.Client(base_url=server.address, timeout=30) as http:
        for headers, path in (
            ({"X-Priority": "high"}, "X-Priority"),
            ({"X-Priority": "5000"}, "X-Priority"),
            ({"X-Tenant": "x" * 200}, "X-Tenant"),
        ):
            r = http.post("/v1/scripts/held", json={}, headers=headers)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["path"] == path
        r = http.post("/v1/scripts/held", json={}, headers={"X-Priority": "high"})
        assert "X-Priority must be an integer from -1000 to 1000, got 'high'" in r.text
        assert http.post("/v1/scripts/held", json={}).status_code == 200  # still serving


def test_an_admission_limit_for_an_unknown_entry_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "limits.toml"
    config.write_text("[admission.entries.hled]\nmax_inflight = 1\n")
    done = run_bls("check", SCRIPT, "--config", str(config))
    assert done.returncode == 1
    assert "[admission.entries.hled]: no entry 'hled' (entries: held, background)" in done.stderr
    config.write_text("[admission.tenants.a]\nrate = 0\n")
    done = run_bls("check", SCRIPT, "--config", str(config))
    assert done.returncode == 1
    assert "[admission.tenants.a]: Expected `float` > 0.0 - at `$.rate`" in done.stderr


TENANTS = """
KEYS = {"sk-a": "team-a", "sk-b": "team-b"}


def by_key(head):
    token = head.headers.get("authorization", "").removeprefix("Bearer ")
    if token == "sk-boom":
        raise KeyError("no such key")
    if token == "sk-bad":
        return "bad\\ttenant"
    assert head.entry == "held" and head.path == "/v1/scripts/held" and head.client
    return KEYS.get(token)
"""


def test_a_tenant_function_names_the_tenant_from_the_api_key(clients: Any, tmp_path: Path) -> None:
    (tmp_path / "tenants.py").write_text(TENANTS)
    config = tmp_path / "bls.toml"
    config.write_text(
        '[admission]\ntenant = "tenants.py:by_key"\n\n[admission.tenants."*"]\nrate = 0.1\n'
    )
    with serving(SCRIPT, "--config", str(config)) as server:
        http = clients(server).http

        def post(key: str, **headers: str) -> httpx.Response:
            headers["Authorization"] = f"Bearer {key}"
            return http.post("/v1/scripts/held", json={}, headers=headers)

        assert post("sk-a").status_code == 200
        # Team a's one request of its burst is spent, whatever X-Tenant the client claims.
        again = post("sk-a", **{"X-Tenant": "someone-else"})
        assert again.status_code == 429, again.text
        assert again.json()["error"]["message"] == (
            "tenant 'team-a' is over its rate of 0.1 requests a second"
        )
        assert post("sk-b").status_code == 200  # another key, another tenant
        assert post("sk-unknown").status_code == 200  # None: the tenant "default"
        for key, why in (
            ("sk-boom", "the tenant function by_key failed: KeyError: 'no such key'"),
            ("sk-bad", "the tenant function by_key returned 'bad\\ttenant': a tenant is"),
        ):
            failed = post(key)
            assert failed.status_code == 500
            assert failed.json()["error"]["message"].startswith(why), failed.text
        assert post("sk-b").status_code == 429  # still serving, still counting
    logged = "the tenant function by_key failed on a request to 'held'"
    assert any(logged in line for line in server.lines)


def test_a_tenant_function_that_does_not_load_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tenants.py").write_text(TENANTS)
    config = tmp_path / "bls.toml"
    for target, why in (
        ("tenants.py:by_kye", "tenants.py has no attribute 'by_kye' (did you mean 'by_key'?)"),
        ("tenants.py:KEYS", "expected a plain (not async) function of the request's head"),
    ):
        config.write_text(f'[admission]\ntenant = "{target}"\n')
        done = run_bls("check", SCRIPT, "--config", str(config))
        assert done.returncode == 1
        assert f"[admission] tenant = '{target}': {why}" in done.stderr, done.stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_priority_travels_to_a_remote_worker(backend: str) -> None:
    worker = start(["worker", f"{STAGES}:hold", "--listen", "tcp://127.0.0.1:0"])
    try:
        with (
            serving(SCRIPT, "--bind", f"hold={worker.address}", backend=backend) as server,
            httpx.Client(base_url=server.address, timeout=30) as http,
        ):
            r = http.post("/v1/scripts/held", json={}, headers={"X-Priority": "7"})
            assert r.status_code == 200 and r.json()["priority"] == 7
            r = http.post("/v1/scripts/held", json={})
            assert r.json()["priority"] == 0
            r = http.post("/v1/scripts/background", json={}, headers={"X-Priority": "7"})
            assert r.json()["priority"] == -5  # the script's bls.priority block
    finally:
        stop(worker.popen)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_queued_requests_whose_clients_left_give_up_their_places(
    clients: Any, backend: str
) -> None:
    with serving(SCRIPT, "--max-inflight", "1", "--max-queued", "50", backend=backend) as server:
        c = clients(server)
        first = c.send("first", 3000)
        _running(c.http, 1)
        url = urlsplit(server.address)
        body = b'{"ms": 10, "tag": "gone"}'
        head = (
            b"POST /v1/scripts/held HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        for _ in range(50):  # fill the queue, then leave
            with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
                sock.sendall(head + body)
        # Each gives its place up as its client leaves: the queue empties long before the
        # request that holds the slot ends, and a live client waits in it, not refused.
        wait_for(lambda: _queued(c.http) == 0, timeout=5)
        live = c.send("live", 10, queued=1)
        assert live.result().status_code == 200 and first.result().status_code == 200
        metrics = c.http.get("/metrics").text
        assert 'bls_cancellations_total{reason="disconnect"} 50.0' in metrics
