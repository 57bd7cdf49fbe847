"""``save_program`` / ``load_program``: the ``.pt2`` round trip of an ``ExportedProgram``, in any process.

A program whose inputs or outputs are ``ModelOutput`` or ``Cache`` objects can only be loaded where those classes
are registered with torch's pytree (``torch.export.load`` fails with "... in pytree is not registered" in a process
that imported only ``engine``). So the save records the classes the program's input and output trees use, and the
load imports and registers them first (:data:`engine.artifact_meta.PYTREE_TYPES_FILE`); a file saved without the
record gets the classes its serialized tree specs name.

The patches that make the round trip fast (each distinct size expression printed and parsed once) are in
:mod:`engine.patches.program_io`, active only inside these two functions.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import zipfile

import torch
import torch.utils._pytree as pytree

import engine.patches.program_io  # noqa: F401  (registers the "pt2" patches)
from engine.artifact_meta import PYTREE_TYPES_FILE
from engine.fake_mode import fake_dispatch_cache_off_while_tracing, restore_fake_dispatch_cache
from engine.patches import apply_patches

#: a node type in a serialized tree spec (JSON inside the program's JSON: its quotes escaped)
_SPEC_TYPE = re.compile(r'\\"type\\": \\"([A-Za-z_][\w.]*)\\"')


def _tree_types(spec) -> set[str]:
    """``module.QualName`` of every non-builtin node type of a treespec."""
    names, todo = set(), [spec]
    while todo:
        node = todo.pop()
        cls = getattr(node, "type", None)
        if isinstance(cls, type) and cls.__module__ not in ("builtins", "collections"):
            names.add(f"{cls.__module__}.{cls.__qualname__}")
        todo.extend(node.children() if hasattr(node, "children") else getattr(node, "children_specs", ()))
    return names


def save_program(program: torch.export.ExportedProgram, path: str | os.PathLike) -> str:
    """``torch.export.save(program, path)``, with the pytree classes its trees use recorded; returns the path."""
    types = sorted(_tree_types(program.call_spec.in_spec) | _tree_types(program.call_spec.out_spec))
    with apply_patches("pt2"):
        torch.export.save(program, path, extra_files={PYTREE_TYPES_FILE: json.dumps(types)})
    return str(path)


def register_type_named(name: str) -> bool:
    """Import ``module.QualName`` and register it with torch's pytree as the exporters do (a ``ModelOutput`` or a
    cache class); whether it is registered now."""
    from engine.pytree import register_type

    module, _, qualname = name.rpartition(".")
    value = None
    while module:
        try:
            value = importlib.import_module(module)
            break
        except ImportError:
            module, _, outer = module.rpartition(".")
            qualname = f"{outer}.{qualname}"
    for part in qualname.split(".") if value is not None else ():
        value = getattr(value, part, None)
    if not isinstance(value, type):
        return False
    register_type(value)
    return value in pytree.SUPPORTED_NODES


def _recorded_types(path: str | os.PathLike) -> list[str]:
    """The pytree classes a ``.pt2`` needs: its record, or for a file saved without one (``torch.export.save``) the
    dotted type names its serialized tree specs hold."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            record = next((n for n in names if n.endswith(f"/extra/{PYTREE_TYPES_FILE}")), None)
            if record is not None:
                return json.loads(archive.read(record))
            found: set[str] = set()
            for name in names:
                if "/models/" in name and name.endswith(".json"):
                    found.update(_SPEC_TYPE.findall(archive.read(name).decode("utf-8", "replace")))
            return sorted(t for t in found if "." in t)
    except (OSError, zipfile.BadZipFile, ValueError):
        return []


def load_program(path: str | os.PathLike) -> torch.export.ExportedProgram:
    """``torch.export.load(path)`` with the pytree classes the program needs registered first, and the fake-tensor
    dispatch cache off while the node metadata is rebuilt (each node is a new op on new shapes, so every lookup
    misses: see ``engine.exporter_dynamo``)."""
    for name in _recorded_types(path):
        register_type_named(name)
    with apply_patches("pt2"), fake_dispatch_cache_off_while_tracing():
        program = torch.export.load(path)
    restore_fake_dispatch_cache(program)
    return program
