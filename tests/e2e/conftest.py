"""Fixtures the end-to-end modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cli import FAKE_LLM, FAKE_LLM_OPTIONS, GENERATOR_OPTIONS
from .procs import Proc, start, stop


@pytest.fixture(scope="session")
def encoders() -> Iterator[dict[str, Proc]]:
    """`bls worker` processes of the vision encoder and the classifier (torch, random
    weights), for the examples' pipelines."""
    from .cli import require_models

    require_models()
    procs: dict[str, Proc] = {}
    try:
        for name, target in (
            ("encoder", "bls.models.encoder:VisionEncoder"),
            ("classifier", "bls.models.encoder:Classifier"),
        ):
            procs[name] = start(["worker", target, "--listen", "tcp://127.0.0.1:0"])
        yield procs
    finally:
        for proc in procs.values():
            stop(proc.popen)


@pytest.fixture(scope="session")
def vision_workers(encoders: dict[str, Proc]) -> Iterator[dict[str, Proc]]:
    """The encoders and a vLLM `bls worker` (the tiny model; one engine start for all the
    modules that test the engine itself: the chat endpoint, describe)."""
    from .cli import require_vllm

    require_vllm()
    generator = start(
        ["worker", "bls.models.vllm:VllmWorker", "--listen", "tcp://127.0.0.1:0",
         *GENERATOR_OPTIONS],
        ready_timeout=240,
    )  # fmt: skip
    try:
        yield {**encoders, "generator": generator}
    finally:
        stop(generator.popen)


@pytest.fixture(scope="session")
def pipeline_workers(encoders: dict[str, Proc]) -> Iterator[dict[str, Proc]]:
    """The encoders and a FakeLLM `bls worker` as the generator."""
    generator = start(["worker", FAKE_LLM, "--listen", "tcp://127.0.0.1:0", *FAKE_LLM_OPTIONS])
    try:
        yield {**encoders, "generator": generator}
    finally:
        stop(generator.popen)
