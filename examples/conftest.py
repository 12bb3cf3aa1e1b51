"""Every example test runs on asyncio and on trio. Copy this beside your own tests for the
same (without it, ``pytest.mark.anyio`` runs them on asyncio only)."""

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return request.param
