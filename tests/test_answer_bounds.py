"""A run's result and a file's bytes count against the bound of large answers (bls.serve.
framing) before the store reads them: while that bound is full, asking for one is
refused 503 without reading it, so many clients asking at once cannot make the frontend
hold a copy for each; once there is room, the same request is answered whole."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from bls.config import RunsConfig
from bls.journal import RunRow
from bls.journal_files import FileRow
from bls.runtime import Runtime
from bls.serve import framing
from bls.serve.files import Files
from bls.serve.framing import LARGE_ANSWER, LARGE_ANSWERS_BYTES, HttpError, holding
from bls.serve.routing import Router
from bls.serve.run_routes import RunRoutes
from bls.serve.runs import Runs
from bls.stores import SqliteJournal

BIG = 2 * LARGE_ANSWER  # a large answer's bytes


class Reads(SqliteJournal):
    """The SQLite store, counting the reads of what a run or a file holds."""

    payloads = 0

    def get(self, run_id: str, *, request: bool = True) -> RunRow | None:
        self.payloads += 1
        return super().get(run_id, request=request)

    def file(self, file_id: str, *, data: bool = False) -> FileRow | None:
        self.payloads += data
        return super().file(file_id, data=data)

    def events(self, run_id: str, after: int = 0, limit: int = 256) -> list[tuple[int, str, bytes]]:
        self.payloads += 1
        return super().events(run_id, after, limit)


async def _ask(router: Router, method: str, path: str) -> tuple[int, bytes]:
    """The status and body the route answers ``method path`` with."""
    got: list[dict[str, Any]] = []
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if asked:  # (the client stays)
            await anyio.sleep_forever()
        asked = True
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        got.append(dict(message))

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    handler, rest = router.match(method, path)
    await handler(scope, receive, send, rest)
    status = next(m["status"] for m in got if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in got if m["type"] == "http.response.body")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_large_result_or_file_is_held_before_it_is_read(tmp_path: Path, backend: str) -> None:
    script = tmp_path / "s.py"
    script.write_text("")
    journal = Reads(tmp_path / "runs.db")
    now = time.time()
    journal.create(
        RunRow(id="r", script=str(script), entry="e", status="queued", request=b"{}", created=now)
    )
    assert journal.finish("r", "succeeded", result=b'"%s"' % (b"x" * BIG))
    data = b"y" * BIG
    file = FileRow(id="file-f", purpose="batch", filename="f", size=BIG, created=now, data=data)
    config = RunsConfig()
    runs = Runs(journal, cast(Runtime, None), {}, script, config)
    router = Router([*RunRoutes(runs).routes, *Files(journal, config).routes])

    async def main() -> None:
        await journal.save_file(file)
        journal.payloads = 0
        with holding(LARGE_ANSWERS_BYTES - LARGE_ANSWER):  # others being sent: no room
            for method, path in [
                ("GET", "/v1/runs/r"),
                ("DELETE", "/v1/runs/r"),
                ("GET", "/v1/files/file-f/content"),
            ]:
                with pytest.raises(HttpError) as refused:
                    await _ask(router, method, path)
                assert refused.value.status == 503, (method, path)
                assert refused.value.type == "too_many_large_answers"
            assert journal.payloads == 0  # (refused before reading)
            # Small answers still go: a run's listing, a file's description.
            assert (await _ask(router, "GET", "/v1/runs"))[0] == 200
            assert (await _ask(router, "GET", "/v1/files/file-f"))[0] == 200
        # Room again: the same requests answered whole, and the bytes let go after.
        status, body = await _ask(router, "GET", "/v1/runs/r")
        assert status == 200 and body.count(b"x") == BIG
        status, body = await _ask(router, "DELETE", "/v1/runs/r")
        assert status == 200 and b'"status":"succeeded"' in body and body.count(b"x") == BIG
        status, body = await _ask(router, "GET", "/v1/files/file-f/content")
        assert status == 200 and body == file.data
        assert framing._large.held == 0

        # An events stream already under way waits for room for a large event before it
        # reads it, then sends it whole.
        item = b'"%s"' % (b"z" * BIG)
        journal.event("r", 1, "item", item)
        journal.event("r", 2, "end", b'{"status":"succeeded","result":null,"error":null}')
        journal.payloads = 0
        streamed: list[tuple[int, bytes]] = []

        async def follow() -> None:
            streamed.append(await _ask(router, "GET", "/v1/runs/r/events"))

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                with holding(LARGE_ANSWERS_BYTES - LARGE_ANSWER):  # others being sent
                    tg.start_soon(follow)
                    while not framing._large.waiting:  # noqa: ASYNC110 - until it waits; bounded
                        await anyio.sleep(0.01)
                    assert journal.payloads == 0 and not streamed  # (nothing read yet)
                # The others' bytes let go: it goes on to the end.
        [(status, body)] = streamed
        assert status == 200 and journal.payloads == 1  # the item (the end came listed)
        assert b"id: 1\nevent: item\ndata: " + item + b"\n\n" in body
        end = b'id: 2\nevent: end\ndata: {"status":"succeeded","result":null,"error":null}\n\n'
        assert body.endswith(end)
        assert framing._large.held == 0

    try:
        anyio.run(main, backend=backend)
    finally:
        journal.close()
