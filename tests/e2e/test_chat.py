"""examples/chat as a drop-in for `vllm serve`: the official `openai` client and vLLM's own
benchmark client against `bls serve`, with the engine in process and in a `bls worker`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pydantic
import pytest

from bls.models import tiny

from .cli import ROOT, bls_env, require_vllm
from .procs import Proc, drain, start

require_vllm()  # skips the module without vLLM; CI requires it

SCRIPT = "examples/chat/chat.py"
ASK = [{"role": "user", "content": "what is in this image ?"}]


@pytest.fixture(scope="module", params=["inline", "remote"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    tiny.build()  # the model the example's default configuration loads
    env = bls_env(TMPDIR=str(tmp_path_factory.mktemp("chat")))
    procs: list[Proc] = []
    try:
        binds: list[str] = []
        if request.param == "remote":
            # The session's vLLM worker (the same tiny model): one engine start fewer.
            worker = request.getfixturevalue("vision_workers")["generator"]
            binds = ["--bind", f"generator={worker.address}"]
        server = start(["serve", SCRIPT, "--port", "0", *binds], ready_timeout=240, env=env)
        procs.append(server)
        yield server
    finally:
        drain(procs)


def client(served: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.address}/v1", api_key="unused", max_retries=0)


def test_a_non_streamed_answer_reports_the_engines_usage_and_finish_reason(
    served: Proc,
) -> None:
    answer = client(served).chat.completions.create(
        model="tiny",
        messages=ASK,  # type: ignore[arg-type]
        max_completion_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 12
    assert answer.usage.prompt_tokens > len(ASK[0]["content"].split())  # templated prompt
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 12
    details = answer.usage.prompt_tokens_details  # what the engine's prefix cache held
    assert details is not None and 0 <= (details.cached_tokens or 0) <= answer.usage.prompt_tokens


def test_a_streamed_answer_ends_with_a_usage_chunk_and_sends_no_empty_deltas(
    served: Proc,
) -> None:
    chunks = list(
        client(served).chat.completions.create(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    first, *deltas, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.content for c in deltas[:-1])  # each carries text
    assert deltas[-1].choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 16


def test_stop_strings_and_sampling_fields_reach_the_engine(served: Proc) -> None:
    openai_client = client(served)
    greedy = {"model": "tiny", "messages": ASK, "temperature": 0, "seed": 3}
    full = openai_client.chat.completions.create(max_tokens=16, **greedy)  # type: ignore[call-overload]
    text = full.choices[0].message.content
    assert text
    stop = text[len(text) // 2 :][:3]
    cut = openai_client.chat.completions.create(max_tokens=16, stop=[stop], **greedy)  # type: ignore[call-overload]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.usage is not None and cut.usage.completion_tokens < 16


def test_models_lists_the_served_chat_model(served: Proc) -> None:
    """The entry's name first, then the engine's model directory (what `vllm serve`
    answers to)."""
    assert [m.id for m in client(served).models.list()] == ["tiny", str(tiny.default_dir())]


def test_what_the_endpoint_cannot_honour_is_a_400_naming_the_field(served: Proc) -> None:
    url = f"{served.address}/v1/chat/completions"
    beams = {"model": "tiny", "messages": ASK, "use_beam_search": True}
    refused = httpx.post(url, json=beams, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"]["path"] == "$.use_beam_search"
    assert "use_beam_search is not supported" in refused.json()["error"]["message"]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]
    picture = httpx.post(url, json={"model": "tiny", "messages": parts}, timeout=30)
    assert picture.status_code == 400
    assert picture.json()["error"]["path"] == "$.messages[0].content[1]"
    # Fields OpenAI clients send that the endpoint does not use are accepted.
    extra = {"model": "tiny", "messages": ASK, "max_tokens": 2, "logprobs": False, "user": "u"}
    assert httpx.post(url, json={**extra, "frequency_penalty": 0}, timeout=30).status_code == 200


class Verdict(pydantic.BaseModel):
    ok: bool
    reason: str = pydantic.Field(max_length=24)


def test_parse_with_a_pydantic_model_gets_a_valid_value_from_the_engine(served: Proc) -> None:
    """Random weights at temperature 1: only the constraint makes this a Verdict."""
    openai_client = client(served)
    for seed in range(5):
        done = openai_client.chat.completions.parse(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            response_format=Verdict,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
        )
        assert isinstance(done.choices[0].message.parsed, Verdict)
        assert done.choices[0].finish_reason == "stop"


CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "maxLength": 12}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}


def test_a_required_tool_choice_is_forced_through_structured_outputs(served: Proc) -> None:
    """`vllm serve` without a tool parser refuses tool_choice="required"; bls answers it."""
    done = client(served).chat.completions.create(
        model="tiny",
        messages=ASK,  # type: ignore[arg-type]
        tools=[CALC],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "calculator"  # type: ignore[union-attr]
    assert set(json.loads(call.function.arguments)) == {"expression"}  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError, match='"auto" needs a tool parser'):
        client(served).chat.completions.create(
            model="tiny",
            messages=ASK,  # type: ignore[arg-type]
            tools=[CALC],  # type: ignore[list-item]
        )


def test_logprobs_and_several_choices_come_from_the_engine(served: Proc) -> None:
    done = client(served).chat.completions.create(
        model="tiny",
        messages=ASK,  # type: ignore[arg-type]
        n=2,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in done.choices] == [0, 1]
    for choice in done.choices:
        assert choice.logprobs is not None and len(choice.logprobs.content or []) == 4
        entry = (choice.logprobs.content or [])[0]
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
    assert done.usage is not None and done.usage.completion_tokens == 8


BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def test_vllms_benchmark_client_counts_every_token(served: Proc, tmp_path: Path) -> None:
    prompts, output_len = 12, 24
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            BENCH,
            "--backend=openai-chat",
            f"--base-url={served.address}",
            "--endpoint=/v1/chat/completions",
            f"--model={tiny.build()}",
            "--served-model-name=tiny",
            "--dataset-name=random",
            "--random-input-len=32",
            f"--random-output-len={output_len}",
            "--ignore-eos",
            f"--num-prompts={prompts}",
            "--max-concurrency=4",
            "--disable-tqdm",
            "--save-result",
            f"--result-dir={tmp_path}",
            "--result-filename=result.json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=bls_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == prompts
    assert result["failed"] == 0
    # Counted from the usage chunk: exactly what the engine generated.
    assert result["total_output_tokens"] == prompts * output_len


def test_bls_bench_drives_the_chat_route(served: Proc) -> None:
    from .cli import run_bls

    for stream in ([], ["--stream"]):
        out = run_bls(
            "bench", served.address, "--chat", "--input", "@examples/chat/request.json",
            "-n", "4", "-c", "2", "--json", *stream, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        assert summary["ok"] == 4 and summary["errors"] == {}
        assert (summary["first_item_ms"] is not None) == bool(stream)


def test_the_engines_model_directory_is_a_name_the_endpoint_answers_to(served: Proc) -> None:
    """A client configured for `vllm serve MODEL_DIR` names the model by its directory."""
    model = str(tiny.default_dir())
    openai_client = client(served)
    answer = openai_client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=2,  # type: ignore[arg-type]
    )
    assert answer.model == model and answer.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError, match="The model `other` does not exist"):
        openai_client.chat.completions.create(model="other", messages=ASK)  # type: ignore[arg-type]
