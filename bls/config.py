"""Binding configuration: ``bls.toml`` beside the script, ``--config FILE``, ``--bind``.

Later sources win per stage: ``bls.toml`` < ``--config`` < ``--bind``. Relative file
targets (``stages.py:fn``) are resolved against the directory of the file that names
them; ``--bind`` targets against the working directory.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import msgspec

from .bindings import Binding
from .cache import CachedBinding, CacheOptions
from .journal import MAX_VALUE_BYTES
from .messages import unknown_field_hint
from .paths import missing
from .policy import policy_from
from .stores import anchored
from .targets import binding_for, load_target, scheme_of

__all__ = [
    "AdmissionConfig",
    "ConfigError",
    "Limit",
    "RunsConfig",
    "StageConfig",
    "TransportConfig",
    "check_names",
    "is_remote",
    "load_config",
    "make_bindings",
    "parse_bind",
]

CONFIG_NAME = "bls.toml"
DISCOVER_SCHEME = "etcd:"  # --bind NAME=etcd:STAGE: replicas found in etcd
POLICY_KNOBS = ("idempotent", "hedge", "retry", "eject", "affinity")


class ConfigError(ValueError):
    """A configuration file or flag is wrong; the message names the file and the key."""


# Every number is checked as the file is read, so a 0 or a negative is refused at start-up
# naming its key (a heartbeat of 0 would spin; a bound of 0 would call every peer dead).
_Seconds = Annotated[float, msgspec.Meta(gt=0)]
_Bytes = Annotated[int, msgspec.Meta(ge=1, le=2**62)]


class TransportConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``[transport]`` in ``bls.toml``: settings for remote bindings."""

    heartbeat_s: _Seconds = 0.25
    dead_after_s: _Seconds = 1.0  # a caller declares a silent worker lost after this
    caller_dead_after_s: _Seconds = 15.0  # a worker gives up on a silent caller after this
    connect_timeout_s: _Seconds = 5.0
    max_frame_bytes: _Bytes = 256 * 1024 * 1024
    curve_server_key: str | None = None
    curve_secret: str | None = None
    # Where stages bound with `discover = "NAME"` (or --bind NAME=etcd:NAME) find their
    # workers: etcd://HOST:2379 (also --discovery), under /NAMESPACE/stages/NAME/.
    discovery: str | None = None
    namespace: str = "bls"


class Limit(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A bound on an entry's or a tenant's requests (``[admission.entries.NAME]``,
    ``[admission.tenants.NAME]``): at once, and a second with a burst; past it, 429 with
    Retry-After. ``weight``: a tenant's share when requests queue (2: twice the others')."""

    max_inflight: Annotated[int, msgspec.Meta(ge=1)] | None = None
    rate: Annotated[float, msgspec.Meta(gt=0)] | None = None  # requests a second
    burst: Annotated[int, msgspec.Meta(ge=1)] | None = None  # default: the rate, at least 1
    weight: Annotated[float, msgspec.Meta(gt=0, le=1000)] = 1.0


class AdmissionConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``[admission]`` in ``bls.toml``: who ``bls serve`` lets in, and who waits (see
    docs/policy.md). ``max_queued``: requests that wait for a slot when ``--max-inflight``
    are running (0: none wait, the rest get 429); ``reserved``: slots only requests of a
    priority above 0 may take; ``tenants."*"``: each tenant not named; ``tenant``: the
    function that names a request's tenant instead of its ``X-Tenant``."""

    max_queued: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    reserved: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 0
    entries: dict[str, Limit] = {}
    tenants: dict[str, Limit] = {}
    tenant: str | None = None  # "FILE:FUNCTION" naming each request's tenant (serve/tenants.py)
    base: str | None = None  # where ``tenant``'s file is resolved from (not a TOML key)
    # This process's limits are its share of N processes' (bls serve --processes; not a
    # TOML key): a 429 says so.
    processes: Annotated[int, msgspec.Meta(ge=1)] = 1


class RunsConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``[runs]`` in ``bls.toml``: background runs (docs/runs.md). ``store``: where their
    journal is kept (``sqlite:///PATH``; none: the default state file; ``"off"``: no
    background runs, ``Prefer: respond-async`` is then ignored); ``lease_s``: how long a
    run stays its frontend's without a renewal (a dead frontend's runs are taken over
    then); ``max_running``: runs at once in a frontend (the rest wait, queued);
    ``max_queued``: runs that may wait (more are answered 429); ``timeout_s``: a run's
    deadline when its request names none; ``retain_s``, ``retain``: finished runs are
    forgotten after this long, and past the newest this many runs (of any status: a
    queued or running one counts, and is never forgotten); ``max_result_bytes``: a streaming
    run's items kept as its result (past it, its result is null: they are in its
    events), and a unary run's result (past it, the run fails: ``result_too_large``; at
    most 512 MiB, for a store holds a value of 1 GB at most); ``max_value_bytes``: a
    stage call a run journals (its request and its result or items: past it, the call
    fails, ``too_large``), and an item of a streaming run (past it, the run fails:
    ``item_too_large``), at most 512 MiB; ``max_event_streams``:
    ``/events`` streams open at once (more get 503);
    ``max_file_bytes``: a file of the Files API (``POST /v1/files``, a batch's output), at
    most; ``batch_concurrency``: a batch's lines running at once; ``batch_window_s``: how
    long a batch may run before it expires (what its ``completion_window``, ``24h``,
    means here); ``batch_input_bytes``: the input files of the batches a frontend runs
    at once, in bytes, at most (a batch past it waits its turn; one larger runs alone),
    and, apart, of those it checks as they are made; ``max_bytes``: what a SQLite store
    (its runs and files) may take on disk: past it, finished runs are forgotten oldest
    first, and while it is still past after that new runs are refused (503,
    ``store_full``; PostgreSQL's space is the database's to bound)."""

    store: str | None = None
    lease_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    max_running: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 256
    max_queued: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 10_000
    max_result_bytes: Annotated[int, msgspec.Meta(ge=0, le=MAX_VALUE_BYTES)] = 64 * 1024 * 1024
    max_value_bytes: Annotated[int, msgspec.Meta(ge=1, le=MAX_VALUE_BYTES)] = MAX_VALUE_BYTES
    max_event_streams: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)] = 1024
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1)] = 64 * 1024 * 1024
    batch_concurrency: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 16
    batch_window_s: Annotated[float, msgspec.Meta(gt=0)] = 24 * 3600.0
    batch_input_bytes: Annotated[int, msgspec.Meta(ge=1)] = 256 * 1024 * 1024
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 24 * 3600.0
    retain_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 24 * 3600.0
    retain: Annotated[int, msgspec.Meta(ge=0)] = 100_000
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] = 16 * 1024**3


class VersionConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One of ``targets = [...]`` (bls/versions.py): a target, its weight, its name."""

    inline: str | None = None
    remote: list[str] | str | None = None
    discover: str | None = None
    weight: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    name: str | None = None  # in traces and metrics (default: the target)
    options: dict[str, Any] = {}


class StageConfig(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """``[stages.NAME]`` in ``bls.toml``: exactly one of ``inline``/``remote``/``discover``,
    or ``targets``, several of them with weights."""

    inline: str | None = None
    remote: list[str] | str | None = None
    discover: str | None = None  # the stage name its workers register under in etcd
    targets: list[VersionConfig] | None = None  # weighted versions (bls/versions.py)
    sticky: str | None = None  # with targets: the request field that picks the version
    options: dict[str, Any] = {}
    cache: dict[str, Any] | None = None
    # Traffic policy (bls/policy.py): checked when the bindings are made.
    idempotent: bool | None = None
    hedge: dict[str, Any] | None = None
    retry: dict[str, Any] | None = None
    eject: dict[str, Any] | None = None
    affinity: dict[str, Any] | None = None
    # Where relative paths in this entry are resolved from, and where the entry was
    # written, for messages (not TOML keys).
    base: str | None = None
    source: str = ""

    def target(self) -> str | list[str]:
        if self.targets is not None:
            return [_target_of(v) for v in self.targets]
        if self.discover is not None:
            return DISCOVER_SCHEME + self.discover
        if self.remote is not None:
            return [self.remote] if isinstance(self.remote, str) else list(self.remote)
        assert self.inline is not None
        return self.inline


def _target_of(version: VersionConfig | StageConfig) -> str:
    """A single target, as text (a version's; a list of remotes comma-separated)."""
    if version.discover is not None:
        return DISCOVER_SCHEME + version.discover
    if version.remote is not None:
        return version.remote if isinstance(version.remote, str) else ",".join(version.remote)
    assert version.inline is not None
    return version.inline


class Config(msgspec.Struct, forbid_unknown_fields=True):
    stages: dict[str, StageConfig] = {}
    transport: TransportConfig = msgspec.field(default_factory=TransportConfig)
    admission: AdmissionConfig = msgspec.field(default_factory=AdmissionConfig)
    runs: RunsConfig = msgspec.field(default_factory=RunsConfig)


def _table_of(raw: dict[str, Any], exc: msgspec.ValidationError) -> str:
    """msgspec's error, naming the table when it is one of ``[admission.*.NAME]`` (msgspec
    does not say which key of a table of tables failed)."""
    admission = raw.get("admission")
    if isinstance(admission, dict):
        for kind in ("entries", "tenants"):
            tables = admission.get(kind)
            for name, table in tables.items() if isinstance(tables, dict) else ():
                try:
                    msgspec.convert(table, Limit)
                except msgspec.ValidationError as inner:
                    hint = unknown_field_hint(Limit, str(inner))
                    return f"[admission.{kind}.{name}]: {inner}{hint}"
    return f"{exc}{unknown_field_hint(Config, str(exc))}"


def _read(path: Path) -> Config:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(missing(path, what="config file")) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    stages = raw.pop("stages", {})
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {_table_of(raw, exc)}") from None
    if not isinstance(stages, dict):
        raise ConfigError(f"{path}: 'stages' must be a table of [stages.NAME] tables")
    for name, table in stages.items():
        try:
            config.stages[name] = msgspec.convert(table, StageConfig)
        except msgspec.ValidationError as exc:
            hint = unknown_field_hint(StageConfig, str(exc), hidden=("base", "source"))
            raise ConfigError(f"{path}: [stages.{name}]: {exc}{hint}") from None
    base = path.parent.resolve()
    for name, stage in config.stages.items():
        where = f"{path.resolve()}: [stages.{name}]"
        given = [
            k for k in ("inline", "remote", "discover", "targets") if getattr(stage, k) is not None
        ]
        if len(given) != 1:
            raise ConfigError(
                f"{where} needs exactly one of 'inline', 'remote', 'discover' or 'targets'"
            )
        _check_versions(where, stage)
        stage.base = str(base)
        stage.source = where
        _check_target(where, stage)
    if config.admission.tenant is not None:
        config.admission.base = str(base)
    if config.runs.store is not None:
        config.runs.store = anchored(config.runs.store, base)
    # Key files, like stage targets, are relative to the file that names them.
    transport = config.transport
    for key in ("curve_server_key", "curve_secret"):
        value = getattr(transport, key)
        if value:
            setattr(transport, key, str(base / Path(value).expanduser()))
    return config


# host:port or an IP address with a port, as people type them without a scheme.
_BARE_ADDRESS = re.compile(r"^(\[[0-9a-fA-F:]+\]|[\w.-]+):\d+$")


def _check_versions(where: str, stage: StageConfig) -> None:
    """``targets``: each exactly one target; ``sticky`` only with them."""
    if stage.sticky is not None and stage.targets is None:
        raise ConfigError(f"{where}: 'sticky' chooses between 'targets', and there are none")
    for i, version in enumerate(stage.targets or ()):
        given = [k for k in ("inline", "remote", "discover") if getattr(version, k) is not None]
        if len(given) != 1:
            raise ConfigError(
                f"{where}: targets[{i}] needs exactly one of 'inline', 'remote' or 'discover'"
            )


def _check_target(where: str, stage: StageConfig) -> None:
    """Catch an address written without its scheme before it is taken for a module."""
    targets = stage.target()
    for target in [targets] if isinstance(targets, str) else targets:
        if _BARE_ADDRESS.match(target) and not target.split(":")[0].endswith(".py"):
            raise ConfigError(
                f"{where}: {target!r} looks like an address without a scheme: write tcp://{target}"
            )
        if stage.remote is not None and not is_remote(target):
            raise ConfigError(
                f"{where}: remote address {target!r} needs a scheme: tcp://, ipc:// or inproc://"
            )


def parse_bind(spec: str) -> tuple[str, StageConfig]:
    """``NAME=TARGET`` from the command line (TARGET inline or comma-separated remotes)."""
    name, sep, target = spec.partition("=")
    name, target = name.strip(), target.strip()
    if not sep or not name or not target:
        raise ConfigError(f"--bind {spec!r}: expected NAME=TARGET (e.g. judge=stages.py:judge)")
    base = str(Path.cwd())
    where = f"--bind {spec}"
    if target.startswith(DISCOVER_SCHEME):
        config = StageConfig(discover=target[len(DISCOVER_SCHEME) :], base=base, source=where)
    elif is_remote(target):
        remote = [t.strip() for t in target.split(",")]
        config = StageConfig(remote=remote, base=base, source=where)
    else:
        config = StageConfig(inline=target, base=base, source=where)
    _check_target(where, config)
    return name, config


def load_config(
    script: str | Path | None,
    config_file: str | Path | None = None,
    binds: Iterable[str] = (),
    options: dict[str, dict[str, Any]] | None = None,
) -> Config:
    """Merge ``bls.toml`` beside ``script``, ``config_file`` and ``binds``, in that order."""
    merged = Config()
    sources: list[Path] = []
    if script is not None:
        beside = Path(script).resolve().parent / CONFIG_NAME
        if beside.is_file():
            sources.append(beside)
    if config_file is not None:
        sources.append(Path(config_file))
    for source in sources:
        config = _read(source)
        for name, stage_config in config.stages.items():
            previous = merged.stages.get(name)
            if previous is not None and not stage_config.options:
                stage_config.options = previous.options  # rebinding keeps the options
            for knob in POLICY_KNOBS if previous is not None else ():
                if getattr(stage_config, knob) is None:  # ...and the policy not given again
                    setattr(stage_config, knob, getattr(previous, knob))
            merged.stages[name] = stage_config
        if config.transport != TransportConfig():
            merged.transport = config.transport
        if config.admission != AdmissionConfig():
            merged.admission = config.admission
        if config.runs != RunsConfig():
            merged.runs = config.runs
    for spec in binds:
        name, stage_config = parse_bind(spec)
        previous = merged.stages.get(name)
        if previous is not None:  # moving a stage keeps its options, cache and policy
            stage_config.cache = previous.cache
            for knob in POLICY_KNOBS:
                setattr(stage_config, knob, getattr(previous, knob))
            # ...but another class in process is not given the options of the one it
            # replaces (bls.toml's vLLM options are not FakeLLM's).
            if not (stage_config.inline and previous.inline != stage_config.inline):
                stage_config.options = previous.options
        merged.stages[name] = stage_config
    for name, extra in (options or {}).items():
        if name not in merged.stages:
            raise ConfigError(f"--option for stage {name!r}, which is not bound")
        merged.stages[name].options = {**merged.stages[name].options, **extra}
    return merged


def is_remote(target: str) -> bool:
    """Whether ``target`` (one address, or several comma-separated) names remote replicas."""
    return any(scheme_of(part.strip()) is not None for part in target.split(","))


def check_names(config: Config, used: Iterable[str], script: str | Path) -> None:
    """Refuse a binding for a stage the script never uses: a typo would otherwise leave
    the real stage bound as before, silently. The error suggests the closest name.

    The ``bls.toml`` beside a script may be shared by the other scripts in its folder:
    a name there that is close to none the script uses belongs to one of them, not to
    a typo. Names from ``--bind`` and ``--config`` must all be used.
    """
    used = sorted(set(used))
    beside = str(Path(script).resolve().parent / CONFIG_NAME)
    for name, stage in config.stages.items():
        if name in used:
            continue
        shared = stage.source.startswith(beside)
        # In a shared file only a near miss (a transposition, a missing letter) is a typo.
        close = difflib.get_close_matches(name, used, n=1, cutoff=0.75 if shared else 0.6)
        if not close and shared:
            continue
        where = stage.source or "config"
        if close and close[0] not in config.stages:
            # The script uses a name nothing binds: which of the two is misspelt, the
            # script's or the binding's, only the user can tell.
            raise ConfigError(
                f"{where}: binds stage {name!r}, which the script does not use; the script "
                f"uses {close[0]!r}, which nothing binds: one of the two names is misspelt"
            )
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = ", ".join(used) or "none"
        raise ConfigError(
            f"{where}: no stage {name!r} in the script{hint}; the stages it uses: {known}"
        )


def _cached(name: str, stage: StageConfig, binding: Binding) -> Binding:
    try:
        options = msgspec.convert(stage.cache, CacheOptions)
        identity = {"stage": name, "target": stage.target(), "options": stage.options}
        return CachedBinding(binding, options, identity)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"stage {name!r}: bad 'cache' table: {exc}") from None


def _bound(
    name: str, target: Any, options: dict[str, Any], base: Path | None, settings: Any
) -> Binding:
    try:
        return binding_for(name, target, options=options, base=base, settings=settings)
    except (ImportError, ValueError, TypeError, FileNotFoundError, SyntaxError) as exc:
        why = str(exc).removeprefix(f"stage {name!r}: ")  # (named once)
        raise ConfigError(f"stage {name!r}: cannot bind {target!r}: {why}") from exc


def _versioned(
    name: str, stage: StageConfig, base: Path | None, settings: TransportConfig
) -> Binding:
    from .versions import Version, VersionedBinding

    versions = []
    for version in stage.targets or ():
        target = _target_of(version)
        bound = _bound(name, _listed(version, target), version.options, base, settings)
        versions.append(Version(version.name or target, bound, version.weight))
    try:
        return VersionedBinding(name, versions, stage.sticky)
    except ValueError as exc:
        raise ConfigError(f"{stage.source}: {exc}") from None


def _listed(version: VersionConfig, target: str) -> Any:
    """What binding_for takes for a version: its remotes as a list."""
    if version.remote is not None and not isinstance(version.remote, str):
        return list(version.remote)
    return target


def make_bindings(config: Config) -> dict[str, Binding]:
    """Turn a merged configuration into bindings (imports inline targets; no set-up)."""
    bindings: dict[str, Binding] = {}
    for name, stage in config.stages.items():
        base = Path(stage.base) if stage.base else None
        binding = (
            _versioned(name, stage, base, config.transport)
            if stage.targets is not None
            else _bound(name, stage.target(), stage.options, base, config.transport)
        )
        knobs = {k: getattr(stage, k) for k in POLICY_KNOBS if getattr(stage, k) is not None}
        if knobs:
            try:
                load = partial(load_target, base=base)
                binding.set_policy(policy_from(name, knobs, load=load))
            except ValueError as exc:
                raise ConfigError(f"{stage.source or 'bls.toml'}: {exc}") from None
        if stage.cache is not None:
            binding = _cached(name, stage, binding)
        bindings[name] = binding
    return bindings
