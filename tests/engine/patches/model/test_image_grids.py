"""Per-image loops over image grids computed per packed position (engine.patches.model.image_grids): each rewrite
against the loop it replaces, and exported for other numbers and sizes of images."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine.patches.export_checks import assert_exports_and_runs


def _tiny_pixtral():
    from transformers import PixtralVisionConfig, PixtralVisionModel

    config = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 head_dim=8, image_size=32, patch_size=4, attn_implementation="sdpa")
    torch.manual_seed(0)
    return PixtralVisionModel(config).eval()


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 6)), min_size=1, max_size=3), st.booleans())
def test_packed_crops_equal_the_per_image_loop(grids, sizes_given):
    """The recompiled forward's packed path gives the per-image loop's output, for any batch and image sizes, with
    ``image_sizes`` (each image cropped) or without (to float32 rounding: the packed tokens are gathered or laid
    out by one reshape instead of a concatenation)."""
    from hypothesis import assume

    from engine.patches.model.image_grids import _patch_crops_without_a_per_image_loop

    assume(not sizes_given or sum(r * c for r, c in grids) > 1)  # the program's stated bound: two patches or more
    model = _tiny_pixtral()
    patched = _patch_crops_without_a_per_image_loop(type(model).forward)
    assert patched is not type(model).forward
    rows, cols = max(g[0] for g in grids), max(g[1] for g in grids)
    pixel_values = torch.randn(len(grids), 3, 4 * rows, 4 * cols)
    image_sizes = torch.tensor([(4 * r, 4 * c) for r, c in grids]) if sizes_given else None
    if not sizes_given:
        pixel_values = pixel_values[..., : 4 * grids[0][0], : 4 * grids[0][1]]
    with torch.no_grad():
        expected, got = model(pixel_values, image_sizes), patched(model, pixel_values, image_sizes)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sizes_given", [False, True])
def test_a_pixtral_tower_exports_for_any_batch_and_image_sizes(sizes_given):
    """Traced with two images, the program runs three of other sizes (the per-image list pinned the batch, and the
    sizes read from ``image_sizes`` met a guard in SDPA)."""
    model = _tiny_pixtral()
    trace = {"pixel_values": torch.randn(2, 3, 16, 24)}
    run = {"pixel_values": torch.randn(3, 3, 12, 8)}
    if sizes_given:
        trace["image_sizes"] = torch.tensor([[16, 24], [8, 20]])
        run["image_sizes"] = torch.tensor([[12, 8], [4, 8], [8, 4]])
    assert_exports_and_runs(model, trace, run, "dynamo", tolerance=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=3), st.sampled_from([1, 2, 3]))
def test_merged_patches_equal_the_per_image_unfold(extra, merge):
    """The gather gives the rows of each image's unfold, for any grid of at least one block (remainders dropped:
    unfold refuses a smaller one) and merge size."""
    from engine.patches.model.image_grids import merged_patches

    grids = [(merge + r, merge + c) for r, c in extra]
    width = 3
    features = torch.randn(sum(r * c for r, c in grids), width)
    expected = []
    for tokens, (r, c) in zip(features.split([r * c for r, c in grids]), grids):
        grid = tokens.view(r, c, width).permute(2, 0, 1).unsqueeze(0)
        expected.append(F.unfold(grid, kernel_size=merge, stride=merge).view(width * merge * merge, -1).t())
    got = merged_patches(features, torch.tensor([(4 * r, 4 * c) for r, c in grids]), 4, merge)
    torch.testing.assert_close(got, torch.cat(expected), rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=3),
       st.sampled_from([3, 4, 7]))
def test_resized_grid_embeddings_equal_the_per_image_interpolation(grids, side):
    """Cosmos3-Edge's per-image antialiased resize (shrinking and growing) read in block order, for any grids."""
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import Cosmos3EdgeVisionEmbeddings

    from engine.patches.model.image_grids import resized_grid_embeddings

    grid_thw = torch.tensor([(t, 2 * h, 2 * w) for t, h, w in grids])
    grid = torch.randn(side, side, 5)
    expected = Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings(grid, grid_thw, 2)
    torch.testing.assert_close(resized_grid_embeddings(grid, grid_thw, 2), expected, rtol=1e-5, atol=1e-5)


class _PositionGrid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(4, 4, 6))

    def forward(self, patches, grid_thw):
        from engine.patches.model.image_grids import resized_grid_embeddings

        positions = resized_grid_embeddings(self.grid, grid_thw, 2)
        torch._check(patches.shape[0] == positions.shape[0])
        return patches + positions


def test_a_resized_position_grid_exports_for_any_grids():
    """Traced at two images, the program takes one and three of other sizes (the loop read each size with
    ``.tolist()``, which the upsample's size check guards on)."""
    def sample(grids):
        grid_thw = torch.tensor(grids)
        return {"patches": torch.randn(int(grid_thw.prod(-1).sum()), 6), "grid_thw": grid_thw}

    assert_exports_and_runs(_PositionGrid(), sample([(1, 4, 6), (1, 2, 2)]), sample([(2, 6, 2), (1, 8, 8), (1, 2, 4)]),
                            "dynamo", tolerance=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.sampled_from([3, 4, 6]), st.booleans())
