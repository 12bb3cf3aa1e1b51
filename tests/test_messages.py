"""The type rules that make inline and remote stages interchangeable, and the limits
every request stays within."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
import pytest

import bls
from bls.messages import (
    always_within_limits,
    beyond_limits,
    compatible,
    convert,
    signature_of,
)


class Point(bls.Message):
    x: int
    y: int = 0


class Spot(bls.Message):  # the same shape under another name
    x: int
    y: int = 0


class Other(bls.Message):
    x: str


def test_a_value_is_converted_as_a_decoded_wire_payload_would_be() -> None:
    assert convert({"x": 1}, Point) == Point(x=1)
    assert convert(Spot(x=2), Point) == Point(x=2)  # by attributes
    assert convert(Point(x=3), Any) == {"x": 3, "y": 0}  # no type known: builtins
    with pytest.raises(msgspec.ValidationError, match=r"\$\.x"):
        convert({"x": "no"}, Point)
    with pytest.raises(msgspec.ValidationError, match="unknown field `z`"):
        convert({"x": 1, "z": 2}, Point)


def test_types_are_compatible_by_shape_not_by_name() -> None:
    assert compatible(Point, Spot) and compatible(Point, Any) and compatible(Any, Other)
    assert not compatible(Point, Other)
    schema = msgspec.json.schema(Spot)
    assert compatible(Point, Any, actual_schema=schema)  # a remote worker's type


def test_signatures_are_read_from_annotations() -> None:
    async def unary(req: Point) -> Spot: ...

    async def streaming(req: Point) -> AsyncIterator[Other]:
        yield Other(x="")

    assert signature_of(unary) == bls.messages.Signature(Point, Spot, False)
    assert signature_of(streaming) == bls.messages.Signature(Point, Other, True)


def test_limits_name_the_field_that_breaks_them() -> None:
    assert beyond_limits(Point(x=2**64 - 1)) is None
    assert beyond_limits({"a": [1, -(2**63)]}) is None
    assert beyond_limits(Point(x=2**64)) == (
        "integer out of range: bls carries 64-bit integers",
        "$.x",
    )
    assert beyond_limits({"a": [1, -(2**63) - 1]}) == (
        "integer out of range: bls carries 64-bit integers",
        "$.a[1]",
    )
    deep: Any = 0
    for _ in range(101):
        deep = [deep]
    problem = beyond_limits({"v": deep})
    assert problem is not None and problem[0] == "nested deeper than 100 levels"


class Bounded(bls.Message):
    n: Annotated[int, msgspec.Meta(ge=0, le=100)]
    scores: list[float] = []
    tags: dict[str, list[str]] = {}
    other: Other | None = None


class Tree(bls.Message):
    children: list[Tree] = []


def test_a_request_type_that_cannot_break_the_limits_is_not_checked_each_time() -> None:
    assert always_within_limits(Other) and always_within_limits(Bounded)
    assert always_within_limits(list[Other])
    # An unbounded integer, something untyped, a type that holds itself: checked.
    assert not always_within_limits(Point)
    assert not always_within_limits(Any) and not always_within_limits(dict)
    assert not always_within_limits(Tree)

    async def takes_point(req: Point) -> Point:
        return req

    entry = bls.script(takes_point)
    with pytest.raises(bls.InvalidRequest, match="64-bit") as refused:
        entry.decode(b'{"x": 18446744073709551616}')
    assert refused.value.path == "$.x"
