"""Hostile peers and clients against real processes: frames that used to kill or bloat a
worker, callers that stall, clients that trickle, values beyond what the wire carries."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import bls
from bls.transport import wire
from bls.transport.wire import Header, Kind

from .cli import run_bls
from .procs import serving, wait_for, worker
from .rawio import http_response, recv_frames

HERE = "tests/e2e/hardening"
STAGES = f"{HERE}/stages.py"
KEEP = f"{HERE}/keep.py"


class RawPeer:
    """A DEALER driven by hand: any frame out, replies matched to their call ids."""

    def __init__(self, address: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        hello = wire.encode_hello(wire.Hello(wire.PROTOCOL, ""))
        self.sock.send_multipart([wire.encode_header(Header(kind=Kind.HELLO)), hello])
        self.answers: dict[int, tuple[int, list[bytes]]] = {}
        self.info = wire.decode_info(self._next(Kind.HELLO)[1][0])

    def _next(self, kind: int | None = None, timeout: float = 10) -> tuple[Header, list[bytes]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                frames = recv_frames(self.sock)
                parsed = wire.parse(frames)
                assert parsed is not None, frames
                header, rest = parsed
                if kind is None or header.kind == kind:
                    return header, list(rest)
        raise AssertionError(f"no frame of kind {kind} within {timeout}s")

    def send(self, header: Header, *body: bytes) -> None:
        self.sock.send_multipart([wire.encode_header(header), *(body or (b"",))])

    def call(self, call_id: int, payload: bytes, **fields: Any) -> None:
        fields.setdefault("to", self.info.instance)
        self.send(Header(kind=Kind.CALL, call=call_id, **fields), payload)

    def answer(self, call_id: int, timeout: float = 10) -> tuple[int, list[bytes]]:
        """The final frame (END or ERROR) of ``call_id``."""
        deadline = time.monotonic() + timeout
        while call_id not in self.answers:
            header, rest = self._next(timeout=max(deadline - time.monotonic(), 0.01))
            if header.kind in (Kind.END, Kind.ERROR):
                self.answers[header.call] = (header.kind, rest)
        return self.answers.pop(call_id)

    def error(self, call_id: int) -> wire.ErrorInfo:
        kind, rest = self.answer(call_id)
        assert kind == Kind.ERROR
        return wire.decode_error(rest[0])

    def close(self) -> None:
        self.sock.close(linger=0)


@contextmanager
def raw_peer(address: str) -> Iterator[RawPeer]:
    peer = RawPeer(address)
    try:
        yield peer
    finally:
        peer.close()


def _payload(value: Any) -> bytes:
    return msgspec.msgpack.encode({"value": value})


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def loaded(pid: int, library: str) -> bool:
    return library in Path(f"/proc/{pid}/maps").read_text()


# -- frames -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_deadlines_that_are_not_times_are_answered_and_the_worker_lives(backend: str) -> None:
    with worker(f"{STAGES}:keep", "--backend", backend) as proc, raw_peer(proc.address) as peer:
        for call_id, deadline in enumerate([math.nan, math.inf, -math.inf, -1.0, 1e300], 1):
            peer.call(call_id, _payload("x"), deadline=deadline)
            error = peer.error(call_id)
            assert error.kind == "bad_frame" and "is not a time" in error.message
        peer.call(99, _payload("fine"), deadline=time.time() + 5)
        kind, rest = peer.answer(99)
        assert kind == Kind.END and msgspec.msgpack.decode(rest[0]) == {"value": "fine"}
        assert proc.popen.poll() is None


def test_a_call_whose_payload_cannot_be_decoded_is_always_answered() -> None:
    deep = b"\x81\xa5value" + b"\x91" * 5000 + b"\xc0"  # {"value": [[[...]]]}
    ext = msgspec.msgpack.encode({"value": msgspec.msgpack.Ext(7, b"")})
    meta = msgspec.msgpack.encode(("<f4", [2], -1, b"\x00" * 8))
    array = msgspec.msgpack.encode({"value": msgspec.msgpack.Ext(1, meta)})
    tensor = msgspec.msgpack.encode({"value": msgspec.msgpack.Ext(2, meta)})
    with worker(f"{STAGES}:keep") as proc, raw_peer(proc.address) as peer:
        for call_id, payload in enumerate([deep, ext, array, tensor, b"\xc1", b""], 1):
            peer.call(call_id, payload)
            error = peer.error(call_id)
            assert error.kind == "invalid_request", error
        assert "does not use torch" in _error_of(peer, tensor).message
        assert "does not use numpy" in _error_of(peer, array).message
        # What a peer sent never made the worker load a heavy module.
        assert not loaded(proc.pid, "libtorch") and not loaded(proc.pid, "numpy")
        assert proc.popen.poll() is None


_ids = itertools.count(1000)


def _error_of(peer: RawPeer, payload: bytes) -> wire.ErrorInfo:
    call_id = next(_ids)
    peer.call(call_id, payload)
    return peer.error(call_id)


def test_a_huge_credit_is_refused_and_a_peer_that_never_reads_cannot_grow_the_worker() -> None:
    with worker(f"{STAGES}:flood") as proc:
        with raw_peer(proc.address) as peer:
            peer.call(1, msgspec.msgpack.encode({"size": 1024}), count=2**62)
            assert peer.error(1).kind == "bad_frame"
        before = rss_mb(proc.pid)
        with raw_peer(proc.address) as hog:  # from here on it never reads
            for call_id in range(1, 201):
                hog.call(call_id, msgspec.msgpack.encode({"size": 1024}), count=wire.MAX_CREDIT)
            hello = wire.encode_hello(wire.Hello(wire.PROTOCOL, ""))
            for _ in range(100_000):
                hog.send(Header(kind=Kind.HELLO), hello)
            wait_for(lambda: "the caller stopped reading its replies" in proc.log(), timeout=30)
            grown = rss_mb(proc.pid) - before
        print(f"worker RSS {before:.0f} MB before a never-reading peer, +{grown:.0f} MB during")
        assert grown < 150, f"the worker grew by {grown:.0f} MB"

        async def still_serves() -> list[bytes]:
            async with bls.Runtime({"flood": proc.address}):
                got = []
                async with bls.stage.stream("flood", {"size": 8}) as items:
                    async for item in items:
                        got.append(item)
                        if len(got) == 3:
                            break
                return got

        assert anyio.run(still_serves) == [b"x" * 8] * 3


# -- fuzz: every decodable call is answered, the worker survives ------------------------

FUZZ_EXAMPLES = int(os.environ.get("BLS_FUZZ_EXAMPLES", "1500"))
_values = st.recursive(
    st.none() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8), st.lists, max_leaves=8
)
_floats = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 1e300]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(0.0),
    st.floats(min_value=0, max_value=4e9),
)


def test_fuzzed_frames_never_kill_the_worker_and_every_call_is_answered() -> None:
    with worker(f"{STAGES}:keep") as proc, raw_peer(proc.address) as peer:
        calls = itertools.count(1)
        frames = 0

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=[Phase.generate],  # report the very frame that broke it, unshrunk
        )
        @given(
            kind=st.one_of(st.just(Kind.CALL), st.integers(-3, 12)),  # calls, mostly
            deadline=_floats,
            count=st.one_of(st.integers(-(2**63), 2**64 - 1), st.integers(-2, 2000)),
            payload=st.one_of(st.builds(_payload, _values), st.binary(max_size=64)),
            junk=st.lists(st.binary(max_size=16), max_size=3),
            stranger=st.booleans(),
        )
        def example(
            kind: int,
            deadline: float,
            count: int,
            payload: bytes,
            junk: list[bytes],
            stranger: bool,
        ) -> None:
            nonlocal frames
            assert proc.popen.poll() is None, "the previous example killed the worker"
            call_id = next(calls)
            to = "someone-else" if stranger else peer.info.instance
            header = Header(kind=kind, call=call_id, deadline=deadline, count=count, to=to)
            peer.send(header, payload, *junk)
            if junk:  # and a frame that is no message at all
                peer.sock.send_multipart(junk)
                frames += 1
            frames += 1
            if kind == Kind.CALL:  # a call with a decodable header: always answered
                final, _ = peer.answer(call_id)
                assert final in (Kind.END, Kind.ERROR)

        example()
        print(f"{frames} fuzzed frames; the worker is alive and answered every call")
        assert proc.popen.poll() is None
        peer.call(next(calls), _payload("after the fuzz"))
        assert peer.answer(next(calls) - 1)[0] == Kind.END


# -- a flood of mixed bad frames, then a new client --------------------------------------

_call_ids = st.one_of(st.integers(1, 64), st.sampled_from([0, 2**63 - 1, 2**62]))


@st.composite
def _bad_frame(draw: st.DrawFn, instance: str) -> list[bytes]:
    """One message of the kinds a hostile or broken peer sends, now and then a good call."""
    call = _call_ids.map(lambda i: Header(kind=Kind.CALL, call=i, to=instance))
    return draw(
        st.one_of(
            st.lists(st.binary(max_size=40), min_size=1, max_size=4),  # random frames
            st.just([b""]),  # empty and single frames
            st.binary(min_size=1, max_size=8).map(lambda b: [b]),
            st.tuples(call, st.integers(1, 5)).map(  # truncated headers
                lambda c: [wire.encode_header(c[0])[: c[1]], _payload(1)]
            ),
            st.just([msgspec.msgpack.encode(["x", "y", 3]), _payload(1)]),  # wrongly typed
            st.tuples(st.sampled_from([0, 10, 99, -1, 2**40]), _call_ids).map(  # unknown kinds
                lambda k: [wire.encode_header(Header(kind=k[0], call=k[1])), _payload(1)]
            ),
            st.tuples(call, st.binary(max_size=12)).map(  # calls with bad payloads
                lambda c: [wire.encode_header(c[0]), c[1]]
            ),
            _call_ids.map(  # calls to another instance
                lambda i: [wire.encode_header(Header(kind=Kind.CALL, call=i, to="x")), _payload(1)]
            ),
            st.tuples(
                st.sampled_from([Kind.CANCEL, Kind.CREDIT]), _call_ids, st.integers(0, 1024)
            ).map(lambda c: [wire.encode_header(Header(kind=c[0], call=c[1], count=c[2])), b""]),
            st.binary(max_size=8).map(  # bad hellos
                lambda b: [wire.encode_header(Header(kind=Kind.HELLO)), b]
            ),
            st.just([wire.encode_header(Header(kind=Kind.HEARTBEAT)), b""]),
            call.map(lambda c: [wire.encode_header(c), _payload("ok")]),  # good calls
        )
    )


def _still_serves(address: str) -> None:
    """A brand-new client gets its hello and a call answered."""
    with raw_peer(address) as fresh:
        fresh.call(1, _payload("after"))
        kind, rest = fresh.answer(1, timeout=10)
        assert kind == Kind.END and msgspec.msgpack.decode(rest[0]) == {"value": "after"}


# Frames in all, over the examples; a long run: BLS_FUZZ_EXAMPLES=100000.
MIXED_FRAMES = max(6000, FUZZ_EXAMPLES)


@pytest.mark.timeout(max(300, MIXED_FRAMES // 50))  # a long run takes its time
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_flood_of_mixed_bad_frames_leaves_the_worker_reading_for_new_clients(
    backend: str,
) -> None:
    """A peer sends bursts of every kind of bad frame among good calls, reading replies
    now and then, and goes away with calls in flight; after each burst a new client must
    get its hello and a call answered (a worker once stopped reading for good)."""
    with worker(f"{STAGES}:keep", "--backend", backend, "--traceback") as proc:
        instance = RawPeer(proc.address)
        instance.close()
        sent = 0

        @settings(
            max_examples=max(MIXED_FRAMES // 250, 1),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            phases=[Phase.generate],
        )
        @given(burst=st.lists(_bad_frame(instance.info.instance), min_size=400, max_size=600))
        def example(burst: list[list[bytes]]) -> None:
            nonlocal sent
            peer = zmq.Context.instance().socket(zmq.DEALER)
            peer.setsockopt(zmq.LINGER, 0)
            peer.setsockopt(zmq.SNDTIMEO, 10_000)  # a worker that stopped reading: fail
            peer.connect(proc.address)
            try:
                for i, frames in enumerate(burst, 1):
                    peer.send_multipart(frames)
                    if i % 50 == 0:
                        while peer.poll(0):
                            peer.recv_multipart()
                peer.send_multipart([wire.encode_header(Header(kind=Kind.HEARTBEAT)), b""])
                answered = peer.poll(10_000)
                assert answered, (
                    f"no answer to a heartbeat; the worker's log:\n{proc.log()[-3000:]}"
                )
            finally:
                peer.close(linger=0)  # gone, with calls in flight
            sent += len(burst)
            assert proc.popen.poll() is None, "the worker died"
            _still_serves(proc.address)

        example()
        print(f"{sent} mixed frames; the worker still reads and serves new clients")
        assert sent >= MIXED_FRAMES * 0.9
        proc.signal(signal.SIGTERM)
        proc.wait()
        assert proc.stats()["read_stalls"] == 0  # the watchdog never had to step in


# -- callers that stall -----------------------------------------------------------------


def _stall(worker_address: str, seconds: float, block: float) -> Any:
    """``bls run`` of an entry whose remote call takes ``seconds`` while its own event
    loop is blocked for ``block`` seconds."""
    return run_bls(
        "run",
        KEEP,
        "--entry",
        "stall",
        "--input",
        json.dumps({"seconds": seconds, "block": block}),
        "--bind",
        f"sleep={worker_address}",
        timeout=60,
    )


def test_a_caller_whose_event_loop_stalls_10s_keeps_its_remote_call() -> None:
    with worker(f"{STAGES}:sleep") as proc:
        out = _stall(proc.address, seconds=11.5, block=10.5)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"value": "slept"}


def test_a_caller_silent_past_the_workers_bound_is_told_what_happened(tmp_path: Path) -> None:
    config = tmp_path / "short.toml"
    config.write_text("[transport]\ncaller_dead_after_s = 1.0\n")
    with worker(f"{STAGES}:sleep", "--config", str(config)) as proc:
        out = _stall(proc.address, seconds=6, block=3)
    assert out.returncode == 1
    assert "heard nothing from the caller for 1s and presumed it dead" in out.stderr
    assert "cancelled by the caller" not in out.stderr


# -- HTTP intake ------------------------------------------------------------------------


def test_values_beyond_the_wires_limits_get_the_same_422_inline_and_remote() -> None:
    deep = "[" * 150 + "]" * 150
    deeper = "[" * 5000 + "]" * 5000
    bodies = [
        '{"value": 1180591620717411303424}',  # 2**70
        '{"value": [1, {"a": -9223372036854775809}]}',  # -2**63 - 1
        '{"value": ' + deep + "}",
        '{"value": ' + deeper + "}",
        '{"value": [18446744073709551615, -9223372036854775808]}',  # the extremes: fine
    ]
    answers: dict[str, list[tuple[int, Any]]] = {}
    with worker(f"{STAGES}:keep") as keep:
        for mode, extra in (("inline", []), ("remote", ["--bind", f"keep={keep.address}"])):
            with serving(KEEP, *extra) as server:
                answers[mode] = [
                    _post(f"{server.address}/v1/scripts/keep", body) for body in bodies
                ]
    assert answers["inline"] == answers["remote"]
    statuses = [status for status, _ in answers["inline"]]
    assert statuses == [422, 422, 422, 422, 200]
    paths = [body["error"]["path"] for _, body in answers["inline"][:3]]
    assert paths == ["$.value", "$.value[1].a", "$.value" + "[0]" * 99]


def _post(url: str, body: str) -> tuple[int, Any]:
    r = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=30)
    return r.status_code, r.json()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_body_that_stalls_gets_408_and_frees_its_admission_slot(backend: str) -> None:
    with serving(KEEP, "--max-inflight", "2", "--body-timeout", "1", backend=backend) as server:
        url = urlsplit(server.address)
        trickles = []
        for _ in range(2):  # all the slots: headers, then part of a body, then nothing
            sock = socket.create_connection((url.hostname, url.port), timeout=30)
            sock.sendall(
                b"POST /v1/scripts/keep HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"value":'
            )
            trickles.append(sock)
        try:
            for sock in trickles:
                answer = http_response(sock)
                assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
                assert b"did not arrive within 1s" in answer
            ok = httpx.post(f"{server.address}/v1/scripts/keep", json={"value": 1}, timeout=10)
            assert ok.status_code == 200 and ok.json() == {"value": 1}
        finally:
            for sock in trickles:
                sock.close()


# -- a request's head: bounded, whatever the client sends ----------------------------------


def _send_head(address: str, head: bytes, timeout: float = 30) -> bytes:
    """Send ``head`` (in pieces, as a slow big client would) and read the answer until the
    server closes; what it answered."""
    url = urlsplit(address)
    with socket.create_connection((url.hostname, url.port), timeout=timeout) as sock:
        try:
            for i in range(0, len(head), 1 << 20):
                sock.sendall(head[i : i + (1 << 20)])
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed before all of it went
        data = b""
        sock.settimeout(timeout)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
        return data


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_heads_over_the_bounds_get_431_and_414_and_the_memory_comes_back(backend: str) -> None:
    with serving(KEEP, backend=backend) as server:
        body = b'{"value": 1}'
        post = b"POST /v1/scripts/keep HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n"
        ok = _send_head(server.address, post + b"X-Big: " + b"a" * 15_000 + b"\r\n"
                        b"Connection: close\r\n\r\n" + body)  # fmt: skip
        assert ok.startswith(b"HTTP/1.1 200"), ok[:200]
        before = rss_mb(server.pid)
        for _ in range(4):
            huge = post + b"X-Big: " + b"a" * (48 << 20) + b"\r\n\r\n" + body
            answer = _send_head(server.address, huge)
            assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:200]
            assert answer.endswith(b"the request's headers are over the 16384-byte limit")
        many = post + b"".join(b"X-%d: v\r\n" % i for i in range(5000)) + b"\r\n" + body
        assert _send_head(server.address, many).startswith(b"HTTP/1.1 431")
        long_url = b"GET /" + b"u" * (64 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
        answer = _send_head(server.address, long_url)
        assert answer.startswith(b"HTTP/1.1 414 Request-URI Too Long"), answer[:200]
        assert answer.endswith(b"the URL is over the 8192-byte limit")
        # A new client is served, and what the big heads took is back.
        again = httpx.post(f"{server.address}/v1/scripts/keep", json={"value": 2}, timeout=10)
        assert again.status_code == 200
        assert rss_mb(server.pid) - before < 20


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_header_bound_is_a_flag(backend: str) -> None:
    with serving(KEEP, "--max-header-bytes", "65536", backend=backend) as server:
        headers = {"x-big": "a" * 40_000}
        got = httpx.post(f"{server.address}/v1/scripts/keep", json={"value": 1}, headers=headers)
        assert got.status_code == 200


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_path_cannot_write_a_line_of_its_own_into_the_log(backend: str) -> None:
    with serving(KEEP, backend=backend) as server:
        forged = "/v1/scripts/keep%0D%0A2026-01-01 00:00:00,000 INFO bls.access: forged%1B[31m"
        got = httpx.post(f"{server.address}{forged}", json={"value": 1}, timeout=10)
        assert got.status_code == 404
        wait_for(lambda: "forged" in server.log())
    lines = [line for line in server.log().splitlines() if "forged" in line]
    assert len(lines) == 1 and "bls.access" in lines[0].split("INFO", 1)[1][:12]
    assert "\\r\\n2026-01-01" in lines[0] and "\\x1b[31m" in lines[0]


def test_a_bad_header_value_is_quoted_short_in_the_answer() -> None:
    with serving(KEEP) as server:
        for name in ("x-priority", "x-request-timeout"):
            got = httpx.post(
                f"{server.address}/v1/scripts/keep",
                json={"value": 1},
                headers={name: "9" * 10_000 + "x"},
                timeout=10,
            )
            error = got.json()["error"]
            assert got.status_code == 400 and len(error["message"]) < 200, error["message"]
            assert error["message"].endswith("(10001 bytes)")


def test_a_caller_whose_hello_was_refused_has_its_calls_refused() -> None:
    with worker(f"{STAGES}:keep", "--stage", "keep") as proc, raw_peer(proc.address) as peer:
        old = wire.encode_hello(wire.Hello(1, "keep"))  # a caller of protocol 1
        peer.send(Header(kind=Kind.HELLO), old)
        info = wire.decode_info(peer._next(Kind.HELLO)[1][0])
        assert info.error.startswith("protocol mismatch: the worker speaks bls wire protocol 2")
        peer.call(1, _payload("x"))
        error = peer.error(1)
        assert error.kind == "unavailable"
        assert error.message.startswith("the worker refused this caller: protocol mismatch")
        peer.send(Header(kind=Kind.HELLO), wire.encode_hello(wire.Hello(wire.PROTOCOL, "keep")))
        assert not wire.decode_info(peer._next(Kind.HELLO)[1][0]).error
        peer.call(2, _payload("y"))  # taken again once its hello is
        kind, rest = peer.answer(2)
        assert kind == Kind.END and msgspec.msgpack.decode(rest[0]) == {"value": "y"}
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    assert proc.stats()["completed"] == 1  # the refused call never ran


def test_a_stage_whose_worker_refused_the_caller_says_so_in_the_503(tmp_path: Path) -> None:
    with worker(f"{STAGES}:keep", "--stage", "other") as proc:
        with serving(KEEP, "--bind", f"keep={proc.address}") as server:
            got = httpx.post(f"{server.address}/v1/scripts/keep", json={"value": 1}, timeout=10)
            ready = httpx.get(f"{server.address}/ready", timeout=10)
    assert got.status_code == 503 and ready.status_code == 503
    message = got.json()["error"]["message"]
    assert "refused: this worker serves stage 'other', not 'keep'" in message, message
    assert "not connected yet" not in message
