"""The frontend in process: a drain that runs out."""

from __future__ import annotations

import threading

import anyio
import httpx
from test_metrics import _value

import bls
from bls.runtime import Runtime
from bls.serve.app import Frontend
from bls.serve.intake import request_id

started = threading.Event()
finally_ran: list[bool] = []


class Nap(bls.Message):
    seconds: float


@bls.script
async def nap(req: Nap) -> Nap:
    started.set()
    try:
        await anyio.sleep(req.seconds)
    finally:
        finally_ran.append(True)
    return req


def test_a_drain_that_runs_out_answers_503_and_counts_a_shutdown() -> None:
    """The frontend in process, over httpx's ASGI transport: a request still running when
    the grace period ends is cancelled, answered 503, and counted as a shutdown."""
    started.clear()
    finally_ran.clear()

    async def main() -> None:
        async with Runtime({}) as runtime:
            frontend = Frontend({"nap": nap}, runtime)
            transport = httpx.ASGITransport(app=frontend)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://bls") as client:
                answers: list[httpx.Response] = []

                async def ask() -> None:
                    answers.append(await client.post("/v1/scripts/nap", json={"seconds": 60}))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask)
                    await anyio.to_thread.run_sync(lambda: started.wait(10))
                    assert not await frontend.drain(0.05)
                assert answers[0].status_code == 503
                assert answers[0].json()["error"]["type"] == "draining"
                late = await client.post("/v1/scripts/nap", json={"seconds": 0})
                assert late.status_code == 503
                metrics = (await client.get("/metrics")).text
        assert finally_ran == [True]
        assert _value(metrics, "bls_cancellations_total", reason="shutdown") == 1
        assert _value(metrics, "bls_requests_in_flight") == 0

    async def bounded() -> None:
        with anyio.fail_after(20):
            await main()

    anyio.run(bounded)


def test_a_request_id_that_cannot_be_echoed_as_it_is_gets_a_new_one() -> None:
    """The answer's head carries the id as it is: only printable ASCII up to 128
    characters is taken (a control character would make the head invalid)."""
    assert request_id(b"abc-123 x") == b"abc-123 x"
    for bad in (b"a\tb", b"a\x7fb", b"a\x00b", b"x" * 129, "é".encode()):
        new = request_id(bad)
        assert new != bad and new.isascii() and new.decode().isprintable()
