"""Whether a sample can tell an exporter's error from float32 rounding: float32 eager against a float64 copy.

The sweep compares every backend with float32 eager at ``atol = rtol = 1e-4``. On some tiny random samples float32
eager is itself further than that from the exact result, so the comparison measures how a runtime rounds, not
what the export computes: a ``GroupNorm(32, 32)`` (Deformable DETR hard-codes 32 groups) over a 1x1 feature map
normalises one element per group, whose exact output is its bias; torch's kernel returns rounding noise scaled by
``1 / sqrt(eps)`` there and onnxruntime returns the bias. A tiny WavTokenizer quantises every frame to code 0, so
its GroupNorms normalise constant rows; CpmAnt's embedding initialised with std 1.0 magnifies a reassociation to
2e-4 in the logits. Trained models at their real widths do not sit on such degenerate points.

:func:`well_conditioned` runs the model once more in float64 and compares. The zoo
(:func:`sweep.zoo.build.build_case`) builds a class whose sample fails it at the other profiles of its ladder,
smallest first, and keeps the first that runs, fits the parameter budget and passes; where none does, the case
stays as built and its row's discrepancy keeps its skiplist entry.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

#: the sweep's default comparison tolerance (``--atol``, ``--rtol``), which the float64 check uses
ATOL = RTOL = 1e-4


def well_conditioned(model: torch.nn.Module, inputs: dict[str, Any], atol: float = ATOL, rtol: float = RTOL) -> bool:
    """Whether ``model``'s float32 eager outputs match a float64 copy's within ``atol``/``rtol``: whether a
    comparison at that tolerance can tell an exporter's error from float32 rounding on this sample. A model whose
    float64 copy does not run (``torch._grouped_mm`` takes float32 and narrower only) cannot be judged so: True.
    A model whose outputs depend on random draws in its forward (float32 runs under two seeds differ; float32 and
    float64 draw other numbers from one seed) cannot be judged either: True."""
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors

    def run(module: torch.nn.Module, sample: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return get_leaf_tensors(module(**copy.deepcopy(sample)))

    wide = copy.deepcopy(model).double()
    wide_inputs = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                   for k, v in inputs.items()}
    with torch.no_grad(), torch.random.fork_rng():
        single = run(model, inputs)
        try:
            double = run(wide, wide_inputs)
        except Exception:  # noqa: BLE001 - a float64 path the model does not have: nothing to judge by
            return True
        if single.keys() != double.keys():
            return False
        reference = {k: v.to(single[k].dtype) if v.is_floating_point() else v for k, v in double.items()}
        if compare_leaves(reference, single, atol=atol, rtol=rtol).ok:
            return True
        again = run(model, inputs, seed=1)
    return not all(torch.equal(single[k], again[k]) for k in single)
