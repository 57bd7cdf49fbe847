"""A case's fingerprint: a hash of everything that can change its result, so an unchanged case need not run again.

Five parts, each hashed on its own so that a rerun can say which one moved (``--reuse-from``, :mod:`sweep.reuse`):

- ``case``: the case spec (class, backend, shapes, tolerances, seed, the skiplist entry and ONNX optimiser flag it
  carries, a local model's module or config path) and the run settings a case reads (timeout, ``--run-skipped``);
- ``versions``: the installed version of every pinned package but transformers (for it, which of the version
  ranges our code tests hold: its sources are hashed), the Python version and the machine type;
- ``export-sweep``: every code and data file under ``engine/`` and ``sweep/``, subpackages included (the zoo's
  recipes, shrink rules, lessons and overrides live in ``sweep/zoo/``), as a wheel ships them;
- ``model``: the model class's source and every module of the same package it imports, transitively (its
  ``modeling_*.py``, its ``configuration_*.py``, ``modeling_utils`` and what they import), and the modeling modules
  of the sub-models its configuration names: touching one modeling file changes the fingerprint of exactly the
  classes whose closure holds it. Shared registries (the auto mappings, lazy ``__init__`` tables) count by the
  class's own entries only (:mod:`sweep.shared_tables`), so registering a new model reruns that model alone;
- ``local``: for ``--config`` the config file's bytes, for ``--model-module`` the module and the modules of its
  folder that it imports, transitively.

A part that cannot be read (a class transformers cannot place, a file gone) hashes as unknown with the reason, so
the case is never reused on a guess.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OWN_SOURCES = ("engine", "sweep")
#: the files under engine/ and sweep/ that can change a result, and that a wheel ships: code and YAML data (not
#: prose, not caches), so an installed wheel and the checkout it was built from hash the same
_HASHED_SUFFIXES = (".py", ".yaml")
#: results shipped with the package (sweep/packaged/: the skiplists and baseline rows), which are not code
_NOT_HASHED_FOLDERS = ("packaged",)
#: the run settings a case's result depends on besides its spec
SETTINGS_KEYS = ("timeout", "run_skipped")


def _digest(data: Any) -> str:
    text = data if isinstance(data, (bytes, str)) else json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()[:16]


@functools.cache
def _file_digest(path: Path) -> str:
    try:
        return _digest(path.read_bytes())
    except OSError as e:
        return f"unreadable: {e.strerror}"


# ─── export-sweep's own sources ──────────────────────────────────────────────────────────────────

@functools.cache
def own_sources_digest(root: Path = REPO) -> str:
    """One hash over the code and data files under ``engine/`` and ``sweep/`` (names and bytes)."""
    entries = []
    for top in OWN_SOURCES:
        for path in sorted((root / top).rglob("*")):
            relative = path.relative_to(root)
            if (path.suffix in _HASHED_SUFFIXES and path.is_file()
                    and not set(relative.parts[1:-1]) & {"__pycache__", *_NOT_HASHED_FOLDERS}):
                entries.append((str(relative), _file_digest(path)))
    return _digest(entries)


# ─── versions ────────────────────────────────────────────────────────────────────────────────────

#: packages whose sources the ``model`` part hashes: their version string adds nothing but the version ranges our
#: own code tests it against (a patch's ``requires``), so a source tree at another version (``5.25.0.dev0``) keeps
#: every case whose sources did not change
HASHED_PACKAGES = ("transformers",)


@functools.cache
def versions_digest(root: Path = REPO) -> str:
    """The installed versions of the pinned packages (a local build tag such as ``+cpu`` left out: the same release's
    CPU and CUDA wheels run the same CPU kernels), the Python version and the machine type; for
    :data:`HASHED_PACKAGES`, which of the version ranges written in our sources hold instead of the version."""
    from engine.versions import installed_in, installed_versions

    packages = {name: (version or "").split("+", 1)[0] or None for name, version in installed_versions().items()
                if name not in HASHED_PACKAGES}
    ranges = sorted((package, spec, installed_in([(package, spec)])) for package, spec in _version_ranges(root))
    return _digest({"packages": packages, "ranges": ranges, "python": list(sys.version_info[:2]),
                    "machine": platform.machine()})


def _version_ranges(root: Path) -> set[tuple[str, str]]:
    """Every ``{"<hashed package>": "<range>"}`` literal (a patch's ``requires=``) in our own sources."""
    found = set()
    for top in OWN_SOURCES:
        for path in sorted((root / top).rglob("*.py")):
            try:
                tree = ast.parse(path.read_bytes())
            except (OSError, SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Dict):
                    found |= {(k.value, v.value) for k, v in zip(node.keys, node.values)
                              if isinstance(k, ast.Constant) and k.value in HASHED_PACKAGES
                              and isinstance(v, ast.Constant) and isinstance(v.value, str)}
    return found


# ─── a module's import closure ───────────────────────────────────────────────────────────────────

@functools.cache
def _module_file(name: str, search_path: Path, prefix: str | None) -> Path | None:
    """The file of module ``name`` (dotted) found under ``search_path``, or None; with ``prefix``, only modules
    of that top-level package are looked up (site-packages holds torch too)."""
    if prefix is not None and name.split(".")[0] != prefix:
        return None
    base = search_path.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST):
    """``(import node, inside a function)`` for every import that can run: the bodies of ``if TYPE_CHECKING:``
    never do (transformers' lazy package ``__init__`` files list every model there)."""
    todo = [(tree, False)]
    while todo:
        node, in_function = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        if isinstance(node, ast.If) and _type_checking(node.test):
            todo.extend((child, in_function) for child in node.orelse)
            continue
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))


