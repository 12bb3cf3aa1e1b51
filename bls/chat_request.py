"""The body of ``POST /v1/chat/completions`` and what it asks of the engine.

:class:`ChatRequest` holds the fields bls implements, with the shapes of OpenAI's API and
vLLM's extensions to it: sampling, ``response_format``, ``tools``/``tool_choice``,
``logprobs``, ``n``. What a request's output must be (:meth:`ChatRequest.constraint`)
is the same :class:`bls.Constraint` a script's :func:`bls.ask` sends: ``response_format``
and a forced tool choice become structured outputs, so they work with any model.

Of the fields a client may send besides (:func:`extra_fields`), one that OpenAI's or
vLLM's chat API knows, that bls does not implement and that would change the answer is an
error naming it; one that changes nothing is accepted; one neither API knows is
ignored, and said so in one log line, as `vllm serve` does (clients send vendor extras).

Here, in the core, so that the frontend (``bls.serve``) and the workers both use it and
neither has to import the other.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .constraints import Constraint
from .conversation import ChatMessage
from .errors import InvalidRequest
from .messages import Message

__all__ = ["ChatRequest", "ToolMode", "extra_fields"]

ToolMode = Literal["required", "named"]


class ChatRequest(Message, forbid_unknown_fields=False):
    """The body of ``POST /v1/chat/completions``: the fields bls implements (see the
    module for the others)."""

    model: str
    messages: list[ChatMessage]
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None

    def problem(self) -> tuple[str, str] | None:
        """``(message, field path)`` for what cannot be answered as asked, else None."""
        if not 1 <= self.n <= MAX_CHOICES:
            return f"n must be between 1 and {MAX_CHOICES}", "$.n"
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
                return f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}", "$.top_logprobs"
            if self.top_logprobs and not self.logprobs:
                return "when using top_logprobs, logprobs must be set to true", "$.top_logprobs"
        try:
            self.constraint()
        except InvalidRequest as exc:
            return exc.message, exc.path
        return None

    def tool_mode(self) -> ToolMode | None:
        """How the answer names its tools: ``"required"`` (a list of calls, any tool),
        ``"named"`` (the arguments of the one tool named), or None (text)."""
        choice = self.tool_choice
        if not self.tools or choice is None or choice == "none":
            return None
        if choice == "required":
            return "required"
        if isinstance(choice, dict):
            return "named"
        return None

    def constraint(self) -> Constraint | None:
        """What the output must be, or None; :class:`InvalidRequest` naming the field
        that asks for what bls cannot do."""
        tools = self._tool_constraint()
        if tools is not None:
            return tools
        if self.structured_outputs is not None:
            try:
                return msgspec.convert(self.structured_outputs, Constraint)
            except (msgspec.ValidationError, ValueError) as exc:
                raise InvalidRequest("", str(exc), "$.structured_outputs") from None
        return _response_constraint(self.response_format)

    def named_tool(self) -> str:
        """The function a named ``tool_choice`` forces."""
        assert isinstance(self.tool_choice, dict)
        function = self.tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            why = 'a named tool_choice is {"type": "function", "function": {"name": ...}}'
            raise InvalidRequest("", why, "$.tool_choice")
        return name

    def _tool_constraint(self) -> Constraint | None:
        if self.tools is not None and not self.tools:
            raise InvalidRequest("", "tools must not be an empty array", "$.tools")
        choice = self.tool_choice if self.tools else None
        if choice is None and self.tools:
            choice = "auto"  # (OpenAI's default when tools are given)
        if choice is None or choice == "none":
            return None
        if choice == "auto":
            why = (
                'tool_choice "auto" needs a tool parser for the model, and bls has none: '
                'use "required" or a named function (forced through structured outputs), '
                'or "none"'
            )
            raise InvalidRequest("", why, "$.tool_choice")
        functions = _functions(self.tools or [])
        if choice == "required":
            return Constraint(json=_required_schema(functions, self.parallel_tool_calls))
        if not isinstance(choice, dict):
            why = (
                'tool_choice must be "none", "auto", "required" or a named function, '
                f"not {choice!r}"
            )
            raise InvalidRequest("", why, "$.tool_choice")
        name = self.named_tool()
        if name not in functions:
            why = (
                f"tool_choice names {name!r}, which is not among the tools ({', '.join(functions)})"
            )
            raise InvalidRequest("", why, "$.tool_choice")
        return Constraint(json=functions[name])


MAX_CHOICES = 16  # n
MAX_TOP_LOGPROBS = 20  # OpenAI's bound


def _functions(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each function tool's name and the schema of its arguments."""
    functions = {}
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise InvalidRequest("", "only function tools are supported", f"$.tools[{i}]")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("", "a function needs a name", f"$.tools[{i}].function.name")
        parameters = function.get("parameters")
        functions[name] = parameters if isinstance(parameters, dict) else _EMPTY_OBJECT
    return functions


