"""bls.replay against hostile records: whatever a record file holds, replaying it ends —
as recorded, with a named divergence, or with "FILE is not a bls record: ..." naming the
field — and never hangs or fails inside bls."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from bls.recording import Record, RecordedError, RecordError, dump, load
from bls.replay import Divergence, replay_file
from bls.typenames import TypeRef

UNTYPED = Path(__file__).parent / "e2e" / "untyped" / "tagger.py"
BLS = str(Path(sys.executable).with_name("bls"))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real record: the untyped tagger's request through its inline stages."""
    path = tmp_path_factory.mktemp("rec") / "tag.blsrec"
    ran = subprocess.run(
        [BLS, "run", str(UNTYPED), "--input", '{"text": "red fox"}', "--record", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    return path.read_bytes()


def _edited(data: bytes, edit: Callable[[Record], None]) -> bytes:
    record = load(data)
    edit(record)
    return dump(record)


def _nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\x01"


def _ext(code: int, data: bytes) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, data))


STR = TypeRef("builtins:str")
FAILED = RecordedError(stage="s", kind="k", message="m")


def _hostile(data: bytes) -> list[tuple[str, bytes]]:
    """Records a file may hold: cut, flipped, and well-formed ones that bls cannot have
    written."""
    rng = random.Random(7)
    cases = [(f"cut at {n}", data[:n]) for n in (0, 1, 5, 17, 40, len(data) // 2, len(data) - 1)]
    for i in range(24):
        flipped = bytearray(data)
        at = rng.randrange(len(flipped))
        flipped[at] ^= 1 << rng.randrange(8)
        cases.append((f"bit flip {i} at {at}", bytes(flipped)))

    def cancelled(end: float) -> Callable[[Record], None]:
        def edit(r: Record) -> None:
            r.calls[0].error = RecordedError(stage="topic", kind="cancelled", message="x")
            r.calls[0].end = end

        return edit

    def setter(field: str, value: object, call: int | None = 0) -> Callable[[Record], None]:
        def edit(r: Record) -> None:
            setattr(r if call is None else r.calls[call], field, value)

        return edit

    edits: list[tuple[str, Callable[[Record], None]]] = [
        ("a NaN duration", setter("duration", math.nan, None)),
        ("an infinite duration", setter("duration", math.inf, None)),
        ("a NaN start", setter("started", math.nan, None)),
        ("a cancelled call that took forever", cancelled(math.inf)),
        ("a cancelled call that took 1e300 s", cancelled(1e300)),
        ("a cancelled call that took NaN s", cancelled(math.nan)),
        ("a negative start", setter("start", -5.0)),
        ("an end before the start", setter("end", -1.0)),
        ("a unary call without its result", setter("items", [])),
        ("a unary call with two results", lambda r: r.calls[0].items.append(r.calls[0].items[0])),
        ("a request nested 2,000 deep", setter("request", _nested(2000))),
        ("a result nested 300 deep", setter("items", [_nested(300)])),
        ("the entry's request nested 100,000 deep", setter("request", _nested(100_000), None)),
        ("an unknown extension type", setter("items", [_ext(9, b"x")])),
        ("an array with garbage inside", setter("items", [_ext(1, b"\xc1")])),
        ("a payload that is not msgpack", setter("request", b"\xc1\xc1", None)),
        ("a payload cut short", setter("items", [b"\x92\x01"])),
        ("a payload claiming 4 GiB", setter("items", [b"\xdb\xff\xff\xff\xffabc"])),
        ("a result type of another module", setter("result_type", TypeRef("antigravity:X"))),
        ("a result type with no arguments", setter("result_type", TypeRef("list"))),
        ("a dict type with one argument", setter("result_type", TypeRef("dict", (STR,)))),
        ("a result type that is not one", setter("result_type", TypeRef("builtins:len"))),
        ("a result type of nonsense", setter("result_type", TypeRef(":::"))),
        ("another stage", setter("stage", "nope")),
        ("the calls reversed", lambda r: r.calls.reverse()),
        ("no calls", lambda r: r.calls.clear()),
        ("another entry", setter("entry", "nothing", None)),
        ("an error of a stage on a unary entry", setter("error", FAILED, None)),
        ("a streaming call that is unary", setter("streaming", True)),
    ]  # fmt: skip
    cases += [(name, _edited(data, edit)) for name, edit in edits]
    cases += [
        ("not msgpack", b"hello world"),
        ("a list", msgspec.msgpack.encode([1, 2, 3])),
        ("calls of the wrong type", msgspec.msgpack.encode({"format": 1, "calls": "x"})),
        ("another format", msgspec.msgpack.encode({"format": 9, "bls": "9"})),
        ("a map nested 5,000 deep", b"\x81\xa1a" * 5000 + b"\x01"),
    ]
    return cases


def test_no_record_hangs_replay_or_fails_inside_bls(recorded: bytes, tmp_path: Path) -> None:
    cases = _hostile(recorded)
    assert len(cases) >= 52
    outcomes: dict[str, str] = {}
    for n, (name, data) in enumerate(cases):
        path = tmp_path / f"{n}.blsrec"
        path.write_bytes(data)
        began = time.monotonic()
        try:
            replay_file(path, UNTYPED)
            outcomes[name] = "replayed"
        except RecordError as exc:
            assert str(exc).startswith(f"{path} ") or str(exc).startswith("the record's"), exc
            outcomes[name] = f"record error: {exc}"
        except Divergence as exc:
            outcomes[name] = f"divergence: {exc}"
        took = time.monotonic() - began
        assert took < 5, f"{name}: {took:.1f}s"
    refused = [n for n, o in outcomes.items() if o.startswith("record error")]
    assert "a NaN duration" in refused and "a cancelled call that took forever" in refused
    assert "a request nested 2,000 deep" in refused and "an unknown extension type" in refused
    assert "a unary call without its result" in refused
    assert outcomes["a cancelled call that took 1e300 s"].startswith("record error")
    assert outcomes["a result type of another module"].startswith("divergence")
    assert (
        "calls[0].result_type: list with 0 argument(s)"
        in outcomes["a result type with no arguments"]
    )
    assert "calls[0].result_type: ':::' names no class" in outcomes["a result type of nonsense"]


def test_a_record_error_names_the_field(recorded: bytes, tmp_path: Path) -> None:
    path = tmp_path / "r.blsrec"
    path.write_bytes(_edited(recorded, lambda r: setattr(r.calls[1], "items", [])))
    with pytest.raises(RecordError) as caught:
        replay_file(path, UNTYPED)
    assert str(caught.value) == (
        f"{path} is not a bls record: calls[1]: a unary call of stage 'label' with 0 results"
    )
    path.write_bytes(_edited(recorded, lambda r: setattr(r.calls[0], "request", _nested(300))))
    with pytest.raises(RecordError, match=r"calls\[0\].request: nested deeper than 256 levels"):
        replay_file(path, UNTYPED)