@functools.cache
def _imported_modules(path: Path, module: str, is_package: bool) -> tuple[frozenset[str], frozenset[str]]:
    """Dotted names of the modules ``path`` imports when run: ``(at import time, inside functions)``."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return frozenset(), frozenset()
    parent = module if is_package else module.rpartition(".")[0]
    found: tuple[set[str], set[str]] = (set(), set())
    for node, in_function in _runtime_imports(tree):
        names = found[in_function]
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = parent.split(".") if parent else []
            base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        names.add(target)
        names.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import submodule`

    def with_parents(names: set[str]) -> frozenset[str]:  # importing a.b.c runs a/__init__ and a/b/__init__
        return frozenset(".".join(n.split(".")[:i]) for n in names if n for i in range(1, n.count(".") + 2))

    return with_parents(found[0]), with_parents(found[1])


#: shared code reaches into one model's package (``<prefix>.models.<name>``) only from optional integrations
#: (quantizers, weight conversion, slow tokenizers) that the sweep never runs: those lazy imports, made inside
#: functions, are not followed
MODELS_SUBPACKAGE = "models"


@functools.cache
def import_closure(module: str, search_path: Path, prefix: str | None = None) -> tuple[Path, ...]:
    """Every file under ``search_path`` (of package ``prefix`` if given) that importing and running ``module``
    can execute, ``module``'s own first: imports at import time everywhere, imports inside functions too except
    shared code's lazy imports of a model package (:data:`MODELS_SUBPACKAGE`)."""
    models = f"{prefix}.{MODELS_SUBPACKAGE}." if prefix else None
    parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]  # run first, by import
    todo, seen, files = [*parents, module], set(), []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_file(name, search_path, prefix)
        if path is None:
            continue
        files.append(path)
        eager, lazy = _imported_modules(path, name, path.name == "__init__.py")
        if models and not name.startswith(models):
            lazy = frozenset(n for n in lazy if not n.startswith(models))
        todo.extend((eager | lazy) - seen)
    return tuple(files[:1] + sorted(files[1:]))


def closure_digest(module: str, search_path: Path, prefix: str | None = None) -> str:
    files = import_closure(module, search_path, prefix)
    if not files:
        return f"unknown: no source for {module} under {search_path}"
    return _digest([(str(p.relative_to(search_path)), _file_digest(p)) for p in files])


@functools.cache
def _transformers_search_path() -> Path:
    import transformers

    return Path(transformers.__file__).resolve().parent.parent


@functools.cache
def model_digest(class_name: str) -> str:
    """The import closure of the transformers module that defines ``class_name``, with the modeling modules of the
    sub-models its configuration names (a composite builds them through the auto classes); shared registries count
    by the class's own entries (:mod:`sweep.shared_tables`)."""
    import transformers

    where = getattr(transformers, "_class_to_module", {}).get(class_name)
    module = f"transformers.{where}" if where else None
    if module is None:  # a class the lazy index does not name: find it as the zoo does, to learn its module
        from sweep.zoo.build import model_class

        try:
            module = model_class(class_name).__module__
        except Exception as e:  # noqa: BLE001 - any import failure leaves the part unknown, never guessed
            return f"unknown: transformers does not place {class_name} ({type(e).__name__})"
    return module_digest(module, class_name)


def module_digest(module: str, class_name: str) -> str:
    """:func:`model_digest` of a class defined in ``module``."""
    from sweep.shared_tables import file_digest_for, own_names, sub_model_packages

    search = _transformers_search_path()
    files = list(import_closure(module, search, "transformers"))
    if not files:
        return f"unknown: no source for {module} under {search}"
    parts = module.split(".")
    for package in sorted(sub_model_packages(parts[2], search)) if parts[1:2] == ["models"] else ():
        for path in sorted((search / "transformers" / "models" / package).glob("modeling_*.py")):
            files += import_closure(f"transformers.models.{package}.{path.stem}", search, "transformers")
    own = own_names(module, search) | {class_name}
    entries = {str(p.relative_to(search)): file_digest_for(p, search, own, _file_digest(p)) for p in files}
    return _digest([(module, *sorted(entries.items()))])


def _local_digest(spec: dict) -> str | None:
    if spec.get("config"):
        path = Path(spec["config"])
        return _file_digest(path / "config.json" if path.is_dir() else path)
    if spec.get("model_module"):
        # the module and every module of the user's folder it imports, transitively
        return closure_digest(spec["model_module"], Path(spec.get("module_path") or ".").resolve())
    return None


# ─── the fingerprint ─────────────────────────────────────────────────────────────────────────────

def fingerprint_parts(spec: dict, settings: dict) -> dict[str, str]:
    """Each part's hash (see the module docstring); ``settings`` holds :data:`SETTINGS_KEYS`."""
    parts = {
        "case": _digest({"spec": spec, **{k: settings.get(k) for k in SETTINGS_KEYS}}),
        "versions": versions_digest(),
        "export-sweep": own_sources_digest(),
    }
    local = _local_digest(spec)
    if local is not None:
        parts["local"] = local
    if not spec.get("model_module"):
        parts["model"] = model_digest(spec.get("class") or spec["model"])
    return parts


def fingerprint(parts: dict[str, str]) -> str:
    """The whole fingerprint: one hash of the parts (a part that is unknown makes it unusable for reuse)."""
    return _digest(parts)


def reusable(parts: dict[str, str]) -> bool:
    return not any(v.startswith(("unknown", "unreadable")) for v in parts.values())
