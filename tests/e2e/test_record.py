"""Record and replay for real: `bls run --record`, `bls serve --record DIR` with real HTTP
requests, `bls replay` of each record; and FakeLLM behind `bls worker`, aborting when a
client goes away and taking tensors as prompts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import httpx
import pytest

import bls
from bls.recording import decode_value, load
from bls.replay import read
from bls.segments import records_in

from .cli import BLS, ROOT, run_bls
from .procs import serving, start, stop, wait_for, worker

HELLO = "examples/hello.py"
SERVED = "tests/e2e/served/served.py"
HANDLES = "tests/e2e/handles/handles.py"


def test_a_recorded_run_replays_to_the_same_output(tmp_path: Path) -> None:
    record = tmp_path / "hello.blsrec"
    ran = run_bls("run", HELLO, "--input", '{"text": "hi"}', "--record", str(record))
    assert ran.returncode == 0, ran.stderr

    replayed = run_bls("replay", str(record), HELLO)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == ran.stdout
    assert json.loads(replayed.stdout)["attempts"] == 2


def test_a_changed_script_replays_to_a_named_divergence(tmp_path: Path) -> None:
    record = tmp_path / "hello.blsrec"
    assert (
        run_bls("run", HELLO, "--input", '{"text": "hi"}', "--record", str(record)).returncode == 0
    )
    changed = tmp_path / "hello.py"
    text = (ROOT / HELLO).read_text()
    changed.write_text(text.replace("Draft(prompt=req.text,", "Draft(prompt=req.text + '?',"))

    replayed = run_bls("replay", str(record), str(changed))
    assert replayed.returncode == 1 and replayed.stdout == ""
    assert replayed.stderr.strip() == (
        "error: the script no longer does what the record says: call 1 (stage 'draft'): the "
        "request differs at $.prompt: the record has 'hi', the script gave 'hi?'"
    )


def test_a_record_that_cannot_be_read_says_why(tmp_path: Path) -> None:
    record = tmp_path / "hello.blsrec"
    assert (
        run_bls("run", HELLO, "--input", '{"text": "hi"}', "--record", str(record)).returncode == 0
    )
    cut = tmp_path / "cut.blsrec"
    cut.write_bytes(record.read_bytes()[:40])
    done = run_bls("replay", str(cut), HELLO)
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: {cut} is truncated (40 bytes)"

    other = run_bls("replay", str(record), "examples/interfaces/interfaces.py")
    assert other.returncode == 1
    assert "the record is of entry 'hello' of hello.py; interfaces.py has no entry 'hello'" in (
        other.stderr
    )


def test_a_failed_run_is_recorded_and_fails_the_same_way_again(tmp_path: Path) -> None:
    record = tmp_path / "late.blsrec"
    (tmp_path / "down.py").write_text(
        "async def judge(text):\n    raise RuntimeError('the judge is down')\n"
    )
    ran = run_bls(
        "run", HELLO, "--input", '{"text": "hi"}', "--record", str(record), "--bind",
        f"judge={tmp_path / 'down.py'}:judge",
    )  # fmt: skip
    assert ran.returncode == 1 and "the judge is down" in ran.stderr
    replayed = run_bls("replay", str(record), HELLO)
    assert replayed.returncode == 0, replayed.stderr
    assert "the request failed as recorded: RuntimeError from stage 'judge'" in (replayed.stderr)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_bls_serve_records_each_request_and_each_replays(backend: str, tmp_path: Path) -> None:
    records = tmp_path / "records"
    with serving(SERVED, "--record", str(records), backend=backend) as server:
        with httpx.Client(base_url=server.address, timeout=30) as http:
            # (an id of the client's own, kept as given: replayed by it below)
            greeted = http.post(
                "/v1/scripts/greet", json={"text": "you"}, headers={"x-request-id": "greet:1/a b"}
            )
            counted = http.post(
                "/v1/scripts/count", json={"text": "x", "n": 3},
                headers={"accept": "application/x-ndjson"},
            )  # fmt: skip
            failed = http.post("/v1/scripts/fail", json={"text": "x"})
        assert (greeted.status_code, counted.status_code, failed.status_code) == (200, 200, 502)
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
    # One segment holds them all, each under its request's id.
    segments = list(records.glob("*.blsseg"))
    assert len(segments) == 1 and list(records.glob("*.blsrec")) == [], server.log()
    ids = [name for name, _ in records_in(segments[0])]
    answered = [r.headers["x-request-id"] for r in (greeted, counted, failed)]
    assert ids == answered and ids[0] == "greet:1/a b"
    assert f"recorded 3 request(s) in {records}" in server.log()

    replayed = {
        read(records, rid).entry: run_bls("replay", str(records), SERVED, "--id", rid)
        for rid in ids
    }
    assert all(r.returncode == 0 for r in replayed.values()), [r.stderr for r in replayed.values()]
    assert json.loads(replayed["greet"].stdout) == greeted.json()
    assert _lines(replayed["count"].stdout) == _lines(counted.text)
    assert replayed["fail"].stdout == ""
    assert "the request failed as recorded" in replayed["fail"].stderr
    # The segment itself, with the id; and without one, or with one it lacks: why not.
    one = run_bls("replay", str(segments[0]), SERVED, "--id", ids[0])
    assert one.returncode == 0 and json.loads(one.stdout) == greeted.json()
    some = run_bls("replay", str(records), SERVED)
    assert some.returncode == 1
    assert "holds 3 records: name the request with --id (its X-Request-Id)" in some.stderr
    none = run_bls("replay", str(records), SERVED, "--id", "nope")
    assert none.returncode == 1
    last = ", ".join(ids)  # (what --id takes there)
    assert f"holds no record of request 'nope' (3 others, the last: {last})" in none.stderr


def test_a_served_request_given_a_value_no_encoder_takes_answers_as_unrecorded(
    tmp_path: Path,
) -> None:
    # An inline stage handed an object no encoder takes: recording leaves it out of the
    # record (which says so, and is not replayed) and the request answers as it would
    # unrecorded; the server says so once.
    records = tmp_path / "records"
    with serving(HANDLES, "--record", str(records)) as server:
        r = httpx.post(f"{server.address}/v1/scripts/untyped", json={}, timeout=30)
        assert r.status_code == 200 and r.json() == {"kind": "Handle", "back": "Handle"}
        rid = r.headers["x-request-id"]
        left_out = "call 1 (stage 'take'): its request: TypeError: cannot send a value of type"
        wait_for(lambda: f"the record of request {rid} left out {left_out}" in server.log())
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
    assert read(records, rid).unrecorded[0].startswith(left_out)
    replayed = run_bls("replay", str(records), HANDLES, "--id", rid)
    assert replayed.returncode == 1
    cannot = "the record cannot be replayed: it left out "
    assert f"{cannot}{left_out}" in replayed.stderr and "(and 1 more)" in replayed.stderr


def _lines(text: str) -> list[object]:
    return [json.loads(line) for line in text.splitlines()]


def test_fakellm_streams_behind_bls_worker_and_aborts_when_the_client_leaves() -> None:
    options = ["--option", "ttft_ms=10", "--option", "tpot_ms=30"]
    with worker("bls.models.fakellm:FakeLLM", *options) as llm:
        with serving(
            "tests/e2e/served/generate.py", "--bind", f"generator={llm.address}"
        ) as server:
            ask = {"text": "a b c", "max_tokens": 1000}
            with httpx.Client(base_url=server.address, timeout=30) as http:
                with http.stream(
                    "POST", "/v1/scripts/generate", json=ask,
                    headers={"accept": "application/x-ndjson"},
                ) as got:  # fmt: skip
                    lines = got.iter_lines()
                    first = json.loads(next(lines))
                    second = json.loads(next(lines))
            # the client has gone: the engine is told to stop
            wait_for(lambda: "aborted fake-" in llm.log(), timeout=15)
            assert "(unfinished in the engine now: 0)" in llm.log()
            assert first["prompt_tokens"] == 3 and second.get("prompt_tokens") is None

            with httpx.Client(base_url=server.address, timeout=30) as again:  # still serves
                done = again.post(
                    "/v1/scripts/generate",
                    json={"text": "a b c", "max_tokens": 4},
                    headers={"accept": "application/x-ndjson"},
                )
            items = [json.loads(line) for line in done.text.splitlines()]
            assert done.status_code == 200 and len(items) == 4
            assert items[-1]["finish_reason"] == "length"


@pytest.mark.anyio
async def test_fakellm_behind_bls_worker_takes_prompt_embeddings_as_tensors() -> None:
    # The worker loads torch as it sets its stage up, so tensors a caller sends decode there.
    torch = pytest.importorskip("torch")
    from bls.models.vllm import GenerateItem, GenerateRequest

    embeds = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with worker("bls.models.fakellm:FakeLLM") as llm:
        async with bls.Runtime({"generator": llm.address}) as rt:
            ask = GenerateRequest(prompt_embeds=embeds, max_tokens=3)
            async with rt.stream("generator", ask) as stream:
                items = [item async for item in stream]
            again = GenerateRequest(prompt_embeds=embeds.clone(), max_tokens=3)
            async with rt.stream("generator", again) as stream:
                same = [item async for item in stream]
    assert all(isinstance(item, GenerateItem) for item in items) and len(items) == 3
    assert items[0].prompt_tokens == 3 and items[-1].finish_reason == "length"
    assert [i.token_ids for i in items] == [i.token_ids for i in same]  # from the values


# -- the record writer of `bls serve --record`: it may die or stall; serving goes on ----


def _writer_of(server_pid: int) -> int | None:
    """The pid of a `bls serve`'s record writer process (its child running write_segments),
    None while it has none."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == server_pid and b"write_segments" in cmdline:
            return int(entry.name)
    return None


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_killing_the_record_writer_never_stops_serving(tmp_path: Path) -> None:
    records = tmp_path / "records"
    with serving(SERVED, "--record", str(records)) as server:
        first = _writer_of(server.pid)
        assert first is not None
        os.kill(first, signal.SIGKILL)
        with httpx.Client(base_url=server.address, timeout=30) as http:  # a new client
            codes = [http.post("/v1/scripts/greet", json={"text": f"{i}"}).status_code
                     for i in range(50)]  # fmt: skip
        assert codes == [200] * 50, server.log()
        wait_for(lambda: "the writer process died (signal 9)" in server.log(), timeout=15)
        wait_for(lambda: _writer_of(server.pid) not in (None, first), timeout=15)  # another
        with httpx.Client(base_url=server.address, timeout=30) as http:
            assert http.post("/v1/scripts/greet", json={"text": "after"}).status_code == 200
        server.signal(signal.SIGTERM)
        assert server.wait() == 0, server.log()
    # Each writer its own segment; every record in them whole (one cut short by the kill
    # at the end of the first is not read).
    kept = [load(data) for seg in records.glob("*.blsseg") for _, data in records_in(seg)]
    assert kept and all(r.entry == "greet" for r in kept)
    closing = next(line for line in server.lines if "recorded " in line)
    assert f"recorded {len(kept)} request(s) in {records}" in closing


