"""A stage's traffic policy: whether its calls may be repeated, hedging, retries, and
ejecting replicas that fail or lag.

``[stages.NAME]`` in ``bls.toml`` (or ``bls.Stage(..., idempotent=True, hedge=...)``)::

    idempotent = true                              # a call may run twice
    hedge = { after_ms = 20 }                      # or { after = "p95" }; max = 1
    retry = { attempts = 3, on = ["unavailable", "overloaded", "shutdown"],
              backoff_ms = 10, budget = 0.1 }
    eject = { failures = 5, for_ms = 1000 }        # on by default
    affinity = { field = "session" }               # the same key, the same replica

What each knob means is in docs/policy.md; the remote binding applies them
(``transport/attempts.py``; affinity: ``transport/replicas.py`` with :mod:`bls.affinity`),
since only a stage with replicas has another to hedge to, to retry on, to take out of
rotation, or to keep a key on. This module holds the options, their checks, and
the state they keep: recent latencies, the retry budget, the counts ``/metrics`` shows.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from .affinity import Affinity
from .counts import Traffic
from .errors import ErrorKind
from .messages import unknown_field_hint

__all__ = [
    "Eject",
    "Hedge",
    "Latencies",
    "Policy",
    "PolicyError",
    "PolicyState",
    "Retry",
    "RetryBudget",
    "Traffic",
    "policy_from",
]

# Failures the request itself caused: the same request fails the same way again, so no
# retry follows them, and they say nothing of the replica's health.
REQUEST_FAULTS = (
    ErrorKind.INVALID_REQUEST,
    ErrorKind.TOO_LARGE,
    ErrorKind.INVALID_RESPONSE,
    ErrorKind.WRONG_MODE,
    ErrorKind.DEADLINE,
    ErrorKind.CANCELLED,
    ErrorKind.BAD_FRAME,
)

_Positive = Annotated[float, msgspec.Meta(gt=0)]


class Hedge(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Send another copy of a unary call that has not answered after ``after_ms``, or
    after the stage's own recent ``after`` quantile (``"p50"`` to ``"p99"``), to another
    replica; the first answer wins, the others are cancelled. ``max``: copies beyond the
    first."""

    after_ms: _Positive | None = None
    after: str | None = None
    max: Annotated[int, msgspec.Meta(ge=1, le=4)] = 1

    def __post_init__(self) -> None:
        if (self.after_ms is None) == (self.after is None):
            raise ValueError("give one of after_ms or after")
        if self.after is not None:
            quantile(self.after)  # checked here: a ValueError names it

    def delay(self, latencies: Latencies) -> float | None:
        """Seconds to wait before the next copy; None: not yet known (too few calls)."""
        if self.after_ms is not None:
            return self.after_ms / 1000
        assert self.after is not None
        return latencies.quantile(quantile(self.after))


class Retry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Try a failed call again, on another replica, up to ``attempts`` in all, when it
    failed with one of the kinds ``on``, after ``backoff_ms`` (doubling, jittered), never
    past the request's deadline, and within ``budget``: retries add at most that fraction
    of the stage's calls (with a floor of a few a second)."""

    attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    on: list[str] = msgspec.field(
        default_factory=lambda: [ErrorKind.UNAVAILABLE, ErrorKind.OVERLOADED, ErrorKind.SHUTDOWN]
    )
    backoff_ms: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    budget: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1

    def __post_init__(self) -> None:
        caused = [k for k in self.on if k in REQUEST_FAULTS]
        if caused:
            raise ValueError(
                f"on: {', '.join(caused)}: the request caused it, and would cause it again"
            )


