"""Ops torch.export records that the ONNX and ExecuTorch lowerings do not take (or compute wrong), rewritten as FX
node fixes (stage 3) of the ``"onnx"`` and ``"executorch"`` scopes into ops both lowerings take; an op whose output
size only data gives (``bincount``), which a node fix cannot re-derive, as a trace patch instead.
"""

from __future__ import annotations

import math
import operator

import torch

from engine.patches.fx_edit import insert_node, size_node
from engine.patches.model.image_grids import ANTIALIAS_TAPS, antialiased_weights
from engine.patches.registry import register_fx_node_fix, register_patch

# ── Correctness: trace patches ──────────────────────────────────────────────────────────────────────────────


@register_patch("executorch", "torch.bincount")
def _patch_bincount_as_scatter_add(original):
    """Make ``torch.bincount(ids, weights, minlength)`` a ``scatter_add`` into zeros.

    Pattern: counting ids per row (Splinter's questions per sample, ``torch.bincount(rows)``). ``aten.bincount`` is
    not Core ATen: ExecuTorch's verifier refuses it (repro ``bincount_not_core_aten.py``). Rewrite: ones (or the
    weights) added at each id into ``max(max(ids) + 1, minlength)`` zeros, the length read from data as bincount's
    own is: the same counts, in bincount's dtype (int64, or the float32/float64 weights'; others keep the op).
    """

    def bincount(input, weights=None, minlength=0):
        known_empty = isinstance(input.numel(), int) and input.numel() == 0  # (then int64 zeros, weights or not)
        if known_empty or input.dim() != 1 or (weights is not None and weights.dtype not in (torch.float32, torch.float64)):
            return original(input, weights, minlength)
        length = torch.cat([input, input.new_full((1,), minlength - 1)]).max().item() + 1  # empty ids: minlength
        torch._check(length >= minlength)
        values = torch.ones_like(input) if weights is None else weights
        return values.new_zeros(length).scatter_add(0, input, values)

    return bincount


