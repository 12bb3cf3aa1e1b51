"""bls.affinity: a key's replica, the same in every frontend, moved only with its replica,
spilled only past the bounded load; where a key comes from, typed or untyped."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

import bls
from bls.affinity import key_of, place
from bls.config import ConfigError, load_config, make_bindings
from bls.policy import PolicyError, policy_from


@dataclasses.dataclass
class Replica:
    address: str
    load: int = 0


def replicas(n: int) -> list[Replica]:
    return [Replica(f"tcp://10.0.0.{i}:5555") for i in range(n)]


KEYS = [f"session-{i}".encode() for i in range(2000)]


def test_every_frontend_puts_a_key_on_the_same_replica_whatever_its_order() -> None:
    mine, theirs = replicas(5), replicas(5)
    random.Random(1).shuffle(theirs)  # another frontend lists them in another order
    for key in KEYS[:200]:
        assert place(key, mine, 1.25, 0).address == place(key, theirs, 1.25, 0).address
    spread = Counter(place(key, mine, 1.25, 0).address for key in KEYS)
    assert len(spread) == 5 and min(spread.values()) > len(KEYS) / 5 * 0.8


def test_a_replica_leaving_or_joining_moves_only_its_own_keys() -> None:
    five = replicas(5)
    before = {key: place(key, five, 1.25, 0).address for key in KEYS}
    gone = five[2].address
    after = {key: place(key, five[:2] + five[3:], 1.25, 0).address for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert moved and all(before[key] == gone for key in moved)
    six = [*five, Replica("tcp://10.0.0.9:5555")]
    joined = {key: place(key, six, 1.25, 0).address for key in KEYS}
    assert all(joined[k] in (before[k], "tcp://10.0.0.9:5555") for k in KEYS)


def test_a_loaded_replica_spills_the_key_to_its_next_choice() -> None:
    three = replicas(3)
    key = KEYS[0]
    first = place(key, three, 1.25, 0)
    # 9 calls out, this the 10th: each may hold ceil(1.25 * 10 / 3) = 5.
    first.load = 5
    for other in three:
        if other is not first:
            other.load = 2
    second = place(key, three, 1.25, 9)
    assert second is not first
    first.load = 4  # under the bound again: back on its own replica
    assert place(key, three, 1.25, 9) is first
    assert place(key, [], 1.25, 0) is None


class Turn(bls.Message):
    session: str
    text: str = ""


def session_of(req: object) -> str | None:
    return req["user"] if isinstance(req, dict) else None  # type: ignore[index]


@pytest.mark.parametrize("req", [Turn(session="s1"), {"session": "s1"}], ids=["typed", "untyped"])
def test_the_key_is_a_field_of_the_request_typed_or_not(req: object) -> None:
    affinity = policy_from("llm", {"affinity": {"field": "session"}}).affinity
    assert affinity is not None
    assert key_of(affinity, req) == b"s1"
    assert key_of(affinity, {"text": "no session"}) is None  # placed by load


def test_the_key_is_what_a_function_says_and_anything_but_text_is_its_json() -> None:
    affinity = policy_from(
        "llm", {"affinity": {"function": "tests.test_affinity:session_of"}}
    ).affinity
    assert affinity is not None
    assert key_of(affinity, {"user": "ada"}) == b"ada"
    assert key_of(affinity, {"user": 7}) == b"7"
    assert key_of(affinity, Turn(session="x")) is None


def test_an_affinity_that_cannot_be_is_refused_naming_the_stage_and_the_field(
    tmp_path: Path,
) -> None:
    with pytest.raises(PolicyError, match=r"stage .llm.: .*give one of field, header or function"):
        policy_from("llm", {"affinity": {"field": "a", "function": "m:f"}})
    with pytest.raises(PolicyError, match=r"stage 'llm': affinity.balance"):
        policy_from("llm", {"affinity": {"field": "a", "balance": 0.5}})
    with pytest.raises(PolicyError, match=r"stage 'llm': .*fild"):
        policy_from("llm", {"affinity": {"fild": "a"}})
    toml = tmp_path / "bls.toml"
    toml.write_text(
        '[stages.llm]\nremote = "tcp://127.0.0.1:1"\naffinity = { function = "keys.py:nope" }\n'
    )
    (tmp_path / "keys.py").write_text("def session(req):\n    return req['s']\n")
    with pytest.raises(ConfigError, match=r"stage 'llm': affinity.function: .*nope"):
        make_bindings(load_config(None, toml))
    toml.write_text(
        '[stages.llm]\nremote = "tcp://127.0.0.1:1"\naffinity = { function = "keys.py:session" }\n'
    )
    (binding,) = make_bindings(load_config(None, toml)).values()
    assert key_of(binding.policy.affinity, {"s": "k"}) == b"k"  # (relative to bls.toml)


def test_an_affinity_key_stays_with_the_call_through_its_context() -> None:
    from bls.scope import CallContext

    ctx = CallContext(priority=3).keyed(b"k")
    assert ctx.key == b"k"
    assert ctx.within(1.0).key == ctx.at_priority(1).key == b"k"
    assert CallContext().key is None


def test_a_typed_handle_takes_an_affinity_where_bls_toml_gives_none() -> None:
    handle = bls.Stage("llm", Turn, Turn, affinity={"field": "session"})
    assert handle.policy is not None and handle.policy.affinity is not None
    assert key_of(handle.policy.affinity, Turn(session="s9")) == b"s9"


def test_the_key_is_a_header_of_the_http_request_the_call_is_made_for() -> None:
    from bls.scope import CallContext

    affinity = policy_from("llm", {"affinity": {"header": "X-Session-Id"}}).affinity
    assert affinity is not None
    served = CallContext(headers=[(b"accept", b"*/*"), (b"x-session-id", b"abc")])
    assert key_of(affinity, {"session": "ignored"}, served) == b"abc"
    assert key_of(affinity, {}, CallContext()) is None  # not made for an HTTP request
    # The request's headers reach every call made under it, as its deadline does.
    derived = served.within(1.0).at_priority(2).keyed(b"k")
    assert derived.headers == served.headers
