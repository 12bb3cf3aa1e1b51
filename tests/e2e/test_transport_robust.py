"""Bad input never crashes a worker: fuzzed frames, garbage over a real socket."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bls
from bls import stage
from bls.bindings import InlineBinding
from bls.transport import wire
from bls.transport.worker_server import WorkerServer

from .rawio import recv_frames


class Ping(bls.Message):
    text: str


async def echo(req: Ping) -> Ping:
    return req


@pytest.mark.anyio
async def test_fuzzed_frames_never_escape_the_receive_loop(tmp_path: Path) -> None:
    """Random frames, and junk behind valid headers of every kind, over a real socket:
    each is dropped and counted, and the worker answers a real call afterwards."""
    server = WorkerServer(InlineBinding("echo", echo), f"ipc://{tmp_path}/fuzz.sock", stage="echo")
    async with anyio.create_task_group() as tg:
        address = await tg.start(server.serve)
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(address)

        @settings(
            max_examples=400,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture],
        )
        @given(
            st.lists(st.binary(max_size=48), min_size=1, max_size=6), st.sampled_from(range(1, 12))
        )
        def feed(parts: list[bytes], kind: int) -> None:
            raw.send_multipart(parts)  # random junk
            header = wire.encode_header(wire.Header(kind=kind, call=len(parts)))
            raw.send_multipart([header, *parts])  # a valid header, junk behind it

        try:
            feed()
            # The peer's frames arrive in order: once a hello is answered, all are read.
            hello = wire.encode_hello(wire.Hello(wire.PROTOCOL, "echo"))
            raw.send_multipart([wire.encode_header(wire.Header(kind=wire.Kind.HELLO)), hello])
            while True:
                parsed = wire.parse(await anyio.to_thread.run_sync(recv_frames, raw))
                if parsed is not None and parsed[0].kind == wire.Kind.HELLO:
                    break
        finally:
            raw.close(linger=0)
        assert server.stats.dropped > 0
        async with bls.Runtime({"echo": address}):
            assert await stage("echo", Ping(text="still serving")) == Ping(text="still serving")
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_garbage_over_a_real_socket_is_dropped_and_counted(tmp_path: Path) -> None:
    server = WorkerServer(
        InlineBinding("echo", echo),
        f"ipc://{tmp_path}/junk.sock",
        stage="echo",
        max_frame_bytes=4096,
    )
    async with anyio.create_task_group() as tg:
        address = await tg.start(server.serve)
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(address)
        try:
            raw.send_multipart([b"not msgpack at all", b""])
            raw.send_multipart([b"\x92"])  # truncated, and too few frames
            cancel = wire.Header(kind=wire.Kind.CANCEL, call=12345)
            raw.send_multipart([wire.encode_header(cancel), b""])  # unknown call id
            raw.send_multipart([wire.encode_header(wire.Header(kind=99)), b""])  # unknown kind
            # A hello from a future protocol version: refused, naming both versions.
            hello = wire.encode_hello(wire.Hello(protocol=99, stage="echo"))
            raw.send_multipart([wire.encode_header(wire.Header(kind=wire.Kind.HELLO)), hello])
            deadline = time.monotonic() + 5
            info = None
            while time.monotonic() < deadline:
                if raw.poll(10):
                    parsed = wire.parse(raw.recv_multipart())
                    assert parsed is not None
                    if parsed[0].kind == wire.Kind.HELLO:
                        info = wire.decode_info(parsed[1][0])
                        break
                await anyio.sleep(0.01)
            assert info is not None
            assert f"protocol {wire.PROTOCOL}" in info.error and "caller 99" in info.error
            # The hello came after the four bad frames, on the same connection: all read.
            assert server.stats.dropped >= 4
            # An over-size frame closes that peer's connection, not the worker.
            raw.send_multipart([b"x" * 10_000])
        finally:
            raw.close(linger=0)
        async with bls.Runtime({"echo": address}):
            assert (await stage("echo", {"text": "ok"})).text == "ok"
            with pytest.raises(bls.StageError) as info_err:
                await stage("echo", {"text": "y" * 10_000})
            assert info_err.value.kind in ("too_large", "unavailable")
        tg.cancel_scope.cancel()
