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
    ), max_leaves=6)


@settings(max_examples=200, deadline=None)
@given(left=_exprs(), right=_exprs(), relation=st.sampled_from([sympy.Eq, sympy.Ne, sympy.Ge, sympy.Lt]),
       s=st.integers(0, 40), t=st.integers(0, 40))
def test_a_recorded_guard_evaluates_as_sympy_does(left, right, relation, s, t):
    expr = relation(left, right, evaluate=False)
    sizes = {S: sympy.Integer(s), T: sympy.Integer(t)}
    expected = bool(relation(left.xreplace(sizes), right.xreplace(sizes)))
    assert holds(PythonPrinter().doprint(expr), {"s0": s, "s1": t}) is expected


@pytest.mark.parametrize("code", ["__import__('os').system('true')", "(1).__class__", "s0 / 2 > 1", "max(s0, 1) > 0",
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
    """Mamba2 traced at 7 tokens, below its chunk of 8: the trace keeps one chunk."""
    torch.manual_seed(0)
    config = tf.Mamba2Config(vocab_size=96, hidden_size=32, num_hidden_layers=1, state_size=8, expand=2, head_dim=8,
                             n_groups=1, chunk_size=8, num_heads=8)
    return tf.Mamba2ForCausalLM(config).eval(), {"input_ids": torch.randint(0, 96, (2, 7))}


@pytest.mark.parametrize("backend", ["dynamo", "onnx", "executorch"])
def test_mamba2_traced_below_a_chunk_states_the_bound_and_refuses_longer_inputs_by_name(mamba2, backend):
    from engine.exporter_executorch import ExecutorchExporter

    model, inputs = mamba2
    exporter, config = {"dynamo": (DynamoExporter(), {"dynamic": True}), "onnx": (OnnxExporter(), {"dynamic": True}),
                        "executorch": (ExecutorchExporter(), ExecutorchConfig(dynamic=True))}[backend]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = exporter.export(model, inputs, config=config)
    stated = [str(w.message) for w in caught if issubclass(w.category, ShapeGuardWarning)]
    assert len(stated) == 1 and "input_ids dim 1 (traced 7) rejects 8" in stated[0], stated
    shorter = {"input_ids": torch.randint(0, 96, (2, 5))}
    with torch.no_grad():
        expected = model(**shorter).logits
    torch.testing.assert_close(run_exported(program, shorter)["logits"], expected, atol=1e-4, rtol=1e-4)
    # above one chunk: a named InputError on every backend (onnxruntime's invalid Expand, ExecuTorch's 0x12 before)
    with pytest.raises(InputError, match=r"input_ids dim 1"):
        run_exported(program, {"input_ids": torch.randint(0, 96, (2, 12))})
