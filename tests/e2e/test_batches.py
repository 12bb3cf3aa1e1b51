"""The OpenAI Batch API for real: the official `openai` client uploads a JSONL file,
makes a batch of chat completions over `bls serve --runs`, follows it and reads its
output; a batch goes on after its frontend is killed with SIGKILL without running a
finished line again; a cancelled batch stops its remote calls and keeps what it
answered; one past its window expires, its unanswered lines in its error file; bad
input is refused naming the line and the field."""

from __future__ import annotations

import collections
import io
import json
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bls.stores import open_journal

from .procs import Proc, drain, wait_for
from .test_runs import calls, ended, lines, serve, store, worker  # noqa: F401
from .test_runs import submit as submit_run


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "runs.toml"
    path.write_text("[runs]\nlease_s = 1.0\nbatch_concurrency = 4\nmax_file_bytes = 65536\n")
    return path


def client(server: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.address}/v1", api_key="unused", max_retries=0)


def jsonl(*turns: str, bad: bool = False) -> bytes:
    rows: list[dict[str, Any]] = [
        {
            "custom_id": f"req-{turn.split()[0]}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": turn}]},
        }
        for turn in turns
    ]
    if bad:  # a line whose body the chat route refuses: in the error file, not fatal
        rows.append({**rows[0], "custom_id": "bad", "body": {"model": "tiny"}})
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def submit(server: Proc, data: bytes) -> str:
    api = client(server)
    uploaded = api.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.bytes == len(data) and uploaded.purpose == "batch"
    batch = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status in ("validating", "in_progress") and batch.input_file_id == uploaded.id
    return batch.id


def finished(server: Proc, batch_id: str, timeout: float = 60) -> Any:
    api = client(server)
    got: list[Any] = []

    def over() -> bool:
        got[:] = [api.batches.retrieve(batch_id)]
        return got[0].status in ("completed", "failed", "cancelled", "expired")

    wait_for(over, timeout=timeout, interval=0.1)
    return got[0]


def outputs(server: Proc, file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    text = client(server).files.content(file_id).text
    rows = [json.loads(line) for line in text.splitlines()]
    return {row["custom_id"]: row for row in rows}


# Two quick lines, then eight slow ones (a minute each, four at a time): a batch that a
# cancel or its window ends while four of them run.
QUICK_THEN_SLOW = ("0", "1", *(f"{n} 60" for n in range(2, 10)))


def kept_the_quick_and_stopped_the_running(server: Proc, batch: Any, log: Path) -> None:
    """A batch of QUICK_THEN_SLOW that ended early: its two quick lines are its output,
    the four lines it was running were cancelled at the worker (``log``: its calls), and
    the server serves on (a chat request after it is answered as before)."""
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 0)
    assert sorted(outputs(server, batch.output_file_id)) == ["req-0", "req-1"]
    wait_for(lambda: sum(ln.startswith("cancel") for ln in lines(log)) == 4, timeout=10)
    answer = client(server).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "7"}]
    )
    assert answer.choices[0].message.content == "line 7:0"


def test_a_batch_answers_each_line_as_the_chat_route_does(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
) -> None:
    server = serve(worker, store, config)
    try:
        batch_id = submit(server, jsonl(*(str(n) for n in range(12)), bad=True))
        batch = finished(server, batch_id)
        assert batch.status == "completed", batch
        counts = batch.request_counts
        assert (counts.total, counts.completed, counts.failed) == (13, 12, 1)
        answered = outputs(server, batch.output_file_id)
        assert sorted(answered) == sorted(f"req-{n}" for n in range(12))
        sync = client(server).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "3"}]
        )
        line = answered["req-3"]["response"]
        assert line["status_code"] == 200
        assert line["body"]["object"] == "chat.completion"
        text = line["body"]["choices"][0]["message"]["content"]
        assert text == sync.choices[0].message.content == "line 3:0"
        failed = outputs(server, batch.error_file_id)["bad"]["response"]
        assert failed["status_code"] == 422
        assert "missing required field `messages`" in failed["body"]["error"]["message"]
        # Listed, and its files read and removed like any other.
        listed = client(server).batches.list()
        assert [b.id for b in listed.data] == [batch_id]
        assert client(server).files.delete(batch.error_file_id).deleted
        with pytest.raises(openai.NotFoundError):
            client(server).files.retrieve(batch.error_file_id)
    finally:
        drain([server])


