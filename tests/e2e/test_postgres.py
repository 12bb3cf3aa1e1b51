"""Background runs on PostgreSQL (``bls serve --runs postgresql://...``), against a real
server (tests/e2e/postgres.py): the store's contract (the tests of tests/test_journal.py,
run here on PostgreSQL), and two frontends sharing runs (tests/e2e/test_runs.py's test of
that, run here too), one of them killed with SIGKILL mid-run."""

from __future__ import annotations

import collections
import glob
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

# The store's contract, the same tests as on SQLite: pytest runs them here with this
# module's ``open_store``.
from test_journal import (  # noqa: F401
    OpenStore,
    test_a_list_or_a_size_reads_no_runs_payloads,
    test_a_run_is_taken_over_only_once_its_owners_lease_ran_out,
    test_a_run_taken_over_takes_no_write_from_its_old_owner,
    test_a_runs_status_and_its_news_come_in_one_read,
    test_an_outcome_is_written_once,
    test_calls_and_events_come_back_in_order,
    test_finished_runs_are_forgotten_by_age_and_count,
    test_runs_are_forgotten_a_slice_at_a_time,
    test_the_oldest_finished_runs_holding_what_is_asked_are_forgotten,
    test_two_frontends_claiming_at_once_never_both_get_a_run,
)

from bls.journal import Journal, JournalError
from bls.stores import PostgresJournal, open_journal

from .postgres import PostgresServer, require_postgres
from .procs import Proc, drain, start, wait_for
from .test_runs import (  # noqa: F401
    ASYNC,
    calls,
    config,
    ended,
    finished_calls,
    lines,
    serve,
    submit,
    test_two_frontends_on_one_store_act_as_one,
    worker,
)

require_postgres()


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def store(postgres: PostgresServer) -> str:
    return postgres.database()


@pytest.fixture
def open_store(store: str) -> Iterator[OpenStore]:
    opened: list[Journal] = []

    def again() -> Journal:
        opened.append(PostgresJournal(store))
        return opened[-1]

    yield again
    for journal in opened:
        journal.close()


def test_a_store_is_named_by_its_url_and_survives_a_broken_connection(
    postgres: PostgresServer, store: str
) -> None:
    journal = open_journal(store)
    assert isinstance(journal, PostgresJournal) and journal.url() == store
    with pytest.raises(JournalError, match='database "nothere" does not exist'):
        open_journal(postgres.url("nothere"))
    # The server ends the connection (a restart, a failover): that call fails, clearly;
    # the next one opens a new connection.
    import psycopg

    with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid != pg_backend_pid()",
            (store.rsplit("/", 1)[1],),
        )
    with pytest.raises(JournalError, match=r"the runs store postgresql://.* failed"):
        journal.get("r")
    assert journal.get("r") is None
    journal.close()
    # A statement is bounded (15 s; the URL's own options may say otherwise).
    quick = PostgresJournal(f"{store}?options=-c%20statement_timeout%3D50")
    with pytest.raises(JournalError, match="statement timeout"):
        quick._execute("SELECT pg_sleep(1)")
    quick.close()


