"""The one registry of workarounds, keyed by backend: reversible patches and in-place FX fixes.

It exists so that every workaround has the same lifetime (installed for one export, always restored) and the
same version range check, wherever it is written (the scope modules of :mod:`engine.patches`).

- **Patches** swap an attribute (a torch op, a backend internal, a model method) for the duration of
  ``with apply_patches(backend): ...`` and always restore the original, even when the body raises.
  A patch is a factory ``_patch_<pattern>(original) -> replacement`` registered against one or more
  dotted paths; it may state the package version range it targets and is skipped outside it, so a
  patch dies with the upstream bug it works around.
- **FX node fixes** ``_fix_<pattern>(graph_module, node) -> bool`` rewrite single nodes; return True
  when the node was consumed. Dead code is eliminated after each walk.
- **FX program fixes** ``_fix_<pattern>(exported_program) -> None`` repair program-level state.
- **Trace contexts** ``context(model) -> context manager`` for patches whose targets are found on the model at
  trace time (its submodules, its config): entered around ``torch.export`` after the forward is flattened, exited
  (restoring the model) after it; each yields what it changed, or something falsy.

Name each function after the *pattern* it replaces, never after a model, and say in its docstring
which pattern and, for upstream bugs, which upstream issue.
"""

from __future__ import annotations

import builtins
import contextlib
import sys
import types
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from engine.swap import resolve_dotted_path, swap_attributes
from engine.versions import installed_in

logger = logging.getLogger("engine")

# "generation": active in export_for_generation; "pt2": active in engine.program_io's save and load of a .pt2
BACKENDS = ("dynamo", "onnx", "executorch", "generation", "pt2")


@dataclass(frozen=True)
class Patch:
    backend: str
    path: str
    factory: Callable[[Any], Any]
    requires: tuple[tuple[str, str], ...] = ()  # ((package, specifier), ...)

    @property
    def name(self) -> str:
        return self.factory.__name__

    def applies(self) -> bool:
        """True when every package named in ``requires`` is installed at a version inside its range."""
        return installed_in(self.requires)


_PATCHES: dict[str, list[Patch]] = {b: [] for b in BACKENDS}
_FX_NODE_FIXES: dict[str, list[Callable]] = {b: [] for b in BACKENDS}
_FX_NODE_FIX_OPS: dict[str, set] = {b: set() for b in BACKENDS}
_FX_PROGRAM_FIXES: dict[str, list[Callable]] = {b: [] for b in BACKENDS}
_TRACE_CONTEXTS: dict[str, list[Callable]] = {b: [] for b in BACKENDS}


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        from engine.errors import ConfigError

        raise ConfigError(f"unknown backend {backend!r}; known backends: {', '.join(BACKENDS)}")


def register_patch(backend: str, *paths: str, requires: dict[str, str] | None = None):
    """Register ``factory(original) -> replacement`` against each dotted path, for one backend.

    ``requires={"torch": ">=2.12,<2.14"}`` limits the patch to those installed versions.
    """
    _check_backend(backend)
    if not paths:
        raise ValueError("register_patch needs at least one dotted path")
    reqs = tuple(sorted((requires or {}).items()))

    def decorator(factory):
        for path in paths:
            _PATCHES[backend].append(Patch(backend, path, factory, reqs))
        return factory

    return decorator


def register_fx_node_fix(backend: str, ops: Iterable = ()):
    """Register ``fix(graph_module, node) -> bool`` for one backend; ``ops``: the ATen ops it rewrites, which a
    single trace keeps whole for it (:func:`fixed_ops`)."""
    _check_backend(backend)

    def decorator(fn):
        _FX_NODE_FIXES[backend].append(fn)
        _FX_NODE_FIX_OPS[backend].update(ops)
        return fn

    return decorator


def fixed_ops(backend: str) -> frozenset:
    """The ATen ops the backend's FX node fixes declare they rewrite: a trace straight to a backend's decomposed IR
    must keep them whole, or the fixes would find their decompositions instead (:mod:`engine.single_trace`)."""
    return frozenset(_FX_NODE_FIX_OPS[backend])


