"""Guards a trace left on input sizes: recorded in ONNX and ExecuTorch artifacts, checked before they run."""

from __future__ import annotations

import warnings

import pytest
import sympy
import torch
import transformers as tf
from hypothesis import given, settings, strategies as st
from torch.utils._sympy.functions import FloorDiv, PythonMod
from torch.utils._sympy.printers import PythonPrinter

from engine import DynamoExporter, ExecutorchConfig, InputError, OnnxExporter, run_exported
from engine import ShapeGuardWarning
from engine.shape_guards import check, holds

S, T = sympy.symbols("s0 s1", integer=True, positive=True)


def _exprs():
    leaves = st.one_of(st.sampled_from([S, T]), st.integers(1, 9).map(sympy.Integer))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda ab: ab[0] + ab[1]),
        st.tuples(inner, inner).map(lambda ab: ab[0] * ab[1]),
        st.tuples(inner, st.integers(1, 9)).map(lambda ab: FloorDiv(ab[0], ab[1])),
        st.tuples(inner, st.integers(1, 9)).map(lambda ab: PythonMod(ab[0], ab[1])),
        st.tuples(inner, inner).map(lambda ab: sympy.Max(ab[0], ab[1])),  # a stride of a dim that may be 0
        st.tuples(inner, inner).map(lambda ab: sympy.Min(ab[0], ab[1])),
    ), max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(left=_exprs(), right=_exprs(), relation=st.sampled_from([sympy.Eq, sympy.Ne, sympy.Ge, sympy.Lt]),
       s=st.integers(0, 40), t=st.integers(0, 40))
def test_a_recorded_guard_evaluates_as_sympy_does(left, right, relation, s, t):
    expr = relation(left, right, evaluate=False)
    sizes = {S: sympy.Integer(s), T: sympy.Integer(t)}
    expected = bool(relation(left.xreplace(sizes), right.xreplace(sizes)))
    assert holds(PythonPrinter().doprint(expr), {"s0": s, "s1": t}) is expected


@pytest.mark.parametrize("code", ["__import__('os').system('true')", "(1).__class__", "s0 / 2 > 1", "abs(s0) > 0",
                                  "max(s0, 1, key=int) > 0", "s0.bit_length() > 0",
                                  "'a' == 'a'"])
def test_anything_but_integer_arithmetic_is_not_evaluated(code):
    assert holds(code, {"s0": 3}) is None


def test_check_names_the_guard_and_the_sizes():
    record = {"guards": ["8 >= s0 + ((8 - s0 % 8) % 8)"], "dims": {"s0": ["input_ids", 1]}}
    check("M", record, {"input_ids": torch.zeros(2, 7)})
    with pytest.raises(InputError, match=r"M: the inputs break a guard .*: 8 >= \(input_ids dim 1\) .* is false for "
                                         r"input_ids dim 1 = 12"):
        check("M", record, {"input_ids": torch.zeros(2, 12)})


@pytest.fixture(scope="module")
def mamba2():
    """Mamba2 traced at 7 tokens, below its chunk of 8: a plain trace keeps one chunk."""
    torch.manual_seed(0)
    config = tf.Mamba2Config(vocab_size=96, hidden_size=32, num_hidden_layers=1, state_size=8, expand=2, head_dim=8,
                             n_groups=1, chunk_size=8, num_heads=8)
    return tf.Mamba2ForCausalLM(config).eval(), {"input_ids": torch.randint(0, 96, (2, 7))}


