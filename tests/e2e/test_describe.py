"""examples/describe: image → encoder → classifier + adapter → vLLM, every stage inline,
then every stage in its own `bls worker`: the same output for a fixed seed."""

from __future__ import annotations

import json
from pathlib import Path

from bls.models.noise import HARMLESS

from .cli import bls_env, require_vllm, run_bls
from .procs import Proc

require_vllm()  # skips the module without vLLM; CI requires it

SCRIPT = "examples/describe/describe.py"
REQUEST = "@examples/describe/request.json"


def parts(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_describe_runs_the_same_inline_and_remote(
    tmp_path: Path, vision_workers: dict[str, Proc]
) -> None:
    # An empty cache, as on a new machine: the first run builds the tiny model, and what
    # building prints must not reach stdout.
    env = bls_env(TMPDIR=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("BLS_TINY_MODEL", None)
    inline = run_bls("run", SCRIPT, "--input", REQUEST, timeout=300, env=env)
    assert inline.returncode == 0, inline.stderr[-3000:]
    assert (tmp_path / "cache" / "bls").is_dir()  # it did build the model
    lines = inline.stdout.splitlines()
    assert lines and all(line.startswith("{") for line in lines), inline.stdout[:500]
    got = parts(inline.stdout)  # stdout holds results only: engine logs go to stderr
    assert got[0]["label"] in ("cat", "dog", "bird", "car", "tree")
    assert sum(len(p["token_ids"]) for p in got[1:]) == 12  # type: ignore[arg-type]
    assert "building the tiny test model" in inline.stderr  # progress, on stderr
    assert "force killing" not in inline.stderr
    # What a new user sees while it starts: one line on what loads and how long it takes,
    # none of the engine's known-harmless warnings, no progress bars, and no item that
    # carries nothing (a step that ends mid-character has no text: its tokens go on).
    assert "loading the vLLM engine for" in inline.stderr and "usually" in inline.stderr
    assert not HARMLESS.search(inline.stderr), inline.stderr[-3000:]
    assert "FutureWarning" not in inline.stderr and "it/s]" not in inline.stderr
    assert all(p["text"] for p in got[1:-1]), got

    # The same with every stage in a `bls worker` (the session's: they built the model
    # in their own cache, from the same seed).
    binds = [
        f"--bind={n}={vision_workers[n].address}" for n in ("encoder", "classifier", "generator")
    ]
    remote = run_bls("run", SCRIPT, "--input", REQUEST, *binds, timeout=120, env=env)
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert parts(remote.stdout) == got
