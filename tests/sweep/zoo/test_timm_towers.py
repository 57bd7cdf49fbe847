"""A timm tower a config names is shrunk through its ``model_args``, and the configs around it follow its widths."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sweep.zoo import build, timm_towers
from sweep.zoo.profiles import PROFILES

pytest.importorskip("timm", reason="timm is not installed")

TINY = PROFILES[0]


def test_a_vit_tower_takes_the_profiles_width_depth_heads_and_image():
    published = timm_towers.builder_kwargs("vit_pe_core_large_patch14_336")
    assert (published["embed_dim"], published["depth"], published["patch_size"]) == (1024, 24, 14)
    args = timm_towers.shrunk_model_args("vit_pe_core_large_patch14_336", TINY)
    assert (args["embed_dim"], args["depth"], args["num_heads"]) == (TINY.width, 1, 2)
    assert args["img_size"] == TINY.conv_image_size and args["img_size"] // args["patch_size"] == TINY.image_grid
    assert timm_towers.feature_channels("vit_pe_core_large_patch14_336", args) == [TINY.width]


def test_class_defaults_are_shrunk_too_and_the_callers_own_arguments_kept():
    # resnet50's stage channels are ResNet.__init__ defaults, not arguments of the resnet50 entry point
    given = {"features_only": True, "out_indices": [1, 2, 3, 4]}
    args = timm_towers.shrunk_model_args("resnet50", TINY, given)
    assert args["layers"] == (1, 1, 1, 1) and args["channels"] == (TINY.width,) * 4
    assert {k: args[k] for k in given} == given
    old, new = timm_towers.feature_channels("resnet50", given), timm_towers.feature_channels("resnet50", args)
    assert old == [256, 512, 1024, 2048] and len(new) == 4 and max(new) < min(old)


def test_fastvlm_builds_with_its_projector_on_the_towers_width():
    # the tower was built at fastvit_mci3's published width: "mat1 and mat2 shapes cannot be multiplied (2x3072 and 32x32)"
    case = build.build_case("FastVlmModel")
    tower = case.model.vision_tower
    assert case.model.config.vision_config.hidden_size == tower.timm_model.num_features < 3072
    assert case.num_parameters < build.PARAMETER_BUDGET


def test_a_parents_list_of_the_towers_channels_follows_them():
    # EdgeTAM's neck lists repvit_m1's feature channels, deepest first ([384, 192, 96, 48] published)
    case = build.build_case("EdgeTamVisionModel")
    config = case.model.config
    channels = timm_towers.feature_channels("repvit_m1", dict(config.backbone_config.model_args))
    assert list(config.backbone_channel_list) == channels[::-1]


def test_the_timm_step_leaves_a_config_without_a_timm_tower_as_it_was(monkeypatch):
    # it once followed every channel map a second time: PP-DocLayoutV4's encoder_in_channels, already mapped to its
    # backbone's stages, were mapped again (a smaller, other model)
    from sweep.zoo import shrink

    config_class = build.model_class("PPDocLayoutV4Model").config_class
    with_step = shrink.shrink_config(config_class, TINY).to_dict()
    monkeypatch.setattr(shrink, "_shrink_timm_towers", lambda root, profile: None)
    assert shrink.shrink_config(config_class, TINY).to_dict() == with_step


_BLOCK_TYPES = ("er", "uir", "mqa")


@given(st.lists(st.lists(st.sampled_from(_BLOCK_TYPES), min_size=1, max_size=12), min_size=1, max_size=5))
def test_a_block_table_keeps_each_stages_first_block_every_type_and_its_ending(stage_types):
    # MobileNetV5 (Gemma 3n's tower) is a decoded block table: 84 blocks at up to 1280 channels
    stages = [[{"block_type": t, "out_chs": 640, "stride": 2 if i == 0 else 1, **(
        {"num_heads": 12, "key_dim": 64, "value_dim": 64} if t == "mqa" else {})} for i, t in enumerate(types)]
        for types in stage_types]
    shrunk = timm_towers._shrunk_block_args(stages, TINY)
    for old, new in zip(stages, shrunk, strict=True):
        assert new[0]["stride"] == old[0]["stride"] and new[0]["block_type"] == old[0]["block_type"]
        assert [b["block_type"] for b in new[:-1]] == list(dict.fromkeys(b["block_type"] for b in old))[:len(new) - 1]
        assert {b["block_type"] for b in new} == {b["block_type"] for b in old}
        assert new[-1]["block_type"] == old[-1]["block_type"] and len(new) <= len(_BLOCK_TYPES) + 1
        assert all(b["out_chs"] == TINY.width and b.get("num_heads", 2) == 2 for b in new)
    assert stages[0][0]["out_chs"] == 640  # the published table is not modified


def test_gemma3n_builds_its_mobilenet_tower_at_the_tiny_width():
    # the tower was built at its published width: "shape '[2, 32, 256]' is invalid for input of size 1048576"
    args = timm_towers.shrunk_model_args("mobilenetv5_300m_enc", TINY)
    assert [len(stage) for stage in args["block_args"]] == [1, 1, 3, 3]
    assert args["msfa_output_resolution"] == TINY.image_grid
    assert timm_towers.feature_channels("mobilenetv5_300m_enc", args) == [2048]  # MobileNetV5's fixed output width
