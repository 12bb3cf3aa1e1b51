"""`bls run` / `bls check` as real subprocesses: output lines, exit codes, errors."""

from __future__ import annotations

import json

import pytest

from .cli import ROOT, run_bls

REVIEW = str(ROOT / "tests/e2e/pipelines/review.py")
BACKENDS = ["asyncio", "trio"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_hello_example(backend: str) -> None:
    out = run_bls("run", "examples/hello.py", "--input", '{"text": "hi"}', "--backend", backend)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "text": "Hi!",
        "attempts": 2,
        "accepted": True,
        "reasons": ["should start with a capital letter"],
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_pipeline_with_every_primitive(backend: str) -> None:
    request = {"words": ["aab", "abcd", "xyz"], "rounds": 3, "patience": 0.05}
    out = run_bls(
        "run", REVIEW, "--entry", "review", "--input", json.dumps(request), "--backend", backend
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "scores": [2, 4, 3],
        "best": "abcd",
        "fastest": "ABCD",
        "rounds_used": 2,
        "timed_out": True,
    }


def test_bind_overrides_config_and_input_from_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"words": ["ab"], "rounds": 1, "patience": 0.01}))
    out = run_bls(
        "run",
        REVIEW,
        "--entry",
        "review",
        "--input",
        f"@{request}",
        "--bind",
        "fast_echo=tests/e2e/pipelines/review_stages.py:letters",
    )
    # fast_echo is now a streaming worker called with stage(): refused before any request.
    assert out.returncode == 1
    assert "'fast_echo' is called with stage()" in out.stderr
    assert "Traceback" not in out.stderr


def test_streaming_entry_prints_one_line_per_item() -> None:
    out = run_bls("run", REVIEW, "--entry", "spell", input='{"words": ["ab", "c"]}')
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ['"a"', '"b"', '"c"']


def test_stage_error_names_the_stage_and_exits_1() -> None:
    out = run_bls(
        "run",
        REVIEW,
        "--entry",
        "review",
        "--input",
        '{"words": ["a"]}',
        "--bind",
        "score=tests/e2e/pipelines/review_stages.py:broken",
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: stage 'score' failed (ZeroDivisionError): no score for a"
    ]
    assert out.stdout == ""


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ('{"words": "nope"}', "error: invalid request for 'review' at $.words: Expected `array`"),
        ('{"words": [1]}', "error: invalid request for 'review' at $.words[0]: Expected `str`"),
        ("{}", "error: invalid request for 'review' at $: Object missing required field `words`"),
        ('{"words": [', "error: invalid request for 'review' at $: Input data was truncated"),
        ("", "error: empty input"),
    ],
)
def test_bad_input_is_one_clear_line(payload: str, expected: str) -> None:
    out = run_bls("run", REVIEW, "--entry", "review", "--input", payload)
    assert out.returncode == 1
    assert out.stderr.startswith(expected), out.stderr
    assert "Traceback" not in out.stderr


def test_entry_must_be_chosen_when_there_are_several() -> None:
    out = run_bls("run", REVIEW, "--input", "{}")
    assert out.returncode == 1
    assert "several entrypoints (review, spell)" in out.stderr
    out = run_bls("run", REVIEW, "--entry", "nope", "--input", "{}")
    assert "no entrypoint 'nope'" in out.stderr


