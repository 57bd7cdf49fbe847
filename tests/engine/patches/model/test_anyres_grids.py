"""LLaVA-NeXT's any-resolution tiles (:mod:`engine.patches.model.anyres_grids`): the grid each image picks and its
packed features equal the per-image loops', and the model exports for any image sizes."""

from __future__ import annotations

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.patches.export_checks import assert_exports_and_runs

TILE, PATCH = 16, 4  # tiles of 16 px, 4 x 4 features each
PINPOINTS = [[16, 32], [32, 16], [32, 32], [48, 16], [16, 48]]
IMAGE_TOKEN = 63


@given(sizes=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 400)), min_size=1, max_size=4),
       pinpoints=st.lists(st.tuples(st.sampled_from([16, 32, 48, 64]), st.sampled_from([16, 32, 48, 64])),
                          min_size=1, max_size=6))
@settings(max_examples=60, deadline=None)
def test_best_grids_equal_select_best_resolution(sizes, pinpoints):
    from transformers.image_processing_utils import select_best_resolution

    from engine.patches.model.anyres_grids import best_grids

    rows, cols = best_grids(torch.tensor(sizes), [list(p) for p in pinpoints], TILE)
    expected = [select_best_resolution(size, pinpoints) for size in sizes]
    assert [(r * TILE, c * TILE) for r, c in zip(rows.tolist(), cols.tolist())] == [tuple(e) for e in expected]


@functools.cache
def _tiny_llava_next():
    import transformers as tf

    config = tf.LlavaNextConfig(
        vision_config=tf.CLIPVisionConfig(image_size=TILE, patch_size=PATCH, hidden_size=16, intermediate_size=32,
                                          num_hidden_layers=1, num_attention_heads=2),
        text_config=tf.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=8),
        image_grid_pinpoints=PINPOINTS, image_token_index=IMAGE_TOKEN, vision_feature_layer=-1)
    torch.manual_seed(0)
    model = tf.LlavaNextModel(config).eval()
    model.image_newline.data.normal_()  # (it starts as zeros: a misplaced newline would go unseen)
    return model


def _features(get_image_features, model, pixel_values, image_sizes) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat(list(get_image_features(model, pixel_values, image_sizes).pooler_output))


@given(sizes=st.lists(st.tuples(st.integers(4, 200), st.integers(4, 200)), min_size=1, max_size=3),
       padded=st.booleans(), seed=st.integers(0, 2**16))
@settings(max_examples=20, deadline=None)
def test_packed_tiles_equal_the_per_image_loops(sizes, padded, seed):
    """Each image's grid, unpadded to its aspect ratio, with a newline per row, as tiles padded per image
    (images, 5, ...) or as the images' own tiles one after another."""
    from transformers.models.llava_next.modeling_llava_next import LlavaNextModel, image_size_to_num_patches

    from engine.patches.model.anyres_grids import _patch_anyres_tiles_without_per_image_loops

    model = _tiny_llava_next()
    patched = _patch_anyres_tiles_without_per_image_loops(LlavaNextModel.get_image_features)
    assert patched is not LlavaNextModel.get_image_features
    image_sizes = torch.tensor(sizes)
    pixel_values = torch.randn(len(sizes), 5, 3, TILE, TILE, generator=torch.Generator().manual_seed(seed))
    if not padded:
        counts = [image_size_to_num_patches(size, PINPOINTS, TILE) for size in image_sizes]
        pixel_values = torch.cat([tiles[:count] for tiles, count in zip(pixel_values, counts)])
    expected = _features(LlavaNextModel.get_image_features, model, pixel_values, image_sizes)
    torch.testing.assert_close(_features(patched, model, pixel_values, image_sizes), expected, rtol=1e-6, atol=1e-6)


class _ImageTokens(torch.nn.Module):
    """The model's merged sequence for a prompt whose image tokens match its images' feature counts."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, pixel_values, image_sizes):
        return self.model(input_ids=input_ids, pixel_values=pixel_values, image_sizes=image_sizes).last_hidden_state


def _prompt(model, image_sizes: list, seed: int) -> dict:
    from transformers.models.llava_next.modeling_llava_next import LlavaNextModel

    pixel_values = torch.randn(len(image_sizes), 5, 3, TILE, TILE, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        tokens = len(_features(LlavaNextModel.get_image_features, model, pixel_values, torch.tensor(image_sizes)))
    ids = torch.cat([torch.tensor([[1, 2]]), torch.full((1, tokens), IMAGE_TOKEN), torch.tensor([[3]])], dim=1)
    return {"input_ids": ids, "pixel_values": pixel_values, "image_sizes": torch.tensor(image_sizes)}


def test_a_llava_next_model_exports_for_other_image_sizes():
    """Traced on two square images, the program merges a wide and a tall image (eager's select_best_resolution
    on ``image_sizes.tolist()`` guarded on data-dependent float ratios: GuardOnDataDependentSymNode)."""
    model = _ImageTokens(_tiny_llava_next())
    trace = _prompt(model.model, [[16, 16], [16, 16]], seed=0)
    run = _prompt(model.model, [[20, 60], [70, 30]], seed=1)
    assert run["input_ids"].shape[1] != trace["input_ids"].shape[1]
    assert_exports_and_runs(model, trace, run, "dynamo", tolerance=1e-5)