@register_patch("executorch", "torch.nn.functional.interpolate")
def _patch_antialiased_resize_as_matmuls(original):
    """Make ``F.interpolate(mode="bilinear"|"bicubic", antialias=True)`` of a fixed-size grid two matmuls.

    Pattern: a vision tower resizes its position-embedding grid to the image's patch grid with an antialiased bicubic
    resize (UnlimitedOcr's ``interpolate_pos_encoding``). torch.export records ``aten._upsample_bicubic2d_aa``, not
    Core ATen: ExecuTorch's verifier refuses it (repro ``bicubic_antialias_not_core_aten.py``). Rewrite: the resize
    is separable, so rows then columns by the filter's weight matrices (:func:`antialiased_weights`), the output
    size symbolic or not. A grid of symbolic size, or of another dtype, keeps the op."""

    def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                    recompute_scale_factor=None, antialias=False):
        sources = tuple(input.shape[2:])
        if not (antialias and mode in ANTIALIAS_TAPS and input.dim() == 4
                and input.dtype in (torch.float32, torch.float64) and all(isinstance(s, int) for s in sources)):
            return original(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
        factors = scale_factor if scale_factor is None or isinstance(scale_factor, (tuple, list)) else (scale_factor,) * 2
        if size is not None:
            sizes = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        else:
            sizes = tuple(math.floor(s * f) for s, f in zip(sources, factors))
        weights = []
        for axis, (source, out) in enumerate(zip(sources, sizes)):
            count = torch.scalar_tensor(out, dtype=torch.float64, device=input.device)
            if align_corners:  # ATen's area_pixel_compute_scale
                scale = torch.where(count > 1, (source - 1) / (count - 1).clamp(min=1), 0.0)
            elif factors is not None and not recompute_scale_factor:
                scale = torch.scalar_tensor(1 / factors[axis], dtype=torch.float64, device=input.device)
            else:
                scale = source / count
            index = torch.arange(out, device=input.device)
            weights.append(antialiased_weights(index, scale, source, mode).to(input.dtype))
        return weights[0] @ input @ weights[1].T

    return interpolate


# ── Correctness: FX node fixes ──────────────────────────────────────────────────────────────────────────────
# Ops torch.export records that neither torchlib nor ExecuTorch's edge dialect takes.


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_is_all_true_as_all(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``aten._is_all_true(x)`` an ``aten.all(x)``.

    Pattern: a model checks a whole tensor before using it (LLaVA checks that its image tokens match the image
    features with ``torch.all(...)``); torch.export records the check as ``aten._is_all_true``, which torchlib
    cannot lower ("No ONNX function found for aten._is_all_true") and which is not in the Core ATen opset
    ExecuTorch's edge dialect takes. Both return a 0-d bool tensor; ``aten.all`` is a plain reduction.
    TODO: upstream issue not found.
    """
    if node.op != "call_function" or node.target is not torch.ops.aten._is_all_true.default:
        return False
    with gm.graph.inserting_before(node):
        replacement = gm.graph.call_function(torch.ops.aten.all.default, (node.args[0],))
    replacement.meta.update(node.meta)
    node.replace_all_uses_with(replacement)
    return True


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_searchsorted_as_comparison_count(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.searchsorted(sorted, values)`` and ``torch.bucketize(values, boundaries)`` a count of the sorted
    entries below each value: ``(sorted < value).sum(-1)`` (``<=`` for ``right=True``).

    Pattern: bucketed patch coordinates (Idefics2/3, Aria: ``bucketize``), question positions (Splinter:
    ``searchsorted``). torchlib has no ``aten.searchsorted`` (https://github.com/pytorch/pytorch/issues/151648); neither
    op is Core ATen (https://github.com/pytorch/executorch/issues/20270). The insertion index is by definition that
    count: the same integers, at ``len(sorted)`` times the values' memory. A ``sorter`` is gathered first. NaN values
    count 0 entries where torch puts them last."""
    if node.op != "call_function" or node.target not in (torch.ops.aten.searchsorted.Tensor, torch.ops.aten.bucketize.Tensor):
        return False
    bound = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs  # every argument, by name
    values = bound["input"]
    sequence = bound["boundaries"] if node.target is torch.ops.aten.bucketize.Tensor else bound["sorted_sequence"]
    right = bound["right"] or bound.get("side") == "right"
    if bound.get("sorter") is not None:
        sequence = insert_node(gm, node, torch.ops.aten.gather.default, sequence, -1, bound["sorter"])
    if sequence.meta["val"].dim() > 1:  # one sorted row per leading index: (..., 1, M) against (..., K, 1)
        sequence = insert_node(gm, node, torch.ops.aten.unsqueeze.default, sequence, -2)
    column = insert_node(gm, node, torch.ops.aten.unsqueeze.default, values, -1)
    below = insert_node(gm, node, torch.ops.aten.le.Tensor if right else torch.ops.aten.lt.Tensor, sequence, column)
    dtype = torch.int32 if bound["out_int32"] else torch.int64
    # the node becomes the count in place: it keeps its name, which the program's output specs may refer to
    node.target, node.args, node.kwargs = torch.ops.aten.sum.dim_IntList, (below, [-1]), {"dtype": dtype}
    return True


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch", ops=(torch.ops.aten.fft_fft.default, torch.ops.aten.fft_ifft.default,
                                         torch.ops.aten.fft_fftn.default, torch.ops.aten.fft_ifftn.default,
                                         torch.ops.aten.fft_irfft.default,
                                         torch.ops.aten.fft_rfft.default))  # decomposed: _fft_c2c/_c2r/_r2c
