"""What a target names: ``module:attr``, ``path/to/file.py:attr`` (a stage's inline
target, ``bls worker``'s, a tenant function), a whole script file, or a remote one
(``tcp://host:port``, ``etcd:NAME``: a scheme another kind of binding registered); and
the binding a target makes (:func:`binding_for`).

A file is imported once, under its own name when that is free (so the modules beside it
can ``import`` it, as ``python file.py`` would let them), and its folder is put on the
path, so that it can import its neighbours. Relative paths are resolved against the
folder of the file that names them (:mod:`bls.paths`).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .bindings import Binding, InlineBinding
from .paths import missing

__all__ = ["binding_for", "load_module", "load_target", "scheme_of"]


def _import_file(path: Path) -> Any:
    """Import a ``.py`` file once, sharing the module with a plain ``import stem``."""
    path = path.resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    stem = path.stem
    existing = sys.modules.get(stem)
    if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path:
        return existing
    if existing is None and stem.isidentifier():
        name = stem
    else:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
        name = f"_bls_{digest}_{stem}"
        if name in sys.modules:
            return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_module(spec: str, base: Path | None = None) -> Any:
    """Import ``pkg.module`` or ``path/to/file.py`` (relative to ``base``, the folder of
    the file that names it, or the current directory: see :mod:`bls.paths`)."""
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_absolute() and base is not None:
            path = base / path
        if not path.is_file():
            raise FileNotFoundError(missing(spec, path.resolve()))
        parent = str(path.resolve().parent)
        if parent not in sys.path:
            # Lets the file import its neighbours, as `python file.py` would.
            sys.path.insert(0, parent)
        return _import_file(path)
    return importlib.import_module(spec)


def load_target(target: str, base: Path | None = None) -> Any:
    """Resolve ``module:attr`` or ``path/to/file.py:attr`` to the object it names."""
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise ValueError(
            f"binding target {target!r} must look like 'module:attr' or 'file.py:attr'"
        )
    module = load_module(module_part, base)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{module_part} has no attribute {part!r}{hint}") from None
    return obj


# -- making bindings from targets ---------------------------------------------------------


def binding_for(
    name: str,
    target: Any,
    *,
    options: Mapping[str, Any] | None = None,
    base: Path | None = None,
    settings: Any = None,
) -> Binding:
    """The binding for ``target``: a Binding, an object (function, Worker, script), a
    ``module:attr``/``file.py:attr`` string (relative to ``base``), or a target with a
    registered scheme (``tcp://host:port``, several comma-separated or in a list,
    ``etcd:NAME``), made by that scheme's factory with ``settings`` (``[transport]``)."""
    if isinstance(target, Binding):
        return target
    first = target[0] if isinstance(target, (list, tuple)) and target else target
    scheme = scheme_of(first) if isinstance(first, str) else None
    if scheme is not None:
        return _schemes()[scheme](name, target, settings)
    if isinstance(target, str):
        return InlineBinding(
            name, load_target(target, base), options=options, description=f"inline {target}"
        )
    return InlineBinding(name, target, options=options)


def scheme_of(target: str) -> str | None:
    """The registered scheme ``target`` starts with (``tcp`` for ``tcp://h:1``), or None."""
    head, sep, _ = target.partition(":")
    return head if sep and head in _schemes() else None


_factories: dict[str, Callable[[str, Any, Any], Binding]] | None = None


def _schemes() -> dict[str, Callable[[str, Any, Any], Binding]]:
    """The factories of the installed binding kinds, by scheme (loaded on first use)."""
    global _factories
    if _factories is None:
        from importlib.metadata import entry_points

        _factories = {ep.name: _lazy(ep) for ep in entry_points(group="bls.schemes")}
    return _factories


def _lazy(ep: Any) -> Callable[[str, Any, Any], Binding]:
    def make(name: str, target: Any, settings: Any) -> Binding:
        return ep.load()(name, target, settings)

    return make
