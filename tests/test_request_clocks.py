"""A request's clocks (bls/serve/intake.py `Clocks`), on both backends, driving the
frontend's ASGI app directly: the server's deadline (504), a body that stalls (408, its
bound counted from the request's slot when it queued), and a client that leaves once its
body is in (the script is cancelled, nothing is answered)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import pytest

import bls
from bls.config import AdmissionConfig
from bls.runtime import Runtime
from bls.serve.app import Frontend
from bls.serve.intake import Limits

pytestmark = pytest.mark.anyio

cancelled: list[str] = []
running: dict[str, anyio.Event] = {}  # set as the script named so starts


class Nap(bls.Message):
    seconds: float
    name: str = ""


@bls.script
async def nap(req: Nap) -> Nap:
    if req.name in running:
        running[req.name].set()
    try:
        await anyio.sleep(req.seconds)
    except anyio.get_cancelled_exc_class():
        cancelled.append(req.name)
        raise
    return req


Receive = Callable[[], Awaitable[dict[str, Any]]]


def _client(req: Nap, leaves: anyio.Event | None = None) -> Receive:
    """A client that sends ``req`` at once, then stays (or goes away once ``leaves`` is
    set)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": msgspec.json.encode(req)}
        if leaves is None:
            await anyio.sleep_forever()
        else:
            await leaves.wait()
        return {"type": "http.disconnect"}

    return receive


def _stalled() -> Receive:
    """A client whose body never comes."""

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError

    return receive


async def _ask(frontend: Frontend, receive: Receive) -> tuple[int, dict[str, Any], float]:
    """(status, JSON body, seconds) of one request to ``nap``; status 0: no answer."""
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/scripts/nap", "headers": []}
    began = time.monotonic()
    with anyio.fail_after(10):  # (never hangs: every request ends with an answer or not)
        await frontend(scope, receive, send)
    took = time.monotonic() - began
    if not messages:
        return 0, {}, took
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return messages[0]["status"], msgspec.json.decode(body), took


async def test_the_servers_deadline_ends_a_request_with_504_on_time() -> None:
    async with Runtime({}) as runtime:
        frontend = Frontend({"nap": nap}, runtime, limits=Limits(request_timeout=0.3))
        status, body, took = await _ask(frontend, _client(Nap(seconds=30, name="late")))
        assert (status, body["error"]["type"]) == (504, "deadline_exceeded")
        assert 0.3 <= took < 5
        assert "late" in cancelled
        # One that ends in time is answered, also right after.
        status, body, _ = await _ask(frontend, _client(Nap(seconds=0)))
        assert status == 200


async def test_a_stalled_body_gets_408_counted_from_the_requests_slot() -> None:
    limits = Limits(body_timeout=0.3, max_inflight=1)
    async with Runtime({}) as runtime:
        frontend = Frontend(
            {"nap": nap}, runtime, limits=limits, admission=AdmissionConfig(max_queued=1)
        )
        answers: dict[str, tuple[int, dict[str, Any], float]] = {}

        async def first() -> None:
            answers["first"] = await _ask(frontend, _client(Nap(seconds=0.6, name="first")))

        async def second() -> None:
            answers["second"] = await _ask(frontend, _stalled())

        running["first"] = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            with anyio.fail_after(5):
                await running["first"].wait()
            tg.start_soon(second)
        assert answers["first"][0] == 200
        status, body, took = answers["second"]
        assert (status, body["error"]["type"]) == (408, "body_timeout")
        # It waited for its slot (the first's 0.6 s), then 0.3 s for a body.
        assert took >= 0.6 + 0.3 - 0.05, took
        assert frontend.inflight == 0 and frontend.admission.queued == 0


async def test_a_client_that_leaves_after_its_body_cancels_the_script() -> None:
    async with Runtime({}) as runtime:
        frontend = Frontend({"nap": nap}, runtime)
        left = anyio.Event()
        answer: list[tuple[int, dict[str, Any], float]] = []

        async def ask() -> None:
            answer.append(await _ask(frontend, _client(Nap(seconds=30, name="gone"), left)))

        running["gone"] = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            with anyio.fail_after(5):
                await running["gone"].wait()
            left.set()  # (seen by its watcher, which starts once it has run 2 ms)
        status, _, took = answer[0]
        assert status == 0  # nobody to answer
        assert took < 5
        assert "gone" in cancelled
        metrics = frontend.metrics.render().decode()
        assert 'bls_cancellations_total{reason="disconnect"} 1.0' in metrics
