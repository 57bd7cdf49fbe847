"""Per-sample boolean selections padded to one length, computed as a scatter by rank.

Pattern: ``torch.stack([pad(x[i][keep[i]], length) for i in range(batch)])``: each sample's kept rows moved to the
front and zero-padded (UDOP's merge of the image patches no text token covers). The loop pins the batch, and each
selection has a data-dependent length. Each kept row's place is its rank among the sample's kept rows (a cumulative
sum), so one scatter into zeros gives the padded rows for any batch, with no data-dependent shape; rows ranked past
the length are dropped, as the pad's truncation drops them.
"""

from __future__ import annotations

import functools

import torch

from engine.patches.registry import register_patch


def compacted(values: torch.Tensor, keep: torch.Tensor, length: int | torch.SymInt) -> torch.Tensor:
    """``torch.stack([pad(values[i][keep[i]], length) for i in range(len(values))])``: each sample's rows of
    ``values`` (batch, rows, ...) where ``keep`` (batch, rows) is true, in order, zero-padded or cut to ``length``."""
    rank = keep.long().cumsum(1) - 1
    slot = torch.where(keep & (rank < length), rank, length)  # slot ``length`` collects the dropped rows
    index = slot.view(*slot.shape, *([1] * (values.dim() - 2))).expand_as(values)
    out = values.new_zeros((values.shape[0], length + 1, *values.shape[2:]))
    return out.scatter(1, index, values)[:, :length]


@register_patch("dynamo", "transformers.models.udop.modeling_udop.combine_image_text_embeddings")
def _patch_uncovered_patches_compacted_by_rank(original):
    """Pattern: UDOP's ``combine_image_text_embeddings`` marks the image patches under each text token with
    ``patch_inds[rows, cols] = False`` from Python tuples of the indices (``zip(*ind)`` iterates a tensor: under
    torch.export 'its data is not allocated yet'), then selects and pads the uncovered patches, their boxes and a
    mask of ones per sample in Python loops (modeling_udop.py:210-247). Rewrite: the marks as one scatter and each
    per-sample selection as :func:`compacted`; the text side (the in-place add of the covered patches' embeddings)
    as the original. TODO (transformers): no upstream issue found."""

    @functools.wraps(original)
    def combine_image_text_embeddings(image_embeddings, inputs_embeds, bbox, visual_bbox, attention_mask=None,
                                      num_patches=14, max_len=0, image_size=224, patch_size=16):
        cells = num_patches
        x = torch.clip(torch.floor((bbox[:, :, 0] + bbox[:, :, 2]) / 2.0 * cells).long(), 0, cells - 1)
        y = torch.clip(torch.floor((bbox[:, :, 1] + bbox[:, :, 3]) / 2.0 * cells).long(), 0, cells - 1) * cells
        ocr_points = x + y
        bbox = bbox.to(torch.float32 if bbox.device.type == "mps" else torch.float64)
        target_seg = (bbox.mean(-1) == 0.0) | (bbox.mean(-1) == 1.0)
        covered = torch.gather(image_embeddings, 1, ocr_points.unsqueeze(-1).repeat(1, 1, image_embeddings.size(-1)))
        covered[target_seg] = 0.0
        inputs_embeds += covered  # in place, as the original

        uncovered = torch.ones_like(image_embeddings[:, :, 0], dtype=torch.bool).scatter(1, ocr_points, False)
        if visual_bbox is None:
            from transformers.models.udop.modeling_udop import get_visual_bbox

            visual_bbox = get_visual_bbox(image_size=image_size, patch_size=patch_size)
            visual_bbox = visual_bbox.unsqueeze(0).repeat(image_embeddings.size(0), 1, 1).to(image_embeddings.device)
        length = image_embeddings.size(1) if max_len == 0 else max_len - inputs_embeds.size(1)
        patches = compacted(image_embeddings, uncovered, length)
        boxes = compacted(visual_bbox, uncovered, length)
        inputs_embeds = torch.cat([inputs_embeds, patches], 1)
        bbox = torch.cat([bbox, boxes], 1)
        if attention_mask is not None:
            ones = torch.ones(uncovered.shape, dtype=attention_mask.dtype, device=attention_mask.device)
            attention_mask = torch.cat([attention_mask, compacted(ones, uncovered, length)], 1)
        return inputs_embeds, bbox, attention_mask

    return combine_image_text_embeddings
