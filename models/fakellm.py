"""``bls.models.fakellm:FakeLLM``: an engine with the vLLM worker's contract and no model.

It takes what :class:`bls.models.vllm.VllmWorker` takes (a prompt, chat messages, token
ids or prompt embeddings; ``max_tokens``, ``min_tokens``, ``stop``, ``ignore_eos``,
``seed``, ``logprobs``, a ``constraint``) and streams what it streams
(:class:`~bls.models.vllm.GenerateItem`: text, token ids, the prompt's token count on the
first item, the finish reason on the last, logprobs when asked), with deterministic text
(the same request, the same words), a time to the first token and a time per token of
your choosing, and an abort when the call is cancelled (counted, and logged as the vLLM
worker logs it).

Under a ``constraint`` (:func:`bls.ask`, the chat endpoint's ``response_format`` or
forced ``tool_choice``) the text satisfies it — a value of the JSON schema, a match of
the regex, one of the choice (:mod:`bls.models.fake_outputs`) — in tokens of up to four
characters, cut at ``max_tokens`` as an engine would. ``replies`` make it answer given
texts instead, in turn (e.g. a tool call, then an answer), whatever the constraint.

So a pipeline can be tested, load-tested and its cancellation checked without a GPU,
inline or behind ``bls worker``::

    [stages.generator]
    inline = "bls.models.fakellm:FakeLLM"
    options = { ttft_ms = 50, tpot_ms = 10 }

    bls worker bls.models.fakellm:FakeLLM --listen tcp://127.0.0.1:5555 --option tpot_ms=10
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import logging
import os
import random
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any

import anyio
import msgspec

import bls
from bls.conversation import conversation

from .fake_outputs import satisfying
from .vllm import GenerateItem, GenerateRequest, TokenLogprob, TopLogprob

__all__ = ["FakeLLM", "FakeOptions"]

log = logging.getLogger("bls.models.fakellm")

WORDS = (
    "the quick brown fox jumps over a lazy dog while small birds sing in tall green trees "
    "and rivers run to the sea under a pale morning sky"
).split()


class FakeOptions(msgspec.Struct, forbid_unknown_fields=True):
    """``ttft_ms``: the wait before the first token; ``tpot_ms``: between the next ones.
    ``eos_after``: the tokens after which it would stop by itself (finish ``"stop"``;
    default: twice the prompt's length, at least 8) unless ``ignore_eos``. ``replies``:
    texts to answer with, one per call in turn (cycling), instead of made-up ones.

    A simulated prefix cache, as vLLM's: ``prefill_ms`` more before the first token for
    each prompt token the cache does not hold, the prompt hashed in blocks of
    ``block_tokens`` (each block's hash chained to the one before), ``prefix_cache``
    blocks kept (least recently used out; 0: no cache, every token prefilled). The first
    item says how many prompt tokens were cached (``cached_tokens``).

    ``prefill_lanes``: how many prompts the engine prefills at once; the others wait their
    turn, first come first served, as prompts wait for an engine's compute (0: no limit,
    each prompt prefilled as if alone). With a limit, a prompt the cache missed delays
    every prompt behind it, as on a real engine, not only itself."""

    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    eos_after: int | None = None
    words: list[str] = msgspec.field(default_factory=lambda: list(WORDS))
    replies: list[str] = []
    prefill_ms: float = 0.0
    prefix_cache: int = 0
    block_tokens: int = 16
    prefill_lanes: Annotated[int, msgspec.Meta(ge=0)] = 0


_ids = itertools.count(1)


class FakeLLM(bls.Worker):
    """A streaming stage: :class:`GenerateRequest` in, :class:`GenerateItem` s out."""

    Options = FakeOptions

    def __init__(self, options: FakeOptions | None = None) -> None:
        super().__init__(options or FakeOptions())
        self.aborted = 0  # calls cancelled before they finished
        self.generated = 0  # tokens produced, all calls together
        self.calls = 0
        self._running = 0
        self._cache = _PrefixCache(self.options.prefix_cache, self.options.block_tokens)
        self._lanes: anyio.CapacityLimiter | None = None  # (made in the loop, on first use)

    async def setup(self) -> None:
        # Prompt embeddings arrive as tensors, as they do at the vLLM worker: the codec
        # decodes a tensor only in a process that uses torch (without torch, they can come
        # as lists). Loaded here, not on import, so that `from bls import testing` stays
        # quick: a worker process sets its stage up before it takes a call.
        with contextlib.suppress(ImportError):
            import torch  # noqa: F401

    def unfinished(self) -> int:
        """Requests still generating (0 once every call has ended or been aborted)."""
        return self._running

    async def __call__(self, req: GenerateRequest) -> AsyncIterator[GenerateItem]:
        # (closed with this generator, at once: its `finally` counts the abort)
        async with contextlib.aclosing(self._tokens(req)) as tokens:
            if req.stream:
                async for item in tokens:
                    yield item
                return
            last = GenerateItem(text="", token_ids=[])  # the whole answer, as one item
            async for item in tokens:
                last.text += item.text
                last.token_ids += item.token_ids
                if item.prompt_tokens is not None:  # (the first item's)
                    last.prompt_tokens, last.cached_tokens = item.prompt_tokens, item.cached_tokens
                last.finish_reason = item.finish_reason
                if item.logprobs is not None:
                    last.logprobs = (last.logprobs or []) + item.logprobs
        yield last

    async def _tokens(self, req: GenerateRequest) -> AsyncGenerator[GenerateItem, None]:
        opts: FakeOptions = self.options
        prompt = _prompt_tokens(req)
        seed = hashlib.blake2b(_prompt_key(req) + str(req.seed).encode(), digest_size=8)
        eos = opts.eos_after if opts.eos_after is not None else max(8, 2 * len(prompt))
        whole = self._whole(req, seed)
        request_id = f"fake-{os.getpid()}-{next(_ids)}"
        text = ""
        finished = False
        words = prompt if req.prompt_embeds is None else []  # (what the cache may hold)
        self._running += 1
        try:
            cached = await self._prefill(words, len(prompt))
            for n in range(req.max_tokens):
                if n:
                    await anyio.sleep(opts.tpot_ms / 1000)
                if whole is None:
                    token = _token(seed, n, len(opts.words))
                    piece = opts.words[token] + " "
                    text += piece
                    finish = _finish(req, n + 1, eos, text)
                else:
                    piece, token = whole[4 * n : 4 * n + 4], n
                    text += piece
                    finish = "stop" if 4 * n + 4 >= len(whole) else None
                    finish = finish or ("length" if n + 1 >= req.max_tokens else None)
                self.generated += 1
                item = GenerateItem(text=piece, token_ids=[token], finish_reason=finish)
                if n == 0:
                    item.prompt_tokens = len(prompt)
                    item.cached_tokens = cached
                if req.logprobs is not None:
                    item.logprobs = [_logprob(piece, req.logprobs)]
                finished = finish is not None
                yield item
                if finished:
                    # The answer's blocks stay cached too: the next turn's prompt has it.
                    self._cache.held(words + text.split())
                    return
        finally:
            self._running -= 1
            if not finished:
                self.aborted += 1
                log.info("aborted %s (unfinished in the engine now: %d)", request_id, self._running)

    async def _prefill(self, words: list[str], tokens: int) -> int:
        """Wait out the prompt's prefill (in a lane, when they are limited); the tokens
        the cache held, looked up when the prefill begins."""
        opts: FakeOptions = self.options
        if not opts.prefill_lanes:
            cached = self._cache.held(words)
            await anyio.sleep((opts.ttft_ms + opts.prefill_ms * (tokens - cached)) / 1000)
            return cached
        if self._lanes is None:
            self._lanes = anyio.CapacityLimiter(opts.prefill_lanes)
        async with self._lanes:
            cached = self._cache.held(words)
            await anyio.sleep(opts.prefill_ms * (tokens - cached) / 1000)
        await anyio.sleep(opts.ttft_ms / 1000)
        return cached

    def _whole(self, req: GenerateRequest, seed: Any) -> str | None:
        """The whole answer when it is given (``replies``) or constrained, else None."""
        replies: list[str] = self.options.replies
        self.calls += 1
        if replies:
            return replies[(self.calls - 1) % len(replies)]
        if req.constraint is None:
            return None
        rng = random.Random(int.from_bytes(seed.digest(), "little"))
        return satisfying(req.constraint, rng) or " "


def _logprob(piece: str, top: int) -> TokenLogprob:
    """A made-up log-probability for a token, with ``top`` made-up alternatives."""
    alternatives = [TopLogprob(token=piece, logprob=-0.5, bytes=list(piece.encode()))]
    alternatives += [
        TopLogprob(token=word, logprob=-2.0 - i, bytes=list(word.encode()))
        for i, word in enumerate(WORDS[: max(top - 1, 0)])
    ]
    return TokenLogprob(
        token=piece, logprob=-0.5, bytes=list(piece.encode()), top_logprobs=alternatives[:top]
    )


def _finish(req: GenerateRequest, n: int, eos: int, text: str) -> str | None:
    """Why generation ends after token ``n`` (None: it goes on)."""
    if any(stop and stop in text for stop in req.stop):
        return "stop"
    if n >= req.max_tokens:
        return "length"
    if not req.ignore_eos and n >= max(eos, req.min_tokens):
        return "stop"
    return None


def _token(seed: Any, n: int, vocab: int) -> int:
    digest = seed.copy()
    digest.update(n.to_bytes(4, "little"))
    return int.from_bytes(digest.digest(), "little") % vocab


def _prompt_key(req: GenerateRequest) -> bytes:
    if req.messages is not None:
        return msgspec.json.encode(conversation(req.messages))
    if req.prompt is not None:
        return req.prompt.encode()
    if req.token_ids is not None:
        return msgspec.json.encode(req.token_ids)
    embeds = req.prompt_embeds
    to_numpy = getattr(embeds, "numpy", None)  # a tensor: its values
    if to_numpy is not None:
        return bytes(to_numpy().tobytes())
    return msgspec.json.encode(embeds)


def _prompt_tokens(req: GenerateRequest) -> list[Any]:
    """The prompt as the engine would count it (and its prefix cache hash it): words,
    token ids, or embedding rows (each a 0: rows are never cached)."""
    kinds = ("prompt", "messages", "token_ids", "prompt_embeds")
    given = [name for name in kinds if getattr(req, name) is not None]
    if len(given) != 1:
        raise bls.InvalidRequest(
            "", f"give exactly one of {', '.join(kinds)} (got {given or 'none'})", "$"
        )
    if req.token_ids is not None:
        return list(req.token_ids)
    if req.prompt_embeds is not None:
        return [0] * _rows(req.prompt_embeds)
    text = (
        req.prompt
        if req.prompt is not None
        else " ".join(m["content"] for m in conversation(req.messages or []))
    )
    return text.split()


class _PrefixCache:
    """Blocks of ``block_tokens`` tokens, each known by a hash chained to the blocks
    before it (so a block is held only with its whole prefix), ``capacity`` of them, the
    least recently used out first (vLLM's prefix cache, without the memory)."""

    def __init__(self, capacity: int, block_tokens: int) -> None:
        self.capacity = capacity
        self.size = max(1, block_tokens)
        self._blocks: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def held(self, tokens: list[Any]) -> int:
        """How many of ``tokens`` (whole blocks from the start) were held; all of their
        whole blocks are held from now on."""
        if self.capacity <= 0:
            return 0
        chain, cached, hit = b"", 0, True
        for start in range(0, len(tokens) - self.size + 1, self.size):
            block = msgspec.json.encode(tokens[start : start + self.size])
            chain = hashlib.blake2b(chain + block, digest_size=16).digest()
            if hit and chain in self._blocks:
                cached += self.size
                self._blocks.move_to_end(chain)
                continue
            hit = False
            self._blocks[chain] = None
            self._blocks.move_to_end(chain)
            if len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)
        return cached


def _rows(embeds: Any) -> int:
    shape = getattr(embeds, "shape", None)
    if shape is not None:
        return int(shape[0])
    return len(embeds) if embeds is not None else 0
