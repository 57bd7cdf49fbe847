"""LLaVA-NeXT's any-resolution image features (a grid of tiles per image, unpadded to the image's aspect ratio, a
newline after every row) for every image at once, reading no image size as a Python number.

Pattern: ``get_image_features`` counts each image's tiles with ``image_size_to_num_patches(image_size.tolist())``,
whose ``select_best_resolution`` compares float ratios of those values (a data-dependent guard; repro
``tolist_image_sizes_patch_count.py``), then slices, splits and unpads each image in Python loops. Rewrite: the
grids by tensor ops over the pinpoints (:func:`best_grids`), the tower over every tile given, and each image's
features on the largest grid, kept by a mask where eager keeps them (:func:`packed_tiles`), as one RaggedRows.
"""

from __future__ import annotations

import ast

import torch

from engine.patches.registry import register_patch
from engine.patches.source_rewrite import recompiled
from engine.stacked_rows import RaggedRows


def best_grids(image_sizes: torch.Tensor, pinpoints: list, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiles per column and per row of the resolution ``select_best_resolution`` picks for each ``(height, width)``
    of ``image_sizes``: the most effective pixels, then the fewest wasted, then the first listed."""
    heights, widths = (torch.tensor([float(p[i]) for p in pinpoints], dtype=torch.float64, device=image_sizes.device)
                       for i in (0, 1))
    height, width = image_sizes[:, :1].double(), image_sizes[:, 1:].double()
    scale = torch.minimum(widths / width, heights / height)
    effective = torch.minimum(torch.trunc(width * scale) * torch.trunc(height * scale), width * height)
    wasted = torch.where(effective == effective.max(-1, keepdim=True).values, widths * heights - effective, torch.inf)
    best = wasted.argmin(-1)
    return (heights[best] // tile).long(), (widths[best] // tile).long()


def packed_tiles(features: torch.Tensor, first_tiles: torch.Tensor, grids: tuple[torch.Tensor, torch.Tensor],
                 image_sizes: torch.Tensor, side: int, most: tuple[int, int], newline: torch.Tensor | None) -> RaggedRows:
    """Each image's base tile then its grid of tiles as ``side`` x ``side`` feature maps side by side, cropped as
    ``unpad_image`` crops it (rows, or columns, centred on the image's aspect ratio), a ``newline`` after each row:
    eager's ``pack_image_features`` rows, from ``features`` (tiles, side * side, dim) whose image ``i`` starts at
    tile ``first_tiles[i]``. ``most``: the largest grid's tiles per column and row."""
    tiles_down, tiles_across = grids
    row = torch.arange(most[0] * side, device=features.device)[None, :, None]
    col = torch.arange(most[1] * side, device=features.device)[None, None, :]
    tile = first_tiles[:, None, None] + 1 + (row // side) * tiles_across[:, None, None] + col // side
    canvas = features[tile.clamp(max=features.shape[0] - 1), (row % side) * side + col % side]
    height, width = (tiles_down * side).double(), (tiles_across * side).double()
    original_height, original_width = image_sizes[:, 0].double(), image_sizes[:, 1].double()
    wider = original_width / original_height > width / height
    # int(round(x, 7)) as unpad_image; round(x * 1e7) / 1e7 is aten.round.decimals, which is not Core ATen
    kept_height = torch.trunc(torch.round(original_height * (width / original_width) * 1e7) / 1e7)
    kept_width = torch.trunc(torch.round(original_width * (height / original_height) * 1e7) / 1e7)
    top = torch.where(wider, torch.div(height - kept_height, 2, rounding_mode="floor"), 0)[:, None, None]
    left = torch.where(wider, 0, torch.div(width - kept_width, 2, rounding_mode="floor"))[:, None, None]
    rows = (row >= top) & (row < height[:, None, None] - top)
    keep = rows & (col >= left) & (col < width[:, None, None] - left)
    if newline is not None:
        canvas = torch.cat([canvas, newline.to(canvas.dtype).expand(*canvas.shape[:2], 1, -1)], dim=2)
        keep = torch.cat([keep, rows], dim=2)
    base = features[first_tiles]
    values = torch.cat([base, canvas.flatten(1, 2)], dim=1)
    valid = torch.cat([torch.ones(base.shape[:2], dtype=torch.bool, device=keep.device), keep.flatten(1)], dim=1)
    return RaggedRows(values[valid], valid.sum(-1))


def _anyres_grids(model, image_sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return best_grids(torch.as_tensor(image_sizes), model.config.image_grid_pinpoints, model.config.vision_config.image_size)


def _all_tiles(pixel_values: torch.Tensor, grids) -> tuple[torch.Tensor, torch.Tensor]:
    """Every tile given, and where each image's tiles start: (images, tiles, ...) padded per image, or the images'
    own tiles one after another (base tile and grid)."""
    if pixel_values.dim() == 5:
        starts = torch.arange(pixel_values.shape[0], device=pixel_values.device) * pixel_values.shape[1]
        return pixel_values.flatten(0, 1), starts
    if pixel_values.dim() != 4:
        raise ValueError(f"pixel_values of shape {pixel_values.shape}, expect to be of 4 or 5 dimensions")
    counts = grids[0] * grids[1] + 1
    return pixel_values, torch.cumsum(counts, 0) - counts


def _packed(model, features: torch.Tensor, image_sizes, grids, first_tiles) -> tuple[RaggedRows, torch.Tensor]:
    config = model.config
    side = config.vision_config.image_size // config.vision_config.patch_size
    tile = config.vision_config.image_size
    most = (max(p[0] for p in config.image_grid_pinpoints) // tile, max(p[1] for p in config.image_grid_pinpoints) // tile)
    packed = packed_tiles(features, first_tiles, grids, torch.as_tensor(image_sizes), side, most, model.image_newline)
    return packed, packed.counts


_HELPERS = {"__anyres_grids__": _anyres_grids, "__all_tiles__": _all_tiles, "__packed_tiles__": _packed}


class _AnyresWithoutPerImageLoops(ast.NodeTransformer):
    """In ``get_image_features``: ``image_num_patches = [...]`` -> the grids; the ``if pixel_values.dim() == 5``
    slicing -> every tile and each image's first; the split by counts -> nothing; ``self.pack_image_features(...)``
    -> :func:`packed_tiles`. All four or nothing."""

    _REWRITES = {
        "image_num_patches": "image_num_patches = __anyres_grids__(self, image_sizes)",
        "pixel_values.dim() == 5": "pixel_values, first_tiles = __all_tiles__(pixel_values, image_num_patches)",
        "image_features = torch.split(image_features, image_num_patches, dim=0)": "pass",
        "(image_features, feature_lens)": "image_features, feature_lens = __packed_tiles__(self, image_features, "
                                          "image_sizes, image_num_patches, first_tiles)",
    }

    def __init__(self):
        self.seen: set[str] = set()

    @property
    def matched(self) -> int:
        """What :func:`recompiled` reads: 1 when every rewrite matched, else 0 (the original is kept)."""
        return int(len(self.seen) == len(self._REWRITES))

    def _rewrite(self, key: str) -> ast.stmt:
        self.seen.add(key)
        return ast.parse(self._REWRITES[key]).body[0]

    def visit_Assign(self, node: ast.Assign) -> ast.stmt:
        target, value = ast.unparse(node.targets[0]), ast.unparse(node)
        if target == "image_num_patches" and "image_size_to_num_patches" in value:
            return self._rewrite(target)
        if value in self._REWRITES:
            return self._rewrite(value)
        if target == "(image_features, feature_lens)" and "self.pack_image_features" in value:
            return self._rewrite(target)
        return node

    def visit_If(self, node: ast.If) -> ast.stmt:
        if ast.unparse(node.test) == "pixel_values.dim() == 5":
            return self._rewrite("pixel_values.dim() == 5")
        return self.generic_visit(node)


@register_patch("dynamo", "transformers.models.llava_next.modeling_llava_next.LlavaNextModel.get_image_features",
                "transformers.models.llava_next_video.modeling_llava_next_video.LlavaNextVideoModel.get_image_features")
def _patch_anyres_tiles_without_per_image_loops(original):
    """LLaVA-NeXT's ``get_image_features`` recompiled with its any-resolution steps as tensor ops (module docstring).
    TODO (transformers): no upstream issue found for select_best_resolution under torch.export."""
    return recompiled(original, _AnyresWithoutPerImageLoops(), _HELPERS)