def test_a_stalled_writer_holds_up_neither_requests_nor_memory_nor_the_drain(
    tmp_path: Path,
) -> None:
    records = tmp_path / "records"
    with serving(SERVED, "--record", str(records), "--grace", "2") as server:
        writer = _writer_of(server.pid)
        assert writer is not None
        os.kill(writer, signal.SIGSTOP)
        try:
            big = "x" * (1 << 20)
            with httpx.Client(base_url=server.address, timeout=30) as http:
                http.post("/v1/scripts/greet", json={"text": big})  # (warm)
                before = _rss_mb(server.pid)
                codes = [http.post("/v1/scripts/greet", json={"text": big}).status_code
                         for _ in range(150)]  # fmt: skip
                grown = _rss_mb(server.pid) - before
            assert codes == [200] * 150
            # 150 records of 2 MiB each were made; at most 64 MiB of them wait.
            assert grown < 150, f"grew {grown:.0f} MB"
            assert "record(s) dropped" in server.log()
            server.signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0, server.log()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(writer, signal.SIGKILL)
    assert "the writer did not finish in 2s; stopping it" in server.log()
    closing = next(line for line in server.lines if "recorded " in line)
    assert "dropped: the writer did not keep up" in closing
    assert "lost with a writer that died or was stopped" in closing


