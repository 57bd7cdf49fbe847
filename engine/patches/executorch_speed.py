"""ExecuTorch speed patches: the same lowering, computed once where ExecuTorch computes it many times.

Registered for ``"executorch"`` and active while the program is lowered (stage 4). None changes what is lowered: each
docstring names the repeated work it removes (what each saves is in ``bench/README.md``), and ``tests/engine/patches/``
checks the lowered program is the same with the patch disabled (:func:`engine.patches.patch_disabled`)."""

from __future__ import annotations

import functools

import torch

from engine.patches.executorch import EXECUTORCH_RANGE
from engine.patches.registry import register_patch


# ── Speed: ExecuTorch internals ─────────────────────────────────────────────────────────────────────────────


class _NoRun(torch.fx.Interpreter):
    """An interpreter that runs no op: below the edge dtype validator, it leaves only its bookkeeping."""

    def call_function(self, target, args, kwargs):
        return None


@register_patch(
    "executorch",
    "executorch.exir.verification.verifier._check_tensor_args_matching_op_allowed_dtype",
    requires=EXECUTORCH_RANGE,
)
def _patch_edge_dtype_check_from_meta(original):
    """Pattern: the edge verifier's dtype check (``_check_tensor_args_matching_op_allowed_dtype``) re-executes the whole
    graph on fake tensors on every verification of an edge program, only to learn the dtypes of each edge op's tensor
    arguments, which ``node.meta["val"]`` already records.

    Rewrite: ExecuTorch's own validator (``EdgeOpArgValidator``, same rules) gets each node's recorded values instead. A
    graph with a delegate call passes unchecked, as unpatched; a node without a recorded value, or any violation, goes
    to the original check, so verdicts and messages are ExecuTorch's. Not an upstream bug: a cost of
    executorch/exir/verification/verifier.py, worth an upstream proposal."""
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
            SymToTensorPass: True, RemoveMixedTypeOperators: True, OpReplacePass: False, MemoryFormatOpsPass: False,
            _view_copy_pass_class(): False}


