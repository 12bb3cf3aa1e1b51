"""Bindings configuration: bls.toml, --config and --bind, merged and checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bls.config import ConfigError, check_names, load_config, make_bindings, parse_bind


def _script(folder: Path, toml: str = "") -> Path:
    script = folder / "app.py"
    script.write_text("")
    if toml:
        (folder / "bls.toml").write_text(toml)
    return script


def test_later_sources_win_and_moving_a_stage_keeps_its_options(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        '[stages.gen]\ninline = "m:a"\noptions = { size = 3 }\ncache = { capacity_mb = 8 }\n'
        '[stages.judge]\ninline = "m:judge"\n',
    )
    override = tmp_path / "prod.toml"
    override.write_text('[stages.judge]\nremote = "tcp://10.0.0.5:5555"\n')
    config = load_config(script, override, ["gen=tcp://127.0.0.1:5555,tcp://127.0.0.1:5556"])
    gen, judge = config.stages["gen"], config.stages["judge"]
    assert gen.target() == ["tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556"]
    assert gen.options == {"size": 3} and gen.cache == {"capacity_mb": 8}
    assert judge.target() == ["tcp://10.0.0.5:5555"]


def test_relative_paths_are_resolved_against_the_file_that_names_them(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    script = _script(tmp_path, '[stages.a]\ninline = "stages.py:a"\n')
    other = tmp_path / "conf" / "keys.toml"
    other.write_text('[transport]\ncurve_server_key = "k/w.key"\ncurve_secret = "k/c.key_secret"\n')
    config = load_config(script, other)
    assert config.stages["a"].base == str(tmp_path.resolve())
    assert config.transport.curve_server_key == str(tmp_path.resolve() / "conf/k/w.key")
    assert config.transport.curve_secret == str(tmp_path.resolve() / "conf/k/c.key_secret")


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[stages.a]\ninline = "m:a"\nremote = "tcp://h:1"\n',
            "exactly one of 'inline', 'remote', 'discover' or 'targets'",
        ),
        ('[stages.a]\ninlin = "m:a"\n', "unknown field `inlin`"),
        ('[stages.a]\nremote = "h:5555"\n', "write tcp://h:5555"),
        ('[stages.a]\nremote = "udp://h:1"\n', "needs a scheme"),
        ("[stages\n", "invalid TOML"),
        ("[transport]\nheartbeat = 1\n", "unknown field `heartbeat`"),
        ("[runs]\nmax_result_bytes = 600000000\n", "<= 536870912 - at `$.runs.max_result_bytes`"),
    ],
)
def test_mistakes_in_a_file_are_named_with_the_file(
    tmp_path: Path, toml: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_script(tmp_path, toml))
    assert message in str(info.value) and "bls.toml" in str(info.value)


def test_a_bind_needs_a_name_and_a_scheme_for_an_address() -> None:
    with pytest.raises(ConfigError, match="expected NAME=TARGET"):
        parse_bind("judge")
    with pytest.raises(ConfigError, match=r"write tcp://127\.0\.0\.1:5555"):
        parse_bind("judge=127.0.0.1:5555")
    name, stage = parse_bind(" judge = tcp://a:1 , ipc:///x ")
    assert (name, stage.target()) == ("judge", ["tcp://a:1", "ipc:///x"])


def test_unknown_stage_names_are_refused_with_the_closest_one(tmp_path: Path) -> None:
    script = _script(tmp_path, '[stages.other_scripts_stage]\ninline = "m:x"\n')
    check_names(load_config(script), ["judge"], script)  # a shared file may bind others
    typo = load_config(script, binds=["jduge=m:y"])
    with pytest.raises(ConfigError) as caught:  # the script's judge is bound by nothing
        check_names(typo, ["judge", "draft"], script)
    assert str(caught.value) == (
        "--bind jduge=m:y: binds stage 'jduge', which the script does not use; the script "
        "uses 'judge', which nothing binds: one of the two names is misspelt"
    )
    both = load_config(script, binds=["judge=m:x", "jduge=m:y"])
    with pytest.raises(ConfigError, match=r"no stage 'jduge' .*did you mean 'judge'\?"):
        check_names(both, ["judge", "draft"], script)  # judge is bound: jduge is the slip
    (tmp_path / "b").mkdir()
    near = _script(tmp_path / "b", '[stages.jugde]\ninline = "m:x"\n')  # a near miss
    with pytest.raises(ConfigError, match="the script uses 'judge', which nothing binds"):
        check_names(load_config(near), ["judge"], near)


def test_unknown_keys_say_which_key_was_meant(tmp_path: Path) -> None:
    for toml, said in [
        ('[stages.judge]\ninlin = "m:x"\n', "unknown field `inlin` (did you mean `inline`?)"),
        ('[stage.judge]\ninline = "m:x"\n', "unknown field `stage` (did you mean `stages`?)"),
        ("[admission.tenants.a]\nrat = 2\n", "unknown field `rat` (did you mean `rate`?)"),
    ]:
        script = _script(tmp_path, toml)
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_config(script)
    toml = '[stages.judge]\ninline = "asyncio:sleep"\nhedge = { afer_ms = 2 }\n'
    meant = "hedge: Object contains unknown field `afer_ms` (did you mean `after_ms`?)"
    with pytest.raises(ConfigError, match=re.escape(meant)):
        make_bindings(load_config(_script(tmp_path, toml)))


def test_a_bad_worker_option_names_the_stage_once(tmp_path: Path) -> None:
    (tmp_path / "w.py").write_text(
        "import bls, msgspec\n"
        "class O(msgspec.Struct, forbid_unknown_fields=True):\n    size: int = 1\n"
        "class W(bls.Worker):\n    Options = O\n"
        "    async def __call__(self, req: dict) -> dict:\n        return req\n"
    )
    toml = '[stages.gen]\ninline = "w.py:W"\noptions = { size = "big" }\n'
    with pytest.raises(ConfigError) as info:
        make_bindings(load_config(_script(tmp_path, toml)))
    assert str(info.value) == (
        "stage 'gen': cannot bind 'w.py:W': bad option for W at $.size: Expected `int`, got `str`"
    )


def test_discovered_stages_from_the_file_and_the_command_line(tmp_path: Path) -> None:
    from bls.config import make_bindings
    from bls.targets import binding_for
    from bls.transport.replicas import RemoteBinding

    script = tmp_path / "s.py"
    script.write_text("")
    (tmp_path / "bls.toml").write_text(
        '[stages.encoder]\ndiscover = "vision-encoder"\n\n'
        '[transport]\ndiscovery = "etcd://etcd.local:2379"\nnamespace = "prod"\n'
    )
    config = load_config(script, binds=["judge=etcd:judge"])
    bindings = make_bindings(config)
    for name, registered_as in (("encoder", "vision-encoder"), ("judge", "judge")):
        binding = bindings[name]
        assert isinstance(binding, RemoteBinding)
        assert binding.registered_as == registered_as
        assert binding.description == f"etcd:{registered_as}"
        assert binding.settings.discovery == "etcd://etcd.local:2379"
        assert binding.settings.namespace == "prod"
    assert isinstance(binding_for("x", "etcd:x"), RemoteBinding)
