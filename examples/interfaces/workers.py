"""Two workers behind the worker interface."""

from collections.abc import AsyncIterator

from contracts import Prompt, Token


async def shout(req: Prompt) -> AsyncIterator[Token]:
    """Every word in capitals."""
    for word in req.text.split():
        yield Token(text=word.upper())


async def mixed(req: Prompt) -> AsyncIterator[Token]:
    """Every word in alternating case: lOuD aNd QuIeT."""
    for word in req.text.split():
        yield Token(
            text="".join(c.lower() if i % 2 == 0 else c.upper() for i, c in enumerate(word))
        )
