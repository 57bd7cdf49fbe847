"""The per-parameter recipes (sweep.zoo.modalities) on tiny configs: each sample has the shape, dtype and range the
config implies, and other layouts (sweep.zoo.layouts) keep the sample's values."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (BertConfig, BertModel, InformerConfig, InformerModel, LlavaConfig, PreTrainedConfig,
                          ViTConfig, ViTModel, Wav2Vec2Config, Wav2Vec2Model, WhisperConfig, WhisperModel)

from sweep.zoo import modalities as m
from sweep.zoo.context import BATCH, SEQ, WAVEFORM, Context, Hints, forward_parameters
from sweep.zoo.layouts import alternative_layouts


def _ctx(model: torch.nn.Module, seed: int = 0, hints: Hints | None = None) -> Context:
    return Context(config=model.config, model=model, gen=torch.Generator().manual_seed(seed), batch=BATCH,
                   hints=hints or Hints(), params=forward_parameters(model))


def _make(ctx: Context, *names: str) -> dict[str, torch.Tensor]:
    """The recipes of ``names``, in order (later ones read what earlier ones made)."""
    return {name: m.recipe_for(name, ctx)(ctx) for name in names}


def _bert(**overrides) -> BertModel:
    config = BertConfig(vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32, pad_token_id=0, **overrides)
    return BertModel(config).eval()


def test_text_ids_are_in_the_vocab_avoid_special_ids_and_the_masks_follow_them():
    ctx = _ctx(_bert())
    made = _make(ctx, "input_ids", "attention_mask", "token_type_ids")
    ids = made["input_ids"]
    assert ids.shape == (BATCH, SEQ) and ids.dtype == torch.long
    assert int(ids.min()) >= 3 and int(ids.max()) < 99  # the low ids are left to special tokens
    assert not (ids == 0).any()  # the pad id
    assert torch.equal(made["attention_mask"], torch.ones_like(ids))
    assert torch.equal(made["token_type_ids"], torch.zeros_like(ids))


def test_samples_are_deterministic_for_a_seed_and_differ_across_seeds():
    model = _bert()
    first, again, other = (_make(_ctx(model, seed), "input_ids")["input_ids"] for seed in (0, 0, 1))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_a_text_length_hint_sets_the_sequence_length():
    ctx = _ctx(_bert(), hints=Hints(text_len=5))
    assert m.input_ids(ctx).shape == (BATCH, 5)


def test_image_pixels_take_the_configs_side_and_channels():
    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32)
    ctx = _ctx(ViTModel(config).eval())
    pixels = _make(ctx, "pixel_values")["pixel_values"]
    assert pixels.shape == (BATCH, 3, 32, 32) and pixels.is_floating_point()
    ctx.hints.image_side = 48  # the model asked for another side (multi-scale patching)
    assert m.pixel_values(ctx).shape == (BATCH, 3, 48, 48)


def test_a_bool_mask_over_patches_masks_half_of_them_in_every_row():
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32)
    mask = m.bool_masked_pos(_ctx(ViTModel(config, use_mask_token=True).eval()))
    assert mask.shape == (BATCH, 16) and mask.dtype == torch.bool
    assert mask.sum(dim=1).tolist() == [8, 8]


def test_audio_features_are_mels_by_twice_the_source_positions():
    config = WhisperConfig(vocab_size=99, num_mel_bins=20, d_model=16, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, max_source_positions=12, max_target_positions=16, pad_token_id=1,
                           bos_token_id=2, eos_token_id=2, decoder_start_token_id=2)
    ctx = _ctx(WhisperModel(config).eval())
    made = _make(ctx, "input_features", "decoder_input_ids", "decoder_attention_mask")
    assert made["input_features"].shape == (BATCH, 20, 24) and made["input_features"].is_floating_point()
    decoder = made["decoder_input_ids"]
    assert decoder.shape == (BATCH, SEQ) and (decoder[:, 0] == config.decoder_start_token_id).all()
    assert int(decoder.max()) < 99 and torch.equal(made["decoder_attention_mask"], torch.ones_like(decoder))
    ctx.hints.feature_dim = 20  # the model named the last dimension: (B, T, F)
    assert m.input_features(ctx).shape == (BATCH, 24, 20)


def test_a_waveform_is_batch_by_samples_and_its_layouts_keep_the_values():
    config = Wav2Vec2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(8, 8), conv_kernel=(10, 3), conv_stride=(5, 2),
                            num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2)
    ctx = _ctx(Wav2Vec2Model(config).eval())
    values = _make(ctx, "input_values")["input_values"]
    assert values.shape == (BATCH, WAVEFORM) and values.is_floating_point()
    ctx.hints.samples = 1600  # the model asked for a multiple of its hop
    assert m.input_values(ctx).shape == (BATCH, 1600)
    channels_first = alternative_layouts(ctx, {"input_values": values})[0]["input_values"]
    assert channels_first.shape == (BATCH, 1, WAVEFORM) and torch.equal(channels_first[:, 0], values)


def test_a_time_series_history_is_context_plus_the_largest_lag():
    config = InformerConfig(prediction_length=4, context_length=8, lags_sequence=[1, 2, 3], input_size=1,
                            d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, num_time_features=2)
    ctx = _ctx(InformerModel(config).eval())
    made = _make(ctx, "past_values", "past_observed_mask", "past_time_features")
    assert made["past_values"].shape == (BATCH, 11)
    assert torch.equal(made["past_observed_mask"], torch.ones(BATCH, 11))
    assert made["past_time_features"].shape[:2] == (BATCH, 11) and made["past_time_features"].shape[-1] >= 2


def test_image_placeholders_follow_the_first_token_once_pixels_are_made():
    config = LlavaConfig(image_token_index=90, text_config={"model_type": "llama", "vocab_size": 99},
                         vision_config={"model_type": "clip_vision_model", "image_size": 32, "patch_size": 8})

    class Multimodal(torch.nn.Module):
        input_modalities = ("image", "text")

        def __init__(self):
            super().__init__()
            self.config = config

        def forward(self, input_ids=None, pixel_values=None):
            return input_ids

    ctx = _ctx(Multimodal(), hints=Hints(image_tokens=3))
    made = _make(ctx, "pixel_values", "input_ids")
    assert made["pixel_values"].shape == (BATCH, 3, 32, 32)
    ids = made["input_ids"]
    assert ids.shape == (BATCH, SEQ + 3) and (ids[:, 1:4] == 90).all() and (ids == 90).sum() == 2 * 3


def test_parameters_no_recipe_knows_by_name_have_none():
    ctx = _ctx(_bert())
    assert m.recipe_for("definitely_not_an_input", ctx) is None
    assert m.recipe_for("input_ids", ctx) is m.input_ids


class _Vocab(PreTrainedConfig):
    model_type = "zoo_test_vocab"


@settings(max_examples=40, deadline=None)
@given(vocab=st.integers(min_value=4, max_value=300), specials=st.sets(st.integers(min_value=0, max_value=299),
                                                                       max_size=8))
def test_token_ids_stay_in_the_vocab_and_off_the_special_ids(vocab, specials):
    config = _Vocab()
    for i, token in enumerate(sorted(specials)):
        setattr(config, f"special{i}_token_id", token)
    ctx = Context(config=config, model=torch.nn.Module(), gen=torch.Generator().manual_seed(0), batch=BATCH,
                  hints=Hints(), params={})
    ids = ctx.token_ids((BATCH, SEQ), vocab)
    assert ids.dtype == torch.long and int(ids.min()) >= 0 and int(ids.max()) < vocab
    if set(range(3, vocab)) - specials:  # some ordinary id is left: only ordinary ids are drawn
        assert not set(ids.flatten().tolist()) & specials
