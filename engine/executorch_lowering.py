"""``lower``: ``to_edge_transform_and_lower`` with one decomposition pass instead of three (stage 4, ExecuTorch).

``to_edge_transform_and_lower`` retraces the whole program three times before the edge dialect: once to
functionalize (``run_decompositions({})``), once to decompose with the partitioner's ops kept, and, for a
partitioner that checks op support per node (XNNPACK does), once more after marking the supported nodes of
those ops so that only they survive. Each retrace re-runs every op on fake tensors with symbolic shapes, and
they are the largest cost of lowering a small model. Marking the supported nodes on the exported program itself
and decomposing once does the same work in one retrace: the .pte files are byte-identical (checked for the
twelve test architectures), and lowering takes about a quarter less CPU time (``bench/bench_executorch.py``).

A program :class:`~engine.exporter_executorch.ExecutorchExporter` traced straight to the decomposed IR (its single
trace: :func:`single_trace_plan`, :func:`single_trace_refusal`) skips that retrace too.
"""

from __future__ import annotations

import contextlib
import logging

import torch

from engine.fake_mode import fake_dispatch_cache_off_while_decomposing
from engine.single_trace import decomposed_with

logger = logging.getLogger("engine")


_ONE_PASS_HELPERS = (
    "_default_decomposition_table",
    "_replace_aten_ops_with_transformed_ops",
    "_restore_transformed_ops_to_aten_ops",
    "_generate_edge_program",
    "_can_skip_using_EDGE_DO_NOT_DECOMP",
    "_remove_invalid_ops_for_not_decompose",
    "_sanity_check_graph_for_non_decomp_ops",
    "EdgeProgramManager",
)


class _ToBackendDeprecationFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "deprecated 'to_edge() + to_backend()' workflow" not in record.getMessage()


@contextlib.contextmanager
def _without_to_backend_deprecation():
    """XNNPACK's partitioner warns of the deprecated ``to_edge() + to_backend()`` workflow whenever no stack frame
    is named ``to_edge_transform_and_lower``; :func:`lower` runs that function's own steps, so the warning is wrong."""
    partitioner_logger = logging.getLogger("executorch.backends.xnnpack.partition.xnnpack_partitioner")
    quiet = _ToBackendDeprecationFilter()
    partitioner_logger.addFilter(quiet)
    try:
        yield
    finally:
        partitioner_logger.removeFilter(quiet)


def _one_pass_supported() -> bool:
    from executorch.exir.program import _program as steps

    return all(hasattr(steps, helper) for helper in _ONE_PASS_HELPERS)


def single_trace_plan(partitioners: list) -> tuple[dict, frozenset] | None:
    """The decomposition table a single trace (:func:`engine.single_trace.export_decomposed`) takes for these
    partitioners, and the ops it keeps whole: ExecuTorch's table without every op a partitioner may keep
    (``ops_to_not_decompose``). None where the installed ExecuTorch lacks the one-pass lowering's steps.

    :func:`lower` decomposes a two-pass program with the same table, apart from nodes of those ops that a
    partitioner declines: they are decomposed there and kept whole here, so :func:`single_trace_refusal` sends such a
    program back to the two passes.

    The kept ops must be known before there is a program: a config-based partitioner (XNNPACK's) lists them from its
    configs; another one (the CUDA backend's, which keeps every op the program has) gives None: the two passes.
    """
    if not _one_pass_supported() or not all(_lists_kept_ops_from_configs(p) for p in partitioners):
        return None
    from executorch.exir.program import _program as steps

    table = steps._default_decomposition_table()
    kept: set = set()
    for partitioner in partitioners:
        ops, _ = partitioner.ops_to_not_decompose(None)  # from the configs; only the node check reads the program
        kept.update(op for op in ops if table.pop(op, None) is not None)
    return table, frozenset(kept)


def _lists_kept_ops_from_configs(partitioner) -> bool:
    from executorch.exir.backend.canonical_partitioners.config_partitioner import ConfigerationBasedPartitioner

    return type(partitioner).ops_to_not_decompose is ConfigerationBasedPartitioner.ops_to_not_decompose


#: ops the decomposition makes of one an FX fix of :mod:`engine.patches.executorch` rewrites, where the fix no longer
#: sees it: ``empty_like`` becomes ``empty_permuted`` (``new_empty`` becomes ``empty.memory_format``, which it sees)
_FIX_PATTERNS_LOST_BY_DECOMPOSING = ("empty_permuted",)


