"""A frontend, etcd and two workers as separate hosts: network namespaces on a private
bridge, each process in its own, the client in another. The workers register their own
host's address; the frontend finds them through etcd and spreads calls over both; when
one host's worker dies, the other takes every call."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cli import BLS
from .etcd import EtcdServer, require_etcd
from .hosts import Hosts, can_build_hosts, hosts
from .procs import Proc, start, stop, wait_for

require_etcd()
_WHY = can_build_hosts()
if _WHY and os.environ.get("BLS_REQUIRE_NETNS"):
    raise RuntimeError(f"BLS_REQUIRE_NETNS is set but {_WHY}")
pytestmark = pytest.mark.skipif(bool(_WHY), reason=f"separate hosts need namespaces: {_WHY}")

SERVED = "tests/e2e/served/served.py"
WHOAMI = "tests/e2e/pipelines/remote_stages.py:whoami"


@pytest.fixture
def net() -> Iterator[Hosts]:
    with hosts(["etcd", "front", "w1", "w2", "client"], delay_ms=0.5) as made:
        yield made


def ask(net: Hosts, url: str) -> tuple[int, dict[str, object]]:
    """POST greet from the client host; (status, body)."""
    out = subprocess.run(
        [*net.run("client"), "curl", "-s", "-m", "10", "-w", "\n%{http_code}",
         "-H", "content-type: application/json", "-d", '{"text": "x"}',
         f"{url}/v1/scripts/greet"],
        capture_output=True, text=True, timeout=20,
    )  # fmt: skip
    body, _, status = out.stdout.rpartition("\n")
    return int(status or 0), json.loads(body) if body else {}


def test_frontend_and_workers_on_separate_hosts(net: Hosts, tmp_path: Path) -> None:
    etcd = EtcdServer(tmp_path / "etcd", host=net.address("etcd"), run=net.run("etcd"))
    etcd.start()
    procs: list[Proc] = []
    try:
        for name in ("w1", "w2"):
            procs.append(
                start(
                    ["worker", WHOAMI, "--listen", f"tcp://{net.address(name)}:5555",
                     "--discovery", etcd.url],
                    program=[*net.run(name), BLS],
                )
            )  # fmt: skip
        w1, w2 = procs
        wait_for(lambda: len(etcd.keys("/bls/stages/whoami/")) == 2, timeout=15)
        addresses = sorted(json.loads(v)["address"] for v in etcd.keys().values())
        assert addresses == [f"tcp://{net.address('w1')}:5555", f"tcp://{net.address('w2')}:5555"]
        frontend = start(
            ["serve", SERVED, "--host", net.address("front"), "--port", "8000",
             "--bind", "whoami=etcd:whoami", "--discovery", etcd.url],
            program=[*net.run("front"), BLS],
        )  # fmt: skip
        procs.append(frontend)
        url = frontend.address
        assert url == f"http://{net.address('front')}:8000"
        wait_for(lambda: len(frontend_replicas(frontend)) == 2, timeout=15)

        answers = [ask(net, url) for _ in range(20)]
        assert {status for status, _ in answers} == {200}
        assert {body["pid"] for _, body in answers} == {w1.pid, w2.pid}  # both hosts serve

        w1.signal(signal.SIGKILL)  # a host's worker dies: its lease expires in etcd
        wait_for(lambda: len(etcd.keys("/bls/stages/whoami/")) == 1, timeout=10)
        wait_for(lambda: "replica tcp://" in frontend.log() and " left" in frontend.log(), 10)
        answers = [ask(net, url) for _ in range(10)]
        assert answers and all(s == 200 and b["pid"] == w2.pid for s, b in answers)
        if net.no_delay:
            print(f"hosts without added latency ({net.no_delay})")
    finally:
        for proc in procs:
            stop(proc.popen)
        etcd.stop()


def frontend_replicas(frontend: Proc) -> list[str]:
    return [line for line in frontend.lines if "answered: it takes calls now" in line]