def register_fx_program_fix(backend: str):
    """Register ``fix(exported_program) -> None`` for one backend."""
    _check_backend(backend)

    def decorator(fn):
        _FX_PROGRAM_FIXES[backend].append(fn)
        return fn

    return decorator


def register_trace_context(backend: str):
    """Register ``context(model) -> context manager`` for one backend (entered in registration order)."""
    _check_backend(backend)

    def decorator(fn):
        _TRACE_CONTEXTS[backend].append(fn)
        return fn

    return decorator


@contextlib.contextmanager
def apply_trace_contexts(backend: str, model) -> Iterator[list[str]]:
    """Enter every trace context of ``backend`` for ``model``; yields the names of those that changed something."""
    _check_backend(backend)
    with contextlib.ExitStack() as stack:
        yield [context.__name__ for context in list(_TRACE_CONTEXTS[backend]) if stack.enter_context(context(model))]


def registered_patches(backend: str) -> list[Patch]:
    return list(_PATCHES[backend])


@contextlib.contextmanager
def patch_disabled(backend: str, name: str) -> Iterator[None]:
    """Leave the registered patch whose factory is ``name`` out of :func:`apply_patches` while inside: to check
    that a patch changes nothing it must not change, and to measure what it saves."""
    _check_backend(backend)
    before = _PATCHES[backend]
    kept = [p for p in before if p.name != name]
    if len(kept) == len(before):
        from engine.errors import ConfigError

        raise ConfigError(f"no {backend} patch named {name!r}; registered: {', '.join(p.name for p in before)}")
    _PATCHES[backend] = kept
    try:
        yield
    finally:  # patches registered meanwhile (a lazily imported patch module) are kept
        _PATCHES[backend] = before + [p for p in _PATCHES[backend] if p not in kept]


def _model_module_loaded(path: str) -> bool:
    parts = path.split(".")
    if parts[0] == "timm":  # a model library of its own: imported by the models that use it
        return "timm" in sys.modules
    if parts[:2] != ["transformers", "models"] or len(parts) < 4:
        return True
    return ".".join(parts[:4]) in sys.modules


@contextlib.contextmanager
def apply_patches(backend: str) -> Iterator[list[str]]:
    """Install every applicable patch of ``backend``; yields the names of those installed.

    Several patches of one path compose in registration order: each wraps the one before.
    Paths whose module is not importable (an optional package, a model removed upstream) are skipped
    with a debug log: a patch for a model the installed transformers lacks has nothing to patch. A model
    module (``transformers.models.x.modeling_x``, or timm) not imported yet is skipped too: no model of it can be
    under export, and importing every patched model's module would slow every export down.
    """
    _check_backend(backend)
    swaps, names = [], []
    replaced: dict[tuple[int, str], Any] = {}  # (id(owner), attr) -> replacement: patches of one path compose
    for patch in _PATCHES[backend]:
        if not patch.applies() or not _model_module_loaded(patch.path):
            continue
        try:
            owner, attr = resolve_dotted_path(patch.path)
            # a module global may shadow a builtin it does not define itself (restored by deletion on exit)
            original = getattr(owner, attr) if hasattr(owner, attr) or not isinstance(owner, types.ModuleType) \
                else getattr(builtins, attr)
        except (ImportError, AttributeError) as e:
            logger.debug("patch %s skipped: %s", patch.path, e)
            continue
        original = replaced.get((id(owner), attr), original)  # a later patch wraps an earlier one
        replaced[(id(owner), attr)] = replacement = patch.factory(original)
        swaps.append((owner, attr, replacement))
        names.append(f"{patch.name}@{patch.path}")
    with swap_attributes(swaps):
        yield names


def apply_fx_node_fixes(backend: str, graph_module) -> int:
    """Run every node fix of ``backend`` over the graph; returns how many nodes were rewritten."""
    fixes = _FX_NODE_FIXES[backend]
    if not fixes:
        return 0
    changed = 0
    for node in list(graph_module.graph.nodes):
        for fix in fixes:
            if fix(graph_module, node):
                changed += 1
                break
    if changed:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    return changed


def apply_fx_program_fixes(backend: str, exported_program) -> None:
    for fix in _FX_PROGRAM_FIXES[backend]:
        fix(exported_program)
