"""The shrinker's rules, and its invariants over randomly drawn source configs."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import (Gemma3TextConfig, LlamaConfig, LlavaConfig, Qwen2VLConfig, Qwen2VLTextConfig,
                          ResNetConfig)

from sweep.zoo import fields, implicit_default_lessons, overrides, profiles, shrink, shrink_rules
from sweep.zoo.config_tree import raw_tree

TINY = profiles.PROFILES[0]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- rules ----------------------------------------------------------------------------------------------------


def test_resample_pattern_keeps_every_layer_type():
    pattern = ["sliding_attention"] * 5 + ["full_attention"]
    assert fields.resample_pattern(pattern * 4, 2) == ["sliding_attention", "full_attention"]
    assert fields.resample_pattern(["a", "b", "c"], 2) == ["a", "b", "c"]  # never drops a type
    assert fields.resample_pattern(["a"] * 10, 3) == ["a", "a", "a"]


def test_proportional_sections_sum_to_the_total():
    assert sum(fields.proportional([16, 24, 24], 4)) == 4
    assert all(s >= 1 for s in fields.proportional([16, 24, 24], 4))


def test_channel_lists_keep_their_ratios_and_a_floor():
    assert shrink_rules.scale_channel_list([256, 512, 1024, 2048], 32, 8) == [8, 16, 32, 64]
    assert shrink_rules.scale_channel_list([3, 64], 2, 8) == [3, 32]  # input channels stay


def test_token_ids_are_remapped_consistently_across_sub_configs():
    root = raw_tree(LlavaConfig())
    mapping = shrink.token_id_map(root, TINY.vocab)
    config = shrink.shrink_config(LlavaConfig)
    assert config.image_token_id < config.text_config.vocab_size
    assert config.image_token_id == mapping[LlavaConfig().image_token_id]


def test_a_token_id_field_an_alias_names_is_remapped():
    """Molmo2's image tokens sit in ``image_patch_id``, which only its ``attribute_map`` (``image_token_id``) says is a
    token id: it is remapped into the shrunk vocabulary with the other special ids, so the embedding holds it."""
    from transformers import Molmo2Config

    assert not fields.is_token_field("image_patch_id")
    assert fields.is_token_field("image_patch_id", Molmo2Config)
    config = shrink.shrink_config(Molmo2Config)
    assert config.image_patch_id < config.text_config.vocab_size
    assert config.image_token_id == config.image_patch_id


def test_derived_fields_are_rederived():
    # head_dim is derived from hidden/heads in the default; it must follow the tiny widths.
    config = shrink.shrink_config(LlamaConfig)
    assert config.head_dim * config.num_attention_heads == config.hidden_size == TINY.width


def test_mrope_sections_sum_to_half_the_head_dim():
    # Qwen2-VL's default config leaves mrope_section out; the modeling code assumes [16, 24, 24] (head_dim 128)
    # and says so in its error, from which the zoo learns it.
    message = ("split_with_sizes expects split_sizes to sum exactly to 4 (input tensor's size at dimension -1), "
               "but got split_sizes=[16, 24, 24]")
    implicit = implicit_default_lessons.implicit_default_from_error(message)
    assert sum(implicit["rope_parameters"]["mrope_section"]) == 4
    config = shrink.shrink_config(Qwen2VLConfig, implicit_defaults=implicit).text_config
    head_dim = config.hidden_size // config.num_attention_heads
    assert sum(config.rope_parameters["mrope_section"]) == head_dim // 2


def test_detector_queries_and_uniform_width_lists_follow_the_profile():
    from transformers import DFineConfig

    config = shrink.shrink_config(DFineConfig)
    assert config.num_queries <= fields.MAX_QUERIES
    assert config.decoder_in_channels == [config.encoder_hidden_dim] * len(config.decoder_in_channels)


def test_moe_configs_without_expert_defaults_get_experts():
    from transformers import Dots1Config

    config = shrink.shrink_config(Dots1Config)
    assert config.n_routed_experts == TINY.experts and config.num_experts_per_tok == TINY.top_k


def test_zero_compute_experts_are_as_few_as_the_real_ones():
    """LongCat-Flash routes to 256 identity experts besides its real ones: each is a branch of the traced graph."""
    from transformers import LongcatFlashConfig

    config = shrink.shrink_config(LongcatFlashConfig)
    assert 0 < config.zero_expert_num <= TINY.experts and config.n_routed_experts == TINY.experts


def test_per_stage_block_counts_are_one_each():
    """Funnel's 4 layers per block, HGNetV2's 3 blocks in a stage of 6 layers each, CvT's 10 blocks in its last
    stage: each repeat is one more copy of a block the graph already has (Funnel's ExecuTorch case: 72 s at [4, 4, 4])."""
    from transformers import CvtConfig, FunnelConfig, HGNetV2Config

    assert shrink.shrink_config(FunnelConfig).block_sizes == [1, 1, 1]
    hgnet = shrink.shrink_config(HGNetV2Config)
    assert hgnet.stage_num_blocks == [1, 1, 1, 1] and hgnet.stage_numb_of_layers == [1, 1, 1, 1]
    assert shrink.shrink_config(CvtConfig).depth == [1, 1, 1]


def test_layer_indices_move_onto_the_remaining_layers():
    from transformers import Qwen3VLMoeConfig

    vision = shrink.shrink_config(Qwen3VLMoeConfig).vision_config
    assert len(vision.deepstack_visual_indexes) == 3
    assert max(vision.deepstack_visual_indexes) < vision.depth <= 3


def test_conv_net_channels_share_one_value_map():
    config = shrink.shrink_config(ResNetConfig)
    assert config.hidden_sizes == sorted(config.hidden_sizes)
    assert max(config.hidden_sizes) <= 64 and all(d == 1 for d in config.depths)


def test_a_default_its_validator_rejects_is_built_unvalidated():
    from transformers import Gemma4AssistantConfig

    with pytest.raises(Exception):
        Gemma4AssistantConfig()
    assert shrink.default_config(Gemma4AssistantConfig).text_config is not None


def test_image_vocabulary_maps_name_every_code_as_the_model_parses_it():
    """Chameleon's checkpoints ship the ``vocabulary_map`` its image tokenizer reads; the zoo writes one whose
    codes its mapping class turns back into codebook indices, below the image placeholder."""
    from sweep.zoo import build

    model = build.build_case("ChameleonModel").model
    mapping = model.vocabulary_mapping
    codes = model.vqmodel.quantize.num_embeddings
    assert sorted(mapping.bpe2img.values()) == list(range(codes))
    assert max(mapping.bpe2img) < mapping.image_token_id < model.config.vocab_size


def test_block_tables_follow_the_channel_map():
    from transformers import PPLCNetV4Config

    config = shrink.shrink_config(PPLCNetV4Config)
    stem_out = config.stem_channels[-1]
    blocks = [block for stage in config.block_configs for block in stage]
    assert blocks[0][1] == stem_out  # the first block takes the stem's channels
    assert all(block[0] == 3 for block in blocks)  # kernels stay
    assert max(block[2] for block in blocks) <= 64


def test_feature_counts_equal_to_a_shrunk_width_follow_it():
    from transformers import ZoeDepthConfig

    config = shrink.shrink_config(ZoeDepthConfig)
    assert config.bottleneck_features == config.fusion_hidden_size < 256


def test_backbone_outputs_a_parent_passed_are_kept():
    from transformers import UperNetConfig

    assert shrink.shrink_config(UperNetConfig).backbone_config.out_features == ["stage1", "stage2", "stage3", "stage4"]


def test_missing_padding_id_is_filled_inside_the_vocab():
    config = shrink.shrink_config(LlamaConfig)
    assert config.pad_token_id is not None and 0 <= config.pad_token_id < config.vocab_size


def test_every_override_has_a_one_line_reason():
    for key, entry in overrides.load().items():
        assert entry["reason"].strip() and "\n" not in entry["reason"].strip(), key


# -- invariants over random source configs --------------------------------------------------------------------


@st.composite
def llama_like(draw):
    heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16, 32, 40, 64]))
    head_dim = draw(st.sampled_from([32, 64, 80, 128]))
    kv = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]))
    vocab = draw(st.integers(1000, 300_000))
    return LlamaConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=kv,
        intermediate_size=draw(st.integers(64, 30_000)), num_hidden_layers=draw(st.integers(1, 96)),
        vocab_size=vocab, bos_token_id=draw(st.integers(0, vocab - 1)), eos_token_id=draw(st.integers(0, vocab - 1)),
        max_position_embeddings=draw(st.sampled_from([512, 2048, 131072])),
    )


