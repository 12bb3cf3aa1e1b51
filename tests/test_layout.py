"""The layout holds: no two modules import each other, not even lazily or in a ring."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "bls": ROOT / "bls",
    "bls.loop": ROOT / "bls" / "loop",
    "bls.serve": ROOT / "bls" / "serve",
    "bls.transport": ROOT / "transport",
    "bls.models": ROOT / "models",
}


def _modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The bls modules ``name`` imports anywhere in its source (functions included)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles() -> None:
    modules = _modules()
    known = set(modules)
    # The package itself re-exports the API: modules below it must not import it back.
    graph = {name: _imports(name, path, known) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_check_finds_a_ring() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# -- layers: which folder may import which ------------------------------------------------

# The core (bls/) imports no other layer, except the command line, which puts them
# together; the transport, the HTTP frontend and the models import the core, not each
# other (a worker's chat types are the core's, not the HTTP package's).
_CLI = {"bls.cli", "bls.commands", "bls.testing", "bls.batchfile"}  # they put the layers together
_LAYER_MAY_IMPORT = {
    "bls": {"bls"},
    "bls.transport": {"bls", "bls.transport"},
    "bls.serve": {"bls", "bls.serve"},
    "bls.models": {"bls", "bls.models"},
}


def _layer(module: str) -> str:
    for layer in ("bls.transport", "bls.serve", "bls.models"):
        if module == layer or module.startswith(layer + "."):
            return layer
    return "bls"


def test_each_folder_imports_only_the_layers_below_it() -> None:
    modules = _modules()
    known = set(modules)
    wrong = []
    for name, path in modules.items():
        if name in _CLI:
            continue
        allowed = _LAYER_MAY_IMPORT[_layer(name)]
        for target in _imports(name, path, known):
            if _layer(target) not in allowed:
                wrong.append(f"{name} imports {target}")
    assert wrong == [], "\n".join(wrong)


def _loaded_by(statement: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules under ``prefixes`` that ``statement`` loads, in a new interpreter."""
    import subprocess
    import sys

    code = f"import sys; {statement}; "
    code += f"print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_import_bls_loads_neither_the_http_package_nor_the_transport() -> None:
    assert _loaded_by("import bls", ("bls.serve", "bls.transport")) == []


def test_bls_testing_loads_neither_the_http_package_nor_torch_until_asked() -> None:
    """Tests of a script's logic import bls.testing: torch alone took a second of that."""
    assert _loaded_by("from bls import testing", ("bls.serve", "torch")) == []


def test_no_two_modules_share_a_name_across_the_folders() -> None:
    folders = [ROOT / "bls", ROOT / "bls" / "serve", ROOT / "transport", ROOT / "bench"]
    seen: dict[str, Path] = {}
    twins = []
    for folder in folders:
        stems = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
        stems |= {
            p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
        }
        for stem in stems:
            if stem in seen and seen[stem] != folder:
                twins.append(
                    f"{stem}: {seen[stem].relative_to(ROOT)} and {folder.relative_to(ROOT)}"
                )
            seen.setdefault(stem, folder)
    assert twins == [], twins


def test_modules_and_functions_stay_small_and_nothing_cleans_up_in_del() -> None:
    problems = []
    for folder in ("bls", "transport", "models"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            lines = len(text.splitlines())
            if folder != "models" and lines > 500:
                problems.append(f"{path.relative_to(ROOT)}: {lines} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    if size > 80:
                        problems.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {size}"
                        )
                    if node.name == "__del__" and folder != "models":
                        problems.append(f"{path.relative_to(ROOT)}:{node.lineno} __del__")
    assert problems == [], problems


def _backends_named(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return {name.split(".")[0] for name in names} & {"asyncio", "trio", "sniffio"}


def test_only_the_seams_name_the_event_loop() -> None:
    """bls/loop/ owns every asyncio/trio difference but the HTTP server's: the runner
    (which server runs on which loop) and the trio driver, which moves the bytes on
    trio's own waits. The asyncio driver is handed its loop. (bls bench's load
    generator runs on a plain selector, bls/loadconn.py.)"""
    naming = sorted(
        str(path.relative_to(ROOT))
        for folder in ("bls", "transport")
        for path in (ROOT / folder).rglob("*.py")
        if _backends_named(path)
    )
    assert naming == [
        "bls/loop/__init__.py",  # (sniffio: which backend runs)
        "bls/loop/_asyncio.py",
        "bls/loop/_trio.py",
        "bls/serve/server.py",
        "bls/serve/trio_http.py",
    ], naming


def test_each_backend_module_names_its_own_backend_only() -> None:
    """One module per backend, as anyio's ``_backends``: a seam grows by files."""
    loop = ROOT / "bls" / "loop"
    assert _backends_named(loop / "_asyncio.py") == {"asyncio"}
    assert _backends_named(loop / "_trio.py") == {"trio"}
    assert _backends_named(loop / "__init__.py") == {"sniffio"}
    assert _backends_named(ROOT / "bls" / "serve" / "trio_http.py") == {"trio"}


def _importers(target: str) -> set[str]:
    modules = _modules()
    known = set(modules)
    return {name for name, path in modules.items() if target in _imports(name, path, known)}


def test_admission_is_one_room() -> None:
    """Who runs, waits or gets 429 is decided in serve/admission.py: the tenant function
    and the admission headers are read there alone, and the frontend and the command line
    (its checks before anything starts) reach it through that one module."""
    assert _importers("bls.serve.tenants") == {"bls.serve.admission"}
    assert _importers("bls.serve.admission") <= {"bls.serve.app", "bls.commands"}


def test_metrics_ask_each_binding_for_its_counts_and_look_inside_none() -> None:
    source = (ROOT / "bls" / "serve" / "metrics.py").read_text()
    assert ".counts()" in source
    for hunt in ("getattr(binding", "hasattr(", ".inner", "isinstance(binding"):
        assert hunt not in source, hunt


def test_a_replicas_health_is_read_and_written_in_ejection_alone() -> None:
    for path in (ROOT / "transport").glob("*.py"):
        if path.name in ("ejection.py", "connection.py"):  # (connection.py makes it)
            continue
        assert ".health" not in path.read_text(), path.name
