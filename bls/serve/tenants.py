"""Whose a request is: its tenant, for admission's fair turns and per-tenant limits.

By default the tenant is what the client says in ``X-Tenant``. With ``[admission] tenant =
"FILE:FUNCTION"`` in ``bls.toml``, the server decides instead: the function is given the
request's head (:class:`RequestHead`: entry, path, headers, client address) and returns its
tenant, or None for ``default``. That is how a tenant becomes the owner of an API key rather
than a name any client may claim::

    KEYS = {"sk-team-a": "team-a", "sk-team-b": "team-b"}

    def by_key(head):
        token = head.headers.get("authorization", "").removeprefix("Bearer ")
        return KEYS.get(token, "anonymous")

It runs on the event loop for every request admission looks at, before the body is read:
keep it a quick, plain function (a dictionary lookup, not a network call).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import AdmissionConfig, ConfigError
from ..targets import load_target
from .framing import HttpError, Scope

__all__ = ["RequestHead", "TenantOf", "tenant_function", "tenant_of", "valid_tenant"]

log = logging.getLogger("bls.http")


class RequestHead:
    """What a tenant function sees of a request: ``entry`` (the entry's name), ``path``,
    ``headers`` (names in lower case; the last of a repeated one) and ``client`` (the
    peer's address, or None)."""

    __slots__ = ("client", "entry", "headers", "path")

    def __init__(self, entry: str, path: str, headers: dict[str, str], client: str | None):
        self.entry = entry
        self.path = path
        self.headers = headers
        self.client = client

    def __repr__(self) -> str:
        return f"RequestHead(entry={self.entry!r}, path={self.path!r}, client={self.client!r})"


TenantOf = Callable[[RequestHead], "str | None"]


def valid_tenant(name: str) -> bool:
    """1 to 128 printable ASCII characters."""
    return 0 < len(name) <= 128 and name.isascii() and name.isprintable()


def tenant_function(config: AdmissionConfig) -> TenantOf | None:
    """The function ``[admission] tenant`` names, loaded; None when it names none.
    ConfigError when it cannot be loaded or is not a plain function."""
    if config.tenant is None:
        return None
    where = f"[admission] tenant = {config.tenant!r}"
    base = Path(config.base) if config.base else Path.cwd()
    try:
        function = load_target(config.tenant, base)
    except (ImportError, ValueError, FileNotFoundError, SyntaxError) as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not callable(function) or inspect.iscoroutinefunction(function):
        raise ConfigError(
            f"{where}: expected a plain (not async) function of the request's head that "
            f"returns its tenant or None, got {function!r}"
        )
    return function


def tenant_of(function: TenantOf, scope: Scope, entry: str) -> str | None:
    """What ``function`` says the request's tenant is; 500 naming it when it fails or
    returns something that is not a tenant."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    client: Any = scope.get("client")
    head = RequestHead(entry, scope["path"], headers, client[0] if client else None)
    name = getattr(function, "__qualname__", repr(function))
    try:
        tenant = function(head)
    except Exception as exc:
        log.exception("the tenant function %s failed on a request to %r", name, entry)
        why = f"the tenant function {name} failed: {type(exc).__name__}: {exc}"
        raise HttpError(500, "internal", why) from None
    if tenant is None or (isinstance(tenant, str) and valid_tenant(tenant)):
        return tenant
    why = (
        f"the tenant function {name} returned {tenant!r}: a tenant is 1 to 128 printable "
        "ASCII characters, or None"
    )
    raise HttpError(500, "internal", why)
