"""Patches and FX node fixes of the ExecuTorch exporter (stages 2, 3 and 5 of :mod:`engine.exporter_executorch`).

Each one exists because a test model (``tests/engine/tiny_models.py``) or a model tried by hand needs it;
its docstring names the pattern and the upstream issue. Imported by ``ExecutorchExporter.export``.
"""

from __future__ import annotations

import torch

from engine.patches import register_fx_node_fix, register_patch  # noqa: F401

# ── Stage 2: Torch patches ────────────────────────────────────────────────────────────────────────
# Ops the ExecuTorch/XNNPACK path cannot take, swapped during torch.export.

# ── Stage 3: ExecuTorch patches ───────────────────────────────────────────────────────────────────
# ExecuTorch internals that crash on legitimate dynamic-shape patterns, swapped during lowering.

# ── Stage 5: FX node fixes ────────────────────────────────────────────────────────────────────────
