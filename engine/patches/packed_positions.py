"""Positions of a packed sequence of images: each position's image, frame, row and column, computed from the
images' sizes with no per-image loop (the pattern families of vision towers share them)."""

from __future__ import annotations

import torch


def images_of_positions(counts: torch.Tensor, length: int | torch.SymInt | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, int | torch.SymInt]:
    """For the ``sum(counts)`` positions of images packed one after another (``counts[i]`` positions each): each
    position's image (the number of images that end at or before it) and its offset within that image; and the
    total (data-dependent under torch.export, unless the caller gives it: the packed features' own length)."""
    if length is None:
        length = counts.sum().item()
        torch._check(length >= 0)
    ends = counts.cumsum(0)
    positions = torch.arange(length, device=counts.device)
    image = (positions[:, None] >= ends[None, :]).sum(-1)
    return image, positions - (ends - counts)[image], length


def packed_positions(grid_thw: torch.Tensor, spatial_merge_size: int | torch.Tensor = 1,
                     length: int | torch.SymInt | None = None) -> dict[str, torch.Tensor]:
    """Per packed position (image after image, frame after frame, each frame's patches in spatial-merge-block
    order): its ``image``, ``frame`` (within the image), ``row`` and ``col``, its image's ``height``/``width``, and
    where its image starts in the packed sequence and its frame within the image (``image_start``,
    ``frame_start``). ``length``: the positions' count where the caller knows it (see :func:`images_of_positions`)."""
    image, offset, length = images_of_positions(grid_thw[:, 0] * grid_thw[:, 1] * grid_thw[:, 2], length)
    height, width = grid_thw[image, 1], grid_thw[image, 2]
    frame, within = offset // (height * width), offset % (height * width)
    merge = spatial_merge_size[image] if isinstance(spatial_merge_size, torch.Tensor) else spatial_merge_size
    blocks_w = width // merge
    row = (within // (merge * merge * blocks_w)) * merge + (within // merge) % merge
    col = ((within // (merge * merge)) % blocks_w) * merge + within % merge
    return {"image": image, "frame": frame, "row": row, "col": col, "height": height, "width": width,
            "frame_start": offset - within, "image_start": torch.arange(length, device=grid_thw.device) - offset}


def pixel_shuffle_index(grid_thw: torch.Tensor, merge_size: int, length: int | torch.SymInt | None = None
                        ) -> torch.Tensor:
    """The gather index that groups each ``merge_size x merge_size`` block of a frame into consecutive rows (MuSE's
    pixel shuffle, PaddleOCR-VL's block fold): for each position in block order, the raster index of its patch in
    the packed sequence. ``length`` as in :func:`packed_positions`."""
    p = packed_positions(grid_thw, merge_size, length)
    return p["image_start"] + p["frame_start"] + p["row"] * p["width"] + p["col"]
