"""The /debug/requests timeline page, rendered by a real headless Chromium."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .browser import chromium, needs_chromium
from .procs import Proc, wait_for, worker
from .test_serve import STAGES, serve

pytestmark = needs_chromium

# Bar colours from bls/timeline.py.
OK = (0x3F, 0x7F, 0xD9)
REMOTE_OK = (0x2F, 0x9E, 0x8F)
CANCELLED = (0x8B, 0x93, 0xA5)


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[Proc, str]]:
    """A server whose last request fanned out to remote workers and cancelled a loser."""
    with (
        worker(f"{STAGES}:whoami") as who,
        worker(f"{STAGES}:slow") as slow,
        serve("--bind", f"whoami={who.address}", "--bind", f"slow={slow.address}") as proc,
    ):
        r = httpx.post(
            f"{proc.address}/v1/scripts/fanout",
            json={"text": "", "marker": str(tmp_path / "race")},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        rid = r.headers["x-request-id"]

        def spans() -> int:
            trace = httpx.get(
                f"{proc.address}/debug/requests/{rid}", headers={"Accept": "application/json"}
            ).json()
            return len(trace["spans"])

        wait_for(lambda: spans() == 9)  # the cancelled call's worker span arrives last
        yield proc, rid


def test_timeline_page_draws_every_span(traced: tuple[Proc, str], tmp_path: Path) -> None:
    proc, rid = traced
    url = f"{proc.address}/debug/requests/{rid}"
    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr
    html = dom.stdout
    # The request, its 4 calls (3 to slow, 1 to whoami), and each one's worker-side span.
    assert html.count('class="row span"') == 9
    assert html.count('data-name="slow"') == 6
    assert html.count('data-name="whoami"') == 2
    assert 'data-name="slow" data-outcome="cancelled" data-depth="1"' in html
    assert 'data-outcome="ok" data-depth="2" data-remote="true"' in html
    assert "✕ cancelled" in html

    shot = tmp_path / "timeline.png"
    done = chromium(tmp_path, "--window-size=1400,700", f"--screenshot={shot}", url)
    assert done.returncode == 0 and shot.exists(), done.stderr
    from PIL import Image

    image = Image.open(shot).convert("RGB")
    colours = {colour for _, colour in image.getcolors(1 << 20) or []}
    assert OK in colours, "no local stage bar was drawn"
    assert REMOTE_OK in colours, "no remote (worker-reported) bar was drawn"
    assert CANCELLED in colours, "the cancelled span is not marked"
    keep = os.environ.get("BLS_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_request_list_links_to_timelines(traced: tuple[Proc, str], tmp_path: Path) -> None:
    proc, rid = traced
    dom = chromium(tmp_path, "--dump-dom", f"{proc.address}/debug/requests")
    assert dom.returncode == 0, dom.stderr
    assert f'href="/debug/requests/{rid}"' in dom.stdout
    assert "fanout" in dom.stdout
