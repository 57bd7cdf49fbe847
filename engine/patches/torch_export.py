"""torch.export internals (scope ``"dynamo"``, and ``"pt2"``/``"executorch"`` where named): guards, probes and
solver steps that fail on symbolic shapes, and the internals' speed.

Model code torch.export cannot trace is patched in :mod:`engine.patches.model`; the ops it records that no lowering
takes in :mod:`engine.patches.unlowerable_ops`; what ``torch.export.save`` cannot write in
:mod:`engine.patches.program_io`.
"""

from __future__ import annotations

import math

import torch

from engine.patches.registry import register_patch


# ── Correctness: torch.export internals ─────────────────────────────────────────────────────────────────────


def contiguity_probe(sizes, strides) -> bool:
    """torch's ``check_contiguous_sizes_strides(..., false_if_dde=True)`` without its size-1 guards: a dim is
    skipped only where it is statically 1, else its stride is checked as for any dim."""
    from torch.fx.experimental.symbolic_shapes import guard_or_true, is_nested_int, statically_known_true

    expected = expected_max = 1
    for size, stride in reversed(tuple(zip(sizes, strides))):
        if statically_known_true(size == 1):
            continue
        if guard_or_true(stride != expected) and guard_or_true(stride != expected_max):
            return False
        expected_max *= size if is_nested_int(size) else torch.sym_max(size, 1)
        expected *= size
    return True


def contiguity_answered_once(sizes, strides) -> bool:
    """:func:`contiguity_probe`, answered once per shape env and tuple of size and stride expressions (after the
    env's replacements): a trace asks it of the same few layouts hundreds of times, each time building the
    symbolic products anew. Its guards are recorded by the first answer."""
    shape_env, key = None, [len(sizes)]
    for value in (*sizes, *strides):
        if isinstance(value, torch.SymInt):
            shape_env = value.node.shape_env
            key.append(value.node.expr)
        else:
            key.append(value)
    if shape_env is None:
        return contiguity_probe(sizes, strides)
    answers = shape_env.__dict__.setdefault("_export_sweep_contiguity", {})
    key = tuple(key)
    if key not in answers:
        answers[key] = contiguity_probe(sizes, strides)
    return answers[key]


@register_patch("dynamo", "torch._prims_common.check_contiguous_sizes_strides")
@register_patch("executorch", "torch._prims_common.check_contiguous_sizes_strides")  # and in the lowering's retraces
def _patch_contiguity_probe_without_singleton_guards(original):
    """Pattern: the layout probes that must not specialize (``false_if_dde=True``) skip size-1 dims with
    ``guard_or_false(size == 1)``, which for a backed symbolic size evaluates the traced value and records a guard. A
    derived size that is 1 at the traced shape (Funnel's pooled ``(seq - 1)//4`` at 8 tokens) pins the input: ``Eq((seq
    - 1)//4, 1)``.

    Rewrite: :func:`contiguity_probe`, answered once per layout (:func:`contiguity_answered_once`; a conservative
    False gates a layout, never a value). Calls without ``false_if_dde`` go to the original. Upstream:
    pytorch/pytorch#165032, fix proposed in pytorch/pytorch#185084 and pytorch/pytorch#185166 (not in torch 2.14.1)."""

    def check_contiguous_sizes_strides(sizes, strides, false_if_dde=False):
        if not false_if_dde:
            return original(sizes, strides, false_if_dde=false_if_dde)
        return contiguity_answered_once(sizes, strides)

    return check_contiguous_sizes_strides


