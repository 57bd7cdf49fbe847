"""Patches and FX node fixes of the ExecuTorch exporter (stages 2, 3 and 5 of :mod:`engine.exporter_executorch`).

Each one exists because a test model (``tests/engine/tiny_models.py``) needs it; its docstring names the
pattern and the upstream issue. Imported by ``ExecutorchExporter.export``.
"""

from __future__ import annotations

import math
import operator
import types

import numpy as np
import torch
from torch.fx.experimental.symbolic_shapes import free_symbols
from torch.utils._sympy.printers import PythonPrinter

from engine.patches import register_fx_node_fix, register_patch  # noqa: F401

#: the ExecuTorch releases whose internals these patches were read against: 1.4.1 (the pins) and 1.5.1, whose
#: patched functions and the helpers they call are unchanged (diffed when following upstream, reports/drift/)
_EXECUTORCH = {"executorch": ">=1.4,<1.6"}

# ── Stage 2: Torch patches ────────────────────────────────────────────────────────────────────────
# Ops the ExecuTorch/XNNPACK path cannot take, swapped during torch.export.


@register_patch("executorch", "torch.nn.functional.scaled_dot_product_attention")
def _patch_sdpa_output_layout(original):
    """Pattern: a ``view`` of the SDPA output (``attn.transpose(1, 2).reshape(b, s, -1)``, then ``x.view(-1, d)``).

    ``torch.export`` records those reshapes as bare views because the SDPA meta kernel reports a contiguous
    ``(N, H, L, E)`` output. ExecuTorch's lowering re-decomposes SDPA on CPU through
    ``_scaled_dot_product_flash_attention_for_cpu``, which returns an ``(L, N, H, E)``-strided buffer, and the
    recorded view fails: ``Cannot view a tensor with shape [s0, s1, 32] and strides (32, 32*s0, 1)`` (GPT-2's
    ``Conv1D``). An explicit contiguous ``clone`` of the output is recorded whatever the trace-time layout, and
    makes every later view valid under either decomposition.
    Upstream: https://github.com/pytorch/pytorch/issues/136543 (same error from the SDPA decomposition).
    """

    def scaled_dot_product_attention(*args, **kwargs):
        return original(*args, **kwargs).clone(memory_format=torch.contiguous_format)

    return scaled_dot_product_attention


