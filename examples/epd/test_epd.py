"""Testing EPD's logic with bls.testing: the encoder behind its cache, a fake engine.

python -m pytest examples/epd/test_epd.py
"""

import pytest
from epd import Images, epd

from bls import testing
from bls.models.encoder import Embedding, EncodeRequest

pytestmark = pytest.mark.anyio


def encode(req: EncodeRequest) -> Embedding:
    """16 patches an image, 8 wide, different for each image."""
    value = float(len(req.image or b""))
    return Embedding(patches=[[value] * 8] * 16, pooled=[value] * 8)


STAGES = {
    "encoder": testing.cached(encode, capacity_mb=1),  # as `cache = {...}` in bls.toml
    "generator": testing.FakeLLM(),
}


async def test_an_image_seen_before_is_served_by_the_cache() -> None:
    with testing.fake(STAGES) as calls:
        first = await testing.call(epd, Images(images=[b"cat", b"dog"], max_tokens=4))
        second = await testing.call(epd, Images(images=[b"dog", b"bird"], max_tokens=4))

    assert first[0].cached == [False, False]
    assert second[0].cached == [True, False]
    assert [c.request.image for c in calls["encoder"]] == [b"cat", b"dog", b"bird"]


async def test_every_image_goes_into_one_prompt() -> None:
    with testing.fake(STAGES) as calls:
        pieces = await testing.call(epd, Images(images=[b"a", b"bb", b"ccc"], max_tokens=5))

    (prompt,) = [c.request for c in calls["generator"]]
    assert prompt.prompt_embeds.shape[0] == 3 * 16  # 16 positions an image
    assert len([p for p in pieces if p.text]) == 5