def test_batches_are_listed_newest_first_in_the_pages_the_client_follows(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
) -> None:
    server = serve(worker, store, config)
    try:
        made = [submit(server, jsonl(str(n))) for n in range(3)]
        run = submit_run(server, "steps", {"n": 1, "steps": 1})  # a run, not a batch
        for batch_id in made:
            assert finished(server, batch_id).status == "completed"
        ended(server, run["id"])
        api = client(server)
        page = api.batches.list(limit=2)
        assert [b.id for b in page.data] == made[::-1][:2] and page.has_more
        # The client follows the pages (after= the last id) to the end.
        assert [b.id for b in api.batches.list(limit=2)] == made[::-1]
        assert [b.id for b in api.batches.list(after=made[1]).data] == [made[0]]
        with pytest.raises(openai.BadRequestError, match="limit must be 1 to 100"):
            api.batches.list(limit=101)
        # A page that would go on from no batch is refused, not answered as the end.
        with pytest.raises(openai.BadRequestError, match="no batch 'batch_gone' to go on from"):
            api.batches.list(after="batch_gone")
    finally:
        drain([server])


def test_files_are_listed_in_the_pages_the_client_follows(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
) -> None:
    """``client.files.list``: newest first (or oldest, ``order="asc"``), ``limit`` a page,
    the pages followed with ``after``, as OpenAI's Files API lists them."""
    server = serve(worker, store, config)
    try:
        api = client(server)
        made = [
            api.files.create(file=(f"{n}.jsonl", io.BytesIO(jsonl(str(n)))), purpose="batch").id
            for n in range(3)
        ]
        page = api.files.list(limit=2)
        assert [f.id for f in page.data] == made[::-1][:2] and page.has_more
        assert [f.id for f in api.files.list(limit=2)] == made[::-1]  # (followed to the end)
        assert [f.id for f in api.files.list(order="asc", limit=1)] == made
        assert [f.id for f in api.files.list(after=made[1]).data] == [made[0]]
        assert [f.id for f in api.files.list(purpose="batch").data] == made[::-1]
        assert api.files.list(purpose="fine-tune").data == []
        with pytest.raises(openai.BadRequestError, match="limit must be 1 to 10000"):
            api.files.list(limit=10_001)
        with pytest.raises(openai.BadRequestError, match="no file 'file-gone' to go on from"):
            api.files.list(after="file-gone")
        bad = httpx.get(f"{server.address}/v1/files", params={"order": "newest"})
        assert bad.status_code == 400 and bad.json()["error"]["path"] == "order"
    finally:
        drain([server])


def test_a_batch_goes_on_after_its_frontend_is_killed_without_redoing_a_line(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
    calls: Path,  # noqa: F811
) -> None:
    first = serve(worker, store, config)
    try:
        batch_id = submit(first, jsonl(*(f"{n} 0.3" for n in range(24))))
        journal = open_journal(store)

        def lines_done() -> set[int]:
            events = journal.events(batch_id, 0, 10_000)
            return {json.loads(d)["index"] for _, k, d in events if k == "line"}

        wait_for(lambda: len(lines_done()) >= 8, timeout=30, interval=0.05)
        first.signal(signal.SIGKILL)
        first.wait()
        done_before = lines_done()
        assert 8 <= len(done_before) < 24
    finally:
        drain([first])
    second = serve(worker, store, config, "--backend", "trio")
    try:
        batch = finished(second, batch_id)
        assert batch.status == "completed" and batch.request_counts.completed == 24
        answered = outputs(second, batch.output_file_id)
        for n in range(24):
            body = answered[f"req-{n}"]["response"]["body"]
            assert body["choices"][0]["message"]["content"] == f"line {n}:0"
        started = collections.Counter(
            int(line.split()[1]) for line in lines(calls) if line.startswith("start")
        )
        assert all(started[n] == 1 for n in done_before)  # none ran twice
        assert set(started) == set(range(24))
        journal.close()
    finally:
        drain([second])