def test_records_the_disk_cannot_hold_are_never_left_truncated(tmp_path: Path) -> None:
    records = tmp_path / "records"
    # A file size limit of 3,000 bytes, inherited by the writer process.
    limited = ["prlimit", "--fsize=3000", BLS]
    proc = start(["serve", SERVED, "--port", "0", "--record", str(records)], program=limited)
    try:
        with httpx.Client(base_url=proc.address, timeout=30) as http:
            small = http.post("/v1/scripts/greet", json={"text": "x"})
            large = [http.post("/v1/scripts/greet", json={"text": "y" * 5000}) for _ in range(20)]
            last = http.post("/v1/scripts/greet", json={"text": "z"})
        assert {a.status_code for a in (small, *large, last)} == {200}
        wait_for(lambda: "written again" in proc.log(), timeout=15)
        # /metrics counts them as the writer reports them.
        counted = ('bls_records_total{outcome="written"} 2.0', 'failed"} 20.0', 'lost"} 0.0')
        wait_for(lambda: all(c in httpx.get(f"{proc.address}/metrics").text for c in counted))
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0, proc.log()
    finally:
        stop(proc.popen)
    kept = [load(data) for seg in records.glob("*.blsseg") for _, data in records_in(seg)]
    # The small ones, whole; the large ones cut off.
    assert [[decode_value(item) for item in r.items] for r in kept] == [
        [small.json()],
        [last.json()],
    ]
    # A run of records that cannot be written is logged once, and its end, not each.
    assert proc.log().count("cannot write") == 1 and "File too large" in proc.log()
    assert "records are written again; 20 record(s) were not" in proc.log()
    assert f"recorded 2 request(s) in {records} (20 failed to write)" in proc.log()