@functools.cache
def _view_copy_pass_class() -> type:
    """torch's ``ReplaceViewOpsWithViewCopyOpsPass`` (torch/_export/passes/), the same ``call_operator`` rewrite, on
    ExecuTorch's ``ExportPass``: torch's pass has its own retrace base, so it could not join a fused group."""
    from executorch.exir.pass_base import ExportPass
    from torch._export.passes import replace_view_ops_with_view_copy_ops_pass as views
    from torch._ops import HigherOrderOperator

    class ViewCopyPass(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op in views._NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS:
                op = views._NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS[op]
            elif not isinstance(op, HigherOrderOperator):
                op = views.get_view_copy_of_view_op(op._schema) or op
            return super().call_operator(op, args, kwargs, meta)

    return ViewCopyPass


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


@register_patch("executorch", "executorch.exir.program._program._generate_edge_program", requires=EXECUTORCH_RANGE)
def _patch_fused_edge_passes(original):
    """Pattern: ``to_edge`` runs 13 passes; 9 retrace the whole graph on fake tensors, and eight of those only rewrite
    one operator call at a time (:func:`_operator_pass_classes`).

    Rewrite: ExecuTorch 1.4/1.5's ``_generate_edge_program`` (executorch/exir/program/_program.py) with its pass list
    put through :func:`fuse_operator_passes`: ReplaceViewOps (on ExecuTorch's pass base, after ReplaceSymSizeOp, which
    it commutes with), NormalizeTranspose, ReplaceBrokenOps and ScalarToTensor retrace once together,
    RemoveMixedTypeOperators, OpReplace and MemoryFormatOps once together. Five retraces fewer, the same ``.pte`` bytes.
    Not an upstream bug: a cost of the pass design, worth an upstream proposal."""
    from executorch.exir.passes.replace_sym_size_op_pass import ReplaceSymSizeOpPass
    from executorch.exir.program import _program as steps

    operator_passes = _operator_pass_classes()

    def generate_edge_program(config, program, core_aten_ops_exception_list=None, preserve_ops=None):
        program = steps.remove_unused_parameters_pass(program)
        pre_op_replace_passes, post_op_replace_passes = steps._get_aten_to_edge_passes(config)
        # ReplaceSymSizeOp edits sym_size nodes' targets only; the views' pass then joins the operator passes after it
        head = [p for p in pre_op_replace_passes[:1] if type(getattr(p, "__wrapped__", p)) is ReplaceSymSizeOpPass]
        passes = [steps.RemoveNonCoreAtenOpGraphAssertsPass(), *head, _view_copy_pass_class()(),
                  *pre_op_replace_passes[len(head):], steps.OpReplacePass()]
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


@register_patch("executorch", "executorch.backends.xnnpack._passes.XNNPACKPassManager.transform", requires=EXECUTORCH_RANGE)
def _patch_xnnpack_idle_retraces(original):
    """Pattern: XNNPACK's preprocess runs 17 passes on every delegated partition, and nearly each ends with
    ``super().call(graph_module)`` (a full retrace on fake tensors, a new ExportedProgram, its verification) whether or
    not it rewrote anything (``ConvertToUpsampleBilinear2d`` on a model without upsampling).

    Rewrite: the same passes in the same order; one that edits the graph before retracing
    (:func:`_rewrites_before_retracing`) skips the retrace when no node changed, reporting the program unmodified.
    Passes that rewrite during the retrace always run it. Same ``.pte`` bytes. Not an upstream bug: a cost of
    executorch/backends/xnnpack/_passes/__init__.py, worth an upstream proposal."""
    from executorch.backends.xnnpack._passes import XNNPACKPass
    from executorch.exir.pass_base import ExportPass
    from executorch.exir.program._program import _transform
    from torch.fx.passes.infra.pass_base import PassResult

    from engine.swap import swap_attributes

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


@register_patch("executorch", "executorch.exir.lowered_backend_module.legalize_graph", requires=EXECUTORCH_RANGE)
def _patch_partition_legalize_without_child_recompiles(original):
    """Pattern: ``create_submodule_from_nodes`` fuses each delegated partition into a ``call_module`` node, then
    re-sorts the program with ``legalize_graph(gm)``, which assigns ``gm.graph`` and so recompiles ``gm`` and every
    GraphModule child: the partitions fused before, which the sort never touches (P * (P - 1) / 2 child recompiles).

    Rewrite: the sort and the parent's recompile run; the children's recompile is skipped, as their graphs and code are
    unchanged (same ``.pte`` bytes). TODO(upstream): no executorch issue found; the partitions could be fused first and
    the program sorted once."""

    def legalize_graph(gm):
        gm._recompile_submodules = list  # an instance attribute: recompile() calls it instead of the method
        try:
            return original(gm)
        finally:
            del gm._recompile_submodules

    return legalize_graph


@register_patch("executorch", "executorch.exir.program._program.edge_to_executorch_passes", requires=EXECUTORCH_RANGE)
def _patch_spec_prop_reuses_the_dim_order_retrace(original):
    """Pattern: ``to_executorch`` runs ``LegalizePortableDimOrderPass`` (an ``ExportPass``: a whole-program retrace on
    fake tensors) and right after it ``SpecPropPass``, whose first step is a plain ``ExportPass()`` retrace "to ensure
    [metadata] is up to date": the metadata the first retrace just produced.

    Rewrite: where the two are adjacent in the list (ExecuTorch 1.4/1.5's ``edge_to_executorch_passes``), one
    ``SpecPropPass`` whose metadata retrace *is* the dim-order pass: one retrace fewer, the same ``.pte`` bytes. Not an
    upstream bug: a cost of the pass design, worth an upstream proposal."""
    from executorch.exir.passes import spec_prop_pass
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    from engine.swap import swap_attributes

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


def _is_one_off_class(cls: type) -> bool:
    """Whether ``cls`` is the one-off ``GraphModuleImpl`` subclass ``GraphModule.__new__`` makes for each instance."""
    return cls.__qualname__.split(".")[-1] == "GraphModuleImpl"


@register_patch("executorch", "torch.fx.graph_module.GraphModule.__new__",
                requires={**EXECUTORCH_RANGE, "torch": ">=2.4"})
def _patch_lazy_graph_module_recompiles(original):
    """Pattern: every ``torch.fx.GraphModule(root, graph)`` an ExecuTorch pass builds, and every ``gm.graph = ...``,
    generates and ``compile()``s the whole graph's code on the spot, though lowering almost never reads the code.

    Rewrite: while lowering, a plain GraphModule is built as torch's ``_LazyGraphModule`` (as ``_use_lazy_graph_module``
    does for Inductor): ``recompile()`` only marks it; the code is generated on first call or read of ``code``. Same
    graphs and ``.pte`` bytes; GraphModule subclasses are untouched. Not an upstream bug: ExecuTorch builds GraphModules
    directly, not through ``_make_graph_module``; worth an upstream proposal."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.graph import _PyTreeCodeGen
    from torch.fx.graph_module import GraphModule

    class LazyGraphModule(_LazyGraphModule):
        """Also keeps the pytree specs current on ``recompile()``, as ``GraphModule.recompile`` does: torch.export
        reads ``gm._in_spec`` of a module it never calls (XNNPACK exports its pattern graphs while lowering)."""

        def recompile(self) -> None:
            codegen = self._graph._codegen
            if isinstance(codegen, _PyTreeCodeGen):
                self._in_spec = codegen.pytree_info.in_spec
                self._out_spec = codegen.pytree_info.out_spec
            type(self).forward = type(self)._lazy_forward

    def __new__(cls, *args, **kwargs):
        base = next(t for t in cls.__mro__ if not _is_one_off_class(t))
        return original(LazyGraphModule if base is GraphModule else cls, *args, **kwargs)

    return staticmethod(__new__)


@register_patch(
    "executorch",
    "executorch.exir.backend.canonical_partitioners.group_partitioner.GroupBasedPartitioner._can_merge_partitions",
    requires=EXECUTORCH_RANGE,
)
def _patch_partition_merge_cycle_check_by_intersection(original):
    """Pattern: XNNPACK's ``GroupBasedPartitioner`` tries to merge every pair of candidate partitions, each try asking
    ``any(n in combined_nodes for n in downstreams_of(node))`` for every outside user: a loop over a whole transitive
    downstream set to find one of the pair's nodes.

    Rewrite: during a try, ``downstreams_of`` answers with that set's intersection with the pair's nodes; the check
    reaches the same verdict (a downstream node is in the pair iff it is in the intersection): same ``.pte`` bytes. Not
    an upstream bug: a cost of executorch/exir/backend/canonical_partitioners/group_partitioner.py; worth an upstream
    proposal (``isdisjoint`` in place of ``any``)."""

    def _can_merge_partitions(self, p1, p2, partitions_by_id):
        pair = partitions_by_id[p1].nodes.keys() | partitions_by_id[p2].nodes.keys()
        viewer = self.dependency_viewer
        downstreams = viewer.downstreams  # the transitive closure the viewer built
        viewer.downstreams_of = lambda node: downstreams[node] & pair  # an instance attribute shadows the method
        try:
            return original(self, p1, p2, partitions_by_id)
        finally:
            del viewer.downstreams_of

    return _can_merge_partitions


def _not_rendered(graph_module: torch.fx.GraphModule) -> str:
    return f"<{type(graph_module).__name__} at {id(graph_module):#x}: not rendered, debug logging is off>"


@register_patch(
    "executorch",
    "executorch.exir.backend.backend_api._create_partitions_in_graph_module",
    "executorch.exir.backend.backend_api._partition_and_lower_one_graph_module",
    requires=EXECUTORCH_RANGE,
)
def _patch_partition_loop_without_debug_rendering(original):
    """Pattern: ExecuTorch's partition loops (``_create_partitions_in_graph_module`` and its lowering twin) call
    ``logging.debug(f"Partitioned graph module: {tagged_graph_module}")`` per partition: the f-string is built even with
    debug logging off, and ``str()`` of a GraphModule generates the whole program's code.

    Rewrite: while the root logger is not enabled for DEBUG (the message is discarded anyway), the program's ``str()``
    answers a short placeholder for the loop (its one-off class, restored after); with DEBUG on, the loop runs
    untouched. Not an upstream bug: eager f-strings in executorch/exir/backend/backend_api.py; worth an upstream
    proposal (``logging.debug("...%s", gm)``)."""
    import logging

    from engine.swap import swap_attributes

    def partition_loop(tagged_graph_module, *args, **kwargs):
        own_class = type(tagged_graph_module)
        if logging.getLogger().isEnabledFor(logging.DEBUG) or not _is_one_off_class(own_class):
            return original(tagged_graph_module, *args, **kwargs)
        with swap_attributes([(own_class, "__str__", _not_rendered)]):
            return original(tagged_graph_module, *args, **kwargs)

    return partition_loop


@register_patch(
    "executorch",
    "executorch.exir.memory_planning._find_max_overlapping_allocations_offset",
    requires=EXECUTORCH_RANGE,
)
def _patch_memory_planning_allocation_ends_once(original):
    """Pattern: ExecuTorch's greedy memory planner places each tensor by scanning every earlier allocation of a buffer
    for lifetime overlaps, recomputing each overlapping one's end, ``alloc.offset + alloc.spec.allocated_memory`` (the
    aligned byte size from shape and dtype), on every scan.

    Rewrite: each allocation's end computed once (its offset and tensor are fixed when it is made; a tensor is realigned
    only before its own allocation), kept per allocation object (held, so its ``id`` is not reused) for one lowering.
    The same plan and ``.pte`` bytes. Not an upstream bug: a cost of executorch/exir/memory_planning.py; worth an
    upstream proposal (the end as an ``AllocationSpec`` field)."""
    ends: dict[int, tuple] = {}  # id(allocation) -> (allocation, its end)

    def _find_max_overlapping_allocations_offset(sobj, spec) -> int:
        first, last = spec.lifetime
        max_offset = 0
        for alloc in sobj.allocations:
            start, stop = alloc.spec.lifetime
            if last < start or first > stop:
                continue
            known = ends.get(id(alloc))
            if known is None or known[0] is not alloc:
                known = ends[id(alloc)] = (alloc, alloc.offset + alloc.spec.allocated_memory)
            max_offset = max(known[1], max_offset)
        return max_offset

    return _find_max_overlapping_allocations_offset


@register_patch(
    "executorch",
    "executorch.exir.sym_util.eval_upper_bound",
    "executorch.exir.passes.sym_shape_eval_pass.eval_upper_bound",
    requires=EXECUTORCH_RANGE,
)
def _patch_upper_bound_once_per_expression(original):
    """Pattern: memory planning asks ``eval_upper_bound`` for each dim of each tensor spec (5,000-7,000 calls per
    export), and each call runs sympy's interval arithmetic (``bound_sympy``) over the same few size expressions.

    Rewrite: one bound per expression and the ranges and traced values of its symbols (all the bound reads), kept
    for one lowering; an error is not kept. Registered after :mod:`engine.patches.executorch`'s exact bound, so it
    keeps that bound. Not an upstream bug: a cost of executorch/exir/sym_util.py."""
    bounds: dict = {}

    def eval_upper_bound(maybe_symint):
        if isinstance(maybe_symint, int):
            return maybe_symint
        node = maybe_symint.node
        env, expr = node.shape_env, node.expr
        hints = env.backed_var_to_val if hasattr(env, "backed_var_to_val") else env.var_to_val  # the traced values
        overrides = getattr(env, "var_to_hint_override", {})
        key = (expr, tuple((s, env.var_to_range.get(s), hints.get(s), overrides.get(s))
                           for s in sorted(expr.free_symbols, key=str)))
        if key not in bounds:
            bounds[key] = original(maybe_symint)
        return bounds[key]

    return eval_upper_bound