@SETTINGS
@given(llama_like())
def test_llama_like_invariants(source):
    config = shrink.shrink_config(type(source), base=source)
    assert config.hidden_size % config.num_attention_heads == 0
    assert config.num_attention_heads % config.num_key_value_heads == 0
    assert config.head_dim * config.num_attention_heads == config.hidden_size
    # the attention class (MHA / GQA / MQA) is kept
    assert (config.num_key_value_heads == config.num_attention_heads) == (
        source.num_key_value_heads == source.num_attention_heads)
    assert (config.num_key_value_heads == 1) == (source.num_key_value_heads == 1) or source.num_attention_heads == 1
    for token in (config.bos_token_id, config.eos_token_id, config.pad_token_id):
        assert token is None or 0 <= token < config.vocab_size
    assert config.num_hidden_layers <= max(TINY.layers, 1) or config.num_hidden_layers <= source.num_hidden_layers
    assert config.hidden_size <= TINY.width and config.vocab_size <= TINY.vocab


@st.composite
def gemma3_like(draw):
    heads = draw(st.sampled_from([2, 4, 8, 16]))
    return Gemma3TextConfig(
        hidden_size=heads * 64, num_attention_heads=heads, num_key_value_heads=draw(st.sampled_from([1, heads])),
        head_dim=64, num_hidden_layers=draw(st.integers(2, 62)),
        sliding_window_pattern=draw(st.integers(2, 8)) if hasattr(Gemma3TextConfig, "sliding_window_pattern") else 6,
    )


