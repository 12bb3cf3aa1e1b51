"""Background runs for real: `bls serve --runs sqlite:///...` with the `slow` stage in a
`bls worker` process; runs submitted with `Prefer: respond-async`, read, streamed,
cancelled, and recovered by a second frontend after the first is killed with SIGKILL."""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import httpx
import msgspec
import pytest

from bls.stores import open_journal

from .browser import chromium, needs_chromium
from .procs import Proc, drain, start, wait_for

SCRIPT = "tests/e2e/runs/pipeline.py"
SLOW = "tests/e2e/runs/slow.py:slow"
ASYNC = {"prefer": "respond-async"}


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    return tmp_path / "calls"


@pytest.fixture
def worker(calls: Path) -> Iterator[Proc]:
    from .cli import bls_env

    proc = start(
        ["worker", SLOW, "--listen", "tcp://127.0.0.1:0"], env=bls_env(BLS_SLOW_CALLS=str(calls))
    )
    try:
        yield proc
    finally:
        drain([proc])


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'runs.sqlite3'}"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A short lease: a killed frontend's runs are taken over within a second."""
    path = tmp_path / "runs.toml"
    path.write_text("[runs]\nlease_s = 1.0\n")
    return path


def serve(worker: Proc, store: str, config: Path, *more: str) -> Proc:
    args = ["serve", SCRIPT, "--port", "0", "--runs", store, "--config", str(config)]
    return start([*args, "--bind", f"slow={worker.address}", *more])


def submit(server: Proc, entry: str, body: object, **headers: str) -> dict[str, object]:
    answer = httpx.post(
        f"{server.address}/v1/scripts/{entry}", json=body, headers={**ASYNC, **headers}
    )
    assert answer.status_code == 202, answer.text
    run = answer.json()
    assert answer.headers["location"] == f"/v1/runs/{run['id']}"
    assert answer.headers["preference-applied"] == "respond-async"
    return run  # type: ignore[no-any-return]


