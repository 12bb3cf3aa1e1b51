"""The callers a worker hears from (:class:`Callers`): what each has sent and had
acknowledged, its calls in flight, whether its hello was refused, and when it was last
heard; calls acknowledged in batches when no reply carries the acknowledgement; callers
that fall silent given up on.

The worker (:class:`.worker_server.WorkerServer`) owns the calls: giving up on a caller
is its :meth:`Host.give_up`, which cancels what the caller had in flight.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import anyio
import anyio.lowlevel
import msgspec

from .liveness import ticks
from .wire import Kind

__all__ = ["Caller", "Callers", "Host"]

log = logging.getLogger("bls.worker")

_GIVEN_UP_KEPT = 1024  # callers given up on lately, remembered to log each once


class Caller(msgspec.Struct):
    """One caller, as the worker knows it."""

    seen: int = 0  # highest call id received
    acked: int = 0  # highest call id acknowledged
    last_heard: float = 0.0
    inflight: int = 0  # its calls running now
    refused: str = ""  # why its hello was refused: its calls are refused too


class Host(Protocol):
    """What :class:`Callers` needs of its worker."""

    def send_to(self, client: bytes, kind: int) -> None:
        """A frame of ``kind`` (no call) to ``client``, carrying its acknowledgement."""

    def give_up(self, client: bytes, why: str) -> None:
        """Cancel ``client``'s calls, saying ``why`` (it is forgotten after)."""

    def sample_busy(self, now: float) -> None:
        """Take a sample of how busy the worker is (once a heartbeat)."""


class Callers:
    """The callers of one worker (module docstring), by their ZeroMQ identity."""

    def __init__(self, host: Host, stage: str, heartbeat_s: float, dead_after_s: float) -> None:
        self.host = host
        self.stage = stage
        self.heartbeat_s = heartbeat_s
        self.dead_after_s = dead_after_s
        self.known: dict[bytes, Caller] = {}
        self._given_up: dict[bytes, None] = {}  # given up on lately (to log each once)
        self._ack_wanted: anyio.Event | None = None

    def heard(self, client: bytes) -> Caller:
        """A frame came from ``client``: its record (made at its first)."""
        caller = self.known.get(client)
        if caller is None:
            caller = self.known[client] = Caller()
        caller.last_heard = time.monotonic()
        return caller

    def called(self, caller: Caller, call_id: int) -> None:
        """``caller`` sent call ``call_id``: it is acknowledged soon, by a reply or not."""
        caller.seen = max(caller.seen, call_id)
        if self._ack_wanted is not None:
            self._ack_wanted.set()

    def forget(self, client: bytes, why: str, calls: int) -> None:
        """``client`` is given up on with ``calls`` calls of its cancelled: logged (once
        per caller: what it sent before it went still arrives, and each reply to it fails
        again), then forgotten."""
        if calls:
            level = logging.DEBUG if client in self._given_up else logging.WARNING
            log.log(level, "stage %r: %s: cancelling its %d call(s)", self.stage, why, calls)
            self._given_up[client] = None
            if len(self._given_up) > _GIVEN_UP_KEPT:
                del self._given_up[next(iter(self._given_up))]
        self.known.pop(client, None)

    async def acknowledge(self) -> None:
        """Acknowledge received calls that no reply has acknowledged yet (coalesced).
        Runs until cancelled."""
        self._ack_wanted = anyio.Event()
        while True:
            await self._ack_wanted.wait()
            self._ack_wanted = anyio.Event()
            # Let just-started calls run first: a quick reply carries the ack for free.
            await anyio.lowlevel.checkpoint()
            for client, caller in list(self.known.items()):  # a send may forget a caller
                if caller.seen > caller.acked:
                    self.host.send_to(client, Kind.ACK)

    async def watch(self) -> None:
        """Give up on callers that went silent for ``dead_after_s``. Runs until cancelled.

        The bound is long (15 s by default): a caller whose event loop is blocked sends
        no heartbeats either, and a long synchronous step must not cost it its calls. A
        caller that went away without a word is noticed by its full send queue first,
        when it had calls streaming (the worker's unroutable sends).
        """
        async for stalled in ticks(self.heartbeat_s, self.dead_after_s / 2):
            now = time.monotonic()
            self.host.sample_busy(now)
            if stalled:  # this worker was not listening: judge its callers from now on
                for caller in self.known.values():
                    caller.last_heard = now
                continue
            for client, caller in list(self.known.items()):
                if now - caller.last_heard > self.dead_after_s:
                    why = (
                        f"the worker heard nothing from the caller for {self.dead_after_s:g}s "
                        "and presumed it dead"
                    )
                    self.host.give_up(client, why)