def test_request_timeout_flag() -> None:
    out = run_bls(
        "run",
        REVIEW,
        "--entry",
        "review",
        "--timeout",
        "0.2",
        "--input",
        '{"words": ["a"], "patience": 10}',
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: deadline exceeded")


def test_check_passes_on_the_examples() -> None:
    out = run_bls("check", "examples/hello.py")
    assert out.returncode == 0, out.stderr
    assert "draft, judge" in out.stdout


def test_check_names_every_problem() -> None:
    out = run_bls("check", "examples/hello.py", "--bind", "judge=examples/hello_stages.py:draft")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert any(
        "stage 'judge': the script sends str but the worker" in x and "hello.Draft" in x
        for x in lines
    )
    assert any("expects hello.Verdict" in x and "returns str" in x for x in lines)


def test_check_reports_unbound_stages_with_location(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "lonely.py"
    script.write_text(
        "import bls\n\n@bls.script\nasync def lonely(req: str) -> str:\n"
        "    return await bls.stage('missing', req)\n"
    )
    out = run_bls("check", str(script))
    assert out.returncode == 1
    assert f"stage 'missing' is not bound (used at {script}:5)" in out.stderr


def test_config_errors_are_clear(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "bls.toml").write_text('[stages.x]\ninline = "a:b"\nremotee = "tcp://x:1"\n')
    (tmp_path / "s.py").write_text(
        "import bls\n@bls.script\nasync def s(r: str) -> str:\n  return r\n"
    )
    out = run_bls("check", str(tmp_path / "s.py"))
    assert out.returncode == 1
    assert "bls.toml: [stages.x]: Object contains unknown field `remotee`" in out.stderr


def test_version_and_help() -> None:
    out = run_bls("--version")
    assert out.returncode == 0 and out.stdout.startswith("bls ")
    for command in ["run", "check"]:
        out = run_bls(command, "--help")
        assert out.returncode == 0 and "--bind" in out.stdout
    # No command is a mistake: its usage goes where errors go (`bls | jq` reads nothing).
    out = run_bls()
    assert out.returncode == 2 and out.stdout == "" and "usage: bls" in out.stderr


# -- traps a newcomer fell into --------------------------------------------------------

NOISY = "tests/e2e/noisy/noisy.py"


def test_stdout_carries_the_results_only_whatever_libraries_print() -> None:
    out = run_bls("run", NOISY, "--input", '"hi"', "--bind", f"chatty={NOISY}:chatty")
    assert out.returncode == 0, out.stderr
    assert out.stdout == '"HI"\n'
    for noise in ("from print()", "written to fd 1", "from a child process"):
        assert noise in out.stderr


def test_a_misspelt_stage_name_is_refused_with_the_closest_one() -> None:
    out = run_bls(
        "run", "examples/hello.py", "--input", '{"text": "hi"}', "--bind", "jduge=tcp://127.0.0.1:1"
    )
    assert out.returncode == 1
    assert "no stage 'jduge' in the script (did you mean 'judge'?)" in out.stderr
    assert "--bind jduge=tcp://127.0.0.1:1" in out.stderr


def test_a_misspelt_stage_name_in_a_config_file_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "bls.toml"
    config.write_text(f'[stages.drfat]\ninline = "{ROOT}/examples/hello_stages.py:draft"\n')
    out = run_bls("check", "examples/hello.py", "--config", str(config))
    assert out.returncode == 1
    assert f"{config}: [stages.drfat]: no stage 'drfat'" in out.stderr
    assert "did you mean 'draft'?" in out.stderr


def test_an_address_without_its_scheme_says_so() -> None:
    out = run_bls(
        "run", "examples/hello.py", "--input", '{"text": "hi"}', "--bind", "judge=127.0.0.1:5555"
    )
    assert out.returncode == 1
    assert "looks like an address without a scheme: write tcp://127.0.0.1:5555" in out.stderr
    assert "No module named" not in out.stderr


def test_an_unreachable_worker_is_one_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    config = tmp_path / "fast.toml"
    config.write_text("[transport]\nconnect_timeout_s = 0.5\n")
    out = run_bls(
        "run",
        "examples/hello.py",
        "--input",
        '{"text": "hi"}',
        "--config",
        str(config),
        "--bind",
        f"judge=tcp://127.0.0.1:{port}",
    )
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: stage 'judge': no replica answered: no answer from tcp://127.0.0.1:{port} "
        "within 0.5s (nothing accepted the connection: is `bls worker` running there?)"
    ]


@pytest.mark.parametrize("command", ["run", "check", "serve", "worker", "keygen"])
def test_traceback_is_accepted_by_every_command(command: str) -> None:
    args = {
        "run": ["run", "nope.py", "--input", "{}"],
        "check": ["check", "nope.py"],
        "serve": ["serve", "nope.py"],
        "worker": ["worker", "nope.py:x", "--listen", "tcp://127.0.0.1:0"],
        "keygen": ["keygen", "k", "--dir", "/proc/no-such-dir"],
    }[command]
    out = run_bls(*args, "--traceback")
    assert out.returncode == 1
    assert "unrecognized arguments" not in out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert out.stderr.rstrip().splitlines()[-1].startswith("error: ")


def test_keygen_writes_the_secret_key_for_its_owner_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run_bls("keygen", "worker", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "worker.key_secret").stat().st_mode & 0o777 == 0o600
    assert out.stdout.splitlines() == [
        f"public {tmp_path / 'worker.key'}",
        f"secret {tmp_path / 'worker.key_secret'}",
    ]


def test_a_request_field_with_a_typo_is_refused_by_name() -> None:
    out = run_bls("run", "examples/hello.py", "--input", '{"text": "hi", "max_attemps": 1}')
    assert out.returncode == 1
    assert "unknown field `max_attemps`" in out.stderr


def test_a_reader_that_goes_away_stops_the_run_quietly() -> None:
    import subprocess

    from .cli import BLS

    proc = subprocess.Popen(
        [BLS, "run", "tests/e2e/served/served.py", "--entry", "count",
         "--input", '{"text": "", "n": 1000000}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline()) == {"i": 0}
    proc.stdout.close()  # as `| head -1` does
    assert proc.wait(timeout=60) == 141
    assert b"error:" not in proc.stderr.read()
