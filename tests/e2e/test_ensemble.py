"""examples/ensemble over HTTP: the classifier runs beside the streamed generation, the
output is the same with every stage inline and with every stage in a `bls worker`, the
hand-written baseline answers the same, and a disconnect cancels both branches. The engine
is not what is tested here (tests/e2e/test_vllm.py, test_chat.py and test_describe.py run
the real one): FakeLLM stands in for it, in process and as a worker, and like the vLLM
worker it logs each generation it aborts."""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from .cli import FAKE_LLM, ROOT, bls_env, run_bls
from .procs import Proc, last_spans, serving, start, stop, wait_for
from .rawio import receive_until

SCRIPT = "examples/ensemble/ensemble.py"
REQUEST = json.loads((ROOT / "examples/ensemble/request.json").read_text())


@pytest.fixture
def workers(pipeline_workers: dict[str, Proc]) -> dict[str, Proc]:
    return pipeline_workers


def _binds(workers: dict[str, Proc], *names: str) -> list[str]:
    return [arg for name in names for arg in ("--bind", f"{name}={workers[name].address}")]


def events(url: str, body: dict[str, object] = REQUEST) -> list[dict[str, object]]:
    """POST the request and read the server-sent events: the items, up to the end event."""
    with httpx.stream("POST", f"{url}/v1/scripts/ensemble", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        items, event = [], "message"
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                if event == "end":
                    return items
                assert event == "message", line
                items.append(json.loads(line[6:]))
        raise AssertionError(f"the stream ended without its end event after {items}")


def test_the_same_answer_inline_remote_and_by_hand(
    workers: dict[str, Proc], tmp_path: Path
) -> None:
    with serving(SCRIPT, "--bind", f"generator={FAKE_LLM}") as inline:
        got = events(inline.address)
        steps = {s["name"]: s for s in last_spans(inline.address)}["generator"]["items"]
    *pieces, merged = got
    assert merged["label"] in ("cat", "dog", "bird", "car", "tree")
    assert 0 < merged["score"] <= 1  # type: ignore[operator]
    assert merged["caption"] == "".join(p.get("text", "") for p in pieces)  # type: ignore[misc]
    assert steps == REQUEST["max_tokens"]  # one engine step per generated token
    # One chunk per step that produced text: none that carries nothing (a step may end
    # mid-character, with no text yet).
    assert 0 < len(pieces) <= steps and all(p["text"] for p in pieces), pieces

    with serving(SCRIPT, *_binds(workers, "encoder", "classifier", "generator")) as remote:
        assert events(remote.address) == got
        # The two branches ran at once: the classifier's span lies within the generation's.
        by_name = {s["name"]: s for s in last_spans(remote.address)}
        classify, generate = by_name["classifier"], by_name["generator"]
        assert classify["start"] < generate["end"] and generate["start"] < classify["end"]
        assert by_name["encoder"]["end"] <= min(classify["start"], generate["start"])

        # bls bench drives it: every stream read to its end, its first item timed, a plot.
        plot = tmp_path / "ensemble.png"
        out = run_bls(
            "bench", remote.address, "--entry", "ensemble",
            "--input", "@examples/ensemble/request.json",
            "--stream", "-c", "2", "-n", "6", "--plot", str(plot), "--json",
            timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        summary = json.loads(out.stdout)
        assert summary["ok"] == 6 and summary["errors"] == {}
        assert summary["first_item_ms"]["p50"] < summary["latency_ms"]["p50"]
        assert plot.read_bytes()[:4] == b"\x89PNG"

    bespoke = start(
        [
            str(ROOT / "examples/ensemble/bespoke.py"),
            "--port",
            "0",
            *(f"--{n}={workers[n].address}" for n in ("encoder", "classifier", "generator")),
        ],
        program=[sys.executable],
    )
    try:
        assert events(bespoke.address) == got
    finally:
        stop(bespoke.popen)


def _aborts(proc: Proc) -> list[str]:
    return [line for line in proc.lines if "aborted fake-" in line]


def test_a_disconnect_cancels_the_classifier_and_aborts_the_generation(
    workers: dict[str, Proc], tmp_path: Path
) -> None:
    marker = tmp_path / "classifier"
    generator = workers["generator"]
    before = len(_aborts(generator))
    server = start(
        [
            "serve",
            SCRIPT,
            "--port",
            "0",
            *_binds(workers, "encoder", "generator"),
            "--bind",
            "classifier=tests/e2e/ensemble/stages.py:slow_classifier",
        ],
        env=bls_env(ENSEMBLE_MARKER=str(marker)),
    )
    try:
        url = urlsplit(server.address)
        body = json.dumps({**REQUEST, "max_tokens": 200}).encode()
        with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/scripts/ensemble HTTP/1.1\r\nHost: x\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            # Two events: the generation is under way.
            received = receive_until(sock, lambda d: d.count(b"data: ") >= 2, timeout=60)
        assert received.startswith(b"HTTP/1.1 200")
        assert marker.with_suffix(".started").exists()  # and so is the classifier
        wait_for(lambda: marker.exists(), timeout=15)
        assert marker.read_text() == "cancelled"
        try:
            wait_for(lambda: len(_aborts(generator)) > before, timeout=15)
        except AssertionError:
            logs = "".join(server.lines[-30:]) + "".join(generator.lines[-30:])
            raise AssertionError(f"no abort in the worker's log; the logs:\n{logs}") from None
        assert _aborts(generator)[-1].rstrip().endswith("(unfinished in the engine now: 0)")
    finally:
        server.signal(signal.SIGTERM)
        stop(server.popen)
