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

import ast
import contextlib
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from engine.patches.registry import register_patch, register_trace_context
from engine.patches.source_rewrite import recompiled
from engine.swap import swap_attributes

_VISION_UTILS = "transformers.vision_utils"


def images_of_positions(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int | torch.SymInt]:
    """For the ``sum(counts)`` positions of images packed one after another (``counts[i]`` positions each): each
    position's image (the number of images that end at or before it) and its offset within that image; and the
    total (data-dependent under torch.export)."""
    length = counts.sum().item()
    torch._check(length >= 0)
    ends = counts.cumsum(0)
    positions = torch.arange(length, device=counts.device)
    image = (positions[:, None] >= ends[None, :]).sum(-1)
    return image, positions - (ends - counts)[image], length


def packed_positions(grid_thw: torch.Tensor, spatial_merge_size: int | torch.Tensor = 1) -> dict[str, torch.Tensor]:
    """Per packed position (image after image, frame after frame, each frame's patches in spatial-merge-block
    order): its ``image``, ``frame`` (within the image), ``row`` and ``col``, its image's ``height``/``width``, and
    where its image starts in the packed sequence and its frame within the image (``image_start``,
    ``frame_start``)."""
    image, offset, length = images_of_positions(grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2])
    height, width = grid_thw[image, 1], grid_thw[image, 2]
    frame, within = offset // (height * width), offset % (height * width)
    merge = spatial_merge_size[image] if isinstance(spatial_merge_size, torch.Tensor) else spatial_merge_size
    blocks_w = width // merge
    row = (within // (merge * merge * blocks_w)) * merge + (within // merge) % merge
    col = ((within // (merge * merge)) % blocks_w) * merge + within % merge
    return {"image": image, "frame": frame, "row": row, "col": col, "height": height, "width": width,
            "frame_start": offset - within, "image_start": torch.arange(length, device=grid_thw.device) - offset}


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


def pixel_shuffle_index(grid_thw: torch.Tensor, merge_size: int) -> torch.Tensor:
    """MuSE's gather index that groups each ``merge_size x merge_size`` block of a frame into consecutive rows:
    for each position in block order, the raster index of its patch in the packed sequence."""
    p = packed_positions(grid_thw, merge_size)
    return p["image_start"] + p["frame_start"] + p["row"] * p["width"] + p["col"]


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
    block-order (row, column) (:func:`engine.patches.model.packed_grids.pixel_shuffle_index`); a value precomputed in ``kwargs``
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


#: modules that size tensors with ``int()`` of a 0-d tensor sum (Kimi-K2.5's ``get_vision_temporal_merge_index``:
#: ``num_patches = int(patches_per_video.sum())``)


def packed_crops(model: torch.nn.Module, pixel_values: torch.Tensor,
                 image_sizes: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Pixtral's packed sequence, for any batch and image sizes: each image's patches cropped to its own size
    (``image_sizes // patch_size``; none given: the whole image), one image after another, with each image's own
    (row, column) positions and a block-diagonal mask that keeps the images apart: ``PixtralTransformer``'s inputs."""
    patch_embeds = model.patch_conv(pixel_values.to(dtype=model.patch_conv.weight.dtype))
    batch, width, rows, cols = patch_embeds.shape
    device = patch_embeds.device
    grid = (batch, rows, cols)
    row = torch.arange(rows, device=device)[None, :, None].expand(grid)
    col = torch.arange(cols, device=device)[None, None, :].expand(grid)
    image = torch.arange(batch, device=device)[:, None, None].expand(grid)
    tokens = patch_embeds.permute(0, 2, 3, 1)
    if image_sizes is None:  # every crop is the whole image
        tokens, row, col, image = tokens.reshape(-1, width), row.reshape(-1), col.reshape(-1), image.reshape(-1)
    else:
        sizes = torch.as_tensor(image_sizes, device=device) // model.patch_size
        keep = (row < sizes[:, 0, None, None]) & (col < sizes[:, 1, None, None])
        tokens, row, col, image = tokens[keep], row[keep], col[keep], image[keep]
        # the packed length is read from image_sizes; the program takes two patches or more (SDPA asks `q_length > 1`)
        torch._check(tokens.shape[0] > 1)
    inputs_embeds = model.ln_pre(tokens[None])
    blocked = torch.full((), torch.finfo(inputs_embeds.dtype).min, dtype=inputs_embeds.dtype, device=device)
    attention_mask = torch.where(image[:, None] == image[None, :], 0.0, blocked).to(inputs_embeds.dtype)
    position_ids = torch.stack([row, col], dim=-1)
    return {"inputs_embeds": inputs_embeds, "attention_mask": attention_mask[None, None],
            "position_embeddings": model.patch_positional_embedding(inputs_embeds, position_ids)}


_PACKED = "__packed_crops__"


class _PackedCropsFirst(ast.NodeTransformer):
    """Puts ``if not <flash>: return self.transformer(**<packed_crops>, **kwargs)`` first in a forward that crops
    each image by ``zip(patch_embeds, image_sizes)``."""

    matched = 0

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        crops = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "zip"
                    and [getattr(a, "id", None) for a in n.args] == ["patch_embeds", "image_sizes"]
                    for n in ast.walk(node))
        if crops and not self.matched:
            self.matched += 1
            first = ast.parse("if not is_flash_attention_requested(self.config):\n"
                              f"    return self.transformer(**{_PACKED}(self, pixel_values, image_sizes), **kwargs)").body
            docstring = int(bool(ast.get_docstring(node)))
            node.body[docstring:docstring] = first
        return node


@register_patch("dynamo", "transformers.models.pixtral.modeling_pixtral.PixtralVisionModel.forward")
def _patch_crops_without_a_per_image_loop(original):
    """Pattern: Pixtral's vision tower crops each image to its size in a list comprehension over
    ``zip(patch_embeds, image_sizes)`` (without ``image_sizes``: ``[(height, width)] * batch_size``), then loops over
    the crops for their positions and mask. The list pins the batch to the traced size, and sizes read from the
    ``image_sizes`` tensor reach SDPA's ``q_length > 1`` as a guard. Rewrite: the forward recompiled from its
    source (decorators kept) with :func:`packed_crops` first: one selection of every image's patches (a reshape
    without ``image_sizes``), positions and a block-diagonal mask from each patch's image, row and column. With
    ``image_sizes`` the program takes two patches or more in all. TODO (transformers): no upstream issue found."""
    return recompiled(original, _PackedCropsFirst(), {_PACKED: packed_crops})


def merged_patches(image_features: torch.Tensor, image_sizes: torch.Tensor, patch_size: int,
                   merge: int) -> torch.Tensor:
    """Each image's ``merge x merge`` blocks of patches, the rows of ``unfold(kernel=stride=merge)`` of its
    ``(h, w)`` grid (``image_sizes // patch_size``), for every image at once: ``image_features`` holds the images'
    patches one after another, row by row; a block's row is its patches' features, channel by channel, each over
    the block in row order (unfold's layout)."""
    sizes = torch.as_tensor(image_sizes, device=image_features.device) // patch_size
    rows, cols = sizes[:, 0], sizes[:, 1]
    image, block, _ = images_of_positions((rows // merge) * (cols // merge))
    first_patch = (rows * cols).cumsum(0) - rows * cols
    block_cols = (cols // merge)[image]
    top = (block // block_cols) * merge
    left = (block % block_cols) * merge
    offsets = torch.arange(merge, device=image_features.device)
    patch = (first_patch[image, None, None] + (top[:, None, None] + offsets[None, :, None]) * cols[image, None, None]
             + left[:, None, None] + offsets[None, None, :])
    blocks = image_features[patch.reshape(-1)].reshape(patch.shape[0], merge * merge, image_features.shape[-1])
    return blocks.transpose(1, 2).reshape(patch.shape[0], merge * merge * image_features.shape[-1])


#: Pixtral-tower projectors that merge each image's patches with a per-image unfold
_PATCH_MERGERS = {"mistral3": "Mistral3PatchMerger", "mistral_large4": "MistralLarge4PatchMerger",
                  "lighton_ocr": "LightOnOcrPatchMerger"}


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.forward" for m, c in _PATCH_MERGERS.items()))
def _patch_merger_without_a_per_image_loop(original):
    """Pattern: the patch merger after Pixtral's tower splits its packed patches per image by
    ``tokens_per_image`` (a list over the ``image_sizes`` tensor) and unfolds each image's grid in a Python loop:
    the loop pins the number of images and the grid sizes are values read from an input. The same rows by one
    gather over every image's blocks (:func:`merged_patches`), then the merging layer. TODO (transformers): no
    upstream issue found."""

    @functools.wraps(original)
    def forward(self, image_features: torch.Tensor, image_sizes: torch.Tensor) -> torch.Tensor:
        merged = merged_patches(image_features, image_sizes, self.patch_size, self.spatial_merge_size)
        return self.merging_layer(merged)

    return forward


def antialiased_bilinear_weights(index: torch.Tensor, size: torch.Tensor, source: int) -> torch.Tensor:
    """Row ``index`` of ``F.interpolate(mode="bilinear", align_corners=False, antialias=True)``'s weights from
    ``source`` positions to ``size`` (both per row of ``index``): the triangle filter, widened by the scale when
    shrinking, over the window the kernel visits, normalised to sum to 1."""
    scale = source / size.double()
    support = scale.clamp(min=1.0)
    center = scale * (index.double() + 0.5)
    first = torch.trunc(center - support + 0.5).clamp(min=0)
    end = torch.trunc(center + support + 0.5).clamp(max=source)
    taps = torch.arange(source, dtype=torch.float64, device=index.device)
    weights = (1 - ((taps - center[:, None] + 0.5) / support[:, None]).abs()).clamp(min=0)
    weights = torch.where((taps >= first[:, None]) & (taps < end[:, None]), weights, 0.0)
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total == 0, 1.0, total)


def resized_grid_embeddings(grid: torch.Tensor, grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """A learned ``(side, side, dim)`` position grid resized (antialiased bilinear) to every packed frame's
    ``(h, w)`` and read at each packed position's (row, column) in spatial-merge-block order."""
    p = packed_positions(grid_thw, merge)
    rows = antialiased_bilinear_weights(p["row"], p["height"], grid.shape[0])
    cols = antialiased_bilinear_weights(p["col"], p["width"], grid.shape[1])
    by_row = torch.einsum("pj,jkd->pkd", rows, grid.double())
    return torch.einsum("pkd,pk->pd", by_row, cols).to(grid.dtype)


@register_patch("dynamo", "transformers.models.cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeVisionEmbeddings.forward")
def _patch_position_grid_resized_without_a_per_image_loop(original):
    """Pattern: Cosmos3-Edge resizes its learned position grid to each image's size in a loop over
    ``grid_thw.tolist()`` (``F.interpolate(size=(h, w), antialias=True)``, modeling_cosmos3_edge.py:385): sizes read
    from an input, which the upsample's own check ``output_size > 0`` guards on. Rewrite: each packed position's
    embedding from the separable filter weights of its row and column (:func:`resized_grid_embeddings`), with the
    packed count checked against ``grid_thw`` as the original does. (Eager's CPU kernel is wrong at an output width
    of 1, every row taking the first row's weights; this computes the filter there, and the merge size keeps
    widths even.) TODO (transformers): no upstream issue found."""

    @functools.wraps(original)
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        patch_embeds = self.patch_embedding(pixel_values.to(dtype=self.patch_embedding.weight.dtype))
        side = self.position_embedding_size
        grid = self.position_embedding.weight.reshape(side, side, -1)
        positions = resized_grid_embeddings(grid, grid_thw, self.config.spatial_merge_size)
        torch._check(patch_embeds.shape[0] == positions.shape[0],
                     lambda: "The packed visual patch count does not match `grid_thw`.")
        return patch_embeds + positions

    return forward
