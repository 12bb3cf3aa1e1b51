"""What a new user runs into first, on real processes: a chat request for a model not
served, paths given from the wrong folder, a picture that is not one, a file name where
JSON belongs, a ready line that says too little, a load test at a wrong route, misspellings.
Each answer must say what is wrong and what to do."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .cli import ROOT, run_bls
from .procs import Proc, serving, worker

SERVED = "tests/e2e/served/served.py"
STAGES = "tests/e2e/pipelines/remote_stages.py"
INTERFACES = "examples/interfaces/interfaces.py"
REQUEST = "@examples/interfaces/request.json"


@pytest.fixture(scope="module")
def whoami() -> Iterator[Proc]:
    with worker(f"{STAGES}:whoami") as proc:
        yield proc


# -- 1. the chat route and the model it serves ------------------------------------------


def test_a_chat_request_for_a_model_not_served_is_404_as_vllm_answers(whoami: Proc) -> None:
    import openai

    ask = [{"role": "user", "content": "hello"}]
    with serving(SERVED, "--bind", f"whoami={whoami.address}") as server:
        client = openai.OpenAI(base_url=f"{server.address}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="gpt-4", messages=ask)  # type: ignore[arg-type]
        error = info.value.body
        assert isinstance(error, dict)
        assert error["message"] == "The model `gpt-4` does not exist. Valid aliases: tiny."
        assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)
        assert client.chat.completions.create(model="tiny", messages=ask).model == "tiny"  # type: ignore[arg-type]
    with serving(SERVED, "--bind", f"whoami={whoami.address}", "--model-alias", "gpt-4") as server:
        client = openai.OpenAI(base_url=f"{server.address}/v1", api_key="-", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny", "gpt-4"]
        answer = client.chat.completions.create(model="gpt-4", messages=ask)  # type: ignore[arg-type]
        assert answer.model == "gpt-4" and answer.choices[0].message.content


def test_a_chat_body_with_message_for_messages_names_both(whoami: Proc) -> None:
    with serving(SERVED, "--bind", f"whoami={whoami.address}") as server:
        r = httpx.post(
            f"{server.address}/v1/chat/completions",
            json={"model": "tiny", "message": [{"role": "user", "content": "hi"}]},
        )
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "`messages`" in message and "`message`" in message, message
    assert "did you mean `messages`?" in message


# -- 2. paths: one rule, and where else a missing file is ---------------------------------


def test_paths_given_from_the_wrong_folder_say_where_the_file_is() -> None:
    out = run_bls("run", INTERFACES, "--input", REQUEST, "--bind", "worker=workers.py:mixed")
    assert out.returncode == 1
    assert "no such file: workers.py" in out.stderr
    assert "there is examples/interfaces/workers.py" in out.stderr, out.stderr
    out = run_bls("run", INTERFACES, "--input", REQUEST, "--config", "slow-mixed.toml")
    assert out.returncode == 1
    assert "no such config file: slow-mixed.toml" in out.stderr
    assert "there is examples/interfaces/slow-mixed.toml" in out.stderr, out.stderr


def test_the_documented_interfaces_commands_run_from_the_repository_root() -> None:
    out = run_bls(
        "run", INTERFACES, "--input", REQUEST,
        "--config", "examples/interfaces/slow-mixed.toml", cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["text"] == "hElLo"


def test_a_misspelt_function_gets_the_closest_name() -> None:
    target = "worker=examples/interfaces/workers.py:mixd"
    out = run_bls("run", INTERFACES, "--input", REQUEST, "--bind", target)
    assert out.returncode == 1
    assert "has no attribute 'mixd' (did you mean 'mixed'?)" in out.stderr, out.stderr


# -- 3. a picture that is not one ----------------------------------------------------------


@pytest.mark.parametrize("where", ["inline", "remote"])
def test_an_image_that_is_not_one_is_422_naming_the_stage_and_field(where: str) -> None:
    pytest.importorskip("torch")
    unreachable = ["--bind", "generator=tcp://127.0.0.1:9", "--connect-timeout", "0.2"]
    body = {"image": base64.b64encode(b"this is not a picture").decode()}

    def ask(*binds: str) -> httpx.Response:
        with serving("examples/describe/describe.py", *unreachable, *binds) as server:
            return httpx.post(f"{server.address}/v1/scripts/describe", json=body, timeout=60)

    if where == "inline":
        r = ask()
    else:
        with worker("bls.models.encoder:VisionEncoder") as encoder:
            r = ask("--bind", f"encoder={encoder.address}")
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert (error["type"], error["stage"], error["path"]) == (
        "invalid_request",
        "encoder",
        "$.image",
    )
    assert error["entry"] == "describe"
    assert "not an image" in error["message"]
    assert " at 0x" not in r.text and "object" not in r.text


# -- 5. a file's name where JSON belongs ---------------------------------------------------


def test_input_naming_a_file_without_the_at_suggests_it() -> None:
    out = run_bls("run", "examples/hello.py", "--input", "examples/hello.py")
    assert out.returncode == 1
    assert "did you mean --input @examples/hello.py?" in out.stderr, out.stderr
    out = run_bls("run", "examples/hello.py", "--input", "@request.json")
    assert out.returncode == 1 and "no such input file: request.json" in out.stderr


# -- 6. the ready line says what is not reachable yet ---------------------------------------


def test_the_ready_line_names_the_stages_not_reachable_yet(whoami: Proc) -> None:
    down = ["--bind", "whoami=tcp://127.0.0.1:9", "--connect-timeout", "0.2"]
    with serving(SERVED, *down) as server:
        assert server.ready_line.endswith("(not reachable yet: whoami)"), server.ready_line
        assert httpx.get(f"{server.address}/ready").status_code == 503
    with serving(SERVED, "--bind", f"whoami={whoami.address}") as server:
        assert server.ready_line == f"ready {server.address}"


# -- 7. a load test at a wrong route stops early ------------------------------------------


def test_bench_at_a_wrong_entry_stops_after_the_first_answers(whoami: Proc) -> None:
    with serving(SERVED, "--bind", f"whoami={whoami.address}") as server:
        out = run_bls(
            "bench", server.address, "--entry", "nope", "--input", "{}", "-c", "4", "-d", "20",
            timeout=60,
        )  # fmt: skip
    assert out.returncode == 1
    assert "the first 20 answers were all the same client error" in out.stderr
    assert "404 not_found: no entry 'nope'" in out.stderr, out.stderr
    assert out.stdout == ""
    sent = server.log().count("POST /v1/scripts/nope 404")
    assert 20 <= sent <= 24, sent  # the probe, and what the other connections had in flight


# -- 8. the 422 body names the entry as such ----------------------------------------------


def test_a_bad_request_names_its_entry_as_entry_not_as_a_stage(whoami: Proc) -> None:
    with serving(SERVED, "--bind", f"whoami={whoami.address}") as server:
        r = httpx.post(f"{server.address}/v1/scripts/greet", json={"txt": "hi"})
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["entry"] == "greet" and error["stage"] is None and error["code"] == 422
    assert "did you mean `text`?" in error["message"], error


# -- the first screen: where each stage is bound; no build warnings -----------------------


def test_check_and_serve_say_where_each_stage_is_bound() -> None:
    out = run_bls("check", "examples/hello.py")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "ok: 1 entrypoint(s), 2 stage(s) bound: draft, judge",
        "  draft: inline hello_stages.py:draft (examples/bls.toml)",
        "  judge: inline hello_stages.py:judge (examples/bls.toml)",
    ]
    moved = run_bls("check", "examples/hello.py", "--bind", "judge=examples/hello_stages.py:judge")
    assert "  judge: inline examples/hello_stages.py:judge (--bind judge=" in moved.stdout
    with serving("examples/hello.py") as server:
        pass
    assert "stage draft: inline hello_stages.py:draft (examples/bls.toml)" in server.log()


def test_building_the_package_prints_no_deprecation(tmp_path: Path) -> None:
    """The metadata a newcomer's `make` builds first: setuptools warns of nothing in it."""
    import shutil
    import subprocess
    import sys

    source = tmp_path / "source"  # (a copy: the build leaves its files beside the sources)
    for name in ("bls", "transport", "models"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "deprecated" not in done.stdout + done.stderr, done.stderr
