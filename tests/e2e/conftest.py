"""Fixtures the end-to-end modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cli import GENERATOR_OPTIONS
from .procs import Proc, start, stop


@pytest.fixture(scope="session")
def vision_workers() -> Iterator[dict[str, Proc]]:
    """`bls worker` processes for the examples and the served chat: encoder, classifier,
    generator (the tiny model; one vLLM engine start for all the modules that use it)."""
    from .cli import require_vllm

    require_vllm()
    procs: dict[str, Proc] = {}
    try:
        for name, target, extra in (
            ("encoder", "bls.models.encoder:VisionEncoder", []),
            ("classifier", "bls.models.encoder:Classifier", []),
            ("generator", "bls.models.vllm:VllmWorker", GENERATOR_OPTIONS),
        ):
            procs[name] = start(
                ["worker", target, "--listen", "tcp://127.0.0.1:0", *extra], ready_timeout=240
            )
        yield procs
    finally:
        for proc in procs.values():
            stop(proc.popen)
