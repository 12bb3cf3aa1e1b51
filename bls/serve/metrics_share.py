"""One ``/metrics`` over several frontend processes (``bls serve --processes N``).

Each process writes its own Prometheus text to ``FOLDER/PID.prom`` every
:data:`PUBLISH_S` (whole: written aside, then renamed); the process a scrape reaches
answers its own text, live, merged with its siblings' files (:func:`merge`: a sample's
values summed across processes, the ``# HELP``/``# TYPE`` lines once). A sibling's part
is at most :data:`PUBLISH_S` old; a file not rewritten for :data:`STALE_S` (its process
died) is left out, so a restarted process's counters start again from zero, as any
restarted target's do for Prometheus.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import anyio

__all__ = ["PUBLISH_S", "STALE_S", "SharedMetrics", "merge"]

log = logging.getLogger("bls.serve")

PUBLISH_S = 1.0
STALE_S = 5.0


class SharedMetrics:
    """This process's part of the metrics in ``folder`` (see the module's docstring)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / f"{os.getpid()}.prom"

    async def publish(self, render: Callable[[], bytes]) -> None:
        """Write ``render()`` every :data:`PUBLISH_S` until cancelled (then remove it)."""
        aside = self.path.with_suffix(".tmp")
        try:
            while True:
                try:
                    aside.write_bytes(render())
                    aside.replace(self.path)
                except OSError as exc:  # (the next turn tries again)
                    log.warning("metrics: cannot write %s: %s", self.path, exc)
                await anyio.sleep(PUBLISH_S)
        finally:
            for path in (aside, self.path):
                path.unlink(missing_ok=True)

    def merged(self, own: bytes) -> bytes:
        """``own`` (this process's text, now) merged with the siblings' fresh parts."""
        now = time.time()
        texts = [own]
        for path in self.folder.glob("*.prom"):
            if path == self.path:
                continue
            try:
                if now - path.stat().st_mtime <= STALE_S:
                    texts.append(path.read_bytes())
            except OSError:
                continue  # (a sibling's part went meanwhile)
        return merge(texts)


def merge(texts: Iterable[bytes]) -> bytes:
    """Prometheus texts as one: each sample (a name and its labels) once, its values
    summed; each metric's comment lines once; in the order first seen."""
    comments: dict[bytes, None] = {}
    samples: dict[bytes, float] = {}
    order: list[tuple[bool, bytes]] = []
    for text in texts:
        for line in text.splitlines():
            if not line:
                continue
            if line.startswith(b"#"):
                if line not in comments:
                    comments[line] = None
                    order.append((True, line))
                continue
            series, _, value = line.rpartition(b" ")
            try:
                number = float(value)
            except ValueError:
                continue
            if series not in samples:
                samples[series] = 0.0
                order.append((False, series))
            samples[series] += number
    out = [
        line if comment else b"%s %s" % (line, _number(samples[line])) for comment, line in order
    ]
    return b"\n".join(out) + b"\n"


def _number(value: float) -> bytes:
    return repr(float(value)).encode()