def test_two_frontends_share_runs_and_one_killed_has_its_runs_finished_by_the_other(
    worker: Proc,  # noqa: F811
    store: str,
    config: Path,  # noqa: F811
    calls: Path,  # noqa: F811
) -> None:
    """Two frontends (asyncio and trio) on one PostgreSQL store; 50 runs of 4 remote steps
    submitted to both; one frontend is killed with SIGKILL halfway. The other finishes
    every run with the answer an uninterrupted run gives, no call the journal had
    finished runs twice, a run cancelled through it stops its remote call, and nothing
    is left running."""
    first = serve(worker, store, config)
    second = serve(worker, store, config, "--backend", "trio")
    try:
        runs = {
            n: submit((first, second)[n % 2], "steps", {"n": n, "steps": 4})["id"]
            for n in range(50)
        }
        wait_for(lambda: sum(line.startswith("start") for line in lines(calls)) >= 100, timeout=60)
        first.signal(signal.SIGKILL)
        first.wait()
        finished = finished_calls(store, list(runs.values()))
        assert finished and len(finished) < 200  # (killed halfway)
        # A long run, cancelled through the survivor once it runs: its remote call stops.
        slow = submit(second, "steps", {"n": 99, "steps": 1, "extra": {"sleep": 60}})
        wait_for(lambda: "start 99 0" in lines(calls), timeout=30)
        assert httpx.delete(f"{second.address}/v1/runs/{slow['id']}").status_code == 200
        wait_for(lambda: "cancel 99 0" in lines(calls), timeout=10)
        assert ended(second, slow["id"])["status"] == "cancelled"
        for n, run_id in runs.items():
            done = ended(second, run_id, timeout=60)
            assert done["status"] == "succeeded", done
            assert done["result"] == {"n": n, "out": [f"{n}:{s}" for s in range(4)]}
        started = collections.Counter(
            tuple(map(int, line.split()[1:])) for line in lines(calls) if line.startswith("start")
        )
        assert set(started) == {(n, s) for n in range(50) for s in range(4)} | {(99, 0)}
        assert all(started[key] == 1 for key in finished)  # none of those ran twice
        running = httpx.get(f"{second.address}/v1/runs", params={"status": "running"})
        assert running.json()["data"] == []
        assert "bls_runs_in_flight 0" in httpx.get(f"{second.address}/metrics").text
    finally:
        drain([first, second])


def test_a_batch_runs_on_postgresql(worker: Proc, store: str, tmp_path: Path) -> None:  # noqa: F811
    """The Batch API's files (bytes in BYTEA) and a batch's run, on PostgreSQL."""
    from .test_batches import finished, jsonl, outputs
    from .test_batches import submit as submit_batch

    settings = tmp_path / "batches.toml"
    settings.write_text("[runs]\nbatch_concurrency = 4\n")
    server = serve(worker, store, settings)
    try:
        batch = finished(server, submit_batch(server, jsonl(*(str(n) for n in range(6)))))
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == 6
        answered = outputs(server, batch.output_file_id)
        assert answered["req-5"]["response"]["body"]["choices"][0]["message"]["content"] == (
            "line 5:0"
        )
    finally:
        drain([server])


def test_a_store_that_goes_away_is_a_503_and_the_server_serves_on(
    postgres: PostgresServer,
    worker: Proc,  # noqa: F811
    store: str,
    config: Path,  # noqa: F811
) -> None:
    import psycopg

    server = serve(worker, store, config)
    try:
        run = submit(server, "steps", {"n": 1, "steps": 1})
        assert ended(server, run["id"])["status"] == "succeeded"
        with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {store.rsplit('/', 1)[1]} WITH (FORCE)")
        gone = httpx.get(f"{server.address}/v1/runs/{run['id']}")
        assert gone.status_code == 503, gone.text
        assert gone.json()["error"]["type"] == "store_unavailable"
        assert "the runs store postgresql://" in gone.json()["error"]["message"]
        refused = httpx.post(
            f"{server.address}/v1/scripts/steps",
            json={"n": 3, "steps": 1},
            headers={"prefer": "respond-async"},
        )
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["type"] == "store_unavailable"
        # Synchronous requests do not need the store: served as before, from a new client.
        with httpx.Client() as fresh:
            answer = fresh.post(f"{server.address}/v1/scripts/steps", json={"n": 2, "steps": 1})
        assert answer.status_code == 200 and answer.json() == {"n": 2, "out": ["2:0"]}
    finally:
        drain([server])


