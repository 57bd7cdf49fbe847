"""Lessons from a model's ``__init__`` error (sweep.zoo.init_lessons): a sample error and the config override it
yields, and an error that matches no lesson yielding nothing."""

from __future__ import annotations

import pytest
from transformers import BertConfig, BitConfig, T5Config

from sweep.zoo import init_lessons
from sweep.zoo.profiles import PROFILES
from tests.sweep.zoo.raised_errors import UNRELATED, raised

TINY = PROFILES[0]


@pytest.mark.parametrize("message, config, fix", [
    ("If you want to use `BertLMHeadModel` as a standalone, add `is_decoder=True.`", BertConfig(), {"is_decoder": True}),
    ("T5EncoderModel supports encoder-only configs", T5Config(), {"is_encoder_decoder": False}),
    ("qk_channels (261) must be divisible by num_heads (4)", BertConfig(num_attention_heads=4),
     {"num_attention_heads": 1}),
    # GroupNorm over Bit's shrunk stem: the group count follows the width, the head counts stay
    ("num_channels (8) must be divisible by num_groups (32)", BitConfig(num_groups=32, embedding_size=8),
     {"num_groups": 8}),
], ids=["flag", "encoder-only", "heads-divide", "groups-divide"])
def test_an_init_error_message_yields_its_config_override(message, config, fix):
    assert init_lessons.learn_from_init_error(raised(ValueError(message)), config, TINY) == fix


def test_an_undeclared_attribute_the_model_reads_gets_a_value_by_its_name():
    config = BertConfig()
    exc = raised(AttributeError("no attribute", name="classifier_dropout_prob", obj=config))
    assert init_lessons.learn_from_init_error(exc, config, TINY) == {"classifier_dropout_prob": 0.0}


def test_a_flag_the_config_already_has_and_an_unknown_message_teach_nothing():
    assert init_lessons.required_flag("add `is_decoder=True.`", BertConfig(is_decoder=True)) is None
    assert init_lessons.learn_from_init_error(raised(ValueError(UNRELATED)), BertConfig(), TINY) is None


def test_rope_sections_the_modeling_code_assumes_are_rescaled_to_the_shrunk_head_dim():
    """Ernie 4.5 VL reads ``rope_parameters.get("mrope_section", [22, 22, 20])``: sized for head dim 128, it fails
    the tiny model's ``__init__``; the zoo learns the default from the failing function's source."""
    from sweep.zoo import build

    case = build.build_case("Ernie4_5_VLMoeModel")
    text = case.model.config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2
