"""ExecuTorch speed patches (:mod:`engine.patches.executorch_speed`): less work, the same ``.pte`` bytes."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


pytest.importorskip("executorch", reason="the executorch extra is not installed")


from tests.engine.executorch_cases import pte_bytes, pte_bytes_with_every_patch, size_symint  # noqa: E402


def _counted_with_and_without(patch: str, events: list) -> tuple[int, int]:
    """How many ``events`` one export of the block appends with ``patch`` and with it disabled (XNNPACK's
    first-use exports of its pattern graphs are left out of both)."""
    from engine.patches import patch_disabled

    pte_bytes()
    events.clear()
    pte_bytes()
    with_patch = len(events)
    events.clear()
    with patch_disabled("executorch", patch):
        pte_bytes()
    return with_patch, len(events)


def test_idle_xnnpack_passes_skip_their_retrace_and_the_bytes_are_unchanged(monkeypatch):
    from executorch.exir.pass_base import ExportPass

    from engine.patches import patch_disabled

    pte_bytes()  # XNNPACK exports its pattern graphs (SDPA, bilinear upsampling) on first use: not counted here
    retraces = []
    real_call = ExportPass.call
    monkeypatch.setattr(ExportPass, "call", lambda self, gm: retraces.append(type(self).__name__) or real_call(self, gm))
    with_patch, retraces_with = pte_bytes(), len(retraces)
    retraces.clear()
    with patch_disabled("executorch", "_patch_xnnpack_idle_retraces"):
        without_patch, retraces_without = pte_bytes(), len(retraces)
    assert with_patch == without_patch
    assert retraces_with < retraces_without / 2  # most of the 17 passes find nothing to rewrite in this block


class _SigmoidAdd(torch.nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x) + y


def test_edge_dtype_check_reads_recorded_values_and_keeps_its_verdicts(monkeypatch):
    import executorch.exir.verification.verifier as verifier
    from executorch.exir import to_edge
    from torch._export.verifier import SpecViolationError

    from engine.patches.executorch_speed import _patch_edge_dtype_check_from_meta

    graph = to_edge(torch.export.export(_SigmoidAdd(), (torch.randn(2, 3), torch.randn(2, 3)))).exported_program().graph_module
    original = verifier._check_tensor_args_matching_op_allowed_dtype
    patched = _patch_edge_dtype_check_from_meta(original)
    runs = []
    real_run = torch.fx.Interpreter.run
    monkeypatch.setattr(torch.fx.Interpreter, "run", lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    assert patched(graph) is None and runs == []  # a valid graph passes without re-running a single op
    assert original(graph) is None and runs == [1]
    x = next(n for n in graph.graph.nodes if n.op == "placeholder")
    x.meta["val"] = x.meta["val"].to(torch.float16)  # sigmoid(half) + float: the edge add takes one dtype
    for check in (original, patched):
        with pytest.raises(SpecViolationError, match="taking Tensor inputs with mismatched dtypes"):
            check(graph)


def test_edge_operator_passes_fuse_in_order_and_a_re_entering_pass_starts_a_group():
    from executorch.exir.passes import base_pre_op_replace_passes
    from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.replace_aten_with_edge_pass import OpReplacePass

    from engine.patches.executorch_speed import _operator_pass_classes, _view_copy_pass_class, fuse_operator_passes

    passes = [base_pre_op_replace_passes[0], _view_copy_pass_class()(), *base_pre_op_replace_passes[1:],
              RemoveMixedTypeOperators(), OpReplacePass(), MemoryFormatOpsPass()]
    fused = fuse_operator_passes(passes, _operator_pass_classes())
    names = [type(getattr(p, "__wrapped__", p)).__name__ for p in fused]
    assert names == [
        "ReplaceSymSizeOpPass",
        "ViewCopyPass+NormalizeTransposePass+ReplaceBrokenOpsWithFunctionalOpsPass+ScalarToTensorPass",
        "SymToTensorPass",  # re-enters self.call_operator: starts a group, and the next pass is not an operator pass
        "RemoveNoopPass", "PruneEmptyTensorsPass", "RemoveToCopyPass",
        "FoldRedundantDequantizeQuantizePass",  # (new in executorch 1.5) not an operator pass
        "RemoveMixedTypeOperators+OpReplacePass+MemoryFormatOpsPass",
    ]
    assert fused[0] is passes[0] and fused[3] is passes[6]  # the others keep their pass manager wrapper


@pytest.mark.parametrize(
    "patch", ["_patch_edge_dtype_check_from_meta", "_patch_fused_edge_passes", "_patch_partition_legalize_without_child_recompiles",
              "_patch_spec_prop_reuses_the_dim_order_retrace", "_patch_lazy_graph_module_recompiles",
              "_patch_partition_merge_cycle_check_by_intersection", "_patch_partition_loop_without_debug_rendering",
              "_patch_memory_planning_allocation_ends_once", "_patch_upper_bound_once_per_expression"]
)
def test_lowering_speed_patch_leaves_the_bytes_unchanged(patch):
    from engine.patches import patch_disabled

    with_patch = pte_bytes_with_every_patch()  # (outside the block: the cache must hold the patched bytes)
    with patch_disabled("executorch", patch):
        assert pte_bytes() == with_patch


def test_graph_modules_built_while_lowering_compile_their_code_when_first_called(monkeypatch):
    """Under the patch a plain GraphModule generates no code when built or recompiled, only when called (and then
    computes what the graph does); its pytree specs are current without a call (torch.export reads them); a
    GraphModule subclass is built as before; the original constructor is back after the block; and lowering
    recompiles far less."""
    from torch.fx.graph_module import GraphModule

    from engine.patches import apply_patches

    class Stateful(GraphModule):
        pass

    traced = torch.fx.symbolic_trace(_SigmoidAdd())
    pytree_traced = torch.export.export(_SigmoidAdd(), (torch.ones(2), torch.ones(2))).module()
    compiled = []
    real_recompile = GraphModule.recompile
    monkeypatch.setattr(GraphModule, "recompile", lambda self: compiled.append(1) or real_recompile(self))
    with apply_patches("executorch"):
        lazy = torch.fx.GraphModule(traced, traced.graph)
        lazy.recompile()
        assert not compiled
        x, y = torch.randn(3), torch.randn(3)
        assert torch.equal(lazy(x, y), torch.sigmoid(x) + y) and len(compiled) == 1
        respecced = torch.fx.GraphModule(pytree_traced, pytree_traced.graph)
        assert respecced._in_spec == pytree_traced._in_spec and respecced._out_spec == pytree_traced._out_spec
        compiled.clear()
        Stateful(traced, traced.graph)
        assert compiled  # a subclass compiles as it is built
    compiled.clear()
    torch.fx.GraphModule(traced, traced.graph)
    assert compiled

    with_patch, without_patch = _counted_with_and_without("_patch_lazy_graph_module_recompiles", compiled)
    assert with_patch < without_patch / 2


@st.composite
def _dags_with_partitions(draw):
    """A random DAG (each node uses up to three earlier ones) and disjoint groups of its nodes as partitions."""
    size = draw(st.integers(2, 24))
    inputs = [draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else [] for i in range(size)]
    partition_of = draw(st.lists(st.integers(-1, 5), min_size=size, max_size=size))  # -1: in no partition
    return inputs, partition_of


@settings(max_examples=60, deadline=None)
@given(_dags_with_partitions())
def test_partition_merge_check_by_intersection_gives_the_original_verdicts(case):
    """Every pair of partitions of a random DAG: the patched cycle check answers as ExecuTorch's own, and leaves the
    dependency viewer as it was."""
    from executorch.exir.backend.canonical_partitioners.group_partitioner import GroupBasedPartitioner
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.operator_support import OperatorSupport

    from engine.patches.executorch_speed import _patch_partition_merge_cycle_check_by_intersection

    inputs, partition_of = case
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes: list[torch.fx.Node] = []
    for uses in inputs:
        nodes.append(graph.call_function(torch.cat, ([x, *(nodes[j] for j in uses)],)))
    graph.output(nodes[-1])
    partitioner = GroupBasedPartitioner(torch.fx.GraphModule(torch.nn.Module(), graph), OperatorSupport())
    partitions = {p: Partition(id=p, nodes=[n for n, q in zip(nodes, partition_of) if q == p])
                  for p in set(partition_of) - {-1}}
    original = GroupBasedPartitioner._can_merge_partitions
    patched = _patch_partition_merge_cycle_check_by_intersection(original)
    for p1 in partitions:
        for p2 in partitions:
            if p1 != p2:
                assert patched(partitioner, p1, p2, partitions) == original(partitioner, p1, p2, partitions)
    assert "downstreams_of" not in vars(partitioner.dependency_viewer)


def test_partition_loop_renders_the_program_only_when_debug_logging_is_on(monkeypatch, caplog):
    """ExecuTorch's loop logs ``f"... {graph_module}"`` at DEBUG: with DEBUG off the patched loop generates no code
    for it (and the lowering generates less code overall); with DEBUG on it logs the program's code; the module's
    own ``str`` is back after the loop."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    from torch.fx.graph import Graph

    from engine.patches.executorch_speed import _patch_partition_loop_without_debug_rendering

    def loop(graph_module):
        logging.debug(f"Partitioned graph module: {graph_module}")
        return "done"

    traced = torch.fx.symbolic_trace(_SigmoidAdd())
    module = _LazyGraphModule(traced, traced.graph)  # as lowering builds them: code generated when first needed
    rendered = []
    real_python_code = Graph.python_code
    monkeypatch.setattr(Graph, "python_code", lambda self, *a, **k: rendered.append(1) or real_python_code(self, *a, **k))
    patched = _patch_partition_loop_without_debug_rendering(loop)
    caplog.set_level(logging.INFO)
    assert patched(module) == "done" and not rendered
    caplog.set_level(logging.DEBUG)
    assert patched(module) == "done" and "sigmoid" in caplog.records[-1].getMessage() and rendered
    assert "sigmoid" in str(module)

    caplog.set_level(logging.WARNING)
    with_patch, without_patch = _counted_with_and_without("_patch_partition_loop_without_debug_rendering", rendered)
    assert with_patch < without_patch


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10), st.integers(0, 4096), st.integers(0, 4096)),
                min_size=1, max_size=40))
