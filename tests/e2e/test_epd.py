"""examples/epd over HTTP: several images per request behind the embedding cache, then
the generator; the first item says which images the cache served; the same answer inline
and with the encoder and the generator in `bls worker` processes. The engine is not what
is tested here (tests/e2e/test_vllm.py, test_chat.py and test_describe.py run the real
one): FakeLLM stands in for it, in process and as a worker."""

from __future__ import annotations

import json

import httpx

from .cli import FAKE_LLM, ROOT
from .procs import Proc, serving

SCRIPT = "examples/epd/epd.py"
REQUEST = json.loads((ROOT / "examples/epd/request.json").read_text())


def items(url: str, body: dict[str, object] = REQUEST) -> list[dict[str, object]]:
    with httpx.stream("POST", f"{url}/v1/scripts/epd", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines[:-1]]  # the last: the end event


def test_cache_hits_per_image_the_same_inline_and_remote(
    pipeline_workers: dict[str, Proc],
) -> None:
    with serving(SCRIPT, "--bind", f"generator={FAKE_LLM}") as inline:
        first, *caption = items(inline.address)
        # The third image is the first one again: encoded once, served to both.
        assert first["cached"] == [False, False, True]
        assert isinstance(first["encode_ms"], float)
        # A piece per engine step with text (a step may end mid-character): none empty.
        assert 0 < len(caption) <= REQUEST["max_tokens"]  # type: ignore[operator]
        assert all(piece["text"] for piece in caption), caption
        again, *caption_again = items(inline.address)
        assert again["cached"] == [True, True, True]
        assert caption_again == caption  # the same prompt and seed: the same caption
        bad = httpx.post(f"{inline.address}/v1/scripts/epd", json={"images": []})
        assert bad.status_code == 422 and bad.json()["error"]["path"] == "$.images"

    binds = [f"{n}={pipeline_workers[n].address}" for n in ("encoder", "generator")]
    with serving(SCRIPT, "--bind", binds[0], "--bind", binds[1]) as remote:
        first, *remote_caption = items(remote.address)
        assert first["cached"] == [False, False, True]  # the cache is in front of the worker
        assert remote_caption == caption
