"""Routes as data: a path (exact, or a prefix whose rest is the route's argument), the
methods it takes, and its handler. A route that takes GET takes HEAD too (the server
sends the head of the GET answer alone). A path that a route serves with other methods
is answered 405 with ``Allow`` listing the route's own; one no route serves, 404.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from .framing import HttpError, Receive, Scope, Send

__all__ = ["Handler", "Route", "Router", "not_allowed"]

# A handler gets the ASGI triple and the rest of the path after a prefix route's prefix
# ("" for an exact route).
Handler = Callable[[Scope, Receive, Send, str], Awaitable[None]]


class Route:
    """``path`` served by ``handler`` for ``methods`` (and HEAD with GET); a ``prefix``
    route serves every path that starts with ``path`` and hands the handler the rest."""

    __slots__ = ("handler", "methods", "path", "prefix")

    def __init__(
        self, path: str, methods: Iterable[str], handler: Handler, *, prefix: bool = False
    ) -> None:
        self.path = path
        methods = frozenset(methods)
        self.methods = methods | {"HEAD"} if "GET" in methods else methods
        self.handler = handler
        self.prefix = prefix


class Router:
    """Finds the route of a request: exact paths first (one dict lookup), then prefixes in
    the order given."""

    __slots__ = ("_exact", "_prefixes")

    def __init__(self, routes: Iterable[Route]) -> None:
        self._exact: dict[str, Route] = {}
        self._prefixes: list[Route] = []
        for route in routes:
            if route.prefix:
                self._prefixes.append(route)
            else:
                self._exact[route.path] = route

    def match(self, method: str, path: str) -> tuple[Handler, str]:
        """The handler and its argument; :class:`HttpError` 405 or 404 when none fits."""
        route = self._exact.get(path)
        rest = ""
        if route is None:
            for candidate in self._prefixes:
                if path.startswith(candidate.path) and len(path) > len(candidate.path):
                    route, rest = candidate, path[len(candidate.path) :]
                    break
            else:
                raise HttpError(404, "not_found", f"no route {method} {path}")
        if method not in route.methods:
            raise not_allowed(method, path, route.methods)
        return route.handler, rest


def not_allowed(method: str, path: str, allowed: Iterable[str]) -> HttpError:
    """405 for ``method`` on ``path``, with ``Allow`` listing the methods it takes."""
    return HttpError(
        405,
        "method_not_allowed",
        f"{method} is not allowed on {path}",
        headers=[(b"allow", ", ".join(sorted(allowed)).encode())],
    )