def test_bilinear_weights_equal_interpolate(height, width, side, shifted):
    """Weights of ``F.interpolate(mode="bilinear")`` to a size, or at HY-V4-VL's ``(n + 0.1) / edge`` scale factor
    (to float32 rounding of the sampling step)."""
    from engine.patches.model.image_grids import bilinear_weights

    # a seeded draw: from torch's global generator the grid depended on test order, and float32 rounding of the step
    # came to 1.8e-5 relative on one grid of a ./dev test run
    grid = torch.randn(1, 2, side, side, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    if shifted:
        expected = F.interpolate(grid, scale_factor=((height + 0.1) / side, (width + 0.1) / side), mode="bilinear",
                                 align_corners=False)
    else:
        expected = F.interpolate(grid, size=(height, width), mode="bilinear", align_corners=False)
    weights = []
    for n in (height, width):
        index, size = torch.arange(n), torch.full((n,), n)
        weights.append(bilinear_weights(index, size, side, (size + 0.1) / side if shifted else None))
    got = torch.einsum("hj,cjk,wk->chw", weights[0], grid[0], weights[1])
    torch.testing.assert_close(got, expected[0], rtol=1e-6, atol=1e-6)  # the kernel keeps its step in float32


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3))
def test_merged_frames_equal_the_per_image_merger(grids):
    """HY-V4-VL's merger run on every frame at once gives the per-image loop's tokens, newlines included."""
    from transformers.models.hy_v4_vl.configuration_hy_v4_vl import HYV4VLVisionConfig
    from transformers.models.hy_v4_vl.modeling_hy_v4_vl import HYV4VLVisionPatchMerger

    from engine.patches.model.image_grids import merged_frames

    config = HYV4VLVisionConfig(hidden_size=8, out_hidden_size=6, spatial_merge_size=2)
    torch.manual_seed(0)
    merger = HYV4VLVisionPatchMerger(config).eval()
    torch.nn.init.normal_(merger.image_newline)
    grid_thw = torch.tensor([(t, 2 * h, 2 * w) for t, h, w in grids])
    hidden_states = torch.randn(1, int(grid_thw.prod(-1).sum()), 8)
    with torch.no_grad():
        items = hidden_states.split(grid_thw.prod(-1).tolist(), dim=1)
        expected = torch.cat([merger(item, size=(h, w)) for (_, h, w), item in zip(grid_thw.tolist(), items)], dim=1)
        got = merged_frames(merger, hidden_states, grid_thw)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 2, 3])),
                min_size=1, max_size=3))
def test_unshuffled_frames_equal_the_per_image_loop(grids):
    """VideoLLaMA3's per-image view and bilinear shrink, for any grids and merge sizes per image."""
    from transformers.models.video_llama_3.modeling_video_llama_3 import VideoLlama3VisionModel

    from engine.patches.model.image_grids import unshuffled_frames

    grid_thw = torch.tensor([(t, m * h, m * w) for t, h, w, m in grids])
    merge_sizes = torch.tensor([m for *_, m in grids])
    hidden_states = torch.randn(int(grid_thw.prod(-1).sum()), 5)
    expected = VideoLlama3VisionModel.pixel_unshuffle(None, hidden_states, grid_thw, merge_sizes)
    torch.testing.assert_close(unshuffled_frames(hidden_states, grid_thw, merge_sizes), expected, rtol=1e-6, atol=1e-6)


class _Vocabulary(torch.nn.Module):
    """Emu3's image vocabulary mapping, as ``convert_img2bpe`` reads it."""

    eol_token_id = 99

    def __init__(self, codes=16):
        super().__init__()
        self.img2bpe_mapping_tensor = torch.randperm(codes) + 100

    def convert_img2bpe(self, img_batch):
        from transformers.models.emu3.modeling_emu3 import Emu3ImageVocabularyMapping

        return Emu3ImageVocabularyMapping.convert_img2bpe(self, img_batch)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=3), st.integers(0, 2**16))
def test_bpe_tokens_of_crops_equal_the_per_image_crops(sizes, seed):
    """Emu3's crops by ``int(size / factor)`` mapped to text tokens and ended by end-of-line, for any image sizes."""
    from engine.patches.model.image_grids import bpe_tokens_of_crops, cropped_codes

    mapping, factor = _Vocabulary(), 4
    grids = torch.randint(0, 16, (len(sizes), 4, 5), generator=torch.Generator().manual_seed(seed))
    image_sizes = torch.tensor([(factor * h + 1, factor * w + 2) for h, w in sizes])
    crops = [g[: int(size[0] / factor), : int(size[1] / factor)] for g, size in zip(grids, image_sizes)]
    expected = torch.cat([mapping.convert_img2bpe(crop).flatten() for crop in crops])
    got = bpe_tokens_of_crops(mapping, cropped_codes(grids, image_sizes, factor))
    assert got.dtype == expected.dtype and torch.equal(got, expected)


