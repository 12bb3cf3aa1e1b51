"""Values as bytes: msgspec-msgpack, with numpy arrays and torch tensors beside it.

What a remote call sends (:mod:`bls.transport.wire` frames these payloads) and what a
recording stores (:mod:`bls.recording`) are encoded here, the same way. Arrays and
tensors become extension values holding ``(dtype, shape, buffer index, bytes)``: small
ones inline, larger ones as side buffers sent zero-copy (a recording keeps them all
inline). Nothing is ever pickled, and a value decodes arrays and tensors only in a
process that has loaded numpy or torch itself (its own types need them): bytes from
elsewhere never make a process import a module.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from typing import Any

import msgspec

__all__ = ["EXTENSIONS", "INLINE_MAX", "Codec"]

INLINE_MAX = 1024  # arrays up to this many bytes travel inside the payload
_EXT_NDARRAY = 1
_EXT_TENSOR = 2
EXTENSIONS = (_EXT_NDARRAY, _EXT_TENSOR)  # the msgpack extension codes a payload may hold


def _loaded(module: str) -> Any:
    """A module this process has imported itself; ValueError when it has not."""
    found = sys.modules.get(module)
    if found is None:
        raise ValueError(
            f"the payload holds a {module} array, and this process does not use {module}"
        )
    return found


class Codec:
    """Payload encoder/decoder with zero-copy side buffers for arrays and tensors.

    One instance per type to decode into; not thread-safe (one event loop thread).
    """

    def __init__(self, tp: Any = Any, *, inline_max: float = INLINE_MAX) -> None:
        self._inline_max = inline_max  # larger arrays go to side buffers
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self.encode_hook)
        self._decoder = msgspec.msgpack.Decoder(type=tp, ext_hook=self._ext_hook)
        self._out: list[Any] = []
        self._in: Sequence[Any] = ()

    # -- encoding ---------------------------------------------------------------------

    def encode(self, value: Any) -> list[Any]:
        """``[payload, *buffers]`` for ``value``."""
        self._out = out = [b""]
        out[0] = self._encoder.encode(value)
        self._out = []
        return out

    def encode_hook(self, obj: Any) -> Any:
        """msgspec's ``enc_hook``: an array or tensor as its extension value."""
        mod = type(obj).__module__
        if mod == "numpy" and type(obj).__name__ == "ndarray":
            return self._array(obj, _EXT_NDARRAY)
        if mod.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter"):
            return self._array(obj.detach().cpu().contiguous().numpy(), _EXT_TENSOR)
        raise TypeError(f"cannot send a value of type {type(obj).__qualname__} over the wire")

    def _array(self, arr: Any, code: int) -> msgspec.msgpack.Ext:
        np = sys.modules["numpy"]  # the value is a numpy array: numpy is loaded
        if arr.dtype.hasobject:
            raise TypeError("cannot send an array of Python objects over the wire")
        arr = np.ascontiguousarray(arr)
        shape = list(arr.shape)
        dtype = arr.dtype.str
        if arr.nbytes <= self._inline_max:
            meta = (dtype, shape, -1, arr.tobytes())
        else:
            self._out.append(memoryview(arr).cast("B"))
            meta = (dtype, shape, len(self._out) - 1, b"")
        return msgspec.msgpack.Ext(code, _meta_encoder.encode(meta))

    # -- decoding ---------------------------------------------------------------------

    def decode(self, payload: Any, buffers: Sequence[Any] = ()) -> Any:
        """Decode ``payload`` (raises msgspec.ValidationError/DecodeError when it fails)."""
        self._in = buffers
        try:
            return self._decoder.decode(payload)
        finally:
            self._in = ()

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code not in EXTENSIONS:
            raise ValueError(f"unknown extension type {code}")
        if code == _EXT_TENSOR:
            _loaded("torch")
        np = _loaded("numpy")  # tensors arrive as numpy arrays first
        dtype, shape, index, inline = _meta_decoder.decode(data)
        if index < 0:
            buf: Any = inline
        else:
            if not 0 < index < len(self._in) + 1:
                raise ValueError(f"array refers to missing buffer frame {index}")
            frame = self._in[index - 1]
            buf = frame.buffer if hasattr(frame, "buffer") else frame
        arr = np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
        if code == _EXT_TENSOR:
            return _tensor(arr)
        return arr


_meta_encoder = msgspec.msgpack.Encoder()
_meta_decoder = msgspec.msgpack.Decoder(tuple[str, list[int], int, bytes])


def _tensor(arr: Any) -> Any:
    torch: Any = sys.modules["torch"]
    with warnings.catch_warnings():
        # The frame's memory is read-only; the tensor shares it (zero-copy).
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)