def _triple(value) -> tuple[int, int, int]:
    return tuple(value) * (3 // len(value)) if isinstance(value, (tuple, list)) else (value,) * 3


@register_patch("executorch", "torch.nn.functional.conv3d")
def _patch_conv3d_as_conv2d_over_time(original):
    """Pattern: a 3-D convolution whose temporal kernel equals its temporal stride, with no temporal padding or
    dilation: the tubelet/patch embedding of video models (VideoMAE, ViViT, V-JEPA 2, VideoPrism).

    ExecuTorch has no 5-D convolution: XNNPACK does not take it, and the portable kernel's argument check
    (``check_convolution_args``: "Expect input tensor to be 3-D or 4-D") fails the loaded method at run time with
    error 0x12. Time windows that do not overlap are independent 2-D convolutions, so the input's time axis is
    folded into the batch (``[N, C, T, H, W]`` -> ``[N * T/kt, C * kt, H, W]``) and the weight's temporal taps into
    its input channels; the ``conv2d`` is delegated to XNNPACK. Any other 3-D convolution (overlapping or padded
    in time, string padding) goes to the original. Upstream: no issue found for 5-D convolution in ExecuTorch's
    portable kernels (TODO: ask for ``conv3d`` there or in XNNPACK's partitioner).
    """

    def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if isinstance(padding, str) or input.dim() != 5:
            return original(input, weight, bias, stride, padding, dilation, groups)
        (st, sh, sw), (pt, ph, pw), (dt, dh, dw) = _triple(stride), _triple(padding), _triple(dilation)
        kt = weight.shape[2]
        if st != kt or pt != 0 or (dt != 1 and kt != 1):
            return original(input, weight, bias, stride, padding, dilation, groups)
        n, c, t, h, w = input.shape
        windows = t // kt
        x = input.narrow(2, 0, windows * kt).reshape(n, c, windows, kt, h, w)
        x = x.permute(0, 2, 1, 3, 4, 5).reshape(n * windows, c * kt, h, w)
        y = torch.nn.functional.conv2d(x, weight.flatten(1, 2), bias, (sh, sw), (ph, pw), (dh, dw), groups)
        return y.reshape(n, windows, *y.shape[1:]).permute(0, 2, 1, 3, 4)

    return conv3d


# ── Stage 3: ExecuTorch patches ───────────────────────────────────────────────────────────────────
# ExecuTorch internals that crash on legitimate dynamic-shape patterns, swapped during lowering.

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
    requires=_EXECUTORCH,
)
def _patch_loose_upper_bound_of_floordiv_ratios(original):
    """Pattern: sizes that divide a dynamic length by a function of itself (chunked scans, windows):
    ``n_chunks = padded // chunk`` then ``padded // n_chunks`` (always ``chunk``).

    ``eval_upper_bound`` bounds a size by interval arithmetic, which evaluates ``x // (x // 4)`` as
    ``upper(x) // lower(x // 4)``: Mamba2's chunked scan, traced with ``chunk_size=4`` and a length capped at
    256, plans ``[2, 64, 8, 259, 259]`` buffers for ``[2, 64, 8, 4, 4]`` tensors, a 1.1 GB arena that the runtime
    then fails to load. Evaluate such expressions exactly at every point of their symbols' ranges when those
    are small (at most 65536 points; else the interval bound stands); the result is never above the interval
    bound and is exact.
    Upstream: TODO: upstream issue not found (executorch/exir/sym_util.py, eval_upper_bound).
    """

    def eval_upper_bound(maybe_symint):
        bound = original(maybe_symint)
        if isinstance(maybe_symint, int):
            return bound
        node = maybe_symint.node
        exact = _exact_max(node.expr, node.shape_env.var_to_range)
        return bound if exact is None else min(bound, exact)

    return eval_upper_bound



@register_patch(
    "executorch",
    "executorch.exir.verification.arg_validator.EdgeOpArgValidator.call_function",
    requires=_EXECUTORCH,
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


def _dynamic_dims(val) -> int:
    return sum(1 for d in val.shape if free_symbols(d)) if isinstance(val, torch.Tensor) else 0


def _rejecting(original, refused):
    """A partitioner config's ``check_constraints`` that also refuses the nodes ``refused(node)`` names: the ones
    XNNPACK's serializer would fail on, so they stay on the portable kernels."""

    def check_constraints(self, node, ep):
        return False if refused(node) else original(self, node, ep)

    return check_constraints


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.generic_node_configs.UnsqueezeCopyConfig.check_constraints",
    requires=_EXECUTORCH,
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
    "executorch.backends.xnnpack.partition.config.generic_node_configs.GeluConfig.check_constraints",
    requires=_EXECUTORCH,
)
def _patch_tanh_gelu_delegated_as_exact_gelu(original):
    """Pattern: ``gelu(x, approximate="tanh")`` (``gelu_pytorch_tanh``/``gelu_new`` in SigLIP, the Gemma family,
    GPT-2-style MLPs).

    XNNPACK's partitioner takes every ``aten.gelu`` and its serializer writes an exact (erf) ``XNNGelu`` whatever
    ``approximate`` says, so the delegated program computes another function: up to 4.7e-4 away from the tanh
    form (at x = -2.7), which grows over a vision tower past the sweep's 1e-4 (SigLIP's last_hidden_state
    4.7e-4; eager and ExecuTorch's portable kernels are within 3e-6 of float64). Keep tanh GELU out of the
    partition: ExecuTorch's portable ``gelu`` kernel implements the tanh form.
    Upstream: https://github.com/pytorch/executorch/pull/22851 (routes tanh GELU to XNNPACK's approxgelu; merged
    after 1.5.1).
    """

    return _rejecting(original, lambda node: node.kwargs.get("approximate", "none") == "tanh"
                      or (len(node.args) > 1 and node.args[1] == "tanh"))


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.gemm_configs.ConvolutionConfig.check_constraints",
    "executorch.backends.xnnpack.partition.config.node_configs.BatchNormConfig.check_constraints",
    requires=_EXECUTORCH,
)
def _patch_conv1d_with_several_dynamic_dims(original):
    """Pattern: a node XNNPACK runs as a 1-D convolution over ``[batch, channels, length]`` with two or more of
    those dims dynamic: a ``conv1d`` (Mamba's causal convolution, audio front-ends) or a ``BatchNorm1d``, which
    XNNPACK rewrites into a depthwise conv1d (``DecomposeBatchNorm``; the convolution module of Conformer-style
    speech encoders: LASR, Canary, Cohere ASR, Granite Speech).

    XNNPACK runs a conv1d as ``unsqueeze(-1) -> conv2d -> squeeze(-1)`` (``Conv1dUnsqueezePass``, inside the
    delegate), and that unsqueeze/squeeze pair is a static reshape limited to one dynamic dim, so lowering
    raises ``XNNPACK reshape only supports 1 dynamic dimension``. Keep such nodes out of the XNNPACK partition;
    the portable kernels run them.
    Upstream: the one-dynamic-dim limit is stated in https://github.com/pytorch/executorch/pull/2976; no issue
    found for the partitioner admitting such nodes (TODO).
    """

    def runs_as_conv1d_with_several_dynamic_dims(node):
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        return isinstance(val, torch.Tensor) and val.ndim == 3 and _dynamic_dims(val) > 1

    return _rejecting(original, runs_as_conv1d_with_several_dynamic_dims)


