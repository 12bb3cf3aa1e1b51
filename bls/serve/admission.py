"""Admission: which requests the frontend runs, which wait, and which it refuses.

At most ``--max-inflight`` requests run at once, and of those, requests of priority 0 and
below (``X-Priority``, default 0) take all but ``reserved``. Past that, up to ``max_queued`` wait
(``[admission]`` in ``bls.toml``): the highest priority first (``X-Priority``), and
within a priority, tenants (``X-Tenant``) in weighted fair order: each waiting request is
tagged with its tenant's virtual finish time (start-time fair queuing), so a tenant that
floods the queue waits behind its own requests while another's go ahead of them. When
the queue is full, the request that would be served last (lowest priority, then latest
tag) is refused with 429: the new one, or one that was waiting.

Per entry and per tenant (``[admission.entries.NAME]``, ``[admission.tenants.NAME]``,
``"*"`` for each tenant not named): ``max_inflight`` (running and waiting together) and a
request rate with a burst (a token bucket); past either, 429 with ``Retry-After``.

With none of that configured, admitting a request is two comparisons and a counter.

Everything admission is lives here: the headers it reads (``X-Priority``, ``X-Tenant``, or
the ``[admission] tenant`` function instead), its checks of ``[admission]`` against the
server's limits and entries (:func:`check`, which ``bls serve`` runs before anything
starts and the frontend again, so that ``bls.testing.client`` is held to them too), and
the order requests wait in.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable

import anyio

from ..config import AdmissionConfig, ConfigError, Limit
from ..priorities import MAX_PRIORITY, checked
from ..shedding import Shedding
from .framing import HttpError, Scope, bad_header
from .intake import Headers
from .tenants import tenant_function, tenant_of, valid_tenant

__all__ = ["Admission", "Ticket", "check"]

DEFAULT_TENANT = "default"  # a request without X-Tenant
ANY_TENANT = "*"  # [admission.tenants."*"]: each tenant not named
# Tenants remembered before those with nothing to remember are forgotten (no request
# running or waiting, a full bucket: forgetting one loses nothing); and the most
# remembered at once, past which a new tenant is refused until some are forgettable.
_FORGET_AT = 4096
MAX_TENANTS = 65_536


class _Bound:
    """One entry's or tenant's limit and what it holds now: requests running or waiting,
    its token bucket, and (a tenant's) the virtual finish time of its last queued one."""

    __slots__ = (
        "_refilled",
        "burst",
        "finish",
        "held",
        "limit",
        "max_inflight",
        "name",
        "rate",
        "share",
        "tokens",
    )

    def __init__(self, name: str, limit: Limit, share: str = "") -> None:
        self.name = name
        self.limit = limit
        self.share = share  # what a 429 adds: whose share of the limit this is
        self.max_inflight = limit.max_inflight or math.inf
        self.rate = limit.rate
        self.burst = float(limit.burst or max(1, math.ceil(limit.rate or 1)))
        self.tokens = self.burst
        self.held = 0
        self.finish = 0.0
        self._refilled = time.monotonic()

    def forgettable(self, virtual: float) -> bool:
        """Whether forgetting it loses nothing: no request of it runs or waits, its
        bucket is full again, and its turn is not ahead of the queue's (``virtual``)."""
        if self.held or self.finish > virtual:
            return False
        if self.rate is None:
            return True
        refill = (time.monotonic() - self._refilled) * self.rate
        return self.tokens + refill >= self.burst

    def take(self, what: str) -> None:
        """Count one more request; 429 naming ``what`` when over the limit."""
        if self.held >= self.max_inflight:
            why = f"{what} is at its limit of {self.limit.max_inflight} requests{self.share}"
            raise _limited(why, 1)
        if self.rate is not None:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self._refilled) * self.rate)
            self._refilled = now
            if self.tokens < 1:
                wait = (1 - self.tokens) / self.rate
                why = f"{what} is over its rate of {self.rate:g} requests a second{self.share}"
                raise _limited(why, wait)
            self.tokens -= 1
        self.held += 1


def _limited(why: str, retry_after: float) -> HttpError:
    seconds = max(1, math.ceil(retry_after))
    return HttpError(429, "rate_limited", why, headers=[(b"retry-after", str(seconds).encode())])


