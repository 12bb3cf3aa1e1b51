"""What bench/scale.py serves: one call to the `serial` stage per request."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _stages import Blob

import bls

serial = bls.Stage("serial", Blob, Blob)


@bls.script
async def encode(req: Blob) -> Blob:
    return await serial(req)
