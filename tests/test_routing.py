"""Routes as data: exact paths, prefixes with their rest, 405 from a route's own methods."""

from __future__ import annotations

import pytest

from bls.serve.framing import HttpError, Receive, Scope, Send
from bls.serve.routing import Route, Router


async def _handler(scope: Scope, receive: Receive, send: Send, rest: str) -> None:
    """A stand-in: the router only hands it out."""


async def _other(scope: Scope, receive: Receive, send: Send, rest: str) -> None:
    """Another stand-in."""


ROUTER = Router(
    [
        Route("/v1/scripts/", ["POST"], _handler, prefix=True),
        Route("/v1/scripts", ["GET"], _other),
        Route("/health", ["GET"], _other),
        Route("/debug/requests/", ["GET"], _handler, prefix=True),
    ]
)


def test_an_exact_path_and_a_prefix_with_its_rest() -> None:
    assert ROUTER.match("GET", "/v1/scripts") == (_other, "")
    assert ROUTER.match("POST", "/v1/scripts/greet") == (_handler, "greet")
    assert ROUTER.match("GET", "/debug/requests/abc") == (_handler, "abc")
    assert ROUTER.match("HEAD", "/health") == (_other, "")  # (what takes GET takes HEAD)


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("POST", "/debug/requests/x", 405, b"GET, HEAD"),
        ("GET", "/v1/scripts/greet", 405, b"POST"),
        ("HEAD", "/v1/scripts/greet", 405, b"POST"),
        ("POST", "/health", 405, b"GET, HEAD"),
        ("GET", "/nowhere", 404, None),
        ("POST", "/v1/scripts/", 404, None),  # a prefix with nothing after it
    ],
)
def test_405_comes_from_the_routes_own_methods_and_404_from_no_route(
    method: str, path: str, status: int, allow: bytes | None
) -> None:
    with pytest.raises(HttpError) as info:
        ROUTER.match(method, path)
    assert info.value.status == status
    assert dict(info.value.headers).get(b"allow") == allow