def test_a_cancelled_batch_stops_its_calls_and_keeps_what_it_answered(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
    calls: Path,  # noqa: F811
) -> None:
    server = serve(worker, store, config)
    try:
        # Cancelled while its slow lines run.
        batch_id = submit(server, jsonl(*QUICK_THEN_SLOW))
        wait_for(lambda: sum(ln.startswith("start") for ln in lines(calls)) >= 6, timeout=30)
        cancelled = client(server).batches.cancel(batch_id)
        assert cancelled.status in ("cancelling", "cancelled")
        batch = finished(server, batch_id)
        assert batch.status == "cancelled"
        kept_the_quick_and_stopped_the_running(server, batch, calls)
    finally:
        drain([server])


def test_a_batch_past_its_window_expires_and_its_unanswered_lines_are_errors(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
    calls: Path,  # noqa: F811
) -> None:
    config.write_text(config.read_text() + "batch_window_s = 4\n")
    server = serve(worker, store, config)
    try:
        # Its slow lines are cut short by the window.
        batch_id = submit(server, jsonl(*QUICK_THEN_SLOW))
        batch = finished(server, batch_id, timeout=30)
        assert batch.status == "expired" and batch.expired_at is not None
        assert batch.expires_at == batch.created_at + 4
        expired = outputs(server, batch.error_file_id)
        assert sorted(expired) == sorted(f"req-{n}" for n in range(2, 10))
        assert all(row["response"] is None for row in expired.values())
        assert {row["error"]["code"] for row in expired.values()} == {"batch_expired"}
        kept_the_quick_and_stopped_the_running(server, batch, calls)
    finally:
        drain([server])


