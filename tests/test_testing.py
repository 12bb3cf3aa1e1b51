"""bls.testing: every kind of fake, the errors a test gets when a fake is wrong or
missing, deadlines acting on fakes, the served client, and FakeLLM's engine contract."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import pytest

import bls
from bls import testing
from bls.models.vllm import GenerateItem, GenerateRequest
from bls.recording import Recorder, dump
from bls.scope import RequestScope
from bls.scriptfile import ScriptFile

pytestmark = pytest.mark.anyio


class Text(bls.Message):
    text: str


class Score(bls.Message):
    value: int


rate = bls.Stage("rate", Text, Score)
words = bls.StreamStage("words", Text, Text)


@bls.script
async def best(req: Text) -> Score:
    """The best of three ratings, then the words of the text."""
    scores = await bls.gather(*(rate(Text(text=f"{req.text} {n}")) for n in range(3)))
    return Score(value=max(s.value for s in scores))


@bls.script
async def spelled(req: Text) -> AsyncIterator[str]:
    async for word in words(req):
        yield word.text


@bls.script
async def patient(req: Text) -> str:
    try:
        with bls.timeout(0.05):
            await rate(req)
    except bls.DeadlineExceeded:
        return "gave up"
    return "rated"


@bls.script
async def untyped(req: Text) -> str:
    return str(await bls.stage("anything", req.text))


async def test_a_fake_is_a_function_an_async_function_a_value_or_one_value_a_call() -> None:
    async def async_rate(req: Text) -> Score:
        return Score(value=len(req.text))

    for fake, want in [
        (lambda req: Score(value=int(req.text[-1])), 2),
        (async_rate, 4),
        (Score(value=7), 7),
        ({"value": 8}, 8),  # canned values arrive in the declared type
        ([Score(value=1), {"value": 5}, Score(value=2)], 5),
    ]:
        with testing.fake({"rate": fake}) as calls:
            assert await testing.call(best, Text(text="ab")) == Score(value=want)
        assert sorted(c.request.text for c in calls["rate"]) == ["ab 0", "ab 1", "ab 2"]
        assert all(isinstance(c.response, Score) for c in calls["rate"])


async def test_a_streaming_fake_is_an_async_generator_or_a_list_of_items() -> None:
    async def split(req: Text) -> AsyncIterator[Text]:
        for word in req.text.split():
            yield Text(text=word)

    with testing.fake({"words": split}) as calls:
        assert await testing.call(spelled, {"text": "a b"}) == ["a", "b"]
    assert [i.text for i in calls["words"][0].items] == ["a", "b"]

    with testing.fake({"words": [{"text": "x"}, {"text": "y"}]}):  # every call's items
        assert await testing.call(spelled, Text(text="")) == ["x", "y"]
        assert await testing.call(spelled, Text(text="")) == ["x", "y"]

    with testing.fake({"words": testing.each([Text(text="1")], [])}):  # one list a call
        assert await testing.call(spelled, Text(text="")) == ["1"]
        assert await testing.call(spelled, Text(text="")) == []


async def test_a_fake_raises_an_exception_at_the_call_or_mid_stream() -> None:
    overloaded = bls.StageError("rate", "overloaded", "busy")
    with testing.fake({"rate": overloaded}) as calls:
        with pytest.raises(bls.StageError) as caught:
            await testing.call(best, Text(text="x"))
    assert caught.value.kind == "overloaded"
    assert any(c.error is overloaded for c in calls["rate"])

    with testing.fake({"words": [Text(text="a"), ValueError("lost the stream")]}) as calls:
        with pytest.raises(bls.StageError) as caught:
            await testing.call(spelled, Text(text=""))
    assert (caught.value.stage, caught.value.kind) == ("words", "ValueError")
    assert [i.text for i in calls["words"][0].items] == ["a"]


async def test_bls_timeout_in_the_script_cancels_a_slow_fake() -> None:
    async def slow(req: Text) -> Score:
        await anyio.sleep(10)
        return Score(value=0)

    with testing.fake({"rate": slow}) as calls:
        assert await testing.call(patient, Text(text="x")) == "gave up"
    (call,) = calls["rate"]
    assert call.cancelled and call.error is None and call.duration < 5


async def test_a_deadline_raised_by_a_fake_reaches_the_script_as_a_deadline() -> None:
    with testing.fake({"rate": bls.DeadlineExceeded("rate took too long")}):
        assert await testing.call(patient, Text(text="x")) == "gave up"


async def test_a_stage_without_a_fake_is_named() -> None:
    with testing.fake({"words": []}):
        with pytest.raises(bls.StageNotBound, match=r"stage 'rate' is called .* no fake.*words"):
            await testing.call(best, Text(text="x"))


async def test_an_undeclared_stage_takes_any_value() -> None:
    with testing.fake({"anything": [1, "two"]}) as calls:
        assert await testing.call(untyped, Text(text="a")) == "1"
        assert await testing.call(untyped, Text(text="b")) == "two"
    assert [c.request for c in calls["anything"]] == ["a", "b"]


async def test_a_fake_with_too_few_answers_says_so() -> None:
    with testing.fake({"rate": [Score(value=1)]}):
        with pytest.raises(AssertionError, match=r"'rate' has 1 answer\(s\) and was called a 2nd"):
            await testing.call(best, Text(text="x"))


async def test_a_fake_value_of_the_wrong_type_names_the_stage_answer_and_field() -> None:
    with testing.fake({"rate": [Score(value=1), {"value": "high"}]}):
        with pytest.raises(TypeError) as caught:
            await testing.call(best, Text(text="x"))
    assert str(caught.value) == (
        "fake for stage 'rate' answer 2: not a tests.test_testing.Score at `$.value`: "
        "Expected `int`, got `str`"
    ).replace("tests.test_testing", Score.__module__)


async def test_testing_needs_a_fake_block() -> None:
    with pytest.raises(RuntimeError, match=r"needs a `with bls.testing.fake"):
        await testing.call(best, Text(text="x"))


async def test_a_cached_fake_is_called_once_per_request_seen() -> None:
    with testing.fake({"rate": testing.cached(lambda r: Score(value=1), capacity_mb=1)}) as calls:
        await testing.call(best, Text(text="x"))
        await testing.call(best, Text(text="x"))
    assert len(calls["rate"]) == 3  # the second request's three were cache hits


SERVED = Path(__file__).parent / "e2e" / "served" / "served.py"


async def test_the_client_serves_the_script_over_http_with_fakes() -> None:
    async def slow(req: object) -> str:
        await anyio.sleep(10)
        return "late"

    with testing.fake({"whoami": {"pid": 1, "text": "fake"}, "slow": slow}):
        async with testing.client(SERVED, request_timeout=0.2) as http:
            hello = await http.post("/v1/scripts/greet", json={"text": "you"})
            bad = await http.post("/v1/scripts/greet", json={"txt": "you"})
            late = await http.post("/v1/scripts/wait", json={"text": "you"})

    assert (hello.status_code, hello.json()) == (200, {"text": "hello you", "pid": 1})
    assert bad.status_code == 422 and bad.json()["error"]["path"] == "$"
    assert "`text`" in bad.json()["error"]["message"]
    assert late.status_code == 504 and late.json()["error"]["type"] == "deadline_exceeded"


# -- FakeLLM ------------------------------------------------------------------------------


async def generate(llm: testing.FakeLLM, **fields: object) -> list[GenerateItem]:
    req = msgspec.convert(fields, GenerateRequest)
    return [item async for item in llm(req)]


async def test_fakellm_is_deterministic_and_streams_the_vllm_contract() -> None:
    llm = testing.FakeLLM()
    one = await generate(llm, prompt="a cat on a mat", max_tokens=5, seed=1)
    again = await generate(llm, prompt="a cat on a mat", max_tokens=5, seed=1)
    other = await generate(llm, prompt="a cat on a mat", max_tokens=5, seed=2)

    assert one == again and [i.text for i in one] != [i.text for i in other]
    assert len(one) == 5 and all(len(i.token_ids) == 1 for i in one)
    assert one[0].prompt_tokens == 5 and all(i.prompt_tokens is None for i in one[1:])
    assert [i.finish_reason for i in one] == [None] * 4 + ["length"]
    assert llm.generated == 15 and llm.aborted == 0 and llm.unfinished() == 0


async def test_fakellm_stops_at_eos_a_stop_string_or_never_with_ignore_eos() -> None:
    llm = testing.FakeLLM(testing.FakeOptions(eos_after=3, words=["x", "y"]))
    assert len(await generate(llm, prompt="p", max_tokens=10)) == 3
    assert (await generate(llm, prompt="p", max_tokens=10))[-1].finish_reason == "stop"
    assert len(await generate(llm, prompt="p", max_tokens=10, ignore_eos=True)) == 10
    assert len(await generate(llm, prompt="p", max_tokens=10, min_tokens=6)) == 6
    stopped = await generate(llm, prompt="p", max_tokens=10, ignore_eos=True, stop=["y"])
    assert stopped[-1].finish_reason == "stop" and "y" in stopped[-1].text


async def test_fakellm_takes_chat_messages_token_ids_and_embeddings() -> None:
    llm = testing.FakeLLM()
    chat = await generate(llm, messages=[{"role": "user", "content": "hi there"}], max_tokens=2)
    ids = await generate(llm, token_ids=[5, 6, 7], max_tokens=2)
    assert (chat[0].prompt_tokens, ids[0].prompt_tokens) == (2, 3)
    with pytest.raises(bls.InvalidRequest, match="exactly one of"):
        await generate(llm, prompt="a", token_ids=[1])


async def test_fakellm_paces_tokens_and_aborts_when_cancelled() -> None:
    llm = testing.FakeLLM(testing.FakeOptions(ttft_ms=30, tpot_ms=20))
    started = anyio.current_time()
    await generate(llm, prompt="p", max_tokens=3, ignore_eos=True)
    assert anyio.current_time() - started >= 0.03 + 2 * 0.02

    got: list[GenerateItem] = []
    with anyio.move_on_after(0.1):
        async for item in llm(GenerateRequest(prompt="p", max_tokens=1000, ignore_eos=True)):
            got.append(item)
    assert 0 < len(got) < 1000
    assert llm.aborted == 1 and llm.unfinished() == 0


async def test_testing_replay_runs_a_recorded_request_again(tmp_path: Path) -> None:
    script = Path(__file__).parent / "e2e" / "pipelines" / "review.py"
    app = ScriptFile(script, record=True)
    recorder = Recorder(app.path)
    async with app.runtime() as rt, RequestScope("test", record=recorder):
        async with rt.run_stream(app.entry("spell"), {"words": ["hi"]}) as items:
            answer = [i async for i in items]
    (tmp_path / "r.blsrec").write_bytes(dump(recorder.finish()))

    assert await testing.replay(tmp_path / "r.blsrec") == answer == ["h", "i"]
    assert await testing.replay(tmp_path / "r.blsrec", app.entry("spell")) == answer


async def test_testing_replay_of_a_unary_entry_returns_what_call_returns(tmp_path: Path) -> None:
    app = ScriptFile(UNTYPED, record=True)
    for text, name in (("red fox", "ok.blsrec"), ("", "failed.blsrec")):
        recorder = Recorder(app.path)
        async with app.runtime() as rt, RequestScope("test", record=recorder):
            try:
                answer = await rt.run(app.entry("tag"), {"text": text})
            except bls.StageError:
                pass
        (tmp_path / name).write_bytes(dump(recorder.finish()))
    assert await testing.replay(tmp_path / "ok.blsrec") == answer
    assert isinstance(answer, tagger.Tagged)
    with pytest.raises(bls.StageError) as failed:  # "".split()[0]: the topic stage fails
        await testing.replay(tmp_path / "failed.blsrec")
    assert (failed.value.stage, failed.value.kind) == ("topic", "IndexError")


# -- an untyped script (the README's style): fakes hand it what the real stages do -------

UNTYPED = Path(__file__).parent / "e2e" / "untyped" / "tagger.py"
tagger = ScriptFile(UNTYPED, configured=False).module
import tagger_stages as st  # noqa: E402  (beside the script, which put its folder on the path)


async def test_an_untyped_script_gets_the_same_values_from_fakes_as_from_its_stages() -> None:
    app = ScriptFile(UNTYPED)
    tag = app.entry("tag")
    async with app.runtime() as rt:
        live = await rt.run(tag, {"text": "red fox"})

    got: list[object] = []

    def label(req: st.LabelRequest) -> st.Label:  # a fake typed as the real stage is
        got.append(req)
        return st.Label(name=f"{req.topic}:{len(req.text)}", score=len(req.text) / 10)

    fakes = {
        "topic": st.topic,  # the real function, as a fake
        "label": label,
        "words": [st.Word(text="RED"), st.Word(text="FOX")],
    }
    with testing.fake(fakes) as calls:
        faked = await testing.call(tag, {"text": "red fox"})
    assert faked == live
    assert isinstance(calls["topic"][0].request, tagger.Topic)
    assert got == [st.LabelRequest(text="red fox", topic="red-topic")]  # a struct, not a dict

    with testing.fake({**fakes, "label": st.Label(name="red-topic:7", score=0.7)}):
        assert await testing.call(tag, {"text": "red fox"}) == live  # a value fake's type


async def test_an_untyped_fake_without_types_hands_over_builtins_as_an_untyped_stage() -> None:
    def label(req):  # type: ignore[no-untyped-def]  # no annotation: the wire's builtins
        assert req == {"text": "red fox", "topic": "red-topic"}
        return {"name": "n", "score": 1.0}

    with testing.fake({"topic": st.topic, "label": label, "words": []}):
        with pytest.raises(AttributeError, match="'dict' object has no attribute 'name'"):
            await testing.call(tagger.tag, {"text": "red fox"})