@register_patch("dynamo", "torch._prims_common.is_contiguous")
@register_patch("executorch", "torch._prims_common.is_contiguous")  # and in the lowering's retraces
def _patch_contiguity_probe_without_numel_guards(original):
    """The same probe's first test, ``guard_or_false(numel < 2)``: a tensor of 0 or 1 elements at the traced shape
    (a strided slice of a short input) pinned its numel (``((seq + 8)//9) >= 2``). Static-only here too; the
    sizes and strides are then checked (pytorch/pytorch#185166)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    def is_contiguous(a, false_if_dde=False):
        if not false_if_dde:
            return original(a, false_if_dde=false_if_dde)
        if statically_known_true(a.numel() < 2):
            return True
        return torch._prims_common.check_contiguous_sizes_strides(a.shape, a.stride(), false_if_dde=True)

    return is_contiguous


@register_patch("dynamo", "torch._prims_common._is_non_overlapping_and_dense_or_false", requires={"torch": ">=2.14,<2.16"})
@register_patch("executorch", "torch._prims_common._is_non_overlapping_and_dense_or_false",
                requires={"torch": ">=2.14,<2.16"})  # and in the lowering's retraces
def _patch_density_probe_without_numel_guards(original):
    """The same numel test in the non-overlapping-and-dense probe (the layout of ``torch.cat``'s output and other
    fake-tensor metadata): ``guard_or_false(prod(sizes) < 2)`` on a slice one shorter than a dynamic input (Music
    Flamingo's ``torch.cumsum(post_lengths, 0)[:-1]`` of two audio windows) pinned the input (``s - 1 < 2``: the
    program accepts only two windows). Static-only here too; a size that may be 0 or 1 gets the stride check
    (pytorch/pytorch#185166; torch 2.14.1's function otherwise). Also in the ExecuTorch lowering, whose decomposition
    retrace probes ``_to_copy`` outputs again (repro: skiplists/repros/numel_probe_pins_slice_of_dynamic_dim.py)."""
    import torch._prims_common as prims_common
    from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

    def is_non_overlapping_and_dense_or_false(sizes, strides):
        if statically_known_true(math.prod(sizes) < 2):
            return True
        if len(sizes) == 1:
            return guard_or_false(strides[0] == 1)
        # the original's remaining lines: the dims sorted by stride must be contiguous (the patched probe above)
        ordered = sorted(map(prims_common.K, sizes, strides))
        return prims_common.check_contiguous_sizes_strides([k.size for k in ordered][::-1],
                                                           [k.stride for k in ordered][::-1], false_if_dde=True)

    return is_non_overlapping_and_dense_or_false


@register_patch("dynamo", "torch._prims_common.compute_elementwise_output_logical_to_physical_perm")
def _patch_elementwise_layout_without_size_guards(original):
    """Pattern: the layout sort of an elementwise op's output breaks stride ties (Blt's hash windows, ``unfold``)
    with ``guard_or_false(length >= g)``, which records a guard that pins the length.

    Rewrite: during the sort ``guard_or_false`` answers as the traced sample, without a guard: a choice of strides,
    never a value. Not in the ExecuTorch lowering, where the choice is the planned dim order, which must hold at
    every size. Upstream: pytorch/pytorch#149215 (a ``should_swap`` rewrite, not merged), pytorch/pytorch#165032."""
    import torch.fx.experimental.symbolic_shapes as symbolic_shapes

    def as_traced_or_false(condition) -> bool:
        if not isinstance(condition, torch.SymBool):
            return bool(condition)
        return bool(condition.node.hint) if condition.node.has_hint() else False

    def compute_elementwise_output_logical_to_physical_perm(*tensors, **kwargs):
        own = symbolic_shapes.guard_or_false  # imported inside the function at each call
        symbolic_shapes.guard_or_false = as_traced_or_false
        try:
            return original(*tensors, **kwargs)
        finally:
            symbolic_shapes.guard_or_false = own

    return compute_elementwise_output_logical_to_physical_perm


