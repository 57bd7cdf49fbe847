"""Forward substitution solves what ``solve_triangular`` solves; gated delta rules export without the loop."""

import re

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.model.triangular_solves import _GATED_DELTA_MODULES, unit_lower_triangular_inverse


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), batch=st.integers(1, 3), columns=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_unit_lower_triangular_inverse_solves_like_torch(n, batch, columns, seed):
    """The series of squares is the forward substitution: same solution as LAPACK's unitriangular solve
    (entries scaled like a gated delta rule's UT system: decays below 1 times normalised key products)."""
    g = torch.Generator().manual_seed(seed)
    matrix = torch.randn(batch, n, n, generator=g, dtype=torch.float64) / n  # diagonal and upper part ignored
    rhs = torch.randn(batch, n, columns, generator=g, dtype=torch.float64)
    expected = torch.linalg.solve_triangular(matrix, rhs, upper=False, unitriangular=True)
    torch.testing.assert_close(unit_lower_triangular_inverse(matrix) @ rhs, expected, atol=1e-10, rtol=1e-10)


def test_gated_delta_modules_use_the_export_flag_only_for_the_solve():
    """``_patch_gated_delta_forward_substitution`` turns ``is_torchdynamo_exporting`` off module-wide: safe only
    while the flag guards nothing but the ``solve_triangular`` branch."""
    import importlib
    import inspect

    for module_name in _GATED_DELTA_MODULES:
        source = inspect.getsource(importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}"))
        uses = re.findall(r"is_torchdynamo_exporting\(\)[^\n]*\n[^\n]*", source)
        assert len(uses) == 1 and "solve_triangular(" in uses[0], (module_name, uses)


def test_exported_gated_delta_rule_has_no_substitution_loop():
    """A 2-layer Qwen3-Next exports with the solve as a few matmuls (no unrolled 63-step loop, no
    ``linalg_solve_triangular`` for ONNX or ExecuTorch to miss) and still computes the eager numbers."""
    from transformers import Qwen3NextConfig, Qwen3NextModel

    from engine import DynamoExporter
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors
    from engine.runtime import run_exported

    config = Qwen3NextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4, num_experts_per_tok=2,
                             layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    model = Qwen3NextModel(config).eval()
    inputs = {"input_ids": torch.randint(0, 128, (2, 8)), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    program = DynamoExporter().export(model, inputs, {"dynamic": True})
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not any("solve_triangular" in t for t in targets)
    assert sum("index_put" in t or "copy_" in t for t in targets) < 10, "the forward substitution was unrolled"
    with torch.no_grad():
        expected = get_leaf_tensors(model(**inputs))
    other = {"input_ids": torch.randint(0, 128, (3, 13)), "attention_mask": torch.ones(3, 13, dtype=torch.long)}
    assert compare_leaves(expected, run_exported(program, inputs)).ok
    with torch.no_grad():
        assert compare_leaves(get_leaf_tensors(model(**other)), run_exported(program, other)).ok
