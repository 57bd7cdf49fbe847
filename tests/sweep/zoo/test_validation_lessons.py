"""Lessons from a config class's validation error (sweep.zoo.validation_lessons): a sample message and the edit
of the raw tree it yields, and a message that matches no lesson changing nothing."""

from __future__ import annotations

from transformers import LlavaConfig

from sweep.zoo import validation_lessons
from sweep.zoo.config_tree import raw_tree
from tests.sweep.zoo.raised_errors import UNRELATED


def test_an_equality_the_validator_asks_for_sets_the_first_field_to_the_second():
    root = raw_tree(LlavaConfig())
    message = "`text_config.hidden_size` (4096) must equal `vision_config.hidden_size` (32)"
    assert validation_lessons.repair_config(root, message)
    assert root.children["text_config"].args["hidden_size"] == 32
    assert not validation_lessons.repair_config(root, message)  # learned once: nothing left to change


def test_layer_indices_move_onto_the_remaining_layers_in_order():
    root = raw_tree(LlavaConfig())
    message = "`vision_feature_layer` [24, 18] must index the 2 layers of `vision_config`"
    assert validation_lessons.repair_config(root, message)
    assert root.args["vision_feature_layer"] == [1, 0]


def test_a_value_the_validator_pins_is_set_wherever_the_tree_holds_the_value_it_got():
    root = raw_tree(LlavaConfig())
    got = root.children["text_config"].args["hidden_size"]
    assert validation_lessons.repair_config(root, f"ValueError: hidden_size must be 64, got {got}")
    assert root.children["text_config"].args["hidden_size"] == 64


def test_a_token_range_past_the_vocabulary_grows_the_vocabulary_to_its_end():
    root = raw_tree(LlavaConfig())
    message = "The audio token range ends at 266440, beyond the vocabulary (`text_config.vocab_size` = 1024)."
    assert validation_lessons.repair_config(root, message)
    assert root.children["text_config"].args["vocab_size"] == 266440
    assert not validation_lessons.repair_config(root, message)  # learned once


def test_a_validation_message_no_lesson_knows_changes_nothing():
    root = raw_tree(LlavaConfig())
    before = {k: dict(n.args) for k, n in root.children.items()}
    assert not validation_lessons.repair_config(root, UNRELATED)
    assert {k: dict(n.args) for k, n in root.children.items()} == before


def test_equality_repairs_follow_the_validation_message():
    root = raw_tree(LlavaConfig())
    message = "ValueError: `vision_config.hidden_size` (1024) must equal `text_config.hidden_size` (32)."
    assert validation_lessons.repair_config(root, message)
    assert root.children["vision_config"].args["hidden_size"] == 32
    assert not validation_lessons.repair_config(root, message.replace("1024", "32"))  # nothing left to repair
    assert not validation_lessons.repair_config(root, "ValueError: something else")


def test_equality_repairs_read_through_integer_expressions():
    root = raw_tree(LlavaConfig())
    message = "ValueError: `vision_config.hidden_size` (64) must equal `text_config.hidden_size // 4` (8)."
    assert validation_lessons.repair_config(root, message)
    assert root.children["vision_config"].args["hidden_size"] == 8


def test_layer_index_repairs_move_indices_onto_the_tower():
    root = raw_tree(LlavaConfig())
    message = "ValueError: `vision_feature_layer` [24, 18] must index the 2 layers of `vision_config`."
    assert validation_lessons.repair_config(root, message)
    assert root.args["vision_feature_layer"] == [1, 0]


def test_required_values_are_repaired_wherever_the_tree_holds_them():
    root = raw_tree(LlavaConfig())
    root.children["text_config"].args["hidden_size_per_layer_input"] = 256
    assert validation_lessons.repair_config(root, "ValueError: hidden_size_per_layer_input must be 0, got 256")
    assert root.children["text_config"].args["hidden_size_per_layer_input"] == 0
    assert not validation_lessons.repair_config(root, "ValueError: hidden_size_per_layer_input must be 0, got 256")
