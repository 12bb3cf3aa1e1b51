"""`bls serve --cors-origin`: a page from another origin calls the server in a real
headless Chromium (web security on) — submits a background run, reads its Location,
follows its events with EventSource, cancels it — and a page from an origin not allowed
cannot; the headers and preflights on every HTTP server bls runs on."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .browser import chromium, needs_chromium
from .procs import Proc, drain, free_port, start, stop, wait_for

SCRIPT = """
import anyio
import bls


@bls.script
async def shout(req):
    return {"text": req["text"].upper()}


@bls.script
async def letters(req):
    for letter in req["text"]:
        yield letter
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "shout.py"
    path.write_text(SCRIPT)
    return path


def _serve(script: Path, tmp_path: Path, *more: str) -> Proc:
    store = f"sqlite:///{tmp_path / f'runs-{free_port()}.db'}"
    return start(["serve", str(script), "--port", "0", "--runs", store, *more])


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A static web server (another origin than bls's: another port) and its folder."""
    folder = tmp_path / "site"
    folder.mkdir()
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    popen = subprocess.Popen(
        [*argv, "--directory", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    try:
        origin = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(origin), 20)
        yield origin, folder
    finally:
        stop(popen)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# A page that submits a background run to SERVER, follows its events to the end, then
# deletes it, and writes what it saw (or how it failed).
_PAGE = """<!doctype html><html><body><pre id="log"></pre><script>
const server = "%s";
const seen = [];
async function main() {
  try {
    const made = await fetch(server + "/v1/scripts/letters", {
      method: "POST",
      headers: {"Content-Type": "application/json", "Prefer": "respond-async"},
      body: JSON.stringify({text: "hi"}),
    });
    const where = made.headers.get("Location");
    seen.push("submitted " + made.status + " " + where.startsWith("/v1/runs/"));
    await new Promise((resolve) => {
      const source = new EventSource(server + where + "/events");
      source.addEventListener("item", (e) => seen.push("item " + JSON.parse(e.data)));
      source.addEventListener("end", (e) => {
        seen.push("end " + JSON.parse(e.data).status);
        source.close();
        resolve();
      });
      source.onerror = () => { seen.push("events failed"); source.close(); resolve(); };
    });
    const gone = await fetch(server + where, {method: "DELETE"});
    seen.push("deleted " + gone.status + " " + (await gone.json()).status);
  } catch (e) {
    seen.push("failed: " + e.name);
  }
  const log = document.getElementById("log");
  log.textContent = seen.join("\\n");
  log.id = "done";
}
main();
</script></body></html>
"""


def _visit(tmp_path: Path, page: str) -> list[str]:
    args = ("--virtual-time-budget=30000", "--dump-dom", page)
    dom = chromium(tmp_path, *args, timeout=60)
    assert dom.returncode == 0, dom.stderr
    return dom.stdout.partition('<pre id="done">')[2].partition("</pre>")[0].splitlines()


@needs_chromium
def test_a_page_from_an_allowed_origin_runs_follows_and_cancels_and_another_cannot(
    script: Path, tmp_path: Path, site: tuple[str, Path]
) -> None:
    origin, folder = site
    allowed = _serve(script, tmp_path, "--cors-origin", origin)
    elsewhere = _serve(script, tmp_path, "--cors-origin", "https://elsewhere.example")
    try:
        (folder / "allowed.html").write_text(_PAGE % allowed.address)
        (folder / "refused.html").write_text(_PAGE % elsewhere.address)
        assert _visit(tmp_path, f"{origin}/allowed.html") == [
            "submitted 202 true",
            "item h",
            "item i",
            "end succeeded",
            "deleted 200 succeeded",
        ]
        # The browser's preflight was refused: the page never sent its request.
        assert _visit(tmp_path, f"{origin}/refused.html") == ["failed: TypeError"]
        assert " OPTIONS /v1/scripts/letters 403" in elsewhere.log()
        assert " POST /v1/scripts/letters " not in elsewhere.log()
    finally:
        drain([allowed, elsewhere])


@pytest.mark.parametrize(
    "server",
    [("--backend", "asyncio"), ("--backend", "trio"), ("--server", "hypercorn")],
    ids=["uvicorn", "own-trio", "hypercorn"],
)
def test_every_answer_to_an_allowed_origin_carries_the_headers(
    script: Path, tmp_path: Path, server: tuple[str, str]
) -> None:
    page = "http://127.0.0.1:3000"
    proc = _serve(script, tmp_path, *server, "--cors-origin", "HTTP://127.0.0.1:3000/")
    try:
        url = proc.address
        asks = {
            "origin": page,
            "access-control-request-method": "POST",
            "access-control-request-headers": "Content-Type, Prefer, X-Request-Timeout",
        }
        preflight = httpx.options(f"{url}/v1/scripts/shout", headers=asks)
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == page
        assert preflight.headers["access-control-allow-methods"] == "GET, POST, DELETE"
        allowed_headers = preflight.headers["access-control-allow-headers"]
        assert allowed_headers == "content-type, prefer, x-request-timeout"
        refused = httpx.options(f"{url}/v1/scripts/shout", headers={**asks, "origin": "http://x"})
        assert refused.status_code == 403
        assert refused.json()["error"]["type"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in refused.headers

        sent = {"origin": page}
        answers = [
            httpx.post(f"{url}/v1/scripts/shout", json={"text": "a"}, headers=sent),  # whole
            httpx.post(f"{url}/v1/scripts/letters", json={"text": "ab"}, headers=sent),  # SSE
            httpx.post(f"{url}/v1/scripts/nope", json={}, headers=sent),  # 404
            httpx.post(f"{url}/v1/scripts/shout", json={}, headers=sent),  # the script fails
            httpx.get(f"{url}/v1/runs", headers=sent),
        ]
        assert [a.status_code for a in answers] == [200, 200, 404, 500, 200]
        for answer in answers:
            assert answer.headers["access-control-allow-origin"] == page
            assert answer.headers["vary"] == "origin"
            assert "location" in answer.headers["access-control-expose-headers"]
        assert answers[0].json() == {"text": "A"}
        # Without an Origin, or from another, nothing is added; it serves on.
        for headers in ({}, {"origin": "http://x"}):
            plain = httpx.post(f"{url}/v1/scripts/shout", json={"text": "b"}, headers=headers)
            assert plain.json() == {"text": "B"}
            assert not any(h.startswith("access-control-") for h in plain.headers)
        assert httpx.options(f"{url}/v1/scripts/shout").status_code == 405  # not a preflight
    finally:
        drain([proc])


def test_an_origin_that_is_not_one_is_refused_at_start(script: Path) -> None:
    from .cli import run_bls

    for given in ("https://app.example/path", "app.example", "ftp://app.example", ""):
        refused = run_bls("serve", str(script), "--port", "0", "--cors-origin", given)
        assert refused.returncode == 2
        assert "argument --cors-origin: expected * or an origin" in refused.stderr
