"""The bytes of the Files API's files beside a SQLite runs store (:class:`FileBytes`): one
file each in a folder next to the database, so that a 64 MiB upload is written, read and
removed in a worker thread, holding neither the event loop (where SQLite's calls run)
nor the database's write lock, which every run's journal waits on.

A file is written to a temporary name, flushed to disk (``fsync``) and renamed into
place before its row is made, so a row never names bytes that are not there; bytes left
without a row (a frontend killed between the two) are removed once older than the
store's retention (:meth:`FileBytes.forget`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FileBytes"]

# A file's id as bls makes them (file-<hex>, file-run-<hex>-output): anything else never
# names a path (an id comes from a request's URL).
_ID = re.compile(r"file-[A-Za-z0-9_-]{1,200}")
_PARTIAL = ".partial-"  # a temporary name's mark: file bytes being written


class FileBytes:
    """The folder ``folder``'s file bytes, by file id. Blocking: call from a thread."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, file_id: str) -> Path:
        if not _ID.fullmatch(file_id):
            raise ValueError(f"{file_id!r} is not a file id")
        return self.folder / file_id

    def write(self, file_id: str, data: bytes) -> None:
        """``data`` under ``file_id``, on disk before this returns."""
        final = self.path(file_id)
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / f"{_PARTIAL}{uuid.uuid4().hex}"
        try:
            with partial.open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            partial.replace(final)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise

    def read(self, file_id: str) -> bytes | None:
        """The bytes of ``file_id``; None when there are none."""
        try:
            return self.path(file_id).read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, file_ids: Iterable[str]) -> None:
        for file_id in file_ids:
            with contextlib.suppress(ValueError):
                self.path(file_id).unlink(missing_ok=True)

    def _entries(self) -> list[os.DirEntry[str]]:
        """What the folder holds (nothing when it was never made)."""
        try:
            return list(os.scandir(self.folder))
        except FileNotFoundError:
            return []

    def total(self) -> int:
        """The bytes of every file in the folder."""
        size = 0
        for entry in self._entries():
            with contextlib.suppress(FileNotFoundError):  # (removed meanwhile)
                size += entry.stat().st_size
        return size

    def forget(self, older_than: float, known: set[str]) -> None:
        """Remove what is older than ``older_than`` s and is not in ``known`` (ids with a
        row): bytes whose row was never made, temporary files a crash left."""
        cutoff = time.time() - older_than
        for entry in self._entries():
            if entry.name in known:
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
