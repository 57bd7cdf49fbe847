"""ExecuTorch correctness patches and FX node fixes: patterns the ExecuTorch/XNNPACK path rejects or computes wrong.

Registered for ``"executorch"``. The torch patches are active while :meth:`DynamoExporter.trace` traces (stage 2)
and while the program is lowered (stage 4), as are the patches of ExecuTorch internals; the node fixes rewrite the
traced program (stage 3). The speed patches of the same stages are in :mod:`engine.patches.executorch_speed`.
Each exists because a test model (``tests/engine/tiny_models.py``) needs it; its docstring names the pattern and
the upstream issue.
"""

from __future__ import annotations

import functools
import math
import types

import numpy as np
import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.printers import PythonPrinter
from torch.utils._sympy.value_ranges import bound_sympy

from engine.patches.model.sequence_scans import unrolled_scan
from engine.patches.registry import register_fx_program_fix, register_patch

#: the ExecuTorch releases whose internals these patches were read against: 1.4.1 (the pins) and 1.5.1, whose
#: patched functions and the helpers they call are unchanged (diffed when following upstream, reports/drift/)
EXECUTORCH_RANGE = {"executorch": ">=1.4,<1.6"}


# ── Correctness: torch functions the model calls ────────────────────────────────────────────────────────────
# Ops the ExecuTorch/XNNPACK path cannot take, swapped while tracing.


@register_patch("executorch", "torch.nn.functional.scaled_dot_product_attention")
def _patch_sdpa_output_layout(original):
    """Pattern: a ``view`` of the SDPA output (``attn.transpose(1, 2).reshape(b, s, -1)``, then ``x.view(-1, d)``).
    ``torch.export`` records those reshapes as bare views because the SDPA meta kernel reports a contiguous ``(N, H, L,
    E)`` output, but ExecuTorch's lowering re-decomposes SDPA through ``_scaled_dot_product_flash_attention_for_cpu``,
    which returns an ``(L, N, H, E)``-strided buffer: ``Cannot view a tensor with shape [s0, s1, 32] and strides (32,
    32*s0, 1)`` (GPT-2's ``Conv1D``). Rewrite: a contiguous ``clone`` of the output, valid under either decomposition.
    Upstream: https://github.com/pytorch/pytorch/issues/136543 (same error from the SDPA decomposition)."""

    def scaled_dot_product_attention(*args, **kwargs):
        return original(*args, **kwargs).clone(memory_format=torch.contiguous_format)

    return scaled_dot_product_attention


@register_patch("executorch", "torch.nn.functional.embedding_bag")
def _patch_fixed_size_bags_as_embedding_sums(original):
    """Pattern: a weighted gather of fixed-size bags, ``F.embedding_bag(indices_2d, table, per_sample_weights=w,
    mode="sum")`` (Kimi-K2.5's vision position embeddings interpolate their taps this way). ExecuTorch's portable
    library has no ``_embedding_bag`` kernel and XNNPACK does not take it, so the program fails to load (0x14,
    OperatorMissing). A bag of a 2-D ``input`` is its row; ``sum`` is then ``(embedding(input) * w[..., None]).sum(1)``
    (and ``mean``/``max`` the row's mean/max without weights): the same rows of the table, reduced per bag. Calls
    with offsets, a padding index, ``max_norm`` or other modes keep the op. Upstream: none found for a portable
    ``_embedding_bag`` kernel (TODO)."""

    def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,
                      mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                      padding_idx=None):
        if (input.dim() != 2 or input.shape[1] == 0 or offsets is not None or max_norm is not None or padding_idx is not None
                or mode not in ("sum", "mean", "max") or (per_sample_weights is not None and mode != "sum")):
            return original(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                            per_sample_weights, include_last_offset, padding_idx)
        rows = F.embedding(input, weight)  # [bags, bag size, dim]
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.to(rows.dtype)[..., None]
        if mode == "max":
            return rows.amax(1)
        return rows.sum(1) if mode == "sum" else rows.mean(1)

    return embedding_bag


