"""What a runs store cannot hold, for real (`bls serve --runs sqlite:///...`):

- a disk that fills (the store on a small tmpfs: mounting one needs root) while a run is
  under way: new runs are refused with a 503 naming the store, synchronous requests are
  served, the run under way is left to recovery, and once the disk has room again it
  finishes with the answer an uninterrupted run gives, and new runs are taken again;
- a value past `[runs] max_value_bytes` (a stage call's request and result, a streaming
  run's item): the call fails `too_large` naming its stage, journaled so, and the
  script goes on; the item fails its run, naming it. The server serves on;
- a run streaming 150 MB: the frontend holds no more of it than its result keeps;
- event streams of that run whose clients read nothing: closed, they stop reading the
  store, and the server answers everyone else meanwhile."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bls.stores import open_journal

from .procs import Proc, drain, start, wait_for
from .test_runs import ASYNC, _events, calls, config, ended, lines, serve, submit, worker

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
        # Nor can a cancel be written: refused, and nothing is cancelled (the run ends
        # as it would have, below).
        kept = httpx.delete(f"{server.address}/v1/runs/{run['id']}")
        assert kept.status_code == 503 and kept.json()["error"]["type"] == "store_unavailable"
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


SCRIPT = """
import bls
from bls import stage


async def echo(req):
    return "x" * req["size"]


@bls.script
async def sized(req):
    out = []
    for size in req["sizes"]:
        try:
            out.append(len(await stage("echo", {"size": size, "note": req.get("note", "")})))
        except bls.StageError as exc:
            out.append(f"{exc.stage}: {exc.kind}")
    return out


class Sized(bls.Message):
    size: int
    note: str = ""


echo_typed = bls.Stage("echo", Sized, str)


@bls.script
async def typed_sized(req: Sized) -> str:
    try:
        return str(len(await echo_typed(req)))
    except bls.StageError as exc:
        return f"{exc.stage}: {exc.kind}"


@bls.script
async def items(req):
    for size in req["sizes"]:
        yield "y" * size
"""


def _serve_sized(tmp_path: Path, runs: str, *more: str) -> Proc:
    """`bls serve` of :data:`SCRIPT` (its `echo` stage in process), ``runs`` the lines of
    its `[runs]` table, on a SQLite store in ``tmp_path``."""
    (tmp_path / "sized.py").write_text(SCRIPT)
    (tmp_path / "bls.toml").write_text(f'[runs]\n{runs}[stages.echo]\ninline = "sized.py:echo"\n')
    store = f"sqlite://{tmp_path / 'runs.sqlite3'}"
    return start(["serve", str(tmp_path / "sized.py"), "--port", "0", "--runs", store, *more])


def test_a_value_past_max_value_bytes_fails_its_call_naming_the_stage_and_is_journaled_so(
    tmp_path: Path,
) -> None:
    server = _serve_sized(tmp_path, "max_value_bytes = 1000\n")
    store = f"sqlite://{tmp_path / 'runs.sqlite3'}"
    try:
        # A result past it (untyped, as the README writes scripts; and typed): that call
        # fails too_large, naming its stage; the script goes on.
        run = ended(server, submit(server, "sized", {"sizes": [10, 5000, 20]})["id"])
        assert run["status"] == "succeeded" and run["result"] == [10, "echo: too_large", 20]
        typed = ended(server, submit(server, "typed_sized", {"size": 5000})["id"])
        assert typed["result"] == "echo: too_large"
        # A request past it: the call is not made.
        big = ended(server, submit(server, "sized", {"sizes": [10], "note": "n" * 2000})["id"])
        assert big["result"] == ["echo: too_large"]
        # The journal has each such call ended, failed so, its result left out: a
        # recovery answers it from there as the run saw it, without making it again.
        journal = open_journal(store)
        try:
            ((_, call, done),) = journal.calls(str(big["id"]))
            failed = [c for _, c, _ in journal.calls(str(run["id"])) if c.error is not None]
        finally:
            journal.close()
        assert done and call.items == [] and call.error is not None
        assert (call.error.stage, call.error.kind) == ("echo", "too_large")
        assert "over the 1000 a background run's journal keeps" in call.error.message
        assert [(c.error.kind, c.items) for c in failed if c.error] == [("too_large", [])]

        # A streaming run's item past it fails the run, naming the item; those before
        # it went out.
        stream = submit(server, "items", {"sizes": [10, 5000]})
        over = ended(server, stream["id"])
        assert over["status"] == "failed", over
        error = over["error"]
        assert isinstance(error, dict) and error["type"] == "item_too_large"
        assert "item 2 is 5002 bytes, over the 1000" in error["message"]
        sent = _events(f"{server.address}/v1/runs/{stream['id']}/events", None)
        assert [d for _, kind, d in sent if kind == "item"] == ['"' + "y" * 10 + '"']
        # The server serves on.
        again = ended(server, submit(server, "sized", {"sizes": [30]})["id"])
        assert again["result"] == [30]
    finally:
        drain([server])


def _peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def test_a_streaming_run_holds_no_more_of_its_items_than_its_result_keeps(
    tmp_path: Path,
) -> None:
    # 1,500 items of 100 KB (150 MB): each goes to the store as it comes; the frontend
    # holds at most max_result_bytes of them (1 MiB here), never the whole stream.
    server = _serve_sized(tmp_path, "max_result_bytes = 1048576\n")
    try:
        warm = ended(server, submit(server, "items", {"sizes": [100_000] * 20})["id"])
        assert warm["status"] == "succeeded"
        before = _peak_rss_mb(server.pid)
        run = ended(server, submit(server, "items", {"sizes": [100_000] * 1500})["id"])
        assert run["status"] == "succeeded" and run["result"] is None  # (events alone)
        grew = _peak_rss_mb(server.pid) - before
        assert grew < 50, f"the frontend's peak memory grew {grew:.0f} MB for a 150 MB stream"
        last = _events(f"{server.address}/v1/runs/{run['id']}/events", 1500)
        assert [(seq, kind) for seq, kind, _ in last] == [(1501, "item"), (1502, "end")]
    finally:
        drain([server])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_event_streams_whose_clients_stopped_reading_leave_the_server_serving(
    tmp_path: Path, backend: str
) -> None:
    # A run of 1,500 items of 100 KB; ten clients open its events and read nothing. Each
    # is closed once it took none of its answer for 1 s (--send-timeout), and its stream
    # stops reading the store: the server answers everyone else meanwhile and after.
    server = _serve_sized(tmp_path, "", "--send-timeout", "1", "--backend", backend)
    stalled: list[socket.socket] = []
    try:
        run = ended(server, submit(server, "items", {"sizes": [100_000] * 1500})["id"])
        assert run["status"] == "succeeded"
        host, port = server.address.removeprefix("http://").split(":")
        for _ in range(10):
            client = socket.create_connection((host, int(port)))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.sendall(f"GET /v1/runs/{run['id']}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            stalled.append(client)
        slowest = 0.0
        with httpx.Client(base_url=server.address, timeout=10) as fresh:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                began = time.monotonic()
                assert fresh.get("/health").status_code == 200
                slowest = max(slowest, time.monotonic() - began)
        assert slowest < 1.0, f"/health took {slowest:.1f}s"
        wait_for(lambda: server.log().count("took none of an answer") == 10, timeout=10)
    finally:
        for client in stalled:
            client.close()
        drain([server])