@register_patch(
    "executorch",
    "executorch.backends.xnnpack.partition.config.node_configs.MaxDimConfig.check_constraints",
    requires=_EXECUTORCH,
)
def _patch_max_dim_outside_the_serializers_dims(original):
    """Pattern: ``x.max(dim=-1, keepdim=True).values`` on a 4-D tensor (GPT-OSS's attention sinks, MiMo-V2, HY-V4,
    OpenAI privacy filter) or ``x.max(dim=d)`` without ``keepdim`` (Hiera).

    XNNPACK's partitioner takes any ``max.dim`` of a 4-D input whose indices go unused, but its serializer
    (``op_max_dim.py``) emits a 2-D pooling that needs ``keepdim=True`` and ``dim`` spelled 2 or 3, and raises
    ``amax.default only supports dim == 2 or dim == 3`` (or ``... keep_dim == True``) at lowering: ``-1`` is
    refused although it is dim 3. Reject the nodes the serializer would refuse, with the serializer's own spelling
    check, so they stay on the portable kernel. Upstream: the same spelling mismatch was fixed for ``mean.dim`` in
    https://github.com/pytorch/executorch/pull/19206; no issue found for ``max.dim`` (TODO).
    """

    def refused(node):
        keepdim = len(node.args) > 2 and node.args[2] is True
        return not keepdim or node.args[1] not in (2, 3)

    return _rejecting(original, refused)


@register_patch("executorch", "executorch.exir.verification.verifier._EXECUTORCH_SYM_OPS", requires=_EXECUTORCH)
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


class _NoRun(torch.fx.Interpreter):
    """An interpreter that runs no op: below the edge dtype validator, it leaves only its bookkeeping."""

    def call_function(self, target, args, kwargs):
        return None