def test_a_store_down_for_a_while_is_said_once_and_its_return_too(
    postgres: PostgresServer,
    worker: Proc,  # noqa: F811
    store: str,
    config: Path,  # noqa: F811
) -> None:
    """The store refuses connections for 3 s (its database closed to them), some 15 turns
    of the keeper (leases of 1 s: a turn every 0.2 s): the frontend says so once, not
    every turn, then that it answers again; and it serves runs again, to a new client."""
    import psycopg

    server = serve(worker, store, config)
    name = store.rsplit("/", 1)[1]
    failed = "background runs: the runs store postgresql://"
    try:
        assert ended(server, submit(server, "steps", {"n": 1, "steps": 1})["id"])["status"] == (
            "succeeded"
        )
        with psycopg.connect(postgres.url("postgres"), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
            wait_for(lambda: failed in server.log(), timeout=10)
            down = time.monotonic()
            wait_for(lambda: time.monotonic() - down >= 3, timeout=10)  # (15 turns or so)
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        wait_for(lambda: "the runs store answers again" in server.log(), timeout=10)
        said = [line for line in server.lines if "bls.runs: background runs:" in line]
        assert len(said) == 2, said
        assert "tried again every 0.2s" in said[0] and "Traceback" not in server.log()
        assert re.search(r"answers again, after \d+s \((1[0-9]|[2-9][0-9]) failed tries\)", said[1])
        with httpx.Client() as fresh:
            again = fresh.post(
                f"{server.address}/v1/scripts/steps", json={"n": 4, "steps": 1}, headers=ASYNC
            )
        assert again.status_code == 202, again.text
        assert ended(server, again.json()["id"])["result"] == {"n": 4, "out": ["4:0"]}
    finally:
        drain([server])


# libfaketime (Debian's faketime), which sets a process's clock ahead; CI installs it and
# sets BLS_REQUIRE_FAKETIME=1, and there its absence fails.
FAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


def test_a_frontend_whose_clock_is_ahead_takes_no_live_run_over(
    worker: Proc,  # noqa: F811
    store: str,
    config: Path,  # noqa: F811
    calls: Path,  # noqa: F811
) -> None:
    """Two frontends on one PostgreSQL store, the second's clock a minute ahead (hosts
    whose clocks drifted: libfaketime), leases of 1 s. Leases are counted on the store's
    clock, so the second never takes over a run the first is running: each runs once,
    each call is made once, and the second frontend still takes over the first's runs
    once it is killed."""
    from .cli import bls_env

    if FAKETIME is None:
        if os.environ.get("BLS_REQUIRE_FAKETIME"):
            raise RuntimeError("BLS_REQUIRE_FAKETIME is set but libfaketime is missing")
        pytest.skip("libfaketime is not installed (Debian: apt install faketime)")
    first = serve(worker, store, config)
    args = ["serve", "tests/e2e/runs/pipeline.py", "--port", "0", "--runs", store]
    ahead = bls_env(LD_PRELOAD=FAKETIME, FAKETIME="+60s", FAKETIME_DONT_RESET="1")
    second = start([*args, "--config", str(config), "--bind", f"slow={worker.address}"], env=ahead)
    try:
        runs = {n: submit(first, "steps", {"n": n, "steps": 3})["id"] for n in range(4)}
        for n, run_id in runs.items():
            done = ended(first, run_id)
            assert done["status"] == "succeeded", done
            assert done["result"] == {"n": n, "out": [f"{n}:{s}" for s in range(3)]}
        assert "recovering" not in second.log()
        started = collections.Counter(line for line in lines(calls) if line.startswith("start"))
        assert set(started.values()) == {1} and len(started) == 12
        assert "this host's clock is 60.0 s ahead of the runs store's" in second.log()
        # The first killed mid-run: the second takes the run over once its lease ran out,
        # and its deadline (30 s from its creation, on the store's clock) has not passed.
        body = {"n": 7, "steps": 2, "extra": {"sleep": 1.0}}
        run = submit(first, "steps", body, **{"x-request-timeout": "30"})
        wait_for(lambda: "start 7 0" in lines(calls), timeout=10)
        first.signal(signal.SIGKILL)
        first.wait()
        done = ended(second, run["id"])
        assert done["status"] == "succeeded", done
        assert done["result"] == {"n": 7, "out": ["7:0", "7:1"]}
        assert f"run {run['id']}: recovering" in second.log()
    finally:
        drain([first, second])
