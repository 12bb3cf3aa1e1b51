"""An untyped script, the README's style: `stage("name", req)` with no typed handle. Its
stages take and return structs of their own module (tagger_stages.py), which this script
never imports: it builds their requests as dicts and reads their results' fields."""

import bls
from bls import stage


class Doc(bls.Message):
    text: str


class Topic(bls.Message):  # the `topic` stage's request type, here for the stage to import
    text: str
    hint: str = ""


class Tagged(bls.Message):
    topic: str
    label: str
    score: float
    words: list[str]


@bls.script
async def tag(req: Doc) -> Tagged:
    topic = await stage("topic", Topic(text=req.text))
    label = await stage("label", {"text": req.text, "topic": topic.name})
    words = [word.text async for word in stage.stream("words", {"text": req.text})]
    return Tagged(topic=topic.name, label=label.name, score=label.score, words=words)