@register_patch(
    "executorch",
    "executorch.exir.verification.verifier._check_tensor_args_matching_op_allowed_dtype",
    requires=_EXECUTORCH,
)
def _patch_edge_dtype_check_from_meta(original):
    """Pattern: the edge verifier's dtype check (``_check_tensor_args_matching_op_allowed_dtype``) runs on every
    verification of an edge program, 34 times while lowering a tiny Llama, and each time re-executes the whole
    graph on fake tensors (an ``fx.Interpreter``) only to learn the dtypes of each edge op's tensor arguments.
    Every node already records its value in ``node.meta["val"]`` (the validator itself reads the outputs from
    there): 1.2 of 10.7 s of a Llama export, 3.7 of 28 s of a T5.

    This hands ExecuTorch's own validator (``EdgeOpArgValidator``, same dtype rules) each node's arguments as
    their recorded values instead of running the ops. A graph with a delegate call passes unchecked, as it does
    unpatched (the interpreter stops at the first higher-order op and the check returns); a node whose arguments
    lack a recorded value, or any violation found, goes to the original check, so its verdict and its error
    message are ExecuTorch's. Not an upstream bug: a cost of the verifier's design
    (executorch/exir/verification/verifier.py), worth an upstream proposal.
    """
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator
    from torch._ops import HigherOrderOperator

    class RecordedArgValidator(EdgeOpArgValidator, _NoRun):
        pass

    def check(gm: torch.fx.GraphModule) -> None:
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        if any(isinstance(n.target, HigherOrderOperator) for n in calls):
            return None
        missing = object()

        def recorded(node: torch.fx.Node):
            if node.op == "get_attr":
                return getattr(gm, node.target, missing) if "." not in node.target else missing
            return node.meta.get("val", missing)

        validator = RecordedArgValidator(gm)
        for node in calls:
            args, kwargs = torch.fx.map_arg((node.args, node.kwargs), recorded)
            if "val" not in node.meta or any(a is missing for a in torch.utils._pytree.tree_leaves((args, kwargs))):
                return original(gm)
            validator.node = node
            validator.call_function(node.target, args, kwargs)
        if validator.violating_ops:
            return original(gm)
        return None

    return check


def _operator_pass_classes() -> dict[type, bool]:
    """The edge passes that rewrite one operator call at a time (they override ``call_operator`` only; ScalarToTensor's
    ``call`` just resets a flag), mapped to whether they re-enter ``self.call_operator`` for an op they add.
    Read from their sources in ExecuTorch 1.4 (executorch/exir/passes/; the same in 1.5)."""
    from executorch.exir.passes import (NormalizeTransposePass, ReplaceBrokenOpsWithFunctionalOpsPass, ScalarToTensorPass,
                                        SymToTensorPass)
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_aten_with_edge_pass import OpReplacePass

    return {NormalizeTransposePass: False, ReplaceBrokenOpsWithFunctionalOpsPass: False, ScalarToTensorPass: False,
            SymToTensorPass: True, RemoveMixedTypeOperators: True, OpReplacePass: False, MemoryFormatOpsPass: False}


def fuse_operator_passes(passes: list, operator_passes: dict[type, bool]) -> list:
    """Consecutive operator passes become one pass whose ``call_operator`` runs theirs in order (each one's
    ``super().call_operator`` is the next one's), so the graph is retraced once for the group instead of once per
    pass. A pass that re-enters ``self.call_operator`` (for an op it adds) starts a group: the ops it adds then
    go through itself and the later passes, as they would when each pass retraced the graph on its own.
    A pass left alone keeps its place and its wrapping."""
    from executorch.exir.pass_base import ExportPass

    groups: list[list[tuple]] = []  # runs of (the pass as given, the pass itself)
    for given in passes:
        p = getattr(given, "__wrapped__", given)  # a pass manager's PassResult wrapper (the pass returns one)
        joins = operator_passes.get(type(p)) is False  # an operator pass that does not re-enter
        if joins and groups and all(type(q) in operator_passes for _, q in groups[-1]):
            groups[-1].append((given, p))
        else:
            groups.append([(given, p)])
    return [group[0][0] if len(group) == 1 else
            type("+".join(type(p).__name__ for _, p in group), (*(type(p) for _, p in group), ExportPass), {})()
            for group in groups]


