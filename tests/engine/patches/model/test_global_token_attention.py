"""Longformer's global attention over every position as a slot computes the model's own numbers, and exports."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.model.global_token_attention import global_slots


def _longformer(window: int = 4, layers: int = 2):
    from transformers import LongformerConfig, LongformerModel

    torch.manual_seed(0)
    config = LongformerConfig(vocab_size=50, hidden_size=16, num_attention_heads=2,
                              intermediate_size=32, attention_window=window, max_position_embeddings=64,
                              num_hidden_layers=layers)
    return LongformerModel(config).eval()


def _led():
    from transformers import LEDConfig, LEDModel

    torch.manual_seed(0)
    config = LEDConfig(vocab_size=50, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                       decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, attention_window=4,
                       max_encoder_position_embeddings=64, max_decoder_position_embeddings=64)
    return LEDModel(config).eval()


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.lists(st.booleans(), min_size=1, max_size=12), min_size=1, max_size=3))
def test_slots_hold_each_rows_global_tokens_in_order(rows):
    """Slot j of a row is its j-th global position, the valid slots are as many as its global tokens, and each
    global token's rank is its slot: what the model's nonzero() gathers and scatters."""
    length = max(len(r) for r in rows)
    flags = torch.tensor([r + [False] * (length - len(r)) for r in rows])
    order, valid, rank = global_slots(flags)
    for b, row in enumerate(flags.tolist()):
        positions = [p for p, g in enumerate(row) if g]
        assert valid[b].tolist() == [j < len(positions) for j in range(length)]
        assert order[b, : len(positions)].tolist() == positions
        assert ((order[b] >= 0) & (order[b] < length)).all()
        assert [rank[b, p].item() for p in positions] == list(range(len(positions)))


@settings(max_examples=15, deadline=None)
@given(data=st.data(), batch=st.integers(1, 3), seq=st.integers(1, 14), led=st.booleans())
def test_every_slot_path_equals_the_models_global_attention(data, batch, seq, led):
    """Random global tokens (none, some, all; other counts per row) and right padding: the patched encoder's
    hidden states equal the model's own (nonzero-gathered) path within 1e-5."""
    from engine.patches.registry import apply_patches

    model = _led() if led else _longformer()
    ids = torch.randint(2, 50, (batch, seq))
    lengths = data.draw(st.lists(st.integers(1, seq), min_size=batch, max_size=batch))
    attention = (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()
    flags = data.draw(st.lists(st.lists(st.booleans(), min_size=seq, max_size=seq), min_size=batch, max_size=batch))
    global_mask = torch.tensor(flags).long() * attention
    inputs = {"input_ids": ids, "attention_mask": attention, "global_attention_mask": global_mask}
    encoder = model.encoder if led else model
    with torch.no_grad():
        expected = encoder(**inputs).last_hidden_state
        with apply_patches("dynamo"):
            got = encoder(**inputs).last_hidden_state
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _inputs(batch, seq, global_positions):
    mask = torch.zeros(batch, seq, dtype=torch.long)
    for b, positions in enumerate(global_positions):
        mask[b, positions] = 1
    return {"input_ids": torch.randint(2, 50, (batch, seq)), "attention_mask": torch.ones(batch, seq, dtype=torch.long),
            "global_attention_mask": mask}


def test_longformer_exports_with_any_global_tokens():
    """Traced with one global token per row at a length the window pads, the program computes eager's numbers for
    other padded lengths, batches and global tokens (none in a row, three in another); the model's own path fails
    to export (a guard on data). A length that needs no padding is refused by name: the sliced-off padding's
    layout probe guards ``pad != 0`` (pytorch/pytorch#165032)."""
    from engine import DynamoExporter
    from engine.errors import ExportStageError
    from engine.patches.registry import patch_disabled

    model = _longformer()
    traced = _inputs(2, 7, [[0], [0]])  # padded to the 4-token window
    with patch_disabled("dynamo", "_patch_global_attention_over_every_slot"), \
            pytest.raises(ExportStageError, match="GuardOnDataDependentSymNode"):
        DynamoExporter().export(model, traced, {"dynamic": True})
    program = DynamoExporter().export(model, traced, {"dynamic": True})
    for inputs in (_inputs(3, 11, [[0], [], [1, 4, 9]]), _inputs(2, 5, [[0, 1, 2, 3, 4], [2]]),
                   _inputs(1, 9, [[1]])):
        with torch.no_grad():
            torch.testing.assert_close(program.module()(**inputs).last_hidden_state,
                                       model(**inputs).last_hidden_state, atol=1e-4, rtol=1e-4)
    with pytest.raises(AssertionError, match="Guard failed"):
        program.module()(**_inputs(2, 12, [[3], [0, 11]]))


def test_window_chunks_by_unfold_run_exactly_on_onnx():
    """The overlapping chunks cut by unfold give onnxruntime eager's numbers (the as_strided chunks gave other
    values on onnx and executorch, with dynamo exact)."""
    pytest.importorskip("onnxruntime")
    from engine import OnnxExporter, run_exported

    model = _longformer(layers=1)  # the chunks are cut in each layer alike; one keeps the ONNX export short
    program = OnnxExporter().export(model, _inputs(2, 7, [[0], [3]]), {"dynamic": True})
    inputs = _inputs(3, 10, [[0], [], [2, 7]])
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    torch.testing.assert_close(run_exported(program, inputs)["last_hidden_state"], expected, atol=1e-4, rtol=1e-4)
