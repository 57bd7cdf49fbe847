"""The layout holds: the import contracts, pyflakes, no private name imported across files, no import cycle, no
module over 600 lines, every package map complete, one labelling of the pipeline's stages. Each check is a static
read of the sources (a few seconds in all)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "sweep")
MAX_LINES = 600
BIN = Path(sys.executable).parent


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_import_contracts_hold():
    """The layers, the pattern families' independence and the zoo's imports (``pyproject.toml``'s contracts)."""
    done = subprocess.run([BIN / "lint-imports", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_finds_nothing():
    done = subprocess.run([BIN / "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.parametrize("folder", ["engine", "sweep", "bench", "tests"])
def test_no_module_over_600_lines(folder):
    long = {str(p.relative_to(ROOT)): n for p in _sources(folder) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by concept (at most {MAX_LINES} lines a module): {long}"


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of attribute reads on a name, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (owner := _dotted(node.value)):
        return f"{owner}.{node.attr}"
    return None


def _first_party_imports(path: Path):
    """``(line, module, name)`` for every ``from <engine|sweep>... import name`` and every ``module.name`` read of a
    first-party module imported whole (``import engine.x`` or ``import engine.x as m``), in one source file."""
    tree = ast.parse(path.read_text())
    modules = {}  # the name code reads a first-party module by -> the module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PACKAGES and not node.level:
            for alias in node.names:
                yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Import):
            modules.update({alias.asname or alias.name: alias.name for alias in node.names
                            if alias.name.split(".")[0] in PACKAGES})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (module := modules.get(_dotted(node.value))):
            yield node.lineno, module, node.attr


def test_no_private_name_is_imported_across_files():
    """A name with a leading underscore is its module's own: code in another module (tests aside, which exercise
    the module they mirror) reaches it through a public name instead. (ruff's PLC2701 exempts imports within one
    package, so it would not see ``engine`` importing ``engine``'s private names.)"""
    found = []
    for path in _sources("engine", "sweep", "bench"):
        own = _module_name(path)
        for line, module, name in _first_party_imports(path):
            if name.startswith("_") and not name.startswith("__") and module != own:
                found.append(f"{path.relative_to(ROOT)}:{line}: {module}.{name}")
    assert not found, "private names imported across files:\n" + "\n".join(found)


def test_no_import_cycles():
    import grimp

    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for module in sorted(edges):
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def _packages() -> list[Path]:
    return sorted(p.parent for folder in PACKAGES for p in (ROOT / folder).rglob("__init__.py"))


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_package_map_lists_every_module(package):
    """A package's ``__init__`` docstring is its map: every module and subpackage in it is named there."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    members = [p.stem for p in package.glob("*.py") if not p.stem.startswith("__")]
    members += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [m for m in sorted(members) if not re.search(rf"(?<![\w]){re.escape(m)}(?![\w])", doc)]
    assert not missing, f"{package.relative_to(ROOT)}/__init__.py's docstring does not name: {missing}"


def test_the_pipeline_has_one_labelling():
    """Every ``# ── Stage N: <name>`` and ``# ── 2x: <name>`` banner of the exporters uses a label of the list in
    ``engine/__init__.py``, under its number."""
    doc = ast.get_docstring(ast.parse((ROOT / "engine" / "__init__.py").read_text()))
    stages = dict(re.findall(r"^(\d)\. \*\*([^*]+)\*\*", doc, re.M))
    steps = dict(re.findall(r"(2[a-h]) \*\*([^*]+)\*\*", doc))
    assert len(stages) == 6 and len(steps) == 8, (stages, steps)
    seen = set()
    for path in (ROOT / "engine").glob("exporter_*.py"):
        for label, text in re.findall(r"# ── (Stage \d|2[a-z]): ([^─\n]*)", path.read_text()):
            number = label.removeprefix("Stage ")
            name = text.split(":")[0].strip()
            assert (stages if label.startswith("Stage") else steps).get(number) == name, \
                f"{path.name}: {label}: {name!r}; the map has {stages} and {steps}"
            seen.add(number)
    assert seen == set(stages) | set(steps), f"labels with no banner: {sorted(set(stages) | set(steps) - seen)}"