def _triple(value) -> tuple[int, int, int]:
    return tuple(value) * (3 // len(value)) if isinstance(value, (tuple, list)) else (value,) * 3


@register_patch("executorch", "torch.nn.functional.conv3d")
def _patch_conv3d_as_conv2d_over_time(original):
    """Pattern: a 3-D convolution (video tubelet embeddings; Emu3's temporal VQ-VAE layers). ExecuTorch 1.5.1 has no
    5-D convolution: XNNPACK does not take it, the portable kernel fails with 0x12
    (https://github.com/pytorch/executorch/issues/11704; fixed after 1.5.1 by pytorch/executorch#19977).

    Rewrite: non-overlapping time windows are 2-D convolutions with time folded into the batch and the temporal taps
    into the input channels; any other temporal kernel is the sum over its taps of a 2-D convolution of the frames
    each tap reads (the same sum in another order). A string padding goes to the original."""

    def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str) or input.dim() != 5:
            return original(input, weight, bias, stride, padding, dilation, groups)
        (st, sh, sw), (pt, ph, pw), (dt, dh, dw) = _triple(stride), _triple(padding), _triple(dilation)
        kt = weight.shape[2]
        if st != kt or pt != 0 or (dt != 1 and kt != 1):
            return _conv3d_as_a_sum_over_taps(input, weight, bias, (st, sh, sw), (pt, ph, pw), (dt, dh, dw), groups)
        n, c, t, h, w = input.shape
        windows = t // kt
        x = input.narrow(2, 0, windows * kt).reshape(n, c, windows, kt, h, w)
        x = x.permute(0, 2, 1, 3, 4, 5).reshape(n * windows, c * kt, h, w)
        y = torch.nn.functional.conv2d(x, weight.flatten(1, 2), bias, (sh, sw), (ph, pw), (dh, dw), groups)
        return y.reshape(n, windows, *y.shape[1:]).permute(0, 2, 1, 3, 4)

    return conv3d


def _conv3d_as_a_sum_over_taps(input, weight, bias, stride, padding, dilation, groups):
    """``conv3d`` as one ``conv2d`` per temporal tap of the frames that tap reads, summed, then the bias."""
    (st, sh, sw), (pt, ph, pw), (dt, dh, dw) = stride, padding, dilation
    x = torch.nn.functional.pad(input, (0, 0, 0, 0, pt, pt)) if pt else input
    n, c, t, h, w = x.shape
    frames = (t - dt * (weight.shape[2] - 1) - 1) // st + 1
    out = None
    for tap in range(weight.shape[2]):
        read = x[:, :, tap * dt: tap * dt + st * (frames - 1) + 1: st].transpose(1, 2).reshape(n * frames, c, h, w)
        y = torch.nn.functional.conv2d(read, weight[:, :, tap], None, (sh, sw), (ph, pw), (dh, dw), groups)
        out = y if out is None else out + y
    if bias is not None:
        out = out + bias[None, :, None, None]
    return out.reshape(n, frames, *out.shape[1:]).transpose(1, 2)


def _dynamic_dims(val) -> int:
    return sum(1 for d in val.shape if free_symbols(d)) if isinstance(val, torch.Tensor) else 0


def _input_value(node):
    """The fake value of ``node``'s first argument, None where it is no node."""
    return node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None


def _rejecting(original, refused):
    """A partitioner config's ``check_constraints`` that also refuses the nodes ``refused(node)`` names: the ones
    XNNPACK's serializer would fail on, so they stay on the portable kernels."""

    def check_constraints(self, node, ep):
        return False if refused(node) else original(self, node, ep)

    return check_constraints


