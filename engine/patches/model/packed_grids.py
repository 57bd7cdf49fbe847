"""The grid helpers of packed vision towers (``transformers.vision_utils``) without per-image loops.

Pattern: Qwen-VL-style vision towers pack every image's patches into one sequence, ``hidden_states`` of shape
``(P, d)``, and derive from ``grid_thw`` ``(images, 3)``: the rotary position ids (a loop over
``grid_thw.tolist()`` building ``arange(h)``/``arange(w)`` meshes per image), the per-frame ``cu_seqlens``
(``repeat_interleave(h * w, t)``), the position-embedding interpolation taps (``repeat_interleave`` of each
image's ``h``, ``w`` over its ``t * h * w`` patches), Qwen2.5-VL's window attention order (a loop that sizes
``arange``/``F.pad`` with ``int()`` of each grid value) and NaViT's nearest-bucket position ids (the same loop over
``target_sizes``, MiniCPM-V). Under torch.export ``int()`` of a value read from an
input fails outright ("Could not extract specialized integer from data-dependent expression",
https://github.com/pytorch/pytorch/issues/158786); the other loops pin the number of images and leave sizes that
are sums and quotients of the values read (``u68 // u65``), which no bound on the inputs bounds, so ExecuTorch
cannot plan memory for them; and ``aten.repeat_interleave.Tensor`` is not Core ATen (ExecuTorch's edge verifier
refuses it).

Each packed position's image, frame and (row, col) is a function of its index: comparing ``arange(P)`` with the
images' cumulative patch counts gives its image (the comparison count of ``engine.patches.model.packed_attention``), and the rest
is integer arithmetic on its image's ``h``, ``w``. So the helpers below compute the same tensors for any number of
images with one data-dependent size each: the patch count ``P = sum(t * h * w)`` (``cu_seqlens``: the frame count
``sum(t)``; the window boundaries: the non-empty windows, found by ``nonzero``); the window order is an ``argsort``
of each token's (image, frame, window, row, column) key. ExecuTorch plans those sizes at the largest input cap
(``engine.dim_bounds``), and the tower's own use of them next to its ``(P, d)`` input ties them to that input.

While a model is traced (:func:`vectorized_vision_grids`) the helpers are replaced wherever ``vision_utils`` and
the modeling modules bound them; a value the caller precomputed (passed in ``kwargs``, which the original pops)
and arguments the original does not take go to the original. TODO (transformers): no upstream issue found for the
helpers themselves; their own docstring asks for them to be precomputed outside the traced graph.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from engine.patches.packed_positions import images_of_positions, packed_positions, pixel_shuffle_index
from engine.patches.registry import register_patch, register_trace_context
from engine.swap import swap_attributes

_VISION_UTILS = "transformers.vision_utils"


def frame_boundaries(grid_thw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cu_seqlens`` of one segment per frame (``t`` frames of ``h * w`` patches per image), without
    ``repeat_interleave``: each frame's image as each patch's above, its length that image's ``h * w``."""
    frame_image, _, _ = images_of_positions(grid_thw[:, 0])
    seqlens = (grid_thw[:, 1] * grid_thw[:, 2])[frame_image]
    return F.pad(seqlens.cumsum(0, dtype=dtype), (1, 0), value=0)


