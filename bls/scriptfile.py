"""Loading a script file with its configuration: what ``bls run``/``check``/``serve`` share."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .bindings import Binding, Wrapper
from .check import StageUse, find_stage_uses, names_stages_dynamically, typed_handles
from .config import Config, ConfigError, check_names, load_config, make_bindings
from .entry import Script, entries
from .paths import missing
from .record_binding import RecordingBinding
from .runtime import Runtime
from .targets import load_module

__all__ = ["ScriptFile"]


class ScriptFile:
    """A script module, its entrypoints, and the bindings its configuration asks for.

    Loading imports the script and the inline targets (no worker set-up); the stage
    names the sources use are collected for the bind-time check.
    """

    def __init__(
        self,
        script: str | Path,
        *,
        config_file: str | Path | None = None,
        binds: Iterable[str] = (),
        options: dict[str, dict[str, Any]] | None = None,
        configured: bool = True,
        record: bool = False,
    ) -> None:
        path = Path(script)
        if not path.is_file():
            raise ConfigError(missing(script, what="script"))
        self.path = path
        self.module = load_module(str(path))
        self.entries: dict[str, Script] = entries(self.module)
        if not self.entries:
            raise ConfigError(f"{script} defines no @bls.script entrypoint")
        self.uses: list[StageUse] = find_stage_uses(path, self.module)
        self.declared = typed_handles(self.module)
        self.config = Config()
        self.bindings: dict[str, Binding] = {}
        if configured:  # else the caller binds the stages (bls replay, bls.testing)
            self._bind(load_config(path, config_file, binds, options), record)

    def _bind(self, config: Config, record: bool) -> None:
        """The bindings ``config`` asks for, each in front of a recorder when ``record``."""
        path = self.path
        self.config = config
        self.bindings = make_bindings(config)
        if record:
            self.bindings = {n: RecordingBinding(b) for n, b in self.bindings.items()}
        sources = [path]
        modules = [self.module]
        for binding in self.bindings.values():
            # A script bound as a stage: the names it uses must be bound here too.
            while isinstance(binding, Wrapper):  # a recorder's, a cache's
                binding = binding.inner
            source = getattr(binding, "script_file", None)
            if source and Path(source).resolve() != path.resolve():
                module = getattr(binding, "script_module", None)
                self.uses.extend(find_stage_uses(source, module))
                sources.append(Path(source))
                modules.append(module)
        # The typed handles these scripts can see: the types the bindings must fit.
        self.declared = typed_handles(*modules)
        if not any(names_stages_dynamically(s) for s in sources):
            check_names(self.config, (u.name for u in self.uses), path)

    def where_bound(self) -> list[str]:
        """One line per stage: its name, its binding, and what bound it (the file and
        table, or the ``--bind`` flag), for ``bls check`` and the start-up log."""
        lines = []
        for name in sorted(self.bindings):
            stage = self.config.stages.get(name)
            origin = f" ({_origin(stage.source)})" if stage is not None and stage.source else ""
            lines.append(f"{name}: {self.bindings[name].description}{origin}")
        return lines

    def entry(self, name: str | None) -> Script:
        """The entry called ``name``, or the only one when ``name`` is None."""
        if name is None:
            if len(self.entries) == 1:
                return next(iter(self.entries.values()))
            raise ConfigError(
                f"{self.path} has several entrypoints ({', '.join(self.entries)}): "
                f"choose one with --entry"
            )
        try:
            return self.entries[name]
        except KeyError:
            raise ConfigError(
                f"{self.path} has no entrypoint {name!r} (it has: {', '.join(self.entries)})"
            ) from None

    def runtime(self, *, start_unreachable: bool = False) -> Runtime:
        """The runtime for the script's bindings. ``start_unreachable``: start even while
        a remote stage has no replica answering (serving processes: any start order)."""
        return Runtime(
            self.bindings,
            declared=self.declared,
            uses=self.uses,
            start_unreachable=start_unreachable,
        )


def _origin(source: str) -> str:
    """What bound a stage, short: ``bls.toml`` (its path relative to here when it is
    below), or the ``--bind`` flag itself."""
    if source.startswith("--bind"):
        return source
    path, _, _ = source.partition(": [")
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path
