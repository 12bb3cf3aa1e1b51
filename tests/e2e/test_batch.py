"""`bls batch`, the real command: every line answered in input order, the same in process
(asyncio and trio) as on a `bls serve`; stopped by Ctrl-C or `kill -9`, the same command
goes on without running a finished line again."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from .cli import BLS, ROOT, bls_env, run_bls
from .procs import free_port, start, stop, wait_for

SCRIPT = str(ROOT / "tests/e2e/batch/lines.py")


def _words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def _write_input(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _answers(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def calls(tmp_path: Path) -> Path:
    return tmp_path / "calls"


def _batch(calls: Path, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    entry = [] if "--entry" in args else ["--entry", "shout"]
    return run_bls("batch", target, *entry, *args, env=bls_env(BLS_BATCH_CALLS=str(calls)))


def test_every_line_is_answered_in_input_order_in_process_and_on_a_server(
    tmp_path: Path, calls: Path
) -> None:
    lines = [json.dumps({"word": w}) for w in _words(30)]
    lines[4] = json.dumps({"word": "bad", "fail": True})  # the stage fails
    lines[9] = '{"wrd": "typo"}'  # the request does not fit the entry
    lines[14] = "not json"
    lines[19] = ""  # a blank line is no request
    source = _write_input(tmp_path / "in.jsonl", lines)

    outputs = {}
    for backend in ("asyncio", "trio"):
        out = tmp_path / f"{backend}.jsonl"
        args = ["--input", str(source), "--output", str(out), "-c", "4", "--backend", backend]
        done = _batch(calls, SCRIPT, *args)
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""  # (answers go to the output file; stdout stays empty)
        assert "29 lines answered (3 with an error)" in done.stderr
        outputs[backend] = out.read_text()
    server = start(["serve", SCRIPT, "--port", "0"], env=bls_env(BLS_BATCH_CALLS=str(calls)))
    try:
        out = tmp_path / "server.jsonl"
        done = _batch(calls, server.address, "--input", str(source), "--output", str(out))
        assert done.returncode == 0, done.stderr
        outputs["server"] = out.read_text()
    finally:
        stop(server.popen)
    assert outputs["asyncio"] == outputs["trio"] == outputs["server"]

    answers = _answers(tmp_path / "asyncio.jsonl")
    assert [a["line"] for a in answers] == [n for n in range(1, 31) if n != 20]
    assert answers[0] == {"line": 1, "result": {"word": "W0", "length": 2}}
    failed = answers[4]["error"]
    assert (failed["stage"], failed["kind"], failed["code"]) == ("upper", "invalid_response", 502)
    assert answers[9]["error"]["type"] == "invalid_request"
    assert "wrd" in answers[9]["error"]["message"]  # names the field
    assert answers[14]["error"]["message"].startswith("JSON is malformed")
    assert not list(tmp_path.glob("*.progress"))


def test_a_streaming_entry_answers_the_list_of_its_items(tmp_path: Path, calls: Path) -> None:
    source = _write_input(tmp_path / "in.jsonl", ['{"word": "abc"}', '{"word": "x", "fail": true}'])
    out = tmp_path / "out.jsonl"
    done = _batch(calls, SCRIPT, "--entry", "letters", "--input", str(source), "--output", str(out))
    assert done.returncode == 0, done.stderr
    first, second = _answers(out)
    assert first == {"line": 1, "result": ["A", "B", "C"]}
    assert second["error"]["stage"] == "upper"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_stopped_batch_goes_on_without_running_a_finished_line_again(
    tmp_path: Path, calls: Path, sig: signal.Signals
) -> None:
    words = _words(40)
    words[12] = "hold"  # held while the file below exists: the batch is stopped meanwhile
    source = _write_input(tmp_path / "in.jsonl", [json.dumps({"word": w}) for w in words])
    out, progress = tmp_path / "out.jsonl", tmp_path / "out.jsonl.progress"
    hold = tmp_path / "hold"
    hold.touch()
    env = bls_env(BLS_BATCH_CALLS=str(calls), BLS_BATCH_HOLD=str(hold))
    argv = [BLS, "batch", SCRIPT, "--entry", "shout", "--input", str(source), "--output", str(out)]
    argv += ["-c", "3"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        # Every line but the held one has finished (the other slots went on past it).
        wait_for(lambda: progress.exists() and len(progress.read_text().splitlines()) == 40, 30)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert "stopped: 39 of 40 lines done" in stderr, stderr
        assert "run the same command again to go on" in stderr
    else:
        assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert Counter(calls.read_text().splitlines())["hold"] == 1

    hold.unlink()
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    answers = _answers(out)
    assert [a["line"] for a in answers] == list(range(1, 41))
    assert [a["result"]["word"] for a in answers] == [w.upper() for w in words]
    ran = Counter(calls.read_text().splitlines())
    # Only the line under way at the stop ran again; none that had finished did.
    assert ran == Counter({**{w: 1 for w in words}, "hold": 2})
    assert not progress.exists()


def test_a_finished_output_or_another_inputs_progress_is_refused(
    tmp_path: Path, calls: Path
) -> None:
    source = _write_input(tmp_path / "in.jsonl", ['{"word": "a"}', '{"word": "b"}'])
    out = tmp_path / "out.jsonl"
    args = ["--input", str(source), "--output", str(out)]
    assert _batch(calls, SCRIPT, *args).returncode == 0
    again = _batch(calls, SCRIPT, *args)
    assert again.returncode == 1
    assert f"error: {out} exists and no batch into it is under way" in again.stderr
    assert len(calls.read_text().splitlines()) == 2  # nothing ran again

    out.unlink()
    progress = tmp_path / "out.jsonl.progress"
    progress.write_text('{"bls_batch": 1, "input": "elsewhere", "bytes": 0, "sha256": ""}\n')
    other = _batch(calls, SCRIPT, *args)
    assert other.returncode == 1
    assert f"error: {progress} is the progress of another input" in other.stderr


def test_a_line_over_the_bound_is_an_answer_not_a_failed_batch(tmp_path: Path, calls: Path) -> None:
    from bls.batchfile import MAX_LINE_BYTES

    huge = json.dumps({"word": "x" * MAX_LINE_BYTES})
    source = _write_input(tmp_path / "in.jsonl", ['{"word": "a"}', huge, '{"word": "b"}'])
    out = tmp_path / "out.jsonl"
    done = _batch(calls, SCRIPT, "--input", str(source), "--output", str(out))
    assert done.returncode == 0, done.stderr
    first, over, last = _answers(out)
    assert over["line"] == 2 and over["error"]["message"] == "the line is over 16 MiB"
    assert (first["result"]["word"], last["result"]["word"]) == ("A", "B")


def test_a_line_refused_for_now_is_tried_again_after_retry_after(
    tmp_path: Path, calls: Path
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    env = bls_env(BLS_BATCH_CALLS=str(calls), BLS_BATCH_HOLD=str(hold))
    # One request at a time, none waiting: while "hold" runs, "a" is answered 429.
    serve = ["serve", SCRIPT, "--port", "0", "--max-inflight", "1", "--max-queued", "0"]
    server = start(serve, env=env)
    try:
        source = _write_input(tmp_path / "in.jsonl", ['{"word": "hold"}', '{"word": "a"}'])
        out = tmp_path / "out.jsonl"
        argv = [BLS, "batch", server.address, "--entry", "shout", "--input", str(source)]
        argv += ["--output", str(out), "-c", "2", "--retries", "3"]
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: " /v1/scripts/shout 429 " in server.log(), 30)
            hold.unlink()
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.returncode == 0, stderr
        assert _answers(out) == [
            {"line": 1, "result": {"word": "HOLD", "length": 4}},
            {"line": 2, "result": {"word": "A", "length": 1}},
        ]
        assert Counter(calls.read_text().splitlines()) == Counter({"hold": 1, "a": 1})
    finally:
        stop(server.popen)


def test_a_server_that_cannot_be_reached_stops_the_batch_and_it_goes_on_later(
    tmp_path: Path, calls: Path
) -> None:
    port = free_port()  # nothing listens there yet
    url = f"http://127.0.0.1:{port}"
    source = _write_input(tmp_path / "in.jsonl", [json.dumps({"word": w}) for w in _words(5)])
    out, progress = tmp_path / "out.jsonl", tmp_path / "out.jsonl.progress"
    args = ["--input", str(source), "--output", str(out)]

    for backend in ("asyncio", "trio"):
        down = _batch(calls, url, *args, "--retries", "1", "--backend", backend)
        assert down.returncode == 1
        assert f"cannot connect to {url}" in down.stderr
        assert "stopped: 0 of 5 lines done" in down.stderr
        assert "run the same command again to go on" in down.stderr
        assert not out.exists() and progress.exists()  # no line was marked failed

    # Again, while the server is still down: it tries again until the server is up.
    log = tmp_path / "batch.log"
    argv = [BLS, "batch", url, "--entry", "shout", *args]
    with log.open("w") as err:
        proc = subprocess.Popen(argv, env=bls_env(BLS_BATCH_CALLS=str(calls)), stderr=err)
    server = None
    try:
        wait_for(lambda: "trying again" in log.read_text(), 30)
        serve = ["serve", SCRIPT, "--port", str(port)]
        server = start(serve, env=bls_env(BLS_BATCH_CALLS=str(calls)))
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if server is not None:
            stop(server.popen)
    answers = _answers(out)
    assert [a["result"]["word"] for a in answers] == [w.upper() for w in _words(5)]
    assert Counter(calls.read_text().splitlines()) == Counter(_words(5))


def test_what_cannot_be_a_batch_is_refused_before_it_starts(tmp_path: Path, calls: Path) -> None:
    """A bad target, flags, or files (``-`` for either, the input as the output, a folder
    that is not there): one line naming it, before anything runs or is written."""
    source = _write_input(tmp_path / "in.jsonl", ['{"word": "a"}'])
    out = tmp_path / "out.jsonl"
    cases = [
        (["http://[::1", "--entry", "shout"], "error: http://[::1 is not a URL: Invalid port"),
        (["http://", "--entry", "shout"], "error: http:// names no host"),
        ([SCRIPT, "--retries", "2"], "error: --retries is for a URL"),
    ]
    for target, said in cases:
        refused = _batch(calls, *target, "--input", str(source), "--output", str(out))
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    files = [
        ("-", str(out), "error: --input -: a batch reads its input again"),
        (str(source), "-", "error: --output -: a batch keeps its progress beside its output"),
        (str(source), str(tmp_path / "." / "in.jsonl"), "is the --input: give another file"),
    ]
    for given, into, said in files:
        refused = _batch(calls, SCRIPT, "--input", given, "--output", into)
        assert refused.returncode == 1 and said in refused.stderr, refused.stderr
    assert source.read_text() == '{"word": "a"}\n' and not (tmp_path / "-").exists()
    nowhere = tmp_path / "no-such-folder" / "out.jsonl"
    refused = _batch(calls, SCRIPT, "--input", str(source), "--output", str(nowhere))
    assert refused.returncode == 1
    assert f"error: cannot write --output {nowhere}: " in refused.stderr
    assert "No such file or directory" in refused.stderr
    assert not list(tmp_path.glob("**/*.progress")) and not calls.exists()
