"""The errors a script sees at an ``await`` on a stage.

A stage that fails raises a :class:`StageError` (or a subclass) carrying the stage's name,
so a script can ``except StageError`` and branch on ``err.kind`` (:class:`ErrorKind` for
bls's own kinds). Two errors are not StageErrors, on purpose: a deadline that passes is a
:class:`DeadlineExceeded` (a ``TimeoutError``), and a stage no binding serves is a
:class:`StageNotBound` (a configuration mistake no fallback should hide). The same error
arrives whether the stage is bound inline or remote.
"""

from __future__ import annotations

import enum
import re
from typing import Any

__all__ = ["DeadlineExceeded", "ErrorKind", "InvalidRequest", "StageError", "StageNotBound"]

# An object's default repr says where it lives in a process's memory, nothing a reader of
# the message can use: it is cut from every error message.
_REPR = re.compile(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>")


def encodable(text: str) -> str:
    """``text``, with any lone surrogate in it written as its escape (``\\udc80``). Python
    holds bytes that are not UTF-8 (a file name, say) so, and no UTF-8 encoder takes
    them: an error whose text held one could be neither answered, sent by a worker nor
    recorded. (Every error's text passes here: ASCII at once.)"""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


class ErrorKind(enum.StrEnum):
    """The kinds of :class:`StageError` bls itself raises, one named set (each is the
    string it compares equal to, as a frame carries it; a worker's own exception has its
    class name as its kind instead)."""

    INVALID_REQUEST = "invalid_request"
    INVALID_RESPONSE = "invalid_response"
    WRONG_MODE = "wrong_mode"
    UNAVAILABLE = "unavailable"
    OVERLOADED = "overloaded"
    SHUTDOWN = "shutdown"
    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    TOO_LARGE = "too_large"
    BAD_FRAME = "bad_frame"
    CACHE_CONFIG = "cache_config"
    INTERRUPTED = "interrupted"


class StageError(Exception):
    """A stage call failed.

    ``kind`` says why. For an exception raised by the worker's own code it is the
    exception's type name (``"ValueError"``); the transport and runtime use these
    lower-case kinds:

    - ``"invalid_request"``: the stage refused its request (raised as
      :class:`InvalidRequest`, which has the field ``path``).
    - ``"invalid_response"``: the worker's result did not match the declared type.
    - ``"wrong_mode"``: a unary call to a streaming stage, or the reverse.
    - ``"unavailable"``: no replica could be reached, or it died mid-call, or the worker
      gave up on this caller (silent, or not reading its replies).
    - ``"overloaded"``: every replica refused the call at its in-flight limit.
    - ``"shutdown"``: the worker's grace period ran out while it ran the call (SIGTERM);
      the call had started, so it is not retried elsewhere.
    - ``"deadline"``: the call's deadline passed in the worker (raised in the caller as
      :class:`DeadlineExceeded`).
    - ``"cancelled"``: the worker's acknowledgement of a cancel (the caller has
      usually moved on already).
    - ``"too_large"``: the request is over the frame size limit (``max_frame_bytes``).
    - ``"bad_frame"``: the call's frame header could not be acted on (a deadline that is
      not a time, credit out of range).
    - ``"cache_config"``: a stage's result cache cannot hold what it is given.

    ``remote_traceback`` holds the worker's traceback text when there is one.
    """

    def __init__(
        self,
        stage: str,
        kind: str,
        message: str,
        remote_traceback: str | None = None,
    ) -> None:
        message = encodable(_REPR.sub("", message))  # no <_io.BytesIO object at 0x7f...>
        if remote_traceback is not None:
            remote_traceback = encodable(remote_traceback)
        super().__init__(stage, kind, message, remote_traceback)
        self.stage = stage
        self.kind = kind
        self.message = message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        return f"stage {self.stage!r} failed ({self.kind}): {self.message}"

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str | None]]:
        return (type(self), (self.stage, self.kind, self.message, self.remote_traceback))


_PATH = re.compile(r" - at `(?P<path>[^`]*)`$")


class InvalidRequest(StageError):
    """A stage (or entry) refused its request.

    ``path`` is msgspec's field path into the request, such as ``"$.items[2].text"``,
    or ``"$"`` when the whole value had the wrong shape. ``mismatch`` is True when bls
    found that the request does not fit the type the stage declares (the caller built
    it wrong), and False when the stage's own code refused what it was given (raise
    ``bls.InvalidRequest("", "not an image", "$.image")`` in a worker): ``bls serve``
    answers the first 502 (the script's fault), the second 422 (the client's input).
    """

    def __init__(
        self,
        stage: str,
        message: str,
        path: str = "$",
        remote_traceback: str | None = None,
        *,
        mismatch: bool = False,
    ) -> None:
        StageError.__init__(self, stage, ErrorKind.INVALID_REQUEST, message, remote_traceback)
        self.path = path
        self.mismatch = mismatch

    def __str__(self) -> str:
        return f"invalid request for {self.stage!r} at {self.path}: {self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.stage, self.message, self.path, self.remote_traceback)
        return (type(self), args, {"mismatch": self.mismatch})

    @classmethod
    def from_validation(cls, stage: str, error: Exception) -> InvalidRequest:
        """Build one from a ``msgspec.ValidationError``/``DecodeError``, keeping its path
        (a ``mismatch``: the request does not fit the declared type)."""
        text = str(error)
        match = _PATH.search(text)
        if match is None:
            return cls(stage, text, "$", mismatch=True)
        return cls(stage, text[: match.start()], match.group("path"), mismatch=True)


class StageNotBound(LookupError):
    """A script used a stage name that has no binding.

    Deliberately not a :class:`StageError`: a script's ``except StageError`` fallback
    must not hide a configuration mistake.
    """

    def __init__(self, stage: str, known: list[str] | None = None) -> None:
        self.stage = stage
        self.known = sorted(known or [])
        hint = f" (bound stages: {', '.join(self.known)})" if self.known else ""
        super().__init__(
            f"stage {stage!r} is not bound: add [stages.{stage}] to bls.toml "
            f"or pass --bind {stage}=TARGET{hint}"
        )


class DeadlineExceeded(TimeoutError):
    """A :func:`bls.timeout` (or the request's deadline) ran out.

    Everything under the expired scope was cancelled first, remote work included.
    """