def _fix_complex_tensors_as_real_pairs(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make every complex-valued node a real ``(..., 2)`` pair (:mod:`engine.patches.complex_pairs`), at the first one.

    Pattern: complex rotary embeddings (``torch.polar`` times ``view_as_complex(q)``: DeepSeek-V2, Llama 4), Fourier
    token mixing (FNet), autocorrelation (Autoformer's ``rfft``/``conj``) and inverse-STFT heads (``torch.polar``
    then ``torch.fft.irfft``). ``aten.polar`` and the FFTs are not Core ATen (https://github.com/pytorch/executorch/issues/1362); torchlib has no complex ``aten.unsqueeze``
    ("No decompositions registered for the complex-valued input": https://github.com/pytorch/pytorch/issues/126972). A
    graph with a complex op the rewrite does not know is left as it is."""
    if node.op != "call_function" or getattr(node, "_erased", False):
        return False
    from engine.patches.complex_pairs import complex_as_real_pairs, touches_complex

    return touches_complex(node) and complex_as_real_pairs(gm) > 0


_SEGMENT_REDUCTIONS = {  # reduce: (fill where another segment, reduction over a compared line, combination with self)
    "sum": (0.0, torch.ops.aten.sum.dim_IntList, torch.ops.aten.add.Tensor),
    "mean": (0.0, torch.ops.aten.sum.dim_IntList, torch.ops.aten.add.Tensor),
    "prod": (1.0, torch.ops.aten.prod.dim_int, torch.ops.aten.mul.Tensor),
    "amax": (-math.inf, torch.ops.aten.amax.default, torch.ops.aten.maximum.default),
    "amin": (math.inf, torch.ops.aten.amin.default, torch.ops.aten.minimum.default),
}


@register_fx_node_fix("executorch", ops=(torch.ops.aten.scatter_reduce.two,))
def _fix_scatter_reduce_as_comparisons(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make a floating ``scatter_reduce(dim, index, src, reduce)`` a reduction over the index compared with itself
    along ``dim``, written back with a plain ``scatter``.

    Pattern: segment reductions (Tapas' ``_segment_reduce``, 1-D; Blt's ``patch_reduce``, ``amax`` along the bytes of
    ``(batch, bytes, hidden)``). ExecuTorch's portable library has no ``scatter_reduce.two_out`` kernel
    (https://github.com/pytorch/executorch/issues/11330; repro ``skiplists/repros/scatter_reduce_missing_kernel.py``).
    Each source element gets the reduction over its line's elements of the same index: an ``[..., N, N, ...]``
    comparison, quadratic in N, counted by the memory budget like any tensor (:mod:`engine.dim_bounds`)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if node.op != "call_function" or node.target is not torch.ops.aten.scatter_reduce.two:
        return False
    bound = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs
    target, index, src = bound.get("self", bound.get("input")), bound["index"], bound["src"]
    values = [a.meta.get("val") for a in (target, index, src)]
    if (bound["reduce"] not in _SEGMENT_REDUCTIONS or any(not isinstance(v, torch.Tensor) for v in values)
            or not values[2].is_floating_point() or len({v.dim() for v in values}) != 1 or values[2].dim() == 0):
        return False
    dim = bound["dim"] % values[2].dim()
    for d, (used, given) in enumerate(zip(values[1].shape, values[2].shape)):
        if not statically_known_true(used == given):  # scatter_reduce reads the source's first index-sized elements
            length = insert_node(gm, node, torch.ops.aten.sym_size.int, index, d)
            src = insert_node(gm, node, torch.ops.aten.slice.Tensor, src, d, 0, length)
    fill, reduction, combine = _SEGMENT_REDUCTIONS[bound["reduce"]]
    over = dim + 1 if reduction is torch.ops.aten.prod.dim_int else [dim + 1]  # the compared line's other elements
    same = insert_node(gm, node, torch.ops.aten.eq.Tensor,
                       insert_node(gm, node, torch.ops.aten.unsqueeze.default, index, dim + 1),
                       insert_node(gm, node, torch.ops.aten.unsqueeze.default, index, dim))
    row = insert_node(gm, node, torch.ops.aten.unsqueeze.default, src, dim)
    other = insert_node(gm, node, torch.ops.aten.full_like.default, row, fill)
    per = insert_node(gm, node, reduction, insert_node(gm, node, torch.ops.aten.where.self, same, row, other), over)
    if bound["include_self"]:
        per = insert_node(gm, node, combine, per, insert_node(gm, node, torch.ops.aten.gather.default, target, dim, index))
    if bound["reduce"] == "mean":  # over the segment's elements, and self's value where it is included
        count = insert_node(gm, node, torch.ops.aten.sum.dim_IntList, same, [dim + 1], dtype=values[2].dtype)
        per = insert_node(gm, node, torch.ops.aten.div.Tensor, per,
                          insert_node(gm, node, torch.ops.aten.add.Tensor, count, 1) if bound["include_self"] else count)
    per = insert_node(gm, node, torch.ops.aten._to_copy.default, per, dtype=values[0].dtype)
    node.target, node.args, node.kwargs = torch.ops.aten.scatter.src, (target, dim, index, per), {}
    return True


_REPEAT_INTERLEAVES = (torch.ops.aten.repeat_interleave.Tensor, torch.ops.aten.repeat_interleave.self_Tensor)


def _output_length(gm: torch.fx.GraphModule, node: torch.fx.Node, repeats: torch.fx.Node) -> torch.fx.Node | None:
    """A node computing the length of ``node``'s 1-D output: from the inputs' sizes where torch derived it from
    them (Inkling2: ``4 * patches``), else ``repeats.sum().item()`` defining the data-dependent symbol ``node``
    bound (its ``unbacked_bindings`` move there); None where neither applies."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    val, bindings = node.meta.get("val"), node.meta.get("unbacked_bindings") or {}
    if not isinstance(val, torch.Tensor) or val.dim() != 1 or not isinstance(val.shape[0], torch.SymInt):
        return None
    size = val.shape[0]
    if not free_unbacked_symbols(size) and not bindings:  # torch knew the length from the inputs' sizes
        return size_node(gm, node, size.node.expr)
    if not size.node.expr.is_symbol or set(free_unbacked_symbols(size)) != set(bindings):
        return None
    total = insert_node(gm, node, torch.ops.aten.sum.default, repeats)
    with gm.graph.inserting_before(node):
        item = gm.graph.call_function(torch.ops.aten._local_scalar_dense.default, (total,))
    item.meta.update({k: v for k, v in node.meta.items() if k != "unbacked_bindings"})
    item.meta["val"] = size
    item.meta["unbacked_bindings"] = {size.node.expr: ()}
    total.meta.pop("unbacked_bindings", None)
    node.meta.pop("unbacked_bindings", None)
    return item


@register_fx_node_fix("onnx")
def _fix_repeat_interleave_of_known_length_as_comparison_count(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The comparison count below, for a ``repeat_interleave`` given its ``output_size`` (torchlib translates the
    op without one)."""
    return _repeat_interleave_as_comparison_count(gm, node, derive_length=False)


@register_fx_node_fix("executorch")
def _fix_repeat_interleave_as_comparison_count(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """The comparison count below, with or without ``output_size``."""
    return _repeat_interleave_as_comparison_count(gm, node, derive_length=True)


def _repeat_interleave_as_comparison_count(gm: torch.fx.GraphModule, node: torch.fx.Node, derive_length: bool) -> bool:
    """Make ``torch.repeat_interleave(repeats, output_size=n)`` a comparison count, ``(arange(n)[:, None] >=
    cumsum(repeats)[None, :]).sum(-1)`` (memory ``n x len(repeats)``); with a 1-D ``x`` first, ``x`` gathered at those
    indices.

    Pattern: Kimi-K2.5's temporal merge index: ``aten.repeat_interleave.Tensor`` is not Core ATen, and torchlib's
    translation takes no ``output_size`` ("aten_repeat_interleave_Tensor() got an unexpected keyword argument
    'output_size'"). Without ``output_size`` (ExecuTorch only) the length is the output's own size, from the inputs'
    sizes where torch derived it, else ``repeats.sum().item()`` bound to the node's symbol. TODO: upstream issue not
    found."""
    if node.op != "call_function" or node.target not in _REPEAT_INTERLEAVES:
        return False
    bound = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs  # every argument, by name
    length, repeats = bound.get("output_size"), bound["repeats"]
    source = bound.get("input") if node.target is torch.ops.aten.repeat_interleave.self_Tensor else None
    if source is not None and (repeats.meta["val"].dim() != 1 or source.meta["val"].dim() != 1
                               or bound.get("dim") not in (None, 0, -1)):
        return False  # the index form, or one 1-D tensor repeated element-wise (what the models do)
    if length is None:
        length = _output_length(gm, node, repeats) if derive_length else None
        if length is None:
            return False
    positions = insert_node(gm, node, torch.ops.aten.arange.default, length, dtype=repeats.meta["val"].dtype)
    ends = insert_node(gm, node, torch.ops.aten.cumsum.default, repeats, 0)
    column = insert_node(gm, node, torch.ops.aten.unsqueeze.default, positions, 1)
    row = insert_node(gm, node, torch.ops.aten.unsqueeze.default, ends, 0)
    covered = insert_node(gm, node, torch.ops.aten.ge.Tensor, column, row)
    # the node becomes the result in place: it keeps its name, which the program's output specs may refer to
    if source is None:
        node.target, node.args, node.kwargs = torch.ops.aten.sum.dim_IntList, (covered, [-1]), {"dtype": repeats.meta["val"].dtype}
    else:
        index = insert_node(gm, node, torch.ops.aten.sum.dim_IntList, covered, [-1], dtype=torch.int64)
        node.target, node.args, node.kwargs = torch.ops.aten.index_select.default, (source, 0, index), {}
    return True


#: Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing Gems, 2011): central and
#: tail polynomial coefficients in w = -log((1 - x)(1 + x)), highest degree first
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)
_ERFINV_OPS = {torch.ops.aten.erfinv.default, torch.ops.prims.erf_inv.default}


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_erfinv_as_polynomial(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.erfinv(x)`` Giles' polynomial approximation, refined by one Newton step on ``erf``.

    Pattern: Gemma3n's activation sparsity, ``torch.distributions.Normal(0, 1).icdf(sparsity)`` (``sqrt(2) * erfinv(2p -
    1)``). ONNX has no Erfinv op (torchlib: no translation for ``prims.erf_inv``) and ``aten.erfinv`` is not Core ATen.
    The approximation's relative error is below 4e-7 in float32 (Giles 2011); one Newton step on ``erf`` brings it to
    float32 rounding, as torch's kernel refines its own. ``x = +-1`` gives ``+-inf`` and ``|x| > 1`` NaN, as in torch.
    TODO: upstream issue not found (no ONNX Erfinv op; no ExecuTorch kernel)."""
    if node.op != "call_function" or node.target not in _ERFINV_OPS:
        return False
    aten = torch.ops.aten
    (x,) = node.args

    def call(target, *args, **kwargs) -> torch.fx.Node:
        return insert_node(gm, node, target, *args, **kwargs)

    def polynomial(w, coefficients):
        p = coefficients[0]
        for c in coefficients[1:]:
            p = call(aten.add.Tensor, call(aten.mul.Tensor, w, p), c)
        return p

    # 1 - x as -x + 1 (the same float): ONNX's table decomposes rsub, and one such op sends the whole single trace
    # through torch.onnx's decomposition again (``_patch_decompose_once``)
    one_minus_x = call(aten.add.Tensor, call(aten.neg.default, x), 1.0)
    w = call(aten.neg.default, call(aten.log.default, call(aten.mul.Tensor, one_minus_x, call(aten.add.Tensor, x, 1.0))))
    central = polynomial(call(aten.sub.Tensor, w, 2.5), _ERFINV_CENTRAL)
    tail = polynomial(call(aten.sub.Tensor, call(aten.sqrt.default, w), 3.0), _ERFINV_TAIL)
    guess = call(aten.mul.Tensor, call(aten.where.self, call(aten.lt.Scalar, w, 5.0), central, tail), x)
    # Newton on erf(y) = x: y -= (erf(y) - x) / (2 / sqrt(pi) * exp(-y^2))
    slope = call(aten.mul.Tensor, call(aten.exp.default, call(aten.neg.default, call(aten.mul.Tensor, guess, guess))), 2 / math.sqrt(math.pi))
    refined = call(aten.sub.Tensor, guess, call(aten.div.Tensor, call(aten.sub.Tensor, call(aten.erf.default, guess), x), slope))
    edge = call(aten.eq.Scalar, call(aten.abs.default, x), 1.0)  # erfinv(+-1) = +-inf, where the step is 0/0
    node.target, node.args, node.kwargs = aten.where.self, (edge, call(aten.mul.Tensor, x, math.inf), refined), {}
    return True


@register_fx_node_fix("executorch")
def _fix_histc_as_comparison_count(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.histc(x, bins, min, max)`` a count of the elements per bin index.

    Pattern: MoE token counts per expert, ``torch.histc(expert_ids.float(), bins=num_experts, min=0, max=num_experts -
    1)`` (transformers' ``integrations/moe.py``): not Core ATen; torchlib refuses ``min == max`` ("aten_histc with min
    == max (0.0) is not supported"). Rewrite: torch's CPU kernel in core ops: ``min == max`` takes the data's range (+1
    if constant); in range, bin ``trunc((x - min) * bins / (max - min))`` (last edge to the last bin), NaN to none. ONNX
    only where torchlib refuses (:func:`_fix_histc_of_the_data_range`). TODO: upstream issue not found (torchlib
    ``aten_histc``; no ExecuTorch kernel)."""
    return node.op == "call_function" and node.target is torch.ops.aten.histc.default and _histc_as_count(gm, node)


@register_fx_node_fix("onnx")
def _fix_histc_of_the_data_range(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """``torch.histc(x, bins, min=m, max=m)`` (the data's range) as :func:`_fix_histc_as_comparison_count` counts
    it: torchlib's ``aten_histc`` lowers a fixed range but raises for ``min == max`` (a one-expert MoE config,
    HunYuan-MoE's default)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.histc.default:
        return False
    bound = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs
    return bound["min"] == bound["max"] and _histc_as_count(gm, node)


def _histc_as_count(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    bound = node.normalized_arguments(gm, normalize_to_only_use_kwargs=True).kwargs  # every argument, by name
    x, bins, low, high = bound["input"], int(bound["bins"]), bound["min"], bound["max"]
    aten = torch.ops.aten

    def call(target, *args, **kwargs) -> torch.fx.Node:
        return insert_node(gm, node, target, *args, **kwargs)

    flat = call(aten.reshape.default, x, [-1])
    if low == high:  # the data's range, widened where it is a single value
        low, high = call(aten.amin.default, flat, [0]), call(aten.amax.default, flat, [0])
        constant = call(aten.eq.Tensor, low, high)
        low = call(aten.where.self, constant, call(aten.sub.Tensor, low, 1), low)
        high = call(aten.where.self, constant, call(aten.add.Tensor, high, 1), high)
        width = call(aten.sub.Tensor, high, low)
        at_least, at_most = call(aten.ge.Tensor, flat, low), call(aten.le.Tensor, flat, high)
    else:
        low, high = float(low), float(high)
        width = high - low
        at_least, at_most = call(aten.ge.Scalar, flat, low), call(aten.le.Scalar, flat, high)
    # the kernel's arithmetic, in its order: (x - min) * bins / (max - min), truncated; the last edge in the last bin
    scaled = call(aten.div.Tensor, call(aten.mul.Tensor, call(aten.sub.Tensor, flat, low), bins), width)
    index = call(aten.clamp.default, call(aten._to_copy.default, scaled, dtype=torch.int64), None, bins - 1)
    inside = call(aten.bitwise_and.Tensor, at_least, at_most)
    in_bin = call(aten.eq.Tensor, call(aten.unsqueeze.default, index, -1), call(aten.arange.default, bins, dtype=torch.int64))
    hits = call(aten.bitwise_and.Tensor, in_bin, call(aten.unsqueeze.default, inside, -1))
    # the node becomes the count in place (it keeps its name, which output specs may refer to)
    node.target, node.args, node.kwargs = aten.sum.dim_IntList, (hits, [0]), {"dtype": node.meta["val"].dtype}
    return True


@register_fx_node_fix("onnx")
def _fix_squeeze_of_non_unit_dims(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Leave out of ``squeeze`` the dims whose size is known not to be 1.

    Pattern: Parakeet's and Nemotron-ASR's RNNT joint ``logits[B, T, U, V].squeeze(2)`` with a decoder length
    ``U`` of 8: a no-op in torch (a dim that is not 1 is kept), but torchlib exports it as ``Squeeze(axes=[2])``,
    which the ONNX spec rejects for a non-1 dim, so onnxruntime refuses the model at load ("Dimension of input 2 must
    be 1 instead of 8"). The dims whose size is known not to be 1 (an integer, or a symbolic size ranged from 2) are
    dropped from the squeeze (the node is a copy of its input where none is left); others are left to the squeeze.
    Upstream: pytorch/pytorch#36796."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.squeeze.dim, aten.squeeze.dims):
        return False
    x, dims = node.args[0], node.args[1]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() == 0:
        return False
    dims = [dims] if isinstance(dims, int) else list(dims)
    kept = [d for d in dims if not statically_known_true(val.shape[d] != 1)]
    if len(kept) == len(dims):
        return False
    # rewritten in place: the node keeps its name, which output specs may refer to
    node.target, node.args, node.kwargs = (aten.squeeze.dims, (x, kept), {}) if kept else (aten.clone.default, (x,), {})
    return True


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_running_extremum_as_masked_reduction(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.cummax`` / ``torch.cummin`` along a dim of ``n`` a reduction over a lower-triangular mask.

    Pattern: running max/min of delimiter positions (GroundingDino's phrase masks: ``torch.cummax(prev_special,
    dim=1)``). torchlib has no ``aten.cummax`` ("No ONNX function found") and neither op is Core ATen. Rewrite: with the
    dim last, value ``i`` is the extremum of entries ``j <= i`` (others filled with the extremum's identity) and its
    index the last such ``j`` holding it: torch's indices, ties included, at ``n`` times the input's memory. NaNs are
    not ordered as torch orders them (TODO if a model needs it). TODO: upstream issue not found."""
    aten = torch.ops.aten
    if node.op != "call_function" or node.target not in (aten.cummax.default, aten.cummin.default):
        return False
    if any(user.op != "call_function" or user.target is not operator.getitem for user in node.users):
        return False  # the pair itself is used: left as it is
    source, dim = node.args[0], node.args[1]
    value = source.meta["val"]
    rank, largest = value.dim(), node.target is aten.cummax.default
    if rank == 0:
        return False
    dim %= rank
    order = [d for d in range(rank) if d != dim] + [dim]
    back = sorted(range(rank), key=order.__getitem__)
    if value.is_floating_point():
        identity = -math.inf if largest else math.inf
    elif value.dtype == torch.bool:
        identity = not largest
    else:
        identity = torch.iinfo(value.dtype).min if largest else torch.iinfo(value.dtype).max

    def call(target, *args, **kwargs):
        return insert_node(gm, node, target, *args, **kwargs)

    length = call(aten.sym_size.int, source, dim)
    positions = call(aten.arange.default, length, dtype=torch.int64, device=value.device)
    earlier = call(aten.le.Tensor, call(aten.unsqueeze.default, positions, 0),
                   call(aten.unsqueeze.default, positions, 1))  # (i, j): j <= i
    rows = call(aten.unsqueeze.default, call(aten.permute.default, source, order), -2)  # (..., 1, n): entry j
    fill = call(aten.full.default, [], identity, dtype=value.dtype, device=value.device)
    extremum = call(aten.amax.default if largest else aten.amin.default,
                    call(aten.where.self, earlier, rows, fill), [-1])  # (..., n): value i
    holds = call(aten.logical_and.default, earlier,
                 call(aten.eq.Tensor, rows, call(aten.unsqueeze.default, extremum, -1)))
    none = call(aten.full.default, [], -1, dtype=torch.int64, device=value.device)
    index = call(aten.amax.default, call(aten.where.self, holds, positions, none), [-1])
    outputs = (extremum, index)
    # each ``getitem`` of the pair becomes its output in place: it keeps its name, which output specs may refer to
    for user in list(node.users):
        user.target, user.args, user.kwargs = aten.permute.default, (outputs[user.args[1]], back), {}
    gm.graph.erase_node(node)
    return True




def _is_integer(value) -> bool:
    """Whether a node's value is an integer tensor (not bool)."""
    return isinstance(value, torch.Tensor) and not (value.is_floating_point() or value.is_complex()
                                                     or value.dtype is torch.bool)


def _exponent_bits(exponent: torch.fx.Node, dtype: torch.dtype) -> int:
    """How many bits the exponents can have: those of ``arange(end)``'s last value where the exponent is one with a
    static end (Blt's ``prime ** arange(group_size)``), else every value bit of the dtype."""
    if exponent.target in (torch.ops.aten.arange.default, torch.ops.aten.arange.start):
        end = exponent.args[0] if exponent.target is torch.ops.aten.arange.default else exponent.args[1]
        if isinstance(end, int):
            return max(1, (end - 1).bit_length())
    return torch.iinfo(dtype).bits - 1


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_integer_pow_as_squarings(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make an integer ``base ** exponent`` a product of the base's repeated squares, one per set bit of the exponent.

    Pattern: polynomial hashes (Blt's ``prime ** arange(g)``, a prime near 1e9). onnxruntime's int64 ``Pow`` and
    ExecuTorch's ``pow`` compute in double: ``1000000007 ** 2`` rounded past ``2**53``, an overflowing power the int64
    minimum (repros ``int64_pow_past_double_precision.py`` and ``executorch_int64_pow_sum_remainder.py`` in
    ``skiplists/repros/``; no upstream issue found). Integer multiplication wraps as torch's power does: exact."""
    if node.op != "call_function" or node.target is not torch.ops.aten.pow.Tensor_Tensor:
        return False
    base, exponent = node.args[0], node.args[1]
    values = [getattr(a, "meta", {}).get("val") for a in (base, exponent, node)]
    if not all(map(_is_integer, values)):
        return False
    square = insert_node(gm, node, torch.ops.aten._to_copy.default, base, dtype=values[2].dtype)
    ones = insert_node(gm, node, torch.ops.aten.full_like.default, square, 1)
    factors = []  # the square where the exponent's bit is set, else 1
    for bit in range(_exponent_bits(exponent, values[1].dtype)):
        if bit:
            square = insert_node(gm, node, torch.ops.aten.mul.Tensor, square, square)
        is_set = insert_node(gm, node, torch.ops.aten.ne.Scalar,
                             insert_node(gm, node, torch.ops.aten.bitwise_and.Scalar, exponent, 1 << bit), 0)
        factors.append(insert_node(gm, node, torch.ops.aten.where.self, is_set, square, ones))
    product = ones
    for factor in factors[:-1]:
        product = insert_node(gm, node, torch.ops.aten.mul.Tensor, product, factor)
    # the node itself computes the last product: the program's signature may name it as an output
    node.target, node.args, node.kwargs = torch.ops.aten.mul.Tensor, (product, factors[-1]), {}
    return True


#: the longest static dim an int64 sum is unrolled over (the sums of hashes are over a few window bytes)
MAX_UNROLLED_SUM = 64


@register_fx_node_fix("onnx")
@register_fx_node_fix("executorch")
def _fix_int64_sum_as_additions(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make an int64 sum over one dim of static length (at most :data:`MAX_UNROLLED_SUM`) a chain of additions of its
    slices.

    Pattern: the same polynomial hashes, summed over each window (``(windows * prime ** arange(g)).sum(-1)``).
    onnxruntime's int64 ``ReduceSum`` and ExecuTorch's ``sum`` kernel accumulate in double, so sums past ``2**53``
    come back rounded (the same two repros); int64 addition is exact and wraps as torch's sum does."""
    if node.op != "call_function" or node.target is not torch.ops.aten.sum.dim_IntList:
        return False
    source, dims = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    value, out = getattr(source, "meta", {}).get("val"), node.meta.get("val")
    if (not _is_integer(value) or not isinstance(out, torch.Tensor) or out.dtype is not torch.int64 or not dims
            or len(dims) != 1):
        return False
    dim = dims[0] % value.dim()
    length = value.shape[dim]
    if not isinstance(length, int) or not 1 < length <= MAX_UNROLLED_SUM:  # one element's sum is exact
        return False
    if value.dtype is not torch.int64:
        source = insert_node(gm, node, torch.ops.aten._to_copy.default, source, dtype=torch.int64)
    parts = [insert_node(gm, node, torch.ops.aten.slice.Tensor, source, dim, i, i + 1) if keepdim
             else insert_node(gm, node, torch.ops.aten.select.int, source, dim, i) for i in range(length)]
    total = parts[0]
    for part in parts[1:-1]:
        total = insert_node(gm, node, torch.ops.aten.add.Tensor, total, part)
    # the node itself adds the last part: the program's signature may name it as an output
    node.target, node.args, node.kwargs = torch.ops.aten.add.Tensor, (total, parts[-1]), {}
    return True


@register_fx_node_fix("executorch")
def _fix_integer_remainder_with_the_divisors_sign(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make an integer ``remainder(a, b)`` that remainder plus ``b`` where it is not 0 and its sign is not ``b``'s.

    Pattern: the same hashes, wrapped into the vocabulary with ``% vocab`` after overflowing to negative values.
    Torch's remainder takes the divisor's sign; ExecuTorch's int64 ``remainder`` kernel the dividend's (C's ``%``):
    ``-25754`` where torch gives ``4246`` modulo 30000 (repro
    ``skiplists/repros/executorch_int64_pow_sum_remainder.py``; no upstream issue found). The correction changes
    nothing where the sign is already the divisor's. (``fmod``, C's remainder, is no way out: ExecuTorch computes it
    in double.)"""
    if node.op != "call_function" or node.target not in (torch.ops.aten.remainder.Scalar, torch.ops.aten.remainder.Tensor):
        return False
    if not _is_integer(node.meta.get("val")):
        return False
    a, b = node.args[0], node.args[1]
    scalar = node.target is torch.ops.aten.remainder.Scalar
    if scalar and not isinstance(b, int):  # a symbolic divisor (a size): its sign is known only at run time
        return False
    rest = insert_node(gm, node, node.target, a, b)
    lt = torch.ops.aten.lt.Scalar
    signs_differ = insert_node(gm, node, torch.ops.aten.ne.Scalar if scalar else torch.ops.aten.ne.Tensor,
                               insert_node(gm, node, lt, rest, 0), b < 0 if scalar else insert_node(gm, node, lt, b, 0))
    wrap = insert_node(gm, node, torch.ops.aten.logical_and.default, signs_differ,
                       insert_node(gm, node, torch.ops.aten.ne.Scalar, rest, 0))
    wrapped = insert_node(gm, node, torch.ops.aten.add.Scalar if scalar else torch.ops.aten.add.Tensor, rest, b)
    node.target, node.args, node.kwargs = torch.ops.aten.where.self, (wrap, wrapped, rest), {}
    return True
