"""The vLLM worker on a real engine (vLLM's CPU build) and the locally built tiny model.

One engine is shared by the in-process tests of this module; the remote tests start one
more inside a `bls worker`. CI sets BLS_REQUIRE_VLLM=1: there a missing vLLM fails the run
instead of skipping these tests.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import msgspec
import pytest

import bls
from bls import stage
from bls.models import tiny
from bls.models.vllm import GenerateItem, GenerateRequest, VllmOptions, VllmWorker

from .cli import bls_env, require_vllm
from .procs import Proc, start, stop, wait_for
from .rawio import receive_until

require_vllm()  # skips the module without vLLM; CI requires it

ENGINE = {"max_model_len": 256, "enforce_eager": True, "dtype": "float32"}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # vLLM's engine is asyncio; one loop for the whole module


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny.build()


@pytest.fixture(scope="module")
async def engine(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[VllmWorker]:
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("vllm"))  # its sockets go here
    worker = VllmWorker(
        VllmOptions(model=str(model_dir), enable_prompt_embeds=True, **ENGINE)  # type: ignore[arg-type]
    )
    await worker.setup()
    yield worker
    await worker.teardown()


def runtime(worker: VllmWorker) -> bls.Runtime:
    """A runtime whose `generator` stage is the shared engine (set up once, above)."""

    async def generator(req: GenerateRequest) -> AsyncIterator[GenerateItem]:
        async with aclosing(worker(req)) as items:  # closed with this generator, at once
            async for item in items:
                yield item

    return bls.Runtime({"generator": generator})


async def collect(req: GenerateRequest) -> list[GenerateItem]:
    return [item async for item in stage.stream("generator", req)]


pytestmark = pytest.mark.anyio


async def test_generates_a_stream_of_tokens(engine: VllmWorker) -> None:
    async with runtime(engine):
        items = await collect(GenerateRequest(prompt="hello world", max_tokens=12, seed=7))
        again = await collect(GenerateRequest(prompt="hello world", max_tokens=12, seed=7))
    assert sum(len(i.token_ids) for i in items) == 12
    assert len(items) > 1  # streamed, not one lump
    assert items[-1].finish_reason == "length"
    assert all(i.finish_reason is None for i in items[:-1])
    # A fixed seed: the same tokens. (How they are cut into items depends on how far the
    # engine got before each read: [264, 4] one time is [264], [4] the next.)
    assert [t for i in items for t in i.token_ids] == [t for i in again for t in i.token_ids]
    assert engine.unfinished() == 0


async def test_token_ids_and_prompt_embeds_prompts(engine: VllmWorker) -> None:
    import torch

    async with runtime(engine):
        by_ids = await collect(GenerateRequest(token_ids=[1, 5, 9, 12], max_tokens=5, seed=1))
        gen = torch.Generator().manual_seed(0)
        embeds = torch.randn(6, tiny.CONFIG["hidden_size"], generator=gen)
        by_embeds = await collect(GenerateRequest(prompt_embeds=embeds, max_tokens=5, seed=1))
    assert sum(len(i.token_ids) for i in by_ids) == 5
    assert sum(len(i.token_ids) for i in by_embeds) == 5


async def test_bad_request_names_the_stage_and_field(engine: VllmWorker) -> None:
    async with runtime(engine):
        with pytest.raises(bls.InvalidRequest) as info:
            await collect(GenerateRequest(prompt="x", token_ids=[1]))
    assert info.value.stage == "generator"
    assert "exactly one of" in info.value.message


async def test_leaving_the_stream_aborts_the_engine_request(engine: VllmWorker) -> None:
    aborted = engine.aborted
    async with runtime(engine):
        ask = GenerateRequest(prompt="count", max_tokens=200, ignore_eos=True)
        async with stage.stream("generator", ask) as items:
            async for _ in items:
                break
    assert engine.aborted == aborted + 1
    assert engine.unfinished() == 0


async def test_a_deadline_aborts_the_engine_request(engine: VllmWorker) -> None:
    aborted = engine.aborted
    async with runtime(engine):
        ask = GenerateRequest(prompt="count", max_tokens=240, ignore_eos=True)
        with pytest.raises(bls.DeadlineExceeded):
            async with bls.timeout(0.05):
                await collect(ask)
    assert engine.aborted == aborted + 1
    assert engine.unfinished() == 0


# -- remote: a `bls worker` process running the engine ----------------------------------


@pytest.fixture(scope="module")
def remote_engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    # A worker of its own (not the session's): these tests count the aborts in its log.
    options = [f"--option={k}={json.dumps(v)}" for k, v in ENGINE.items()]
    proc = start(
        [
            "worker",
            "bls.models.vllm:VllmWorker",
            "--listen",
            "tcp://127.0.0.1:0",
            "--option",
            f"model={model_dir}",
            *options,
        ],
        ready_timeout=180,
        env=bls_env(TMPDIR=str(tmp_path_factory.mktemp("vllm-worker"))),
    )
    try:
        yield proc
    finally:
        stop(proc.popen)


def _aborts(proc: Proc) -> list[str]:
    return [line for line in proc.lines if "aborted bls-" in line]


async def test_remote_cancel_aborts_the_request_in_the_workers_engine(
    remote_engine: Proc,
) -> None:
    before = len(_aborts(remote_engine))
    async with bls.Runtime({"generator": remote_engine.address}):
        ask = GenerateRequest(prompt="count", max_tokens=200, ignore_eos=True)
        async with stage.stream("generator", ask) as items:
            async for _ in items:
                break
    wait_for(lambda: len(_aborts(remote_engine)) > before, timeout=15)
    assert _aborts(remote_engine)[-1].rstrip().endswith("(unfinished in the engine now: 0)")


def test_http_disconnect_aborts_the_request_in_the_workers_engine(remote_engine: Proc) -> None:
    before = len(_aborts(remote_engine))
    server = start(
        [
            "serve",
            "tests/e2e/served/generate.py",
            "--port",
            "0",
            "--bind",
            f"generator={remote_engine.address}",
        ]
    )
    try:
        url = urlsplit(server.address)
        # Read slowly (10 s for the whole answer): the client leaves while the engine still
        # holds the request, however late this process gets to read its first items.
        ask = {"text": "tell me a story", "max_tokens": 200, "pause": 0.05}
        body = json.dumps(ask).encode()
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/scripts/generate HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            received = receive_until(sock, lambda d: d.count(b"data: ") >= 2)
        assert received.startswith(b"HTTP/1.1 200")
        try:
            wait_for(lambda: len(_aborts(remote_engine)) > before, timeout=15)
        except AssertionError:
            raise AssertionError(
                "no abort in the worker's engine after the client left; server:\n"
                + server.log()[-3000:]
                + "\nworker:\n"
                + "".join(remote_engine.lines[-30:])
            ) from None
        assert _aborts(remote_engine)[-1].rstrip().endswith("(unfinished in the engine now: 0)")
    finally:
        server.signal(signal.SIGTERM)
        stop(server.popen)


class Verdict(bls.Message):
    ok: bool
    score: Annotated[int, msgspec.Meta(ge=0, le=10)]
    reason: Annotated[str, msgspec.Meta(max_length=16)]


class Calc(bls.Message):
    expression: Annotated[str, msgspec.Meta(max_length=12)]


async def test_ask_returns_a_valid_typed_value_every_time_at_temperature_1(
    engine: VllmWorker,
) -> None:
    """Random weights: the constraint alone makes every output a Verdict."""
    async with runtime(engine):
        verdicts = [
            await bls.ask("generator", f"judge answer {i}", Verdict, temperature=1.0)
            for i in range(100)
        ]
        pick = await bls.ask("generator", "pick", Literal["left", "right"], temperature=1.0)
        code = await bls.ask("generator", "code", bls.Regex(r"[A-Z]{2}-\d{3}"), temperature=1.0)
        reply = await bls.ask(
            "generator", "2+2?", Verdict, tools=[bls.Tool("calc", Calc)], temperature=1.0
        )
    assert all(isinstance(v, Verdict) for v in verdicts) and len(verdicts) == 100
    assert len({v.reason for v in verdicts}) > 50  # sampled, not one answer repeated
    assert pick in ("left", "right") and re.fullmatch(r"[A-Z]{2}-\d{3}", code)
    assert isinstance(reply, Verdict) or (
        isinstance(reply, bls.ToolCall) and isinstance(reply.arguments, Calc)
    )
    assert engine.unfinished() == 0


async def test_an_output_cut_at_max_tokens_is_an_invalid_response(engine: VllmWorker) -> None:
    async with runtime(engine):
        with pytest.raises(bls.StageError, match="stopped at max_tokens=4") as failed:
            await bls.ask("generator", "judge", Verdict, max_tokens=4)
    assert failed.value.kind == "invalid_response" and failed.value.stage == "generator"