def ended(server: Proc, run_id: object, timeout: float = 30) -> dict[str, object]:
    """The run once it has ended (polled, bounded)."""
    found: dict[str, object] = {}

    def over() -> bool:
        found.update(httpx.get(f"{server.address}/v1/runs/{run_id}").json())
        return found["status"] in ("succeeded", "failed", "cancelled")

    wait_for(over, timeout=timeout, interval=0.05)
    return found


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_background_run_answers_what_a_synchronous_request_answers(
    worker: Proc, store: str, config: Path, backend: str
) -> None:
    server = serve(worker, store, config, "--backend", backend)
    try:
        for entry, body in (
            ("steps", {"n": 1, "steps": 3}),  # untyped, as the README writes scripts
            ("typed_steps", {"n": 2, "steps": 3}),
        ):
            run = submit(server, entry, body)
            assert run["status"] in ("queued", "running") and run["entry"] == entry
            done = ended(server, run["id"])
            assert done["status"] == "succeeded" and done["error"] is None
            sync = httpx.post(f"{server.address}/v1/scripts/{entry}", json=body, timeout=30)
            assert sync.status_code == 200
            assert done["result"] == sync.json()
            assert done["started"] >= done["created"] and done["ended"] >= done["started"]  # type: ignore[operator]
        # curl, as a shell script submits one: 202, its Location, the run.
        curl = subprocess.run(
            ["curl", "-si", "-H", "Prefer: respond-async", "-d", '{"n": 9, "steps": 1}',
             f"{server.address}/v1/scripts/steps"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        head, _, body = curl.stdout.partition("\n\n")  # (text mode: \r\n read as \n)
        assert head.startswith("HTTP/1.1 202 Accepted")
        assert f"location: /v1/runs/{json.loads(body)['id']}" in head.lower()
        assert ended(server, json.loads(body)["id"])["result"] == {"n": 9, "out": ["9:0"]}
        listed = httpx.get(f"{server.address}/v1/runs", params={"status": "succeeded"}).json()
        assert [r["entry"] for r in listed["data"]] == ["steps", "typed_steps", "steps"]
        page = httpx.get(f"{server.address}/v1/runs", params={"limit": 2}).json()
        assert page["has_more"] and len(page["data"]) == 2  # newest first
        after = httpx.get(
            f"{server.address}/v1/runs", params={"before": page["data"][1]["id"]}
        ).json()
        assert [r["entry"] for r in after["data"]] == ["steps"] and not after["has_more"]
        bad = httpx.get(f"{server.address}/v1/runs", params={"status": "done"})
        assert bad.status_code == 400 and bad.json()["error"]["path"] == "status"
        bad = httpx.get(f"{server.address}/v1/runs", params={"before": "run-gone"})
        assert bad.status_code == 400 and bad.json()["error"]["path"] == "before"
        bad = httpx.get(f"{server.address}/v1/runs", params={"state": "running"})  # (a typo)
        assert bad.status_code == 400 and bad.json()["error"]["path"] == "state"
        assert "known: status, limit, before" in bad.json()["error"]["message"]
        assert httpx.get(f"{server.address}/v1/runs/run-nope").status_code == 404
        wrong = httpx.delete(f"{server.address}/v1/runs/{run['id']}/events")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD"
        assert wrong.json()["error"]["type"] == "method_not_allowed"
        spec = httpx.get(f"{server.address}/openapi.json").json()
        assert {"/v1/runs", "/v1/runs/{id}", "/v1/runs/{id}/events"} <= set(spec["paths"])
        steps = spec["paths"]["/v1/scripts/steps"]["post"]
        assert "202" in steps["responses"] and "Prefer" in [p["name"] for p in steps["parameters"]]
    finally:
        drain([server])


def test_bad_input_is_refused_before_a_run_is_made(worker: Proc, store: str, config: Path) -> None:
    server = serve(worker, store, config)
    try:
        answer = httpx.post(
            f"{server.address}/v1/scripts/typed_steps", json={"n": "x"}, headers=ASYNC
        )
        assert answer.status_code == 422 and answer.json()["error"]["path"] == "$.n"
        assert httpx.get(f"{server.address}/v1/runs").json()["data"] == []
    finally:
        drain([server])


def test_delete_cancels_the_run_and_its_remote_call(
    worker: Proc, store: str, config: Path, calls: Path
) -> None:
    server = serve(worker, store, config)
    try:
        run = submit(server, "steps", {"n": 7, "steps": 2, "extra": {"sleep": 60}})
        wait_for(lambda: "start 7 0" in lines(calls), timeout=10)
        gone = httpx.delete(f"{server.address}/v1/runs/{run['id']}", timeout=10)
        assert gone.status_code == 200, gone.text
        assert gone.json()["status"] == "cancelled"
        assert gone.json()["error"]["type"] == "cancelled"
        wait_for(lambda: "cancel 7 0" in lines(calls), timeout=10)  # the worker stopped it
        assert "start 7 1" not in lines(calls)
        assert httpx.delete(f"{server.address}/v1/runs/{run['id']}").json()["status"] == "cancelled"
        # The server serves on, and runs new background runs.
        assert ended(server, submit(server, "steps", {"n": 8, "steps": 1})["id"])["status"] == (
            "succeeded"
        )
    finally:
        drain([server])


def test_a_deadline_of_its_own_ends_the_run(worker: Proc, store: str, config: Path) -> None:
    server = serve(worker, store, config, "--request-timeout", "0.1")
    try:
        # --request-timeout bounds synchronous requests only: this run outlives it.
        run = submit(server, "steps", {"n": 3, "steps": 2}, **{"x-request-timeout": "30"})
        assert ended(server, run["id"])["status"] == "succeeded"
        run = submit(
            server,
            "steps",
            {"n": 4, "steps": 1, "extra": {"sleep": 30}},
            **{"x-request-timeout": "0.5"},
        )
        done = ended(server, run["id"])
        assert done["status"] == "failed" and done["error"]["code"] == 504  # type: ignore[index]
    finally:
        drain([server])


def _events(
    url: str, last: int | None, stop_after: int | None = None
) -> list[tuple[int, str, str]]:
    """The SSE events of ``url`` (after ``last``), until the end, or ``stop_after`` items."""
    headers = {} if last is None else {"last-event-id": str(last)}
    got: list[tuple[int, str, str]] = []
    with httpx.stream("GET", url, headers=headers, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        event: dict[str, str] = {}
        for line in answer.iter_lines():
            if line:
                key, _, value = line.partition(": ")
                event[key] = value
                continue
            got.append((int(event["id"]), event["event"], event["data"]))
            event = {}
            if got[-1][1] == "end":
                break
            if stop_after is not None and sum(k == "item" for _, k, _ in got) == stop_after:
                break
    return got


def test_an_events_client_that_reconnects_misses_no_item_and_sees_none_twice(
    worker: Proc, store: str, config: Path
) -> None:
    server = serve(worker, store, config)
    try:
        run = submit(server, "items", {"n": 5, "steps": 5})
        url = f"{server.address}/v1/runs/{run['id']}/events"
        first = _events(url, None, stop_after=2)
        second = _events(url, first[-1][0])
        seen = first + second
        ids = [i for i, _, _ in seen]
        assert ids == sorted(set(ids))  # none twice, in order
        items = [json.loads(d)["item"] for _, k, d in seen if k == "item"]
        assert items == [f"5:{s}" for s in range(5)]
        end = json.loads(seen[-1][2])
        assert seen[-1][1] == "end" and end["status"] == "succeeded"
        assert end["result"] == [{"item": i} for i in items]
        # Read again from the start: the same events.
        assert _events(url, None) == seen
    finally:
        drain([server])


def test_an_events_client_that_saw_the_end_is_told_there_is_no_more(
    worker: Proc, store: str, config: Path
) -> None:
    """An EventSource reconnects whenever a stream ends: once it has seen the run's end,
    it is answered 204 (and stops), not held on a stream that never sends again."""
    server = serve(worker, store, config)
    try:
        run = submit(server, "items", {"n": 6, "steps": 2})
        url = f"{server.address}/v1/runs/{run['id']}/events"
        seen = _events(url, None)
        last = seen[-1][0]
        for after in (last, last + 10):
            again = httpx.get(url, headers={"last-event-id": str(after)}, timeout=10)
            assert again.status_code == 204 and again.content == b""
        for bad in ("-1", "1_0", "x", "9" * 19):
            refused = httpx.get(url, headers={"last-event-id": bad}, timeout=10)
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["type"] == "invalid_header"
        # A client that names an event past where a running run ends: its stream ends
        # with the run (2 s of calls: it is running as the stream starts), nothing sent.
        running = submit(server, "items", {"n": 7, "steps": 10})
        url = f"{server.address}/v1/runs/{running['id']}/events"
        with httpx.stream("GET", url, headers={"last-event-id": "1000"}, timeout=30) as past:
            assert past.status_code == 200
            assert list(past.iter_lines()) == []
        assert ended(server, running["id"])["status"] == "succeeded"
        assert [k for _, k, _ in _events(url, None)][-1] == "end"  # served on
    finally:
        drain([server])


@needs_chromium
def test_a_browser_follows_a_run_to_its_end_and_stops(
    worker: Proc, store: str, config: Path, tmp_path: Path
) -> None:
    """A real EventSource: every event once, in order, then the stream ends and the
    reconnect it makes is told there is no more (204), so it closes."""
    server = serve(worker, store, config)
    try:
        run = submit(server, "items", {"n": 4, "steps": 4})
        page = tmp_path / "events.html"
        page.write_text(_FOLLOWER % f"{server.address}/v1/runs/{run['id']}/events")
        # (The page is a file: web security off lets it read the server's events.)
        args = ("--disable-web-security", "--virtual-time-budget=30000", "--dump-dom")
        dom = chromium(tmp_path, *args, page.as_uri(), timeout=60)
        assert dom.returncode == 0, dom.stderr
        log = dom.stdout.partition('<pre id="closed">')[2].partition("</pre>")[0]
        head, *events = log.splitlines()
        assert head == "opened 1 time", dom.stdout
        assert [e.split(" ", 2)[:2] for e in events] == [
            [str(i + 1), kind] for i, kind in enumerate(["status"] + ["item"] * 4 + ["end"])
        ]
        items = [json.loads(e.split(" ", 2)[2])["item"] for e in events[1:5]]
        assert items == [f"4:{s}" for s in range(4)]
    finally:
        drain([server])


# A page that follows a run's events with EventSource, and writes what it saw once the
# source closes: how many times it opened, then each event's id, kind and data.
_FOLLOWER = """<!doctype html><html><body><pre id="log"></pre><script>
const seen = [];
let opened = 0;
const source = new EventSource("%s");
source.onopen = () => { opened += 1; };
for (const kind of ["status", "item", "end"]) {
  source.addEventListener(kind, (e) => seen.push(e.lastEventId + " " + kind + " " + e.data));
}
source.onerror = () => {
  if (source.readyState !== EventSource.CLOSED) return;  // (reconnecting)
  const log = document.getElementById("log");
  log.textContent = ["opened " + opened + " time" + (opened === 1 ? "" : "s"), ...seen].join("\\n");
  log.id = "closed";
};
</script></body></html>
"""


def finished_calls(store: str, run_ids: list[str]) -> set[tuple[int, int]]:
    """(run, step) of every call the journal of ``store`` has as finished."""
    journal = open_journal(store)
    try:
        return {
            (request["run"], request["step"])
            for run_id in run_ids
            for _, call, done in journal.calls(run_id)
            if done and (request := msgspec.msgpack.decode(call.request))
        }
    finally:
        journal.close()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_frontend_killed_mid_run_has_its_runs_finished_by_the_next_without_redoing_a_call(
    worker: Proc, store: str, config: Path, calls: Path, backend: str
) -> None:
    """50 runs of 4 remote steps; the frontend is killed with SIGKILL halfway; a second
    one on the same store (on ``backend``) finishes every run with the answer an
    uninterrupted run gives, no call the journal had finished is run again, and nothing
    is left running."""
    first = serve(worker, store, config)
    runs = {}
    try:
        for n in range(50):
            runs[n] = submit(first, "steps", {"n": n, "steps": 4})["id"]
        wait_for(lambda: sum(line.startswith("start") for line in lines(calls)) >= 100, timeout=60)
        first.signal(signal.SIGKILL)
        first.wait()
    finally:
        drain([first])
    finished = finished_calls(store, list(runs.values()))
    assert finished and len(finished) < 200  # (killed halfway)
    second = serve(worker, store, config, "--backend", backend)
    try:
        for n, run_id in runs.items():
            done = ended(second, run_id, timeout=60)
            assert done["status"] == "succeeded", done
            assert done["result"] == {"n": n, "out": [f"{n}:{s}" for s in range(4)]}
        started = collections.Counter(
            tuple(map(int, line.split()[1:])) for line in lines(calls) if line.startswith("start")
        )
        assert set(started) == {(n, s) for n in range(50) for s in range(4)}
        assert all(started[key] == 1 for key in finished)  # none of those ran twice
        assert (
            httpx.get(f"{second.address}/v1/runs", params={"status": "running"}).json()["data"]
            == []
        )
        metrics = httpx.get(f"{second.address}/metrics").text
        assert "bls_runs_in_flight 0" in metrics
    finally:
        drain([second])


def test_every_bound_of_runs_holds_against_a_flood_and_the_server_serves_on(
    worker: Proc, store: str, tmp_path: Path, calls: Path
) -> None:
    """One run at a time, one waiting, one events stream, 40 bytes of a result kept: past
    each, a clear refusal (the items left to the events, a unary run failed), and the
    server serves on."""
    config = tmp_path / "bounds.toml"
    config.write_text(
        "[runs]\nlease_s = 1.0\nmax_running = 1\nmax_queued = 1\nmax_result_bytes = 40\n"
        "max_event_streams = 1\n"
    )
    server = serve(worker, store, config)
    try:
        holding = submit(server, "steps", {"n": 1, "steps": 1, "extra": {"sleep": 60}})
        waiting = submit(server, "steps", {"n": 2, "steps": 1})
        refused = httpx.post(
            f"{server.address}/v1/scripts/steps", json={"n": 3, "steps": 1}, headers=ASYNC
        )
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "too_many_runs"
        assert httpx.get(f"{server.address}/v1/runs/{waiting['id']}").json()["status"] == "queued"

        url = f"{server.address}/v1/runs/{holding['id']}/events"
        with httpx.stream("GET", url, timeout=30) as first:
            reading = first.iter_lines()  # (kept: a dropped iterator closes the stream)
            assert next(reading) == "id: 1"  # (its "running" status event)
            second = httpx.get(url, timeout=10)
            assert second.status_code == 503, server.log()
            assert second.json()["error"]["type"] == "too_many_streams"
        # The first stream gone, another may open (HEAD: its head alone, at once).
        wait_for(lambda: httpx.head(url, timeout=10).status_code == 200, timeout=10)

        for run in (waiting, holding):  # (the waiting one first: else it takes the room)
            gone = httpx.delete(f"{server.address}/v1/runs/{run['id']}", timeout=10)
            assert gone.json()["status"] == "cancelled", gone.text
        assert "start 2 0" not in lines(calls)  # the waiting run never started

        # A streaming run whose items pass 40 bytes keeps them in its events alone.
        many = ended(server, submit(server, "items", {"n": 9, "steps": 4})["id"])
        assert many["status"] == "succeeded" and many["result"] is None
        items = _events(f"{server.address}/v1/runs/{many['id']}/events", None)
        assert [json.loads(d)["item"] for _, k, d in items if k == "item"] == [
            f"9:{s}" for s in range(4)
        ]
        few = ended(server, submit(server, "items", {"n": 8, "steps": 1})["id"])
        assert few["result"] == [{"item": "8:0"}]
        # A unary run whose result passes 40 bytes fails, naming the bound (typed or not),
        # rather than be recovered again and again with a result the store is not to hold.
        for entry in ("steps", "typed_steps"):
            big = ended(server, submit(server, entry, {"n": 7, "steps": 6})["id"])
            assert (big["status"], big["result"]) == ("failed", None), big
            error = big["error"]
            assert error["type"] == "result_too_large" and error["entry"] == entry, error
            assert "over the 40 a run keeps ([runs] max_result_bytes)" in error["message"]
        small = ended(server, submit(server, "steps", {"n": 1, "steps": 0})["id"])
        assert small["result"] == {"n": 1, "out": []}  # (the server serves on)
    finally:
        drain([server])


def test_two_frontends_on_one_store_act_as_one(
    worker: Proc, store: str, config: Path, calls: Path
) -> None:
    """Runs submitted to one frontend are read, followed and cancelled through another
    on the same store; queued runs start wherever there is room."""
    first = serve(worker, store, config)
    second = serve(worker, store, config)
    try:
        slow = submit(first, "steps", {"n": 1, "steps": 1, "extra": {"sleep": 60}})
        wait_for(lambda: "start 1 0" in lines(calls), timeout=10)
        # The other frontend reads it, and follows its events (from the store).
        seen = httpx.get(f"{second.address}/v1/runs/{slow['id']}").json()
        assert seen["status"] == "running"
        url = f"{second.address}/v1/runs/{slow['id']}/events"
        with httpx.stream("GET", url, timeout=30) as events:
            reading = events.iter_lines()
            assert next(reading) == "id: 1"
            # Cancelled through it: its owner is asked, and carries it out.
            asked = httpx.delete(f"{second.address}/v1/runs/{slow['id']}", timeout=10)
            assert asked.status_code == 202 and asked.json()["status"] == "running"
            rest = list(reading)
        assert any(line == "event: end" for line in rest)
        assert ended(second, slow["id"])["status"] == "cancelled"
        wait_for(lambda: "cancel 1 0" in lines(calls), timeout=10)  # the remote call too
        # A streamed run of the first, followed through the second from the start.
        run = submit(first, "items", {"n": 2, "steps": 3})
        got = _events(f"{second.address}/v1/runs/{run['id']}/events", None)
        items = [json.loads(d)["item"] for _, k, d in got if k == "item"]
        assert items == ["2:0", "2:1", "2:2"] and got[-1][1] == "end"
        # Its items come through the other frontend as they are made, not in bursts: 12
        # made 0.1 s apart come one or two at a time (looking every half second, five).
        run = submit(first, "items", {"n": 3, "steps": 12, "extra": {"sleep": 0.1}})
        url = f"{second.address}/v1/runs/{run['id']}/events"
        with httpx.stream("GET", url, timeout=30) as answer:
            came = [time.monotonic() for line in answer.iter_lines() if line == "event: item"]
        bursts = [1]  # how many came at once, moment after moment
        for before, then in pairwise(came):
            if then - before < 0.02:
                bursts[-1] += 1
            else:
                bursts.append(1)
        assert len(came) == 12 and max(bursts[1:]) <= 3, bursts  # (the first: caught up)
    finally:
        drain([first, second])


def test_a_stalled_frontend_has_its_run_taken_over_and_goes_no_further_with_it(
    worker: Proc, store: str, config: Path, calls: Path
) -> None:
    """A frontend stopped (SIGSTOP: a long pause) past its lease while a run's call is in
    flight: the other frontend takes the run over, and is at the run's next call when the
    first resumes (SIGCONT) with its own call's answer waiting. The first finds the run
    is not its own any more (its next renewal says so, or the store refuses its write of
    that call's end: tests/test_resume.py) and stops it there: the run ends once, as an
    uninterrupted run ends, its next call made once, by the other; and the first serves
    on."""
    first = serve(worker, store, config)
    second = serve(worker, store, config)
    try:
        run = submit(first, "steps", {"n": 5, "steps": 2, "extra": {"sleep": 1.0}})
        wait_for(lambda: "start 5 0" in lines(calls), timeout=10)
        first.signal(signal.SIGSTOP)
        try:
            wait_for(lambda: "start 5 1" in lines(calls), timeout=15)  # (the second's)
        finally:
            first.signal(signal.SIGCONT)
        done = ended(second, run["id"])
        assert done["status"] == "succeeded", done
        assert done["result"] == {"n": 5, "out": ["5:0", "5:1"]}
        wait_for(lambda: "taken over by another frontend; stopping here" in first.log())
        made = [line for line in lines(calls) if line.startswith("start")]
        # (Its first call, in flight when the first stalled, sent again: idempotent.)
        assert made.count("start 5 0") == 2 and made.count("start 5 1") == 1, made
        with httpx.Client() as fresh:  # the first serves on, a new client's run too
            answer = fresh.post(
                f"{first.address}/v1/scripts/steps", json={"n": 6, "steps": 1}, headers=ASYNC
            )
        assert ended(first, answer.json()["id"])["result"] == {"n": 6, "out": ["6:0"]}
    finally:
        drain([first, second])


def test_a_cancel_its_stopped_frontend_never_carried_out_ends_the_run_when_taken_over(
    worker: Proc, store: str, config: Path, calls: Path
) -> None:
    """A run's frontend stalls (SIGSTOP), a cancel is asked through another (202: the
    owner is to carry it out), and the owner dies (SIGKILL) before it could. The other
    frontend takes the run over and ends it cancelled: its call is not sent again."""
    first = serve(worker, store, config)
    second = serve(worker, store, config)
    try:
        run = submit(first, "steps", {"n": 8, "steps": 1, "extra": {"sleep": 5}})
        wait_for(lambda: "start 8 0" in lines(calls), timeout=10)
        first.signal(signal.SIGSTOP)
        asked = httpx.delete(f"{second.address}/v1/runs/{run['id']}", timeout=10)
        assert asked.status_code in (200, 202), asked.text
        first.signal(signal.SIGKILL)
        first.wait()
        done = ended(second, run["id"])
        assert done["status"] == "cancelled", done
        assert lines(calls).count("start 8 0") == 1
    finally:
        drain([first, second])
