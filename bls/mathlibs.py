"""The native math libraries a stage's code loaded, set up on one thread before its first
call (:func:`settle`, from :meth:`bls.bindings.InlineBinding.start`, in ``bls serve`` and
``bls worker`` alike).

Torch's CPU build hands elementwise functions (``tanh``, ``exp``, ``erf``...) of larger
tensors to MKL's vector math, split between its threads. MKL sets that up lazily, at the
first call in the process; when that first call comes from two threads at once, one of
them now and then computes its half with other code, up to 5e-5 off for ``tanh`` (seen in
about 2 % of fresh processes on two busy cores). That first answer then differs between a
stage in process and the same stage in a ``bls worker``, where bls promises the same
bytes. One small call on one thread first sets MKL up: every call after gives the same
bits, in every process.
"""

from __future__ import annotations

import sys

__all__ = ["settle"]

_settled = False


def settle() -> None:
    """Set up torch's math libraries once, if a stage loaded torch (else nothing)."""
    global _settled
    torch = sys.modules.get("torch")
    if _settled or torch is None or not hasattr(torch, "tanh"):
        return
    _settled = True
    torch.tanh(torch.zeros(8, device="cpu"))  # (one thread, through MKL's vector math)
