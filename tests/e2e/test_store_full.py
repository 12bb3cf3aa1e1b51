"""A runs store on a disk that fills, for real: `bls serve --runs sqlite:///...` with its
store on a small tmpfs (mounting one needs root), filled up while a run is under way.
New runs are refused with a 503 naming the store, synchronous requests are served, the
run under way is left to recovery, and once the disk has room again it finishes with the
answer an uninterrupted run gives, and new runs are taken again."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .procs import Proc, drain, wait_for
from .test_runs import ASYNC, calls, config, ended, lines, serve, submit, worker

__all__ = ["calls", "config", "worker"]  # (fixtures, used by name)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk that fills."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small disk needs root")
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(folder: Path) -> Path:
    """A file that takes every byte the disk has left."""
    filler = folder / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_full_disk_refuses_new_runs_with_503_and_the_runs_under_way_finish_once_it_has_room(
    disk: Path, worker: Proc, calls: Path, config: Path, backend: str
) -> None:
    store = f"sqlite://{disk / 'runs.sqlite3'}"
    server = serve(worker, store, config, "--backend", backend)
    try:
        done = ended(server, submit(server, "steps", {"n": 1, "steps": 1})["id"])
        assert done["result"] == {"n": 1, "out": ["1:0"]}
        # A run whose first call is under way (2 s) when the disk fills.
        run = submit(server, "steps", {"n": 2, "steps": 2, "extra": {"sleep": 2.0}})
        wait_for(lambda: "start 2 0" in lines(calls), timeout=10)
        filler = _fill(disk)

        refused = httpx.post(
            f"{server.address}/v1/scripts/steps", json={"n": 3, "steps": 1}, headers=ASYNC
        )
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["type"] == "store_unavailable" and error["entry"] == "steps"
        assert "the runs store" in error["message"] and "full" in error["message"]
        # Synchronous requests need no store: served, from a new client.
        with httpx.Client() as fresh:
            answer = fresh.post(
                f"{server.address}/v1/scripts/steps", json={"n": 4, "steps": 1}, timeout=30
            )
        assert answer.status_code == 200 and answer.json() == {"n": 4, "out": ["4:0"]}
        # The run's call ends, its end cannot be saved: the run is left as the store has
        # it (running), and read as such.
        wait_for(lambda: "left to recovery" in server.log(), timeout=10)
        assert httpx.get(f"{server.address}/v1/runs/{run['id']}").json()["status"] == "running"

        filler.unlink()  # room again: the run is recovered and ends as it would have
        finished = ended(server, run["id"])
        assert finished["status"] == "succeeded", finished
        assert finished["result"] == {"n": 2, "out": ["2:0", "2:1"]}
        # (Its first call ended unsaved: in flight to the store, sent again, idempotent.)
        assert lines(calls).count("start 2 1") == 1
        again = ended(server, submit(server, "steps", {"n": 5, "steps": 1})["id"])
        assert again["result"] == {"n": 5, "out": ["5:0"]}
    finally:
        drain([server])
