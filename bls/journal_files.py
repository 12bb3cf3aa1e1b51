"""The files of the OpenAI Files API (``/v1/files``: a batch's input, its output and its
errors) in the runs store: :class:`FileStore`, the part of :class:`bls.journal.Journal`
that keeps them, and :class:`FileRow`, a file as the store holds it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

__all__ = ["FileRow", "FileStore"]


class FileRow(msgspec.Struct, kw_only=True):
    """A file a client uploaded (``POST /v1/files``) or a batch wrote, as the journal
    holds it; ``data`` is None when read without it."""

    id: str
    purpose: str
    filename: str
    size: int
    created: float
    data: bytes | None = None


class FileStore:
    """The files' table of a store (``files`` in :data:`bls.journal.SCHEMA`), through
    the store's own :meth:`bls.journal.Journal._execute` and :meth:`bls.journal.Journal.do`."""

    _execute: Callable[..., Any]
    do: Callable[..., Awaitable[Any]]

    def put_file(self, file: FileRow) -> None:
        assert file.data is not None
        self._execute(
            "INSERT INTO files (id, purpose, filename, size, created, data) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (file.id, file.purpose, file.filename, file.size, file.created, file.data),
        )

    def file(self, file_id: str, *, data: bool = False) -> FileRow | None:
        """The file ``file_id`` (its bytes too when ``data``); None: no such file."""
        what = _FILE_COLUMNS + (", data" if data else "")
        found = self._execute(f"SELECT {what} FROM files WHERE id = ?", (file_id,)).fetchone()
        return None if found is None else _file_row(found)

    def files(
        self,
        *,
        purpose: str | None = None,
        limit: int = 100,
        after: FileRow | None = None,
        oldest_first: bool = False,
    ) -> list[FileRow]:
        """Files newest first (or oldest), ``limit`` at most, of ``purpose`` only when
        given, those that come ``after`` that one in that order only when given."""
        where: list[str] = []
        args: list[Any] = []
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        past = ">" if oldest_first else "<"
        if after is not None:
            where.append(f"(created {past} ? OR (created = ? AND id {past} ?))")
            args += [after.created, after.created, after.id]
        sql = f"SELECT {_FILE_COLUMNS} FROM files"
        if where:
            sql += " WHERE " + " AND ".join(where)
        order = "" if oldest_first else " DESC"
        rows = self._execute(f"{sql} ORDER BY created{order}, id{order} LIMIT ?", (*args, limit))
        return [_file_row(r) for r in rows.fetchall()]

    def delete_file(self, file_id: str) -> bool:
        return bool(self._execute("DELETE FROM files WHERE id = ?", (file_id,)).rowcount == 1)

    # A file's bytes, from the event loop: kept in the store with its row here (read and
    # written in the store's calls, :meth:`do`); a store may keep them elsewhere (SQLite:
    # beside its database, so that a large file holds neither the loop nor the lock).

    async def save_file(self, file: FileRow) -> None:
        """:meth:`put_file`, from the event loop."""
        await self.do(self.put_file, file)

    async def load_file(self, file_id: str) -> FileRow | None:
        """:meth:`file` with its bytes, from the event loop."""
        found: FileRow | None = await self.do(self.file, file_id, data=True)
        return found

    async def drop_file(self, file_id: str) -> bool:
        """:meth:`delete_file`, from the event loop."""
        dropped: bool = await self.do(self.delete_file, file_id)
        return dropped


_FILE_COLUMNS = "id, purpose, filename, size, created"  # a FileRow's, but its data


def _file_row(values: Sequence[Any]) -> FileRow:
    """A FileRow from its columns (:data:`_FILE_COLUMNS`, then its data when read)."""
    row = FileRow(
        id=values[0], purpose=values[1], filename=values[2], size=values[3], created=values[4]
    )
    if len(values) > 5:
        row.data = bytes(values[5])
    return row