def single_trace_refusal(program: torch.export.ExportedProgram) -> str | None:
    """Why a program traced by a single trace (:func:`single_trace_plan`) cannot stand for the first of the two
    passes (``torch.export.export``; :func:`lower` decomposes it), or None where it can:

    - it updates a buffer or an input in place: the FX fixes read those updates as ``copy_`` nodes, which only the
      first pass's program has;
    - it has control-flow submodules (their nodes are marked for the partitioner apart);
    - it has data-dependent sizes (unbacked symbols): the two passes make those of the decomposition after
      :func:`engine.dim_bounds.bound_dynamic_dims` has bounded the program's dims, and so bounded by them (CohereCompass:
      a size the single trace made has no finite bound for memory planning);
    - it has an op the decomposition made of one an FX fix rewrites, where the fix does not see it
      (:data:`_FIX_PATTERNS_LOST_BY_DECOMPOSING`).
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return "it updates a buffer or an input in place"
    if any(n.op == "get_attr" and isinstance(getattr(program.graph_module, n.target, None), torch.fx.GraphModule)
           for n in program.graph.nodes):
        return "it has control-flow submodules"
    if any(free_unbacked_symbols(n.meta.get("val")) for n in program.graph.nodes):
        return "it has data-dependent sizes"
    for node in program.graph.nodes:
        if getattr(getattr(node.target, "overloadpacket", None), "__name__", "") in _FIX_PATTERNS_LOST_BY_DECOMPOSING:
            return f"the decomposition made {node.target}, which an FX fix would have rewritten before it"
    return None


def declined_kept_node(program: torch.export.ExportedProgram, partitioners: list, kept: frozenset) -> str | None:
    """A node of an op the single trace kept whole (:func:`single_trace_plan`) that a partitioner declines, or None:
    the two passes decompose such a node, so the program is decomposed again by :func:`lower`."""
    from executorch.exir.program import _program as steps

    nodes = [n for n in program.graph.nodes if n.op == "call_function" and n.target in kept]
    for partitioner in partitioners:
        ops, check_op_support = partitioner.ops_to_not_decompose(program)
        ops = set(steps._remove_invalid_ops_for_not_decompose(list(ops)))
        for node in nodes:
            if node.target not in ops or (check_op_support and not check_op_support(node)):
                return f"{type(partitioner).__name__} declines {node.format_node()}"
    return None


def lower(program: torch.export.ExportedProgram, partitioners: list, config, constant_methods: dict):
    """``to_edge_transform_and_lower(program, partitioners, config, constant_methods)`` with one decomposition pass.

    Falls back to ``to_edge_transform_and_lower`` itself when the installed ExecuTorch lacks one of the
    (private) steps it is made of, so a newer ExecuTorch is slower, never wrong.
    """
    from executorch.exir.program import _program as steps

    if not _one_pass_supported():
        logger.debug("ExecuTorch %s lacks a one-pass lowering step; using to_edge_transform_and_lower", steps.__name__)
        return steps.to_edge_transform_and_lower(
            program, partitioner=partitioners, compile_config=config, constant_methods=constant_methods
        )
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    method = "forward"
    traced_with = decomposed_with(program)
    plan = single_trace_plan(partitioners) if traced_with is not None else None
    if plan is not None and traced_with == frozenset(plan[0]):
        # traced straight to this table by ExecutorchExporter (single_trace_refusal found no reason against it):
        # the ops kept whole are those the partitioners take, as the decomposition below would keep them
        preserved = {n.target for n in program.graph.nodes if n.op == "call_function" and n.target in plan[1]}
    else:
        table = steps._default_decomposition_table()
        preserved = set()
        for partitioner in partitioners:
            ops, check_op_support = partitioner.ops_to_not_decompose(program)
            if check_op_support is None:  # keep every node of these ops
                preserved.update(op for op in ops if table.pop(op, None) is not None)
            else:  # keep only the nodes the partitioner takes: they become ops the decomposition does not know
                preserved.update(steps._replace_aten_ops_with_transformed_ops(method, program, {method: [partitioner]}) or ())
        # functionalizes and decomposes in one retrace, faster without the fake dispatch cache (tiny Mamba2's
        # ExecuTorch export 70-82 -> 57-66 CPU s; Llama, T5, DETR within noise), which the edge passes then use
        with fake_dispatch_cache_off_while_decomposing(program):
            program = program.run_decompositions(table)
        steps._restore_transformed_ops_to_aten_ops(program)

    preserved_ops = list(preserved)
    edge_program = steps._generate_edge_program(config, program, preserve_ops=preserved_ops)
    config._core_aten_ops_exception_list = list(set(config._core_aten_ops_exception_list) | preserved)
    edge = steps.EdgeProgramManager({method: edge_program}, constant_methods, config, preserved_ops)
    with _without_to_backend_deprecation():
        for partitioner in partitioners:
            edge = edge.to_backend({method: partitioner})

    # the checks to_edge_transform_and_lower ends with: no kept op left outside a delegate unless allowed
    lowered = edge.exported_program(method)
    kept: set = set()
    for partitioner in partitioners:
        ops, check_op_support = partitioner.ops_to_not_decompose(lowered)
        if not steps._can_skip_using_EDGE_DO_NOT_DECOMP(partitioner, lowered):
            ops = steps._remove_invalid_ops_for_not_decompose(ops)
        kept.update(ops)
        steps._sanity_check_graph_for_non_decomp_ops(
            method, lowered, kept, check_op_support, partitioner_name=type(partitioner).__name__, generate_error=True
        )
    if config._check_ir_validity:
        EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True, preserve_ops=config.preserve_ops + list(kept))()(
            lowered.graph_module
        )
    return edge
