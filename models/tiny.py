"""A tiny Llama model built locally: random weights and a tokenizer trained here.

Used by the tests, the benchmarks and the examples' default configuration, so nothing is
downloaded from a hub. Its output is random text, but it exercises the real engine (vLLM
loads it like any Hugging Face model directory). Point ``model`` at a real local model
directory for real output.

    python -m bls.models.tiny [DIR]        # build (or reuse) and print the directory
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from .noise import verbose

__all__ = ["CONFIG", "build", "default_dir"]

log = logging.getLogger("bls.models.tiny")

# head_dim = hidden_size / num_attention_heads = 32: vLLM's CPU attention needs 32, 64, 80...
CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}
_VERSION = 1  # bump when the recipe changes: cached builds are rebuilt

_CORPUS = (
    "the quick brown fox jumps over the lazy dog . a picture of a cat sitting on a mat . "
    "what is in this image ? describe the scene in one sentence . hello world , how are "
    "you today ? the model answers with a short caption about the photo and the colours "
    "red green blue yellow black white of the objects : one two three four five six"
)


def default_dir() -> Path:
    """Where the shared tiny model lives: ``$BLS_TINY_MODEL``, else the user's cache."""
    override = os.environ.get("BLS_TINY_MODEL")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "bls" / f"tiny-llama-v{_VERSION}"


def _tokenizer(path: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its progress bars write to stdout
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    fast.save_pretrained(path)
    return int(tok.get_vocab_size())


def build(path: str | Path | None = None, *, seed: int = 0) -> Path:
    """Build the tiny model into ``path`` (default: :func:`default_dir`) unless it is
    there already; returns the directory. Deterministic for a given ``seed``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path) if path is not None else default_dir()
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    log.info("building the tiny test model into %s (first use only)", path)
    started = time.monotonic()
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    vocab = _tokenizer(tmp)
    config = LlamaConfig(
        vocab_size=vocab,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        **CONFIG,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled() and not verbose()
    if bars:  # a progress bar for one small file
        hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(tmp, safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    (tmp / "bls-tiny.json").write_text(json.dumps({"version": _VERSION, "seed": seed}))
    try:
        tmp.rename(path)  # atomic: concurrent builders race, one wins
    except OSError:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    log.info("built the tiny test model in %.1fs", time.monotonic() - started)
    return path


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else None))
