"""The docs name only what exists: every file path they mention, and every bls module."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_PATH = re.compile(
    r"\b(?:bls|transport|models|bench|tests|examples|deploy|docs)/[\w./-]*\.(?:py|md|toml|yaml|json)\b"
)
_MODULE = re.compile(r"\bbls\.(?:transport|models|serve)\.\w+\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    text = doc.read_text()
    missing = sorted({p for p in _PATH.findall(text) if not (ROOT / p).exists()})
    assert missing == [], f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_bls_module_a_doc_names_imports(doc: Path) -> None:
    missing = []
    for name in sorted(set(_MODULE.findall(doc.read_text()))):
        module, _, attr = name.rpartition(".")
        try:
            importlib.import_module(name)
        except ImportError:
            try:
                getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError):
                missing.append(name)
    assert missing == [], f"{doc.name} names modules that do not exist: {missing}"
