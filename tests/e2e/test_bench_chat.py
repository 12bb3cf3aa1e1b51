"""Multi-turn chat through two frontends that share one engine: the chat endpoint's
``usage`` says how much of the prompt the engine's prefix cache held (read with the
official `openai` client), and `bls bench --chat --turns` holds conversations across
both frontends and reports the hit rate from it. FakeLLM (a simulated prefix cache)
behind `bls worker` stands in for the engine."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest

from .cli import FAKE_LLM, run_bls
from .procs import Proc, drain, start, worker

SCRIPT = "examples/chat/chat.py"
BLOCK = 4  # tokens a cached block holds
SYSTEM = {"role": "system", "content": "You are a careful assistant."}


@pytest.fixture(scope="module")
def frontends() -> Iterator[list[Proc]]:
    options = ["--option", "prefix_cache=5000", "--option", f"block_tokens={BLOCK}"]
    with worker(FAKE_LLM, *options) as engine:
        procs: list[Proc] = []
        try:
            for _ in range(2):
                bind = ["--bind", f"generator={engine.address}"]
                procs.append(start(["serve", SCRIPT, "--port", "0", *bind]))
            yield procs
        finally:
            drain(procs)


def ask(text: str) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": text}]


def test_usage_says_how_much_of_the_prompt_the_prefix_cache_held(frontends: list[Proc]) -> None:
    client = openai.OpenAI(base_url=f"{frontends[0].address}/v1", api_key="unused", max_retries=0)
    messages = ask(f"a question not asked before: {uuid.uuid4().hex} and what follows it")
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    prompt = first.usage.prompt_tokens
    # Only the system prompt's whole blocks can be held: the question is new.
    assert first.usage.prompt_tokens_details.cached_tokens < prompt - BLOCK
    streamed = list(
        client.chat.completions.create(
            model="tiny",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = streamed[-1].usage
    assert usage is not None and usage.prompt_tokens == prompt
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == prompt // BLOCK * BLOCK  # all whole blocks


def requests_served(proc: Proc) -> float:
    text = httpx.get(f"{proc.address}/metrics", timeout=10).text
    found = re.search(r'bls_requests_total\{entry="chat",status="200"\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_bench_holds_conversations_across_frontends_and_reports_the_hit_rate(
    frontends: list[Proc],
) -> None:
    before = [requests_served(p) for p in frontends]
    body = {"model": "tiny", "messages": ask("tell me about the sea, " * 4), "max_tokens": 12}
    urls = [p.address for p in frontends]
    out = run_bls(
        "bench", *urls, "--chat", "--turns", "4", "--input", json.dumps(body),
        "-c", "3", "-n", "24", "--stream", "--json", timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["urls"] == urls and summary["ok"] == 24
    talks = summary["conversations"]
    # The 24 requests are shared by the connections as their answers come (one may send
    # more than another), so each connection may leave its last conversation unfinished.
    assert talks["turns"] == 4 and talks["started"] - 3 <= talks["finished"] <= 6
    assert 4 * talks["finished"] <= 24 - (talks["started"] - talks["finished"])
    assert talks["later_turns"] == 24 - talks["started"]  # each began with one first turn
    # Each later turn sends the conversation so far, which the one engine has cached
    # but for the newest answer's last part and the follow-up.
    assert talks["prompt_tokens"] > 0 and talks["hit_rate"] > 0.6
    assert talks["later_first_item_ms"]["p50"] > 0
    # A conversation's turns went to the two frontends in turn: two of each finished
    # conversation's four turns each, so the two differ by at most the unfinished ones'
    # one extra turn. (Connections fixed to a frontend would give 16 and 8.)
    served = [requests_served(p) - b for p, b in zip(frontends, before, strict=True)]
    assert sum(served) == 24
    assert abs(served[0] - served[1]) <= talks["started"] - talks["finished"]


def test_turns_needs_a_chat_request_that_ends_with_the_users_message(
    frontends: list[Proc],
) -> None:
    url = frontends[0].address
    out = run_bls("bench", url, "--entry", "chat", "--turns", "2", "--input", "{}")
    assert out.returncode == 1 and "--turns" in out.stderr and "--chat" in out.stderr
    body = json.dumps({"model": "tiny", "messages": [SYSTEM]})
    out = run_bls("bench", url, "--chat", "--turns", "2", "--input", body)
    assert out.returncode == 1 and "end with the user's" in out.stderr
    assert out.stdout == ""