@SETTINGS
@given(gemma3_like())
def test_layer_type_lists_match_the_layer_count(source):
    config = shrink.shrink_config(type(source), base=source)
    assert len(config.layer_types) == config.num_hidden_layers
    assert set(config.layer_types) == set(source.layer_types)


@SETTINGS
@given(st.text(alphabet="ME*-", min_size=2, max_size=60))
def test_a_stack_counted_by_its_layer_types_keeps_one_layer_of_each(pattern):
    """NemotronH's stack is its ``layers_block_type`` (from ``hybrid_override_pattern``; ``num_hidden_layers`` is
    unset): it keeps one layer of each type, first seen first (Nemotron3.5-Transcribe's 52 layers became 3)."""
    from transformers import NemotronHConfig

    source = NemotronHConfig(hybrid_override_pattern=pattern)
    config = shrink.shrink_config(type(source), base=source)
    types = list(dict.fromkeys(source.layers_block_type))
    assert config.layers_block_type[: len(types)] == types
    assert len(config.layers_block_type) == min(len(source.layers_block_type), max(len(types), TINY.layers))


@st.composite
def qwen2vl_text_like(draw):
    heads = draw(st.sampled_from([4, 8, 16, 28]))
    head_dim = 128
    a = draw(st.integers(1, 40))
    b = draw(st.integers(1, 40))
    return Qwen2VLTextConfig(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=heads,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                              "mrope_section": [a, b, head_dim // 2 - a - b]}
                             if head_dim // 2 - a - b > 0 else None)


@SETTINGS
@given(qwen2vl_text_like())
def test_multimodal_rope_sections_follow_the_head_dim(source):
    config = shrink.shrink_config(type(source), base=source)
    head_dim = config.hidden_size // config.num_attention_heads
    section = (config.rope_parameters or {}).get("mrope_section")
    if section is not None:
        assert sum(section) == head_dim // 2 and min(section) >= 1


@pytest.mark.parametrize("profile", profiles.PROFILES, ids=lambda p: p.name)
def test_profiles_shrink_llama_under_budget(profile):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(shrink.shrink_config(LlamaConfig, profile))
    assert sum(p.numel() for p in model.parameters()) < 5_000_000


def test_windows_pooled_by_a_downsampling_rate_keep_a_whole_multiple():
    from transformers import GraniteSpeechConfig

    config = shrink.shrink_config(GraniteSpeechConfig)
    assert config.window_size % config.downsample_rate == 0 and config.window_size // config.downsample_rate >= 1


def test_a_channel_ramp_ending_at_a_model_width_ends_at_the_new_width():
    from transformers.models.unlimited_ocr.configuration_unlimited_ocr import UnlimitedOcrConfig

    config = shrink.shrink_config(UnlimitedOcrConfig)
    channels = list(config.vision_config.sam_config.downsample_channels)
    assert channels == [channels[-1] // 2, config.vision_config.encoder_config.hidden_size]


def test_spectrogram_side_and_stage_stem_width_follow_the_model():
    from transformers import ClapAudioConfig

    config = shrink.shrink_config(ClapAudioConfig)
    assert config.spec_size // config.num_mel_bins >= 1  # CLAP's freq_ratio: a side, not a width
    stages = len(config.depths)
    assert config.patch_embeds_hidden_size * 2 ** (stages - 1) == config.hidden_size  # doubled per stage


def test_contrastive_width_mismatch_sets_the_projection_width():
    from transformers import AlignConfig

    message = "mat1 and mat2 shapes cannot be multiplied (2x32 and 80x2)"
    implicit = implicit_default_lessons.implicit_default_from_error(message)
    assert implicit == {implicit_default_lessons.PROJECTION_WIDTH: (32, 80)}
    plain_linear = "mat1 and mat2 shapes cannot be multiplied (2x32 and 80x7)"
    assert implicit_default_lessons.implicit_default_from_error(plain_linear) is None
    config = shrink.shrink_config(AlignConfig, implicit_defaults=implicit)
    assert config.projection_dim == 80


def test_fused_tower_widths_and_codec_encoder_widths_stay_small_and_consistent():
    from transformers import DacConfig, Xcodec2Config

    config = shrink.shrink_config(Xcodec2Config)  # quantization_dim = hidden_size + semantic tower's hidden_size
    assert config.quantization_dim == config.hidden_size + config.semantic_model_config.hidden_size
    assert config.encoder_hidden_size <= profiles.PROFILES[0].min_channel  # doubled at each downsampling ratio
    assert shrink.shrink_config(DacConfig).encoder_hidden_size <= profiles.PROFILES[0].min_channel


def test_lists_naming_every_layer_do_not_pin_the_layer_count():
    """Llama 4 derives ``moe_layers`` = every layer and MistralLarge 4 ``kv_source_layers`` = one per layer:
    both kept 48 and 72 layers before; "every layer" stays every layer of the shrunk stack."""
    from transformers import Llama4TextConfig, MistralLarge4TextConfig

    llama4 = shrink.shrink_config(Llama4TextConfig)
    assert llama4.num_hidden_layers == TINY.layers
    assert list(llama4.moe_layers) == list(range(TINY.layers))
    assert len(llama4.no_rope_layers) == TINY.layers
    mistral = shrink.shrink_config(MistralLarge4TextConfig)
    assert mistral.num_hidden_layers == TINY.layers and len(mistral.kv_source_layers) == TINY.layers


def test_side_stacks_and_time_series_contexts_shrink():
    """A second stack beside the main one (SeamlessM4T's 24-layer speech encoder), a long context walked
    patch by patch (TimesFM 2.5: 16,384 steps) and repeated passes over one stack (HRM) are what made tiny
    models export for minutes."""
    from transformers import HrmTextConfig, SeamlessM4TConfig, TimesFm2_5Config

    seamless = shrink.shrink_config(SeamlessM4TConfig)
    assert seamless.speech_encoder_layers == seamless.t2u_encoder_layers == TINY.layers
    timesfm = shrink.shrink_config(TimesFm2_5Config)
    assert timesfm.context_length == fields.CONTEXT_PATCHES * timesfm.patch_length
    hrm = shrink.shrink_config(HrmTextConfig)
    assert hrm.H_cycles == hrm.L_cycles == 1 and hrm.num_layers_per_stack == TINY.layers


def test_layer_sections_shrink_with_a_stack_whose_remainder_the_config_derives():
    """Dory's pattern (transformers 5.24): input and output sections given, the recurrent middle derived as the
    total minus both; kept at 8 + 8 in a shrunk stack, the middle came out negative and layers ran twice."""
    import dataclasses

    @dataclasses.dataclass(repr=False)
    class SectionedConfig(LlamaConfig):
        model_type = "sectioned-test"
        n_input_layers: int = 8
        n_recurrent_layers: int | None = None
        n_output_layers: int = 8

        def __post_init__(self, **kwargs):
            if self.n_recurrent_layers is None:
                self.n_recurrent_layers = self.num_hidden_layers - self.n_input_layers - self.n_output_layers
            super().__post_init__(**kwargs)

    config = shrink.shrink_config(SectionedConfig)
    sections = (config.n_input_layers, config.n_recurrent_layers, config.n_output_layers)
    assert sections == (1, 1, 1) and config.num_hidden_layers == 3