@register_patch("executorch", "torch._subclasses.fake_impls.op_implementations_dict", requires=EXECUTORCH_RANGE)
def _patch_nonzero_planned_row_major(original):
    """Pattern: ``torch.nonzero`` (or ``argwhere``) in an ExecuTorch program. torch's CPU and fake ``nonzero`` return the
    ``(n, ndim)`` indices column-major (strides ``(1, n)``; https://github.com/pytorch/pytorch/pull/130440), so
    ExecuTorch plans dim order ``(1, 0)``, but its portable kernel writes row-major: consumers fail with 0x12
    ('tensors_have_same_dim_order'), or a copy to contiguous silently transposes the indices.

    Rewrite: while an ExecuTorch program is traced and lowered, the fake kernel returns row-major indices (strides are
    layout, not data; restored after). TODO: upstream ExecuTorch issue not found (2026-11-28): the portable kernel could
    honour the planned dim order instead."""
    nonzero = torch.ops.aten.nonzero.default
    column_major = original[nonzero]

    def row_major(fake_mode, func, arg):
        out = column_major(fake_mode, func, arg)
        return arg.new_empty((out.shape[0], arg.dim()), dtype=torch.int64)

    return {**original, nonzero: row_major}


@register_patch(
    "executorch",
    "executorch.exir.tensor.dim_order_from_stride",
    "executorch.exir.tensor_layout.dim_order_from_stride",
    "executorch.exir.emit._emitter.dim_order_from_stride",
    "executorch.exir.passes.replace_view_copy_with_view_pass.dim_order_from_stride",
    requires=EXECUTORCH_RANGE,
)
def _patch_dim_order_of_unbacked_strides(original):
    """Pattern: strides holding a data-dependent size, e.g. ``(32*u0, 32, 1)`` after a boolean-mask selection (Idefics2/3's
    ``pixel_values[real_images_inds]``). ExecuTorch orders dims by sorting strides; its comparator (``exir/tensor.py``,
    https://github.com/pytorch/executorch/pull/19516) proves ``32 < 32*u0`` by divisibility but not the reverse ``32*u0
    < 32``, and raises GuardOnDataDependentSymNode. Rewrite: strides are positive and a multiple of a stride is not
    smaller (if equal, the dim is 1 long: same memory either order), so the answer is False: the original's rule applied
    both ways, only where it raised. TODO: upstream issue not found for the reverse comparison."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, guard_or_false

    def dim_order_from_stride(stride):
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            pass  # only then: every order the original computes stays as it was

        def later_first(pair_a, pair_b):  # -1 when dim a is outer (larger stride) than dim b
            a, b = pair_a[1], pair_b[1]
            if guard_or_false(a == b):
                return 0
            if guard_or_false(a > b) or guard_or_false(a % b == 0):  # a multiple of b: not smaller
                return -1
            if guard_or_false(a < b) or guard_or_false(b % a == 0):
                return 1
            return -1 if a > b else 1  # undecidable: the original raises the same guard here

        for s in stride:
            torch._check(s != 0, lambda: "0 in strides is not supported for ExecuTorch.")
        return tuple(i for i, _ in sorted(enumerate(stride), key=functools.cmp_to_key(later_first)))

    return dim_order_from_stride


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints",
    requires=EXECUTORCH_RANGE,
)
def _patch_unsqueeze_with_several_dynamic_dims(original):
    """Pattern: ``unsqueeze(-1)`` of a tensor with two or more dynamic dims (``[batch, seq] -> [batch, seq, 1]``).

    XNNPACK's partitioner accepts any trailing-dim ``unsqueeze_copy``, but its serializer
    (``UnsqueezeVisitor.define_node``) emits a static reshape that allows one dynamic dim only and raises
    ``XNNPACK reshape only supports 1 dynamic dimension`` at lowering. Reject such nodes in the partitioner,
    mirroring the serializer's check, so they stay on the portable ``unsqueeze_copy`` kernel.
    Upstream: the limit comes with https://github.com/pytorch/executorch/pull/7959 (static_reshape, "up to one
    dynamic dimension"); no issue found for the partitioner/serializer mismatch (TODO).
    """

    return _rejecting(original, lambda node: _dynamic_dims(node.meta.get("val")) > 1)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.xnnpack_config.XNNPartitionerConfig.check_common_constraints",
    requires=EXECUTORCH_RANGE,
)
def _patch_tensors_above_xnnpacks_rank(original):
    """Pattern: an op on a tensor of more than six dims (Inkling's image packing views its patches as
    ``[B, T, 1, 4, 10, H/10, W/10, C]`` before a permute).

    XNNPACK defines tensors of at most ``XNN_MAX_TENSOR_DIMS`` = 6 dims (executorch/backends/xnnpack/utils/
    xnnpack_constants.py), but no partitioner config checks it: the op is delegated, the ``.pte`` is written, and
    loading it fails ('Failed to define tensor 0 with code: xnn_status_unsupported_parameter', 0x1). Refuse such a
    node in every config's common constraints, so it runs on the portable kernels. Upstream: no issue found for the
    partitioner admitting tensors above XNNPACK's rank (TODO).
    """
    from executorch.backends.xnnpack.utils.xnnpack_constants import XNN_MAX_TENSOR_DIMS

    def above_rank(node) -> bool:
        values = [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
        values = [v for value in values for v in (value if isinstance(value, (tuple, list)) else (value,))]
        return any(isinstance(v, torch.Tensor) and v.ndim > XNN_MAX_TENSOR_DIMS for v in values)

    def check_common_constraints(self, node, ep):
        return False if above_rank(node) else original(self, node, ep)

    return check_common_constraints


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.GeluConfig.check_constraints",
    requires=EXECUTORCH_RANGE,
)
def _patch_tanh_gelu_delegated_as_exact_gelu(original):
    """Pattern: ``gelu(x, approximate="tanh")`` (``gelu_pytorch_tanh``/``gelu_new``: SigLIP, the Gemma family,
    GPT-2-style MLPs). XNNPACK's partitioner takes every ``aten.gelu`` and its serializer writes an exact (erf)
    ``XNNGelu`` whatever ``approximate`` says: up to 4.7e-4 off the tanh form, past the sweep's 1e-4 over a vision
    tower. Rewrite: tanh GELU stays out of the partition; ExecuTorch's portable ``gelu`` kernel implements the tanh
    form. Upstream: https://github.com/pytorch/executorch/pull/22851 (routes tanh GELU to XNNPACK's approxgelu; merged
    after 1.5.1)."""

    return _rejecting(original, lambda node: node.kwargs.get("approximate", "none") == "tanh"
                      or (len(node.args) > 1 and node.args[1] == "tanh"))


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints",
    "executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints",
    requires=EXECUTORCH_RANGE,
)
def _patch_conv1d_with_several_dynamic_dims(original):
    """Pattern: a node XNNPACK runs as a 1-D convolution over ``[batch, channels, length]`` with two or more of those
    dims dynamic: a ``conv1d`` or a ``BatchNorm1d``, which XNNPACK's ``DecomposeBatchNorm`` makes a depthwise conv1d
    (Conformer-style speech encoders). XNNPACK runs a conv1d as ``unsqueeze(-1) -> conv2d -> squeeze(-1)``, a static
    reshape limited to one dynamic dim: ``XNNPACK reshape only supports 1 dynamic dimension``. Rewrite: such nodes stay
    out of the XNNPACK partition; the portable kernels run them. Upstream: the one-dynamic-dim limit is stated in
    https://github.com/pytorch/executorch/pull/2976; no issue found for the partitioner admitting such nodes (TODO)."""

    def runs_as_conv1d_with_several_dynamic_dims(node):
        val = _input_value(node)
        return isinstance(val, torch.Tensor) and val.ndim == 3 and _dynamic_dims(val) > 1

    return _rejecting(original, runs_as_conv1d_with_several_dynamic_dims)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.node_configs.PreluConfig.check_constraints",
    requires=EXECUTORCH_RANGE,
)
def _patch_prelu_of_other_ranks_than_4(original):
    """Pattern: ``nn.PReLU`` on states that are not 4-D images (DAB-DETR's default activation on ``(batch, seq,
    hidden)``). XNNPACK's partitioner takes every ``prelu`` with a parameter weight, but its
    ``ChannelsLastTaggedReshapePass`` converts the input to NHWC and asserts 'Attempting to convert non-NHWC
    compatible node to NHWC'. Rewrite: such a ``prelu`` stays out of the partition; ``to_edge`` then decomposes it
    to core ATen (a ``where``) for the other kernels. Upstream: repro ``skiplists/repros/xnnpack_prelu_3d_nhwc.py``
    (pytorch/executorch; no issue found, TODO)."""

    return _rejecting(original, lambda node: getattr(_input_value(node), "ndim", None) != 4)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.xnnpack_partitioner.XnnpackPartitioner.generate_partitions",
    requires=EXECUTORCH_RANGE,
)
def _patch_no_op_copies_out_of_partition_outputs(original):
    """Pattern: a copy XNNPACK drops as a no-op (``clone``/``_clone_dim_order`` keeping the dim order: ``.contiguous()``
    of a contiguous tensor) whose result leaves the partition while its source does too, or comes from outside
    (RecurrentGemma returns a permute and its contiguous copy). XNNPACK's ``RemoveCloneOpsTransform`` removes it and
    the partition returns one value twice, or its own input: 'Output node ... is already in the inputs'. Rewrite:
    such a copy leaves the partition, for the portable kernel. Upstream: pytorch/executorch#14937 (pass-through
    outputs); no issue found for the removed copy (TODO)."""
    from executorch.backends.transforms.remove_clone_ops import RemoveCloneOpsTransform

    def aliases_an_output(node, nodes) -> bool:
        if node.target not in RemoveCloneOpsTransform.clone_ops or any(user in nodes for user in node.users):
            return False
        source = node.args[0]
        return source not in nodes or any(user is not node and user not in nodes for user in source.users)

    def generate_partitions(self, ep):
        partitions = original(self, ep)
        for partition in partitions:
            for node in [n for n in partition.nodes if aliases_an_output(n, partition.nodes)]:
                partition.remove_node(node)
        return [partition for partition in partitions if partition.nodes]

    return generate_partitions


