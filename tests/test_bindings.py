"""Inline bindings: what a target is turned into, and the errors a worker's code raises."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest

import bls
from bls.bindings import InlineBinding, worker_error
from bls.targets import load_target

pytestmark = pytest.mark.anyio


class Opts(msgspec.Struct, forbid_unknown_fields=True):
    size: int = 1


class Sized(bls.Worker):
    Options = Opts

    async def __call__(self, req: str) -> str:
        return req * self.options.size


async def letters(req: str) -> AsyncIterator[str]:
    for c in req:
        yield c


async def test_a_worker_class_is_set_up_with_validated_options() -> None:
    binding = InlineBinding("s", Sized, options={"size": 2})
    await binding.open()
    await binding.start()
    assert await binding.invoke("ab") == "abab"
    await binding.aclose()
    with pytest.raises(TypeError, match="size"):
        InlineBinding("s", Sized, options={"size": "big"})


async def test_a_stream_is_called_in_its_own_mode_only() -> None:
    binding = InlineBinding("letters", letters)
    await binding.open()
    assert binding.signature.streaming
    assert [c async for c in binding.stream("hi")] == ["h", "i"]
    with pytest.raises(bls.StageError) as info:
        await binding.call("hi")
    assert info.value.kind == "wrong_mode"


def test_a_workers_exception_becomes_a_stage_error_naming_the_stage() -> None:
    err = worker_error("encoder", ValueError("bad pixels"))
    assert (err.stage, err.kind, err.message) == ("encoder", "ValueError", "bad pixels")
    assert err.remote_traceback and "ValueError: bad pixels" in err.remote_traceback
    unnamed = worker_error("generator", bls.InvalidRequest("", "no prompt", "$.prompt"))
    assert unnamed.stage == "generator"  # a worker that does not know its name


def test_targets_name_a_module_or_a_file_and_an_attribute(tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "w.py").write_text("async def f(req: str) -> str:\n    return req\n")
    assert load_target(f"{tmp_path}/w.py:f").__name__ == "f"
    assert load_target("bls.models.tiny:build").__name__ == "build"
    with pytest.raises(ValueError, match="must look like"):
        load_target("no-colon")
    with pytest.raises(ValueError, match="has no attribute 'g'"):
        load_target(f"{tmp_path}/w.py:g")


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_asyncio_called_on_trio_says_what_to_use_instead() -> None:
    import asyncio

    async def naps(req: int) -> int:
        await asyncio.sleep(0.01)  # a newcomer's habit
        return req

    async with bls.Runtime({"nap": naps}) as rt:
        with pytest.raises(bls.StageError) as caught:
            await rt.call("nap", 1)
    assert caught.value.kind == "RuntimeError"
    assert caught.value.message.startswith("no running event loop (asyncio was called")
    assert "use anyio" in caught.value.message and "--backend asyncio" in caught.value.message


class FakeTorch:
    """What bls.mathlibs uses of torch, its calls noted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def zeros(self, n: int, *, device: str) -> tuple[int, str]:
        return n, device

    def tanh(self, x: object) -> None:
        self.calls.append(("tanh", x))


class Torchish(bls.Worker):
    """A worker that loads torch (a stand-in) in its setup, as bls.models' do."""

    torch = FakeTorch()

    async def setup(self) -> None:
        import sys

        sys.modules["torch"] = self.torch  # type: ignore[assignment]

    async def __call__(self, req: str) -> str:
        return req


async def test_torchs_vector_math_is_set_up_once_before_a_stages_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MKL's vector math, set up lazily by two threads at once, now and then answers a
    process's first call with other bits (bls.mathlibs): a stage's start makes one small
    call first, once a process, even when torch comes with a worker's setup."""
    import sys

    from bls import mathlibs

    monkeypatch.setattr(mathlibs, "_settled", False)
    monkeypatch.setattr(Torchish, "torch", FakeTorch())
    monkeypatch.setitem(sys.modules, "torch", None)  # (not loaded; undone after the test)
    for name in ("a", "b"):
        binding = InlineBinding(name, Torchish)
        await binding.open()
        await binding.start()
        await binding.aclose()
    assert Torchish.torch.calls == [("tanh", (8, "cpu"))]  # (not a default device's: CUDA)