_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def _required_schema(functions: dict[str, dict[str, Any]], parallel: bool | None) -> dict[str, Any]:
    """A list of calls, each ``{"name", "parameters"}`` of one function: what `vllm
    serve` decodes ``tool_choice="required"`` under, so its answers read the same — but
    with no room for keys besides those two, so that any model's list of calls ends."""
    defs: dict[str, Any] = {}
    calls = []
    for name, parameters in functions.items():
        parameters = dict(parameters)
        defs.update(parameters.pop("$defs", {}))
        calls.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,  # (vLLM's leaves room for more keys: no end)
            }
        )
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": calls},
    }
    if parallel is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _response_constraint(response_format: dict[str, Any] | None) -> Constraint | None:
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(json_object=True)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            why = "a json_schema response_format needs json_schema.schema, an object"
            raise InvalidRequest("", why, "$.response_format.json_schema")
        return Constraint(json=schema)
    why = f'response_format.type must be "text", "json_object" or "json_schema", not {kind!r}'
    raise InvalidRequest("", why, "$.response_format.type")


# Fields of OpenAI's or vLLM's chat API that bls does not implement, each with the values
# that ask for nothing (sent by clients that fill every field): any other value is refused.
_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "logit_bias": (None, {}),
    "functions": (None,),
    "function_call": (None, "none"),
    "reasoning_effort": (None,),
    "verbosity": (None,),
    "thinking_token_budget": (None,),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "truncation_side": (None,),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None,),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "echo": (None, False),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "add_special_tokens": (None, False),
    "documents": (None,),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "mm_processor_kwargs": (None,),
    "media_io_kwargs": (None,),
    "logits_processors": (None,),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "return_token_offsets": (None, False),
    "return_prompt_text": (None, False),
    "watermarking": (None,),
    "repetition_detection": (None,),
    "vllm_xargs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}

# Fields of either API that change nothing in the answer: accepted, and not used.
_NO_EFFECT = frozenset(
    {
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "include_reasoning",
        "priority",
        "request_id",
        "session_id",
        "cache_salt",
        "kv_transfer_params",
        "ec_transfer_params",
        "stream_interval",
        "mm_payload",
        "return_mm_kwargs",
        "routed_experts_prompt_start",
    }
)


def extra_fields(body: bytes) -> list[str]:
    """The top-level fields of a chat request's JSON ``body`` that neither OpenAI's nor
    vLLM's chat API knows (to be logged and ignored); :class:`InvalidRequest` naming the
    first field that one of them knows, bls does not implement and that asks for
    something."""
    try:
        fields = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
    except (msgspec.ValidationError, msgspec.DecodeError):
        return []  # (not an object: the request's own decoding says what is wrong)
    known = ChatRequest.__struct_fields__
    unknown = []
    for name, raw in fields.items():
        if name in known or name in _NO_EFFECT:
            continue
        inert = _UNIMPLEMENTED.get(name)
        if inert is None:
            unknown.append(name)
        elif msgspec.json.decode(raw) not in inert:
            why = f"{name} is not supported by this server (send it unset, or {inert[-1]!r})"
            raise InvalidRequest("", why, f"$.{name}")
    return unknown
