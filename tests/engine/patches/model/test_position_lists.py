"""Positions as tensor arithmetic equal the Python lists they replace, and keep sequence lengths symbolic."""


import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.patches.model.exported_generation import greedy_through_exported_steps


def test_prophetnet_decode_steps_take_any_cache_length():
    """ProphetNet's cached position was ``int(padding_idx + cache length + 1)``, which pinned the exported decode
    step to the traced cache length: the second generated token was rejected. Its decode step also asserts one
    token per cached step, so the program is the one-token call (engine.generation.decompose's fallback)."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.ProphetNetConfig(vocab_size=64, hidden_size=32, encoder_ffn_dim=32, decoder_ffn_dim=32, num_encoder_layers=1,
                                 num_decoder_layers=1, num_encoder_attention_heads=2, num_decoder_attention_heads=2, ngram=2,
                                 num_buckets=8, relative_max_distance=16, max_position_embeddings=64, is_decoder=True,
                                 add_cross_attention=False)
    model = tf.ProphetNetForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    components, got, expected = greedy_through_exported_steps(model, inputs)
    assert components.plan.templates["decode"]["input_ids"].shape[1] == 1
    assert torch.equal(got, expected), f"\neager:    {expected}\nexported: {got}"


@settings(max_examples=25, deadline=None)
@given(
    axial=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    dims=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    batch=st.integers(1, 4),
    data=st.data(),
)
def test_axial_positions_as_one_gather_equal_the_per_sample_selection(axial, dims, batch, data):
    """Reformer's eval axial position embeddings: one index of the whole grid selects each sample's rows as the
    per-sample ``index_select`` of the cut grid does, for any position ids below the grid size."""
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import AxialPositionEmbeddings

    from engine.patches.model.position_lists import _patch_axial_positions_as_one_gather

    seq = data.draw(st.integers(1, axial[0] * axial[1]))
    ids = torch.tensor(data.draw(st.lists(st.lists(st.integers(0, axial[0] * axial[1] - 1), min_size=seq, max_size=seq),
                                          min_size=batch, max_size=batch)))
    config = ReformerConfig(axial_pos_shape=list(axial), axial_pos_embds_dim=list(dims), hidden_size=sum(dims),
                            attn_layers=["local"], local_attn_chunk_length=1)
    module = AxialPositionEmbeddings(config).eval()
    for weight in module.weights:
        torch.nn.init.normal_(weight)
    patched = _patch_axial_positions_as_one_gather(AxialPositionEmbeddings.forward)
    assert torch.equal(patched(module, ids), AxialPositionEmbeddings.forward(module, ids))


def test_axial_positions_export_with_any_batch():
    """Without the patch the per-sample loop pins the batch to the traced one (the exported program rejects 3)."""
    from transformers import ReformerConfig
    from transformers.models.reformer.modeling_reformer import AxialPositionEmbeddings

    from engine.patches.registry import apply_patches

    config = ReformerConfig(axial_pos_shape=[4, 4], axial_pos_embds_dim=[2, 3], hidden_size=5,
                            attn_layers=["local"], local_attn_chunk_length=1)
    module = AxialPositionEmbeddings(config).eval()
    ids = torch.arange(6).expand(2, 6)
    batch = torch.export.Dim("batch", min=1, max=8)
    with apply_patches("dynamo"):
        program = torch.export.export(module, (ids,), dynamic_shapes=({0: batch},), strict=False)
    other = torch.tensor([[3, 1, 0, 4, 4, 9], [15, 2, 2, 0, 1, 1], [7, 7, 8, 12, 13, 14]])
    assert torch.equal(program.module()(other), module(other))


def _funnel_config(separate_cls: bool, truncate_seq: bool, blocks: int):
    from transformers import FunnelConfig

    return FunnelConfig(block_sizes=[1] * blocks, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=50,
                        separate_cls=separate_cls, truncate_seq=truncate_seq, num_decoder_layers=1)


@settings(max_examples=60, deadline=None)
@given(separate_cls=st.booleans(), truncate_seq=st.booleans(), blocks=st.integers(1, 4), seq=st.integers(1, 40))
def test_funnel_positions_pool_and_measure_as_the_lists(separate_cls, truncate_seq, blocks, seq):
    """The pooled position lists described by first/last/count give the relative-position aranges the lists give,
    block after block."""
    from transformers.models.funnel.modeling_funnel import FunnelAttentionStructure

    from engine.patches.model.position_lists import ArithmeticPositions, _patch_stride_pooled_positions, _patch_relative_positions_as_arithmetic

    structure = FunnelAttentionStructure(_funnel_config(separate_cls, truncate_seq, blocks))
    pool = _patch_stride_pooled_positions(FunnelAttentionStructure.stride_pool_pos)
    relative = _patch_relative_positions_as_arithmetic(FunnelAttentionStructure.relative_pos)
    as_list, described = list(range(seq)), ArithmeticPositions(0, 1, seq)
    for block_index in range(blocks):
        if block_index > 0:
            pooled_list, pooled = structure.stride_pool_pos(as_list, block_index), pool(structure, described, block_index)
            if not pooled_list or not as_list:
                return  # eager's gather fails on an empty list: nothing to compare
            expected = structure.relative_pos(as_list, 2 ** (block_index - 1), pooled_list, shift=2)
            assert torch.equal(relative(structure, described, 2 ** (block_index - 1), pooled, shift=2), expected)
            as_list, described = pooled_list, pooled
        assert described.size == len(as_list)
        assert torch.equal(relative(structure, described, 2**block_index), structure.relative_pos(as_list, 2**block_index))


def test_funnel_exports_with_any_sequence_length():
    """Funnel (relative-shift attention, 3 pooling blocks, decoder upsampling): without the patches the program
    accepts 8 tokens only; with them, traced at 8, it computes eager's numbers at 5, 9 and 12, and the patched
    gathers equal the reshapes they replace in eager on every length the model accepts."""
    from transformers import FunnelModel

    from engine import DynamoExporter
    from engine.patches.registry import apply_patches

    for separate_cls, truncate_seq in ((True, True), (False, False)):
        torch.manual_seed(0)
        model = FunnelModel(_funnel_config(separate_cls, truncate_seq, 3)).eval()
        for seq in range(5, 17):
            ids = torch.randint(0, 50, (2, seq))
            with torch.no_grad():
                expected = model(ids).last_hidden_state
                with apply_patches("dynamo"):
                    assert torch.equal(model(ids).last_hidden_state, expected), seq
    program = DynamoExporter().export(model, {"input_ids": torch.randint(0, 50, (2, 8))}, {"dynamic": True})
    for seq in (5, 9, 12):
        ids = torch.randint(0, 50, (3, seq))
        with torch.no_grad():
            assert torch.allclose(program.module()(input_ids=ids).last_hidden_state, model(ids).last_hidden_state,
                                  atol=1e-5), seq


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 3), prompt=st.integers(0, 4), extra=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_cpmant_mask_with_arange_equals_the_list_one(batch, prompt, extra, seed):
    """CpmAnt's attention mask with the descending positions from ``torch.arange`` equals the one built from a
    reversed Python list, for any padding lengths, spans and contexts."""
    from types import SimpleNamespace

    from transformers.models.cpmant.modeling_cpmant import CpmAntModel

    from engine.patches.model.position_lists import _patch_descending_positions_as_arange

    g = torch.Generator().manual_seed(seed)
    seqlen = prompt + extra
    owner = SimpleNamespace(prompt_length=prompt)
    input_ids = torch.zeros(batch, seqlen, dtype=torch.long)
    span = torch.randint(0, 2, (batch, seqlen), generator=g)
    context = torch.randint(0, 2, (batch, seqlen), generator=g).bool()
    length = torch.randint(0, extra + 1, (batch,), generator=g)
    patched = _patch_descending_positions_as_arange(CpmAntModel._prepare_attention_mask)
    expected = CpmAntModel._prepare_attention_mask(owner, input_ids, span, context, length)
    assert torch.equal(patched(owner, input_ids, span, context, length), expected)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9), st.integers(0, 2**16))
def test_relative_shift_equals_the_pad_and_view_trick(length, seed):
    from transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer import FastSpeech2ConformerAttention

    from engine.patches.model.position_lists import relative_shift

    scores = torch.randn(2, 3, length, 2 * length - 1, generator=torch.Generator().manual_seed(seed))
    expected = FastSpeech2ConformerAttention.shift_relative_position_tensor(None, scores)
    torch.testing.assert_close(relative_shift(scores), expected, rtol=0, atol=0)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 12))
def test_relative_positions_for_the_length_equal_the_table_slice(length):
    """The encoding built for the length holds the 5,000-position table's slice around its centre."""
    from transformers import FastSpeech2ConformerConfig
    from transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer import (
        FastSpeech2ConformerRelPositionalEncoding,
    )

    from engine.patches.model.position_lists import _patch_relative_positions_for_the_length

    config = FastSpeech2ConformerConfig(hidden_size=8)
    module = FastSpeech2ConformerRelPositionalEncoding(config, {"positional_dropout_rate": 0.0}).eval()
    forward = _patch_relative_positions_for_the_length(type(module).forward)
    features = torch.randn(2, length, 8)
    for got, expected in zip(forward(module, features), module(features)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
