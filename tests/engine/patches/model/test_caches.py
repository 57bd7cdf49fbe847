"""A prefill shorter than the conv kernel runs on a program traced longer."""


import pytest
import torch


def test_a_prefill_shorter_than_the_conv_kernel_runs_on_a_longer_trace():
    """Lfm3's short convolution (kernel 7) pads a prefill's conv state only when the prompt is shorter than the
    kernel: without the patch the program traced at 8 tokens refuses 4; with it the program gives eager's hidden
    states and cached conv state at 4, 7 and 12 tokens."""
    from transformers import DynamicCache, Lfm3Config, Lfm3Model

    from engine import DynamoExporter, run_exported
    from engine.errors import InputError
    from engine.patches.registry import patch_disabled

    torch.manual_seed(0)
    config = Lfm3Config(vocab_size=50, pad_token_id=0, bos_token_id=1, eos_token_id=2, hidden_size=32,
                        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=8, layer_types=["conv", "full_attention"])
    model = Lfm3Model(config).eval()
    assert model.layers[0].conv.conv_kernel_size == 7
    sample = {"input_ids": torch.randint(0, 50, (2, 8))}
    with patch_disabled("dynamo", "_patch_prefill_conv_state_padded_whatever_its_length"):
        bounded = DynamoExporter().export(model, sample, {"dynamic": True})
    with pytest.raises(InputError, match="outside the exported bounds"):
        run_exported(bounded, {"input_ids": torch.randint(0, 50, (2, 4))})
    program = DynamoExporter().export(model, sample, {"dynamic": True})
    for length in (4, 7, 12):
        ids = torch.randint(0, 50, (3, length))
        with torch.no_grad():
            expected = model(input_ids=ids, cache=DynamicCache(config=config))
        got = program.module()(input_ids=ids)
        torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state)
        torch.testing.assert_close(got.cache.layers[0].conv_states[0], expected.cache.layers[0].conv_states[0])
