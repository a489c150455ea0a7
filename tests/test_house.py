"""The shape of the source tree: imports go one way (no module imports, even inside a function,
a module that imports it back), and no source file grows past 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "tandem"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = ("tandem", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The tandem modules `path` imports anywhere in its body (TYPE_CHECKING blocks too)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _graph() -> dict[str, set[str]]:
    files = sorted(SRC.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    return {_module_name(f): _imports(f, modules) for f in files}


def test_no_import_circle():
    graph = _graph()
    assert graph["tandem.cli"], "the import graph was not read"  # cli imports every command
    assert _circles(graph) == []


def test_a_circle_is_found():
    """The check above can fail: a two-module loop and a three-module loop are reported."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_circles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_cli_only_dispatches_and_nothing_imports_it():
    graph = _graph()
    assert [m for m, deps in graph.items() if "tandem.cli" in deps] == []
    assert len((SRC / "cli.py").read_text().splitlines()) < 80


def test_every_source_file_under_600_lines():
    long = {str(f.relative_to(SRC)): n for f in sorted(SRC.rglob("*"))
            if f.suffix in (".py", ".c", ".h")
            and (n := len(f.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}
