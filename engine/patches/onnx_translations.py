"""Stage 4 of :mod:`engine.exporter_onnx`: onnxscript translations for aten ops whose torchlib lowering is missing or wrong.

``translation_table()`` is passed to ``torch.onnx.export(custom_translation_table=...)``. Each entry is an
``_aten_<op>`` function traced by the exporter: it receives ``onnx_ir`` values for tensor arguments and plain
Python values for attributes, and builds its result from ``op.*`` calls. Name each after the op it lowers,
and say in its docstring which lowering it replaces and why (with the upstream issue).

This module imports onnxscript; :mod:`engine.exporter_onnx` imports it only after checking the dependency.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import onnx_ir as ir
import torch
from onnxscript.function_libs.torch_lib.ops.core import aten_add as _torchlib_add
from onnxscript.function_libs.torch_lib.ops.core import aten_bincount as _torchlib_bincount
from onnxscript.function_libs.torch_lib.ops.core import aten_mul as _torchlib_mul
from onnxscript.function_libs.torch_lib.ops.core import aten_sub as _torchlib_sub
from onnxscript.function_libs.torch_lib.tensor_typing import INT64, IntType, TFloat, TReal, TTensor
from onnxscript.onnx_opset import opset18 as op

_ONNX_DTYPE: dict[torch.dtype, ir.DataType] = {
    torch.float32: ir.DataType.FLOAT,
    torch.float64: ir.DataType.DOUBLE,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.int32: ir.DataType.INT32,
    torch.int64: ir.DataType.INT64,
}


def _aten_grouped_mm(mat_a: TFloat, mat_b: TFloat, offs: INT64, bias: TFloat | None = None, out_dtype: Any = None) -> TFloat:
    """MoE grouped matmul: ``out[r] = mat_a[r] @ mat_b[g(r)]`` for rows sorted by group, ``offs`` = group ends.

    Pattern: Mixtral-style MoE experts as ``aten._grouped_mm`` (bf16 on CUDA) or transformers' custom op
    ``transformers::grouped_mm_fallback`` (same contract); torchlib lowers neither: "No ONNX function found". TODO:
    upstream issue not found (torchlib has no ``_grouped_mm``; the custom op is transformers-defined).

    Rewrite: the group count ``mat_b.shape[0]`` is static, so one row ``Slice`` + ``MatMul`` per group and a ``Concat``.
    Half-precision operands multiply in float32, cast back (or to ``out_dtype``); onnxruntime's CPU provider has no
    bfloat16 ``MatMul``."""
    groups = mat_b.shape[0] if mat_b.shape is not None else None
    if not isinstance(groups, int):
        raise ValueError("_grouped_mm: the number of groups (mat_b.shape[0]) must be static to lower to ONNX")
    result_dtype = mat_a.dtype
    if out_dtype is not None:
        result_dtype = _ONNX_DTYPE[out_dtype] if isinstance(out_dtype, torch.dtype) else ir.DataType(out_dtype)
    if mat_a.dtype in (ir.DataType.BFLOAT16, ir.DataType.FLOAT16):
        mat_a, mat_b = op.Cast(mat_a, to=ir.DataType.FLOAT.value), op.Cast(mat_b, to=ir.DataType.FLOAT.value)
        if bias is not None:
            bias = op.Cast(bias, to=ir.DataType.FLOAT.value)
        computed = ir.DataType.FLOAT
    else:
        computed = mat_a.dtype
    axis0 = op.Constant(value_ints=[0])
    ends = op.Cast(offs, to=ir.DataType.INT64.value)
    start = op.Constant(value_ints=[0])
    pieces = []
    for g in range(groups):
        end = op.Slice(ends, op.Constant(value_ints=[g]), op.Constant(value_ints=[g + 1]), axis0)
        rows = op.Slice(mat_a, start, end, axis0)
        weight = op.Gather(mat_b, op.Constant(value_int=g), axis=0)
        piece = op.MatMul(rows, weight)
        if bias is not None:
            piece = op.Add(piece, op.Gather(bias, op.Constant(value_int=g), axis=0))
        pieces.append(piece)
        start = end
    result = op.Concat(*pieces, axis=0) if groups > 1 else op.Identity(pieces[0])
    if result_dtype != computed:
        result = op.Cast(result, to=result_dtype.value)
    return result


def _aten_bincount(self: IntType, weights: TReal | None = None, minlength: int = 0) -> TTensor:
    """``torch.bincount`` with ``weights``: a ``ScatterElements(reduction="add")`` of the weights into zeros.

    Pattern: weighted histograms (``torch.bincount(ids, weights=w)``, e.g. per-expert load statistics in MoE
    routers). torchlib's ``aten_bincount`` raises ``NotImplementedError("aten::bincount with weights is not
    supported.")``. TODO: upstream issue not found (the limitation is stated in torchlib's docstring).

    Without ``weights`` this defers to torchlib, whose lowering is correct. The output dtype follows torch:
    float32 and float64 weights keep their dtype, any other weight dtype accumulates in float64.
    """
    if weights is None:
        return _torchlib_bincount(self, None, minlength)
    ids = op.Cast(self, to=ir.DataType.INT64.value)
    axis0 = op.Constant(value_ints=[0])
    # Append a 0 so ReduceMax is defined on an empty input; an empty input then gives depth 0 (or minlength).
    biggest = op.ReduceMax(op.Concat(ids, op.Constant(value_ints=[0]), axis=0), axis0, keepdims=1)
    non_empty = op.Cast(op.Greater(op.Size(ids), op.Constant(value_int=0)), to=ir.DataType.INT64.value)
    depth = op.Mul(op.Add(biggest, op.Constant(value_ints=[1])), op.Unsqueeze(non_empty, axis0))
    if minlength > 0:
        depth = op.Max(depth, op.Constant(value_ints=[minlength]))
    weight_dtype = weights.dtype
    out_dtype = weight_dtype if weight_dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE) else ir.DataType.DOUBLE
    values = op.Cast(weights, to=out_dtype.value)
    zeros = op.ConstantOfShape(depth, value=ir.tensor([0], dtype=out_dtype))
    return op.ScatterElements(zeros, ids, values, axis=0, reduction="add")


def _aten_group_norm(input: TFloat, num_groups: int, weight: TFloat | None = None, bias: TFloat | None = None,
                     eps: float = 1e-05, cudnn_enabled: bool = True) -> TFloat:
    """``torch.nn.functional.group_norm`` with the variance of the centred values, ``mean((x - mean)**2)``.

    Pattern: every ``nn.GroupNorm`` (ResNet-style and audio-codec blocks). From opset 21 torch.onnx lowers
    ``aten.group_norm`` to ``GroupNormalization-21``, which onnxruntime runs without a native kernel of that version
    (microsoft/onnxruntime#24538) and which, there as in ``onnx.reference``, loses the variance of groups whose mean is
    large against their spread (mean 1, std 1e-3: 0.1 off torch; catastrophic cancellation, as in
    pytorch/pytorch#94261). Rewrite: torch's centred variance, in float32 for half inputs (torch's CPU kernel
    accumulates in float too)."""
    dtype = input.dtype
    half = dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    x = op.Cast(input, to=ir.DataType.FLOAT.value) if half else input
    grouped_shape = op.Concat(op.Shape(x, start=0, end=1), op.Constant(value_ints=[num_groups, -1]), axis=0)
    grouped = op.Reshape(x, grouped_shape)
    axis = op.Constant(value_ints=[2])
    centred = op.Sub(grouped, op.ReduceMean(grouped, axis, keepdims=1))
    variance = op.ReduceMean(op.Mul(centred, centred), axis, keepdims=1)
    epsilon = op.CastLike(op.Constant(value_float=eps), variance)
    normalised = op.Reshape(op.Mul(centred, op.Reciprocal(op.Sqrt(op.Add(variance, epsilon)))), op.Shape(x))
    if half:
        normalised = op.Cast(normalised, to=dtype.value)
    rank = len(input.shape) if input.shape is not None else None
    if rank is None:
        raise ValueError("group_norm: the input's rank must be known to lower to ONNX")
    channel_axes = op.Constant(value_ints=list(range(1, rank - 1)))  # (C,) -> (C, 1, ..., 1)
    if weight is not None:
        normalised = op.Mul(normalised, op.CastLike(op.Unsqueeze(weight, channel_axes), normalised))
    if bias is not None:
        normalised = op.Add(normalised, op.CastLike(op.Unsqueeze(bias, channel_axes), normalised))
    return normalised


def _operator_floordiv(self: INT64, other: INT64) -> INT64:
    """``a // b`` of symbolic sizes, rounding toward minus infinity as Python does.

    Pattern: size arithmetic that divides a negative number, e.g. the ceiling division ``-(-length // stride)``
    or ``(kernel - length) // stride`` in padding code. torchlib lowers ``operator.floordiv`` to ONNX ``Div``,
    which truncates ("only for positive inputs ... the usual intended case", its comment says), so
    ``(3 - 8) // 2`` is -2 instead of -3 and the program computes another shape without an error
    (microsoft/onnxscript#989 for ``floor_divide``). Here: truncation, minus one where the signs differ and the
    division leaves a remainder (torch's ``floor_divide`` reference); non-negative operands divide as before.
    """
    truncated = op.Div(self, other)
    signs_differ = op.Equal(op.Less(self, op.CastLike(0, self)), op.Greater(other, op.CastLike(0, other)))
    inexact = op.Not(op.Equal(op.Mod(self, other), op.CastLike(0, self)))
    return op.Sub(truncated, op.Cast(op.And(signs_differ, inexact), to=ir.DataType.INT64.value))


def _scalar_operand(other: Any, self: TTensor) -> TTensor:
    """The ``Scalar`` operand of an ``aten.<op>.Scalar`` as a tensor of ``self``'s dtype: a constant for a
    Python number (what torchlib builds), a cast of the graph value for a symbolic one."""
    if isinstance(other, ir.Value):
        return op.CastLike(other, self)
    return op.Constant(value=ir.tensor(other, dtype=self.dtype))


def _aten_add_scalar(self: TTensor, other: Any, alpha: float = 1.0) -> TTensor:
    """``aten.add.Scalar`` whose scalar may be symbolic; see :func:`_aten_mul_scalar`."""
    return _torchlib_add(self, _scalar_operand(other, self), alpha=alpha)


def _aten_sub_scalar(self: TTensor, other: Any, alpha: float = 1.0) -> TTensor:
    """``aten.sub.Scalar`` whose scalar may be symbolic; see :func:`_aten_mul_scalar`."""
    return _torchlib_sub(self, _scalar_operand(other, self), alpha=alpha)


def _aten_mul_scalar(self: TTensor, other: Any) -> TTensor:
    """``tensor * s`` where ``s`` is a float computed from symbolic sizes (a ``SymFloat``).

    Pattern: ``coords * (size / 16)`` (the position grids of DeepSeek-OCR-2 and Unlimited-OCR), traced as
    ``aten.mul.Scalar(tensor, truediv)`` with the ``SymFloat`` a graph value. torchlib's ``aten_mul_scalar`` (and
    ``add``/``sub``) builds it with ``ir.tensor(other)``, which takes only a Python number: "float() argument must be a
    string or a real number, not 'SymbolicTensor'". Rewrite: a symbolic scalar is cast to the tensor's dtype (what torch
    computes in); a Python number gets torchlib's own constant. TODO: upstream issue not found (onnxscript's
    ``aten_*_scalar`` lowerings, torch_lib/ops/core.py)."""
    return _torchlib_mul(self, _scalar_operand(other, self))


def translation_table() -> dict[Callable, Callable]:
    """``{torch op overload: onnxscript function}`` for ``torch.onnx.export(custom_translation_table=...)``."""
    table: dict[Callable, Callable] = {torch.ops.aten.bincount.default: _aten_bincount,
                                       torch.ops.aten.group_norm.default: _aten_group_norm,
                                       operator.floordiv: _operator_floordiv,
                                       torch.ops.aten.add.Scalar: _aten_add_scalar,
                                       torch.ops.aten.sub.Scalar: _aten_sub_scalar,
                                       torch.ops.aten.mul.Scalar: _aten_mul_scalar}
    if hasattr(torch.ops.aten, "_grouped_mm"):
        table[torch.ops.aten._grouped_mm.default] = _aten_grouped_mm
    # transformers registers its fallback custom op when its MoE integration is imported (any MoE model does)
    fallback = getattr(getattr(torch.ops, "transformers", None), "grouped_mm_fallback", None)
    if fallback is not None:
        table[fallback.default] = _aten_grouped_mm
    return table
