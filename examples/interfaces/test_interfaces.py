"""Testing the interfaces example with bls.testing: each router with a fake worker, and
the frontend with a fake router.

    python -m pytest examples/interfaces/test_interfaces.py
"""

import pytest
from contracts import Prompt, Token
from interfaces import generate
from routers import fast, slow

import bls
from bls import testing

pytestmark = pytest.mark.anyio

WORDS = [Token(text="one"), Token(text="two"), Token(text="three")]


@pytest.mark.parametrize("router", [fast, slow], ids=["fast", "slow"])
async def test_each_router_passes_on_its_workers_tokens(router: bls.Script) -> None:
    with testing.fake({"worker": WORDS}) as calls:
        tokens = await testing.call(router, Prompt(text="one two three"))

    assert tokens == WORDS
    assert [c.request for c in calls["worker"]] == [Prompt(text="one two three")]


async def test_the_slow_router_paces_the_tokens() -> None:
    with testing.fake({"worker": WORDS}) as calls:
        await testing.call(slow, Prompt(text="x"))
    assert calls["worker"][0].duration >= 3 * 0.02


async def test_a_worker_failing_mid_stream_ends_the_routers_stream_with_its_error() -> None:
    broken = [WORDS[0], bls.StageError("worker", "internal", "lost the GPU")]
    with testing.fake({"worker": broken}):
        with pytest.raises(bls.StageError) as caught:
            await testing.call(fast, Prompt(text="x"))
    assert caught.value.stage == "worker"


async def test_the_frontend_streams_whatever_router_is_bound() -> None:
    async def router(req: Prompt):
        for word in reversed(req.text.split()):
            yield Token(text=word)

    with testing.fake({"router": router}):
        tokens = await testing.call(generate, Prompt(text="a b"))
    assert [t.text for t in tokens] == ["b", "a"]


async def test_a_fake_of_the_wrong_type_names_the_stage_and_field() -> None:
    with testing.fake({"worker": [{"txt": "one"}]}):
        with pytest.raises(TypeError, match=r"fake for stage .worker. item 1.*`text`"):
            await testing.call(fast, Prompt(text="x"))
