"""``bls bench --chat --turns T``: multi-turn chat conversations as the load.

Each connection holds one conversation at a time. Its first request is ``--input`` with
its last user message marked as this conversation's (``[conversation N]`` before the
text), so that conversations share what the input shares (a system prompt) and nothing
after it. Each next request is the conversation so far, the answer just received
included, and a follow-up question: what a chat client sends. After ``T`` turns, or a
turn that failed, the connection starts a new conversation. With several URLs a
conversation's turns go to them in turn, as a round-robin load balancer in front of
several frontends sends them: the case that routing by prompt prefix is for.

From each answer's ``usage`` (for a stream, the last chunk, which
``stream_options.include_usage`` asks for) it keeps the prompt's tokens and, where the
server says (``prompt_tokens_details.cached_tokens``), how many the engine's prefix
cache held. :func:`summary` gives the hit rate over the turns after each conversation's
first, and those turns' times.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

from .console import UsageError

__all__ = ["Conversations", "follow_up", "summary"]


def follow_up(turn: int) -> str:
    """The user's message after the answer to turn ``turn`` (0 is the first)."""
    return f"Go on, please: part {turn + 2}."


class Conversations:
    """The requests of every connection's conversations, and what their answers said.

    ``body``: the first turn's request (a chat completion request, ``messages`` ending
    with the user's); ``requests[u](body)``: the HTTP request's bytes for URL ``u``."""

    def __init__(
        self,
        body: dict[str, Any],
        turns: int,
        requests: Sequence[Callable[[bytes], bytes]],
        stream: bool,
    ) -> None:
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        if not (isinstance(last, dict) and last.get("role") == "user"):
            raise UsageError(
                "--turns needs an --input whose messages end with the user's (a chat "
                'request: {"messages": [..., {"role": "user", "content": "..."}]})'
            )
        if not isinstance(last.get("content"), str):
            raise UsageError("--turns needs the last user message's content as a string")
        self.body = dict(body)
        if stream:  # the last chunk then carries the usage
            self.body["stream_options"] = {**(body.get("stream_options") or {})}
            self.body["stream_options"]["include_usage"] = True
        self.turns = turns
        self.requests = requests
        self.stream = stream
        self.started = 0  # conversations begun
        self.finished = 0  # ... that went through all their turns
        self._talks: dict[int, _Talk] = {}  # a connection's conversation

    def next(self, slot: int) -> tuple[int, bytes]:
        """(the URL's index, the request's bytes) of connection ``slot``'s next turn."""
        talk = self._talks.get(slot)
        if talk is None or talk.turn >= self.turns:
            talk = self._talks[slot] = self._begin(slot)
        where = (slot + talk.turn) % len(self.requests)
        body = dict(self.body, messages=talk.messages)
        return where, self.requests[where](json.dumps(body).encode())

    def answered(self, slot: int, ok: bool, body: bytes) -> tuple[int, int | None, int | None]:
        """Note connection ``slot``'s answer: (the turn it answered, its prompt tokens,
        those cached; None where the answer does not say). A failed turn, or one whose
        answer cannot be read, ends its conversation."""
        talk = self._talks[slot]
        turn = talk.turn
        read = _read(body, self.stream) if ok else None
        if read is None:
            self._talks.pop(slot)
            return turn, None, None
        text, prompt, cached = read
        talk.turn += 1
        if talk.turn == self.turns:
            self.finished += 1
        else:
            talk.messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": follow_up(turn)},
            ]
        return turn, prompt, cached

    def _begin(self, slot: int) -> _Talk:
        self.started += 1
        messages = copy.deepcopy(self.body["messages"])
        messages[-1]["content"] = f"[conversation {self.started}] " + messages[-1]["content"]
        return _Talk(messages)


class _Talk:
    __slots__ = ("messages", "turn")

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.turn = 0  # the turn to send next


def _read(body: bytes, stream: bool) -> tuple[str, int | None, int | None] | None:
    """(the answer's text, prompt tokens, cached tokens) from a chat completion or its
    SSE chunks; None when it is not one."""
    try:
        if not stream:
            answer = json.loads(body)
            return answer["choices"][0]["message"]["content"] or "", *_usage(answer)
        parts: list[str] = []
        usage: tuple[int | None, int | None] = (None, None)
        for line in body.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
            if chunk.get("usage"):
                usage = _usage(chunk)
        return "".join(parts), *usage
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None


def _usage(answer: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = answer.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return usage.get("prompt_tokens"), details.get("cached_tokens")


def summary(
    samples: Sequence[Any],
    conversations: Conversations,
    percentiles: Callable[[list[float]], dict[str, float]],
) -> dict[str, Any]:
    """The ``conversations`` part of ``bls bench``'s summary: the prefix-cache hit rate
    (cached / prompt tokens) and the times of the turns after each conversation's first."""
    later = [s for s in samples if not s.kind and s.turn]
    counted = [s for s in later if s.prompt_tokens and s.cached_tokens is not None]
    prompt = sum(s.prompt_tokens for s in counted)
    cached = sum(s.cached_tokens for s in counted)
    firsts = sorted(s.first for s in later if s.first is not None)
    return {
        "turns": conversations.turns,
        "started": conversations.started,
        "finished": conversations.finished,
        "later_turns": len(later),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": round(cached / prompt, 4) if prompt else None,
        "later_latency_ms": percentiles(sorted(s.latency for s in later)),
        "later_first_item_ms": percentiles(firsts) if firsts else None,
    }
