"""Every lesson of sweep.zoo.lessons: a sample error message and the fix it yields, and a message that matches no
lesson yielding nothing (the caller then reports the error as it is)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, LlavaConfig, T5Config

from sweep.zoo import lessons
from sweep.zoo.config_tree import raw_tree
from sweep.zoo.context import BATCH, Hints
from sweep.zoo.profiles import PROFILES

TINY = PROFILES[0]
UNRELATED = "RuntimeError: something no lesson knows about"


def _raised(fn, *args) -> BaseException:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - a real traceback, as the model would leave
        return exc
    raise AssertionError("no error")


def _raise(exc: BaseException) -> BaseException:
    return _raised(lambda: (_ for _ in ()).throw(exc))


# -- config validation -----------------------------------------------------------------------------------------


def test_an_equality_the_validator_asks_for_sets_the_first_field_to_the_second():
    root = raw_tree(LlavaConfig())
    message = "`text_config.hidden_size` (4096) must equal `vision_config.hidden_size` (32)"
    assert lessons.repair_config(root, message)
    assert root.children["text_config"].args["hidden_size"] == 32
    assert not lessons.repair_config(root, message)  # learned once: nothing left to change


def test_layer_indices_move_onto_the_remaining_layers_in_order():
    root = raw_tree(LlavaConfig())
    assert lessons.repair_config(root, "`vision_feature_layer` [24, 18] must index the 2 layers of `vision_config`")
    assert root.args["vision_feature_layer"] == [1, 0]


def test_a_value_the_validator_pins_is_set_wherever_the_tree_holds_the_value_it_got():
    root = raw_tree(LlavaConfig())
    got = root.children["text_config"].args["hidden_size"]
    assert lessons.repair_config(root, f"ValueError: hidden_size must be 64, got {got}")
    assert root.children["text_config"].args["hidden_size"] == 64


def test_a_token_range_past_the_vocabulary_grows_the_vocabulary_to_its_end():
    root = raw_tree(LlavaConfig())
    message = "The audio token range ends at 266440, beyond the vocabulary (`text_config.vocab_size` = 1024)."
    assert lessons.repair_config(root, message)
    assert root.children["text_config"].args["vocab_size"] == 266440
    assert not lessons.repair_config(root, message)  # learned once


def test_a_validation_message_no_lesson_knows_changes_nothing():
    root = raw_tree(LlavaConfig())
    before = {k: dict(n.args) for k, n in root.children.items()}
    assert not lessons.repair_config(root, UNRELATED)
    assert {k: dict(n.args) for k, n in root.children.items()} == before


# -- model __init__ --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message, config, fix", [
    ("If you want to use `BertLMHeadModel` as a standalone, add `is_decoder=True.`", BertConfig(), {"is_decoder": True}),
    ("T5EncoderModel supports encoder-only configs", T5Config(), {"is_encoder_decoder": False}),
    ("qk_channels (261) must be divisible by num_heads (4)", BertConfig(num_attention_heads=4),
     {"num_attention_heads": 1}),
], ids=["flag", "encoder-only", "heads-divide"])
def test_an_init_error_message_yields_its_config_override(message, config, fix):
    assert lessons.learn_from_init_error(_raise(ValueError(message)), config, TINY) == fix


def test_an_undeclared_attribute_the_model_reads_gets_a_value_by_its_name():
    config = BertConfig()
    exc = _raise(AttributeError("no attribute", name="classifier_dropout_prob", obj=config))
    assert lessons.learn_from_init_error(exc, config, TINY) == {"classifier_dropout_prob": 0.0}


def test_a_flag_the_config_already_has_and_an_unknown_message_teach_nothing():
    assert lessons.required_flag("add `is_decoder=True.`", BertConfig(is_decoder=True)) is None
    assert lessons.learn_from_init_error(_raise(ValueError(UNRELATED)), BertConfig(), TINY) is None


# -- forward, about the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize("message, implicit", [
    ("ValueError: Could not find a `sliding_window` argument in the config, or it is not set",
     {"sliding_window": lessons.IMPLICIT_WINDOW}),
    ("mat1 and mat2 shapes cannot be multiplied (2x32 and 80x2)", {lessons.PROJECTION_WIDTH: (32, 80)}),
    ("split_with_sizes expects split_sizes to sum exactly to 8 (input tensor's size at dimension -1), but got "
     "split_sizes=[16, 24, 24]", {"rope_parameters": {"mrope_section": [2, 3, 3]}}),
    ("mat1 and mat2 shapes cannot be multiplied (2x32 and 80x7)", None),  # a Linear, not two embeddings compared
    (UNRELATED, None),
], ids=["sliding-window", "projection-width", "mrope-sections", "plain-linear", "unrelated"])
def test_a_forward_error_message_yields_the_implicit_default_it_names(message, implicit):
    assert lessons.implicit_default_from_error(message) == implicit


def test_ids_out_of_a_table_that_no_input_holds_raise_the_vocabulary():
    table = torch.nn.Embedding(10, 4)
    given = torch.randint(0, 10, (2, 3))
    exc = _raised(lambda ids: table(ids * 0 + 17), given)
    assert lessons.config_lesson(exc, {"input_ids": given}) == {lessons.VOCAB_AT_LEAST: (10, 18)}
    assert lessons.config_lesson(_raise(ValueError(UNRELATED)), {"input_ids": given}) is None


# -- forward, about the inputs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("message, field, value", [
    ("Image features and image tokens do not match: tokens: 4, features: 10", "image_tokens", 10 // BATCH),
    ("expected `feature_length` to be a multiple of the window (4), but got 10", "frames", 12),
    ("pixel_values has patch width 48 but the model expects 192", "patch_width", 192),
    ("Got 8 image patches for 4 image placeholder tokens", "image_tokens", 8 // BATCH),
    ("Got 8 feature vectors for 32 placeholder tokens (id 1021)", "image_tokens", 8 // BATCH),
    ("Image too small to be scaled with scaled_images_ratios=[0.5, 1.0] when patch_size=16", "image_side", 32),
    ("input_values length 8001 is not a multiple of 320", "samples", 8320),
    ("split_with_sizes expects split_sizes to sum exactly to 2 (input tensor's size at dimension 0), but got "
     "split_sizes=[5, 5]", "tiles", 5),
    ("Given normalized_shape=[80], expected input with shape [*, 80], but got input of size[2, 64, 128]",
     "feature_dim", 80),
], ids=["placeholders", "frames", "patch-width", "patches-for", "vectors-for", "image-side", "samples", "tiles",
        "feature-dim"])
def test_a_models_own_check_teaches_one_hint(message, field, value):
    hints = Hints()
    assert lessons.refine_hints(hints, _raise(ValueError(message)), {})
    assert getattr(hints, field) == value
    assert not lessons.refine_hints(hints, _raise(ValueError(message)), {})  # learned once


def test_image_hints_read_the_pixels_the_candidate_holds():
    hints = Hints()
    pixels = {"pixel_values": torch.zeros(2, 3, 128, 64)}
    assert lessons.refine_hints(hints, _raise(ValueError("Input image size (128*64) doesn't match model (64*64)")),
                                pixels)
    assert hints.image_hw == (64, 64)
    message = "Given input size: (64x1x1). Calculated output size: (64x0x0). Output size is too small"
    assert lessons.refine_hints(hints, _raise(RuntimeError(message)), {"pixel_values": torch.zeros(2, 3, 32, 32)})
    assert hints.image_side == 64


def test_a_conv_teaches_the_channels_of_the_input_it_was_handed():
    conv = torch.nn.Conv1d(4, 8, 3)
    features = torch.randn(2, 3, 50)
    hints = Hints()
    assert lessons.refine_hints(hints, _raised(lambda x: conv(x), features), {"input_features": features})
    assert hints.shapes == {"input_features": (2, 4, 50)}


def test_a_kernel_longer_than_the_input_teaches_a_longer_input():
    conv = torch.nn.Conv1d(1, 1, 10)
    signal = torch.randn(2, 1, 4)
    hints = Hints()
    assert lessons.refine_hints(hints, _raised(lambda x: conv(x), signal), {"input_values": signal})
    assert hints.shapes == {"input_values": (2, 1, 4 * 4 * 3)}


def test_ids_past_an_embedding_bound_that_input():
    table = torch.nn.Embedding(10, 4)
    ids = torch.full((2, 3), 12)
    hints = Hints()
    assert lessons.refine_hints(hints, _raised(lambda x: table(x), ids), {"input_ids": ids})
    assert hints.bounds == {"input_ids": 10}


def test_a_forward_error_no_lesson_knows_leaves_the_hints_alone():
    hints = Hints()
    assert not lessons.refine_hints(hints, _raise(ValueError(UNRELATED)), {"input_ids": torch.zeros(2, 3)})
    assert hints == Hints()


def test_rope_sections_the_modeling_code_assumes_are_rescaled_to_the_shrunk_head_dim():
    """Ernie 4.5 VL reads ``rope_parameters.get("mrope_section", [22, 22, 20])``: sized for head dim 128, it fails
    the tiny model's ``__init__``; the zoo learns the default from the failing function's source."""
    from sweep.zoo import build

    case = build.build_case("Ernie4_5_VLMoeModel")
    text = case.model.config.text_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2


def test_image_vocabulary_maps_name_every_code_as_the_model_parses_it():
    """Chameleon's checkpoints ship the ``vocabulary_map`` its image tokenizer reads; the zoo writes one whose
    codes its mapping class turns back into codebook indices, below the image placeholder."""
    from sweep.zoo import build

    model = build.build_case("ChameleonModel").model
    mapping = model.vocabulary_mapping
    codes = model.vqmodel.quantize.num_embeddings
    assert sorted(mapping.bpe2img.values()) == list(range(codes))
    assert max(mapping.bpe2img) < mapping.image_token_id < model.config.vocab_size
