from collections.abc import AsyncIterator

import anyio


async def score(word: str) -> int:
    await anyio.sleep(0.001 * len(word))
    return len(set(word))


async def fast_echo(word: str) -> str:
    return word.upper()


async def slow_echo(word: str) -> str:
    await anyio.sleep(3)
    return word


async def letters(word: str) -> AsyncIterator[str]:
    for ch in word:
        yield ch


async def broken(word: str) -> int:
    raise ZeroDivisionError("no score for " + word)
