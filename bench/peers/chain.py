"""The first of bls's two chained stages: a script served by `bls worker` calling `second`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _stages import Blob

import bls

second = bls.Stage("second", Blob, Blob)


@bls.script
async def first(req: Blob) -> Blob:
    return await second(req)
