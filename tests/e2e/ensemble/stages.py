"""A classifier for the ensemble's cancellation test: slow, and it records how it ended."""

from __future__ import annotations

import os
import time

import anyio

from bls.models.encoder import Embedding, Labels


async def slow_classifier(req: Embedding) -> Labels:
    marker = anyio.Path(os.environ["ENSEMBLE_MARKER"])
    await marker.with_suffix(".started").write_text(str(time.time()))
    try:
        await anyio.sleep(60)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            await marker.write_text("cancelled")
        raise
    await marker.write_text("finished")
    return Labels(names=["slow"], scores=[1.0])