@register_patch("dynamo", "torch.nn.functional._verify_batch_size")
def _patch_norm_size_check_as_runtime_assert(original):
    """Pattern: ``F.group_norm`` (and ``F.batch_norm`` in training) refuse an input with one value per channel group
    with a Python ``if size_prods == 1: raise``. On sizes read from data (an image whose height and width come from a
    grid tensor: Apertus-1.5's vision tokenizer) that comparison is a data-dependent guard (``Eq(u4*u5, 1)``) and the
    export stops. The same check as ``torch._check``: decided while tracing where the sizes allow, else a runtime assert
    the program keeps (it raises where eager raises). No upstream issue found; TODO (torch): ``torch._check`` in
    ``_verify_batch_size``."""

    def _verify_batch_size(size):
        size_prods = size[0]
        for extent in list(size)[2:]:
            size_prods = size_prods * extent
        if not isinstance(size_prods, torch.SymInt):
            return original(size)
        torch._check(size_prods != 1,
                     lambda: f"Expected more than 1 value per channel when training, got input size {size}")
        return None

    return _verify_batch_size


def max_pool1d_as_2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """``F.max_pool1d`` computed by ``F.max_pool2d`` over a height of 1 (each argument ``(1, k)``, the height unpadded):
    the same windows, and flat indices that are the 1-D ones."""

    def pair(value, height=1):
        return (height, *(value if isinstance(value, (tuple, list)) else (value,)))

    pooled = torch.nn.functional.max_pool2d(
        input.unsqueeze(-2), pair(kernel_size), None if stride is None or stride == [] else pair(stride),
        pair(padding, 0), pair(dilation), ceil_mode=ceil_mode, return_indices=return_indices)
    if return_indices:
        return pooled[0].squeeze(-2), pooled[1].squeeze(-2)
    return pooled.squeeze(-2)


@register_patch("dynamo", "torch.nn.functional.max_pool1d")
def _patch_max_pool1d_as_max_pool2d(original):
    """Pattern: ``nn.MaxPool1d``/``F.max_pool1d`` over a symbolic length (Canine's attention-mask downsampling). The
    C++ ``max_pool1d`` computes its output size from concrete sizes, so the trace pins the length (``Eq(seq, 8)``).
    Rewrite: :func:`max_pool1d_as_2d`, whose meta keeps the length symbolic; static lengths go to the original.
    Upstream: repro ``skiplists/repros/max_pool1d_pins_length.py`` (torch); TODO: symbolic sizes in ``max_pool1d``."""

    def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        pool = max_pool1d_as_2d if isinstance(input.shape[-1], torch.SymInt) else original
        return pool(input, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode, return_indices=return_indices)

    return max_pool1d


@register_patch("dynamo", "torch.unique_consecutive")
def _patch_unique_consecutive_as_run_starts(original):
    """Pattern: ``torch.unique_consecutive(eos_mask.sum(1)).numel() == 1``, the one-count-per-row check of the
    sequence-classification heads (BART, T5 and their copies). ``aten.unique_consecutive`` is not Core ATen
    (ExecuTorch's verifier refuses it), and ``torch.export.load`` cannot rebind its size ("expected no unbacked symbols,
    got 1: {u0}").

    Rewrite: the values alone (no inverse, no counts, flattened) are ``flat[run_start]``, the first entry and each one
    unequal to the one before: a boolean selection every backend has, same order; NaNs each start a run, as in torch.
    Other calls go to the original. No upstream issue found; TODO: upstream issue for the serde rebinding."""

    def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
        if return_inverse or return_counts or dim is not None:
            return original(input, return_inverse=return_inverse, return_counts=return_counts, dim=dim)
        flat = input.flatten()
        # each entry against the one before (rolled, not sliced: slices of n - 1 would broadcast-guard n - 1 == 1)
        run_start = (flat != flat.roll(1)) | (torch.arange(flat.shape[0], device=flat.device) == 0)
        return flat[run_start]

    return unique_consecutive


@register_patch("dynamo", "torch.distributions.distribution.Distribution._validate_args")
def _patch_distribution_checks_off(original):
    """Pattern: a ``torch.distributions`` object built in a forward (Blt's entropy, PI0's Beta): ``__init__``
    validates with ``if not torch._is_all_true(valid): raise``, a Python branch on tensor values export cannot trace
    (pytorch/pytorch#135061). Off while exporting, as ``torch.compile`` sets it process-wide and as transformers
    proposed (huggingface/transformers#43631): valid parameters give the same numbers; ``validate_args=True`` still
    checks."""
    return False


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.ShapeEnv._set_replacement",
                requires={"torch": ">=2.14,<2.16"})
