"""Weighted versions of a stage: one name bound to several targets, each call sent to one
of them by weight (a canary, an A/B split), or by a key of the request when the split
must be sticky::

    [stages.generator]
    targets = [{ discover = "gen-v1", weight = 9 }, { discover = "gen-v2", weight = 1 }]
    sticky = "user"      # a field of the stage's request: the same user, the same version

Each version is a binding like any other (inline, remote, discovered), checked against
the same types. The version that served a call is its span's ``version`` (in the trace)
and a label of ``bls_stage_version_calls_total`` (in ``/metrics``), so the versions can
be compared. A version with no live replica is passed over while another has one.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio.abc

from .bindings import Binding
from .counts import StageCounts
from .messages import Signature, field_of
from .policy import Policy
from .runtime import BindingError
from .scope import NO_CONTEXT, CallContext

__all__ = ["Version", "VersionedBinding"]


class Version:
    """One target of a stage: its label (``name``, else its target), binding and weight."""

    __slots__ = ("binding", "label", "weight")

    def __init__(self, label: str, binding: Binding, weight: float) -> None:
        self.label = label
        self.binding = binding
        self.weight = weight


class VersionedBinding(Binding):
    """A stage whose calls are split between :class:`Version` s by weight (module
    docstring); everything else (types, policy, readiness) is theirs together."""

    def __init__(self, name: str, versions: Sequence[Version], sticky: str | None = None) -> None:
        if len(versions) < 2:
            raise ValueError("targets: give two or more (one target is a plain binding)")
        labels = [v.label for v in versions]
        if len(set(labels)) != len(labels):
            raise ValueError(f"targets: two versions share a name ({', '.join(labels)})")
        self.name = name
        self.versions = list(versions)
        self.sticky = sticky
        total = sum(v.weight for v in versions)
        self.description = "versions " + ", ".join(
            f"{v.label} ({v.weight / total:.0%})" for v in versions
        )

    @property
    def signature(self) -> Signature:  # type: ignore[override]
        return self.versions[0].binding.signature

    @property
    def schemas(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.versions[0].binding.schemas

    @property
    def type_labels(self) -> tuple[str, str]:
        return self.versions[0].binding.type_labels

    @property
    def policy(self) -> Policy:  # type: ignore[override]
        return self.versions[0].binding.policy

    @property
    def policy_given(self) -> bool:  # type: ignore[override]
        return self.versions[0].binding.policy_given

    def set_policy(self, policy: Policy) -> None:
        for v in self.versions:
            v.binding.set_policy(policy)

    async def open(self, tg: anyio.abc.TaskGroup | None = None) -> None:
        for v in self.versions:
            await v.binding.open(tg)
        known = [v for v in self.versions if getattr(v.binding, "resolved", True)]
        for v in known[1:]:
            if v.binding.schemas != known[0].binding.schemas:
                first = known[0]
                raise BindingError(
                    [
                        f"stage {self.name!r}: version {v.label} serves "
                        f"{' -> '.join(v.binding.type_labels)}, version {first.label} "
                        f"{' -> '.join(first.binding.type_labels)}: versions must share "
                        "their types"
                    ]
                )

    def resolve_later(self, check: Callable[[], list[str]]) -> bool:
        return all(v.binding.resolve_later(check) for v in self.versions)

    async def start(self) -> None:
        for v in self.versions:
            await v.binding.start()

    async def aclose(self) -> None:
        for v in self.versions:
            await v.binding.aclose()

    def ready(self) -> bool:
        return any(v.binding.ready() for v in self.versions)

    def models(self) -> list[str]:
        return list(dict.fromkeys(n for v in self.versions for n in v.binding.models()))

    def counts(self) -> StageCounts:
        """Each version's policy counts, under its label (the policy acts within each)."""
        traffic = {v.label: t for v in self.versions for t in v.binding.counts().traffic.values()}
        return StageCounts(traffic=traffic)

    def expect(self, tp: Any) -> None:
        super().expect(tp)
        for v in self.versions:
            v.binding.expect(tp)

    def pick(self, req: Any) -> Version:
        """The version for a call of ``req``: by weight, among those ready (all of them
        when none is), at a point fixed by the sticky field's value, else at random."""
        live = [v for v in self.versions if v.binding.ready()] or self.versions
        bounds = list(itertools.accumulate(v.weight for v in live))
        point = _point(field_of(req, self.sticky)) if self.sticky else random.random()
        return live[min(len(live) - 1, bisect.bisect_right(bounds, point * bounds[-1]))]

    async def invoke(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        version = self._chosen(req, ctx)
        return await version.binding.invoke(req, ctx)

    async def call(self, req: Any, ctx: CallContext = NO_CONTEXT) -> Any:
        version = self._chosen(req, ctx)
        return await version.binding.call(req, ctx)

    def stream(self, req: Any, ctx: CallContext = NO_CONTEXT) -> AsyncIterator[Any]:
        version = self._chosen(req, ctx)
        return version.binding.stream(req, ctx)

    def _chosen(self, req: Any, ctx: CallContext) -> Version:
        version = self.pick(req)
        if ctx.trace is not None and ctx.span is not None:
            ctx.span.version = version.label
        return version


def _point(value: Any) -> float:
    """A stable point in [0, 1) for a key: the same in every process and run."""
    digest = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64
