"""Retention of background runs on a real `bls serve`: a store holding far more finished
runs than `[runs] retain` is brought down to it a slice at a time, the server serving
meanwhile and the runs it is running kept."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path

import httpx

from bls.stores import open_journal

from .procs import drain, start, wait_for

SCRIPT = """
import anyio
import bls


@bls.script
async def hold(req):
    await anyio.sleep(req["s"])
    return {"held": req["s"]}
"""


def _fill(path: Path, n: int) -> None:
    """``n`` runs that ended a day ago, each with a call and two events."""
    open_journal(f"sqlite://{path}").close()  # (the schema)
    day_ago = time.time() - 86400
    ids = [f"run-old-{i:08d}" for i in range(n)]
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO runs (id, script, entry, status, request, priority, created, started, "
            "ended, result, lease) VALUES (?, '/s.py', 'e', 'succeeded', x'80', 0, ?, ?, ?, "
            "x'7b7d', 0)",
            [
                (run_id, day_ago + i / 1000, day_ago + i / 1000, day_ago + i / 1000)
                for i, run_id in enumerate(ids)
            ],
        )
        db.executemany(
            "INSERT INTO calls (run, seq, call, done) VALUES (?, 0, x'80', 1)", [(r,) for r in ids]
        )
        db.executemany(
            "INSERT INTO events (run, seq, kind, data) VALUES (?, ?, 'item', x'31')",
            [(r, seq) for r in ids for seq in (1, 2)],
        )
    db.close()


def _count(path: Path, table: str) -> int:
    db = sqlite3.connect(path)
    try:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        db.close()


def _slices(log: str) -> list[int]:
    """How many runs each pass forgot, from the server's debug log."""
    return [int(n) for n in re.findall(r"background runs: forgot (\d+) old run", log)]


def test_a_store_past_its_retention_is_pruned_in_slices_while_the_server_serves(
    tmp_path: Path,
) -> None:
    store = tmp_path / "runs.sqlite3"
    _fill(store, 5000)  # five slices' worth past what is kept
    script = tmp_path / "hold.py"
    script.write_text(SCRIPT)
    (tmp_path / "bls.toml").write_text("[runs]\nretain = 100\n")
    argv = ["serve", str(script), "--port", "0", "--runs", f"sqlite://{store}"]
    server = start([*argv, "--log-level", "debug"])
    try:
        url = server.address
        running = httpx.post(
            f"{url}/v1/scripts/hold", json={"s": 30}, headers={"prefer": "respond-async"}
        ).json()
        # Every slice goes, one after another (not one a minute), down to what is kept;
        # none larger than a slice (each holds the event loop while SQLite works).
        wait_for(lambda: _count(store, "runs") <= 100, 60, interval=0.1)
        wait_for(
            lambda: sum(_slices(server.log())) == 4901, 10
        )  # (5,001 runs, the running one too)
        assert max(_slices(server.log())) == 1000 and len(_slices(server.log())) == 5
        assert _count(store, "runs") >= 99  # (the newest kept, the running one among them)
        assert _count(store, "calls") <= 100 and _count(store, "events") <= 200
        assert httpx.get(f"{url}/v1/runs/{running['id']}").json()["status"] == "running"
        assert httpx.post(f"{url}/v1/scripts/hold", json={"s": 0}).json() == {"held": 0}
        gone = httpx.get(f"{url}/v1/runs/run-old-00000000")
        assert gone.status_code == 404
        assert httpx.get(f"{url}/v1/runs/run-old-00004999").json()["status"] == "succeeded"
        assert httpx.delete(f"{url}/v1/runs/{running['id']}").json()["status"] == "cancelled"
    finally:
        drain([server])


def _used(path: Path) -> int:
    """The bytes a SQLite store's pages in use take (what [runs] max_bytes bounds)."""
    db = sqlite3.connect(path)
    try:
        pages, free, size = (
            db.execute(f"PRAGMA {p}").fetchone()[0]
            for p in ("page_count", "freelist_count", "page_size")
        )
        return int((pages - free) * size)
    finally:
        db.close()


def test_a_store_is_kept_within_its_bytes_and_refuses_runs_while_only_live_ones_fill_it(
    tmp_path: Path,
) -> None:
    """``[runs] max_bytes = 1 MB``. 30 runs of 100 KB requests end: the oldest are
    forgotten until the store takes 1 MB at most, the newest kept. Then three runs of
    400 KB that go on fill it alone: new runs are refused 503 ``store_full`` (synchronous
    requests served), until those three are cancelled; then runs are taken again."""
    store = tmp_path / "runs.sqlite3"
    script = tmp_path / "hold.py"
    script.write_text(SCRIPT)
    (tmp_path / "bls.toml").write_text("[runs]\nlease_s = 1.0\nmax_bytes = 1000000\n")
    argv = ["serve", str(script), "--port", "0", "--runs", f"sqlite://{store}"]
    server = start(argv)
    url, later = server.address, {"prefer": "respond-async"}

    def submit(s: float, pad: int) -> httpx.Response:
        return httpx.post(f"{url}/v1/scripts/hold", json={"s": s, "pad": "x" * pad}, headers=later)

    try:
        ran = [submit(0, 100_000).json()["id"] for _ in range(30)]
        wait_for(lambda: _used(store) <= 1_000_000, 30, interval=0.1)
        wait_for(lambda: "oldest finished run(s): the store took more" in server.log(), 10)
        assert httpx.get(f"{url}/v1/runs/{ran[0]}").status_code == 404
        gauge = re.search(r"^bls_runs_store_bytes (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
        assert gauge is not None and 0 < float(gauge[1]) <= 1_000_000
        newest = httpx.get(f"{url}/v1/runs/{ran[-1]}").json()
        assert newest["status"] == "succeeded" and newest["result"] == {"held": 0}

        live = [submit(60, 400_000).json()["id"] for _ in range(3)]
        refused: list[httpx.Response] = []
        wait_for(lambda: refused.append(submit(0, 0)) or refused[-1].status_code == 503, 30, 0.1)
        error = refused[-1].json()["error"]
        assert error["type"] == "store_full" and "[runs] max_bytes" in error["message"]
        assert refused[-1].headers["retry-after"] == "5"
        assert all(httpx.get(f"{url}/v1/runs/{r}").json()["status"] == "running" for r in live)
        with httpx.Client() as fresh:
            assert fresh.post(f"{url}/v1/scripts/hold", json={"s": 0}).json() == {"held": 0}
        for run_id in live:
            assert httpx.delete(f"{url}/v1/runs/{run_id}").json()["status"] == "cancelled"
        taken: list[httpx.Response] = []
        wait_for(lambda: taken.append(submit(0, 0)) or taken[-1].status_code == 202, 30, 0.1)
        wait_for(
            lambda: (
                httpx.get(f"{url}/v1/runs/{taken[-1].json()['id']}").json()["status"] == "succeeded"
            ),
            10,
        )
        assert "is within [runs] max_bytes again" in server.log()
    finally:
        drain([server])
