"""Outlier ejection: a replica whose calls keep failing, or take far longer than its
peers', is taken out of rotation for a while (``eject`` in a stage's policy,
:class:`bls.traffic.Eject`), then tried again; ejected again soon after, it stays out twice
as long. Never more than ``max_fraction`` of a stage's replicas are out at once, and the
replica set still picks an ejected one when no other is left.

The state is kept on each :class:`.connection.Connection` (failures in a row, out until,
times ejected, recent call times); the replica set reports each call's outcome and time
here. Ejections are logged and counted in the stage's :class:`bls.traffic.Traffic`.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Protocol

from bls.traffic import Policy, Traffic

from .connection import Connection

__all__ = ["outcome", "took"]

log = logging.getLogger("bls.transport")

SAMPLES = 3  # a replica's recent calls needed before its latency is compared


class Replicas(Protocol):
    """What ejection needs of a stage's replica set (transport/replicas.py's
    RemoteBinding): its name, policy, counts and replicas."""

    name: str
    policy: Policy
    traffic: Traffic
    connections: list[Connection]


def outcome(replicas: Replicas, conn: Connection, failed: bool) -> None:
    """Count a call's outcome against its replica; eject one that keeps failing."""
    if not failed:
        conn.failures = 0
        return
    eject = replicas.policy.eject
    conn.failures += 1
    if eject.failures and conn.failures >= eject.failures:
        _eject(replicas, conn, f"after {eject.failures} failed call(s) in a row")
        conn.failures = eject.failures - 1  # back in rotation, one more failure ejects it


def took(replicas: Replicas, conn: Connection, seconds: float) -> None:
    """A call on ``conn`` took ``seconds`` (or was cancelled after that long, a hedge's
    loser): eject the replica if it is far slower than its peers."""
    conn.recent.append(seconds)
    eject = replicas.policy.eject
    if not eject.slower or len(conn.recent) < SAMPLES:
        return
    now = time.monotonic()
    peers = [
        statistics.median(c.recent)
        for c in replicas.connections
        if c is not conn and len(c.recent) >= SAMPLES and c.ejected_until <= now
    ]
    if not peers:
        return
    mine, theirs = statistics.median(conn.recent), statistics.median(peers)
    if mine >= eject.slower * theirs and mine - theirs >= eject.slower_ms / 1000:
        _eject(replicas, conn, f"for taking {mine * 1000:.0f} ms against {theirs * 1000:.0f} ms")
    elif conn.ejected_until <= now:
        conn.ejections = 0  # back and well: the next ejection starts short again


def _eject(replicas: Replicas, conn: Connection, why: str) -> None:
    eject = replicas.policy.eject
    now = time.monotonic()
    live = [c for c in replicas.connections if c.alive and not c.retired]
    out = sum(1 for c in live if c.ejected_until > now)
    if conn.ejected_until > now or out + 1 > eject.max_fraction * len(live):
        return
    seconds = min(eject.max_ms, eject.for_ms * 2**conn.ejections) / 1000
    conn.ejected_until = now + seconds
    conn.ejections += 1
    replicas.traffic.ejections += 1
    log.warning(
        "stage %r: replica %s ejected for %.1fs %s", replicas.name, conn.address, seconds, why
    )
