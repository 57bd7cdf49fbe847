"""``save_program`` / ``load_program``: the ``.pt2`` round trip of an ``ExportedProgram``, without its repeated work.

The patches that make it fast (each distinct size expression printed and parsed once) are in
:mod:`engine.patches.program_io`, active only inside these two functions.
"""

from __future__ import annotations

import os

import torch

import engine.patches.program_io  # noqa: F401  (registers the "pt2" patches)
from engine.fake_mode import fake_dispatch_cache_off_while_tracing, restore_fake_dispatch_cache
from engine.patches import apply_patches


def save_program(program: torch.export.ExportedProgram, path: str | os.PathLike) -> str:
    """``torch.export.save(program, path)``; returns the path."""
    with apply_patches("pt2"):
        torch.export.save(program, path)
    return str(path)


def load_program(path: str | os.PathLike) -> torch.export.ExportedProgram:
    """``torch.export.load(path)``, with the fake-tensor dispatch cache off while the node metadata is rebuilt
    (each node is a new op on new shapes, so every lookup misses: see ``engine.exporter_dynamo``)."""
    with apply_patches("pt2"), fake_dispatch_cache_off_while_tracing():
        program = torch.export.load(path)
    restore_fake_dispatch_cache(program)
    return program
