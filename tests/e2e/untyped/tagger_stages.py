"""The stages of tagger.py: typed functions, whose types the script never imports."""

from collections.abc import AsyncIterator

from tagger import Topic

import bls


class Named(bls.Message):
    name: str


class LabelRequest(bls.Message):
    text: str
    topic: str


class Label(bls.Message):
    name: str
    score: float


class Words(bls.Message):
    text: str


class Word(bls.Message):
    text: str


async def topic(req: Topic) -> Named:
    return Named(name=f"{req.text.split()[0]}-topic")


async def label(req: LabelRequest) -> Label:
    return Label(name=f"{req.topic}:{len(req.text)}", score=len(req.text) / 10)


async def words(req: Words) -> AsyncIterator[Word]:
    for text in req.text.split():
        yield Word(text=text.upper())
