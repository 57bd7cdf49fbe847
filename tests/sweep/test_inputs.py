"""Input synthesis: recipes by parameter name and what the zoo learns from the model's own errors (no model builds)."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig

from sweep import inputs
from sweep import modalities as m


class _Config(PretrainedConfig):
    model_type = "zoo_test"


class _Parent(PretrainedConfig):
    model_type = "zoo_test_parent"
    sub_configs = {"high_res_vision_config": _Config}


class _Model(torch.nn.Module):
    def __init__(self, config_class=_Config, **fields):
        super().__init__()
        self.config = config_class(**fields)

    def forward(self, input_ids=None, pixel_values=None, high_res_pixel_values=None, bool_masked_pos=None,
                global_attention_mask=None, inputs_embeds=None):
        if pixel_values is not None and high_res_pixel_values is None:
            raise ValueError("Both pixel_values and high_res_pixel_values should be specified at the same time")
        return bool_masked_pos.dim()  # None unless given: "'NoneType' object has no attribute 'dim'"


def _error(fn) -> BaseException:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("no error")


def test_a_parameter_the_message_names_is_added():
    model, hints = _Model(), inputs.Hints()
    exc = _error(lambda: model(pixel_values=torch.zeros(1)))
    assert inputs.refine_hints(hints, exc, {"pixel_values": torch.zeros(1)}, model)
    assert hints.extra == ("high_res_pixel_values",)
    # a parameter never synthesised stays out even when named (inputs_embeds)
    assert not inputs.refine_hints(hints, ValueError("give input_ids or inputs_embeds"), {"input_ids": 1}, model)


def test_a_none_parameter_read_by_the_failing_line_is_added_even_if_usually_skipped():
    model, hints = _Model(), inputs.Hints()
    candidate = {"pixel_values": torch.zeros(1), "high_res_pixel_values": torch.zeros(1)}
    exc = _error(lambda: model(**candidate))
    assert inputs.refine_hints(hints, exc, candidate, model)
    assert hints.extra == ("bool_masked_pos",)


def test_a_special_token_every_row_needs_is_learned_from_the_config():
    model, hints = _Model(question_token_id=104), inputs.Hints()
    exc = ValueError("All samples in the batch must have at least one question token.")
    assert inputs.refine_hints(hints, exc, {}, model)
    assert hints.tokens == (104,)
    ctx = m.Context(config=model.config, model=model, gen=torch.Generator().manual_seed(0), batch=2, hints=hints,
                    params={})
    assert ((m.input_ids(ctx) == 104).sum(dim=1) == 1).all()


def test_stacked_images_are_scaled_to_what_the_model_wants():
    hints = inputs.Hints()
    exc = ValueError("Input image size (128*64) doesn't match model (64*64).")
    assert inputs.refine_hints(hints, exc, {"pixel_values": torch.zeros(2, 3, 64, 64)})
    assert hints.image_hw == (32, 64)


def _ctx(model, **made):
    ctx = m.Context(config=model.config, model=model, gen=torch.Generator().manual_seed(0), batch=2,
                    hints=inputs.Hints(), params=inputs.forward_parameters(model))
    ctx.made.update(made)
    return ctx


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
    assert "global_attention_mask" in m.CHOICE_INPUTS


def test_image_rows_fed_to_a_linear_become_flattened_patches_of_its_width():
    hints = inputs.Hints()
    exc = RuntimeError("mat1 and mat2 shapes cannot be multiplied (720x120 and 2700x32)")
    assert inputs.refine_hints(hints, exc, {"pixel_values": torch.zeros(2, 3, 120, 120)})
    assert hints.patch_width == 2700


def test_feature_vectors_per_placeholder_set_the_image_token_count():
    hints = inputs.Hints()
    assert inputs.refine_hints(hints, ValueError("Got 8 feature vectors for 32 placeholder tokens (id 1021)"))
    assert hints.image_tokens == 4


def test_height_width_grids_come_with_patchified_pixels():
    class _GridModel(_Model):
        def forward(self, input_ids=None, pixel_values=None, image_grid_hw=None):
            return pixel_values

    model = _GridModel(image_size=16, patch_size=4, num_channels=3)
    ctx = _ctx(model)
    x = m.pixel_values(ctx)
    assert x.shape == (2 * 16, 3 * 4 * 4) and ctx.made["image_grid_hw"].tolist() == [[4, 4], [4, 4]]
