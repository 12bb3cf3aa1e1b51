"""An encoder-like stage and the scripts that call it, for the worker-side cache with
affinity by content (tests/e2e/test_affinity.py): `embed` notes each call it computes (a
line in $BLS_EMBED_CALLS); `describe` calls it typed, `describe_plain` untyped."""

import base64
import os

import anyio

import bls
from bls import stage


class Image(bls.Message):
    image: bytes


class Vector(bls.Message):
    values: list[int]


async def embed(req: Image) -> Vector:
    async with await anyio.open_file(os.environ["BLS_EMBED_CALLS"], "a") as calls:
        await calls.write(f"{req.image.hex()}\n")
    return Vector(values=[len(req.image), req.image[0]])


class Images(bls.Message):
    images: list[bytes]


class Described(bls.Message):
    vectors: list[Vector]


encoder = bls.Stage("embed", Image, Vector)


@bls.script
async def describe(req: Images) -> Described:
    async def one(image: bytes) -> Vector:
        return await encoder(Image(image=image))

    return Described(vectors=await bls.map(one, req.images))  # all at once, as EPD does


@bls.script
async def describe_plain(req):
    images = [base64.b64decode(i) for i in req["images"]]  # (JSON carries bytes as base64)
    return {"vectors": await bls.map(lambda i: stage("embed", {"image": i}), images)}
