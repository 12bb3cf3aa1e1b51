"""Traffic policy with real `bls worker` replicas: a hedged call's loser is cancelled on
its replica, retries go to another replica within their budget, a replica that fails
or lags is ejected, the policy is refused where it would repeat a call that is not
idempotent, and each attempt is a span of its own under `bls serve`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import bls
from bls.policy import policy_from
from bls.targets import binding_for

from .cli import ROOT, bls_env, run_bls
from .procs import Proc, serving, start, stop, wait_for

STAGES = str(ROOT / "bench" / "policy_stages.py")
SCRIPT = "tests/e2e/pipelines/policy.py"


def _replica(name: str, **env: str) -> Proc:
    return start(
        ["worker", f"{STAGES}:work", "--listen", "tcp://127.0.0.1:0"],
        env=bls_env(BLS_REPLICA_NAME=name, **env),
    )


@pytest.fixture(scope="module")
def replicas() -> Iterator[dict[str, Proc]]:
    procs: dict[str, Proc] = {}
    try:
        procs["fast0"] = _replica("fast0", BLS_REPLICA_DELAY_MS="1")
        procs["fast1"] = _replica("fast1", BLS_REPLICA_DELAY_MS="1")
        procs["slow"] = _replica("slow", BLS_REPLICA_DELAY_MS="400")
        procs["broken"] = _replica("broken", BLS_REPLICA_FAILS="crash")
        yield procs
    finally:
        for proc in procs.values():
            stop(proc.popen)


def _calls(proc: Proc, what: str = "call") -> int:
    return sum(1 for line in proc.lines if f"{what} " in line and " on " in line)


class Job(bls.Message):
    n: int


class Done(bls.Message):
    n: int
    replica: str


async def _run(addresses: list[str], policy: dict[str, Any], jobs: range) -> tuple[list[Any], Any]:
    """Call the stage once per job from a runtime; (each result or error, its traffic)."""
    binding = binding_for("work", ",".join(addresses))
    binding.set_policy(policy_from("work", policy))
    handle = bls.Stage("work", Job, Done)

    @bls.script
    async def one(req: Job) -> Done:
        return await handle(req)

    out: list[Any] = []
    async with bls.Runtime({"work": binding}, declared=[handle]) as rt:
        for n in jobs:
            try:
                out.append(await rt.run(one, Job(n=n), timeout=10))
            except bls.StageError as exc:
                out.append(exc)
    return out, binding.state.counts


NO_EJECT = {"eject": {"failures": 0, "slower": 0}}
HEDGE = {"idempotent": True, "hedge": {"after_ms": 50}}


@pytest.mark.anyio
async def test_a_hedge_answers_from_a_fast_replica_and_cancels_the_slow_copy(
    replicas: dict[str, Proc],
) -> None:
    slow, fast = replicas["slow"], replicas["fast0"]
    cancelled = _calls(slow, "cancelled call")
    results, traffic = await _run(
        [slow.address, fast.address], {**HEDGE, **NO_EJECT}, range(100, 106)
    )

    assert all(isinstance(r, Done) and r.replica == "fast0" for r in results), results
    # The calls that went to the slow replica first were hedged; each original there was
    # cancelled (by cancel frame: its handler saw the cancellation). No copy lost.
    assert traffic.hedges == traffic.hedges_won >= 2 and traffic.hedges_cancelled == 0
    wait_for(lambda: _calls(slow, "cancelled call") - cancelled == traffic.hedges, timeout=10)


@pytest.mark.anyio
async def test_no_hedge_when_the_copy_could_not_answer_in_time(replicas: dict[str, Proc]) -> None:
    slow, fast = replicas["slow"], replicas["fast1"]
    binding = binding_for("work", f"{slow.address},{fast.address}")
    binding.set_policy(policy_from("work", {**HEDGE, **NO_EJECT}))
    handle = bls.Stage("work", Job, Done)

    @bls.script
    async def one(req: Job) -> Done:
        return await handle(req)

    late = 0
    async with bls.Runtime({"work": binding}, declared=[handle]) as rt:
        for n in range(6):  # turn about: half of them go to the slow replica first
            try:  # 40 ms: a copy sent at 50 ms would be too late to help
                await rt.run(one, Job(n=n), timeout=0.04)
            except bls.DeadlineExceeded:
                late += 1
    assert late >= 2 and binding.state.counts.hedges == 0


@pytest.mark.anyio
async def test_a_retry_goes_to_another_replica(replicas: dict[str, Proc]) -> None:
    broken, fast = replicas["broken"], replicas["fast1"]
    policy = {
        "idempotent": True,
        "retry": {"on": ["RuntimeError"], "backoff_ms": 1, "budget": 1},
        **NO_EJECT,
    }
    results, traffic = await _run([broken.address, fast.address], policy, range(200, 210))
    assert all(isinstance(r, Done) for r in results), results
    assert traffic.retries >= 3 and traffic.retries_denied == 0


@pytest.mark.anyio
async def test_the_retry_budget_caps_retries(replicas: dict[str, Proc]) -> None:
    broken = replicas["broken"]
    policy = {"idempotent": True, "retry": {"on": ["RuntimeError"], "budget": 0}, **NO_EJECT}
    results, traffic = await _run([broken.address], policy, range(300, 320))
    assert all(isinstance(r, bls.StageError) and r.kind == "RuntimeError" for r in results)
    # The floor lets a few through (2 a second); the rest were denied.
    assert traffic.retries <= 4 and traffic.retries_denied >= 16


@pytest.mark.anyio
async def test_a_failing_replica_is_ejected_after_five_failures(replicas: dict[str, Proc]) -> None:
    broken, fast = replicas["broken"], replicas["fast0"]
    before = _calls(broken)
    results, traffic = await _run([broken.address, fast.address], {}, range(400, 440))
    failed = [r for r in results if isinstance(r, bls.StageError)]
    assert len(failed) == 5 and traffic.ejections == 1  # 40 calls well inside the 1 s
    assert _calls(broken) - before == 5


@pytest.mark.anyio
async def test_a_lagging_replica_is_ejected(replicas: dict[str, Proc]) -> None:
    slow, fast = replicas["slow"], replicas["fast1"]
    results, traffic = await _run([slow.address, fast.address], {}, range(500, 540))
    on_slow = [r for r in results if isinstance(r, Done) and r.replica == "slow"]
    assert traffic.ejections == 1 and len(on_slow) == 3  # its 3 samples, then out


def test_hedge_or_retry_on_a_stage_not_declared_idempotent_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "policy.toml"
    config.write_text('[stages.work]\nremote = "tcp://127.0.0.1:1"\nhedge = { after_ms = 20 }\n')
    done = run_bls("check", SCRIPT, "--config", str(config))
    assert done.returncode == 1
    assert (
        "stage 'work': hedge would send a call more than once, and the stage is not declared "
        "idempotent: add `idempotent = true`" in done.stderr
    )
    config.write_text(
        '[stages.work]\nremote = "tcp://127.0.0.1:1"\nidempotent = true\n'
        'hedge = { after = "p100" }\n'
    )
    done = run_bls("check", SCRIPT, "--config", str(config))
    assert done.returncode == 1 and "hedge.after: expected p50 to p99, got 'p100'" in done.stderr


def test_each_attempt_is_a_span_and_metrics_count_hedges(
    replicas: dict[str, Proc], tmp_path: Path
) -> None:
    slow, fast = replicas["slow"], replicas["fast0"]
    config = tmp_path / "policy.toml"
    config.write_text(
        f'[stages.work]\nremote = ["{slow.address}", "{fast.address}"]\nidempotent = true\n'
        "hedge = { after_ms = 50 }\neject = { slower = 0 }\n"
    )
    with serving(SCRIPT, "--config", str(config)) as server:
        with httpx.Client(base_url=server.address, timeout=30) as http:
            for n in range(4):
                assert http.post("/v1/scripts/one", json={"n": n}).status_code == 200
            metrics = http.get("/metrics").text
            traces = http.get("/debug/requests", headers={"accept": "application/json"}).json()
            spans = [
                http.get(
                    f"/debug/requests/{t['id']}", headers={"accept": "application/json"}
                ).json()["spans"]
                for t in traces
            ]
    hedged = [s for s in spans if any(span.get("attempt") == 2 for span in s)]
    assert hedged, json.dumps(spans)[:2000]
    attempts = sorted(
        (span["attempt"], span["replica"], span["outcome"])
        for span in hedged[0]
        if span.get("attempt")
    )
    assert attempts == [(1, slow.address, "cancelled"), (2, fast.address, "ok")]
    counted = {
        line.split("{")[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("bls_stage_hedges") and 'stage="work"' in line
    }
    hedges = len(hedged)  # every hedged call's fast copy won, its slow original was cancelled
    assert counted == {
        "bls_stage_hedges_total": hedges,
        "bls_stage_hedges_won_total": hedges,
        "bls_stage_hedges_cancelled_total": 0,
    }, metrics


def test_a_hung_replica_is_ejected(replicas: dict[str, Proc], tmp_path: Path) -> None:
    """A replica that takes calls and never answers (it still heartbeats: a stuck engine)
    is ejected: by the calls its requests' deadlines cut, and, under a long deadline, by
    calls still waiting far past its peers' time."""
    hung = _replica("hung", BLS_REPLICA_DELAY_MS="600000")
    try:
        fast0, fast1 = replicas["fast0"], replicas["fast1"]
        config = tmp_path / "policy.toml"
        config.write_text(
            f'[stages.work]\nremote = ["{fast0.address}", "{fast1.address}", "{hung.address}"]\n'
        )
        with serving(SCRIPT, "--config", str(config)) as server:
            with httpx.Client(base_url=server.address, timeout=30) as http:
                codes = [
                    http.post(
                        "/v1/scripts/one", json={"n": n}, headers={"x-request-timeout": "1"}
                    ).status_code
                    for n in range(200)
                ]
                metrics = http.get("/metrics").text
        # Before: every third call went to the hung replica and ran out of time (67 of 200).
        assert codes.count(504) <= 8 and codes.count(200) == 200 - codes.count(504), codes
        assert _ejections(metrics) >= 1
        assert "replica " + hung.address + " ejected" in server.log()

        with serving(SCRIPT, "--config", str(config)) as server:  # a long deadline
            with httpx.Client(base_url=server.address, timeout=2) as http:
                stuck = 0
                for n in range(40):
                    try:
                        assert http.post("/v1/scripts/one", json={"n": n}).status_code == 200
                    except httpx.ReadTimeout:  # a call on the hung replica: this client leaves
                        stuck += 1
                metrics = http.get("/metrics").text
        assert stuck <= 5, stuck  # (without ejection: one call in three, 13 of 40)
        assert _ejections(metrics) >= 1
    finally:
        stop(hung.popen)


def _ejections(metrics: str) -> float:
    line = next(x for x in metrics.splitlines() if x.startswith("bls_stage_ejections_total{"))
    return float(line.split()[-1])
