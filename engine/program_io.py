"""``save_program`` / ``load_program``: the ``.pt2`` round trip of an ``ExportedProgram``, in any process.

``torch.export.load`` needs the ``ModelOutput`` and ``Cache`` classes of the program's trees registered with
pytree, which a process that imported only ``engine`` has not done. The save records them
(:data:`engine.artifact_meta.PYTREE_TYPES_FILE`) and the load registers them first (for a plain
``torch.export.save`` file, the classes its serialized tree specs name). The speed patches of the round trip are in
:mod:`engine.patches.program_io`.
"""

from __future__ import annotations

import json
import os
import pkgutil
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
    """Import ``module.QualName`` and register it with torch's pytree as the exporters do (a ``ModelOutput`` or a cache
    class); returns whether it ends up registered."""
    from engine.pytree import register_type

    try:
        value = pkgutil.resolve_name(name)
    except (ImportError, AttributeError, ValueError):
        return False
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
