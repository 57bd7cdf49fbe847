"""The one-pass lowering (:mod:`engine.executorch_lowering`) writes the bytes ``to_edge_transform_and_lower`` writes,
and falls back to it on an ExecuTorch that lacks one of its steps."""

from __future__ import annotations


import pytest


pytest.importorskip("executorch", reason="the executorch extra is not installed")


from tests.engine.executorch_cases import pte_bytes, pte_bytes_with_every_patch  # noqa: E402



def _reference_lowering(program, partitioners, config, constant_methods):
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(program, partitioner=partitioners, compile_config=config, constant_methods=constant_methods)


def test_one_pass_lowering_gives_the_bytes_of_to_edge_transform_and_lower(monkeypatch):
    import engine.exporter_executorch as exporter

    ours = pte_bytes_with_every_patch()  # (before the swap: the cache must hold our lowering's bytes)
    monkeypatch.setattr(exporter, "lower", _reference_lowering)
    assert pte_bytes() == ours


def test_lowering_falls_back_when_executorch_lacks_a_step(monkeypatch):
    from executorch.exir.program import _program

    import engine.executorch_lowering as lowering

    calls = []
    real = _program.to_edge_transform_and_lower
    monkeypatch.setattr(lowering, "_ONE_PASS_HELPERS", (*lowering._ONE_PASS_HELPERS, "_a_step_of_a_future_executorch"))
    monkeypatch.setattr(_program, "to_edge_transform_and_lower", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert pte_bytes() and calls == [1]


# ── One trace (ExecutorchConfig.single_trace) ─────────────────────────────────────────────────────────────────


def _export_counting_decompositions(monkeypatch, model, inputs, single_trace: bool):
    """The ExecuTorch program of ``model`` and how many times the lowering decomposed it again."""
    from engine import ExecutorchConfig, ExecutorchExporter

    import engine.executorch_lowering as lowering

    calls = []
    real = lowering.fake_dispatch_cache_off_while_decomposing  # around the lowering's decomposition retrace only
    monkeypatch.setattr(lowering, "fake_dispatch_cache_off_while_decomposing", lambda p: calls.append(1) or real(p))
    manager = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True, single_trace=single_trace))
    monkeypatch.setattr(lowering, "fake_dispatch_cache_off_while_decomposing", real)
    return manager, len(calls)


def _outputs(manager, inputs):
    from engine import run_exported

    return run_exported(manager, inputs)


def test_a_single_trace_is_lowered_without_decomposing_again(monkeypatch):
    """The program traced straight to the edge-ready ATen IR (XNNPACK's linear kept whole, every node of it taken)
    is lowered as it is: no second decomposition retrace, and the .pte computes what the two passes' does."""
    import torch

    from tests.engine.executorch_cases import Block

    torch.manual_seed(0)
    model = Block().eval()
    inputs = {"input_ids": torch.randint(0, 16, (2, 5)), "attention_mask": torch.ones(2, 5)}
    once, retraces = _export_counting_decompositions(monkeypatch, model, inputs, single_trace=True)
    twice, two_pass_retraces = _export_counting_decompositions(monkeypatch, model, inputs, single_trace=False)
    assert (retraces, two_pass_retraces) == (0, 1)
    for name, value in _outputs(twice, inputs).items():
        torch.testing.assert_close(_outputs(once, inputs)[name], value, rtol=0, atol=0)


class _ComputedWeightLinear:
    """A linear whose weight is computed in the forward: XNNPACK's linear takes only a constant weight."""

    @staticmethod
    def model():
        import torch

        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.randn(6, 4))
                self.kept = torch.nn.Linear(6, 3)

            def forward(self, x):
                return self.kept(torch.nn.functional.linear(x, self.weight * 2.0))

        return Scaled().eval()


def test_a_kept_node_the_partitioner_does_not_take_is_decomposed_while_lowering(monkeypatch):
    """One linear XNNPACK does not take (its weight is computed) sends the single trace's program through the
    lowering's decomposition, with the linear it takes marked as before: outputs as eager's."""
    import torch

    from engine.executorch_lowering import trace_table

    torch.manual_seed(0)
    model = _ComputedWeightLinear.model()
    inputs = {"x": torch.randn(2, 5, 4)}
    manager, retraces = _export_counting_decompositions(monkeypatch, model, inputs, single_trace=True)
    assert retraces == 1
    with torch.no_grad():
        expected = model(**inputs)
    torch.testing.assert_close(next(iter(_outputs(manager, inputs).values())), expected, rtol=1e-5, atol=1e-5)
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    assert torch.ops.aten.linear.default not in trace_table([XnnpackPartitioner()])


def test_the_ops_an_fx_fix_rewrites_are_traced_whole_and_left_decomposed_by_it(monkeypatch):
    """``new_empty`` is rewritten by an ExecuTorch FX fix (a zero-filled allocation where its size is symbolic), which
    must see it: the single trace keeps the ops the fixes declare (``fixed_ops``) whole, and the fix writes what the
    table decomposes to (``full``; a static ``new_empty``'s ``empty``), so the lowering needs no decomposition
    retrace. Outputs as eager's."""
    import torch

    from engine.executorch_lowering import trace_table
    from engine.patches.registry import fixed_ops

    class HalvesFilledInPlace(torch.nn.Module):  # DeepSeek-V3's keys: new_empty, then both halves written
        def forward(self, a, b):
            out = a.new_empty(a.shape[0], a.shape[1], a.shape[2] + b.shape[2])
            out[..., : a.shape[2]] = a
            out[..., a.shape[2]:] = b
            table = a.new_empty(3, 2)  # static
            table.fill_(1.5)
            return out * 2, table

    import engine.patches.executorch_nodes  # noqa: F401
    import engine.patches.executorch  # noqa: F401  (registers the fixes)

    assert torch.ops.aten.new_empty.default in fixed_ops("executorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    assert torch.ops.aten.new_empty.default not in trace_table([XnnpackPartitioner()])
    inputs = {"a": torch.randn(2, 5, 3), "b": torch.randn(2, 5, 4)}
    manager, retraces = _export_counting_decompositions(monkeypatch, HalvesFilledInPlace(), inputs, single_trace=True)
    assert retraces == 0
    outputs = list(_outputs(manager, inputs).values())
    for got, expected in zip(outputs, HalvesFilledInPlace()(**inputs), strict=True):
        torch.testing.assert_close(got, expected)


def test_a_single_trace_with_a_data_dependent_size_is_decomposed_while_lowering(monkeypatch):
    """A size read from data (the rows a mask selects) sends the single trace's program through the lowering's
    decomposition, as the two passes' program goes: edge passes on the trace as it is create unbounded symbols
    (GLM-4V's packed grid). Outputs as eager's."""
    import torch

    class Selected(torch.nn.Module):
        def forward(self, x):
            return x[x > 0] * 2

    x = torch.randn(3, 4)
    manager, retraces = _export_counting_decompositions(monkeypatch, Selected(), {"x": x}, single_trace=True)
    assert retraces == 1
    torch.testing.assert_close(next(iter(_outputs(manager, {"x": x}).values())), Selected()(x))