@register_patch("executorch", "executorch.exir.program._program._generate_edge_program", requires=_EXECUTORCH)
def _patch_fused_edge_passes(original):
    """Pattern: ``to_edge`` turns the ATen program into the edge dialect with 13 passes, and 9 of them are
    ``ExportPass``es that retrace the whole graph on fake tensors with symbolic shapes, 0.25 to 0.45 s each for a
    tiny Llama. Seven of those only rewrite one operator call at a time (:func:`_operator_pass_classes`).

    This is ExecuTorch 1.4's (and 1.5's, identical) ``_generate_edge_program`` (executorch/exir/program/_program.py) with its pass list
    put through :func:`fuse_operator_passes`: NormalizeTranspose, ReplaceBrokenOps and ScalarToTensor retrace once
    together, and RemoveMixedTypeOperators, OpReplace and MemoryFormatOps once together: four retraces fewer. The
    ``.pte`` bytes are unchanged (``bench/bench_executorch.py --check-identical _patch_fused_edge_passes``).
    Not an upstream bug: a cost of the pass design, worth an upstream proposal.
    """
    from executorch.exir.program import _program as steps

    operator_passes = _operator_pass_classes()

    def generate_edge_program(config, program, core_aten_ops_exception_list=None, preserve_ops=None):
        program = steps.remove_unused_parameters_pass(program)
        pre_op_replace_passes, post_op_replace_passes = steps._get_aten_to_edge_passes(config)
        passes = [steps.RemoveNonCoreAtenOpGraphAssertsPass(), steps.ReplaceViewOpsWithViewCopyOpsPass(),
                  *pre_op_replace_passes, steps.OpReplacePass()]
        if not config._skip_dim_order:
            passes.append(steps.MemoryFormatOpsPass())
        gm = program.graph_module
        for p in fuse_operator_passes(passes, operator_passes):
            result = p(gm)
            assert result is not None
            gm = result.graph_module
        edge_program = steps.ExportedProgram(
            root=gm,
            graph=gm.graph,
            graph_signature=steps._get_updated_graph_signature(program.graph_signature, gm),
            state_dict=program.state_dict,
            range_constraints=program.range_constraints,
            module_call_graph=program.module_call_graph,
            example_inputs=program.example_inputs,
            constants=program.constants,
            verifiers=[steps.EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True,
                                                      core_aten_ops_exception_list=core_aten_ops_exception_list,
                                                      preserve_ops=preserve_ops)],
        )
        edge_program = steps.lift_constant_tensor_pass(edge_program)
        edge_program = steps.convert_constant_dim_order_pass.convert_constant_dim_order_pass(edge_program)
        return steps._transform(edge_program, *post_op_replace_passes)

    return generate_edge_program


#: ExportPass hooks through which a pass rewrites nodes *during* its retrace (such a pass always retraces)
_RETRACE_HOOKS = ("placeholder", "call_operator", "call_sym", "call_cond", "call_while", "call_map", "call_scan",
                  "call_getitem", "output", "call_submodule", "call_delegate")


def _rewrites_before_retracing(pass_class, export_pass_class) -> bool:
    """An ExportPass whose own ``call`` edits the graph and then retraces it (``super().call(gm)``) only to
    refresh the nodes' metadata: it overrides ``call`` and none of the hooks that rewrite during the retrace."""
    return (issubclass(pass_class, export_pass_class) and pass_class.call is not export_pass_class.call
            and all(getattr(pass_class, h, None) is getattr(export_pass_class, h, None) for h in _RETRACE_HOOKS))


def _graph_structure(graph_module: torch.fx.GraphModule) -> list:
    """Every node with its op, target and arguments (the objects themselves: an edit replaces one of them)."""
    return [(n, n.op, n.target, n.args, n.kwargs) for n in graph_module.graph.nodes]


