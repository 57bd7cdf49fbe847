"""Unit tests of the input synthesiser's generic rules (no model builds): recipes and fallback inputs by parameter
name, annotation and config, and the lessons learned from a model's own errors (inputs the message names or the
failing statement finds None, which input the failing operation was handed, learned sizes and tokens)."""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedConfig, cache_utils

from sweep.zoo import implicit_default_lessons, input_lessons, inputs, layouts
from sweep.zoo import modalities as m
from sweep.zoo.context import SEQ, WAVEFORM, Context, Hints, forward_parameters, model_modalities
from sweep.zoo.fallback import fallback
from sweep.zoo.frames import failing_statements


class _Config(PreTrainedConfig):
    model_type = "zoo_test"

    def __init__(self, **kwargs):
        for key in ("hidden_size", "max_state_dim", "freq_size", "speaker_embedding_dim"):
            if key in kwargs:
                setattr(self, key, kwargs.pop(key))
        super().__init__(**kwargs)


class _Parent(PreTrainedConfig):
    model_type = "zoo_test_parent"
    sub_configs = {"high_res_vision_config": _Config}


class _Model(torch.nn.Module):
    def __init__(self, config_class=_Config, **fields):
        super().__init__()
        self.config = config_class(**fields)
        self.freq_emb = torch.nn.Embedding(getattr(self.config, "freq_size", 3), 4)

    def forward(self, input_ids=None, pixel_values=None, high_res_pixel_values=None, bool_masked_pos=None,
                global_attention_mask=None, inputs_embeds=None):
        if pixel_values is not None and high_res_pixel_values is None:
            raise ValueError("Both pixel_values and high_res_pixel_values should be specified at the same time")
        return bool_masked_pos.dim()  # None unless given: "'NoneType' object has no attribute 'dim'"


def _ctx(model: torch.nn.Module, forward=None, **made) -> Context:
    """A recipe context for ``model``, with the parameters of ``forward`` (default: the model's own)."""
    params = ({k: p for k, p in inspect.signature(forward).parameters.items() if k != "self"} if forward
              else forward_parameters(model))
    ctx = Context(config=model.config, model=model, gen=torch.Generator().manual_seed(0), batch=2,
                    hints=Hints(), params=params)
    ctx.made.update(made)
    return ctx


def _raise_inside(fn, *args):
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no error")


def test_required_parameters_are_filled_by_name_annotation_and_config():
    def forward(self, past_values: torch.Tensor, past_values_padding: torch.LongTensor, freq: torch.Tensor,
                state: torch.Tensor, inputs_embeds: torch.Tensor, marks: torch.LongTensor,
                question_type_ids: torch.LongTensor, num_options: torch.LongTensor, speaker_embeddings=None):
        ...

    model = _Model(hidden_size=24, max_state_dim=6, freq_size=3, speaker_embedding_dim=5)
    ctx = _ctx(model, forward)
    ctx.made["past_values"] = torch.randn(2, 16)
    out = fallback(ctx, ["past_values_padding", "freq", "state", "inputs_embeds", "marks", "question_type_ids",
                           "num_options", "speaker_embeddings"])
    assert out["past_values_padding"].shape == (2, 16) and not out["past_values_padding"].any()  # nothing padded
    assert out["freq"].shape == (2, 1) and int(out["freq"].max()) < 3  # indices into the freq_size table
    assert out["state"].shape == (2, 6)  # a vector of the named width (max_state_dim)
    assert out["speaker_embeddings"].shape == (2, 5)  # speaker_embedding_dim
    assert out["inputs_embeds"].shape == (2, SEQ, 24)  # a sequence of the model's width
    assert out["marks"].dtype == torch.long and 1 <= int(out["marks"].min()) and int(out["marks"].max()) < SEQ
    assert not out["question_type_ids"].any() and (out["num_options"] == 1).all()