@register_patch("executorch", "engine.patches.model.sequence_scans._scan")
def _patch_time_loops_unrolled_for_executorch(scan):
    """The time-loop scans of :mod:`engine.patches.model.sequence_scans` (RWKV, RecurrentGemma, xLSTM) as steps
    unrolled up to the traced length (:func:`~engine.patches.model.sequence_scans.unrolled_scan`): ExecuTorch 1.5.1
    lowers the scan, but its emitted copy of the initial carry cannot take a batch other than the planned one (0x12
    at run time). The ``.pte`` takes lengths up to the traced one. Upstream: repro
    ``skiplists/repros/scan_with_dynamic_carry.py`` (executorch)."""
    return unrolled_scan


# ── Correctness: ExecuTorch internals ───────────────────────────────────────────────────────────────────────
# Internals that fail on legitimate dynamic-shape patterns, swapped while lowering.


@register_patch("executorch", "torch._subclasses.fake_tensor.op_implementations_checks", requires=EXECUTORCH_RANGE)
def _patch_slice_copy_with_data_dependent_bounds(original):
    """Pattern: a slice whose bounds are read from data, ``hidden[0, start : start + n] = features`` with ``start, n``
    from ``.tolist()`` (MiniCPM-V 4.6, MiniCPM-o). torch.export traces ``aten.slice`` through fake tensors'
    data-dependent-safe rule, but ExecuTorch's lowering re-traces ``aten.slice_copy``, whose meta decomposition
    (torch._decomp's ``slice_forward``) compares the bounds with plain ``if``s: "Could not guard on data-dependent
    expression u26 > 16". Rewrite: ``slice_copy`` gets ``slice``'s fake rule (then a contiguous copy), for the lowering
    only. Upstream: the fake rule for ``slice`` is https://github.com/pytorch/pytorch/pull/157944; none found for
    ``slice_copy`` (TODO)."""
    from torch._subclasses import fake_impls

    def is_slice_copy(func) -> bool:
        return func is torch.ops.aten.slice_copy.Tensor

    def slice_copy(fake_mode, func, source, *args, **kwargs):
        view = fake_impls.slice_forward(fake_mode, torch.ops.aten.slice.Tensor, source, *args, **kwargs)
        return view.clone(memory_format=torch.contiguous_format)

    return [(is_slice_copy, slice_copy), *original]


