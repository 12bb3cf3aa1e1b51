"""examples/interfaces over HTTP: four pipelines composed by configuration alone, the same
answer with the stages in `bls worker` processes, and a binding that does not satisfy an
interface refused at start-up."""

from __future__ import annotations

import json

import httpx
import pytest

from .cli import ROOT, run_bls
from .procs import serving, start, stop, worker

SCRIPT = "examples/interfaces/interfaces.py"
HERE = "examples/interfaces"
REQUEST = json.loads((ROOT / HERE / "request.json").read_text())
SHOUT = ["HELLO", "FROM", "THE", "INTERFACES", "EXAMPLE"]
MIXED = ["hElLo", "fRoM", "tHe", "iNtErFaCeS", "eXaMpLe"]


def tokens(url: str) -> list[str]:
    with httpx.stream("POST", f"{url}/v1/scripts/generate", json=REQUEST, timeout=30) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:])["text"] for line in lines[:-1]]  # the last: the end event


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (None, SHOUT),
        ("fast-mixed.toml", MIXED),
        ("slow-shout.toml", SHOUT),
        ("slow-mixed.toml", MIXED),
    ],
)
def test_four_pipelines_by_configuration_alone(config: str | None, expected: list[str]) -> None:
    extra = ["--config", f"{HERE}/{config}"] if config else []
    with serving(SCRIPT, *extra) as proc:
        assert tokens(proc.address) == expected
        described = httpx.get(f"{proc.address}/ready").json()
        assert described["status"] == "ready"


def test_the_same_answer_with_router_and_worker_in_their_own_processes() -> None:
    with worker(f"{HERE}/workers.py:mixed", "--stage", "worker") as mixer:
        with worker(
            f"{HERE}/routers.py:slow", "--stage", "router", "--bind", f"worker={mixer.address}"
        ) as routed:
            with serving(SCRIPT, "--bind", f"router={routed.address}") as proc:
                assert tokens(proc.address) == MIXED


def test_a_binding_that_does_not_satisfy_the_interface_is_refused() -> None:
    wrong = "tests/e2e/interfaces/wrong.py:numbers"
    out = run_bls("run", SCRIPT, "--input", json.dumps(REQUEST), "--bind", f"worker={wrong}")
    assert out.returncode == 1
    assert "stage 'worker'" in out.stderr
    assert "sends contracts.Prompt" in out.stderr and "takes wrong.Count" in out.stderr, out.stderr
    # The same when the wrong worker runs in its own process.
    proc = start(["worker", wrong, "--stage", "worker", "--listen", "tcp://127.0.0.1:0"])
    try:
        out = run_bls(
            "serve", SCRIPT, "--port", "0", "--bind", f"worker={proc.address}", timeout=30
        )
    finally:
        stop(proc.popen)
    assert out.returncode == 1
    assert "stage 'worker'" in out.stderr and "Count" in out.stderr, out.stderr
    assert "ready" not in out.stdout
