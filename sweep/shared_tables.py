"""Shared registries hashed per class: a PR that registers a new model reruns that model's classes, not every class.

transformers lists every model in files every class's import closure holds: the auto mappings and the lazy
package ``__init__`` files. Hashed here, for one class: ``if TYPE_CHECKING:`` bodies and ``__version__`` are left
out; a *registry table* (a module-level literal of string entries, most naming a model) counts by the entries naming
the class's own names (:func:`own_names`); all else is hashed as written.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from pathlib import Path

#: a literal of fewer entries is a constant, not a registry
MIN_ENTRIES = 8
#: ... and one whose entries mostly name no model is hashed whole
REGISTRY_SHARE = 0.5


def _digest(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _strings(node: ast.AST) -> frozenset[str] | None:
    """The strings of a registry entry (a string, or a tuple/list of strings, nested), None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return frozenset({node.value})
    if isinstance(node, (ast.Tuple, ast.List)) and node.elts:
        parts = [_strings(e) for e in node.elts]
        return frozenset().union(*parts) if all(p is not None for p in parts) else None
    return None


def _entries(value: ast.AST) -> list[tuple[ast.AST, frozenset[str]]] | None:
    """The entries of a table literal: a dict, list, tuple or set of string entries, or such a literal passed
    alone to ``OrderedDict``/``dict``/``set``/``frozenset``/``tuple``/``list``."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and len(value.args) == 1 and not value.keywords \
            and value.func.id in ("OrderedDict", "dict", "set", "frozenset", "tuple", "list"):
        value = value.args[0]
    if isinstance(value, ast.Dict):
        pairs = [(k, v) for k, v in zip(value.keys, value.values) if k is not None]
        found = [(ast.Tuple(elts=[k, v]), _strings(k), _strings(v)) for k, v in pairs]
        return [(node, a | b) for node, a, b in found] if all(a is not None and b is not None for _, a, b in found) \
            and len(pairs) == len(value.keys) else None
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        found = [(e, _strings(e)) for e in value.elts]
        return found if all(s is not None for _, s in found) else None
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_version_string(statement: ast.stmt) -> bool:
    """``__version__ = "5.25.0.dev0"``: a package's version string, which a dev tree bumps in its ``__init__``."""
    return (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == "__version__"
            and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str))


@functools.cache
def known_names(search_path: Path) -> frozenset[str]:
    """Every model type, model package and class name the installed transformers registers."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    names = set(CONFIG_MAPPING_NAMES) | set(CONFIG_MAPPING_NAMES.values())
    names |= {model_type_to_module_name(t) for t in CONFIG_MAPPING_NAMES}
    names |= set(getattr(transformers, "_class_to_module", {}))
    models = search_path / "transformers" / "models"
    names |= {p.name for p in models.iterdir() if p.is_dir()} if models.is_dir() else set()
    return frozenset(names)


@functools.cache
def split_file(path: Path, search_path: Path) -> tuple[str, tuple[tuple[frozenset[str], str], ...]] | None:
    """``(digest of the file without its registry tables and TYPE_CHECKING bodies, ((names, entry), ...))``, or None
    for a file with neither (hashed by its bytes)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    known = known_names(search_path)
    kept, entries, changed = [], [], False
    for statement in tree.body:
        if _is_version_string(statement):  # counted through the version ranges our code tests (sweep.fingerprint)
            kept.append(ast.Expr(ast.Constant("__version__")))
            changed = True
            continue
        if isinstance(statement, ast.If) and _is_type_checking(statement.test):
            kept.append(ast.If(test=statement.test, body=[ast.Pass()], orelse=statement.orelse))
            changed = True
            continue
        target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else (
            statement.target if isinstance(statement, ast.AnnAssign) else None)
        table = _entries(statement.value) if target is not None and statement.value is not None else None
        if table and len(table) >= MIN_ENTRIES and sum(bool(s & known) for _, s in table) >= REGISTRY_SHARE * len(table):
            name = ast.dump(target)
            kept.append(ast.Expr(ast.Constant(f"registry table {name}")))
            entries += [(strings, f"{name}: {ast.dump(node)}") for node, strings in table]
            changed = True
            continue
        kept.append(statement)
    if not changed:
        return None
    return _digest(ast.dump(ast.Module(body=kept, type_ignores=[]))), tuple(entries)


@functools.cache
def _by_name(path: Path, search_path: Path) -> dict[str, frozenset[str]]:
    """A registry file's entries by each name they carry."""
    index: dict[str, set[str]] = {}
    for strings, entry in split_file(path, search_path)[1]:
        for name in strings:
            index.setdefault(name, set()).add(entry)
    return {name: frozenset(entries) for name, entries in index.items()}


def file_digest_for(path: Path, search_path: Path, own: frozenset[str], whole: str) -> str:
    """The file's digest for a class whose names are ``own`` (``whole``: the bytes' digest, for other files)."""
    split = split_file(path, search_path)
    if split is None:
        return whole
    index = _by_name(path, search_path)
    return _digest([split[0], sorted(set().union(*(index.get(name, ()) for name in own)))])


@functools.cache
def own_names(module: str, search_path: Path) -> frozenset[str]:
    """The names a class's registry entries carry: its model package (``transformers.models.<package>``), the model
    types whose module is that package, their config classes, and the same for the model types its configuration
    module names as sub-models (Llava's ``"llama"`` text model): those entries decide how the class is built."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    parts = module.split(".")
    if len(parts) < 3 or parts[1] != "models":
        return frozenset()
    packages = {parts[2]} | sub_model_packages(parts[2], search_path)
    types = {t for t in CONFIG_MAPPING_NAMES if model_type_to_module_name(t) in packages}
    return frozenset(packages | types | {CONFIG_MAPPING_NAMES[t] for t in types})


@functools.cache
def sub_model_packages(package: str, search_path: Path) -> frozenset[str]:
    """The model packages of the model types a package's configuration modules name (composite models build their
    sub-models from those types, through the auto classes: code their import closure does not hold)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

    folder = search_path / "transformers" / "models" / package
    found: set[str] = set()
    for path in sorted(folder.glob("configuration_*.py")):
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        found |= {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in CONFIG_MAPPING_NAMES}
    return frozenset(model_type_to_module_name(t) for t in found) - {package}