@register_patch("pt2", "torch.fx.experimental.symbolic_shapes.ShapeEnv._set_replacement",
                requires={"torch": ">=2.14,<2.16"})
def _patch_replacement_skipped_where_bounds_overflow(original):
    """Pattern: ``torch._check(mask_count == features.numel())`` (a multimodal placeholder check) equates a data-dependent
    count, ranged up to ``sys.maxsize - 1``, with a product of input sizes; near ``2**63`` torch's recomputed bounds
    differ by rounding and its own assertion fails: ``tgt_bound=VR[64, 9223372036854775808] not a subset of
    src_bound=VR[64, 9223372036854775806]``.

    Rewrite: where that assertion fires the replacement is skipped; the equality stays a deferred runtime assert and the
    refined ranges are kept. Also installed for loading ("pt2"), which replays the assert. TODO(upstream): no torch
    issue found (torch/fx/experimental/symbolic_shapes.py ``_set_replacement``, 2.14.1)."""

    def set_replacement(self, a, tgt, msg):
        try:
            return original(self, a, tgt, msg)
        except AssertionError as e:
            if "not a subset of src_bound" not in str(e):
                raise
            return None

    return set_replacement


@register_patch("dynamo", "torch.fx.experimental.symbolic_shapes.DimConstraints.solve",
                requires={"torch": ">=2.14,<2.16"})
def _patch_constraint_solver_past_floor_division_equalities(original):
    """Pattern: a size that must divide evenly through two floor divisions (a pooled-then-upsampled map concatenated with
    its source: EfficientLoFTR). The guard stays, but ``DimConstraints.solve`` (the "suggested fixes") hands it to
    sympy's ``reduce_inequalities``, which raises ``NotImplementedError: The inequality, Eq(-x/8 + 4*((x/8)//4), 0),
    cannot be solved using solve_univariate_inequality``.

    Rewrite: symbols whose equalities sympy cannot reduce are left out of that solve (upstream's proposal); the guard
    still refuses bad sizes at run time. Upstream: https://github.com/pytorch/pytorch/issues/131897 (closed for the
    ``TruncToInt`` form; the ``FloorDiv`` form still raises at torch 2.14.1)."""
    import sympy

    def solve(self):
        for symbol in list(self._symbols_with_equalities):
            try:
                sympy.solvers.inequalities.reduce_inequalities(self._univariate_inequalities[symbol], symbol)
            except NotImplementedError:
                self._symbols_with_equalities.discard(symbol)
        return original(self)

    return solve


@register_patch("dynamo", "torch.take_along_dim")
def _patch_take_along_dim_as_gather(original):
    """Pattern: ``torch.take_along_dim(values, indices, dim=1)`` (PP-DocLayoutV2 sorts its detections by score
    with it). Its C++ kernel pins every size of its arguments to the traced value (``Eq(batch, 2)``; a two-line
    export of ``take_along_dim(x, x.argsort(1), 1)`` keeps no dynamic dim), so the program accepts only the traced
    batch. ``take_along_dim`` is a ``gather`` of both arguments broadcast to one shape except along ``dim``, where
    ``values`` keeps its size; written so with symbolic sizes. ``dim=None`` (the flattened form) and ``out=`` go to
    torch. TODO(upstream): no torch issue found (aten/src/ATen/native/TensorAdvancedIndexing.cpp
    ``take_along_dim``, torch 2.14.1)."""

    def take_along_dim(input, indices, dim=None, *, out=None):
        if dim is None or out is not None or input.dim() != indices.dim():
            return original(input, indices, dim, out=out) if out is not None else original(input, indices, dim)
        dim = dim % input.dim()
        wanted = list(input.shape)
        wanted[dim] = indices.shape[dim]
        shape = list(torch.broadcast_shapes(tuple(wanted), tuple(indices.shape)))
        indices = indices if list(indices.shape) == shape else indices.expand(shape)
        shape[dim] = input.shape[dim]
        return (input if list(input.shape) == shape else input.expand(shape)).gather(dim, indices)

    return take_along_dim


