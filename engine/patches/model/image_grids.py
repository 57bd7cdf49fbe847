"""Per-image loops over image grids (crops, resized position grids, patch mergers) computed per packed position.

Pattern: a vision tower or projector loops over the images in Python with each image's size read from an input
(``image_sizes``, ``grid_thw``): the loop pins the number of images, and the sizes are data-dependent (``int()`` of
them fails; the ops they size guard on them). Each packed position's image, frame, row and column is a function of
its index (:mod:`engine.patches.packed_positions`), so one selection or gather over every image gives the same
tensors: crops as a mask, a resize as separable filter weights, a block merge as a gather of each block's patches.
"""

from __future__ import annotations

import ast
import functools
import sys

import torch

from engine.patches.packed_positions import images_of_positions, packed_positions, pixel_shuffle_index
from engine.patches.registry import register_patch
from engine.patches.source_rewrite import recompiled
from engine.stacked_rows import RaggedRows, StackedRows


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
    """Pattern: Pixtral's vision tower crops each image in a list over ``zip(patch_embeds, image_sizes)`` (none
    given: ``[(height, width)] * batch_size``), then loops over the crops for positions and mask: the list pins the
    batch, and sizes read from ``image_sizes`` reach SDPA's ``q_length > 1`` as a guard. Rewrite: the forward
    recompiled (decorators kept) with :func:`packed_crops` first: one selection of every image's patches, positions
    and a block-diagonal mask from each patch's image, row and column. With ``image_sizes`` the program takes two
    patches or more in all. TODO (transformers): no upstream issue found."""
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