class Eject(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Take a replica out of rotation after ``failures`` failed calls in a row (lost,
    refused, or failed by the worker: any error but those the request caused), or when
    its recent calls take ``slower`` times as long as its peers' and ``slower_ms`` more
    (a call a hedge cancelled counts with the time it had run), for ``for_ms``, doubling
    each time it is ejected again after coming back, up to ``max_ms``; never more than
    ``max_fraction`` of the replicas at once. ``failures = 0``, ``slower = 0``: never."""

    failures: Annotated[int, msgspec.Meta(ge=0)] = 5
    slower: Annotated[float, msgspec.Meta(ge=0)] = 5.0
    slower_ms: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    for_ms: _Positive = 1000.0
    max_ms: _Positive = 30_000.0
    max_fraction: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5


class Policy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    idempotent: bool = False
    hedge: Hedge | None = None
    retry: Retry | None = None
    eject: Eject = msgspec.field(default_factory=Eject)
    affinity: Affinity | None = None

    @property
    def repeats(self) -> bool:
        """Whether a call may be sent more than once (hedged or retried once started)."""
        return self.hedge is not None or self.retry is not None


class PolicyError(ValueError):
    """A stage's traffic policy that cannot be, naming the stage and the field."""


def policy_from(
    stage: str,
    fields: dict[str, Any],
    *,
    idempotent: str = "`idempotent = true`",
    load: Callable[[str], Any] | None = None,
) -> Policy:
    """The policy ``fields`` (from bls.toml or ``bls.Stage``) give; :class:`PolicyError`
    naming the stage and the field when they cannot, or when they would repeat a call of
    a stage that is not idempotent (saying to add ``idempotent``, written as where the
    policy was written). ``load`` imports an affinity function now (bls.toml's
    ``file.py:attr``, relative to the file); without it, it is imported at first use."""
    try:
        policy = msgspec.convert(fields, Policy)
    except msgspec.ValidationError as exc:
        hint = unknown_field_hint(Policy, str(exc))
        raise PolicyError(f"stage {stage!r}: {_where(exc)}{hint}") from None
    affinity = policy.affinity
    if affinity is not None and affinity.function is not None and load is not None:
        try:
            affinity.use(load(affinity.function))
        except (ImportError, OSError, AttributeError, ValueError) as exc:
            raise PolicyError(f"stage {stage!r}: affinity.function: {exc}") from None
    if policy.repeats and not policy.idempotent:
        which = " and ".join(k for k in ("hedge", "retry") if getattr(policy, k) is not None)
        raise PolicyError(
            f"stage {stage!r}: {which} would send a call more than once, and the stage is "
            f"not declared idempotent: add {idempotent} if running a call twice is safe"
        )
    return policy


def _where(exc: msgspec.ValidationError) -> str:
    """msgspec's error with its path first: ``hedge.after_ms: ...``; a check of ours
    that names its field (``after: ...``) gets the full path (``hedge.after: ...``)."""
    text = str(exc)
    message, sep, path = text.rpartition(" - at `$.")
    if not sep:
        return text
    path = path.rstrip("`")
    field, colon, rest = message.partition(": ")
    if colon and field.isidentifier() and field.islower():
        return f"{path}.{field}: {rest}"
    return f"{path}: {message}"


def quantile(name: str) -> float:
    """``"p95"`` → 0.95."""
    try:
        q = float(name.removeprefix("p")) / 100 if name.startswith("p") else math.nan
    except ValueError:
        q = math.nan
    if not 0.5 <= q <= 0.99:
        raise ValueError(f"after: expected p50 to p99, got {name!r}")
    return q


class Latencies:
    """A stage's recent call latencies (the last ``keep``), for ``hedge.after = "p95"``."""

    MIN_SAMPLES = 20  # fewer: no quantile yet, so no hedge

    def __init__(self, keep: int = 256) -> None:
        self._recent: collections.deque[float] = collections.deque(maxlen=keep)
        self._sorted: list[float] | None = None

    def add(self, seconds: float) -> None:
        self._recent.append(seconds)
        self._sorted = None

    def quantile(self, q: float) -> float | None:
        if len(self._recent) < self.MIN_SAMPLES:
            return None
        if self._sorted is None:
            self._sorted = sorted(self._recent)
        return self._sorted[min(len(self._sorted) - 1, int(q * len(self._sorted)))]


class RetryBudget:
    """Retries as a fraction of calls (Finagle's budgets, gRPC's retry throttling): each
    call deposits ``ratio`` of a retry, each retry withdraws one; a retry with nothing
    left is not made. ``floor_per_s`` retries a second are always allowed, so a stage
    with few calls can still retry one."""

    def __init__(self, ratio: float, floor_per_s: float = 2.0, cap: float = 100.0) -> None:
        self.ratio = ratio
        self.floor_per_s = floor_per_s
        self.cap = cap
        self._balance = 0.0
        self._floor = floor_per_s
        self._refilled = time.monotonic()

    def deposit(self) -> None:
        self._balance = min(self.cap, self._balance + self.ratio)

    def withdraw(self) -> bool:
        now = time.monotonic()
        self._floor = min(self.floor_per_s, self._floor + (now - self._refilled) * self.floor_per_s)
        self._refilled = now
        if self._balance >= 1:
            self._balance -= 1
            return True
        if self._floor >= 1:
            self._floor -= 1
            return True
        return False


class PolicyState:
    """What a stage's policy keeps between calls, in one place: its recent latencies (for
    ``hedge.after``), its retry budget (with a retry policy), and what it did (``counts``,
    which ``/metrics`` shows)."""

    __slots__ = ("counts", "latencies", "retry_budget")

    def __init__(self, policy: Policy | None = None) -> None:
        self.latencies = Latencies()
        self.counts = Traffic()
        retry = policy.retry if policy is not None else None
        self.retry_budget = RetryBudget(retry.budget) if retry is not None else None