@register_patch("executorch", "executorch.backends.xnnpack._passes.XNNPACKPassManager.transform", requires=_EXECUTORCH)
def _patch_xnnpack_idle_retraces(original):
    """Pattern: XNNPACK's preprocess runs its 17 graph passes on every delegated partition, and nearly every pass
    ends with ``super().call(graph_module)``: a full retrace of the partition on fake tensors with symbolic
    shapes, then a new ExportedProgram and its verification, whether or not the pass found anything to rewrite
    (``ConvertToUpsampleBilinear2d`` on a model without upsampling). A tiny Llama has 25 partitions, so 375
    retraces, 3.6 of the 11.8 CPU seconds of its whole export, and 15 of the 17 passes change nothing.

    This runs the same passes in the same order, and skips the retrace of a pass that edits the graph before
    retracing (:func:`_rewrites_before_retracing`) when its edits left every node as it was, reporting the
    pass as not modifying the program. Passes that rewrite during the retrace always run it. The ``.pte``
    bytes are unchanged (``bench/bench_executorch.py --check-identical``). Not an upstream bug: a cost of the
    pass design (executorch/backends/xnnpack/_passes/__init__.py), worth an upstream proposal.
    """
    from executorch.backends.xnnpack._passes import XNNPACKPass
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.program._program import _transform
    from torch.fx.passes.infra.pass_base import PassResult

    from engine.patches import swap_attributes

    retrace = ExportPass.call
    unchanged_since: dict[int, list] = {}  # id(graph module) -> its structure when the running pass started

    def call(export_pass, graph_module):
        start = unchanged_since.get(id(graph_module))
        if start is not None and _graph_structure(graph_module) == start:
            return PassResult(graph_module, False)
        return retrace(export_pass, graph_module)

    class SkipIdleRetrace:
        def __init__(self, inner):
            self.inner = inner

        def __call__(self, graph_module):
            start = _graph_structure(graph_module)
            unchanged_since[id(graph_module)] = start
            try:
                result = self.inner(graph_module)
            finally:
                unchanged_since.pop(id(graph_module), None)
            if result is not None and result.graph_module is graph_module and _graph_structure(graph_module) == start:
                return PassResult(graph_module, False)
            return result

    def transform(self):
        if not all(isinstance(p, type) and issubclass(p, ExportPass) for p in self.passes):
            return original(self)
        program = self.exported_program
        skippable = [_rewrites_before_retracing(p, ExportPass) for p in self.passes]
        with swap_attributes([(ExportPass, "call", call)]):
            for pass_class, skip_if_idle in zip(self.passes, skippable):
                instance = pass_class(program) if issubclass(pass_class, XNNPACKPass) else pass_class()
                program = _transform(program, SkipIdleRetrace(instance) if skip_if_idle else instance)
        return program

    return transform


@register_patch("executorch", "executorch.exir.lowered_backend_module.legalize_graph", requires=_EXECUTORCH)
def _patch_partition_legalize_without_child_recompiles(original):
    """Pattern: ``create_submodule_from_nodes`` fuses each delegated partition into a ``call_module`` node, then
    re-sorts the whole program with ``legalize_graph(gm)``, which assigns ``gm.graph`` and so recompiles ``gm``
    and every GraphModule child of it: the partitions fused before, none of which the sort touches. With P
    partitions that is P * (P - 1) / 2 child recompiles; a tiny HrmText has 218 partitions, and lowering it
    spent about 25 of its 122 s there. The sort and the parent's recompile run as before; only the children's
    recompile is skipped, as their graphs and code are unchanged (the ``.pte`` bytes are the same:
    ``bench/bench_executorch.py --check-identical``).
    TODO(upstream): no executorch issue found; the partitions could be fused first and the program sorted once.
    """

    def legalize_graph(gm):
        gm._recompile_submodules = list  # an instance attribute: recompile() calls it instead of the method
        try:
            return original(gm)
        finally:
            del gm._recompile_submodules

    return legalize_graph


