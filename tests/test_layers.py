"""The package's layers only point down, and no modules import each other in a circle.

Every import of every module under ``ingest/`` counts, those inside functions too: a lazy import is still a
dependency, and hiding one in a function is not a way around the order. A module's layer is that of the
longest entry of `LAYERS` it is or lies under; the package itself (``ingest/__init__.py``, the public names)
sits with the framework adapter, which it re-exports. A module no entry covers fails the test, so a new
top-level module has to be given a place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "ingest"

#: The layers, lowest first: a module may import its own layer and those before it, never one after it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("ingest.errors", "ingest.defaults", "ingest._atomic", "ingest._malloc", "ingest._numpy",
              "ingest._threads", "ingest._driver", "ingest.random", "ingest._random", "ingest.sampler")),
    ("io", ("ingest.io", "ingest._readv")),
    ("formats", ("ingest.formats", "ingest.stream")),
    ("decode", ("ingest.decode",)),
    ("ops", ("ingest.ops", "ingest.native_plan", "ingest._plan")),   # the ops as the native planner takes them
    ("engine", ("ingest.engine", "ingest.native", "ingest._native", "ingest._engine")),   # the native engine: read to ops in C
    ("torch", ("ingest.torch", "ingest", "ingest.jax", "ingest.tf")),   # the framework adapters
    ("tools", ("ingest.tools", "ingest.serve")),   # the command line, and the server it starts
)


def module_files(root: Path) -> dict[str, Path | None]:
    """Every module of the package under ``root`` by dotted name: ``.py`` files (a package by its
    ``__init__.py``) and compiled extensions (value None: no imports to read), by the names ``setup.py`` beside
    the package gives them, else by their ``.c`` source."""
    modules: dict[str, Path | None] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    for path in sorted(root.rglob("*.c")):
        modules.setdefault(".".join(path.relative_to(root.parent).with_suffix("").parts), None)
    for name in extension_names(root.parent / "setup.py"):
        modules.setdefault(name, None)
    return modules


def extension_names(setup: Path) -> list[str]:
    """The names of the ``Extension("name", ...)`` calls in ``setup`` (none where there is no such file)."""
    if not setup.is_file():
        return []
    return [node.args[0].value for node in ast.walk(ast.parse(setup.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension" and node.args
            and isinstance(node.args[0], ast.Constant)]


def imports_of(name: str, source: str, is_package: bool, modules: set[str]) -> list[tuple[str, int]]:
    """The package modules ``source`` (module ``name``) imports, with the line of each import, from every
    ``import`` and ``from ... import`` in it (inside functions and ``if`` blocks too). ``from p import x``
    counts as importing ``p.x`` where that is a module, else ``p``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:   # ``import ingest.ops.base as b`` and the like
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name:
                found.append((target, node.lineno))
    return found


def import_graph(root: Path) -> dict[str, list[tuple[str, int]]]:
    modules = module_files(root)
    return {name: imports_of(name, path.read_text(), path.name == "__init__.py", set(modules))
            if path is not None else [] for name, path in modules.items()}


def layer_of(module: str, layers=LAYERS) -> int:
    """The index in ``layers`` of the longest entry ``module`` is or lies under (the bare package name
    covers only the package itself)."""
    best, rank = -1, None
    for k, (_, entries) in enumerate(layers):
        for entry in entries:
            covers = module == entry or ("." in entry and module.startswith(entry + "."))
            if covers and len(entry) > best:
                best, rank = len(entry), k
    if rank is None:
        raise LookupError(f"{module} has no layer: add it (or its package) to LAYERS in tests/test_layers.py")
    return rank


def upward_imports(graph: dict[str, list[tuple[str, int]]], layers=LAYERS) -> list[str]:
    """Each import that points up the order, as ``"a (layer) imports b (layer), line n"``."""
    bad = []
    for module, targets in sorted(graph.items()):
        mine = layer_of(module, layers)
        for target, line in targets:
            theirs = layer_of(target, layers)
            if theirs > mine:
                bad.append(f"{module} ({layers[mine][0]}) imports {target} ({layers[theirs][0]}), line {line}")
    return bad


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules, sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(v: str) -> None:   # the package is small: recursion depth is its longest import chain
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def circle_message(graph: dict[str, list[tuple[str, int]]], group: list[str]) -> str:
    """A circle named by two of its modules that import each other (directly or through the rest of it)."""
    inside = set(group)
    a = group[0]
    b = next(t for t, _ in graph[a] if t in inside)
    return f"import circle between {a} and {b} (all of it: {', '.join(group)})"


def test_every_import_points_down_the_layers():
    assert upward_imports(import_graph(ROOT)) == []


def test_no_import_circles():
    graph = import_graph(ROOT)
    assert [circle_message(graph, g) for g in cycles(graph)] == []


def test_every_module_has_a_layer():
    for module in module_files(ROOT):
        layer_of(module)


# -- the checks catch what they are for (a synthetic package) ------------------------------------------
def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "ingest"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_an_upward_import_is_named_with_both_modules_even_inside_a_function(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "io.py": "def read():\n    from .formats.base import Location\n",
        "formats/__init__.py": "",
        "formats/base.py": "from ..io import read\n",
        "ops/__init__.py": "",
        "ops/geometry.py": "import ingest.torch\n",
        "torch.py": "from .ops import geometry\n",
    })
    assert upward_imports(import_graph(root)) == [
        "ingest.io (io) imports ingest.formats.base (formats), line 2",
        "ingest.ops.geometry (ops) imports ingest.torch (torch), line 1",
    ]


def test_an_import_circle_is_named(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "tools/__init__.py": "",
        "tools/convert.py": "def run():\n    from .runners import make_runner\n",
        "tools/runners.py": "from . import convert\n",
        "tools/cli.py": "from . import convert, runners\n",
    })
    graph = import_graph(root)
    assert upward_imports(graph) == []   # one layer: only the circle is wrong
    assert [circle_message(graph, g) for g in cycles(graph)] == [
        "import circle between ingest.tools.convert and ingest.tools.runners "
        "(all of it: ingest.tools.convert, ingest.tools.runners)"]


def test_a_module_without_a_layer_fails(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "newthing.py": "from . import io\n", "io.py": ""})
    with pytest.raises(LookupError, match="ingest.newthing has no layer"):
        upward_imports(import_graph(root))


def test_a_compiled_module_counts_as_its_layer(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "io.py": "from . import _readv\n", "_readv.c": "",
                               "random.py": "from . import _readv\n"})
    assert upward_imports(import_graph(root)) == ["ingest.random (base) imports ingest._readv (io), line 1"]
