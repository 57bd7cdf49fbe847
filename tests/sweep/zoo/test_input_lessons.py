"""Lessons from a forward error about the inputs (sweep.zoo.input_lessons): a sample error and the hint it
teaches, and an error that matches no lesson leaving the hints alone."""

from __future__ import annotations

import pytest
import torch

from sweep.zoo import input_lessons
from sweep.zoo.context import BATCH, Hints
from tests.sweep.zoo.raised_errors import UNRELATED, raised, raised_by


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
    assert input_lessons.refine_hints(hints, raised(ValueError(message)), {})
    assert getattr(hints, field) == value
    assert not input_lessons.refine_hints(hints, raised(ValueError(message)), {})  # learned once


def test_image_hints_read_the_pixels_the_candidate_holds():
    hints = Hints()
    pixels = {"pixel_values": torch.zeros(2, 3, 128, 64)}
    exc = raised(ValueError("Input image size (128*64) doesn't match model (64*64)"))
    assert input_lessons.refine_hints(hints, exc, pixels)
    assert hints.image_hw == (64, 64)
    message = "Given input size: (64x1x1). Calculated output size: (64x0x0). Output size is too small"
    assert input_lessons.refine_hints(hints, raised(RuntimeError(message)), {"pixel_values": torch.zeros(2, 3, 32, 32)})
    assert hints.image_side == 64


def test_a_conv_teaches_the_channels_of_the_input_it_was_handed():
    conv = torch.nn.Conv1d(4, 8, 3)
    features = torch.randn(2, 3, 50)
    hints = Hints()
    assert input_lessons.refine_hints(hints, raised_by(lambda x: conv(x), features), {"input_features": features})
    assert hints.shapes == {"input_features": (2, 4, 50)}


def test_a_kernel_longer_than_the_input_teaches_a_longer_input():
    conv = torch.nn.Conv1d(1, 1, 10)
    signal = torch.randn(2, 1, 4)
    hints = Hints()
    assert input_lessons.refine_hints(hints, raised_by(lambda x: conv(x), signal), {"input_values": signal})
    assert hints.shapes == {"input_values": (2, 1, 4 * 4 * 3)}


def test_ids_past_an_embedding_bound_that_input():
    table = torch.nn.Embedding(10, 4)
    ids = torch.full((2, 3), 12)
    hints = Hints()
    assert input_lessons.refine_hints(hints, raised_by(lambda x: table(x), ids), {"input_ids": ids})
    assert hints.bounds == {"input_ids": 10}


def test_a_forward_error_no_lesson_knows_leaves_the_hints_alone():
    hints = Hints()
    assert not input_lessons.refine_hints(hints, raised(ValueError(UNRELATED)), {"input_ids": torch.zeros(2, 3)})
    assert hints == Hints()


def test_a_mask_the_model_fills_with_is_given_as_booleans():
    # Gemma 3n negates input_features_mask (``~mask`` of ones is -2, not a mask) and fills with it
    mask, text_mask = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    hints = Hints()
    failing = raised_by(lambda m: torch.zeros(2, 5).masked_fill(~m, 0.0), mask)
    candidate = {"input_features_mask": mask, "attention_mask": text_mask}
    assert input_lessons.refine_hints(hints, failing, candidate)
    assert hints.bool_masks == ("input_features_mask",)  # the text attention mask stays a count mask
    assert not input_lessons.refine_hints(hints, failing, candidate)  # learned once