class Ticket:
    """One request's place: running (``granted``), waiting, or refused while waiting."""

    __slots__ = ("entry", "granted", "key", "refused", "tenant", "woken")

    def __init__(self, entry: _Bound | None, tenant: _Bound | None) -> None:
        self.entry = entry
        self.tenant = tenant
        self.granted = False
        self.refused: HttpError | None = None
        self.key: tuple[int, float, int] = (0, 0.0, 0)
        self.woken: anyio.Event | None = None

    async def wait(self) -> None:
        """Until the request may run; its 429 if a better one took its place."""
        if self.woken is not None:
            await self.woken.wait()
        if self.refused is not None:
            raise self.refused


GRANTED = Ticket(None, None)
GRANTED.granted = True


def check(config: AdmissionConfig, max_inflight: int, entries: Iterable[str]) -> None:
    """``[admission]`` as it must be for a server of ``max_inflight`` slots serving
    ``entries``: its reserved slots fewer, its entries the script's, its tenant function
    one that loads. ConfigError saying which, else nothing."""
    if config.reserved >= max_inflight:
        raise ConfigError(
            f"[admission] reserved = {config.reserved} leaves none of the {max_inflight} "
            "slots (--max-inflight) to requests of priority 0 and below"
        )
    known = list(entries)
    for name in config.entries:
        if name not in known:
            raise ConfigError(
                f"[admission.entries.{name}]: no entry {name!r} (entries: {', '.join(known)})"
            )
    tenant_function(config)  # loads, or says why it cannot


