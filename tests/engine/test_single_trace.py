"""export_decomposed: one trace gives what torch.export.export and then run_decompositions give, without the retrace."""

from __future__ import annotations

import pytest
import torch

from engine.single_trace import decomposed_with, export_decomposed, single_trace_supported

pytestmark = pytest.mark.skipif(not single_trace_supported(), reason="the installed torch lacks the private hooks")


class Block(torch.nn.Module):
    """Ops a decomposition table acts on: linear (composite implicit), layer_norm, softmax, a transpose and a
    reshape over a dynamic sequence length."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        b, s, _ = x.shape
        y = self.norm(self.proj(x)).view(b, s, 2, 4).transpose(1, 2).contiguous().reshape(b, s, 8)
        return torch.softmax(y, dim=-1) + x.mean(dim=1, keepdim=True)


def inputs(batch, length, seed=0):
    return {"x": torch.randn(batch, length, 8, generator=torch.Generator().manual_seed(seed))}


DYNAMIC = {"x": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}}

TABLES = {
    "default": lambda: dict(torch.export.default_decompositions()),  # to core ATen
    "keep everything": dict,
    "keep layer_norm": lambda: {
        op: fn for op, fn in torch.export.default_decompositions().items() if op is not torch.ops.aten.layer_norm.default
    },
}


def targets(program):
    return sorted(str(n.target) for n in program.graph.nodes if n.op == "call_function")


@pytest.mark.parametrize("table", list(TABLES))
def test_one_trace_gives_the_two_pass_program(table, monkeypatch):
    decompositions = TABLES[table]()
    model = Block().eval()
    two_passes = torch.export.export(model, (), inputs(2, 6), dynamic_shapes=DYNAMIC).run_decompositions(dict(decompositions))

    def no_retrace(*args, **kwargs):
        raise AssertionError("export_decomposed must not call run_decompositions")

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", no_retrace)
    one_trace = export_decomposed(model, inputs(2, 6), decompositions, dynamic_shapes=DYNAMIC)

    assert targets(one_trace) == targets(two_passes)
    assert decomposed_with(one_trace) == frozenset(decompositions)
    for batch, length in [(2, 6), (3, 11)]:  # the traced shape and another one
        run = inputs(batch, length, seed=length)
        torch.testing.assert_close(one_trace.module()(**run), model(**run), rtol=0, atol=1e-6)


def test_a_usual_export_carries_no_table():
    program = torch.export.export(Block().eval(), (), inputs(2, 6), dynamic_shapes=DYNAMIC)
    assert decomposed_with(program) is None
    assert decomposed_with(program.run_decompositions()) is None


def test_the_trace_hook_is_put_back_when_the_trace_fails():
    from torch.export import _trace

    before = _trace._export_to_aten_ir

    class Fails(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.export refuses it
                return x
            return -x

    with pytest.raises(Exception):
        export_decomposed(Fails(), {"x": torch.ones(2)}, {})
    assert _trace._export_to_aten_ir is before


# ── The symbolic-work budget ────────────────────────────────────────────────────────────────────────────────


class StridedConvs(torch.nn.Module):
    """Strided convs over a dynamic image: each output side is a floor division of the one before, the nested size
    expressions whose probes the budget counts. Each test takes its own kernel and stride: torch caches the ranges
    of expressions it has bounded, and a second trace of the same ones takes no step."""

    def __init__(self, kernel: int, stride: int):
        super().__init__()
        self.convs = torch.nn.Sequential(*[torch.nn.Conv2d(2, 2, kernel, stride=stride, padding=1) for _ in range(3)])

    def forward(self, x):
        y = self.convs(x)
        return y.reshape(y.shape[0], -1).softmax(-1)


IMAGE = {"x": torch.randn(2, 2, 64, 80)}
IMAGE_DYNAMIC = {"x": {0: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO, 3: torch.export.Dim.AUTO}}


def _spend_nothing(monkeypatch):
    """A budget every size expression exceeds: any value-range step counts, none is allowed."""
    import engine.single_trace as single_trace

    monkeypatch.setattr(single_trace, "DEEP_EXPRESSION_STEPS", 0)
    monkeypatch.setattr(single_trace, "SYMBOLIC_WORK_BUDGET", 0)


def test_a_single_trace_past_its_symbolic_work_budget_raises_and_restores_bound_sympy(monkeypatch):
    from torch.fx.experimental import symbolic_shapes
    from torch.utils._sympy import interp, value_ranges

    from engine.single_trace import SymbolicWorkExceeded

    table = TABLES["default"]()
    before = (value_ranges.bound_sympy, symbolic_shapes.bound_sympy, interp._run_sympy_handler)
    _spend_nothing(monkeypatch)
    with pytest.raises(SymbolicWorkExceeded, match="interval-analysis steps"):
        export_decomposed(StridedConvs(kernel=5, stride=3), IMAGE, table, dynamic_shapes=IMAGE_DYNAMIC)
    assert (value_ranges.bound_sympy, symbolic_shapes.bound_sympy, interp._run_sympy_handler) == before


def test_an_exporter_takes_the_two_passes_when_the_single_trace_is_over_budget(monkeypatch):
    from engine import DynamoConfig, DynamoExporter

    table = TABLES["default"]()
    model = StridedConvs(kernel=4, stride=3).eval()
    _spend_nothing(monkeypatch)
    program = DynamoExporter().export_program_decomposed(model, IMAGE, IMAGE_DYNAMIC, DynamoConfig(dynamic=True), table)
    assert decomposed_with(program) is None  # the two passes' plain torch.export program
    other = {"x": torch.randn(3, 2, 70, 100)}
    torch.testing.assert_close(program.module()(**other), model(**other), rtol=0, atol=1e-6)
