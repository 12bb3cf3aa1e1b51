"""Small randomly initialised torch models for the video example: the shapes and the
control flow of a text-conditioned video diffusion pipeline, not its quality.

- ``FrameEncoder``: frames (T x 3 x 64 x 64, in [0, 1]) to latents (T x 8 x 16 x 16).
- ``Denoiser``: one denoising step of the latents, conditioned on a text embedding and
  the step; ``delay_ms`` stands in for a real model's cost per step.
- ``Upscaler``: latents to frames at twice the input's resolution (T x 128 x 128 x 3 bytes).

The same seed gives the same weights in every process, so a stage gives the same result
in process and in a ``bls worker``.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import msgspec
import torch

import bls

log = logging.getLogger("bls.examples.video")

CHANNELS = 8  # latent channels
TEXT = 384  # the text encoder's embedding size (all-MiniLM-L6-v2)


class Frames(bls.Message):
    pixels: Any  # T x 3 x H x W float tensor in [0, 1] (in), or T x H x W x 3 uint8 (out)


class Latents(bls.Message):
    latents: Any  # T x CHANNELS x h x w float tensor


class Step(bls.Message):
    latents: Any
    text: Any  # the prompt's embedding (TEXT floats)
    t: int  # this step, counting down to 0
    steps: int


class ModelOptions(msgspec.Struct, forbid_unknown_fields=True):
    seed: int = 0


class DenoiserOptions(msgspec.Struct, forbid_unknown_fields=True):
    seed: int = 0
    delay_ms: float = 0.0  # added to every step, as a bigger model would take


def _seeded(seed: int, module: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return module.eval()


class FrameEncoder(bls.Worker):
    Options = ModelOptions

    async def setup(self) -> None:
        self.net = _seeded(self.options.seed, torch.nn.Conv2d(3, CHANNELS, 4, stride=4))

    async def __call__(self, req: Frames) -> Latents:
        with torch.inference_mode():
            return Latents(latents=self.net(torch.as_tensor(req.pixels, dtype=torch.float32)))


class Denoiser(bls.Worker):
    Options = DenoiserOptions

    async def setup(self) -> None:
        self.net = _seeded(self.options.seed, torch.nn.Conv2d(CHANNELS, CHANNELS, 3, padding=1))
        self.condition = _seeded(self.options.seed + 1, torch.nn.Linear(TEXT + 1, CHANNELS))

    async def __call__(self, req: Step) -> Latents:
        x = torch.as_tensor(req.latents, dtype=torch.float32)
        text = torch.as_tensor(req.text, dtype=torch.float32).reshape(-1)
        t = torch.tensor([req.t / max(1, req.steps)])
        with torch.inference_mode():
            bias = self.condition(torch.cat([text, t]))[None, :, None, None]
            noise = torch.tanh(self.net(x) + bias)
        if self.options.delay_ms:
            # After the arithmetic, so that a cancel arriving at any point of the step ends it.
            log.info("denoiser: step t=%d started", req.t)
            try:
                await anyio.sleep(self.options.delay_ms / 1000)
            except anyio.get_cancelled_exc_class():
                log.warning("denoiser: step t=%d cancelled", req.t)
                raise
            log.info("denoiser: step t=%d done", req.t)
        return Latents(latents=x - noise / max(1, req.steps))


class Upscaler(bls.Worker):
    Options = ModelOptions

    async def setup(self) -> None:
        self.net = _seeded(self.options.seed, torch.nn.Conv2d(CHANNELS, 3, 3, padding=1))

    async def __call__(self, req: Latents) -> Frames:
        x = torch.as_tensor(req.latents, dtype=torch.float32)
        with torch.inference_mode():
            up = torch.nn.functional.interpolate(x, scale_factor=8, mode="bilinear")
            rgb = torch.sigmoid(self.net(up))  # T x 3 x 128 x 128
        return Frames(pixels=(rgb * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous())
