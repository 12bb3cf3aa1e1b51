"""A unary call of an idempotent stage, sent more than once when its policy says so:
hedged (another copy to another replica when the first is slow; the first answer wins,
the others are cancelled by cancel frame) and retried (a failed call tried again on
another replica, after a back-off, within the retry budget and the deadline).

Each copy is an attempt with a span of its own under the call's span (``attempt`` 1, 2,
...; the replica it went to), so the trace shows which copy answered and which was
cancelled. What the policy did is counted in the stage's :class:`bls.policy.PolicyState`
(``/metrics``).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any, Protocol

import anyio

from bls.errors import DeadlineExceeded, StageError
from bls.policy import Hedge
from bls.scope import CallContext
from bls.tracing import outcome_of

from . import ejection
from .connection import Connection

__all__ = ["Replicas", "call"]


class Replicas(ejection.Replicas, Protocol):
    """What the attempts need of a stage's replica set besides: its description, and
    one call."""

    @property
    def description(self) -> str: ...

    async def answer(
        self, body: list[Any], ctx: CallContext, busy: list[Connection] | None = None
    ) -> Any: ...


async def call(binding: Replicas, body: list[Any], ctx: CallContext) -> Any:
    """The answer's frames of one unary call under the binding's policy."""
    policy = binding.policy
    retry = policy.retry
    budget = binding.state.retry_budget
    if budget is not None:
        budget.deposit()
    numbers = iter(range(1, 1_000))
    tried: list[Connection] = []  # replicas earlier copies went to: a retry tries another
    tries = 0
    while True:
        tries += 1
        try:
            if policy.hedge is not None:
                return await _hedged(binding, policy.hedge, body, ctx, numbers, tried)
            return await _attempt(binding, body, ctx, next(numbers), tried)
        except StageError as exc:
            if retry is None or exc.kind not in retry.on or tries >= retry.attempts:
                raise
            backoff = retry.backoff_ms / 1000 * 2 ** (tries - 1) * random.uniform(0.5, 1.5)
            if time.time() + backoff >= ctx.deadline:
                raise  # a retry could not answer in time
            if budget is not None and not budget.withdraw():
                binding.state.counts.retries_denied += 1
                raise
            binding.state.counts.retries += 1
            await anyio.sleep(backoff)


async def _attempt(
    binding: Replicas, body: list[Any], ctx: CallContext, n: int, busy: list[Connection]
) -> Any:
    """One copy of the call, in a span of its own (when traced)."""
    if ctx.trace is None:
        return await binding.answer(body, ctx, busy)
    span = ctx.trace.open(binding.name, ctx.parent, binding.description)
    span.attempt = n
    try:
        rest = await binding.answer(body, ctx.under(span), busy)
    except BaseException as exc:
        ctx.trace.close(span, *outcome_of(exc))
        raise
    ctx.trace.close(span, "ok")
    return rest


async def _hedged(
    binding: Replicas,
    hedge: Hedge,
    body: list[Any],
    ctx: CallContext,
    numbers: Any,
    busy: list[Connection],
) -> Any:
    """Copies of the call, a new one each time the last has not answered after the
    hedge delay (up to ``hedge.max`` extra), each to a replica no other copy is on
    (``busy``, which each copy joins); the first answer wins and the rest are
    cancelled. All failing: the first error, as a call without copies raises it."""
    traffic = binding.state.counts
    hedged_from = len(busy)
    answers: list[tuple[int, Any]] = []
    errors: list[StageError | DeadlineExceeded] = []
    running = 0
    settled = anyio.Event()

    async def attempt(n: int, first: bool) -> None:
        nonlocal running, settled
        try:
            rest = await _attempt(binding, body, ctx, n, busy)
        except (StageError, DeadlineExceeded) as exc:  # (the worker saw the deadline pass)
            errors.append(exc)
        except anyio.get_cancelled_exc_class():
            if answers and not first:  # a hedged copy, and the original or another answered
                traffic.hedges_cancelled += 1
            raise
        else:
            answers.append((n, rest))
            if not first:
                traffic.hedges_won += 1
            tg.cancel_scope.cancel()
        finally:
            running -= 1
            if not running:
                settled.set()

    async with anyio.create_task_group() as tg:
        running = 1
        tg.start_soon(attempt, next(numbers), True)
        for _ in range(hedge.max):
            delay = hedge.delay(binding.state.latencies)
            if delay is None or not _worth_it(binding, ctx, delay, len(busy) - hedged_from):
                break
            with anyio.move_on_after(delay):
                await settled.wait()
            if answers or not running:
                break
            if not _worth_it(binding, ctx, 0.0, len(busy) - hedged_from):
                break
            traffic.hedges += 1
            running += 1
            settled = anyio.Event()
            tg.start_soon(attempt, next(numbers), False)
    if answers:
        return answers[0][1]
    raise errors[0]


def _worth_it(binding: Replicas, ctx: CallContext, wait: float, copies: int) -> bool:
    """Whether another copy, sent ``wait`` seconds from now, can help: another replica
    is free of this call, and the stage's typical latency fits before the deadline."""
    others = [c for c in binding.connections if c.alive and not c.retired]
    if len(others) <= copies:
        return False
    typical = binding.state.latencies.quantile(0.5) or 0.0
    if not math.isfinite(ctx.deadline):
        return True
    return time.time() + wait + typical < ctx.deadline
