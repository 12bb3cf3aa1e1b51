"""A worker whose types do not satisfy the worker interface of examples/interfaces."""

from __future__ import annotations

from collections.abc import AsyncIterator

import bls


class Count(bls.Message):
    n: int


async def numbers(req: Count) -> AsyncIterator[int]:
    for i in range(req.n):
        yield i
