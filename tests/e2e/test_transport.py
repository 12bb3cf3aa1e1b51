"""Remote stages over real ZeroMQ sockets to real `bls worker` processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import bls
from bls import stage
from bls.runtime import StageStream
from bls.transport import stream as transport_stream

from .cli import BLS, ROOT, run_bls
from .procs import wait_for, worker
from .rawio import recv_frames

sys.path.insert(0, str(ROOT / "tests/e2e/pipelines"))
from remote_stages import Mark, Served

STAGES = "tests/e2e/pipelines/remote_stages.py"
REVIEW = "tests/e2e/pipelines/review.py"
REVIEW_STAGES = "tests/e2e/pipelines/review_stages.py"


def _addr(kind: str, tmp_path: Path, name: str) -> str:
    return f"ipc://{tmp_path}/{name}.sock" if kind == "ipc" else "tcp://127.0.0.1:0"


# -- the invariant: same results inline and remote ------------------------------------


@pytest.mark.parametrize("kind", ["tcp", "ipc"])
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_hello_example_remote_equals_inline(kind: str, backend: str, tmp_path: Path) -> None:
    inline = run_bls("run", "examples/hello.py", "--input", '{"text": "hi"}')
    assert inline.returncode == 0, inline.stderr
    with (
        worker(
            "examples/hello_stages.py:judge",
            listen=_addr(kind, tmp_path, "j"),
        ) as judge,
        worker("examples/hello_stages.py:draft", listen=_addr(kind, tmp_path, "d")) as draft,
    ):
        remote = run_bls(
            "run",
            "examples/hello.py",
            "--input",
            '{"text": "hi"}',
            "--backend",
            backend,
            "--bind",
            f"judge={judge.address}",
            "--bind",
            f"draft={draft.address}",
        )
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == inline.stdout


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_every_primitive_remote_equals_inline(backend: str) -> None:
    request = json.dumps({"words": ["aab", "abcd", "xyz"], "rounds": 3, "patience": 0.05})
    inline = run_bls("run", REVIEW, "--entry", "review", "--input", request)
    assert inline.returncode == 0, inline.stderr
    with (
        worker(f"{REVIEW_STAGES}:score") as score,
        worker(f"{REVIEW_STAGES}:slow_echo") as slow,
        worker(f"{REVIEW_STAGES}:fast_echo") as fast,
        worker(f"{REVIEW_STAGES}:letters") as letters,
    ):
        binds = [
            "--bind",
            f"score={score.address}",
            "--bind",
            f"slow_echo={slow.address}",
            "--bind",
            f"fast_echo={fast.address}",
            "--bind",
            f"letters={letters.address}",
        ]
        remote = run_bls(
            "run", REVIEW, "--entry", "review", "--input", request, "--backend", backend, *binds
        )
        streamed = run_bls(
            "run", REVIEW, "--entry", "spell", "--input", '{"words": ["ab"]}', *binds
        )
        # The race loser and the timed-out call were cancelled inside the worker.
        slow.signal(signal.SIGTERM)
        assert slow.wait() == 0
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == inline.stdout
    assert streamed.stdout.splitlines() == ['"a"', '"b"']
    stats = slow.stats()
    assert stats["cancelled"] + stats["deadline"] == 2 and stats["completed"] == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_errors_are_the_same_remote_and_inline(backend: str) -> None:
    inline_bad = run_bls(
        "run",
        REVIEW,
        "--entry",
        "review",
        "--input",
        '{"words": ["a"]}',
        "--bind",
        f"score={REVIEW_STAGES}:broken",
    )
    with worker(f"{REVIEW_STAGES}:broken") as broken:
        remote_bad = run_bls(
            "run",
            REVIEW,
            "--entry",
            "review",
            "--input",
            '{"words": ["a"]}',
            "--bind",
            f"score={broken.address}",
            "--backend",
            backend,
        )
    assert inline_bad.returncode == remote_bad.returncode == 1
    assert remote_bad.stderr == inline_bad.stderr
    assert "stage 'score' failed (ZeroDivisionError): no score for a" in remote_bad.stderr


# -- in-process caller, real worker processes -----------------------------------------


@pytest.mark.anyio
async def test_remote_types_errors_and_traceback() -> None:
    with worker(f"{STAGES}:boom") as boom, worker(f"{STAGES}:whoami") as who:
        async with bls.Runtime({"boom": boom.address, "who": who.address}):
            served = await stage("who", Mark())
            assert isinstance(served, Served) and served.pid == who.pid  # the worker's type
            with pytest.raises(bls.StageError) as info:
                await stage("boom", Mark(marker="m"))
            assert (info.value.stage, info.value.kind) == ("boom", "ValueError")
            assert "bad marker 'm'" in info.value.message
            assert info.value.remote_traceback and "remote_stages.py" in info.value.remote_traceback
            with pytest.raises(bls.InvalidRequest) as bad:
                await stage("who", {"seconds": "soon"})
            assert bad.value.path == "$.seconds" and bad.value.stage == "who"


@pytest.mark.anyio
async def test_timeout_mid_stream_cancels_the_remote_handler(tmp_path: Path) -> None:
    marker = tmp_path / "ticks"
    with worker(f"{STAGES}:ticks") as proc:
        async with bls.Runtime({"ticks": proc.address}) as rt:
            got = []
            with pytest.raises(bls.DeadlineExceeded):
                async with bls.timeout(0.3):
                    async for i in stage.stream("ticks", Mark(marker=str(marker), seconds=0.01)):
                        got.append(i)
            t_cancel = time.time()
            assert len(got) > 3
            await anyio.to_thread.run_sync(lambda: wait_for(marker.exists, timeout=2))
            what, when = marker.read_text().split()
            assert what == "cancelled"
            assert float(when) - t_cancel < 5  # at once, not after its million items
            binding: Any = rt.bindings["ticks"]
            assert [len(c.calls) for c in binding.connections] == [0]  # nothing left behind


@bls.script
async def first_five(req: Mark) -> int:
    async for i in stage.stream("ticks", req):
        if i == 5:
            return i  # leaves the stream open: the request's end closes it
    return -1


@pytest.mark.anyio
async def test_leaving_a_stream_early_cancels_the_remote_handler_when_the_request_ends(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "early"
    with worker(f"{STAGES}:ticks") as proc:
        async with bls.Runtime({"ticks": proc.address}) as rt:
            assert await rt.run(first_five, Mark(marker=str(marker), seconds=0.001)) == 5
            # The request is over: its stream was closed, the worker told to stop.
            await anyio.to_thread.run_sync(lambda: wait_for(marker.exists, timeout=10))
            assert marker.read_text().split()[0] in ("cancelled", "closed")
            second = tmp_path / "block"
            request = Mark(marker=str(second), seconds=0.001)
            async with stage.stream("ticks", request) as items:  # a close point of its own
                async for i in items:
                    if i == 5:
                        break
            await anyio.to_thread.run_sync(lambda: wait_for(second.exists, timeout=10))
            assert second.read_text().split()[0] in ("cancelled", "closed")


def test_worker_stops_at_the_deadline_without_a_cancel_frame(tmp_path: Path) -> None:
    import msgspec
    import zmq

    from bls.transport import wire

    marker = tmp_path / "slow"
    with worker(f"{STAGES}:slow") as proc:
        # A caller that sends its call with a deadline and then nothing, not even a cancel.
        peer = zmq.Context.instance().socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.connect(proc.address)
        try:
            hello = wire.encode_hello(wire.Hello(wire.PROTOCOL, "slow"))
            peer.send_multipart([wire.encode_header(wire.Header(kind=wire.Kind.HELLO)), hello])
            info = wire.decode_info(recv_frames(peer)[1])
            start = time.time()
            header = wire.Header(
                kind=wire.Kind.CALL, call=1, deadline=start + 0.4, to=info.instance
            )
            request = msgspec.msgpack.encode(Mark(marker=str(marker), seconds=30))
            peer.send_multipart([wire.encode_header(header), request])
            wait_for(marker.exists, timeout=3)
            answer = None
            while answer is None and peer.poll(3000):
                parsed = wire.parse(peer.recv_multipart())
                assert parsed is not None
                if parsed[0].kind == wire.Kind.ERROR:
                    answer = wire.decode_error(parsed[1][0])
        finally:
            peer.close(linger=0)
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    what, when = marker.read_text().split()
    assert what == "cancelled"
    assert 0.3 < float(when) - start < 10  # at its 0.4 s deadline, not after its 30 s
    assert answer is not None and answer.kind == "deadline"
    assert proc.stats()["deadline"] == 1 and proc.stats()["cancelled"] == 0


@pytest.mark.anyio
async def test_nested_call_inside_a_worker_inherits_deadline(tmp_path: Path) -> None:
    marker = tmp_path / "inner"
    with worker(f"{STAGES}:slow") as inner:
        with worker(f"{STAGES}:nested", "--bind", f"slow={inner.address}") as outer:
            async with bls.Runtime({"nested": outer.address}):
                with pytest.raises(bls.DeadlineExceeded):
                    async with bls.timeout(0.3):
                        await stage("nested", Mark(marker=str(marker)))
                await anyio.to_thread.run_sync(lambda: wait_for(marker.exists, timeout=3))
    assert marker.read_text().split()[0] == "cancelled"


@pytest.mark.anyio
async def test_sigkill_mid_stream_fails_fast_and_survivor_takes_new_calls(tmp_path: Path) -> None:
    with worker(f"{STAGES}:ticks") as a, worker(f"{STAGES}:ticks") as b:
        async with bls.Runtime({"ticks": f"{a.address},{b.address}"}) as rt:
            binding: Any = rt.bindings["ticks"]
            streams = [stage.stream("ticks", Mark(seconds=0.01)) for _ in range(2)]
            for s in streams:
                await s.__anext__()
            assert {c.address: len(c.calls) for c in binding.connections} == {
                a.address: 1,
                b.address: 1,
            }
            killed_at = time.monotonic()
            a.signal(signal.SIGKILL)
            failed_after: list[float] = []

            async def consume(items: StageStream) -> None:
                async with items:
                    try:
                        async for _ in items:
                            if time.monotonic() - killed_at > 2:
                                return  # the survivor's stream just goes on
                    except bls.StageError as exc:
                        assert exc.kind == "unavailable"
                        failed_after.append(time.monotonic() - killed_at)

            async with anyio.create_task_group() as tg:
                for s in streams:
                    tg.start_soon(consume, s)
            # Noticed from the dropped connection, not the 15 s a silent peer gets.
            assert len(failed_after) == 1 and failed_after[0] < 5
            for _ in range(4):
                async with stage.stream("ticks", Mark(count=1, seconds=0)) as items:
                    assert [i async for i in items] == [0]
            assert sum(len(c.calls) for c in binding.connections) == 0


@pytest.mark.anyio
async def test_unacknowledged_calls_are_retried_on_another_replica() -> None:
    with worker(f"{STAGES}:whoami") as a, worker(f"{STAGES}:whoami") as b:
        async with bls.Runtime({"who": f"{a.address},{b.address}"}):
            a.signal(signal.SIGSTOP)  # alive to TCP, but never acknowledges anything
            try:
                results = await bls.gather(*(stage("who", Mark()) for _ in range(6)))
            finally:
                a.signal(signal.SIGCONT)
    assert {r.pid for r in results} == {b.pid}


@pytest.mark.anyio
async def test_overloaded_worker_refuses_and_caller_tries_another_replica() -> None:
    with worker(f"{STAGES}:slow", "--max-inflight", "1") as a:
        async with bls.Runtime({"slow": a.address}):
            with pytest.raises(bls.StageError) as info:
                await bls.gather(stage("slow", Mark(seconds=0.5)), stage("slow", Mark(seconds=0.5)))
            assert info.value.kind == "overloaded"
        with worker(f"{STAGES}:slow", "--max-inflight", "1") as b:
            async with bls.Runtime({"slow": f"{a.address},{b.address}"}):
                both = await bls.gather(
                    stage("slow", Mark(seconds=0.3)), stage("slow", Mark(seconds=0.3))
                )
            assert {s.pid for s in both} == {a.pid, b.pid}


@pytest.mark.anyio
async def test_reconnects_when_the_worker_comes_back(tmp_path: Path) -> None:
    address = f"ipc://{tmp_path}/who.sock"
    with worker(f"{STAGES}:whoami", listen=address) as first:
        async with bls.Runtime({"who": address}) as rt:
            assert (await stage("who", Mark())).pid == first.pid
            first.signal(signal.SIGKILL)
            first.wait()
            binding = rt.bindings["who"]
            await anyio.to_thread.run_sync(lambda: wait_for(lambda: not binding.ready(), 3))
            with pytest.raises(bls.StageError, match="unavailable"):
                await stage("who", Mark())
            with worker(f"{STAGES}:whoami", listen=address) as second:
                await anyio.to_thread.run_sync(lambda: wait_for(binding.ready, 5))
                assert (await stage("who", Mark())).pid == second.pid


@pytest.mark.anyio
async def test_slow_consumer_bounds_what_the_producer_runs_ahead(tmp_path: Path) -> None:
    marker = tmp_path / "flow"
    produced = Path(str(marker) + ".produced")
    with worker(f"{STAGES}:ticks") as proc:
        async with bls.Runtime({"ticks": proc.address}):
            items = stage.stream("ticks", Mark(marker=str(marker), seconds=0))
            consumed = 0
            async with items:
                async for _ in items:
                    consumed += 1
                    if consumed == 5:
                        await anyio.sleep(0.5)  # the producer is free-running meanwhile
                        ahead = _count(produced) - consumed
                        assert ahead <= transport_stream.WINDOW + 1
                    if consumed == 40:
                        break
            assert _count(produced) - consumed <= transport_stream.WINDOW + 1


def _count(path: Path) -> int:
    return int(path.read_text().split()[0])


def test_typed_handle_mismatch_with_remote_worker_fails_at_bind(tmp_path: Path) -> None:
    script = tmp_path / "typed.py"
    script.write_text(
        "import bls\n\nclass Other(bls.Message):\n    name: int\n\n"
        "who = bls.Stage('who', Other, str)\n\n"
        "@bls.script\nasync def typed(req: Other) -> str:\n    return await who(req)\n"
    )
    with worker(f"{STAGES}:whoami") as who:
        out = run_bls("check", str(script), "--bind", f"who={who.address}")
    assert out.returncode == 1
    assert "stage 'who': the script sends" in out.stderr and "typed.Other" in out.stderr
    assert "stage 'who': the script expects str but the worker" in out.stderr
    assert "remote_stages.Served" in out.stderr


def test_unreachable_worker_is_reported_at_start(tmp_path: Path) -> None:
    (tmp_path / "bls.toml").write_text("[transport]\nconnect_timeout_s = 0.3\n")
    out = run_bls(
        "run",
        "examples/hello.py",
        "--input",
        '{"text": "x"}',
        "--config",
        str(tmp_path / "bls.toml"),
        "--bind",
        f"judge=ipc://{tmp_path}/nobody.sock",
    )
    assert out.returncode == 1
    assert "stage 'judge': no replica answered" in out.stderr
    assert "nobody.sock" in out.stderr


def test_worker_drains_in_flight_calls_on_sigterm(tmp_path: Path) -> None:
    marker = tmp_path / "drain"
    with worker(f"{STAGES}:slow") as proc:
        caller = subprocess.Popen(
            [
                BLS,
                "run",
                str(ROOT / "tests/e2e/pipelines/one_slow.py"),
                "--input",
                json.dumps({"seconds": 0.8, "marker": str(marker)}),
                "--bind",
                f"slow={proc.address}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            wait_for(Path(str(marker) + ".started").exists, timeout=20)
            proc.signal(signal.SIGTERM)
            out, err = caller.communicate(timeout=20)
        finally:
            if caller.poll() is None:
                caller.kill()
        assert proc.wait() == 0
    assert caller.returncode == 0, err
    assert json.loads(out)["text"] == "slept"
    assert "draining 1 call(s)" in proc.log()


def test_keygen_and_curve_refuse_unknown_callers(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    allowed = tmp_path / "allowed"
    for name in ("server", "client", "stranger"):
        out = run_bls("keygen", name, "--dir", str(keys))
        assert out.returncode == 0, out.stderr
    allowed.mkdir()
    (allowed / "client.key").write_text((keys / "client.key").read_text())

    def config(who: str) -> str:
        # Key paths relative to the config file (the tests run from the repository root).
        path = tmp_path / f"{who}.toml"
        path.write_text(
            "[transport]\nconnect_timeout_s = 1.0\n"
            f'curve_server_key = "keys/server.key"\ncurve_secret = "keys/{who}.key_secret"\n'
        )
        return str(path)

    with worker(
        "examples/hello_stages.py:judge",
        "--curve-secret",
        f"{keys}/server.key_secret",
        "--curve-allow",
        str(allowed),
    ) as judge:
        ok = run_bls(
            "run",
            "examples/hello.py",
            "--input",
            '{"text": "hi"}',
            "--config",
            config("client"),
            "--bind",
            f"judge={judge.address}",
        )
        refused = run_bls(
            "run",
            "examples/hello.py",
            "--input",
            '{"text": "hi"}',
            "--config",
            config("stranger"),
            "--bind",
            f"judge={judge.address}",
        )
        plain = run_bls(
            "run",
            "examples/hello.py",
            "--input",
            '{"text": "hi"}',
            "--config",
            str(_plain(tmp_path)),
            "--bind",
            f"judge={judge.address}",
        )
    assert ok.returncode == 0, ok.stderr
    assert '"accepted":true' in ok.stdout
    assert refused.returncode == 1 and "no replica answered" in refused.stderr
    assert "refused this caller's credentials" in refused.stderr
    assert plain.returncode == 1 and "no replica answered" in plain.stderr


def _plain(tmp_path: Path) -> Path:
    path = tmp_path / "plain.toml"
    path.write_text("[transport]\nconnect_timeout_s = 0.5\n")
    return path


def test_worker_help_and_bad_target() -> None:
    out = run_bls("worker", "--help")
    assert out.returncode == 0 and "--listen" in out.stdout and "--max-inflight" in out.stdout
    out = run_bls("worker", "nope.py:x", "--listen", "tcp://127.0.0.1:0")
    assert out.returncode == 1 and out.stderr.startswith("error: cannot load 'nope.py:x'")
    out = run_bls("worker", f"{STAGES}:whoami", "--listen", "bogus://x")
    assert out.returncode == 1 and "cannot listen on bogus://x" in out.stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_batched_worker_batches_remote_calls(backend: str) -> None:
    with worker(f"{STAGES}:sized") as proc:

        async def main() -> list[Served]:
            results: list[Served] = []
            async with bls.Runtime({"sized": proc.address}):

                async def one() -> None:
                    results.append(await stage("sized", Mark()))

                async with anyio.create_task_group() as tg:
                    for _ in range(8):
                        tg.start_soon(one)
            return results

        results = anyio.run(main, backend=backend)
    assert len(results) == 8
    assert all(r.pid == proc.pid for r in results)
    assert max(int(r.text) for r in results) > 1  # calls shared forward passes


def test_a_bad_worker_option_is_named_before_anything_starts() -> None:
    done = run_bls(
        "worker",
        "bls.models.vllm:VllmWorker",
        "--listen",
        "tcp://127.0.0.1:0",
        "--option",
        "max_model_len=lots",
        "--option",
        "bogus=1",
    )
    assert done.returncode == 1
    assert "max_model_len" in done.stderr or "bogus" in done.stderr
    assert "VllmOptions" in done.stderr or "VllmWorker" in done.stderr


def test_a_worker_serving_another_stage_name_is_refused_at_start() -> None:
    with worker("examples/hello_stages.py:judge", "--stage", "judge") as proc:
        out = run_bls(
            "run",
            "examples/hello.py",
            "--input",
            '{"text": "hi"}',
            "--bind",
            f"draft={proc.address}",
        )
    assert out.returncode == 1
    assert "this worker serves stage 'judge', not 'draft'" in out.stderr


# -- a worker's shutdown and a hung worker ------------------------------------------


async def _started(marker: Path) -> None:
    await anyio.to_thread.run_sync(lambda: wait_for(Path(f"{marker}.started").exists, 10))


@pytest.mark.anyio
async def test_grace_running_out_cancels_the_call_and_answers_shutdown(tmp_path: Path) -> None:
    marker = tmp_path / "cut"
    failures: list[bls.StageError] = []
    with worker(f"{STAGES}:slow", "--grace", "0.3") as proc:
        async with bls.Runtime({"slow": proc.address}):

            async def call() -> None:
                with pytest.raises(bls.StageError) as info:
                    await stage("slow", Mark(marker=str(marker), seconds=60))
                failures.append(info.value)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await _started(marker)
                proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    assert failures[0].kind == "shutdown" and failures[0].stage == "slow"
    assert "shut down before the call ended" in failures[0].message
    assert marker.read_text().split()[0] == "cancelled"  # its finally ran in the worker
    assert "grace period over" in proc.log()
    assert proc.stats()["cancelled"] == 1


@pytest.mark.anyio
async def test_a_draining_worker_refuses_new_calls_and_they_go_to_another_replica(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "long"
    with worker(f"{STAGES}:slow", "--grace", "20") as draining, worker(f"{STAGES}:slow") as other:
        async with (
            bls.Runtime({"slow": draining.address}) as alone,
            bls.Runtime({"slow": f"{draining.address},{other.address}"}) as both,
        ):
            first: list[Served] = []

            async def long_call() -> None:
                first.append(await alone.call("slow", Mark(marker=str(marker), seconds=1.5)))

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_call)
                await _started(marker)
                draining.signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(
                    lambda: wait_for(lambda: "draining 1 call(s)" in draining.log(), 10)
                )
                with pytest.raises(bls.StageError) as refused:
                    await alone.call("slow", Mark(seconds=0))
                during = [await both.call("slow", Mark(seconds=0)) for _ in range(4)]
            assert refused.value.kind == "unavailable"
            assert "shutting down" in refused.value.message
            assert {s.pid for s in during} == {other.pid}
            assert first[0].pid == draining.pid  # the call in flight still finished
        assert draining.wait() == 0
    assert draining.stats()["rejected"] >= 1


@pytest.mark.anyio
async def test_a_hung_worker_is_caught_by_heartbeats(tmp_path: Path) -> None:
    marker = tmp_path / "hang"
    with worker(f"{STAGES}:slow") as proc:
        async with bls.Runtime({"slow": proc.address}):
            failures: list[bls.StageError] = []
            failed = anyio.Event()

            async def call() -> None:
                with pytest.raises(bls.StageError) as info:
                    await stage("slow", Mark(marker=str(marker), seconds=60))
                failures.append(info.value)
                failed.set()

            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await _started(marker)
                    proc.signal(signal.SIGSTOP)  # alive, connected, and silent
                    stopped = time.monotonic()
                    with anyio.fail_after(10):  # dead_after_s is 1 s
                        await failed.wait()
                    caught = time.monotonic() - stopped
            finally:
                proc.signal(signal.SIGCONT)
    assert failures[0].kind == "unavailable"
    assert "no heartbeat" in failures[0].message
    assert caught < 5


@pytest.mark.anyio
async def test_a_result_of_the_wrong_type_names_the_expected_one_remote_as_inline(
    tmp_path: Path,
) -> None:
    liar = tmp_path / "liar.py"
    liar.write_text("async def liar(req):\n    return 'not a number'\n")
    handle = bls.Stage("liar", str, int)
    sys.path.insert(0, str(tmp_path))
    try:
        from liar import liar as inline_liar  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    messages = []
    with worker(f"{liar}:liar") as remote:
        for target in (inline_liar, remote.address):
            async with bls.Runtime({"liar": target}, declared=[handle]):
                with pytest.raises(bls.StageError) as info:
                    await handle("x")
            assert info.value.kind == "invalid_response"
            messages.append(info.value.message)
    assert all(
        m.startswith("result does not match int: Expected `int`, got `str`") for m in messages
    )