def vectorized_helper(original: Callable, compute: Callable, precomputed: tuple[str, ...]) -> Callable:
    """``compute(**bound arguments)``, or ``original`` where the caller's ``kwargs`` holds one of the
    ``precomputed`` keys (the original pops them) or the arguments are not the original's."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def helper(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        caller_kwargs = arguments.pop("kwargs", None) or {}
        if any(key in caller_kwargs for key in precomputed):
            return original(*args, **kwargs)
        return compute(**arguments)

    helper.__vectorized_vision_grid__ = True
    return helper


def _position_ids(grid_thw, spatial_merge_size, include_temporal=False):
    p = packed_positions(grid_thw, spatial_merge_size)
    columns = [p["frame"], p["row"], p["col"]] if include_temporal else [p["row"], p["col"]]
    return torch.stack(columns, dim=-1)


def _cu_seqlens(grid_thw, merge_temporal=False):
    dtype = grid_thw.dtype if torch.jit.is_tracing() else torch.int32
    if merge_temporal:  # one segment per clip: no repeat_interleave in the original
        counts = grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2]
        return F.pad(counts.cumsum(dim=0, dtype=dtype), (1, 0), value=0)
    return frame_boundaries(grid_thw, dtype)


def _interpolation(grid_thw, num_grid_per_side, mode="bilinear", align_corners=False, spatial_merge_size=1,
                   padding="border"):
    from transformers.vision_utils import _interpolation_axis_taps_weights

    p = packed_positions(grid_thw, spatial_merge_size)
    side = num_grid_per_side
    h_taps, h_weights = _interpolation_axis_taps_weights(p["row"], p["height"], side, mode, align_corners, padding)
    w_taps, w_weights = _interpolation_axis_taps_weights(p["col"], p["width"], side, mode, align_corners, padding)
    n = h_taps.shape[1]
    indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, n * n)
    weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, n * n)
    return indices, weights


def _window_index(grid_thw, spatial_merge_size, window_size, patch_size):
    """Qwen2.5-VL's window attention order: the merged tokens (``t * (h/m) * (w/m)`` per image) sorted image by
    image, frame by frame, window by window (``W x W`` merged tokens, raster order, the grid padded up to whole
    windows) and raster order within a window; and the windows' boundaries (empty windows, which the padding makes,
    give none), in patches."""
    merge = spatial_merge_size
    window = window_size // spatial_merge_size // patch_size
    frames, rows, cols = grid_thw[:, 0], grid_thw[:, 1] // merge, grid_thw[:, 2] // merge
    windows_h, windows_w = rows // window + 1, cols // window + 1  # the original pads by window - size % window
    image, local, length = images_of_positions(frames * rows * cols)
    per_frame = (rows * cols)[image]
    frame, within = local // per_frame, local % per_frame
    row, col = within // cols[image], within % cols[image]
    padded = frames * windows_h * windows_w * window * window  # each image's padded grid, a multiple of W * W
    window_of = (frame * windows_h[image] + row // window) * windows_w[image] + col // window
    key = (padded.cumsum(0) - padded)[image] + window_of * window * window + (row % window) * window + col % window
    order = torch.argsort(key)
    # a window's tokens fill its top-left corner (the padding is at the bottom and right): its first token is the
    # one at in-window (0, 0), and an empty window has none (no slice of the data-dependent length either, whose
    # decomposition ExecuTorch's lowering would guard)
    first = ((row % window == 0) & (col % window == 0))[order]
    starts = first.nonzero().squeeze(-1)
    boundaries = torch.cat([starts, starts.new_full((1,), length)]) * (merge * merge)
    return order, boundaries.to(torch.int32)


def _nearest_position_ids(target_sizes, num_patches_per_side):
    """NaViT's (MiniCPM-V) nearest-bucket position ids: each packed patch's (row / h, column / w) bucketed on a
    ``num_patches_per_side`` grid, images one after another."""
    device = target_sizes.device
    boundaries = torch.arange(1 / num_patches_per_side, 1.0, 1 / num_patches_per_side, device=device)
    heights, widths = target_sizes[:, 0], target_sizes[:, 1]
    image, local, _ = images_of_positions(heights * widths)
    width = widths[image]
    bucket_h = torch.bucketize((local // width) / heights[image], boundaries, right=True)
    bucket_w = torch.bucketize((local % width) / width, boundaries, right=True)
    return bucket_h * num_patches_per_side + bucket_w


def frame_index(grid_thw: torch.Tensor) -> torch.Tensor:
    """Kimi-K2.5's per-patch temporal embedding row: 0 for every patch of a single-frame clip, ``frame + 1``
    for frame ``frame`` of a longer one."""
    p = packed_positions(grid_thw)
    return p["frame"] + (grid_thw[p["image"], 0] > 1).to(p["frame"].dtype)


#: the helpers of ``transformers.vision_utils`` replaced: how each is computed without a per-image loop, and the
#: keys of a value the caller precomputed (which the original pops from its ``kwargs`` and returns)
REPLACEMENTS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "get_vision_position_ids": (_position_ids, ("position_ids",)),
    "get_vision_cu_seqlens": (_cu_seqlens, ("cu_seqlens",)),
    "get_vision_interpolation_indices_and_weights": (_interpolation, ("interp_indices", "interp_weights")),
    "get_vision_window_index": (_window_index, ("window_index", "cu_window_seqlens")),
    "get_vision_nearest_position_ids": (_nearest_position_ids, ("position_ids",)),
}


def _binding_modules(originals: dict[str, Any]) -> list[tuple[Any, str]]:
    """Every loaded ``transformers`` module that binds one of ``originals`` (``vision_utils`` and the modeling
    modules that imported the helpers by name)."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == _VISION_UTILS or module_name.startswith("transformers.models.")):
            continue
        for name, original in originals.items():
            if vars(module).get(name) is original:
                found.append((module, name))
    return found