@pytest.mark.parametrize("backend", ["dynamo", "onnx", pytest.param("executorch", marks=pytest.mark.slow)])
def test_mamba2_traced_below_a_chunk_runs_longer_inputs_or_names_the_guard(mamba2, backend):
    """The size-oblivious retrace drops the one-chunk guard on dynamo and ONNX: 9 and 12 tokens run and match eager;
    what stays is Mamba2's own branch on padding (multiples of 8 rejected, named). ExecuTorch keeps the first
    trace (its lowering specialises again: ``ExecutorchExporter.size_oblivious_retrace``), its guard named."""
    from engine.exporter_executorch import ExecutorchExporter

    model, inputs = mamba2
    exporter, config = {"dynamo": (DynamoExporter(), {"dynamic": True}), "onnx": (OnnxExporter(), {"dynamic": True}),
                        "executorch": (ExecutorchExporter(), ExecutorchConfig(dynamic=True))}[backend]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = exporter.export(model, inputs, config=config)
    stated = [str(w.message) for w in caught if issubclass(w.category, ShapeGuardWarning)]
    assert len(stated) == 1 and "input_ids dim 1 (traced 7) rejects 8" in stated[0], stated
    runs = [5, 9, 12] if backend != "executorch" else [5]
    for length in runs:
        given = {"input_ids": torch.randint(0, 96, (2, length))}
        with torch.no_grad():
            expected = model(**given).logits
        torch.testing.assert_close(run_exported(program, given)["logits"], expected, atol=1e-4, rtol=1e-4)
    # outside the guards: a named InputError on every backend (onnxruntime's invalid Expand, ExecuTorch's 0x12 before)
    with pytest.raises(InputError, match=r"input_ids dim 1"):
        run_exported(program, {"input_ids": torch.randint(0, 96, (2, 16 if backend != "executorch" else 12))})


class Chunked(torch.nn.Module):
    """Mamba2's pattern in small: pad to whole chunks of 4, then one output per chunk."""

    def forward(self, x, mask):
        pad = (4 - x.shape[1] % 4) % 4
        return torch.nn.functional.pad(x * mask, (0, pad)).reshape(x.shape[0], -1, 4).cumsum(1).sum(-1)


class Branchy(Chunked):
    """The same, with a Python branch on one chunk: a retrace must not take the other side for the sample."""

    def forward(self, x, mask):
        out = super().forward(x, mask)
        return out * 2 if out.shape[1] == 1 else out


def test_a_trace_below_one_chunk_is_retraced_to_run_longer_inputs_unless_the_model_branches_on_it():
    from engine.shape_guards import grow_dim, probe_plan, program_guards, rejected_probes

    x, mask = torch.rand(2, 3), torch.ones(2, 3)
    program = DynamoExporter().export(Chunked().eval(), {"x": x, "mask": mask}, config={"dynamic": True})
    for length in (3, 5, 9):  # a plain trace at 3 keeps one chunk and refuses 5 and 9
        given = {"x": torch.rand(2, length), "mask": torch.ones(2, length)}
        torch.testing.assert_close(program.module()(**given), Chunked()(**given))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        branchy = DynamoExporter().export(Branchy().eval(), {"x": x, "mask": mask}, config={"dynamic": True})
    stated = [str(w.message) for w in caught if issubclass(w.category, ShapeGuardWarning)]
    assert len(stated) == 1 and "x dim 1 (traced 3) rejects 5" in stated[0], stated
    torch.testing.assert_close(branchy.module()(x=x, mask=mask), Branchy()(x, mask))
    traced, probes = probe_plan(branchy)
    assert [size for size, _ in rejected_probes(program_guards(branchy), traced, probes)[("x", 1)]][:2] == [5, 6]
    grown = grow_dim({"x": x, "mask": mask}, branchy, ("x", 1), 5)  # every input traced with that symbol grows
    assert grown["x"].shape == grown["mask"].shape == (2, 5) and torch.equal(grown["x"][:, 3:], x[:, :2])
    assert grow_dim({"x": x, "mask": mask}, branchy, ("y", 1), 5) is None


def test_dims_of_one_size_a_guard_relates_are_probed_together():
    """``input_ids`` dim 1 <= ``attention_mask`` dim 1 (separate symbols of inputs meant to match, as transformers'
    masks leave them) is no restriction: both grow together; an unrelated size still probes alone."""
    from engine.shape_guards import rejected_probes, tied_leaves

    record = {"guards": ["s1 <= s2", "s3 <= 4"], "dims": {"s1": ["input_ids", 1], "s2": ["attention_mask", 1],
                                                          "s3": ["pixel_values", 0]}}
    traced = {("input_ids", 1): 8, ("attention_mask", 1): 8, ("pixel_values", 0): 2}
    assert tied_leaves(record, traced)[("input_ids", 1)] == [("input_ids", 1), ("attention_mask", 1)]
    probes = {("input_ids", 1): [9, 16], ("pixel_values", 0): [3, 5]}
    assert rejected_probes(record, traced, probes) == {("pixel_values", 0): [(5, "s3 <= 4")]}
    untied = {**traced, ("attention_mask", 1): 9}  # of another size: input_ids alone past it breaks the guard
    assert rejected_probes(record, untied, {("input_ids", 1): [9, 10]}) == {("input_ids", 1): [(10, "s1 <= s2")]}