#: most points a size expression is evaluated at to find its exact maximum (else interval arithmetic)
_MAX_GRID = 1 << 16


def _exact_max(expr, var_to_range) -> int | None:
    """The exact maximum of an integer size expression over its symbols' (finite) ranges, by evaluating it at
    every point; ``None`` when the grid is too large or the expression does not evaluate."""
    syms = sorted(expr.free_symbols, key=str)
    ranges = [var_to_range.get(s) for s in syms]
    if not syms or any(r is None or not r.lower.is_finite or not r.upper.is_finite for r in ranges):
        return None
    spans = [(int(r.lower), int(r.upper)) for r in ranges]
    if math.prod(hi - lo + 1 for lo, hi in spans) > _MAX_GRID:
        return None
    key = (expr, tuple(spans))
    if key not in _EXACT_MAX_CACHE:
        _EXACT_MAX_CACHE[key] = _evaluate_max(expr, syms, spans)
    return _EXACT_MAX_CACHE[key]


_EXACT_MAX_CACHE: dict = {}


def _evaluate_max(expr, syms, spans) -> int | None:
    try:
        source = PythonPrinter().doprint(expr)
        fn = eval(f"lambda {', '.join(map(str, syms))}: {source}", {"math": math})  # noqa: S307 (printed sympy)
        grids = np.meshgrid(*[np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in spans], indexing="ij")
        with np.errstate(all="ignore"):
            values = np.asarray(fn(*grids))
        if values.dtype.kind not in "iu":
            return None
        return int(values.max())
    except Exception:  # an expression the printer or numpy cannot evaluate: keep the interval bound
        return None


