"""Experts without the hit loop compute the looped experts' numbers."""


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def _experts(name: str, experts: int):
    """A tiny experts module of each looped kind, its parameters drawn at random."""
    from types import SimpleNamespace

    from transformers.models.dbrx.modeling_dbrx import DbrxExperts
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashExperts
    from transformers.models.step3p7.modeling_step3p7 import Step3p7Experts

    config = SimpleNamespace(hidden_size=6, ffn_hidden_size=5, moe_num_experts=experts, ffn_act_fn={"name": "silu"},
                             expert_ffn_hidden_size=5, n_routed_experts=experts - 1, zero_expert_num=1,
                             hidden_act="silu", num_local_experts=experts, moe_intermediate_size=5)
    module = {"dbrx": DbrxExperts, "longcat_flash": LongcatFlashExperts, "step3p7": Step3p7Experts}[name](config)
    for parameter in module.parameters():
        torch.nn.init.normal_(parameter)
    return module.eval()


@pytest.mark.parametrize("name", ["dbrx", "longcat_flash", "step3p7"])
@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 9), experts=st.integers(2, 6), data=st.data())
def test_dense_expert_mixture_equals_the_looped_experts(name, tokens, experts, data):
    """Every expert on every token, weighted by the token's routing weight to it, equals the loop over the hit
    experts (at 1e-4 relative, the sweep's tolerance: the matmuls see more rows), for random routings."""
    import importlib

    from engine.patches.model import experts as patches

    # Longcat's loop squeezes the top-k dim of its mask (``expert_mask[e].squeeze(0)``): it needs top_k >= 2
    top_k = data.draw(st.integers(2 if name == "longcat_flash" else 1, experts))
    module = _experts(name, experts)
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k)
    hidden = torch.randn(1, tokens, 6) if name == "dbrx" else torch.randn(tokens, 6)
    cls = type(module)
    factory = {"dbrx": patches._patch_hit_loop_over_flat_expert_weights,
               "longcat_flash": patches._patch_hit_loop_with_identity_experts,
               "step3p7": patches._patch_hit_loop_over_gated_expert_projections}[name]
    assert importlib.import_module(cls.__module__) is not None
    with torch.no_grad():
        expected = cls.forward(module, hidden, index, weights)
        got = factory(cls.forward)(module, hidden, index, weights)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_eager_experts_trace_as_batched_mm():
    """The OpenAI privacy filter defaults its decorated experts to the looped ``eager`` implementation; traced with
    ``batched_mm`` instead, its program takes another token count, and the model is ``eager`` again afterwards."""
    from transformers import OpenAIPrivacyFilterConfig, OpenAIPrivacyFilterModel

    from engine import DynamoExporter

    torch.manual_seed(0)
    config = OpenAIPrivacyFilterConfig(hidden_size=16, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                                       vocab_size=50, pad_token_id=0)
    model = OpenAIPrivacyFilterModel(config).eval()
    assert model.config._experts_implementation == "eager"
    program = DynamoExporter().export(model, {"input_ids": torch.randint(0, 50, (2, 8))}, {"dynamic": True})
    assert model.config._experts_implementation == "eager"
    ids = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(input_ids=ids).last_hidden_state, model(ids).last_hidden_state,
                                   rtol=1e-4, atol=1e-4)