def test_the_executorch_runner_refuses_a_size_a_kept_guard_rejects_by_name():
    """The guard of :class:`Branchy`'s branch is recorded in the ``.pte`` and checked before it runs (ExecuTorch would
    fail in a kernel); the Mamba2 case above checks it on ONNX, and on ExecuTorch in the slow run."""
    from engine.exporter_executorch import ExecutorchExporter

    x, mask = torch.rand(2, 3), torch.ones(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeGuardWarning)
        artifact = ExecutorchExporter().export(Branchy().eval(), {"x": x, "mask": mask},
                                               config=ExecutorchConfig(dynamic=True))
    torch.testing.assert_close(run_exported(artifact, {"x": x, "mask": mask})[""], Branchy()(x, mask))
    with pytest.raises(InputError, match=r"x dim 1"):
        run_exported(artifact, {"x": torch.rand(2, 5), "mask": torch.ones(2, 5)})


class Triples(torch.nn.Module):
    """Rows in groups of 3 (a merge of patches): traced at 6, its guard ``s % 3 == 0`` refuses 7, and so does eager."""

    def forward(self, x):
        return x.reshape(-1, 3, x.shape[-1]).sum(1)


class MonoConv(torch.nn.Module):
    """One input channel, a size-1 dim the widening would double: eager refuses 2 channels."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 2, 3)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("model, sample", [(Triples(), {"x": torch.rand(6, 4)}), (MonoConv(), {"x": torch.rand(1, 1, 8)})])
def test_a_sample_eager_refuses_is_never_traced(monkeypatch, model, sample):
    """Step 2a's own samples (size-1 dims at 2, a dim grown to a size a guard rejects) are traced only where eager
    takes them: Triples grown to 7 rows and MonoConv at 2 channels fail in eager, so only the sample is traced (no
    size-oblivious retrace either: the size its guard refuses is one the model needs)."""
    calls = []
    trace_at = DynamoExporter._trace_at
    monkeypatch.setattr(DynamoExporter, "_trace_at", lambda self, m, inputs, *a, **k: calls.append(
        {k: tuple(v.shape) for k, v in inputs.items()}) or trace_at(self, m, inputs, *a, **k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = DynamoExporter().export(model.eval(), sample, config={"dynamic": True})
    assert calls == [{k: tuple(v.shape) for k, v in sample.items()}]
    torch.testing.assert_close(program.module()(**sample), model(**sample))


def test_a_size_where_more_than_unit_guards_break_is_no_size_to_retrace_at():
    """One chunk (a floor division equal to 1) is a 0/1 specialisation a trace at the refused size avoids; a remainder
    compared with 0 (Mamba2 and Florence-2 pad only where a size is not a multiple) or another broken relation is a
    branch whose other side that trace would take: only the size-oblivious retrace is tried for it."""
    from engine.shape_guards import pins_a_unit_size

    one_chunk = {"guards": ["((s1 + ((4 - (s1 % 4)) % 4)) // 4) == 1"], "dims": {"s1": ["x", 1]}}
    padded = {"guards": ["((4 - (s1 % 4)) % 4) > 0"], "dims": {"s1": ["x", 1]}}
    windows = {"guards": [*one_chunk["guards"], "(s1 // 2) == (s1 - (s1 // 2))"], "dims": {"s1": ["x", 1]}}
    assert pins_a_unit_size(one_chunk, {("x", 1): 3}, ("x", 1), 5, only=True)
    assert pins_a_unit_size(padded, {("x", 1): 3}, ("x", 1), 4)
    assert not pins_a_unit_size(padded, {("x", 1): 3}, ("x", 1), 4, only=True)
    assert pins_a_unit_size(windows, {("x", 1): 2}, ("x", 1), 5)
    assert not pins_a_unit_size(windows, {("x", 1): 2}, ("x", 1), 5, only=True)