@register_patch(
    "executorch",
    "executorch.exir.sym_util.eval_upper_bound",
    "executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound",
    requires=EXECUTORCH_RANGE,
)
def _patch_loose_upper_bound_of_floordiv_ratios(original):
    """Pattern: sizes dividing a dynamic length by a function of itself (chunked scans): ``n_chunks = padded // chunk``
    then ``padded // n_chunks``. ``eval_upper_bound``'s interval arithmetic bounds ``x // (x // 4)`` by ``upper(x) //
    lower(x // 4)`` (Mamba2: ``259`` planned for ``4``), and with no bound (a divisor ranging to 0) returns the traced
    hint, which later inputs exceed ("Attempted to resize a bounded tensor with a maximum capacity of ...").

    Rewrite: such expressions are evaluated exactly over their symbols' ranges when small (at most 65536 points; else
    the interval bound stands). TODO: upstream issue not found (executorch/exir/sym_util.py, eval_upper_bound)."""

    def eval_upper_bound(maybe_symint):
        bound = original(maybe_symint)
        if isinstance(maybe_symint, int):
            return bound
        node = maybe_symint.node
        exact = _exact_max(node.expr, node.shape_env.var_to_range)
        if exact is None:
            return bound
        if bound_sympy(node.expr, node.shape_env.var_to_range).upper is int_oo:  # ``bound`` is the traced hint
            return exact
        return min(bound, exact)

    return eval_upper_bound