@register_patch("executorch", "executorch.exir.program._program.edge_to_executorch_passes", requires=_EXECUTORCH)
def _patch_spec_prop_reuses_the_dim_order_retrace(original):
    """Pattern: ``to_executorch`` runs ``LegalizePortableDimOrderPass``, an ``ExportPass`` that retraces the whole
    program on fake tensors (inserting a dim-order copy where a portable kernel needs one), and right after it
    ``SpecPropPass``, whose first step is a plain ``ExportPass()`` retrace "to ensure [metadata] is up to date"
    before it attaches the tensor specs. The metadata the first retrace just produced is what the second one
    recomputes. When the two passes are adjacent in the list (ExecuTorch 1.4's and 1.5's ``edge_to_executorch_passes``), they
    become one ``SpecPropPass`` whose metadata retrace *is* the dim-order pass: one whole-program retrace fewer
    per export: ``to_executorch`` 1.26 -> 0.92 CPU s for a tiny Llama, 0.79 -> 0.52 s for a tiny ViT (exports of
    5 to 9 s; ``bench/bench_executorch.py --check-identical _patch_spec_prop_reuses_the_dim_order_retrace --timed
    executorch.exir.program._program.EdgeProgramManager.to_executorch``, on a loaded machine). The ``.pte`` bytes
    are unchanged on the 12 test architectures.
    Not an upstream bug: a cost of the pass design, worth an upstream proposal.
    """
    from executorch.exir.passes import spec_prop_pass
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    from engine.patches import swap_attributes

    class LegalizeDimOrderThenSpecProp(spec_prop_pass.SpecPropPass):
        def __call__(self, graph_module):
            with swap_attributes([(spec_prop_pass, "ExportPass", LegalizePortableDimOrderPass)]):
                return super().__call__(graph_module)

    def edge_to_executorch_passes(*args, **kwargs):
        passes = original(*args, **kwargs)
        for i, (first, second) in enumerate(zip(passes, passes[1:])):
            if type(first) is LegalizePortableDimOrderPass and type(second) is spec_prop_pass.SpecPropPass:
                return [*passes[:i], LegalizeDimOrderThenSpecProp(), *passes[i + 2:]]
        return passes

    return edge_to_executorch_passes


@register_patch("executorch", "torch.export.exported_program._convert_guards_to_code", requires={"torch": ">=2.11,<2.15"})
def _patch_guards_printed_once_per_shape_env(original):
    """Pattern: every ``ExportedProgram`` constructor prints all the guards of its shape env as Python source
    (``_convert_guards_to_code``, a sympy printer per guard). Lowering builds a new ExportedProgram after most
    passes and for every delegated partition, all over one shape env whose guard list only grows, so the same
    guards are printed again and again: a tiny Mamba2 (many guards from its chunk padding) built 117 programs and
    spent 19 of its 158 profiled CPU s printing.

    This keeps each guard's text on the shape env and prints only new guards. A guard's text depends on its
    expression and on the first source of each of its symbols, neither of which changes, and the original's two
    filters (symbols that all have non-constant sources; no guard on ``L['self']``) run every time, so the list is
    the one the original returns (``.pte`` bytes unchanged: ``bench/bench_executorch.py --check-identical``).
    TODO(upstream): no torch issue found; the constructor could print lazily, as few callers read ``_guards_code``.
    """
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


# ── Stage 5: FX node fixes ────────────────────────────────────────────────────────────────────────

#: uninitialised allocations and their zero-filled twins (same arguments, no ``memory_format``)
_ZEROED = {
    torch.ops.aten.new_empty.default: torch.ops.aten.new_zeros.default,
    torch.ops.aten.empty.memory_format: torch.ops.aten.zeros.default,
    torch.ops.aten.empty_like.default: torch.ops.aten.zeros_like.default,
}


