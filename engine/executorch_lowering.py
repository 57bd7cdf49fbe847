"""``lower``: ``to_edge_transform_and_lower`` with one decomposition pass instead of three (stage 4, ExecuTorch).

``to_edge_transform_and_lower`` retraces the whole program three times before the edge dialect: once to
functionalize (``run_decompositions({})``), once to decompose with the partitioner's ops kept, and, for a
partitioner that checks op support per node (XNNPACK does), once more after marking the supported nodes of
those ops so that only they survive. Each retrace re-runs every op on fake tensors with symbolic shapes, and
they are the largest cost of lowering a small model. Marking the supported nodes on the exported program itself
and decomposing once does the same work in one retrace: the .pte files are byte-identical (checked for the
twelve test architectures), and lowering takes about a quarter less CPU time (``bench/bench_executorch.py``).

A program traced straight to that ATen IR (``ExecutorchConfig.single_trace``, :func:`trace_table`) needs no
decomposition at all where the partitioner takes every node the trace kept whole: :func:`lower` checks them
node by node and decomposes again only where it does not (or where an FX fix left an op the table decomposes).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from engine.fake_mode import fake_dispatch_cache_off_while_decomposing

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
    "get_control_flow_submodules",
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


def trace_table(partitioners: list) -> dict | None:
    """The table a single trace decomposes with (:func:`engine.single_trace.export_decomposed`): ExecuTorch's
    default decomposition table less every op a partitioner may keep whole (XNNPACK's ``linear``,
    ``upsample_bilinear2d``, ``max_pool2d``, ...), whose nodes :func:`lower` then checks one by one, and less the ops
    the ExecuTorch FX fixes declare they rewrite (``new_empty``, ``empty_like``, the FFTs: decomposed, they become ops
    the fixes do not match). None where the installed ExecuTorch lacks a step of :func:`lower` or a partitioner
    names its ops only for a program (the CUDA backend's)."""
    from executorch.exir.program import _program as steps

    if not all(hasattr(steps, helper) for helper in _ONE_PASS_HELPERS):
        return None
    from engine.patches.registry import fixed_ops

    table = steps._default_decomposition_table()
    for partitioner in partitioners:
        try:
            ops, _ = partitioner.ops_to_not_decompose(None)
        except Exception:  # noqa: BLE001 - it reads the program: the two passes
            return None
        for op in steps._remove_invalid_ops_for_not_decompose(list(ops)):
            table.pop(op, None)
    for op in fixed_ops("executorch"):  # the FX fixes rewrite these before lowering: traced whole for them
        table.pop(op, None)
    return table


def _kept_whole_by_the_trace(program: torch.export.ExportedProgram, partitioners: list) -> set | None:
    """For a program traced straight to the edge-ready ATen IR with :func:`trace_table`: the kept ops (those with a
    node the partitioner takes), when the partitioners take every node of them, no node is of an op the
    decomposition table decomposes (one an FX fix kept or put there) and no size is data-dependent; None otherwise
    (then :func:`lower` marks the taken nodes and decomposes, as for a program of two passes) or for any other
    program."""
    from executorch.exir.program import _program as steps

    from engine.single_trace import decomposed_with

    traced_with = decomposed_with(program)
    table = trace_table(partitioners) if traced_with is not None else None
    if table is None or traced_with != frozenset(table):
        return None
    graphs = [program.graph_module, *(sub for _, sub, _ in steps.get_control_flow_submodules(program.graph_module))]
    nodes = [node for graph_module in graphs for node in graph_module.graph.nodes if node.op == "call_function"]
    preserved: set = set()
    kept: set = set()
    for partitioner in partitioners:
        ops, check_op_support = partitioner.ops_to_not_decompose(program)
        ops = set(steps._remove_invalid_ops_for_not_decompose(list(ops)))
        kept |= ops
        for node in nodes:
            if node.target not in ops:
                continue
            if check_op_support is not None and not check_op_support(node):
                return None
            preserved.add(node.target)
    decomposed = {op for op in steps._default_decomposition_table() if op not in kept and _returns_tensors(op)}
    if any(node.target in decomposed for node in nodes) or _has_data_dependent_sizes(nodes):
        return None
    return preserved


def _has_data_dependent_sizes(nodes) -> bool:
    """Whether a node's value has a size read from data (an unbacked symbol: ``.item()``, ``nonzero``). Lowering
    such a single trace as it is left symbols the edge passes create without a bound (GLM-4V's packed vision grid:
    'Cannot evaluate a finite upper bound for symbolic expression u28'); decomposed once more, as the two passes'
    program is, it lowers as before."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(node.meta.get("val")) for node in nodes)


def _returns_tensors(op) -> bool:
    """Whether ``op`` computes tensors: the table also lists size queries (``sym_size``, ``executorch_prim.sym_max``),
    which stay as they are whatever the table."""
    schema = getattr(op, "_schema", None)
    return schema is not None and any("Tensor" in str(ret.type) for ret in schema.returns)


def lower(program: torch.export.ExportedProgram, partitioners: list, config, constant_methods: dict):
    """``to_edge_transform_and_lower(program, partitioners, config, constant_methods)`` with one decomposition pass.

    Falls back to ``to_edge_transform_and_lower`` itself when the installed ExecuTorch lacks one of the
    (private) steps it is made of, so a newer ExecuTorch is slower, never wrong.
    """
    from executorch.exir.program import _program as steps

    if not all(hasattr(steps, helper) for helper in _ONE_PASS_HELPERS):
        logger.debug("ExecuTorch %s lacks a one-pass lowering step; using to_edge_transform_and_lower", steps.__name__)
        return steps.to_edge_transform_and_lower(
            program, partitioner=partitioners, compile_config=config, constant_methods=constant_methods
        )
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    method = "forward"
    table = steps._default_decomposition_table()
    preserved = _kept_whole_by_the_trace(program, partitioners)
    if preserved is None:
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