def test_a_record_folder_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    done = run_bls("serve", SERVED, "--port", "0", "--record", str(blocker / "records"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().endswith(
        f"error: --record {blocker / 'records'}: cannot write records there: Not a directory"
    ), done.stderr


# -- an untyped script replays to what it answered live ----------------------------------

UNTYPED = "tests/e2e/untyped/tagger.py"


def test_an_untyped_script_replays_with_the_values_its_stages_gave(tmp_path: Path) -> None:
    record = tmp_path / "tag.blsrec"
    ask = '{"text": "red fox jumps"}'
    ran = run_bls("run", UNTYPED, "--input", ask, "--record", str(record))
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["words"] == ["RED", "FOX", "JUMPS"]
    # A fresh process, no bls.toml: the stages' own module holds the results' types.
    replayed = run_bls("replay", str(record), UNTYPED)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == ran.stdout

    with worker("tests/e2e/untyped/tagger_stages.py:label") as label:  # one stage remote
        remote = tmp_path / "remote.blsrec"
        bind = f"label={label.address}"
        ran = run_bls("run", UNTYPED, "--input", ask, "--record", str(remote), "--bind", bind)
        assert ran.returncode == 0, ran.stderr
    replayed = run_bls("replay", str(remote), UNTYPED)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout == ran.stdout


def test_a_record_naming_a_type_from_elsewhere_never_imports_it(tmp_path: Path) -> None:
    record = tmp_path / "tag.blsrec"
    assert (
        run_bls("run", UNTYPED, "--input", '{"text": "a b"}', "--record", str(record)).returncode
        == 0
    )
    from bls.recording import dump, load
    from bls.typenames import TypeRef

    rec = load(record.read_bytes())
    rec.calls[0].result_type = TypeRef("antigravity:Named")  # a module that does things
    record.write_bytes(dump(rec))
    replayed = run_bls("replay", str(record), UNTYPED)
    assert replayed.returncode == 1
    assert replayed.stderr.strip() == (
        "error: the script no longer does what the record says: call 1 (stage 'topic'): the "
        "script got its result as antigravity:Named: module antigravity is not loaded here: "
        "import it in the script"
    )
