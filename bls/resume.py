"""A background run's recorder, and its recovery: the script runs again with every call
it finished before answered from the journal (:mod:`bls.journal`), then goes on live.

:class:`JournalRecorder` is the :class:`bls.recording.Recorder` of a background run: each
stage call is written to the journal as it starts and again as it ends, before the
script sees its result. A recovered run's recorder carries a :class:`Resume`, which
:class:`bls.record_binding.RecordingBinding` asks first (:meth:`Resume.take`):

- a call the journal has finished is answered from it, as ``bls replay`` answers
  (:func:`bls.replay.recorded_value`, :func:`bls.replay.recorded_failure`): it is not
  sent again;
- a call that was in flight when the run's frontend stopped is sent again to an
  idempotent stage (``idempotent = true``), under its number in the journal; to any
  other the run fails with ``interrupted``, naming the stage: it may have run, and
  running it twice is not known to be safe;
- a call the journal has no more calls for goes live;
- a call of a stage whose next journaled call had another request is a divergence (the
  script was changed): the run fails naming the call and the field, as ``bls replay``
  does, and so does a run that ends without making every call the journal has. Old and
  new results are never mixed into an answer.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bindings import Binding
from .errors import ErrorKind, StageError
from .journal import MAX_VALUE_BYTES, Journal, RunLost
from .recording import RecordedCall, RecordedError, Recorder, encode_value
from .replay import Divergence, difference, recorded_failure, recorded_value
from .typenames import TypeRef

__all__ = ["JournalRecorder", "Resume", "Taken"]


class Taken:
    """What :meth:`Resume.take` found for a call: the finished ``call`` to answer from
    (``call`` None: send it live, as journal call ``seq``, or a new one when ``seq`` is
    None)."""

    __slots__ = ("call", "n", "seq")

    def __init__(self, seq: int | None, call: RecordedCall | None = None) -> None:
        self.seq = seq
        self.call = call
        self.n = (seq or 0) + 1  # as replay numbers calls: from 1

    def value(self, i: int, result_type: Any, resume: Resume) -> Any:
        assert self.call is not None
        return recorded_value(self.call, self.n, i, result_type, resume.importable, resume.diverge)

    async def fail(self, resume: Resume) -> None:
        assert self.call is not None
        await recorded_failure(self.n, self.call, resume.diverge)


class Resume:
    """A recovered run's journaled calls (see the module's docstring). ``on_diverge`` is
    told of the first divergence (the run's owner cancels the run with it: the script
    may catch the error)."""

    def __init__(
        self, calls: list[tuple[int, RecordedCall, bool]], importable: Callable[[str], bool]
    ) -> None:
        self.left: dict[str, list[tuple[int, RecordedCall, bool]]] = {}
        for seq, call, done in calls:
            self.left.setdefault(call.stage, []).append((seq, call, done))
        self.next_seq = max((seq for seq, _, _ in calls), default=-1) + 1
        self.importable = importable
        self.diverged: Divergence | None = None
        self.on_diverge: Callable[[], None] = lambda: None

    def diverge(self, message: str) -> Divergence:
        exc = Divergence(f"the run's recovery diverged from its journal: {message}")
        if self.diverged is None:
            self.diverged = exc
            self.on_diverge()
        return exc

    def take(self, binding: Binding, req: Any) -> Taken | None:
        """What the journal has for this call of ``binding`` (None: it goes live, as a new
        call); raises the divergence, or ``interrupted``."""
        name = binding.name
        left = self.left.get(name)
        if not left:
            return None
        sent = encode_value(req)
        for i, (seq, call, done) in enumerate(left):
            if call.request == sent:
                del left[i]
                if done:
                    return Taken(seq, call)
                if binding.policy.idempotent:
                    return Taken(seq)  # sent again, as the same journal call
                raise StageError(
                    name,
                    ErrorKind.INTERRUPTED,
                    f"the run's call {seq + 1} to stage {name!r} was in flight when its "
                    "frontend stopped, and the stage is not idempotent: it may have run, "
                    "so it is not sent again (declare the stage idempotent = true if "
                    "running it twice is safe)",
                )
        seq, call, _ = left[0]
        raise self.diverge(
            f"call {seq + 1} (stage {name!r}): the request differs {difference(call.request, sent)}"
        )

    def check_all_made(self) -> None:
        """The run ended: every journaled call must have been made again."""
        unmade = sorted((seq, call.stage) for calls in self.left.values() for seq, call, _ in calls)
        if unmade:
            seq, stage = unmade[0]
            raise self.diverge(
                f"the script did not make {len(unmade)} call(s) the journal has; the first: "
                f"call {seq + 1} (stage {stage!r})"
            )


class JournalRecorder(Recorder):
    """The recorder of background run ``run_id``: each call goes to ``journal`` as it
    starts and as it ends (numbered from ``resume``'s next when the run is recovered).
    After :meth:`stop` (the frontend is stopping, and cancels its runs to hand them over)
    the calls that end are left in flight in the journal: cancelled by the stop, not by
    the script. A call whose request and result (or items) come to more than ``most``
    bytes fails with ``too_large``, naming its stage, before the store is asked to hold
    it (a store holds a value of 1 GB at most; :data:`bls.journal.MAX_VALUE_BYTES`): it
    is journaled so, and a recovery fails it the same way. Its calls are journaled only
    while the run is ``owner``'s; once another frontend took it over, a call's save
    raises :class:`bls.journal.RunLost`, after :attr:`on_lost` (which stops the run here)."""

    __slots__ = (
        "_journal",
        "_next",
        "_seqs",
        "_sizes",
        "most",
        "on_lost",
        "owner",
        "run_id",
        "stopping",
    )

    def __init__(
        self,
        journal: Journal,
        run_id: str,
        script: str | Path,
        resume: Resume | None = None,
        most: int = MAX_VALUE_BYTES,
    ) -> None:
        super().__init__(script)
        self._room = math.inf  # (the journal holds each call as it goes: all of them)
        self._journal = journal
        self.run_id = run_id
        self.resume = resume
        self.most = most
        # Whose run it is, and what stops it here once it is not (bls.serve.run_events.Live
        # sets both; None: unfenced, as a test journals).
        self.owner: str | None = None
        self.on_lost: Callable[[], None] = lambda: None
        self._next = resume.next_seq if resume is not None else 0
        self._seqs: dict[int, int] = {}  # id(call): its number in the journal
        self._sizes: dict[int, int] = {}  # id(call): its values' bytes so far
        self.stopping = False

    durable = True

    # The run's request, items and result are its row's and its events' (bls.serve.runs):
    # a journal notes none of them again, nor holds them while the run runs (a streaming
    # run's items would all be held until it ends).

    def entry(self, name: str, req: Any) -> None:
        self.record.entry = name
        self._t0 = time.monotonic()  # (its calls' times are counted from here)

    def answer(self, value: Any) -> None:
        pass

    def call(
        self,
        stage: str,
        streaming: bool,
        req: Any,
        result_ref: TypeRef | None = None,
        seq: int | None = None,
    ) -> RecordedCall:
        call = self.new_call(stage, streaming, req, result_ref)
        if seq is None:
            seq, self._next = self._next, self._next + 1
        self._seqs[id(call)] = seq
        self._sizes[id(call)] = len(call.request)
        return call

    def item(self, call: RecordedCall, value: Any) -> None:
        """A stream's item; past ``most``, not kept: the call fails (the stream is closed)."""
        super().item(call, value)
        size = self._sizes[id(call)] + len(call.items[-1])
        if size > self.most:
            call.items.pop()
            raise self._too_large(call, size)
        self._sizes[id(call)] = size

    def result(self, call: RecordedCall, value: Any) -> None:
        super().result(call, value)
        self._sizes[id(call)] += len(call.items[-1])

    async def saved(self, call: RecordedCall, done: bool) -> None:
        """The call into the journal, as it starts and as it ends (not after :meth:`stop`:
        a call the stop cancelled stays in flight there). A call past ``most`` is saved
        as ended, failed (its result left out), and its error raised: at its start, it is
        not made."""
        key = id(call)
        size = self._sizes[key]
        too_large = self._too_large(call, size) if size > self.most else None
        if too_large is not None:
            call.items.clear()
            call.end = call.end or call.start
            call.error = RecordedError(
                stage=call.stage, kind=too_large.kind, message=too_large.message
            )
            done = True
        seq = self._seqs.pop(key) if done else self._seqs[key]
        if done:
            del self._sizes[key]
        if not (done and self.stopping):
            journal = self._journal
            try:
                await journal.do(journal.call, self.run_id, seq, call, done, self.owner)
            except RunLost:
                self.on_lost()
                raise
        if too_large is not None:
            raise too_large

    def _too_large(self, call: RecordedCall, size: int) -> StageError:
        what = "items" if call.streaming else "result"
        return StageError(
            call.stage,
            ErrorKind.TOO_LARGE,
            f"the call's request and {what} come to {size} bytes, over the {self.most} a "
            "background run's journal keeps of one call ([runs] max_value_bytes)",
        )

    def stop(self) -> None:
        self.stopping = True
