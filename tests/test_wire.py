"""The wire format: round trips, zero-copy arrays, and a decoder that never raises."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bls
from bls.transport import wire


class Item(bls.Message):
    name: str
    vector: list[float] = []


def test_header_round_trip() -> None:
    h = wire.Header(kind=wire.Kind.CALL, call=7, stage="enc", deadline=1.5, count=16, to="ab")
    parsed = wire.parse([wire.encode_header(h), b"payload"])
    assert parsed is not None
    assert parsed[0] == h and list(parsed[1]) == [b"payload"]


def test_large_arrays_travel_as_their_own_frames_small_ones_inline() -> None:
    codec = wire.Codec()
    big = np.arange(4096, dtype=np.float32).reshape(64, 64)
    small = np.ones(4, dtype=np.int64)
    frames = codec.encode({"big": big, "small": small})
    assert len(frames) == 2  # payload + one buffer
    assert frames[1].nbytes == big.nbytes
    out = codec.decode(frames[0], frames[1:])
    assert out["big"].dtype == np.float32 and out["big"].shape == (64, 64)
    assert np.array_equal(out["big"], big) and np.array_equal(out["small"], small)
    # Zero-copy: the decoded array is a view of the received buffer.
    assert np.shares_memory(out["big"], np.frombuffer(frames[1], dtype=np.float32))


def test_typed_decode_validates() -> None:
    codec = wire.Codec(Item)
    assert codec.decode(wire.Codec().encode({"name": "a"})[0]) == Item(name="a")
    with pytest.raises(msgspec.ValidationError, match=r"\$.name"):
        codec.decode(wire.Codec().encode({"name": 3})[0])


def test_objects_are_never_pickled() -> None:
    with pytest.raises(TypeError, match="cannot send"):
        wire.Codec().encode({"x": object()})
    with pytest.raises(TypeError, match="Python objects"):
        wire.Codec().encode(np.array([object()]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=5))
def test_parse_never_raises_on_random_frames(frames: list[bytes]) -> None:
    result = wire.parse(frames)
    assert result is None or isinstance(result[0], wire.Header)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_payload_decode_raises_only_decode_errors(data: bytes) -> None:
    try:
        wire.Codec(Item).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        pass


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=200))
def test_truncated_valid_messages_are_rejected_cleanly(cut: int) -> None:
    payload = bytes(wire.Codec().encode(Item(name="x" * 50, vector=[1.0] * 20))[0])
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        wire.Codec(Item).decode(payload[: max(0, len(payload) - cut)])