@register_patch(
    "executorch",
    "executorch.exir.passes.sym_shape_eval_pass.ConstraintBasedSymShapeEvalPass.call",
    requires=EXECUTORCH_RANGE,
)
def _patch_view_planned_at_its_base_capacity(original):
    """Pattern: a view of a dynamic tensor whose dims are other functions of the same symbols than its base's (Mllama's
    ``[32, 17, 16]`` viewed as ``[8, 272, 2, 8]``). ExecuTorch plans a view (``et_view``) inside its base's memory but
    bounds each dim on its own, so its capacity can exceed the base's (load fails: 0x21) or fall short (resize fails).
    Rewrite: where the two differ, the view's upper-bound shape becomes ``[base elements, 1, ...]`` (``et_view`` sets
    real sizes at run time, checking only the element count). Upstream: TODO: upstream issue not found
    (executorch/exir/passes/replace_view_copy_with_view_pass.py ``_ViewSpec``, concretized per dim by
    ``ConstraintBasedSymShapeEvalPass``)."""
    from executorch.exir.passes.replace_view_copy_with_view_pass import _ViewSpec

    def call(self, graph_module):
        result = original(self, graph_module)
        for module in graph_module.modules():
            if not isinstance(module, torch.fx.GraphModule):
                continue
            for node in module.graph.nodes:
                spec = node.meta.get("spec")
                if isinstance(spec, _ViewSpec) and spec.shape and math.prod(spec.shape) != math.prod(spec._base.shape):
                    spec.shape = [math.prod(spec._base.shape)] + [1] * (len(spec.shape) - 1)
                    spec.stride = [1] * len(spec.shape)
        return result

    return call


@register_patch("executorch", "executorch.exir.program._program.lift_constant_tensor_pass", requires=EXECUTORCH_RANGE)
def _patch_lifted_constants_in_placeholder_order(original):
    """Pattern: a program whose first user input is a constant (a ``None`` leaf: the generation components of Gemma 3
    and Inkling take ``attention_mask`` as a dict of masks, some ``None``). ``to_edge`` inserts lifted constant
    placeholders before the first *tensor* user input but their input specs before the first user input *spec*, the
    constant one, and the verifier fails: "Input spec name _lifted_tensor_constant5 does not match node name
    attention_mask_full_attention". Rewrite: the specs put back in the placeholders' order (a permutation keeping every
    user input's order). TODO(upstream): no issue found (executorch/exir/program/_program.py
    ``lift_constant_tensor_pass``, 1.5.1)."""

    def lift_constant_tensor_pass(ep):
        ep = original(ep)
        specs = ep.graph_signature.input_specs
        names = [n.name for n in ep.graph.nodes if n.op == "placeholder"]
        by_name = {getattr(spec.arg, "name", None): spec for spec in specs}
        if [getattr(spec.arg, "name", None) for spec in specs] != names and sorted(by_name, key=str) == sorted(names):
            ep.graph_signature.input_specs = [by_name[name] for name in names]
        return ep

    return lift_constant_tensor_pass


#: ops that give their first argument's values (a device/dtype no-op when the dtype is unchanged)
_SAME_VALUE_OPS = ("aten.to.device", "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default",
                   "aten.clone.default", "aten.alias.default", "aten.detach.default")


def _same_values_as(node, source) -> bool:
    """Whether ``node`` is ``source`` passed through ops that keep its values, dtype and shape."""
    start = node
    while isinstance(node, torch.fx.Node) and node is not source and node.op == "call_function" \
            and str(node.target) in _SAME_VALUE_OPS:
        node = node.args[0]
    if node is not source:
        return False
    a, b = start.meta.get("val"), source.meta.get("val")
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape


@register_fx_program_fix("executorch")
def _fix_no_op_buffer_write_back(program) -> None:
    """Drop ``buffer.copy_(buffer.to(device, dtype))`` where that changes nothing.

    Pattern: a forward re-assigning a buffer to itself, moved (CTRL: ``self.pos_encoding =
    self.pos_encoding.to(device=..., dtype=...)``). torch.export records a write-back, which makes it a mutable buffer
    of the ExecuTorch program: planned, not loaded from the weights, so the positions read from it are garbage
    (CTRLModel off by up to 4.2). Rewrite: where the written value is the buffer's own (same dtype and shape, through
    ``to``/``_to_copy``/``clone``), the write-back is removed and the buffer stays a constant. TODO(upstream): no issue
    found (a write-back of an unchanged value as a mutation)."""
    buffers = set(program.graph_signature.inputs_to_buffers)
    graph = program.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is torch.ops.aten.copy_.default and not node.users
                and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder"
                and node.args[0].name in buffers and _same_values_as(node.args[1], node.args[0])):
            graph.erase_node(node)
            changed = True
    if changed:
        graph.eliminate_dead_code()
        program.graph_module.recompile()


