"""Every example test runs on asyncio and on trio. anyio 4's ``pytest.mark.anyio`` does that
by itself (trio is one of bls's dependencies); naming both here makes an environment
without trio an error rather than fewer tests (docs/testing.md, "On asyncio and trio")."""

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param