@register_patch("dynamo", "transformers.models.paddleocr_vl.modeling_paddleocr_vl.PaddleOCRProjector.forward")
def _patch_block_merge_without_a_per_image_loop(original):
    """Pattern: PaddleOCR-VL's projector splits the packed patches per image by ``grid_thw.prod(1).tolist()`` and
    folds each image's ``spatial_merge_size`` blocks with ``reshape(t, h // m, m, w // m, m, d)`` of sizes read from
    ``grid_thw`` (modeling_paddleocr_vl.py:82-103): a loop as long as the batch, and view sizes that only data bound
    (ExecuTorch's emitter then plans a 2**31 view). Rewrite: each block's patches gathered at once, in the same
    (row, column) order (:func:`pixel_shuffle_index`, its count the features' own length); the norm and the
    linears act per row as before. TODO (transformers): no upstream issue found."""

    @functools.wraps(original)
    def forward(self, image_features: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
        merge = self.merge_kernel_size[0]
        if self.merge_kernel_size[1] != merge:
            return original(self, image_features, image_grid_thw)
        source = pixel_shuffle_index(image_grid_thw, merge, length=image_features.shape[0])
        blocks = self.pre_norm(image_features)[source].reshape(-1, merge * merge * image_features.shape[-1])
        return self.linear_2(self.act(self.linear_1(blocks)))

    return forward


def _antialias_filter(t: torch.Tensor, mode: str) -> torch.Tensor:
    a = t.abs()
    if mode == "bilinear":
        return (1 - a).clamp(min=0)
    return torch.where(a < 1, (1.5 * a - 2.5) * a * a + 1, torch.where(a < 2, ((-0.5 * a + 2.5) * a - 4) * a + 2, 0.0))


ANTIALIAS_TAPS = {"bilinear": 2, "bicubic": 4}  # the filter's width at scale 1


def antialiased_weights(index: torch.Tensor, scale: torch.Tensor, source: int, mode: str = "bilinear") -> torch.Tensor:
    """Row ``index`` of ``F.interpolate(mode=mode, antialias=True)``'s weights over ``source`` positions, ``scale``
    input positions per output one (per row of ``index``, or one for all; align_corners changes only it): ATen's CPU
    kernel's filter (the triangle, or Keys' cubic with a = -0.5 as PIL's), widened by the scale when shrinking, over
    the window the kernel visits, normalised to sum to 1."""
    stretch = scale.double().clamp(min=1.0)[..., None]
    support = ANTIALIAS_TAPS[mode] / 2 * stretch
    center = (scale.double() * (index.double() + 0.5))[..., None]
    first = torch.trunc(center - support + 0.5).clamp(min=0)
    end = torch.trunc(center + support + 0.5).clamp(max=source)
    taps = torch.arange(source, dtype=torch.float64, device=index.device)
    weights = _antialias_filter((taps - center + 0.5) / stretch, mode)
    weights = torch.where((taps >= first) & (taps < end), weights, 0.0)
    total = weights.sum(-1, keepdim=True)
    return weights / torch.where(total == 0, 1.0, total)


def resized_grid_embeddings(grid: torch.Tensor, grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """A learned ``(side, side, dim)`` position grid resized (antialiased bilinear) to every packed frame's
    ``(h, w)`` and read at each packed position's (row, column) in spatial-merge-block order."""
    p = packed_positions(grid_thw, merge)
    rows = antialiased_weights(p["row"], grid.shape[0] / p["height"].double(), grid.shape[0])
    cols = antialiased_weights(p["col"], grid.shape[1] / p["width"].double(), grid.shape[1])
    return separable_read(grid.double(), rows, cols).to(grid.dtype)


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


def _axis_taps(index: torch.Tensor, step: torch.Tensor, source: torch.Tensor):
    """The two source taps and the second's weight of ``F.interpolate(mode="bilinear", align_corners=False)`` at
    output ``index`` of an axis of ``source`` positions sampled every ``step`` (per row, or one for all)."""
    src = ((index.double() + 0.5) * step - 0.5).clamp(min=0)
    low = torch.minimum(src.floor().long(), source - 1)
    return low, torch.minimum(low + 1, source - 1), src - low


def bilinear_weights(index: torch.Tensor, size: torch.Tensor, source: int,
                     scale_factor: torch.Tensor | None = None) -> torch.Tensor:
    """Row ``index`` of ``F.interpolate(mode="bilinear", align_corners=False)``'s weights from ``source`` positions
    to ``size`` (per row of ``index``); with ``scale_factor`` (given to interpolate, not recomputed) the sampling
    step is its inverse rather than ``source / size``. An axis whose size is the source's is copied, as torch's
    kernel does whatever the scale factor."""
    step = 1.0 / scale_factor.double() if scale_factor is not None else source / size.double()
    low, high, frac = _axis_taps(index, step, torch.tensor(source, device=index.device))
    taps = torch.arange(source, device=index.device)
    weights = (torch.where(taps == low[:, None], 1 - frac[:, None], 0.0)
               + torch.where(taps == high[:, None], frac[:, None], 0.0))
    return torch.where((size == source)[:, None], (taps == index[:, None]).double(), weights)


def separable_read(grid: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """A ``(h, w, dim)`` grid read at each position through its row and column weights (``(p, h)``, ``(p, w)``)."""
    return torch.einsum("pkd,pk->pd", torch.einsum("pj,jkd->pkd", rows, grid), cols)


def merged_frames(merger: torch.nn.Module, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """HY-V4-VL's patch merger over every frame at once: each frame's ``merge x merge`` blocks of patches (packed
    row by row, frame after frame) through the merger's strided conv and projection, a newline token after each row
    of blocks; ``(1, tokens, out)`` in the per-frame loop's order."""
    merge = merger.spatial_merge_size
    states = merger.before_rms(hidden_states[0])
    t, h, w = grid_thw[:, 0], grid_thw[:, 1], grid_thw[:, 2]
    per_row = w // merge + 1
    image, offset, _ = images_of_positions(t * (h // merge) * per_row)
    frame, within = offset // ((h // merge) * per_row)[image], offset % ((h // merge) * per_row)[image]
    row, col = within // per_row[image], within % per_row[image]
    newline = col == w[image] // merge
    first = ((t * h * w).cumsum(0) - t * h * w)[image] + frame * (h * w)[image]
    offsets = torch.arange(merge, device=states.device)
    patch = (first[:, None, None] + (row[:, None, None] * merge + offsets[None, :, None]) * w[image, None, None]
             + torch.where(newline, 0, col)[:, None, None] * merge + offsets[None, None, :])
    patch = patch.clamp(max=states.shape[0] - 1)
    blocks = states[patch.reshape(-1)].reshape(patch.shape[0], merge, merge, -1).permute(0, 3, 1, 2)
    tokens = merger.proj_out(merger.proj_act(merger.proj_conv(blocks))).flatten(1)
    tokens = torch.where(newline[:, None], merger.image_newline.to(tokens.dtype)[None, :], tokens)
    return tokens[None]


_MERGED = "__merged_frames__"


class _MergedFramesInsteadOfTheLoop(ast.NodeTransformer):
    """``split_sizes = ...``, ``split_items = ...``, ``processed_items = []`` and the loop over
    ``zip(grid_thw.tolist(), split_items)`` calling ``self.patch_merger`` go; ``torch.cat(processed_items, dim=1)``
    becomes ``__merged_frames__(self.patch_merger, hidden_states, grid_thw)``."""

    _GONE = {"split_sizes", "split_items", "processed_items"}
    matched = 0

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        loops = [s for s in node.body if isinstance(s, ast.For) and "self.patch_merger(" in ast.unparse(s)
                 and ast.unparse(s.iter) == "zip(grid_thw.tolist(), split_items)"]
        if len(loops) != 1:
            return node
        body = []
        for stmt in node.body:
            if stmt is loops[0] or (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                                    and getattr(stmt.targets[0], "id", None) in self._GONE):
                continue
            if isinstance(stmt, ast.Assign) and ast.unparse(stmt.value) == "torch.cat(processed_items, dim=1)":
                stmt.value = ast.parse(f"{_MERGED}(self.patch_merger, hidden_states, grid_thw)", mode="eval").body
                self.matched += 1
            body.append(stmt)
        node.body = body if self.matched else node.body
        return node


@register_patch("dynamo", "transformers.models.hy_v4_vl.modeling_hy_v4_vl.HYV4VLVisionModel.forward")
def _patch_frames_merged_without_a_per_image_loop(original):
    """Pattern: HY-V4-VL's vision tower splits its packed patches by ``grid_thw.prod(-1).tolist()`` and merges each
    image in a loop over ``grid_thw.tolist()`` (modeling_hy_v4_vl.py:1058-1064): sizes read from an input pin the
    number of images and size the reshape. Rewrite: the forward recompiled from its source (decorators kept) with
    the loop replaced by :func:`merged_frames`. TODO (transformers): no upstream issue found."""
    return recompiled(original, _MergedFramesInsteadOfTheLoop(), {_MERGED: merged_frames})


@register_patch("dynamo", "transformers.models.hy_v4_vl.modeling_hy_v4_vl.HYV4VLVisionPatchEmbed.forward")
def _patch_shifted_position_grid_without_a_per_image_loop(original):
    """Pattern: HY-V4-VL resizes its learned position grid per image in a loop over ``grid_thw``, with
    ``scale_factor=(int(h) + 0.1) / edge`` (modeling_hy_v4_vl.py:798-820): ``int()`` of a value read from an input
    (https://github.com/pytorch/pytorch/issues/158786). Rewrite: each packed position's embedding from the bilinear
    weights of its row and column at that scale factor (:func:`bilinear_weights`), frames repeated as the loop does;
    another ``interpolate_mode`` takes the original. TODO (transformers): no upstream issue found."""

    @functools.wraps(original)
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        if self.config.interpolate_mode != "bilinear" or not isinstance(grid_thw, torch.Tensor):
            return original(self, pixel_values, grid_thw)
        patches = pixel_values.reshape(-1, self.config.num_channels, self.patch_size, self.patch_size)
        embeddings = self.patch_embedding(patches.to(dtype=self.patch_embedding.weight.dtype)).flatten(1)
        edge = self.position_edge
        grid = self.position_embedding.weight[1:, :].reshape(edge, edge, self.embed_dim).double()
        p = packed_positions(grid_thw, 1)
        rows = bilinear_weights(p["row"], p["height"], edge, (p["height"] + 0.1) / edge)
        cols = bilinear_weights(p["col"], p["width"], edge, (p["width"] + 0.1) / edge)
        positions = separable_read(grid, rows, cols)
        torch._check(embeddings.shape[0] == positions.shape[0])
        return (embeddings + positions.to(embeddings.dtype)).unsqueeze(0)

    return forward


def unshuffled_frames(hidden_states: torch.Tensor, grid_thw: torch.Tensor, merge_sizes: torch.Tensor) -> torch.Tensor:
    """VideoLLaMA3's ``pixel_unshuffle`` for every frame at once: each frame's patches (packed in ``merge x merge``
    block order) laid out as its ``(h, w)`` grid and shrunk bilinearly to ``(h / merge, w / merge)``, row by row,
    frame after frame."""
    t, h, w, merge = grid_thw[:, 0], grid_thw[:, 1], grid_thw[:, 2], merge_sizes
    rows_out, cols_out = h // merge, w // merge
    image, offset, _ = images_of_positions(t * rows_out * cols_out)
    frame, within = offset // (rows_out * cols_out)[image], offset % (rows_out * cols_out)[image]
    height, width, m = h[image], w[image], merge[image]
    first = ((t * h * w).cumsum(0) - t * h * w)[image] + frame * height * width
    row_taps = _axis_taps(within // cols_out[image], height.double() / rows_out[image], height)
    col_taps = _axis_taps(within % cols_out[image], width.double() / cols_out[image], width)

    def packed(row, col):  # the position of the frame's (row, col) in merge-block order
        return first + ((row // m) * (width // m) + col // m) * m * m + (row % m) * m + col % m

    states = hidden_states.double()
    out = 0
    for row, row_weight in ((row_taps[0], 1 - row_taps[2]), (row_taps[1], row_taps[2])):
        for col, col_weight in ((col_taps[0], 1 - col_taps[2]), (col_taps[1], col_taps[2])):
            out = out + (row_weight * col_weight)[:, None] * states[packed(row, col)]
    return out.to(hidden_states.dtype)


@register_patch("dynamo", "transformers.models.video_llama_3.modeling_video_llama_3.VideoLlama3VisionModel.pixel_unshuffle")
def _patch_unshuffle_without_a_per_image_loop(original):
    """Pattern: VideoLLaMA3's vision tower splits its packed patches by ``grid_thw.prod(1).tolist()`` and, per image,
    views them as a grid of the sizes read from ``grid_thw`` and ``merge_sizes`` before a bilinear shrink
    (modeling_video_llama_3.py:482-497): sizes read from an input size the views (``32*u11*u12*u5 < 2``). Rewrite:
    each output position from its four bilinear taps in the packed sequence (:func:`unshuffled_frames`). TODO
    (transformers): no upstream issue found."""

    @functools.wraps(original)
    def pixel_unshuffle(self, hidden_states, grid_thw, merge_sizes):
        return unshuffled_frames(hidden_states, grid_thw, merge_sizes)

    return pixel_unshuffle


class CroppedCodes:
    """Each image's code grid cropped to its own ``rows`` x ``cols``, held as the uncropped ``grids`` (images, H, W):
    what Emu3's VQ-VAE returns while traced instead of a list of slices of data-dependent sizes."""

    def __init__(self, grids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor):
        self.grids, self.rows, self.cols = grids, rows, cols


def cropped_codes(grids: torch.Tensor, image_sizes: torch.Tensor, factor: int) -> CroppedCodes:
    """``[g[: int(h / factor), : int(w / factor)] for g, (h, w) in zip(grids, image_sizes)]`` as one value."""
    sizes = torch.as_tensor(image_sizes, device=grids.device) // factor
    return CroppedCodes(grids, sizes[:, 0].clamp(max=grids.shape[1]), sizes[:, 1].clamp(max=grids.shape[2]))


def bpe_tokens_of_crops(mapping: torch.nn.Module, crops: CroppedCodes) -> torch.Tensor:
    """``torch.cat([mapping.convert_img2bpe(crop).flatten() for crop in crops])``: each crop's codes mapped to text
    tokens row by row, each row ended by the end-of-line token, image after image."""
    grids = crops.grids
    tokens = mapping.img2bpe_mapping_tensor[grids.to(mapping.img2bpe_mapping_tensor.device)]
    eol = torch.ones((*tokens.shape[:2], 1), dtype=torch.int) * mapping.eol_token_id
    tokens = torch.cat([tokens, eol.to(tokens.device)], dim=-1).to(grids.device)
    row = torch.arange(grids.shape[1], device=grids.device)[None, :, None]
    col = torch.arange(grids.shape[2] + 1, device=grids.device)[None, None, :]
    cols = crops.cols[:, None, None]
    tokens = torch.where(col == cols, tokens[:, :, -1:], tokens)  # each crop's end of line right after its row
    return tokens[(row < crops.rows[:, None, None]) & (col <= cols)]


def crops_as_ragged_rows(crops: CroppedCodes) -> RaggedRows:
    """The crops as the per-image list eager returns: every crop's codes one after another, with each crop's shape."""
    row = torch.arange(crops.grids.shape[1], device=crops.grids.device)[None, :, None]
    col = torch.arange(crops.grids.shape[2], device=crops.grids.device)[None, None, :]
    keep = (row < crops.rows[:, None, None]) & (col < crops.cols[:, None, None])
    return RaggedRows(crops.grids[keep], crops.rows * crops.cols, torch.stack([crops.rows, crops.cols], dim=-1))


_CROPPED = "__cropped_codes__"


class _CodesCroppedByMask(ast.NodeTransformer):
    """``image_tokens = [single_image[: int(...), : int(...)] for single_image, size in zip(image_tokens,
    image_sizes)]`` -> ``image_tokens = __cropped_codes__(image_tokens, image_sizes, self.vision_spatial_factor)``."""

    matched = 0

    def visit_Assign(self, node: ast.Assign) -> ast.Assign:
        if (ast.unparse(node.targets[0]) == "image_tokens" and isinstance(node.value, ast.ListComp)
                and ast.unparse(node.value.generators[0].iter) == "zip(image_tokens, image_sizes)"
                and "self.vision_spatial_factor" in ast.unparse(node.value.elt)):
            node.value = ast.parse(f"{_CROPPED}(image_tokens, image_sizes, self.vision_spatial_factor)",
                                   mode="eval").body
            self.matched += 1
        return node


@register_patch("dynamo", "transformers.models.emu3.modeling_emu3.Emu3VQVAE.encode")
def _patch_code_grids_cropped_by_mask(original):
    """Pattern: Emu3's VQ-VAE crops each image's code grid in a list over the images, ``single_image[:
    int(size[0] / factor), ...]`` (modeling_emu3.py:1018-1021): ``int()`` of a value read from ``image_sizes``
    (https://github.com/pytorch/pytorch/issues/158786), and a list as long as the batch. Rewrite: the forward
    recompiled (decorators kept) returning the crops as one :class:`CroppedCodes`, which the model's
    ``get_image_features``/``get_image_tokens`` (patched below) read with a mask. TODO (transformers): no upstream
    issue found."""
    return recompiled(original, _CodesCroppedByMask(), {_CROPPED: cropped_codes})


@register_patch("dynamo", "transformers.models.emu3.modeling_emu3.Emu3Model.get_image_tokens")
def _patch_image_tokens_of_cropped_codes(original):
    """Emu3's image tokens from :class:`CroppedCodes` (the list comprehension over the crops, as one selection)."""

    @functools.wraps(original)
    def get_image_tokens(self, pixel_values, image_sizes):
        encoded = self.vqmodel.encode(pixel_values, image_sizes, return_dict=True)
        if not isinstance(encoded.image_tokens, CroppedCodes):
            return original(self, pixel_values, image_sizes)
        return bpe_tokens_of_crops(self.vocabulary_mapping, encoded.image_tokens)

    return get_image_tokens


@register_patch("dynamo", "transformers.models.emu3.modeling_emu3.Emu3Model.get_image_features")
def _patch_image_features_of_cropped_codes(original):
    """Emu3's image features from :class:`CroppedCodes`: the tokens of every crop embedded at once, the per-image
    ``pooler_output`` (a split by a list over ``image_sizes``) as one ragged value, which the model concatenates
    again, and the crops as one ragged value of 2-D items; the original where the crops are a list."""

    from transformers.utils.generic import can_return_tuple

    @can_return_tuple  # as the original: it takes `return_dict` out of the kwargs
    @functools.wraps(original)
    def get_image_features(self, pixel_values, image_sizes, **kwargs):
        encoded = self.vqmodel.encode(pixel_values, image_sizes, return_dict=True, **kwargs)
        crops = encoded.image_tokens
        if not isinstance(crops, CroppedCodes):
            return original(self, pixel_values, image_sizes, **kwargs)
        embeddings = self.get_input_embeddings()(bpe_tokens_of_crops(self.vocabulary_mapping, crops))
        sizes = torch.as_tensor(image_sizes, device=embeddings.device) // self.vqmodel.vision_spatial_factor
        fields = {name: value for name, value in encoded.items() if name != "image_tokens"}
        return type(encoded)(**fields, image_tokens=crops_as_ragged_rows(crops),
                             pooler_output=RaggedRows(embeddings, sizes[:, 0] * (sizes[:, 1] + 1)))

    return get_image_features


def global_view_features(original, output_type: str, arrange):
    """``get_image_features`` of the DeepSeek-OCR family without local views: every image's global tokens
    (``arrange(self, projected)``, batch-major) then the view separator, in one concatenation returned as the
    per-image list (:class:`~engine.stacked_rows.StackedRows`); images with local views take the original."""
    from transformers.utils.generic import can_return_tuple

    @can_return_tuple  # as the original: it takes `return_dict` out of the kwargs
    @functools.wraps(original)
    def get_image_features(self, pixel_values, pixel_values_local=None, *args, **kwargs):
        if pixel_values_local is not None:
            return original(self, pixel_values, pixel_values_local, *args, **kwargs)
        vision = self.vision_tower(pixel_values, **kwargs)
        rows = arrange(self, self.multi_modal_projector(vision.last_hidden_state))
        separator = self.view_separator.to(rows.device)[None, None].expand(rows.shape[0], 1, -1)
        output = getattr(sys.modules[original.__module__], output_type)
        return output(last_hidden_state=vision.last_hidden_state, hidden_states=vision.hidden_states,
                      attentions=vision.attentions, pooler_output=StackedRows(torch.cat([rows, separator], 1)))

    return get_image_features


@register_patch("dynamo", "transformers.models.deepseek_ocr2.modeling_deepseek_ocr2.DeepseekOcr2Model.get_image_features")
def _patch_global_views_without_a_per_image_loop(original):
    """Pattern: DeepSeek-OCR-2's ``get_image_features`` assembles each image's features in a loop over the batch
    (``per_image_local = [None] * batch_size``, then ``for idx in range(batch_size)``, modeling_deepseek_ocr2.py:
    1424-1437), pinning the image count. Without local views every image is its global view's tokens and the view
    separator (:func:`global_view_features`). TODO (transformers): no upstream issue found."""
    return global_view_features(original, "DeepseekOcr2ModelOutputWithPooling",
                                lambda self, features: features.reshape(features.shape[0], -1, features.shape[-1]))


def _rows_with_newlines(self, features: torch.Tensor) -> torch.Tensor:
    """UnlimitedOCR's global grid (a square of tokens) with its newline token after each row, row by row."""
    batch, tokens, width = features.shape
    side = int(tokens ** 0.5)
    newline = self.image_newline.to(features.device)[None, None, None].expand(batch, side, 1, width)
    return torch.cat([features.reshape(batch, side, side, width), newline], dim=2).reshape(batch, -1, width)


@register_patch("dynamo", "transformers.models.unlimited_ocr.modeling_unlimited_ocr.UnlimitedOcrModel.get_image_features")
def _patch_global_grids_without_a_per_image_loop(original):
    """Pattern: UnlimitedOCR's ``get_image_features`` (DeepSeek-OCR-2's, with a newline token after each row of the
    global grid) assembles each image's features in a loop over the batch (modeling_unlimited_ocr.py:1856-1884),
    pinning the image count. Without local views every image is its global grid with the newline column, then the
    view separator (:func:`global_view_features`). TODO (transformers): no upstream issue found."""
    return global_view_features(original, "UnlimitedOcrModelOutputWithPooling", _rows_with_newlines)


@register_patch("dynamo", "transformers.models.step3p7.modeling_step3p7.Step3p7Model.get_image_features")
def _patch_image_rows_without_a_per_image_loop(original):
    """Pattern: Step3p7's ``get_image_features`` builds ``num_local_patches = [0] * image_features.shape[0]`` and
    merges each image's features in a loop over it (modeling_step3p7.py:976-988), pinning the image count. Without
    local patches every image's features are its own rows: one reshape for every image, returned as the per-image
    list (:class:`~engine.stacked_rows.StackedRows`). Local patches take the original. TODO (transformers): no
    upstream issue found."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.utils.generic import can_return_tuple

    @can_return_tuple  # as the original: it takes `return_dict` out of the kwargs
    @functools.wraps(original)
    def get_image_features(self, pixel_values, pixel_values_local=None, num_local_patches=None, **kwargs):
        if pixel_values_local is not None or num_local_patches is not None:
            return original(self, pixel_values, pixel_values_local, num_local_patches, **kwargs)
        vision = self.vision_model(pixel_values, **kwargs)
        features = self.multi_modal_projector(vision.last_hidden_state)
        rows = features.reshape(features.shape[0], -1, features.shape[-1])
        return BaseModelOutputWithPooling(last_hidden_state=vision.last_hidden_state, pooler_output=StackedRows(rows),
                                          hidden_states=vision.hidden_states, attentions=vision.attentions)

    return get_image_features
