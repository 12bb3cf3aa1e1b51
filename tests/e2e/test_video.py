"""examples/video over HTTP: two encoders at once, a denoising loop of stage calls, an
upscaler, an animated PNG back; the same bytes inline and with every stage in a
`bls worker`; a deadline or a disconnect in the middle of the loop stops the denoiser."""

from __future__ import annotations

import base64
import io
import json
import signal
import socket
import time
from collections.abc import Iterator
from itertools import pairwise
from urllib.parse import urlsplit

import httpx
import pytest

from .cli import ROOT, require_models
from .procs import Proc, last_spans, serving, start, stop, wait_for

require_models()

SCRIPT = "examples/video/video.py"
MODELS = "examples/video/models.py"
REQUEST = json.loads((ROOT / "examples/video/request.json").read_text())
TARGETS = {
    "frame_encoder": f"{MODELS}:FrameEncoder",
    "text_encoder": "bls.models.encoder:TextEncoder",
    "denoiser": f"{MODELS}:Denoiser",
    "upscaler": f"{MODELS}:Upscaler",
}


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, Proc]]:
    procs: dict[str, Proc] = {}
    try:
        for name, target in TARGETS.items():
            procs[name] = start(
                ["worker", target, "--listen", "tcp://127.0.0.1:0"], ready_timeout=120
            )
        yield procs
    finally:
        for proc in procs.values():
            stop(proc.popen)


def _binds(workers: dict[str, Proc], *names: str) -> list[str]:
    return [arg for n in names for arg in ("--bind", f"{n}={workers[n].address}")]


def test_an_animated_png_the_same_inline_and_remote(workers: dict[str, Proc]) -> None:
    from PIL import Image

    with serving(SCRIPT, ready_timeout=120) as inline:
        r = httpx.post(f"{inline.address}/v1/scripts/video", json=REQUEST, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()
        bad = {**REQUEST, "frames": [REQUEST["frames"][0], base64.b64encode(b"nope").decode()]}
        r = httpx.post(f"{inline.address}/v1/scripts/video", json=bad, timeout=60)
        assert r.status_code == 422 and r.json()["error"]["path"] == "$.frames[1]"
    assert (got["frames"], got["width"], got["height"], got["steps"]) == (4, 128, 128, 8)
    image = Image.open(io.BytesIO(base64.b64decode(got["apng"])))
    assert image.format == "PNG" and image.is_animated and image.n_frames == 4
    assert image.size == (128, 128)

    with serving(SCRIPT, *_binds(workers, *TARGETS)) as remote:
        r = httpx.post(f"{remote.address}/v1/scripts/video", json=REQUEST, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json() == got  # the same bytes
        local = last_spans(remote.address)
    frames = next(s for s in local if s["name"] == "frame_encoder")
    text = next(s for s in local if s["name"] == "text_encoder")
    assert frames["start"] < text["end"] and text["start"] < frames["end"]  # at once
    steps = [s for s in local if s["name"] == "denoiser"]
    assert len(steps) == 8 and all(a["end"] <= b["start"] for a, b in pairwise(steps))


def _cancelled_steps(proc: Proc) -> int:
    return sum("denoiser: step t=" in line and "cancelled" in line for line in proc.lines)


def _started_steps(proc: Proc) -> int:
    return sum("denoiser: step t=" in line and "started" in line for line in proc.lines)


def _ended_steps(proc: Proc) -> int:
    return sum(
        "denoiser: step t=" in line and ("done" in line or "cancelled" in line)
        for line in proc.lines
    )


def test_a_deadline_mid_loop_stops_the_denoiser(workers: dict[str, Proc]) -> None:
    slow = start(
        ["worker", TARGETS["denoiser"], "--listen", "tcp://127.0.0.1:0",
         "--option", "delay_ms=100"],
        ready_timeout=60,
    )  # fmt: skip
    try:
        binds = [*_binds(workers, "frame_encoder", "text_encoder", "upscaler")]
        with serving(SCRIPT, *binds, "--bind", f"denoiser={slow.address}") as proc:
            # Warm every stage up first, so that the deadline falls inside the loop.
            warm = httpx.post(
                f"{proc.address}/v1/scripts/video", json={**REQUEST, "steps": 1}, timeout=60
            )
            assert warm.status_code == 200, warm.text
            started = time.monotonic()
            r = httpx.post(
                f"{proc.address}/v1/scripts/video",
                json={**REQUEST, "steps": 100},
                headers={"X-Request-Timeout": "2"},
                timeout=30,
            )
            assert r.status_code == 504
            assert time.monotonic() - started < 4
            assert _started_steps(slow) > 2, slow.log()  # the deadline fell inside the loop
            # The step in flight ends (cancelled, unless the deadline fell in the instant
            # between two steps), and no step starts after it.
            wait_for(lambda: _ended_steps(slow) == _started_steps(slow), timeout=5)
            after_deadline = _cancelled_steps(slow)
            assert after_deadline <= 1

            # A client that goes away mid-loop: the same.
            url = urlsplit(proc.address)
            body = json.dumps({**REQUEST, "steps": 100}).encode()
            with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
                sock.sendall(
                    b"POST /v1/scripts/video HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                begun = _started_steps(slow)
                wait_for(lambda: _started_steps(slow) >= begun + 3, timeout=10)  # mid-loop
            # The client hung up while a step was sleeping: that step is cancelled.
            wait_for(lambda: _cancelled_steps(slow) == after_deadline + 1, timeout=5)
            wait_for(lambda: _ended_steps(slow) == _started_steps(slow), timeout=5)
        slow.signal(signal.SIGTERM)
        assert slow.wait() == 0
        stats = slow.stats()
    finally:
        stop(slow.popen)
    # Nothing ran after the cancels: every call the worker took completed but those.
    ended_early = stats["cancelled"] + stats["deadline"]
    assert 1 <= ended_early <= 2
    assert stats["calls"] == stats["completed"] + ended_early
    assert stats["completed"] < 60  # of the 201 steps asked for