def test_cutoffs_and_padding_masks_follow_the_input_they_describe():
    def forward(self, input_values, input_values_cutoffs=None, padding_mask=None):
        ...

    ctx = _ctx(_Model(), forward)
    ctx.made["input_values"] = torch.randn(2, 100)
    out = fallback(ctx, ["input_values_cutoffs", "padding_mask"])
    assert out["input_values_cutoffs"].tolist() == [[100], [100]]
    assert out["padding_mask"].shape == (2, 100)


def test_string_modalities_name_one_modality():
    class Audio(torch.nn.Module):
        input_modalities = "audio"

    assert model_modalities(Audio()) == ("audio",)


def test_a_linear_teaches_the_width_of_the_input_it_was_handed():
    linear = torch.nn.Linear(12, 4)
    context = torch.randn(2, 8, 4)
    exc = _raise_inside(lambda x: linear(x), context)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"context_hidden_states": context, "other": torch.randn(2, 8, 4)})
    assert hints.shapes == {"context_hidden_states": (2, 8, 12)}


def test_a_derived_width_scales_with_the_input():
    def subsample(features):  # the last dimension halves on the way to the Linear
        hidden = features[..., ::2]
        return torch.nn.functional.linear(hidden.reshape(2, -1), torch.randn(4, 64))

    features = torch.randn(2, 1, 64)
    exc = _raise_inside(subsample, features)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"audio_mel": features})
    assert hints.shapes == {"audio_mel": (2, 1, 128)}


def test_a_conv_teaches_channels_and_a_signal_gets_samples():
    conv = torch.nn.Conv1d(1, 4, 3)
    hidden = torch.randn(2, 8, 32)
    exc = _raise_inside(lambda x: conv(x), hidden)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"hidden_states": hidden})
    assert hints.shapes == {"hidden_states": (2, 1, WAVEFORM)}


def test_a_norm_handed_a_waveform_teaches_a_hidden_sequence():
    norm = torch.nn.LayerNorm(8)
    waveform = torch.randn(2, WAVEFORM)
    exc = _raise_inside(lambda x: norm(x), waveform)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"input_values": waveform})
    assert hints.shapes == {"input_values": (2, SEQ, 8)}


def test_a_conv_that_takes_a_2d_waveform_for_one_sample_teaches_a_channel_axis():
    conv = torch.nn.Conv1d(1, 4, 3)
    waveform = torch.randn(2, WAVEFORM)
    exc = _raise_inside(lambda x: conv(x), waveform)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"input_values": waveform})
    assert hints.shapes == {"input_values": (2, 1, WAVEFORM)}


def test_branches_concatenated_with_different_frames_align_the_inputs_frames():
    features, mask, waveform = torch.randn(2, 64, 16), torch.ones(2, 64, dtype=torch.long), torch.randn(2, 1, 800)

    def fuse(features, waveform):
        return torch.cat([features.transpose(1, 2), waveform.reshape(2, 32, 25)], dim=1)

    exc = _raise_inside(fuse, features, waveform)
    hints = Hints()
    candidate = {"input_features": features, "input_features_mask": mask, "input_values": waveform}
    assert input_lessons.refine_hints(hints, exc, candidate)
    assert hints.shapes == {"input_features": (2, 25, 16), "input_features_mask": (2, 25)}
    learned = inputs._learned(candidate, hints, torch.Generator().manual_seed(0))
    assert learned["input_features_mask"].shape == (2, 25) and bool((learned["input_features_mask"] == 1).all())


def test_an_embedding_bounds_the_ids_it_was_handed_and_candidates_follow():
    table = torch.nn.Embedding(10, 4)
    ids = torch.arange(16).view(2, 8)
    exc = _raise_inside(lambda x: table(x), ids)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"input_ids": ids})
    assert hints.bounds == {"input_ids": 10}
    learned = inputs._learned({"input_ids": ids}, hints, torch.Generator())
    assert int(learned["input_ids"].max()) < 10


def test_ids_plus_a_codebook_offset_table_get_a_codebook_axis():
    offsets = torch.arange(5)
    ids = torch.zeros(2, 8, dtype=torch.long)
    exc = _raise_inside(lambda x: x + offsets, ids)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"input_ids": ids})
    assert hints.shapes == {"input_ids": (2, 8, 5)}