def test_memory_planning_allocation_ends_once_finds_the_original_offsets(allocations):
    """A buffer filled allocation by allocation (random lifetimes, offsets, sizes): before each one, the patched
    scan (with the ends it kept from earlier scans) finds the same offset as ExecuTorch's."""
    from executorch.exir import memory_planning

    from engine.patches.executorch_speed import _patch_memory_planning_allocation_ends_once

    original = memory_planning._find_max_overlapping_allocations_offset
    patched = _patch_memory_planning_allocation_ends_once(original)
    buffer = SimpleNamespace(allocations=[])
    for start, length, offset, size in allocations:
        spec = SimpleNamespace(lifetime=[start, start + length], allocated_memory=size)
        assert patched(buffer, spec) == original(buffer, spec)
        buffer.allocations.append(memory_planning.AllocationSpec(offset, spec))


def test_an_upper_bound_is_kept_per_expression_and_the_ranges_of_its_symbols():
    from executorch.exir.sym_util import eval_upper_bound
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from engine.patches.executorch_speed import _patch_upper_bound_once_per_expression

    calls = []
    bound = _patch_upper_bound_once_per_expression(lambda n: calls.append(n) or eval_upper_bound(n))
    small, large = (size_symint(ShapeEnv(), "x", 5, 2, upper) for upper in (10, 20))  # each env names it alike
    assert str(small.node.expr) == str(large.node.expr)  # the same expression, other ranges
    assert [bound(small * 4), bound(small * 4), bound(large * 4), bound(7)] == [40, 40, 80, 7]
    assert len(calls) == 2  # computed once for each range, never for an int
