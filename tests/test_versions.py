"""bls.versions on its own: weights, a sticky key, and versions passed over when they
have no live replica."""

from __future__ import annotations

import collections
import random

import pytest

from bls.bindings import Binding, InlineBinding
from bls.versions import Version, VersionedBinding


class Job:
    def __init__(self, user: str) -> None:
        self.user = user


def _binding(name: str, ready: bool = True) -> Binding:
    async def answer(req: dict) -> str:
        return name

    binding = InlineBinding("gen", answer)
    binding.ready = lambda: ready  # type: ignore[method-assign]
    return binding


def test_calls_split_by_weight() -> None:
    random.seed(7)
    split = VersionedBinding(
        "gen", [Version("a", _binding("a"), 3), Version("b", _binding("b"), 1)]
    )
    counts = collections.Counter(split.pick(Job("x")).label for _ in range(4000))
    assert 2800 < counts["a"] < 3200 and counts["a"] + counts["b"] == 4000


def test_a_sticky_field_picks_the_same_version_every_time() -> None:
    versions = [Version("a", _binding("a"), 1), Version("b", _binding("b"), 1)]
    split = VersionedBinding("gen", versions, sticky="user")
    first = {u: split.pick(Job(u)).label for u in map(str, range(200))}
    assert {u: split.pick(Job(u)).label for u in first} == first
    assert 70 < list(first.values()).count("a") < 130
    assert split.pick({"user": "7"}).label == first["7"]  # a mapping's key works too


def test_a_version_without_a_live_replica_is_passed_over() -> None:
    versions = [Version("down", _binding("down", ready=False), 9), Version("up", _binding("up"), 1)]
    split = VersionedBinding("gen", versions)
    assert {split.pick(Job("x")).label for _ in range(50)} == {"up"}
    assert split.ready()


def test_one_target_or_two_of_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="give two or more"):
        VersionedBinding("gen", [Version("a", _binding("a"), 1)])
    with pytest.raises(ValueError, match="two versions share a name"):
        VersionedBinding("gen", [Version("a", _binding("a"), 1), Version("a", _binding("b"), 1)])
