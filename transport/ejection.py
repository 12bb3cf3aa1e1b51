"""Outlier ejection: a replica whose calls keep failing, or take far longer than its
peers', is taken out of rotation for a while (``eject`` in a stage's policy,
:class:`bls.policy.Eject`), then tried again; ejected again soon after, it stays out twice
as long. Never more than ``max_fraction`` of a stage's replicas are out at once, and the
replica set still picks an ejected one when no other is left.

A replica's :class:`Health` (failures in a row, out until, times ejected, recent call
times) lives on its connection, and is written and read here alone: the replica set
reports each call's end (:func:`outcome`, :func:`took`, :func:`cut`), asks whether a
replica is in rotation (:func:`in_rotation`), and runs :func:`watch`, which counts a call
still running far past its peers' as slow before it ends. What counts against a replica:

- a failed call (lost, refused, failed by the worker: any error but those the request
  caused), for ``failures`` in a row;
- a call's time, for ``slower``: an answered call's, a cancelled one's so far (a hedge's
  loser, a client that left: it took at least that long), a running one's once it is far
  past its peers';
- a call its request's deadline cut: its time so far, and a failure, as a gateway that
  times out on an upstream counts it (a replica that takes calls and never answers
  still sends heartbeats; this is how it is noticed).

Ejections are logged and counted in the stage's :class:`bls.policy.PolicyState`.
"""

from __future__ import annotations

import collections
import logging
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import anyio

from bls.policy import Policy, PolicyState

__all__ = ["Health", "cut", "in_rotation", "outcome", "took", "watch"]

log = logging.getLogger("bls.transport")

SAMPLES = 3  # a replica's recent calls needed before its latency is compared
RECENT = 8  # the calls whose times are compared (the median of these)
WATCH_S = 0.25  # how often calls still running are looked at
_DEADLINE_SLACK_S = 0.005  # a cancel this close to the deadline is the deadline's


class Health:
    """One replica's standing (kept on its connection, read and written here)."""

    __slots__ = ("ejected_until", "ejections", "failures", "recent")

    def __init__(self) -> None:
        self.failures = 0  # failed calls in a row
        self.ejected_until = 0.0  # out of rotation until (monotonic seconds)
        self.ejections = 0  # times ejected in a row
        self.recent: collections.deque[float] = collections.deque(maxlen=RECENT)


class Inbox(Protocol):
    """A call in flight (:class:`.connection.Inbox`): when it went, whether its time was sampled."""

    sent: float
    sampled: bool


class Replica(Protocol):
    """A replica (:class:`.connection.Connection`) as ejection sees it."""

    @property
    def address(self) -> str: ...
    @property
    def alive(self) -> bool: ...
    @property
    def retired(self) -> bool: ...
    @property
    def health(self) -> Health: ...
    @property
    def calls(self) -> Mapping[int, Inbox]: ...


class Replicas(Protocol):
    """What ejection needs of a stage's replica set (transport/replicas.py's
    RemoteBinding): its name, policy, counts and replicas."""

    @property
    def name(self) -> str: ...
    @property
    def policy(self) -> Policy: ...
    @property
    def state(self) -> PolicyState: ...
    @property
    def connections(self) -> Sequence[Replica]: ...


def in_rotation(conn: Replica, now: float) -> bool:
    """Whether calls may go to ``conn`` (``now``: monotonic seconds) as to any other."""
    return conn.health.ejected_until <= now


def outcome(replicas: Replicas, conn: Replica, failed: bool) -> None:
    """Count a call's outcome against its replica; eject one that keeps failing."""
    health = conn.health
    if not failed:
        health.failures = 0
        return
    eject = replicas.policy.eject
    health.failures += 1
    if eject.failures and health.failures >= eject.failures:
        _eject(replicas, conn, f"after {eject.failures} failed call(s) in a row")
        health.failures = eject.failures - 1  # back in rotation, one more failure ejects it


def took(replicas: Replicas, conn: Replica, call: Inbox) -> None:
    """``call`` on ``conn`` ended (answered, or cancelled: a hedge's loser, a client that
    left): its time so far counts, unless :func:`watch` counted it already."""
    if not call.sampled:
        call.sampled = True
        _sample(replicas, conn, time.monotonic() - call.sent)


def cut(replicas: Replicas, conn: Replica, call: Inbox, deadline: float) -> None:
    """``call`` on ``conn`` was cancelled: it counts as :func:`took` says, and, when the
    request's ``deadline`` (epoch seconds) is what cancelled it, as a failure."""
    took(replicas, conn, call)
    if time.time() >= deadline - _DEADLINE_SLACK_S:
        outcome(replicas, conn, failed=True)


async def watch(replicas: Replicas) -> None:
    """Every :data:`WATCH_S`, count the oldest call on each replica still waiting for its
    first answer as slow once it has waited ``slower`` times its peers' typical time (and
    ``slower_ms`` more):
    a replica that holds calls and never answers is ejected before any deadline cuts
    them. Runs until cancelled."""
    while True:
        await anyio.sleep(WATCH_S)
        eject = replicas.policy.eject
        if not eject.slower:
            continue
        now = time.monotonic()
        for conn in replicas.connections:
            # (calls in the order they were sent: a stream past its first item is sampled)
            oldest = next((c for c in conn.calls.values() if not c.sampled), None)
            if oldest is None:
                continue
            typical = _peers(replicas.connections, conn, now)
            age = now - oldest.sent
            if typical is not None and _lags(eject, age, typical):
                oldest.sampled = True
                _sample(replicas, conn, age)


def _sample(replicas: Replicas, conn: Replica, seconds: float) -> None:
    """A call of ``conn`` took ``seconds`` (at least): eject it if it is far slower than
    its peers."""
    health = conn.health
    health.recent.append(seconds)
    eject = replicas.policy.eject
    if not eject.slower or len(health.recent) < SAMPLES:
        return
    now = time.monotonic()
    theirs = _peers(replicas.connections, conn, now)
    if theirs is None:
        return
    mine = statistics.median(health.recent)
    if _lags(eject, mine, theirs):
        _eject(replicas, conn, f"for taking {mine * 1000:.0f} ms against {theirs * 1000:.0f} ms")
    elif health.ejected_until <= now:
        health.ejections = 0  # back and well: the next ejection starts short again


def _peers(connections: Iterable[Replica], conn: Replica, now: float) -> float | None:
    """The typical call time of ``conn``'s peers in rotation (the median of their
    medians); None while none has enough calls to say."""
    medians = [
        statistics.median(c.health.recent)
        for c in connections
        if c is not conn and len(c.health.recent) >= SAMPLES and in_rotation(c, now)
    ]
    return statistics.median(medians) if medians else None


def _lags(eject: Any, seconds: float, typical: float) -> bool:
    return seconds >= eject.slower * typical and seconds - typical >= eject.slower_ms / 1000


def _eject(replicas: Replicas, conn: Replica, why: str) -> None:
    eject = replicas.policy.eject
    health = conn.health
    now = time.monotonic()
    live = [c for c in replicas.connections if c.alive and not c.retired]
    out = sum(1 for c in live if not in_rotation(c, now))
    if health.ejected_until > now or out + 1 > eject.max_fraction * len(live):
        return
    seconds = min(eject.max_ms, eject.for_ms * 2**health.ejections) / 1000
    health.ejected_until = now + seconds
    health.ejections += 1
    replicas.state.counts.ejections += 1
    log.warning(
        "stage %r: replica %s ejected for %.1fs %s", replicas.name, conn.address, seconds, why
    )
