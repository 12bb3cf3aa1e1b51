"""epd: several images per request → encode behind the embedding cache → prefill/decode.

    bls run examples/epd/epd.py --input @examples/epd/request.json
    bls serve examples/epd/epd.py

Encode, Prefill, Decode: each image goes through the vision encoder — all of a request's
images at once, batched by the encoder — behind a result cache keyed by the image's
bytes (`cache` in bls.toml), so an image seen before is not encoded again. The patch
embeddings of all the images become one prompt for vLLM, which prefills it and decodes
the caption token by token. The first item reports which images the cache served and how
long encoding took; the rest are the caption's pieces. Move the encoder or the generator
to a `bls worker` with `--bind`: the cache stays in front of the encoder, in this process.
"""

import time
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
import torch

import bls
from bls.models.adapters import embeds_prompt
from bls.models.encoder import Embedding, EncodeRequest
from bls.models.vllm import GenerateItem, GenerateRequest

HIDDEN = 128  # the generator model's hidden size (the tiny model's)

encoder = bls.Stage("encoder", EncodeRequest, Embedding)
generator = bls.StreamStage("generator", GenerateRequest, GenerateItem)


class Images(bls.Message):
    # PNG or JPEG bytes, base64 in JSON; 16 prompt positions each (64x64, 16-pixel patches).
    images: Annotated[list[bytes], msgspec.Meta(min_length=1, max_length=8)]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=64)] = 16
    seed: int = 0


class Piece(bls.Message, omit_defaults=True):
    """First: ``cached`` (one flag per image) and ``encode_ms``; then the caption."""

    cached: list[bool] | None = None
    encode_ms: float | None = None
    text: str | None = None


@bls.script
async def epd(req: Images) -> AsyncIterator[Piece]:
    async def encode(image: bytes) -> tuple[Embedding, bool]:
        with bls.cache_report() as report:
            emb = await encoder(EncodeRequest(image=image))
        return emb, report.hits == 1

    started = time.perf_counter()
    encoded = await bls.map(encode, req.images)  # all at once: the encoder batches them
    took = (time.perf_counter() - started) * 1000
    yield Piece(cached=[hit for _, hit in encoded], encode_ms=round(took, 3))

    patches = torch.cat([torch.as_tensor(emb.patches) for emb, _ in encoded])
    prompt = embeds_prompt(
        Embedding(patches=patches, pooled=patches.mean(0)),
        hidden=HIDDEN,
        max_tokens=req.max_tokens,
        seed=req.seed,
    )
    async for item in generator(prompt):
        if item.text:  # an engine step may end mid-character: no text yet
            yield Piece(text=item.text)