def test_bad_uploads_and_batches_are_refused_naming_what_is_wrong(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
    tmp_path: Path,
) -> None:
    server = serve(worker, store, config)
    api = client(server)
    try:
        with pytest.raises(openai.BadRequestError, match="purpose 'fine-tune'"):
            api.files.create(file=("x.jsonl", io.BytesIO(jsonl("1"))), purpose="fine-tune")
        with pytest.raises(openai.APIStatusError, match="over \\[runs\\] max_file_bytes") as big:
            api.files.create(file=("x.jsonl", io.BytesIO(b"x" * 70_000)), purpose="batch")
        assert big.value.status_code == 413
        with pytest.raises(openai.BadRequestError, match="no file 'file-nothere'"):
            api.batches.create(
                input_file_id="file-nothere",
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        twice = jsonl("1") + jsonl("1")
        wrong = api.files.create(file=("x.jsonl", io.BytesIO(twice)), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="line 2: custom_id 'req-1' is used twice"):
            api.batches.create(
                input_file_id=wrong.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        with pytest.raises(openai.BadRequestError, match="batches run /v1/chat/completions"):
            api.batches.create(
                input_file_id=wrong.id, endpoint="/v1/embeddings", completion_window="24h"
            )
        assert api.batches.list().data == []
        with pytest.raises(openai.NotFoundError, match="no batch 'batch-x'"):
            api.batches.retrieve("batch-x")
        # A plain form post (curl -F) is an upload too, its bytes kept as they are;
        # anything else is refused clearly.
        sent = tmp_path / "by curl.jsonl"
        sent.write_bytes(jsonl("1") + bytes(range(256)) + b"\r\n--\r\n")
        form = ["-F", "purpose=batch", "-F", f"file=@{sent}"]
        made = subprocess.run(
            ["curl", "-sS", *form, f"{server.address}/v1/files"], capture_output=True, check=True
        )
        upload = json.loads(made.stdout)
        assert upload["filename"] == "by curl.jsonl" and upload["bytes"] == sent.stat().st_size
        assert api.files.content(upload["id"]).read() == sent.read_bytes()
        raw = httpx.post(f"{server.address}/v1/files", content=b"{}")
        assert raw.status_code == 400 and "multipart/form-data" in raw.json()["error"]["message"]
        assert api.models.list().data[0].id == "tiny"  # the server serves on
    finally:
        drain([server])


def test_uploads_at_once_are_bounded_and_a_stalled_one_holds_nothing_after(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    config: Path,
) -> None:
    """Four uploads whose bodies stall hold the four upload slots; a fifth is told 503
    with Retry-After, not queued; once they are gone, uploads go through again."""
    server = serve(worker, store, config)
    host, port = server.address.removeprefix("http://").split(":")
    stalled = []
    try:
        for _ in range(4):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(
                b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                b"Content-Type: multipart/form-data; boundary=b\r\n\r\n--b\r\n"
            )
            stalled.append(sock)
        api = client(server)
        refused: list[openai.APIStatusError] = []

        def fifth_refused() -> bool:
            try:
                api.files.create(file=("x.jsonl", io.BytesIO(jsonl("1"))), purpose="batch")
            except openai.APIStatusError as exc:
                refused.append(exc)
                return True
            return False

        wait_for(fifth_refused, timeout=10, interval=0.05)
        assert refused[0].status_code == 503
        assert refused[0].response.headers["retry-after"] == "1"
    finally:
        for sock in stalled:
            sock.close()
    try:
        wait_for(lambda: not fifth_refused(), timeout=10, interval=0.05)
    finally:
        drain([server])


def test_a_large_batch_holds_its_lines_not_a_task_for_each(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    tmp_path: Path,
    calls: Path,  # noqa: F811
) -> None:
    """40,000 lines, four at a time: the 39,996 waiting are lines in a list, not tasks
    waiting their turn (those took 7 KB a line: 276 MB here, gigabytes for a large file)."""
    config = tmp_path / "big.toml"
    config.write_text("[runs]\nbatch_concurrency = 4\nmax_file_bytes = 16777216\n")
    server = serve(worker, store, config)
    try:
        data = jsonl(*(f"{n} 60" for n in range(40_000)))  # (each line a minute long)
        before = _rss_mib(server.pid)
        batch_id = submit(server, data)
        wait_for(lambda: sum(ln.startswith("start") for ln in lines(calls)) == 4, timeout=60)
        grown = _rss_mib(server.pid) - before
        assert grown < 150, f"the server grew {grown} MiB for a batch of {len(data) >> 20} MiB"
        assert client(server).batches.cancel(batch_id).status in ("cancelling", "cancelled")
        assert finished(server, batch_id).status == "cancelled"
    finally:
        drain([server])


def _rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1]) >> 10


def test_batches_past_their_input_bytes_wait_their_turn(
    worker: Proc,  # noqa: F811
    store: str,  # noqa: F811
    tmp_path: Path,
    calls: Path,  # noqa: F811
) -> None:
    """[runs] batch_input_bytes bounds the input files held at once: at 1 byte, one
    batch at a time (one larger than the bound runs alone): the second starts its lines
    only once the first has ended."""
    config = tmp_path / "one.toml"
    config.write_text("[runs]\nbatch_concurrency = 4\nbatch_input_bytes = 1\n")
    server = serve(worker, store, config)
    try:
        first = submit(server, jsonl("100 60", "101 60"))  # (a minute a line)
        wait_for(lambda: sum(ln.startswith("start 10") for ln in lines(calls)) == 2, 30)
        second = submit(server, jsonl("200", "201"))
        api = client(server)
        wait_for(lambda: api.batches.retrieve(second).status == "in_progress", 30, 0.05)
        with calls.open("a") as log:  # (where the first is cancelled, among the calls)
            log.write("cancelling the first\n")
        api.batches.cancel(first)
        done = finished(server, second)
        assert done.status == "completed" and done.request_counts.completed == 2
        noted = lines(calls)
        cancelled = noted.index("cancelling the first")
        assert all(i > cancelled for i, ln in enumerate(noted) if ln.startswith("start 20"))
    finally:
        drain([server])
