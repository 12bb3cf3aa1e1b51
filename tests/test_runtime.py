"""Runtime + inline bindings: binding kinds, type conversion, errors, cancellation."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import helpers
import pytest
from conftest import live_tasks
from helpers import Shout, Text, probe

import bls
from bls import stage
from bls.bindings import InlineBinding

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _fresh_probe() -> None:
    probe.reset()


class Counter(bls.Worker):
    """A stateful worker: records its life cycle."""

    events: list[str] = []

    async def setup(self) -> None:
        self.events.append("setup")
        self.n = 0

    async def teardown(self) -> None:
        self.events.append("teardown")

    async def __call__(self, req: Text) -> int:
        self.n += 1
        return self.n


class Spell(bls.Worker):
    async def __call__(self, req: Text) -> AsyncIterator[str]:
        for ch in req.text:
            yield ch


@bls.script
async def shout_twice(req: Text) -> str:
    first = await stage("upper", req)
    return first.text + first.text


async def test_function_binding_converts_request_and_keeps_result_type() -> None:
    async with bls.Runtime({"upper": helpers.upper}):
        assert await stage("upper", Text(text="hi")) == Shout(text="HI")
        # A dict, or another Struct of the same shape, is converted like a wire decode.
        assert await stage("upper", {"text": "x"}) == Shout(text="X")
        assert await stage("upper", Shout(text="y", loud=False)) == Shout(text="Y")


async def test_untyped_worker_result_becomes_builtins_as_on_the_wire() -> None:
    async with bls.Runtime({"u": helpers.untyped}):
        assert await stage("u", {"text": "a"}) == {"text": "a", "loud": True}


async def test_typed_handle_converts_untyped_results() -> None:
    handle = bls.Stage("typed_untyped", dict, Shout)
    async with bls.Runtime({"typed_untyped": helpers.untyped}):
        assert await handle({"text": "a"}) == Shout(text="a")
        assert await stage("typed_untyped", {"text": "b"}) == Shout(text="b")


async def test_worker_class_is_set_up_once_and_torn_down() -> None:
    Counter.events = []
    async with bls.Runtime({"count": Counter}):
        assert Counter.events == ["setup"]
        assert [await stage("count", Text(text="")) for _ in range(3)] == [1, 2, 3]
    assert Counter.events == ["setup", "teardown"]


async def test_worker_is_torn_down_when_the_body_fails() -> None:
    Counter.events = []
    with pytest.raises(RuntimeError):
        async with bls.Runtime({"count": Counter}):
            raise RuntimeError("body failed")
    assert Counter.events == ["setup", "teardown"]


async def test_streaming_worker_and_async_generator() -> None:
    async with bls.Runtime({"spell": Spell, "tokens": helpers.tokens}):
        assert [c async for c in stage.stream("spell", Text(text="abc"))] == ["a", "b", "c"]
        assert await bls.collect(stage.stream("tokens", Text(text="x y"))) == "x y "


async def test_script_bound_as_a_stage_of_another_script() -> None:
    async with bls.Runtime({"upper": helpers.upper, "twice": shout_twice}):
        assert await stage("twice", Text(text="ab")) == "ABAB"


async def test_worker_exception_is_a_stage_error_naming_stage_and_type() -> None:
    async with bls.Runtime({"fails": helpers.fails}):
        with pytest.raises(bls.StageError) as info:
            await stage("fails", Text(text="x"))
    err = info.value
    assert (err.stage, err.kind) == ("fails", "ValueError")
    assert "cannot handle 'x'" in err.message
    assert err.remote_traceback and "ValueError" in err.remote_traceback
    assert "stage 'fails'" in str(err)


async def test_invalid_request_names_stage_and_field_path() -> None:
    async with bls.Runtime({"upper": helpers.upper}):
        with pytest.raises(bls.InvalidRequest) as info:
            await stage("upper", {"text": 5})
    assert info.value.stage == "upper"
    assert info.value.path == "$.text"
    assert isinstance(info.value, bls.StageError)


async def test_invalid_response_is_reported() -> None:
    handle = bls.Stage("liar", Text, int)

    async def liar(req: Text) -> str:
        return "not a number"

    with pytest.raises(bls.BindingError, match="returns str"):
        async with bls.Runtime({"liar": liar}, declared=[handle]):
            pass

    async def unannotated(req: Text):  # type: ignore[no-untyped-def]
        return "not a number"

    async with bls.Runtime({"liar": unannotated}, declared=[handle]):
        with pytest.raises(bls.StageError) as info:
            await stage("liar", Text(text=""))
    assert info.value.kind == "invalid_response"


async def test_unbound_stage_is_not_a_stage_error() -> None:
    async with bls.Runtime({"upper": helpers.upper}):
        with pytest.raises(bls.StageNotBound, match=r"'nope' is not bound.*upper"):
            await stage("nope", Text(text=""))


async def test_wrong_mode_is_a_clear_error() -> None:
    async with bls.Runtime({"upper": helpers.upper, "tokens": helpers.tokens}):
        with pytest.raises(bls.StageError, match="streaming") as info:
            await stage("tokens", Text(text="a"))
        assert info.value.kind == "wrong_mode"
        with pytest.raises(bls.StageError, match="unary"):
            await bls.collect(stage.stream("upper", Text(text="a")))


async def test_stage_outside_a_runtime_says_how_to_run() -> None:
    with pytest.raises(RuntimeError, match="outside a running bls script"):
        await stage("upper", Text(text=""))


async def test_typed_handle_mismatch_fails_before_setup() -> None:
    Counter.events = []
    handle = bls.Stage("counted", Text, str)
    with pytest.raises(bls.BindingError) as info:
        async with bls.Runtime({"counted": Counter}, declared=[handle]):
            pass
    assert "'counted'" in str(info.value) and "returns int" in str(info.value)
    assert Counter.events == []


async def test_a_handle_not_declared_up_front_is_checked_at_its_first_call() -> None:
    wrong = bls.Stage("counted", Text, str)
    right = bls.Stage("counted", Text, int)
    async with bls.Runtime({"counted": Counter}):
        with pytest.raises(bls.BindingError, match="returns int"):
            await wrong(Text(text=""))
        assert await right(Text(text="")) == 1
        # From then on the stage is declared: untyped calls come back in its type too.
        assert await stage("counted", Text(text="")) == 2


async def test_handles_declare_only_to_the_runtime_they_are_given_to() -> None:
    # Two scripts in one process may type the same stage name differently.
    as_text = bls.Stage("shared_name", Text, Shout)
    as_other = bls.Stage("shared_name", Other, Shout)
    async with bls.Runtime({"shared_name": helpers.upper}, declared=[as_text]):
        assert await as_text(Text(text="a")) == Shout(text="A")
    async with bls.Runtime({"shared_name": helpers.upper}, declared=[as_other]):
        assert await as_other(Other(text="b")) == Shout(text="B")


class Other(bls.Message):
    text: str


async def test_typed_handle_accepts_same_shape_under_another_name() -> None:
    bls.Stage("same_shape", Other, Shout)
    async with bls.Runtime({"same_shape": helpers.upper}):
        assert await stage("same_shape", Other(text="q")) == Shout(text="Q")


async def test_conflicting_declarations_are_rejected() -> None:
    first = bls.Stage("declared_once", Text, str)
    same = bls.Stage("declared_once", Text, str)  # identical: fine
    other = bls.Stage("declared_once", Text, int)
    bls.Runtime({}, declared=[first, same])
    with pytest.raises(TypeError, match="declared twice"):
        bls.Runtime({}, declared=[first, other])


async def test_cancelling_a_request_cancels_inline_workers_and_leaves_no_task() -> None:
    @bls.script
    async def fan(req: Text) -> list[Text]:
        return await bls.gather(stage("slow", req), stage("slow", req))

    async with bls.Runtime({"slow": helpers.slow}) as rt:
        before = live_tasks()
        async with anyio.create_task_group() as tg:
            tg.start_soon(rt.run, fan, Text(text="x"))
            await probe.started.wait()
            tg.cancel_scope.cancel()
        assert probe.cancelled == 2 and probe.finished == 2
        assert live_tasks() == before


async def test_request_timeout_raises_deadline_and_cancels_worker() -> None:
    @bls.script
    async def one(req: Text) -> Text:
        return await stage("slow", req)

    async with bls.Runtime({"slow": helpers.slow}) as rt:
        with pytest.raises(bls.DeadlineExceeded):
            await rt.run(one, Text(text="x"), timeout=0.05)
    assert probe.cancelled == 1


async def test_run_stream_hands_items_over_and_closes_on_early_exit() -> None:
    @bls.script
    async def numbers(req: Text) -> AsyncIterator[int]:
        async for n in stage.stream("endless", req):
            yield n

    async with bls.Runtime({"endless": helpers.endless}) as rt:
        before = live_tasks()
        got = []
        async with rt.run_stream(numbers, Text(text="")) as items:
            async for n in items:
                got.append(n)
                if n == 3:
                    break
        assert got == [0, 1, 2, 3]
        assert probe.finished == 1
        assert live_tasks() == before


async def test_run_stream_raises_script_errors_and_deadlines() -> None:
    @bls.script
    async def broken(req: Text) -> AsyncIterator[str]:
        yield "first"
        await stage("fails", req)

    @bls.script
    async def forever(req: Text) -> AsyncIterator[int]:
        async for n in stage.stream("endless", req):
            yield n

    async with bls.Runtime({"fails": helpers.fails, "endless": helpers.endless}) as rt:
        got = []
        with pytest.raises(bls.StageError, match="cannot handle"):
            async with rt.run_stream(broken, Text(text="z")) as items:
                async for item in items:
                    got.append(item)
        assert got == ["first"]
        with pytest.raises(bls.DeadlineExceeded):
            async with rt.run_stream(forever, {"text": ""}, timeout=0.05) as items:
                async for _ in items:
                    pass
        # Cancelled mid-sleep or closed at a yield: either way its finally ran.
        assert probe.finished == 1


async def test_entry_request_is_validated_with_path() -> None:
    async with bls.Runtime({"upper": helpers.upper}) as rt:
        with pytest.raises(bls.InvalidRequest) as info:
            await rt.run(shout_twice, {})
    assert info.value.stage == "shout_twice"
    assert "text" in info.value.message


async def test_a_field_the_request_type_does_not_declare_is_refused_by_name() -> None:
    async with bls.Runtime({"upper": helpers.upper}) as rt:
        with pytest.raises(bls.InvalidRequest) as info:
            await rt.run(shout_twice, {"text": "hi", "txet": "typo"})
    assert "unknown field `txet`" in info.value.message


class _Lenient(bls.Message, forbid_unknown_fields=False):
    text: str


@bls.script
async def lenient(req: _Lenient) -> str:
    return req.text


async def test_a_request_type_can_opt_out_of_refusing_unknown_fields() -> None:
    async with bls.Runtime({}) as rt:
        assert await rt.run(lenient, {"text": "hi", "extra": 1}) == "hi"


@bls.script
async def forgets_to_return(req: helpers.Text) -> helpers.Shout:
    del req  # returns nothing against its declared type


async def test_an_entry_that_returns_nothing_against_its_declared_type_is_an_error() -> None:
    async with bls.Runtime({}) as rt:
        with pytest.raises(bls.StageError) as info:
            await rt.run(forgets_to_return, {"text": "hi"})
    assert info.value.kind == "invalid_response"
    assert "returned None" in info.value.message and "Shout" in info.value.message


async def test_options_are_validated_against_the_workers_options_type() -> None:
    import msgspec

    class Opts(msgspec.Struct):
        size: int = 1

    class Sized(bls.Worker):
        Options = Opts

        async def __call__(self, req: Text) -> int:
            return self.options.size

    async with bls.Runtime({"s": InlineBinding("s", Sized, options={"size": "3"})}):
        assert await stage("s", Text(text="")) == 3
    with pytest.raises(TypeError, match=r"stage 's': bad option .* at \$.size"):
        InlineBinding("s", Sized, options={"size": "big"})
    with pytest.raises(TypeError, match="takes no options"):
        InlineBinding("c", Counter, options={"x": 1})


@bls.script
async def countdown(req: helpers.Text) -> AsyncIterator[str]:
    try:
        for word in req.text.split():
            if word == "boom":
                raise ValueError("boom")
            yield (await bls.stage("upper", helpers.Text(text=word))).text
    finally:
        helpers.probe.finished += 1


async def test_feed_hands_each_item_to_the_sink_in_order_and_closes_the_script() -> None:
    helpers.probe.reset()
    got: list[str] = []

    async def sink(item: str) -> None:
        got.append(item)

    async with bls.Runtime({"upper": helpers.upper}) as rt:
        await rt.feed(countdown, {"text": "a b c"}, sink)
        assert got == ["A", "B", "C"]
        with pytest.raises(ValueError, match="boom"):
            await rt.feed(countdown, {"text": "a boom"}, sink)

        async def full(item: str) -> None:
            raise OSError("the client went away")

        with pytest.raises(OSError):
            await rt.feed(countdown, {"text": "x y"}, full)
    assert got == ["A", "B", "C", "A"]
    assert helpers.probe.finished == 3  # the script's finally ran every time


def test_the_handles_a_script_can_see_are_its_globals_and_its_imported_modules() -> None:
    import types

    from bls.check import typed_handles

    contracts = types.ModuleType("contracts")
    shared = bls.Stage("shared", Text, Shout)
    contracts.shared = shared  # type: ignore[attr-defined]
    contracts.streamed = bls.StreamStage("streamed", Text, str)  # type: ignore[attr-defined]
    script = types.ModuleType("script")
    own = bls.Stage("own", Text, str)
    script.own = own  # type: ignore[attr-defined]
    script.contracts = contracts  # type: ignore[attr-defined]  # import contracts
    script.again = shared  # type: ignore[attr-defined]  # from contracts import shared
    found = typed_handles(script, None)
    assert sorted(h.name for h in found) == ["own", "shared", "streamed"]
