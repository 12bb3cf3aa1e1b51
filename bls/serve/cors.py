"""Cross-origin requests (CORS, the Fetch standard's protocol) for ``bls serve
--cors-origin ORIGIN``: a page served from an allowed origin may call every route — run
an entry, submit a background run with ``Prefer: respond-async`` and read its
``Location``, follow its events with ``EventSource``, cancel it — and read the answers.

Without the flag no header is added and a browser's preflight (``OPTIONS``) is a 405, as
before. With it, a request naming an allowed origin gets ``Access-Control-Allow-Origin``
(the origin, or ``*`` when any is allowed) and ``Access-Control-Expose-Headers`` naming
the headers bls answers with; a preflight from an allowed origin is answered 204 with the
methods and the headers it asked for, and one from another origin 403. A request from an
origin not allowed is served without the headers: the browser keeps its answer from the
page, as the protocol has it (put an authenticating gateway in front of a server that
must refuse such requests outright: docs/security.md).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from ..console import loggable
from .framing import WHOLE, HttpError, Message, Scope, Send, send_error
from .intake import request_id_of

__all__ = ["Cors"]

access = logging.getLogger("bls.access")

_METHODS = b"GET, POST, DELETE"
# The headers bls answers with that a page may read besides the safelisted ones
# (Content-Type...): a run's Location, the request's id, what was applied, when to retry.
_EXPOSED = b"location, x-request-id, preference-applied, retry-after, allow"
_MAX_AGE = b"600"  # how long a browser may keep a preflight's answer, seconds
# The header names a preflight may ask for (tokens and the commas between them).
_NAMES = re.compile(rb"[!#$%&'*+.^_`|~0-9a-z\-, \t]*")


class Cors:
    """The origins allowed (``*``: any; the others as :func:`bls.flags.origin` checked
    them, lower-case), and what each cross-origin request is answered."""

    def __init__(self, origins: Sequence[str]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o.encode() for o in origins if o != "*")

    def allows(self, origin: bytes) -> bool:
        return self.any or origin.lower() in self.origins

    async def route(self, scope: Scope, send: Send) -> Send | None:
        """The ``send`` to answer ``scope`` with: adding the headers when it comes from an
        allowed origin; None when it was a preflight, answered here."""
        origin = preflight = None
        for name, value in scope["headers"]:
            if name == b"origin":
                origin = value
            elif name == b"access-control-request-method":
                preflight = value
        if origin is None:
            return send
        if preflight is not None and scope["method"] == "OPTIONS":
            await self._preflight(scope, send, origin)
            return None
        if not self.allows(origin):
            return send
        return _Adding(send, self._headers(origin))

    def _headers(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        """(``origin``: one allowed, so one of the origins given, as the browser wrote it.)"""
        if self.any:
            return [(b"access-control-allow-origin", b"*")]
        return [(b"access-control-allow-origin", origin), (b"vary", b"origin")]

    async def _preflight(self, scope: Scope, send: Send, origin: bytes) -> None:
        rid = request_id_of(scope)
        status = 204 if self.allows(origin) else 403
        access.info("%s OPTIONS %s %d", rid.decode(), loggable(scope["path"]), status)
        if status == 403:
            named = origin.decode(errors="replace")
            why = f"origin {named!r} is not allowed (bls serve --cors-origin)"
            await send_error(scope, send, HttpError(403, "origin_not_allowed", why), rid)
            return
        asked = b", ".join(v for n, v in scope["headers"] if n == b"access-control-request-headers")
        headers = [
            *self._headers(origin),
            (b"access-control-allow-methods", _METHODS),
            (b"access-control-max-age", _MAX_AGE),
            (b"x-request-id", rid),
        ]
        if asked and _NAMES.fullmatch(asked.lower()):
            headers.append((b"access-control-allow-headers", asked.lower()))
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})


class _Adding:
    """A ``send`` that adds the CORS headers to the answer's head."""

    __slots__ = ("_headers", "_send")

    def __init__(self, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        self._send = send
        self._headers = [*headers, (b"access-control-expose-headers", _EXPOSED)]

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *self._headers]}
        elif kind == WHOLE:  # (lines this module vouches for: an origin it matched)
            lines = b"".join(b"%s: %s\r\n" % pair for pair in self._headers)
            message = {**message, "head": message["head"] + lines}
        await self._send(message)
