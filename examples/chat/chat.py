"""chat: an OpenAI-compatible chat endpoint over a vLLM engine, with room for logic.

    bls serve examples/chat/chat.py
    curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \
        -d @examples/chat/request.json

A drop-in for `vllm serve`: the official `openai` client and vLLM's own benchmark
client talk to it unchanged. The engine applies the model's own chat template to the
messages and reports the token counts and finish reason, which the endpoint turns into
OpenAI's `usage` and `finish_reason`. The generator runs in process by default (bls.toml);
move it to its own process with

    bls worker bls.models.vllm:VllmWorker --listen tcp://127.0.0.1:5555 \
        --option max_model_len=512 --option enforce_eager=true --option dtype=float32
    bls serve examples/chat/chat.py --bind generator=tcp://127.0.0.1:5555

The default model is the tiny random one built by `python -m bls.models.tiny` (its
answers are gibberish); point the generator's `model` option at any local Hugging Face
model directory with a chat template for real answers.
"""

from collections.abc import AsyncIterator

import bls
from bls.models.vllm import GenerateItem, GenerateRequest, from_chat

generator = bls.StreamStage("generator", GenerateRequest, GenerateItem)


@bls.script(openai="chat", model="tiny")
async def chat(req: bls.ChatRequest) -> AsyncIterator[GenerateItem]:
    # Business logic goes around this call: routing by user, guardrails, retries,
    # a cache. The items carry the engine's token ids and finish reason through.
    async for item in generator(from_chat(req)):
        yield item
