"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import sniffio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session", autouse=True)
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Background runs kept where no other run of the tests (or of the user's) is: each
    `bls serve` a test starts without --runs keeps its journal here."""
    import os

    folder = tmp_path_factory.mktemp("state")
    os.environ["BLS_STATE_DIR"] = str(folder)
    return folder


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param


def live_tasks() -> int:
    """How many tasks exist right now, on whichever backend is running."""
    if sniffio.current_async_library() == "asyncio":
        return len(asyncio.all_tasks())
    import trio

    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    return count(trio.lowlevel.current_root_task())