@register_patch(
    "executorch",
    "executorch.exir.verification.arg_validator.EdgeOpArgValidator.call_function",
    requires=EXECUTORCH_RANGE,
)
def _patch_dtype_validator_len_of_tensor_list(original):
    """Pattern: an op returning one ``Tensor[]`` (``split_with_sizes_copy``: GPT-2's fused ``qkv.split``) whose
    first output has a dynamic dim 0 (the batch).

    The edge verifier's dtype validator walks ``node.meta["val"]`` one element per schema return, so for a single
    ``Tensor[]`` return it takes the *first tensor* for the list and calls ``len()`` on it. ``len`` of a tensor with
    a symbolic dim 0 installs the guard ``Eq(s0, 2)``: the batch is silently specialised to its traced size and
    the program then rejects any other batch at run time. Hand the validator the list wrapped as one return.
    Upstream: TODO: upstream issue not found (executorch/exir/verification/arg_validator.py, call_function).
    """

    def call_function(self, target, args, kwargs):
        returns = getattr(getattr(target, "_schema", None), "returns", ())
        val = self.node.meta.get("val")
        if len(returns) == 1 and returns[0].type == torch.ListType.ofTensors() and isinstance(val, (list, tuple)):
            self.node.meta["val"] = [val]
            try:
                return original(self, target, args, kwargs)
            finally:
                self.node.meta["val"] = val
        return original(self, target, args, kwargs)

    return call_function


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.node_configs.MaxDimConfig.check_constraints",
    requires=EXECUTORCH_RANGE,
)
def _patch_max_dim_outside_the_serializers_dims(original):
    """Pattern: ``x.max(dim=-1, keepdim=True).values`` on a 4-D tensor or ``x.max(dim=d)`` without ``keepdim`` (Hiera).
    XNNPACK's partitioner takes any ``max.dim`` of a 4-D input with unused indices, but its serializer
    (``op_max_dim.py``) needs ``keepdim=True`` and ``dim`` spelled 2 or 3 and raises ``amax.default only supports dim ==
    2 or dim == 3`` (or ``... keep_dim == True``): ``-1`` is refused although it is dim 3. Rewrite: the nodes the
    serializer would refuse (its own spelling check) stay out of the partition, on the portable kernel. Upstream: the
    same mismatch for ``mean.dim`` is fixed by https://github.com/pytorch/executorch/pull/19206; no issue found for
    ``max.dim`` (TODO)."""

    def refused(node):
        keepdim = len(node.args) > 2 and node.args[2] is True
        return not keepdim or node.args[1] not in (2, 3)

    return _rejecting(original, refused)


@register_patch("executorch", "executorch.exir.verification.verifier._EXECUTORCH_SYM_OPS", requires=EXECUTORCH_RANGE)
def _patch_edge_verifier_python_sym_functions(original):
    """Pattern: a data-dependent check on a tensor (``torch._check_tensor_all(mask.sum() * h == n)``, as
    transformers' ``torch_compilable_check`` does for LLaVA's image tokens) leaves ``torch.sym_ite`` in the program
    as part of a runtime assert. ``to_edge`` verifies the graph before ExecuTorch's own ``ReplaceSymSizeOpPass``
    maps Python sym functions (``torch.sym_ite``, ``sym_not``, ``sym_max``, ...) to ``executorch_prim`` ops, and
    the edge verifier admits no Python function but ``alloc`` (a bare ``AssertionError``). The verifier's set of
    admitted sym ops gains exactly the functions that pass maps. TODO: upstream issue not found.
    """
    from executorch.exir.passes.executorch_prim_ops_registry import _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS

    return set(original) | {op for op in _PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS if isinstance(op, types.FunctionType)}
