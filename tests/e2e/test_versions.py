"""Weighted versions of a stage under `bls serve`, with real `bls worker` processes: the
split follows the weights, a sticky key keeps a caller on one version, and the version
that served each call is in the trace and in /metrics; versions of other types, and
`targets` written wrong, are refused at start-up."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .cli import ROOT, bls_env, run_bls
from .procs import Proc, serving, start, stop

STAGES = str(ROOT / "bench" / "policy_stages.py")
SCRIPT = "bench/policy_stages.py"  # its entry `one` calls the stage `work` once


@pytest.fixture(scope="module")
def versions() -> Iterator[dict[str, Proc]]:
    procs: dict[str, Proc] = {}
    try:
        for name in ("v1", "v2"):
            procs[name] = start(
                ["worker", f"{STAGES}:work", "--listen", "tcp://127.0.0.1:0"],
                env=bls_env(BLS_REPLICA_NAME=name),
            )
        yield procs
    finally:
        for proc in procs.values():
            stop(proc.popen)


def _config(tmp_path: Path, versions: dict[str, Proc], extra: str = "") -> str:
    path = tmp_path / "versions.toml"
    path.write_text(
        "[stages.work]\ntargets = [\n"
        f'  {{ remote = "{versions["v1"].address}", weight = 9, name = "v1" }},\n'
        f'  {{ remote = "{versions["v2"].address}", weight = 1, name = "v2" }},\n'
        f"]\n{extra}"
    )
    return str(path)


def test_calls_split_by_weight_and_each_version_is_counted(
    versions: dict[str, Proc], tmp_path: Path
) -> None:
    with (
        serving(SCRIPT, "--config", _config(tmp_path, versions)) as server,
        httpx.Client(base_url=server.address, timeout=30) as http,
    ):
        served = collections.Counter(
            http.post("/v1/scripts/one", json={"n": n}).json()["replica"] for n in range(200)
        )
        metrics = http.get("/metrics").text
        (trace, *_) = http.get("/debug/requests", headers={"accept": "application/json"}).json()
        spans = http.get(
            f"/debug/requests/{trace['id']}", headers={"accept": "application/json"}
        ).json()["spans"]
    assert set(served) == {"v1", "v2"}
    assert 5 <= served["v2"] <= 45, served  # 1 in 10 of 200: 20 expected
    for name, n in served.items():
        line = f'bls_stage_version_calls_total{{outcome="ok",stage="work",version="{name}"}}'
        assert f"{line} {float(n)}" in metrics, metrics
    (work,) = [s for s in spans if s["name"] == "work" and not s["remote"]]
    assert work["version"] in ("v1", "v2")
    # The policy acts within each version, and each version's counts are exported.
    for name in ("v1", "v2"):
        for counter in ("hedges", "retries", "ejections"):
            line = f'bls_stage_{counter}_total{{stage="work",version="{name}"}} 0.0'
            assert line in metrics, metrics


def test_a_sticky_key_keeps_a_caller_on_one_version(
    versions: dict[str, Proc], tmp_path: Path
) -> None:
    config = _config(tmp_path, versions, 'sticky = "n"\n')
    with (
        serving(SCRIPT, "--config", config) as server,
        httpx.Client(base_url=server.address, timeout=30) as http,
    ):

        def version_of(n: int) -> str:
            return str(http.post("/v1/scripts/one", json={"n": n}).json()["replica"])

        first = {n: version_of(n) for n in range(60)}
        again = {n: version_of(n) for n in range(60)}
    assert first == again
    assert set(first.values()) == {"v1", "v2"}


def test_versions_must_share_their_types(versions: dict[str, Proc], tmp_path: Path) -> None:
    config = tmp_path / "mixed.toml"
    other = ROOT / "tests/e2e/pipelines/admission/stages.py"
    config.write_text(
        "[stages.work]\ntargets = [\n"
        f'  {{ remote = "{versions["v1"].address}", name = "v1" }},\n'
        f'  {{ inline = "{other}:hold", name = "held" }},\n'
        "]\n"
    )
    done = run_bls("check", SCRIPT, "--config", str(config))
    assert done.returncode == 1
    assert (
        "error: stage 'work': version held serves stages.Hold -> stages.Held, version v1 "
        "policy_stages.Job -> policy_stages.Done: versions must share their types"
    ) in done.stderr


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            'targets = [{ inline = "x.py:f" }]\nsticky = 3\n',
            "Expected `str | null`, got `int`",
        ),
        ('inline = "x.py:f"\nsticky = "user"\n', "'sticky' chooses between 'targets'"),
        ("targets = [{ weight = 2 }]\n", "targets[0] needs exactly one of"),
        ('targets = [{ inline = "x.py:f", weight = 0 }]\n', "Expected `float` > 0"),
    ],
)
def test_targets_written_wrong_are_refused(tmp_path: Path, toml: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f"[stages.work]\n{toml}")
    done = run_bls("check", SCRIPT, "--config", str(config))
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