class _GlobalViews(torch.nn.Module):
    """DeepSeek-OCR-2's get_image_features over a stand-in tower: each image's projected tokens, then a separator."""

    def __init__(self, get_image_features):
        super().__init__()
        from transformers.modeling_outputs import BaseModelOutput

        class Tower(torch.nn.Module):
            def forward(self, pixel_values, **kwargs):
                return BaseModelOutput(last_hidden_state=pixel_values.flatten(2).transpose(1, 2))

        self.vision_tower, self.multi_modal_projector = Tower(), torch.nn.Linear(3, 4)
        self.vision_model = self.vision_tower  # Step3p7's name for it
        self.view_separator = torch.nn.Parameter(torch.randn(4))
        self.image_newline = torch.nn.Parameter(torch.randn(4))  # UnlimitedOCR's, after each row of the grid
        self.features = get_image_features

    def forward(self, pixel_values):
        return torch.cat(self.features(self, pixel_values).pooler_output, dim=0)


@pytest.mark.parametrize("model", ["deepseek_ocr2", "unlimited_ocr", "step3p7"])
def test_global_views_equal_the_per_image_loop_and_export_for_any_batch(model):
    """DeepSeek-OCR-2's global tokens and separator, UnlimitedOCR's global grid with its newline column, and
    Step3p7's image rows."""
    from engine.patches.model import image_grids

    if model == "deepseek_ocr2":
        from transformers.models.deepseek_ocr2.modeling_deepseek_ocr2 import DeepseekOcr2Model as Model
        rewrite = image_grids._patch_global_views_without_a_per_image_loop
    elif model == "step3p7":
        from transformers.models.step3p7.modeling_step3p7 import Step3p7Model as Model
        rewrite = image_grids._patch_image_rows_without_a_per_image_loop
    else:
        from transformers.models.unlimited_ocr.modeling_unlimited_ocr import UnlimitedOcrModel as Model
        rewrite = image_grids._patch_global_grids_without_a_per_image_loop
    original = _GlobalViews(Model.get_image_features)
    patched = _GlobalViews(rewrite(Model.get_image_features))
    patched.load_state_dict(original.state_dict())
    for batch in (1, 3):
        pixel_values = torch.randn(batch, 3, 3, 3)  # a square grid of tokens (UnlimitedOCR's side is its root)
        torch.testing.assert_close(patched(pixel_values), original(pixel_values), rtol=0, atol=0)
    assert_exports_and_runs(patched, {"pixel_values": torch.randn(2, 3, 3, 3)}, {"pixel_values": torch.randn(3, 3, 3, 3)},
                            "dynamo", tolerance=1e-6)


def _tiny_paddleocr_projector():
    from transformers import PaddleOCRVLConfig
    from transformers.models.paddleocr_vl.modeling_paddleocr_vl import PaddleOCRProjector

    torch.manual_seed(0)
    config = PaddleOCRVLConfig(vision_config={"hidden_size": 8, "spatial_merge_size": 2}, text_config={"hidden_size": 12})
    return PaddleOCRProjector(config).eval()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=3))
def test_block_merge_equals_the_per_image_reshape(blocks):
    """PaddleOCR-VL's projector: each image's 2 x 2 blocks, frame after frame, as the per-image reshape folds them."""
    from engine.patches.model.image_grids import _patch_block_merge_without_a_per_image_loop

    projector = _tiny_paddleocr_projector()
    grid_thw = torch.tensor([(t, 2 * h, 2 * w) for t, h, w in blocks])
    features = torch.randn(int(grid_thw.prod(1).sum()), 8)
    with torch.no_grad():
        expected = projector(features, grid_thw)
        got = _patch_block_merge_without_a_per_image_loop(type(projector).forward)(projector, features, grid_thw)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_a_block_merge_exports_for_other_images_with_bounded_sizes():
    """Traced on two images, the program folds three of other sizes, and no size in it is bounded by data alone
    (the per-image reshape's sizes were read from grid_thw: unbacked, which ExecuTorch planned as a 2**31 view)."""
    grids = {"trace": torch.tensor([[1, 4, 4], [1, 2, 6]]), "run": torch.tensor([[1, 2, 2], [2, 4, 2], [1, 6, 4]])}
    inputs = {k: {"image_features": torch.randn(int(g.prod(1).sum()), 8), "image_grid_thw": g} for k, g in grids.items()}
    from engine.patches.registry import apply_patches

    dims = {"image_features": {0: torch.export.Dim.AUTO}, "image_grid_thw": {0: torch.export.Dim.AUTO}}
    with apply_patches("dynamo"):
        program = torch.export.export(_tiny_paddleocr_projector(), (), inputs["trace"], dynamic_shapes=dims)
    assert not [symbol for symbol in program.range_constraints if str(symbol).startswith("u")]  # no unbacked size
    assert_exports_and_runs(_tiny_paddleocr_projector(), inputs["trace"], inputs["run"], "dynamo", tolerance=1e-5)
