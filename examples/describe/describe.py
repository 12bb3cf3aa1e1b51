"""describe: encode an image, classify it, and caption it with an LLM, streaming.

    bls run examples/describe/describe.py --input @examples/describe/request.json
    bls serve examples/describe/describe.py

The image (base64 in JSON) goes through a ViT-style encoder; the pooled embedding goes to
a classifier head, and the patch embeddings, adapted into a prompt-embeds prompt, to a vLLM
engine whose tokens stream back as they are generated. bls.toml beside this file binds
every stage in process; move any of them to its own process with `bls worker` and
`--bind`, and the output stays the same (a fixed seed, greedy decoding).

The default generator is the tiny random model built by `python -m bls.models.tiny`, so
the caption is gibberish; point the generator's `model` option at a real local model
directory for real text (its hidden size goes in HIDDEN below).
"""

from collections.abc import AsyncIterator

import bls
from bls.models.adapters import embeds_prompt
from bls.models.encoder import Embedding, EncodeRequest, Labels
from bls.models.vllm import GenerateItem, GenerateRequest

HIDDEN = 128  # the generator model's hidden size (the tiny model's)

encoder = bls.Stage("encoder", EncodeRequest, Embedding)
classifier = bls.Stage("classifier", Embedding, Labels)
generator = bls.StreamStage("generator", GenerateRequest, GenerateItem)


class Describe(bls.Message):
    image: bytes  # PNG or JPEG; base64 in JSON
    max_tokens: int = 16
    seed: int = 0


class Part(bls.Message):
    """The label first, then the caption's pieces as they are generated."""

    label: str | None = None
    score: float | None = None
    text: str = ""
    token_ids: list[int] = []


@bls.script
async def describe(req: Describe) -> AsyncIterator[Part]:
    emb = await encoder(EncodeRequest(image=req.image))
    labels = await classifier(emb)
    yield Part(label=labels.names[0], score=labels.scores[0])
    prompt = embeds_prompt(emb, hidden=HIDDEN, max_tokens=req.max_tokens, seed=req.seed)
    tokens: list[int] = []  # the tokens of a character not yet whole
    async for item in generator(prompt):
        tokens += item.token_ids
        if item.text:  # an engine step may end mid-character: its tokens go with the next
            yield Part(text=item.text, token_ids=tokens)
            tokens = []
    if tokens:  # tokens that never made a whole character
        yield Part(token_ids=tokens)