@register_fx_node_fix("executorch")
def _fix_symbolic_empty_as_zeros(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make an uninitialised allocation of a symbolic size (``x.new_empty(b, h, s, d)``, ``torch.empty_like(x)``) a
    zero-filled one.

    Pattern: DeepSeek-V3's multi-head latent attention (and MiniCPM3, Mistral 4, Kimi Linear, GLM-MoE-DSA...)
    builds its keys with ``kv_nope.new_empty(...)`` and fills the two halves in place. ExecuTorch's edge passes
    turn ``aten.empty.memory_format`` into ``dim_order_ops._empty_dim_order``, whose schema takes ``int[] size``,
    not ``SymInt[]``: calling it on symbolic sizes makes each one a Python int, so the frozen shape environment
    pins batch and sequence to their traced values and the ``.pte`` accepts only the traced sequence length (and
    batches up to the traced one). ``zeros`` takes ``SymInt[]`` and lowers to ``full``; an ``empty`` tensor's
    contents are undefined, so zeros are one of its values. Only symbolic sizes are touched: a static ``empty``
    keeps its (free) uninitialised allocation. Upstream: no issue found for ``_empty_dim_order``'s ``int[]`` schema
    (executorch/exir/passes/dim_order_ops_registry.py) (TODO).
    """
    zeroed = _ZEROED.get(node.target) if node.op == "call_function" else None
    val = node.meta.get("val")
    if zeroed is None or not isinstance(val, torch.Tensor) or not any(free_symbols(d) for d in val.shape):
        return False
    if node.kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        return False
    kwargs = {k: v for k, v in node.kwargs.items() if k != "memory_format"}
    return _replace_node(gm, node, zeroed, node.args, kwargs)


def _replace_node(gm: torch.fx.GraphModule, node: torch.fx.Node, target, args, kwargs) -> bool:
    """Put a call of ``target`` where ``node`` is (same outputs, so same ``meta``) and drop ``node``."""
    with gm.graph.inserting_before(node):
        replacement = gm.graph.call_function(target, tuple(args), kwargs)
    replacement.meta.update(node.meta)
    node.replace_all_uses_with(replacement)
    gm.graph.erase_node(node)
    return True


_SORTS = (torch.ops.aten.sort.default, torch.ops.aten.sort.stable)
_ARGSORTS = (torch.ops.aten.argsort.default, torch.ops.aten.argsort.stable)


@register_fx_node_fix("executorch")
def _fix_sort_as_topk(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Make ``torch.sort(x, dim, descending)`` (and ``torch.argsort``) a ``torch.topk(x, x.shape[dim], dim,
    largest=descending)``.

    Pattern: JetMoE sorts its routed expert ids to group tokens by expert; SAM-HQ sorts point scores. The
    ExecuTorch runtime's portable kernels have no ``sort`` (``kernel 'aten::sort.values' not found``: the method
    fails to load with 0x14), but have ``topk``, which with ``k`` the whole dim and ``sorted=True`` returns the same
    values and indices (for tied values an unstable sort may order the indices either way, as ``sort`` itself
    may). A stable sort (``stable=True``) keeps its ``sort``: ``topk`` does not promise the order of ties.
    Upstream: no issue found for a portable ``sort`` kernel in ExecuTorch (TODO).
    """
    if node.op != "call_function" or node.target not in (*_SORTS, *_ARGSORTS) or node.kwargs.get("stable"):
        return False
    source = node.args[0]
    src_val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(src_val, torch.Tensor) or src_val.dim() == 0:
        return False
    # sort/argsort.default(self, dim=-1, descending=False); .stable(self, *, stable, dim=-1, descending=False)
    positional = node.args[1:] if node.target in (torch.ops.aten.sort.default, torch.ops.aten.argsort.default) else ()
    dim = positional[0] if len(positional) > 0 else node.kwargs.get("dim", -1)
    descending = positional[1] if len(positional) > 1 else node.kwargs.get("descending", False)
    length = src_val.shape[dim]
    with gm.graph.inserting_before(node):
        if free_symbols(length):
            k = gm.graph.call_function(torch.ops.aten.sym_size.int, (source, dim % src_val.dim()))
            k.meta["val"] = length
        else:
            k = int(length)
    topk_args = (source, k, dim, bool(descending), True)
    if node.target in _SORTS:  # same (values, indices) outputs
        return _replace_node(gm, node, torch.ops.aten.topk.default, topk_args, {})
    # argsort: the indices of topk
    with gm.graph.inserting_before(node):
        topk = gm.graph.call_function(torch.ops.aten.topk.default, topk_args)
    topk.meta.update({**node.meta, "val": (src_val, node.meta.get("val"))})
    return _replace_node(gm, node, operator.getitem, (topk, 1), {})
