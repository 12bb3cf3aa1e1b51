"""The keeper of a frontend's runs (bls.serve.run_leases): runs it claims together are
started together, even when the end of one of them cannot be written."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from bls.config import RunsConfig
from bls.journal import JournalError, RunRow
from bls.runtime import Runtime
from bls.serve.runs import Runs
from bls.stores import SqliteJournal


class FullForOne(SqliteJournal):
    """The SQLite store, which cannot write the outcome of run ``a`` (a full disk, say)."""

    def finish(self, run_id: str, status: str, **kw: Any) -> bool:
        if run_id == "a":
            raise JournalError(f"the runs store {self.path} failed: database or disk is full")
        return super().finish(run_id, status, **kw)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_claimed_run_whose_end_fails_holds_up_none_claimed_with_it(
    tmp_path: Path, backend: str
) -> None:
    """Runs ``a`` (cancelled while its frontend was away) and ``b`` wait in the store; the
    keeper claims both. ``a``'s end cannot be written: ``b`` starts at the same turn all
    the same, not one lease later, and ``a`` is left to be claimed again."""
    script = tmp_path / "s.py"
    script.write_text("")
    journal = FullForOne(tmp_path / "runs.db")
    now = time.time()
    for name in ("a", "b"):
        journal.create(
            RunRow(
                id=name, script=str(script.resolve()), entry="e", status="queued",
                request=b"{}", created=now,
            )
        )  # fmt: skip
    journal.ask_cancel("a")
    runs = Runs(journal, cast(Runtime, None), {}, script, RunsConfig(lease_s=60.0))
    started: list[str] = []

    async def main() -> None:
        one = anyio.Event()

        def start(row: RunRow) -> None:
            started.append(row.id)
            one.set()

        runs._start = start  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            await tg.start(runs.keep)
            with anyio.fail_after(5):
                await one.wait()
            tg.cancel_scope.cancel()

    anyio.run(main, backend=backend)
    assert started == ["b"]
    row = journal.get("a")
    assert row is not None and row.status == "queued" and row.cancel
    journal.close()
