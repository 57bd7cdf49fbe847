"""torch.export patterns no backend lowers (:mod:`engine.patches.torch_export`): each rewrite equals the op it
replaces, and the pattern exports and runs on the backends it is registered for."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.patches.torch_export  # noqa: F401  (registers the fixes under test)
from engine import AutoExporter, run_exported
from engine.compare import compare_leaves
from engine.patches.registry import apply_fx_node_fixes
from tests.engine.tiny_models import eager_leaves


class _Buckets(torch.nn.Module):
    """``bucketize`` against fixed boundaries (a vision tower's patch coordinates) and ``searchsorted`` in batched
    sorted rows, with a ``sorter`` and both sides."""

    def __init__(self, right: bool):
        super().__init__()
        self.right = right
        self.register_buffer("boundaries", torch.arange(1, 8) / 8)

    def forward(self, coords, rows, order, values):
        buckets = torch.bucketize(coords, self.boundaries, right=self.right)
        left = torch.searchsorted(rows, values, out_int32=True)
        right = torch.searchsorted(rows.gather(-1, order), values, sorter=order.argsort(-1), side="right")
        return buckets, left, right


def _bucket_inputs(batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 6, (batch, 5), generator=g).float().sort(-1).values  # ties: left and right differ
    return {"coords": torch.rand(batch, length, generator=g), "rows": rows,
            "order": torch.stack([torch.randperm(5, generator=g) for _ in range(batch)]),
            "values": torch.randint(-1, 7, (batch, length), generator=g).float()}


def _rewritten(module: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.nn.Module:
    program = torch.export.export(module, (), inputs, strict=False)
    graph = program.graph_module
    assert any(n.target in (torch.ops.aten.bucketize.Tensor, torch.ops.aten.searchsorted.Tensor) for n in graph.graph.nodes)
    assert apply_fx_node_fixes("executorch", graph) > 0
    assert not any(n.target in (torch.ops.aten.bucketize.Tensor, torch.ops.aten.searchsorted.Tensor) for n in graph.graph.nodes)
    return program.module()


@pytest.mark.parametrize("right", [False, True])
@given(seed=st.integers(0, 2**16))
@settings(max_examples=25, deadline=None)
def test_comparison_count_equals_searchsorted(right, seed):
    module = _Buckets(right).eval()
    rewritten = _rewritten(module, _bucket_inputs(2, 3, 0))
    inputs = _bucket_inputs(2, 3, seed)
    for expected, got in zip(module(**inputs), rewritten(**inputs)):
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected)


@pytest.mark.parametrize("backend", ["onnx", "executorch"])
def test_searchsorted_and_bucketize_export_and_run(backend):
    if backend == "executorch":
        pytest.importorskip("executorch", reason="the executorch extra is not installed")
    module = _Buckets(right=True).eval()
    config = {"export_format": backend, "dynamic": True}
    program = AutoExporter.from_config(config).export(module, _bucket_inputs(2, 6, 0), config=config)
    run_inputs = _bucket_inputs(3, 9, 1)
    comparison = compare_leaves(eager_leaves(module, run_inputs), run_exported(program, run_inputs), atol=0, rtol=0)
    assert comparison.ok, str(comparison)
