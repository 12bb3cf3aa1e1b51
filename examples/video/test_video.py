"""Testing the video pipeline's logic with bls.testing: no encoders, denoiser or upscaler.

python -m pytest examples/video/test_video.py
"""

import io

import anyio
import pytest
import torch
from PIL import Image
from video import Clip, video

import bls
from bls import testing
from bls.models.encoder import TextEmbedding
from models import Frames, Latents, Step

pytestmark = pytest.mark.anyio


def png(colour: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


def encode_frames(req: Frames) -> Latents:
    return Latents(latents=torch.zeros(req.pixels.shape[0], 4, 8, 8))


def denoise(step: Step) -> Latents:
    return Latents(latents=step.latents * 0.5)


def upscale(req: Latents) -> Frames:
    frames = req.latents.shape[0]
    return Frames(pixels=torch.zeros(frames, 16, 16, 3, dtype=torch.uint8))


STAGES = {
    "frame_encoder": encode_frames,
    "text_encoder": TextEmbedding(embedding=[0.0] * 4),
    "denoiser": denoise,
    "upscaler": upscale,
}


async def test_the_loop_takes_one_denoising_step_per_step_counting_down() -> None:
    with testing.fake(STAGES) as calls:
        out = await testing.call(video, Clip(frames=[png("red"), png("blue")], prompt="a", steps=5))

    assert [c.request.t for c in calls["denoiser"]] == [4, 3, 2, 1, 0]
    assert (out.frames, out.width, out.height, out.steps) == (2, 16, 16, 5)
    assert out.apng.startswith(b"\x89PNG")


async def test_the_encoders_run_at_once() -> None:
    async def slow_frames(req: Frames) -> Latents:
        await anyio.sleep(0.05)
        return encode_frames(req)

    async def slow_text(req: object) -> TextEmbedding:
        await anyio.sleep(0.05)
        return TextEmbedding(embedding=[0.0] * 4)

    stages = {**STAGES, "frame_encoder": slow_frames, "text_encoder": slow_text}
    with testing.fake(stages) as calls:
        await testing.call(video, Clip(frames=[png("red")], prompt="a", steps=1))

    (frames,), (text,) = calls["frame_encoder"], calls["text_encoder"]
    assert frames.started < text.ended and text.started < frames.ended


async def test_a_deadline_mid_loop_stops_the_step_in_flight_and_starts_no_other() -> None:
    async def slow_denoise(step: Step) -> Latents:
        await anyio.sleep(0.05)
        return denoise(step)

    with testing.fake({**STAGES, "denoiser": slow_denoise}) as calls:
        with pytest.raises(bls.DeadlineExceeded):
            await testing.call(video, Clip(frames=[png("red")], prompt="a", steps=100), timeout=0.3)

    steps = calls["denoiser"]
    assert 1 < len(steps) < 100
    assert steps[-1].cancelled and not any(s.cancelled for s in steps[:-1])
    assert calls["upscaler"] == []


async def test_a_frame_that_is_not_an_image_is_refused_before_any_stage() -> None:
    with testing.fake(STAGES) as calls:
        with pytest.raises(bls.InvalidRequest) as caught:
            await testing.call(video, Clip(frames=[png("red"), b"junk"], prompt="a"))

    assert caught.value.path == "$.frames[1]"
    assert calls == {}
