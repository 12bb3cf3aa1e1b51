"""Testing the ensemble's logic with bls.testing: no encoder, classifier or engine.

    python -m pytest examples/ensemble/test_ensemble.py

The generator is FakeLLM, an engine with the vLLM worker's contract and no model; the
encoder and the classifier are canned values and plain functions.
"""

import anyio
import pytest
from ensemble import Chunk, Picture, ensemble

import bls
from bls import testing
from bls.models.encoder import Embedding, Labels

pytestmark = pytest.mark.anyio

EMBEDDING = Embedding(patches=[[0.5] * 8] * 4, pooled=[0.5] * 8)  # 4 patches, 8 wide
CAT = Labels(names=["cat", "dog"], scores=[0.9, 0.1])
LLM = testing.FakeLLM(testing.FakeOptions(ttft_ms=20, tpot_ms=10))


async def test_the_caption_streams_and_the_last_chunk_merges() -> None:
    with testing.fake({"encoder": EMBEDDING, "classifier": CAT, "generator": LLM}) as calls:
        chunks = await testing.call(ensemble, Picture(image=b"png", max_tokens=6))

    *caption, last = chunks
    assert len(caption) == 6 and all(c.text for c in caption)
    assert last == Chunk(label="cat", score=0.9, caption="".join(c.text for c in caption))
    (prompt,) = [c.request for c in calls["generator"]]
    assert prompt.max_tokens == 6 and prompt.prompt_embeds.shape[0] == 4  # one row a patch


async def test_the_classifier_runs_beside_the_caption() -> None:
    async def classify(emb: Embedding) -> Labels:
        await anyio.sleep(0.05)
        return CAT

    with testing.fake({"encoder": EMBEDDING, "classifier": classify, "generator": LLM}) as calls:
        await testing.call(ensemble, Picture(image=b"png", max_tokens=8))

    (classified,), (captioned,) = calls["classifier"], calls["generator"]
    assert classified.started < captioned.ended and captioned.started < classified.ended


async def test_a_failing_classifier_fails_the_request_and_stops_the_caption() -> None:
    slow = testing.FakeLLM(testing.FakeOptions(tpot_ms=50))
    broken = bls.StageError("classifier", "internal", "out of memory")
    with testing.fake({"encoder": EMBEDDING, "classifier": broken, "generator": slow}) as calls:
        with pytest.raises(bls.StageError) as caught:
            await testing.call(ensemble, Picture(image=b"png", max_tokens=64))

    assert caught.value.stage == "classifier"
    (captioned,) = calls["generator"]
    assert captioned.cancelled and len(captioned.items) < 64
    assert slow.aborted == 1 and slow.unfinished() == 0  # the engine was told to stop


async def test_served_it_streams_server_sent_events() -> None:
    with testing.fake({"encoder": EMBEDDING, "classifier": CAT, "generator": LLM}):
        async with testing.client("examples/ensemble/ensemble.py") as http:
            got = await http.post(
                "/v1/scripts/ensemble",
                json={"image": "cG5n", "max_tokens": 3},
                headers={"accept": "text/event-stream"},
            )
    assert got.status_code == 200, got.text
    chunks = [line for line in got.text.splitlines() if line.startswith('data: {"')]
    assert len(chunks) == 4 and '"label":"cat"' in chunks[-1]
    assert got.text.rstrip().splitlines()[-2] == "event: end"
