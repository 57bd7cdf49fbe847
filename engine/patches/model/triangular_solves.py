"""Unit lower-triangular systems (gated delta rules) solved by forward substitution in tensor ops.

Pattern: ``torch.linalg.solve_triangular`` and the gated-delta chunk kernels' Python loop over the chunk rows; the
first has no ONNX or ExecuTorch lowering, the second pins the chunk size.
"""

from __future__ import annotations

import math

import torch

from engine.patches.registry import register_patch


_GATED_DELTA_MODULES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid", "qwen4_exp")


def unit_lower_triangular_inverse(matrix: torch.Tensor) -> torch.Tensor:
    """``(I + L)^-1`` for ``L`` the strictly lower part of ``matrix`` (its diagonal is taken as ones).

    ``L`` is nilpotent (``L^n = 0`` for an n x n matrix), so the inverse is the finite series
    ``sum_k (-L)^k = (I - L)(I + L^2)(I + L^4)...``: ``ceil(log2 n)`` products of squares, a dozen matmuls where
    forward substitution takes n - 1 dependent steps. A symbolic side (a chunk size torch.export could not
    simplify, ``(s + pad) // ((s + pad) // 64)``) is checked equal to its traced value, as broadcasting it
    against a ``torch.eye(64)`` would.
    """
    n = matrix.shape[-1]
    if not isinstance(n, int):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        size = optimization_hint(n)
        torch._check(n == size, lambda: f"a unit triangular system of side {n} was traced at side {size}")
        n = size
    eye = torch.eye(n, dtype=matrix.dtype, device=matrix.device)
    power = -matrix.tril(-1)
    inverse = eye + power
    for _ in range(max(0, math.ceil(math.log2(n)) - 1)):
        power = power @ power
        inverse = inverse + inverse @ power
    return inverse


@register_patch("dynamo", "torch.linalg.solve_triangular")
def _patch_unit_triangular_solve(original):
    """Pattern: ``torch.linalg.solve_triangular(A, B, upper=False, unitriangular=True)`` (gated delta rule
    models, see below) traces to ``aten.linalg_solve_triangular``, which neither torch.onnx nor ExecuTorch
    lowers. That case becomes ``unit_lower_triangular_inverse(A) @ B``; every other call goes to torch.
    Not an upstream bug: the ops are missing by design. No upstream issue applies.
    """

    def solve_triangular(A, B, *, upper, left=True, unitriangular=False, out=None):
        if unitriangular and not upper and left and out is None:
            return unit_lower_triangular_inverse(A) @ B
        return original(A, B, upper=upper, left=left, unitriangular=unitriangular, out=out)

    return solve_triangular


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.is_torchdynamo_exporting" for m in _GATED_DELTA_MODULES))
def _patch_gated_delta_forward_substitution(original):
    """Pattern: ``torch_chunk_gated_delta_rule`` (Qwen3-Next and its kin) switches on ``is_torchdynamo_exporting()``
    from ``solve_triangular`` to ``for i in range(1, chunk_size)``: a forward substitution of 63 dependent in-place row
    updates per layer, traced on symbolic shapes (most of the graph's nodes and of the export's time). In these modules
    the flag guards only that branch, so it reads False and the solve goes through ``_patch_unit_triangular_solve``
    (log2(64) = 6 products instead). ``test_gated_delta_modules_use_the_export_flag_only_for_the_solve`` fails if a
    module starts using the flag for anything else. No upstream issue found; TODO (transformers): a loop-free UT solve
    on the export path."""
    return lambda: False
