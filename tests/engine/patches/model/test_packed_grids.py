"""The grid helpers of packed vision towers without per-image loops: equal to transformers' helpers, and what lets
a tower's program take any number of images and lower to ExecuTorch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.model.packed_grids import REPLACEMENTS, frame_index, pixel_shuffle_index, vectorized_helper, vectorized_vision_grids
from tests.engine.patches.export_checks import assert_exports_and_runs
from tests.engine.patches.model.test_packed_attention import sample_images, tiny_vision_tower

vision_utils = pytest.importorskip("transformers.vision_utils")


@st.composite
def _grids(draw):
    """``grid_thw`` of 1-3 images or videos with ``h``, ``w`` multiples of their merge size, and that merge size
    (an int for all, or one per image)."""
    images = draw(st.integers(1, 3))
    per_image = draw(st.booleans())
    merges = [draw(st.sampled_from([1, 2])) for _ in range(images)] if per_image else [draw(st.sampled_from([1, 2]))] * images
    grid = [[draw(st.integers(1, 3)), m * draw(st.integers(1, 3)), m * draw(st.integers(1, 3))] for m in merges]
    return torch.tensor(grid), (torch.tensor(merges) if per_image else merges[0])


def _vectorized_helper(name: str):
    return vectorized_helper(getattr(vision_utils, name), *REPLACEMENTS[name])


@settings(max_examples=60, deadline=None)
@given(grid=_grids(), include_temporal=st.booleans(), merge_temporal=st.booleans())
def test_vectorized_helpers_equal_transformers(grid, include_temporal, merge_temporal):
    grid_thw, merge = grid
    calls = [("get_vision_position_ids", lambda f: f(grid_thw, merge, include_temporal=include_temporal)),
             ("get_vision_cu_seqlens", lambda f: f(grid_thw, merge_temporal=merge_temporal))]
    calls += [("get_vision_interpolation_indices_and_weights",
               lambda f, mode=mode, corners=corners: f(grid_thw, 5, mode=mode, align_corners=corners,
                                                       spatial_merge_size=merge if isinstance(merge, int) else 1))
              for mode in ("bilinear", "bicubic") for corners in (False, True)]
    if isinstance(merge, int):  # the models' own helpers of the same loop (Kimi-K2.5, MuSE)
        from transformers.models.kimi_k25 import modeling_kimi_k25
        from transformers.models.muse_glimmer import modeling_muse_glimmer

        for expected, got in [(modeling_kimi_k25.get_vision_frame_index(grid_thw), frame_index(grid_thw)),
                              (modeling_muse_glimmer.get_vision_pixel_shuffle_index(grid_thw, merge),
                               pixel_shuffle_index(grid_thw, merge))]:
            assert got.dtype == expected.dtype and torch.equal(got, expected)
    sizes = grid_thw[:, 1:] * grid_thw[:, :1]  # (h, w) per image, for NaViT's buckets
    calls += [("get_vision_nearest_position_ids", lambda f, n=n: f(sizes, n)) for n in (3, 7)]
    if isinstance(merge, int):  # windows of 1, 2 and 4 merged tokens (window_size // merge // patch_size)
        calls += [("get_vision_window_index", lambda f, w=w: f(grid_thw, merge, w * merge * 2, 2)) for w in (1, 2, 4)]
    for name, call in calls:
        expected, got = call(getattr(vision_utils, name)), call(_vectorized_helper(name))
        for e, g in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (expected, got))):
            assert g.dtype == e.dtype and torch.equal(g, e), name


def test_a_precomputed_value_goes_to_transformers():
    grid_thw = torch.tensor([[1, 2, 4]])
    helper = _vectorized_helper("get_vision_cu_seqlens")
    precomputed = torch.tensor([0, 5])
    caller = {"cu_seqlens": precomputed, "output_attentions": False}
    assert helper(grid_thw, kwargs=caller) is precomputed and caller == {"output_attentions": False}  # popped
    assert torch.equal(helper(grid_thw, kwargs={"output_attentions": False}), vision_utils.get_vision_cu_seqlens(grid_thw))


def test_the_helpers_are_replaced_where_bound_and_restored():
    model = tiny_vision_tower()  # imports a modeling module that binds the helpers by name
    modeling = type(model).__module__
    original = vision_utils.get_vision_position_ids
    with vectorized_vision_grids() as modules:
        assert {"transformers.vision_utils", modeling} <= set(modules)
        assert getattr(vision_utils.get_vision_position_ids, "__vectorized_vision_grid__", False)
        with vectorized_vision_grids():  # nested: the replacement is not wrapped again
            assert vision_utils.get_vision_position_ids.__wrapped__ is original
    assert vision_utils.get_vision_position_ids is original


@pytest.mark.parametrize("backend", ["dynamo", "executorch"])
def test_a_packed_tower_runs_any_number_of_images(backend):
    """Traced with two images, the program runs one and three (transformers' per-image loop pinned the count);
    on ExecuTorch it lowers at all (``repeat_interleave.Tensor`` is not Core ATen, and the sizes read from
    ``grid_thw`` had no upper bound to plan memory for)."""
    if backend == "executorch":
        pytest.importorskip("executorch", reason="the executorch extra is not installed")
    from engine import AutoExporter
    from engine.compare import compare_leaves
    from engine.pytree import get_leaf_tensors
    from engine.runtime import run_exported

    model = tiny_vision_tower()
    config = {"export_format": backend, "dynamic": True}
    program = AutoExporter.from_config(config).export(model, sample_images([(4, 4), (2, 4)]), config=config)
    for grid in ([(4, 4)], [(2, 6), (6, 4), (2, 2)]):
        inputs = sample_images(grid)
        with torch.no_grad():
            expected = get_leaf_tensors(model(**inputs))
        comparison = compare_leaves(expected, run_exported(program, inputs))
        assert comparison.ok, str(comparison)


class WindowPermutingTower(torch.nn.Module):
    """Qwen2.5-VL's pattern: merged tokens reordered into attention windows by an index computed from the grid
    (its length read from data), by ``reshape(seq_len // unit, unit, -1)[window_index]``."""

    spatial_merge_unit = 4

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 6)

    def permute_input_for_window_attn(self, input_tensor, window_index, seq_len):
        input_tensor = input_tensor.reshape(seq_len // self.spatial_merge_unit, self.spatial_merge_unit, -1)
        return input_tensor[window_index, :, :].reshape(seq_len, -1)

    def forward(self, hidden_states, tokens_per_image):
        count = tokens_per_image.sum().item()  # the merged tokens, read from the grid as the helpers do
        torch._check(count >= 0)
        window_index = torch.arange(count).flip(0)
        hidden_states = self.proj(hidden_states)
        seq_len, _ = hidden_states.size()
        return self.permute_input_for_window_attn(hidden_states, window_index, seq_len)


def test_window_permutation_sizes_tied_to_the_packed_input():
    """Unpatched, the permuted rows are ``u`` merged tokens (read from data) times a quotient of the input length,
    and ExecuTorch plans memory for every symbol at its worst case (Qwen2.5-VL: 11.9 GB, which the runtime cannot
    allocate: load_method fails with 0x21); with the lengths checked against the packed input the sizes are
    functions of the input length, the plan is smaller, and one program runs any number of merged tokens as eager
    does."""
    from engine import AutoExporter, run_exported
    from engine.patches.model.packed_grids import _patch_window_permutation_sizes_tied_to_the_input

    def sample(tokens):
        g = torch.Generator().manual_seed(len(tokens))
        return {"hidden_states": torch.randn(4 * sum(tokens), 6, generator=g), "tokens_per_image": torch.tensor(tokens)}

    class Patched(WindowPermutingTower):
        permute_input_for_window_attn = _patch_window_permutation_sizes_tied_to_the_input(
            WindowPermutingTower.permute_input_for_window_attn)

    config = {"export_format": "executorch", "dynamic": True}
    eager = WindowPermutingTower().eval()
    model = Patched().eval()
    model.load_state_dict(eager.state_dict())
    unpatched = AutoExporter.export(eager, sample([3, 5]), config)
    artifact = AutoExporter.export(model, sample([3, 5]), config)
    planned = [sum(a.executorch_program.execution_plan[0].non_const_buffer_sizes) for a in (unpatched, artifact)]
    assert planned[1] < planned[0]
    for tokens in ([3, 5], [2, 4, 6]):
        with torch.no_grad():
            expected = eager(**sample(tokens))
        got = next(iter(run_exported(artifact, sample(tokens)).values()))
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


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
    from engine.patches.model.packed_grids import _patch_crops_without_a_per_image_loop

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
    from engine.patches.model.packed_grids import merged_patches

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

    from engine.patches.model.packed_grids import resized_grid_embeddings

    grid_thw = torch.tensor([(t, 2 * h, 2 * w) for t, h, w in grids])
    grid = torch.randn(side, side, 5)
    expected = Cosmos3EdgeVisionEmbeddings.resize_positional_embeddings(grid, grid_thw, 2)
    torch.testing.assert_close(resized_grid_embeddings(grid, grid_thw, 2), expected, rtol=1e-5, atol=1e-5)


class _PositionGrid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.grid = torch.nn.Parameter(torch.randn(4, 4, 6))

    def forward(self, patches, grid_thw):
        from engine.patches.model.packed_grids import resized_grid_embeddings

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
