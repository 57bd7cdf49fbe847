"""The grid helpers of packed vision towers without per-image loops: equal to transformers' helpers, and what lets
a tower's program take any number of images and lower to ExecuTorch."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.patches.model.packed_grids import REPLACEMENTS, frame_index, pixel_shuffle_index, vectorized_helper, vectorized_vision_grids
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
