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


MAX_FUNCTION_LINES = 80
MAX_STEP_LINES = 40


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, node.end_lineno - node.lineno + 1


def _long_functions(limit: int) -> dict[str, int]:
    return {f"{f.relative_to(SRC)}:{node.lineno} {node.name}": n
            for f in sorted(SRC.rglob("*.py"))
            for node, n in _functions(ast.parse(f.read_text(encoding="utf-8")))
            if n > limit}


def test_no_function_longer_than_80_lines():
    assert _long_functions(MAX_FUNCTION_LINES) == {}


def test_a_long_function_is_found():
    """The check above can fail: a function's lines are counted from its def to its end."""
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    [(node, n)] = list(_functions(ast.parse(f"def f():\n{body}\n")))
    assert n == MAX_FUNCTION_LINES + 1 > MAX_FUNCTION_LINES


def test_the_engine_step_fits_in_a_screen():
    """Engine.step reads as plan -> drafts -> one packed pass -> postprocess."""
    tree = ast.parse((SRC / "engine" / "engine.py").read_text(encoding="utf-8"))
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine")
    step = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "step")
    assert step.end_lineno - step.lineno + 1 <= MAX_STEP_LINES


def test_the_server_holds_the_inference_api_only():
    """The agent tools and the CORS proxy are their own optional package (pip install
    'tandem[agent]'), not modules of the server."""
    server = SRC / "server"
    assert sorted(f.name for f in server.rglob("agent_*.py")) == []
    assert not (server / "corsproxy.py").exists()


ROOT = SRC.parents[1]


def test_bench_results_hold_results_not_code():
    """bench/results/ keeps the folders that back a claim (bench/RESULTS.md): at most 200
    files and 5 MB, and nothing runnable (scripts live in experiments/)."""
    files = [f for f in (ROOT / "bench" / "results").rglob("*") if f.is_file()]
    assert len(files) <= 200
    assert sum(f.stat().st_size for f in files) <= 5 * 1024 * 1024
    assert [str(f.relative_to(ROOT)) for f in files
            if f.suffix in (".py", ".sh", ".c", ".h", ".diff")] == []


def test_every_experiment_is_named_in_its_index():
    index = (ROOT / "experiments" / "README.md").read_text(encoding="utf-8")
    scripts = [f.relative_to(ROOT / "experiments").as_posix()
               for f in (ROOT / "experiments").rglob("*")
               if f.is_file() and f.name != "README.md" and "__pycache__" not in f.parts]
    assert scripts and [s for s in scripts if f"`{s}`" not in index] == []


def test_the_readme_reads_in_a_few_screens():
    """At most 150 lines, no paragraph longer than 15 (code blocks count as paragraphs)."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150
    paragraphs, run = [], 0
    for line in lines + [""]:
        run = run + 1 if line.strip() else (paragraphs.append(run) or 0)
    assert max(paragraphs) <= 15