@register_patch("dynamo", "torch.SymInt.__mod__")
def _patch_size_modulo_a_unit_fraction(original):
    """Pattern: ``if height % scale_factor != 0`` with ``scale_factor=0.5`` (InternVL's and Qianfan-OCR's
    ``pixel_shuffle``). torch bounds ``Mod(ToFloat(h), 0.5)`` with its integer rule (``ValueRangeError: Invalid ranges
    [0.5:-0.5]``) and its sympy ``Mod`` asserts integer arguments, so the export fails. An integer modulo ``1/k`` (``k``
    a power of two, so ``1/k`` is exact) is 0 for every integer (:func:`divides_every_integer`): the remainder is
    returned as ``0.0``. Other divisors go to torch. TODO(upstream): no torch issue found
    (torch/utils/_sympy/value_ranges.py ``mod``, torch/utils/_sympy/functions.py ``Mod.eval``, 2.14.1)."""

    def __mod__(self, other):
        return 0.0 if divides_every_integer(other) else original(self, other)

    return __mod__


def divides_every_integer(divisor) -> bool:
    """Whether ``divisor`` is a float ``1/k`` with ``k`` a power of two (exact in binary floating point), so that
    ``n % divisor == 0.0`` for every integer ``n`` (``1/3`` is not exact: ``1 % (1/3)`` is ``0.333...``)."""
    if not isinstance(divisor, float) or not 2.0**-52 <= divisor <= 1:  # 1/divisor finite and an exact integer
        return False
    k = round(1 / divisor)
    return k & (k - 1) == 0 and 1 / k == divisor


# ── Speed: torch.export internals ───────────────────────────────────────────────────────────────────────────
# Called by every retrace of the program while ExecuTorch lowers it.


@register_patch("executorch", "torch.export.exported_program._convert_guards_to_code", requires={"torch": ">=2.11,<2.16"})
def _patch_guards_printed_once_per_shape_env(original):
    """Pattern: every ``ExportedProgram`` constructor prints all the guards of its shape env as Python source
    (``_convert_guards_to_code``); lowering builds one after most passes and per delegated partition, over one shape env
    whose guard list only grows, so the same guards are printed again and again.

    Rewrite: each guard's text is kept on the shape env and only new guards are printed. The text depends on the guard's
    expression and its symbols' first sources, which never change, and the original's two filters run every time, so the
    list is the original's (same ``.pte`` bytes). TODO(upstream): no torch issue found; the constructor could print
    lazily, as few callers read ``_guards_code``."""
    from torch._dynamo.source import ConstantSource
    from torch.export.exported_program import _get_shape_env
    from torch.fx.experimental.symbolic_shapes import ShapeGuardPythonPrinter

    def convert_guards_to_code(graph_module):
        shape_env = _get_shape_env(graph_module)
        if shape_env is None:
            return []
        local_vars = {var for var, sources in shape_env.var_to_sources.items()
                      if all(not isinstance(source, ConstantSource) for source in sources)}
        printed = shape_env.__dict__.setdefault("_export_sweep_guard_code", {})  # id(guard) -> (guard, text)
        printer = None
        code = []
        for guard in shape_env.guards:
            if not guard.expr.free_symbols.issubset(local_vars):
                continue
            known = printed.get(id(guard))
            if known is None or known[0] is not guard:
                if printer is None:
                    printer = ShapeGuardPythonPrinter(shape_env.var_to_sources, lambda s: s.name,
                                                      shape_env.var_to_sources)
                known = printed[id(guard)] = (guard, printer.doprint(guard.expr))
            code.append(known[1])
        return [text for text in code if "L['self']" not in text]

    return convert_guards_to_code
