"""The frontend's request scope on asyncio: deadline, early cancel, late cancel."""

from __future__ import annotations

import asyncio

from bls.serve.intake import _AsyncioScope


def test_request_scope_expires_cancels_and_ignores_late_cancels() -> None:
    async def main() -> None:
        deadline = _AsyncioScope()
        deadline.expire_after(0.01)
        async with deadline:
            await asyncio.sleep(5)
        assert deadline.cancelled_caught

        early = _AsyncioScope()
        early.cancel()  # a drain reached it before it started
        async with early:
            await asyncio.sleep(5)
        assert early.cancelled_caught

        done = _AsyncioScope()
        done.expire_after(5)
        async with done:
            await asyncio.sleep(0)
        assert not done.cancelled_caught
        done.cancel()  # a drain reached it while it sent its answer: nothing to do

    asyncio.run(asyncio.wait_for(main(), 10))
