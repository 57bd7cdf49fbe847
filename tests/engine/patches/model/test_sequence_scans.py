"""The sequence loops traced as scans compute what the loops compute, for any length."""


import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.mamba.modeling_mamba import mamba_selective_scan

from engine.patches.model.sequence_scans import closed_form_selective_scan
from tests.engine.patches.model.exported_generation import greedy_through_exported_steps


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    channels=st.integers(1, 6),
    state=st.integers(1, 5),
    seq=st.integers(1, 12),
    with_skip=st.booleans(),
    with_gate=st.booleans(),
    last_state=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_closed_form_scan_equals_the_recurrent_loop(batch, channels, state, seq, with_skip, with_gate, last_state, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, channels, seq, generator=g)
    dt = torch.randn(batch, channels, seq, generator=g)
    A = -torch.rand(channels, state, generator=g) * 2  # Mamba's A = -exp(A_log): negative
    B = torch.randn(batch, state, seq, generator=g)
    C = torch.randn(batch, state, seq, generator=g)
    kwargs = dict(
        D=torch.randn(channels, generator=g) if with_skip else None,
        z=torch.randn(batch, channels, seq, generator=g) if with_gate else None,
        delta_bias=torch.randn(channels, generator=g),
        delta_softplus=True,
        return_last_state=last_state,
    )
    expected = mamba_selective_scan(x, dt, A, B, C, **kwargs)  # eager: the recurrent loop
    got = closed_form_selective_scan(x, dt, A, B, C, **kwargs)
    for e, o in zip(expected if last_state else (expected,), got if last_state else (got,)):
        torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-4)


def test_a_returned_recurrent_state_is_fed_to_the_next_step():
    """RWKV takes its ``state`` back each step (generate() does ``model_kwargs["state"] = outputs.state``); the loop
    feeds the step's ``state`` output under that name instead of the captured one. Its WKV recurrence is a Python
    loop over the tokens, so the decode program is the one-token call."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.RwkvConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                           intermediate_size=64, context_length=64)
    model = tf.RwkvForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    components, got, expected = greedy_through_exported_steps(model, inputs)
    assert "state" in components.plan.templates["decode"]
    assert torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"


def _tiny_rwkv():
    from transformers import RwkvConfig, RwkvModel

    torch.manual_seed(0)
    return RwkvModel(RwkvConfig(vocab_size=50, hidden_size=16, attention_hidden_size=16, intermediate_size=32,
                                num_hidden_layers=2, context_length=64)).eval()


def _tiny_recurrent_gemma():
    from transformers import RecurrentGemmaConfig, RecurrentGemmaModel

    torch.manual_seed(0)
    config = RecurrentGemmaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8, lru_width=16,
                                  attention_window_size=16, conv1d_width=4, block_types=["recurrent", "attention"])
    return RecurrentGemmaModel(config).eval()


def _tiny_xlstm():
    from transformers import xLSTMConfig, xLSTMModel

    torch.manual_seed(0)
    # 128 wide: narrower, the config rounds its head dims up and the cache disagrees with the layers
    config = xLSTMConfig(vocab_size=50, hidden_size=128, embedding_dim=128, num_heads=4, num_blocks=2, num_hidden_layers=2)
    return xLSTMModel(config).eval()


@pytest.mark.parametrize("build, patch", [(_tiny_rwkv, "_patch_wkv_time_loop_as_scan"),
                                          (_tiny_recurrent_gemma, "_patch_linear_rnn_time_loop_as_scan"),
                                          (_tiny_xlstm, "_patch_mlstm_time_loop_as_scan")])
def test_a_time_loop_as_a_scan_exports_for_any_length(build, patch):
    """RWKV's WKV recurrence, RecurrentGemma's RG-LRU and xLSTM's mLSTM sequence kernel loop over the sequence in
    Python: without the patch the program, traced at 8 tokens, refuses 5 (the loop was unrolled); with it the
    program runs the traced step as a scan and gives eager's values (the same ops in the same order) at 3, 5 and
    13 tokens."""
    from engine import DynamoExporter, run_exported
    from engine.errors import InputError
    from engine.patches.registry import patch_disabled

    model = build()
    sample = {"input_ids": torch.randint(0, 50, (2, 8))}
    with patch_disabled("dynamo", patch):
        unrolled = DynamoExporter().export(model, sample, {"dynamic": True})
    with pytest.raises(InputError, match="outside the exported bounds"):
        run_exported(unrolled, {"input_ids": torch.randint(0, 50, (2, 5))})
    program = DynamoExporter().export(model, sample, {"dynamic": True})
    assert any(node.target is torch.ops.higher_order.scan for node in program.graph.nodes)
    for length in (3, 5, 13):
        ids = torch.randint(0, 50, (3, length))
        with torch.no_grad():
            expected = model(input_ids=ids).last_hidden_state
        torch.testing.assert_close(program.module()(input_ids=ids).last_hidden_state, expected)


def test_the_time_loop_scans_are_unrolled_for_executorch():
    """ExecuTorch does not run the scan of a dynamic batch: under the ExecuTorch exporter's patches (applied after
    every exporter's) the three recurrences step through :func:`unrolled_scan`; under the others' they scan."""
    import engine.patches.executorch  # noqa: F401  (registers the swap)
    from engine.patches.model import sequence_scans
    from engine.patches.registry import apply_patches

    with apply_patches("dynamo"):
        assert sequence_scans._scan is not sequence_scans.unrolled_scan
        with apply_patches("executorch"):
            assert sequence_scans._scan is sequence_scans.unrolled_scan
    assert sequence_scans._scan is not sequence_scans.unrolled_scan


class _DecayingSums(torch.nn.Module):
    """A recurrence as the patched loops step it: a carry updated per step, an output per step."""

    def forward(self, xs, gates):
        from engine.patches.model.sequence_scans import unrolled_scan

        def step(state, current):
            x, gate = current
            state = torch.sigmoid(gate) * state + x
            return state, state * 2

        return unrolled_scan(step, torch.zeros_like(xs[:, 0]), [xs, gates], dim=1)


def _loop(xs, gates):
    state, outputs = torch.zeros_like(xs[:, 0]), []
    for t in range(xs.shape[1]):
        state = torch.sigmoid(gates[:, t]) * state + xs[:, t]
        outputs.append(state * 2)
    return state, torch.stack(outputs, 1)


@functools.cache
def _unrolled_program():
    sample = (torch.randn(2, 7, 3), torch.randn(2, 7, 3))
    auto = torch.export.Dim.AUTO
    return torch.export.export(_DecayingSums(), sample, dynamic_shapes=({0: auto, 1: auto}, {0: auto, 1: auto}))


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 5), length=st.integers(2, 7), seed=st.integers(0, 2**16))
def test_the_unrolled_scan_equals_the_loop_up_to_the_traced_length(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    xs, gates = torch.randn(batch, length, 3, generator=g), torch.randn(batch, length, 3, generator=g)
    for got, expected in zip(_unrolled_program().module()(xs, gates), _loop(xs, gates)):
        assert torch.equal(got, expected)


def test_the_unrolled_scan_refuses_a_length_past_the_traced_one():
    with pytest.raises(Exception, match="<= 7|length"):
        _unrolled_program().module()(torch.randn(2, 9, 3), torch.randn(2, 9, 3))