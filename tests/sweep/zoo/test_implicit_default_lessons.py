"""Lessons from a forward error about the config (sweep.zoo.implicit_default_lessons): a sample error and the
implicit default it names, and an error that matches no lesson yielding nothing."""

from __future__ import annotations

import pytest
import torch

from sweep.zoo import implicit_default_lessons
from tests.sweep.zoo.raised_errors import UNRELATED, raised, raised_by


@pytest.mark.parametrize("message, implicit", [
    ("ValueError: Could not find a `sliding_window` argument in the config, or it is not set",
     {"sliding_window": implicit_default_lessons.IMPLICIT_WINDOW}),
    ("mat1 and mat2 shapes cannot be multiplied (2x32 and 80x2)",
     {implicit_default_lessons.PROJECTION_WIDTH: (32, 80)}),
    ("split_with_sizes expects split_sizes to sum exactly to 8 (input tensor's size at dimension -1), but got "
     "split_sizes=[16, 24, 24]", {"rope_parameters": {"mrope_section": [2, 3, 3]}}),
    ("mat1 and mat2 shapes cannot be multiplied (2x32 and 80x7)", None),  # a Linear, not two embeddings compared
    (UNRELATED, None),
], ids=["sliding-window", "projection-width", "mrope-sections", "plain-linear", "unrelated"])
def test_a_forward_error_message_yields_the_implicit_default_it_names(message, implicit):
    assert implicit_default_lessons.implicit_default_from_error(message) == implicit


def test_ids_out_of_a_table_that_no_input_holds_raise_the_vocabulary():
    table = torch.nn.Embedding(10, 4)
    given = torch.randint(0, 10, (2, 3))
    exc = raised_by(lambda ids: table(ids * 0 + 17), given)
    lesson = implicit_default_lessons.config_lesson(exc, {"input_ids": given})
    assert lesson == {implicit_default_lessons.VOCAB_AT_LEAST: (10, 18)}
    assert implicit_default_lessons.config_lesson(raised(ValueError(UNRELATED)), {"input_ids": given}) is None
