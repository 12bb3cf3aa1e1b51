"""examples/agent for real: `bls serve` with the tiny vLLM engine in process and the tools
in `bls worker` processes (the lookup one that notes its calls); a client that leaves
mid-request leaves nothing running."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from bls.models import tiny

from .cli import bls_env, require_vllm
from .procs import Proc, drain, start, wait_for

require_vllm()  # skips the module without vLLM; CI requires it

SCRIPT = "examples/agent/agent.py"
CALCULATOR = "examples/agent/tools.py:calculate"
LOOKUP = "tests/e2e/served/agent_lookup.py:lookup"


@pytest.fixture(scope="module")
def lookups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the lookup notes its calls, a line each."""
    return tmp_path_factory.mktemp("agent-calls") / "lookups"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, lookups: Path) -> Iterator[Proc]:
    tiny.build()
    env = bls_env(TMPDIR=str(tmp_path_factory.mktemp("agent")))
    procs: list[Proc] = []
    try:
        binds = []
        for name, target in (("calculator", CALCULATOR), ("lookup", LOOKUP)):
            tool_env = bls_env(BLS_AGENT_CALLS=str(lookups))
            tool = start(["worker", target, "--listen", "tcp://127.0.0.1:0"], env=tool_env)
            procs.append(tool)
            binds += ["--bind", f"{name}={tool.address}"]
        server = start(["serve", SCRIPT, "--port", "0", *binds], ready_timeout=240, env=env)
        procs.append(server)
        yield server
    finally:
        drain(procs)


def ask(served: Proc, **fields: object) -> dict[str, object]:
    body = {"question": "How many moons do Mars and Jupiter have?", **fields}
    answer = httpx.post(f"{served.address}/v1/scripts/agent", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_the_agent_runs_on_the_engine_to_a_well_formed_outcome(served: Proc) -> None:
    """Random weights: tool choices and answers are random, but always well formed."""
    tools_used = set()
    for seed in range(6):
        outcome = ask(served, seed=seed, max_steps=3)
        assert outcome["ended"] in ("answer", "step budget")
        assert (outcome["answer"] is None) == (outcome["ended"] == "step budget")
        for step in outcome["steps"]:  # type: ignore[attr-defined]
            tools_used.add(step["tool"])
            assert step["tool"] in ("calculator", "lookup") and step["result"]
    assert tools_used  # some run called a tool, remote, and went on
    assert ask(served, seed=3, max_steps=3) == ask(served, seed=3, max_steps=3)


def test_a_client_that_leaves_cancels_the_engine_request_and_the_server_serves_on(
    served: Proc, lookups: Path
) -> None:
    """An agent run whose client leaves mid-run: the request ends at once, the engine
    holds nothing, and a new client is served. The client leaves when a lookup has been
    made (seed 1 makes some), so the cancel mostly lands in the step's generation that
    follows at once and takes far longer than a tool call. The model is random: a run
    whose next step answers quickly may end before its client's leaving is seen, which is
    no fault; so runs go on (six at most) until one was cancelled in the engine."""
    url = urlsplit(served.address)
    body = json.dumps({"question": "moons?", "max_steps": 1000, "seed": 1}).encode()
    cancels = engine_aborts = 0
    for _ in range(6):
        before, cancelled = len(_aborts(served)), _metric(served, "bls_cancellations_total")
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/scripts/agent HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            made = _lines(lookups)
            wait_for(lambda m=made: _lines(lookups) > m, timeout=60)
        wait_for(lambda: _metric(served, "bls_requests_in_flight") == 0, timeout=30)
        cancels += _metric(served, "bls_cancellations_total") > cancelled
        aborts = _aborts(served)[before:]
        assert all(a.rstrip().endswith("(unfinished in the engine now: 0)") for a in aborts)
        engine_aborts += len(aborts)
        if engine_aborts:
            break
    assert cancels >= 1 and engine_aborts >= 1
    assert ask(served, seed=2, max_steps=2)["ended"] in ("answer", "step budget")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _aborts(proc: Proc) -> list[str]:
    return [line for line in proc.lines if "aborted bls-" in line]


def _metric(served: Proc, prefix: str) -> float:
    """The sum of the /metrics samples whose line starts with ``prefix``."""
    text = httpx.get(f"{served.address}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and not line.startswith("#")
    )