def test_an_optional_input_the_forward_dereferences_is_added():
    class Padded(_Model):
        def forward(self, input_ids, padding_mask=None):
            return padding_mask.sum()

    model, hints = Padded(), Hints()
    exc = _raise_inside(model, torch.zeros(2, 3))
    assert input_lessons.refine_hints(hints, exc, {"input_ids": torch.zeros(2, 3)}, model)
    assert hints.extra == ("padding_mask",)
    assert not input_lessons.refine_hints(hints, exc, {"input_ids": torch.zeros(2, 3)}, model)  # learned once


def test_placeholders_per_row_are_read_from_the_feature_tensor_of_the_check():
    def check(input_ids, audio_features):
        n_audio_features = audio_features.shape[0]  # the check reports the batch, not the rows
        raise ValueError(f"Audio features and audio tokens do not match, tokens: 2, features: {n_audio_features}")

    exc = _raise_inside(check, torch.zeros(2, 9), torch.randn(2, 7, 32))
    hints = Hints(audio_tokens=1, text_width=32)
    assert input_lessons.refine_hints(hints, exc, {})
    assert hints.audio_tokens == 7


def test_a_parameter_the_message_names_is_added():
    model, hints = _Model(), Hints()
    exc = _raise_inside(lambda: model(pixel_values=torch.zeros(1)))
    assert input_lessons.refine_hints(hints, exc, {"pixel_values": torch.zeros(1)}, model)
    assert hints.extra == ("high_res_pixel_values",)
    # a parameter never synthesised stays out even when named (inputs_embeds)
    assert not input_lessons.refine_hints(hints, ValueError("give input_ids or inputs_embeds"), {"input_ids": 1}, model)


def test_targets_and_flags_the_message_names_stay_out():
    class Flags(_Model):
        def forward(self, pixel_values, codebook_pixel_values=None, mim_labels=None, use_cache: bool = False,
                    speaker_embeddings: torch.FloatTensor | None = None):
            ...

    model, hints = Flags(), Hints()
    exc = ValueError("`codebook_pixel_value` are required to generate `mim_labels` (use_cache, speaker_embeddings)")
    assert input_lessons.refine_hints(hints, exc, {"pixel_values": torch.zeros(1)}, model)
    assert hints.extra == ("codebook_pixel_values", "speaker_embeddings")  # a tensor by name or annotation


def test_a_none_parameter_read_by_the_failing_line_is_added_even_if_usually_skipped():
    model, hints = _Model(), Hints()
    candidate = {"pixel_values": torch.zeros(1), "high_res_pixel_values": torch.zeros(1)}
    exc = _raise_inside(lambda: model(**candidate))
    assert input_lessons.refine_hints(hints, exc, candidate, model)
    assert hints.extra == ("bool_masked_pos",)


def test_a_special_token_every_row_needs_is_learned_from_the_config():
    model, hints = _Model(question_token_id=104), Hints()
    exc = ValueError("All samples in the batch must have at least one question token.")
    assert input_lessons.refine_hints(hints, exc, {}, model)
    assert hints.tokens == (104,)
    ctx = Context(config=model.config, model=model, gen=torch.Generator().manual_seed(0), batch=2, hints=hints,
                    params={})
    assert ((m.input_ids(ctx) == 104).sum(dim=1) == 1).all()


def test_stacked_images_are_scaled_to_what_the_model_wants():
    hints = Hints()
    exc = ValueError("Input image size (128*64) doesn't match model (64*64).")
    assert input_lessons.refine_hints(hints, exc, {"pixel_values": torch.zeros(2, 3, 64, 64)})
    assert hints.image_hw == (32, 64)


def test_prefixed_pixel_values_follow_the_sub_config_named_by_the_prefix():
    model = _Model(_Parent)
    model.config.high_res_vision_config = _Config(image_size=48, num_channels=1)
    ctx = _ctx(model, pixel_values=torch.zeros(2, 3, 16, 16))
    assert m.recipe_for("high_res_pixel_values", ctx)(ctx).shape == (2, 1, 48, 48)
    assert m.recipe_for("prompt_pixel_values", ctx)(ctx).shape == (2, 3, 16, 16)  # no such sub-config


