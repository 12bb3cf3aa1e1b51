"""ensemble: one image, two branches at once — a classifier beside an LLM caption — merged.

    bls run examples/ensemble/ensemble.py --input @examples/ensemble/request.json
    bls serve examples/ensemble/ensemble.py

                      ┌─> classifier ───────────────────────┐
    request → encoder ┤                                     ├→ merge → last chunk
                      └─> request adapter → vLLM (streamed) ┘

The caption streams to the client token by token while the classifier runs beside it;
the last chunk merges the two branches: the label and the whole caption. Cancelling the
request (a disconnect, its deadline) cancels both branches, in whatever process they run:
the vLLM engine aborts the generation. bls.toml beside this file runs every stage in
process; `--bind NAME=tcp://...` moves any of them to a `bls worker`, with the same output.
`bespoke.py` is the same pipeline written by hand on anyio and the transport client.
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


class Picture(bls.Message):
    image: bytes  # PNG or JPEG; base64 in JSON
    max_tokens: int = 16
    seed: int = 0


class Chunk(bls.Message, omit_defaults=True):
    """A piece of the caption as it is generated; the last chunk is the merge."""

    text: str = ""
    label: str | None = None
    score: float | None = None
    caption: str | None = None


@bls.script
async def ensemble(req: Picture) -> AsyncIterator[Chunk]:
    emb = await encoder(EncodeRequest(image=req.image))
    prompt = embeds_prompt(emb, hidden=HIDDEN, max_tokens=req.max_tokens, seed=req.seed)
    caption: list[str] = []
    async with bls.beside(classifier(emb)) as labels:
        async for item in generator(prompt):
            caption.append(item.text)
            if item.text:  # an engine step may end mid-character: no text yet
                yield Chunk(text=item.text)
    top = await labels
    yield Chunk(label=top.names[0], score=top.scores[0], caption="".join(caption))
