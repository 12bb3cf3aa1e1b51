"""video: frames and a prompt → two encoders at once → a denoising loop → an upscaler.

    bls run examples/video/video.py --input @examples/video/request.json
    bls serve examples/video/video.py

The frames go through a frame encoder while the prompt goes through a text encoder (the
two at once); then a loop of `steps` denoising steps — each a call to the denoiser stage,
the latents going over the wire as tensors, zero-copy — and an upscaler to twice the
resolution. The answer is an animated PNG (base64 in JSON). A deadline or a disconnect in
the middle of the loop cancels the step in flight wherever the denoiser runs, and no
further step starts. The models (models.py) are small and randomly initialised: the
shapes and the control flow are real, the pictures are noise.
"""

import io
from typing import Annotated

import msgspec
import torch
from PIL import Image

import bls
from bls.models.encoder import TextEmbedding, TextRequest
from models import Frames, Latents, Step

frame_encoder = bls.Stage("frame_encoder", Frames, Latents)
text_encoder = bls.Stage("text_encoder", TextRequest, TextEmbedding)
denoiser = bls.Stage("denoiser", Step, Latents)
upscaler = bls.Stage("upscaler", Latents, Frames)

SIZE = 64  # frames are resized to SIZE x SIZE on the way in


class Clip(bls.Message):
    frames: Annotated[list[bytes], msgspec.Meta(min_length=1, max_length=16)]  # PNG/JPEG
    prompt: str
    steps: Annotated[int, msgspec.Meta(ge=1, le=200)] = 8
    seed: int = 0


class Video(bls.Message):
    apng: bytes  # an animated PNG, base64 in JSON
    frames: int
    width: int
    height: int
    steps: int


def read_frames(frames: list[bytes]) -> torch.Tensor:
    """PNG/JPEG bytes to a T x 3 x SIZE x SIZE float tensor in [0, 1]."""
    out = []
    for i, data in enumerate(frames):
        try:
            image = Image.open(io.BytesIO(data)).convert("RGB").resize((SIZE, SIZE))
        except OSError as exc:
            why = f"frame {i} is not an image: {exc}"
            raise bls.InvalidRequest("video", why, f"$.frames[{i}]") from None
        pixels = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
        out.append(pixels.view(SIZE, SIZE, 3).permute(2, 0, 1).float() / 255)
    return torch.stack(out)


def animated_png(pixels: torch.Tensor) -> bytes:
    images = [Image.fromarray(frame.numpy()) for frame in pixels]
    buf = io.BytesIO()
    images[0].save(buf, format="PNG", save_all=True, append_images=images[1:], duration=100, loop=0)
    return buf.getvalue()


@bls.script
async def video(req: Clip) -> Video:
    pixels = read_frames(req.frames)
    encoded, text = await bls.gather(
        frame_encoder(Frames(pixels=pixels)), text_encoder(TextRequest(text=req.prompt))
    )
    gen = torch.Generator().manual_seed(req.seed)
    x = encoded.latents + torch.randn(encoded.latents.shape, generator=gen)
    for t in reversed(range(req.steps)):
        x = (await denoiser(Step(latents=x, text=text.embedding, t=t, steps=req.steps))).latents
    out = (await upscaler(Latents(latents=x))).pixels
    return Video(
        apng=animated_png(out),
        frames=out.shape[0],
        width=out.shape[2],
        height=out.shape[1],
        steps=req.steps,
    )