def test_masked_positions_have_the_same_count_in_every_row():
    model = _Model(image_size=32, patch_size=8)
    mask = m.bool_masked_pos(_ctx(model))
    assert mask.shape == (2, 16) and mask.dtype == torch.bool
    assert mask.sum(dim=1).tolist() == [8, 8]


def test_flattened_patches_lead_with_row_and_column():
    model = _Model(patch_embed_hidden_size=12, seq_len=64)
    x = m.flattened_patches(_ctx(model))
    assert x.shape == (2, 16, 14)
    assert x[0, :, :2].min() >= 1 and x[0, -1, :2].tolist() == [4.0, 4.0]


def test_global_attention_on_the_first_token_and_in_the_multiple_choice_layout():
    model = _Model(vocab_size=64)
    ctx = _ctx(model, input_ids=torch.ones(2, 8, dtype=torch.long))
    mask = m.global_attention_mask(ctx)
    assert mask[:, 0].tolist() == [1, 1] and mask[:, 1:].sum() == 0
    assert "global_attention_mask" in layouts.CHOICE_INPUTS


def test_image_rows_fed_to_a_linear_become_flattened_patches_of_its_width():
    hints = Hints()
    exc = RuntimeError("mat1 and mat2 shapes cannot be multiplied (720x120 and 2700x32)")
    assert input_lessons.refine_hints(hints, exc, {"pixel_values": torch.zeros(2, 3, 120, 120)})
    assert hints.patch_width == 2700


def test_feature_vectors_per_placeholder_set_the_image_token_count():
    hints = Hints()
    assert input_lessons.refine_hints(hints, ValueError("Got 8 feature vectors for 32 placeholder tokens (id 1021)"))
    assert hints.image_tokens == 4


def test_height_width_grids_come_with_patchified_pixels():
    class _GridModel(_Model):
        def forward(self, input_ids=None, pixel_values=None, image_grid_hw=None):
            return pixel_values

    model = _GridModel(image_size=16, patch_size=4, num_channels=3)
    ctx = _ctx(model)
    x = m.pixel_values(ctx)
    assert x.shape == (2 * 16, 3 * 4 * 4) and ctx.made["image_grid_hw"].tolist() == [[4, 4], [4, 4]]


def test_an_error_building_the_cache_turns_the_cache_off():
    hints = Hints()
    try:
        cache_utils.get_layer_types_and_kwargs(object())  # a config the cache cannot read
    except Exception as exc:  # noqa: BLE001
        assert input_lessons.refine_hints(hints, exc)
        assert hints.no_cache and not input_lessons.refine_hints(hints, exc)  # learned once
    assert not input_lessons.refine_hints(Hints(), ValueError("elsewhere"))


def test_failing_statements_are_innermost_first_and_whole():
    def inner(x):
        return (x
                .sum())

    exc = _raise_inside(lambda: inner(None))
    frame, first, statement = failing_statements(exc)[0]
    assert frame.f_code.co_name == "inner" and "sum" in statement
    assert failing_statements(exc)[1][0].f_code.co_name == "<lambda>"


def test_ids_the_model_made_itself_past_a_table_raise_that_vocabulary():
    from transformers import ClvpConfig

    from sweep.zoo import shrink

    table = torch.nn.Embedding(10, 4)
    given = torch.randint(0, 10, (2, 3))

    def decode_then_embed(ids):
        return table(ids * 0 + 17)  # ids the model produced (a decoder's argmax), not the input

    exc = _raise_inside(decode_then_embed, given)
    lesson = implicit_default_lessons.config_lesson(exc, {"input_ids": given})
    assert lesson == {implicit_default_lessons.VOCAB_AT_LEAST: (10, 18)}
    past = given + 10  # the input's own ids: the bounds rule's business, not the config's
    assert implicit_default_lessons.config_lesson(_raise_inside(lambda x: table(x), past), {"input_ids": past}) is None
    config = shrink.shrink_config(ClvpConfig, implicit_defaults={implicit_default_lessons.VOCAB_AT_LEAST: (256, 1000)})
    assert config.speech_config.vocab_size == config.decoder_config.vocab_size  # the tree's vocab that holds them


