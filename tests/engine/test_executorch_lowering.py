"""The one-pass lowering (:mod:`engine.executorch_lowering`) writes the bytes ``to_edge_transform_and_lower`` writes,
and falls back to it on an ExecuTorch that lacks one of its steps; the single trace (``ExecutorchConfig.single_trace``)
lowers the program of the two passes without their retrace, and takes the two passes where it cannot stand for them."""

from __future__ import annotations

import logging

import pytest
import torch


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


# -- the single trace (ExecutorchConfig.single_trace) ----------------------------------------------------------------


def _export_counting_traces(monkeypatch, model, inputs, single_trace: bool):
    """The manager, how many times the export traced the model with ``torch.export.export`` (the two passes' first),
    and how many times it ran ``ExportedProgram.run_decompositions`` (a retrace) on a program of the model (XNNPACK
    also decomposes programs of its own, the patterns it matches, once per process)."""
    from engine import ExecutorchConfig, ExecutorchExporter

    exports, decompositions = [], []
    real_export, real_decompose = torch.export.export, torch.export.ExportedProgram.run_decompositions

    def decompose(self, *args, **kwargs):
        decompositions.append(set(inputs) <= {spec.arg.name for spec in self.graph_signature.input_specs})
        return real_decompose(self, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(torch.export, "export", lambda *a, **k: exports.append(1) or real_export(*a, **k))
        patched.setattr(torch.export.ExportedProgram, "run_decompositions", decompose)
        manager = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(dynamic=True, single_trace=single_trace))
    return manager, len(exports), sum(decompositions)


def _runs_like_eager(manager, model, inputs_at, tmp_path) -> None:
    from engine import ExecutorchExporter, run_exported

    path = ExecutorchExporter.save(manager, tmp_path / f"{type(model).__name__}.pte")
    for shape in [(2, 5), (3, 9)]:  # the traced shape and another one
        inputs = inputs_at(*shape)
        with torch.no_grad():
            expected = model(**inputs)
        got = run_exported(path, inputs)
        got = got if isinstance(got, torch.Tensor) else next(iter(got.values()))
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _block_inputs(batch, length):
    generator = torch.Generator().manual_seed(batch * 100 + length)
    return {"input_ids": torch.randint(0, 16, (batch, length), generator=generator),
            "attention_mask": (torch.rand(batch, length, generator=generator) > 0.2).float()}


def test_the_single_trace_lowers_the_two_pass_program_without_retracing(monkeypatch, tmp_path):
    from tests.engine.executorch_cases import Block

    torch.manual_seed(0)
    model = Block().eval()
    once, *traces_once = _export_counting_traces(monkeypatch, model, _block_inputs(2, 5), single_trace=True)
    twice, *traces_twice = _export_counting_traces(monkeypatch, model, _block_inputs(2, 5), single_trace=False)
    assert (traces_once, traces_twice) == ([0, 0], [1, 1])  # (torch.export.export, run_decompositions)

    def code(manager):
        return manager.exported_program().graph_module.print_readable(print_output=False)

    assert code(once) == code(twice)  # same edge program, same delegates (their debug handles may be numbered apart)
    _runs_like_eager(once, model, _block_inputs, tmp_path)


class _LinearOfAnInput(torch.nn.Module):
    """A linear whose weight is an input: XNNPACK declines it, so the two passes decompose it."""

    def forward(self, x, weight):
        return torch.nn.functional.linear(x, weight)


class _Sorts(torch.nn.Module):
    """A sort: an FX fix makes it a topk, which the decomposition then lowers."""

    def forward(self, x):
        return torch.sort(x, dim=-1).values * 2


class _CountsCalls(torch.nn.Module):
    """Updates a buffer in place."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        self.calls.add_(1)
        return self.linear(x) + self.calls


class _SelectsPositive(torch.nn.Module):
    """A size read from the data (how many values are positive)."""

    def forward(self, x):
        return x[x > 0].sum(dim=0, keepdim=True) + x.mean()


class _EmptyLike(torch.nn.Module):
    """``empty_like`` of a symbolic size, which an FX fix makes ``zeros_like``; decomposed, it is ``empty_permuted``."""

    def forward(self, x):
        out = torch.empty_like(x)
        return out.copy_(x * 2)


def _weight():
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(7))


def _features(batch, length):
    return {"x": torch.randn(batch, length, 8, generator=torch.Generator().manual_seed(batch * 100 + length))}


#: module, inputs at a shape, expected (torch.export.export calls, run_decompositions calls), the debug line
NOT_SINGLE_TRACED = {
    "a partitioner declines a kept op": (_LinearOfAnInput, lambda b, n: {**_features(b, n), "weight": _weight()}, (0, 1),
                                         "decomposed in the lowering: XnnpackPartitioner declines"),
    "an FX fix applies": (_Sorts, _features, (0, 1), None),
    "a buffer updated in place": (_CountsCalls, _features, (1, 1), "traced in two passes: it updates a buffer"),
    "a data-dependent size": (_SelectsPositive, _features, (1, 1), "traced in two passes: it has data-dependent sizes"),
    "a fix's pattern lost by decomposing": (_EmptyLike, _features, (1, 1), "traced in two passes: the decomposition made"),
}


@pytest.mark.parametrize("case", list(NOT_SINGLE_TRACED))
def test_a_single_trace_that_cannot_stand_for_the_two_passes_is_decomposed_or_traced_again(case, monkeypatch, tmp_path,
                                                                                           caplog):
    module, inputs_at, traces, message = NOT_SINGLE_TRACED[case]
    torch.manual_seed(0)
    with caplog.at_level(logging.DEBUG, logger="engine"):
        manager, *counted = _export_counting_traces(monkeypatch, module().eval(), inputs_at(2, 5), single_trace=True)
    assert tuple(counted) == traces
    assert message is None or any(message in r.getMessage() for r in caplog.records)
    if module is not _CountsCalls:  # its eager model counts its own calls
        _runs_like_eager(manager, module().eval(), inputs_at, tmp_path)


def test_the_single_trace_needs_the_kept_ops_before_there_is_a_program():
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.backend.partitioner import Partitioner

    from engine.executorch_lowering import single_trace_plan

    class KeepsWhatTheProgramHas(Partitioner):  # as the CUDA backend's AOTI partitioner does
        def partition(self, exported_program):
            raise NotImplementedError

        def ops_to_not_decompose(self, ep):
            return [n.target for n in ep.graph.nodes if n.op == "call_function"], None

    table, kept = single_trace_plan([XnnpackPartitioner()])
    assert torch.ops.aten.linear.default in kept and torch.ops.aten.linear.default not in table
    assert single_trace_plan([KeepsWhatTheProgramHas()]) is None
