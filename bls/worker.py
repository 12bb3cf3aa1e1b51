"""``bls.Worker``: the base class for stateful workers (models that load once)."""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["Worker"]


class Worker:
    """A stage implementation with a life cycle.

    Subclass it and define ``async def __call__(self, req)`` (unary) or an async
    generator ``__call__`` (streaming). ``setup`` runs once per process before the first
    call (load weights there); ``teardown`` runs once on shutdown, also after a failed
    request or a cancelled one. The same class runs inline or behind ``bls worker``.

    ``Options`` may name a ``msgspec.Struct`` type: the binding's ``options`` table
    (``bls.toml``) or ``--option KEY=VALUE`` flags are validated against it and passed
    to ``__init__`` as ``options``.
    """

    Options: ClassVar[type | None] = None

    def __init__(self, options: Any = None) -> None:
        self.options = options

    async def setup(self) -> None:
        """Prepare the worker (load models). Runs once, before any call."""

    async def teardown(self) -> None:
        """Release what ``setup`` took. Runs once, at shutdown."""

    def served_models(self) -> list[str]:
        """The model names a chat client may ask for by this worker (after ``setup``):
        what an OpenAI-compatible server over it answers to. None by default."""
        return []

    def __call__(self, req: Any) -> Any:
        """Handle one request: override with an ``async def`` (unary) or an async
        generator (streaming)."""
        raise NotImplementedError(f"{type(self).__qualname__} does not define __call__")