def test_placeholder_scatter_mismatch_teaches_the_count_of_the_modality_it_names():
    def merge(audio_embeds):
        embeds, mask = torch.zeros(2, 4, 8), torch.zeros(2, 4, dtype=torch.bool)
        mask[:, 0] = True
        embeds[mask] = audio_embeds

    exc = _raise_inside(merge, torch.randn(10, 8))
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {})
    assert hints.audio_tokens == 5 and hints.image_tokens is None


def test_a_shared_placeholder_check_takes_the_modality_its_caller_names():
    def check(features):
        raise ValueError(f"Multimodal features and placeholder tokens do not match, tokens: 2, features: {len(features)}")

    def merge(audio_features):
        audio_mask = check(audio_features)
        return audio_mask

    exc = _raise_inside(merge, torch.randn(16, 4))
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {})
    assert hints.audio_tokens == 8 and hints.image_tokens is None


def test_sample_lengths_count_the_waveform_behind_the_features():
    def forward(self, input_features, chunk_sample_lengths):
        ...

    model = _Model()
    model.config.hop_length = 160
    ctx = _ctx(model, forward)
    ctx.made["input_features"] = torch.randn(2, 128, 64)
    assert fallback(ctx, ["chunk_sample_lengths"])["chunk_sample_lengths"].tolist() == [64 * 160] * 2


def test_a_pooling_window_larger_than_the_remaining_image_asks_for_a_larger_image():
    pixels = torch.randn(2, 3, 2, 2)
    exc = _raise_inside(lambda x: torch.nn.functional.avg_pool2d(x, (3, 2)), pixels)
    hints = Hints()
    assert input_lessons.refine_hints(hints, exc, {"pixel_values": pixels})
    assert hints.image_side == 4


def test_merged_token_tiles_and_patch_clips_are_offered_to_the_models_that_take_them():
    """Inkling2 takes one channels-last tile per merged token with its grid counted in merged tokens (and the
    patch grid must hold whole merge blocks); Inkling one channels-last patch clip per image token."""
    from sweep.zoo import build

    case = build.build_case("Inkling2VisionModel")
    config = case.model.config
    side = config.patch_size * config.spatial_merge_size
    assert case.inputs["pixel_values"].shape[1:] == (side, side, config.num_channels)
    assert int(case.inputs["image_grid_thw"].prod(-1).sum()) == case.inputs["pixel_values"].shape[0]
    clips = build.build_case("InklingModel").inputs["pixel_values"]
    vision = build.build_case("InklingModel").model.config.vision_config
    assert clips.shape[1:] == (vision.temporal_patch_size, vision.patch_size, vision.patch_size, vision.num_channels)


def test_a_decoder_over_codebooks_gets_a_row_per_codebook():
    """MusicGen's decoder takes ``input_ids`` as ``(batch * num_codebooks, seq)`` and its mask per sample: the zoo
    stacks a row per codebook (the multiple-choice layout ``(batch, 2, seq)`` ran too, as one sample of 4
    codebooks, and its mask broke the export)."""
    from sweep.zoo.build import build_case

    case = build_case("MusicgenForCausalLM", seed=0)
    ids, mask = case.inputs["input_ids"], case.inputs["attention_mask"]
    assert ids.dim() == 2 and mask.dim() == 2
    assert ids.shape == (mask.shape[0] * case.model.config.num_codebooks, mask.shape[1])


def test_only_a_forward_documenting_num_choices_gets_the_multiple_choice_layout():
    """``(batch, choices, seq)`` ids are for the multiple-choice heads; VibeVoice refuses 2-D ids in a first round for
    its placeholder count, and must not end with 3-D ones, which its eager takes by accident."""
    from sweep.zoo.build import build_case

    assert build_case("BertForMultipleChoice", seed=0).inputs["input_ids"].dim() == 3
    assert build_case("VibeVoiceForConditionalGeneration", seed=0).inputs["input_ids"].dim() == 2