class Admission:
    """The frontend's admission (module docstring): :meth:`admit` (or :meth:`enter`) when
    a request arrives, ``Ticket.wait`` until it may run, ``leave`` when it is over,
    whatever happened."""

    def __init__(
        self, max_inflight: int, config: AdmissionConfig, entries: Iterable[str] = ()
    ) -> None:
        check(config, max_inflight, entries or config.entries)
        self._tenant_function = tenant_function(config)
        self.max_inflight = max_inflight
        self.reserved = config.reserved
        self.max_queued = config.max_queued
        self.running = 0
        n = config.processes
        self._share = "" if n == 1 else f" (this process's share: the limit is divided by {n})"
        self._entries = {
            name: _Bound(name, limit, self._share) for name, limit in config.entries.items()
        }
        self._tenant_limits = dict(config.tenants)
        self._tenants: dict[str, _Bound] = {}
        self._forget_at = _FORGET_AT
        self._queue: Shedding[Ticket] = Shedding()
        self._virtual = 0.0  # the tag of the request last taken from the queue
        self._seq = itertools.count()
        # Nothing but --max-inflight: no tenant, entry or queue to look at.
        self.simple = not (self._entries or self._tenant_limits or self.max_queued or self.reserved)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def admit(self, scope: Scope, entry: str, headers: Headers) -> tuple[Ticket, int]:
        """A request's place and priority: from its ``X-Priority``, and its tenant from
        ``X-Tenant`` or the tenant function; 429 when a limit refuses it, 400 for a bad
        header."""
        if self.simple and headers.priority is None and headers.tenant is None:
            return self.enter(entry, None, 0), 0
        priority = request_priority(headers)
        if self._tenant_function is None:
            tenant = request_tenant(headers)
        elif self.simple:  # no tenant has a limit or a turn to take: no need to ask
            tenant = None
        else:
            tenant = tenant_of(self._tenant_function, scope, entry)
        return self.enter(entry, tenant, priority), priority

    def enter(self, entry: str, tenant: str | None, priority: int) -> Ticket:
        """The request's ticket, granted or to wait on; 429 when a limit refuses it."""
        if self.simple:
            if self.running >= self.max_inflight:
                raise self._full()
            self.running += 1
            return GRANTED
        bound = self._entries.get(entry)
        if bound is not None:
            bound.take(f"entry {entry!r}")
        owner = self._tenant(tenant or DEFAULT_TENANT)
        try:
            owner.take(f"tenant {owner.name!r}")
        except HttpError:
            if bound is not None:
                bound.held -= 1
            raise
        ticket = Ticket(bound, owner)
        # (Requests wait only for lack of a slot their priority may take: one of a higher
        # priority may find a reserved one free.)
        if self.running < self._slots(priority) and (
            not self._queue or priority > -self._queue.best_key()[0]
        ):
            self.running += 1
            ticket.granted = True
            return ticket
        if not self.max_queued:
            self._release(ticket)
            raise self._full(priority=priority)
        return self._enqueue(ticket, priority)

    def leave(self, ticket: Ticket) -> None:
        """The request is over (or refused, or cancelled while it waited)."""
        if ticket is GRANTED:
            self.running -= 1
            return
        if ticket.granted:
            self.running -= 1
        elif ticket.refused is None and ticket.woken is not None:
            self._queue.remove(ticket)  # cancelled while it waited
        self._release(ticket)
        # The queue's head has the highest priority: if it may not run, none may.
        while self._queue and self.running < self._slots(-self._queue.best_key()[0]):
            nxt = self._queue.pop()
            self._virtual = max(self._virtual, nxt.key[1])
            self.running += 1
            nxt.granted = True
            assert nxt.woken is not None
            nxt.woken.set()

    def _slots(self, priority: int) -> int:
        """The slots a request of ``priority`` may take (the reserved ones: above 0)."""
        return self.max_inflight if priority > 0 else self.max_inflight - self.reserved

    def _enqueue(self, ticket: Ticket, priority: int) -> Ticket:
        owner = ticket.tenant
        assert owner is not None
        weight = owner.limit.weight
        owner.finish = max(self._virtual, owner.finish) + 1 / weight
        ticket.key = (-priority, owner.finish, next(self._seq))
        ticket.woken = anyio.Event()
        self._queue.push(ticket.key, ticket)
        if len(self._queue) > self.max_queued:
            worst = self._queue.worst()
            assert worst is not None
            shed = worst[1]
            self._queue.remove(shed)
            shed.refused = self._full(queued=True, priority=-shed.key[0])
            self._release(shed)
            if shed is ticket:
                raise shed.refused
            assert shed.woken is not None
            shed.woken.set()
        return ticket

    def _tenant(self, name: str) -> _Bound:
        bound = self._tenants.get(name)
        if bound is None:
            if len(self._tenants) >= self._forget_at:
                self._forget()
            if len(self._tenants) >= MAX_TENANTS:
                raise _limited(
                    f"the server tracks {MAX_TENANTS} tenants with requests or limits in "
                    "use already; try again when their buckets refill",
                    1,
                )
            limit = self._tenant_limits.get(name) or self._tenant_limits.get(ANY_TENANT)
            bound = self._tenants[name] = _Bound(name, limit or Limit(), self._share)
        return bound

    def _forget(self) -> None:
        """Forget the tenants with nothing to remember (:meth:`_Bound.forgettable`); look
        again once as many more have come."""
        virtual = self._virtual
        self._tenants = {n: b for n, b in self._tenants.items() if not b.forgettable(virtual)}
        self._forget_at = max(_FORGET_AT, 2 * len(self._tenants))

    def _release(self, ticket: Ticket) -> None:
        for bound in (ticket.entry, ticket.tenant):
            if bound is not None:
                bound.held -= 1
        ticket.entry = ticket.tenant = None

    def _full(self, queued: bool = False, priority: int = 0) -> HttpError:
        why = f"the server is at its limit of {self.max_inflight} requests in flight"
        if self.reserved and priority <= 0:
            why += f" ({self.reserved} of them kept for requests of priority above 0)"
        if queued:
            why += f" and {self.max_queued} waiting, and the waiting ones come first"
        return HttpError(429, "overloaded", why, headers=[(b"retry-after", b"1")])


def request_priority(headers: Headers) -> int:
    """``X-Priority`` (higher first; 0 without it); 400 for one that is not a priority."""
    raw = headers.priority
    if raw is None:
        return 0
    try:
        return checked(int(raw), "X-Priority")
    except ValueError:
        expected = f"an integer from -{MAX_PRIORITY} to {MAX_PRIORITY}"
        raise bad_header("X-Priority", expected, raw) from None


def request_tenant(headers: Headers) -> str | None:
    """``X-Tenant``, when sent: up to 128 printable ASCII characters, else 400."""
    raw = headers.tenant
    if raw is None:
        return None
    if not (raw.isascii() and valid_tenant(raw.decode())):
        raise bad_header("X-Tenant", "1 to 128 printable ASCII characters")
    return raw.decode()
