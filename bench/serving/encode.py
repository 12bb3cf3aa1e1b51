"""What bench/epd_frontends.py serves: a request's images through the vision encoder,
all at once (as examples/epd does), their pooled embeddings' sizes as the answer."""

from __future__ import annotations

import torch  # noqa: F401  (the embeddings arrive as tensors: this process decodes them)

import bls
from bls.models.encoder import Embedding, EncodeRequest

encoder = bls.Stage("encoder", EncodeRequest, Embedding)


class Images(bls.Message):
    images: list[bytes]


class Encoded(bls.Message):
    sizes: list[int]


@bls.script
async def encode(req: Images) -> Encoded:
    async def one(image: bytes) -> int:
        return len((await encoder(EncodeRequest(image=image))).pooled)

    return Encoded(sizes=await bls.map(one, req.images))
