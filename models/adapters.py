"""Prompt adapters: from an encoder's output to what the engine takes as a prompt.

Two shapes, as vision pipelines need them:

- :func:`embeds_prompt` — for a text LLM: the image's patch embeddings (projected to the
  model's hidden size if they differ) are the prompt, as vLLM's prompt-embeds input
  (``enable_prompt_embeds``). Runs on vLLM's CPU build; the tests drive it for real.
- :func:`multimodal_prompt` — for a vision-language model such as Qwen2-VL: token ids with
  one image placeholder token per merged patch, plus the image embeddings and their
  ``grid_thw``, as vLLM's ``multi_modal_data``. Needs a VLM checkpoint; the tests check
  the shapes it builds.

Both are plain functions: call them in a script, or bind one as an inline stage.
"""

from __future__ import annotations

from typing import Any

import torch  # at import, not on the event loop at the first call

from .encoder import Embedding
from .vllm import GenerateRequest, MultiModal

__all__ = ["embeds_prompt", "multimodal_prompt"]


def _project(patches: Any, hidden: int, seed: int) -> Any:
    patches = torch.as_tensor(patches, dtype=torch.float32)
    if patches.shape[-1] == hidden:
        return patches
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(patches.shape[-1], hidden, generator=gen) / patches.shape[-1] ** 0.5
    return patches @ weight


def embeds_prompt(
    emb: Embedding,
    *,
    hidden: int,
    max_tokens: int = 32,
    temperature: float = 0.0,
    seed: int | None = 0,
    projection_seed: int = 0,
) -> GenerateRequest:
    """A generation whose prompt is the image's patch embeddings (patches x ``hidden``)."""
    return GenerateRequest(
        prompt_embeds=_project(emb.patches, hidden, projection_seed),
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
    )


def multimodal_prompt(
    emb: Embedding,
    prompt_ids: list[int],
    *,
    image_token_id: int,
    grid: tuple[int, int],
    merge: int = 2,
    max_tokens: int = 32,
    temperature: float = 0.0,
    seed: int | None = 0,
) -> GenerateRequest:
    """Token ids with the image placeholders expanded, Qwen2-VL style.

    ``grid`` is the (height, width) of the patch grid; the model merges ``merge``x``merge``
    patches into one token, so ``grid[0] * grid[1] // merge**2`` placeholders go where
    ``image_token_id`` stands in ``prompt_ids`` (or in front, when it does not appear).
    """
    h, w = grid
    count = (h * w) // (merge * merge)
    placeholders = [image_token_id] * count
    if image_token_id in prompt_ids:
        at = prompt_ids.index(image_token_id)
        ids = prompt_ids[:at] + placeholders + prompt_ids[at + 1 :]
    else:
        ids = placeholders + list(prompt_ids)
    return GenerateRequest(
        token_ids=ids,
        multimodal=MultiModal(modality="image", embeddings=emb.patches, grid_thw=[[1, h, w]]),
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
    )