@register_trace_context("dynamo")
@contextlib.contextmanager
def vectorized_vision_grids(model: torch.nn.Module | None = None) -> Iterator[list[str]]:
    """While inside, the grid helpers of ``transformers.vision_utils`` (where loaded) are the vectorized ones above,
    in ``vision_utils`` and in every loaded modeling module that imported them, whatever ``model`` is traced (they
    are module functions); yields the modules patched."""
    vision_utils = sys.modules.get(_VISION_UTILS)
    if vision_utils is None:
        yield []
        return

    originals = {name: getattr(vision_utils, name) for name in REPLACEMENTS if hasattr(vision_utils, name)}
    originals = {n: f for n, f in originals.items() if not getattr(f, "__vectorized_vision_grid__", False)}
    bindings = _binding_modules(originals)
    with swap_attributes([(module, name, vectorized_helper(originals[name], *REPLACEMENTS[name])) for module, name in bindings]):
        yield sorted({module.__name__ for module, _ in bindings})


_WINDOW_PERMUTING_TOWERS = {"qwen2_5_vl": "Qwen2_5_VisionTransformerPretrainedModel",
                            "qwen2_5_omni": "Qwen2_5OmniVisionEncoder", "exaone4_5": "Exaone4_5_VisionModel"}


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.permute_input_for_window_attn"
                            for m, c in _WINDOW_PERMUTING_TOWERS.items()))
def _patch_window_permutation_sizes_tied_to_the_input(original):
    """Pattern: ``input_tensor.reshape(seq_len // unit, unit, -1)[window_index]``, where ``window_index`` and the rotary
    tables permuted alike come from ``grid_thw`` values: under torch.export their lengths are data-dependent symbols
    unrelated to ``seq_len``, the reshape's ``-1`` becomes ``d * u // (seq_len // unit)``, and ExecuTorch plans it at
    every symbol's worst case (GBs, or no finite bound). Rewrite: every valid input has one window entry per merged
    token and a table row per patch, stated as runtime checks that torch.export turns into equalities: the sizes become
    functions of ``seq_len``. No upstream issue found; TODO (transformers): size the window index from
    ``hidden_states``."""

    def permute_input_for_window_attn(self, input_tensor, window_index, seq_len):
        torch._check(input_tensor.shape[0] == seq_len)
        torch._check(window_index.shape[0] == seq_len // self.spatial_merge_unit)
        return original(self, input_tensor, window_index, seq_len)

    return permute_input_for_window_attn


#: models whose ``get_image_features`` split the features per sample by a ``.tolist()`` of per-sample counts
_PIXEL_SHUFFLE_INDEX_MODULES = ("muse_glimmer", "muse_spark")


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.get_vision_pixel_shuffle_index"
                            for m in _PIXEL_SHUFFLE_INDEX_MODULES))
def _patch_pixel_shuffle_index_without_a_loop(original):
    """Pattern: MuSE's vision tower builds its pixel-shuffle gather index in a loop over ``grid_thw.tolist()`` that
    calls ``int()`` on each value (modeling_muse_glimmer.py:771): torch.export refuses ``int()`` of a value read
    from an input ("Could not extract specialized integer from data-dependent expression",
    https://github.com/pytorch/pytorch/issues/158786). The same index from each packed position's image, frame and
    block-order (row, column) (:func:`engine.patches.packed_positions.pixel_shuffle_index`); a value precomputed in ``kwargs``
    goes to the original, which pops it.
    """

    return vectorized_helper(original, pixel_shuffle_index, ("pixel_shuffle_index",))


@register_patch("dynamo", "transformers.models.kimi_k25.modeling_kimi_k25.get_vision_frame_index")
def _patch_frame_index_without_a_loop(original):
    """Pattern: Kimi-K2.5's vision tower builds its per-patch temporal index in a loop over ``grid_thw.tolist()``
    that calls ``int()`` on each value (modeling_kimi_k25.py:91): refused by torch.export as above
    (https://github.com/pytorch/pytorch/issues/158786). The same index from each packed position's image and frame
    (:func:`engine.patches.model.packed_grids.frame_index`); a value precomputed in ``kwargs`` goes to the original.
    """

    return vectorized_helper(original, frame_index, ("frame_index",))
