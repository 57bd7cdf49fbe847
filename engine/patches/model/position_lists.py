"""Positions built as Python lists or Python ints of sizes, computed as tensor arithmetic instead.

Pattern: ``int(...)`` of a cached length, ``list(range(n))[::-1]``, per-block position lists (Funnel's relative
positions, Reformer's axial positions): Python values made from a symbolic size pin it to the traced one. The same
positions as ``arange``/gather expressions keep it symbolic.
"""

from __future__ import annotations

import builtins
import inspect
import math

import torch

from engine.patches.registry import register_patch
from engine.swap import swap_attributes


@register_patch("dynamo", "transformers.models.prophetnet.modeling_prophetnet.ProphetNetPositionalEmbeddings.forward")
def _patch_int_of_a_cached_position(original):
    """Pattern: a cached step's position computed as ``int(padding_idx + cache length + query length)``
    (``ProphetNetPositionalEmbeddings.forward``): ``int()`` of the symbolic cache length pins it to the traced one, so
    the exported decode step accepts a single cache length. The same position as a tensor expression keeps it symbolic;
    steps without a cache go to the original. Not an upstream bug: the cast exists for the legacy ONNX exporter (its
    comment says so)."""

    signature = inspect.signature(original)  # the cache argument is `cache` from transformers 5.24 (deprecate_kwarg)

    def forward(self, *args, **kwargs):
        try:
            given = signature.bind(self, *args, **kwargs).arguments
        except TypeError:  # a name only the deprecation shim knows: the original sorts it out
            return original(self, *args, **kwargs)
        cache = given.get("cache", given.get("past_key_values"))
        if given.get("position_ids") is None and cache is not None and cache.get_seq_length() != 0:
            position = self.padding_idx + given["inputs_shape"][1] + cache.get_seq_length()
            position_ids = torch.ones((1, 1), dtype=torch.long, device=given["device"]) * position
            return self._forward(position_ids), position_ids
        return original(self, *args, **kwargs)

    return forward


#: (module, class) of the Encodec-style padded Conv1d (its geometry kept in 0-d tensor buffers; the others copy it)
@register_patch("dynamo", "transformers.models.reformer.modeling_reformer.AxialPositionEmbeddings.forward")
def _patch_axial_positions_as_one_gather(original):
    """Pattern: ``AxialPositionEmbeddings.forward`` (eval) cuts the axial grid to the columns the largest position id
    needs (``position_ids.max().item()``) and selects each sample's rows with a Python list over
    ``range(batch_size)``: the loop pins the batch to the traced one (``Eq(batch, 2)``). The grid's rows in
    row-major order are the positions, so one index of the whole grid by ``position_ids`` selects the same rows
    for every sample at once (cutting the grid first drops only rows no id reaches). Training (dropout over the
    grid) goes to the original. No upstream issue found; TODO (transformers): a batched gather in eval.
    """

    def forward(self, position_ids):
        if self.training:
            return original(self, position_ids)
        if math.prod(self.axial_pos_shape) < position_ids.shape[1]:
            return original(self, position_ids)  # its error names the limit
        columns = [weight.expand(self.axial_pos_shape + weight.shape[-1:]).reshape(-1, weight.shape[-1])
                   for weight in self.weights]
        grid = torch.cat(columns, dim=-1)
        return grid[position_ids]

    return forward


class ArithmeticPositions:
    """Funnel's position list ``[head] + [start + k * step for k in range(count)]`` with a symbolic ``count``.

    The relative-position code reads only a list's first and last position and its length, so a pooled list is
    described by those and stays symbolic, where a Python list pins the sequence length."""

    def __init__(self, start, step, count, head=None):
        self.start, self.step, self.count, self.head = start, step, count, head

    @property
    def first(self):
        return self.start if self.head is None else self.head

    @property
    def last(self):
        return self.start + (self.count - 1) * self.step

    @property
    def size(self):
        return self.count + (self.head is not None)

    def tail(self, drop_last: bool = False) -> ArithmeticPositions:
        """``positions[1:]`` (``[1:-1]`` with ``drop_last``)."""
        if self.head is not None:
            start, count = self.start, self.count
        else:
            start, count = self.start + self.step, self.count - 1
        return ArithmeticPositions(start, self.step, torch.sym_max(count - drop_last, 0))

    def every_other(self) -> ArithmeticPositions:
        """``positions[::2]`` of a list without a head."""
        return ArithmeticPositions(self.start, 2 * self.step, (self.count + 1) // 2)


_FUNNEL = "transformers.models.funnel.modeling_funnel"
_FUNNEL_PATTERN = """Pattern: ``FunnelAttentionStructure.get_position_embeds`` (relative-shift attention) builds
    ``pos = list(range(seq_len))`` and pools it with Python slices (``stride_pool_pos``) to size the relative
    position ``arange`` (``relative_pos``): ``range`` of the symbolic length pins it to the traced one (``Eq(seq, 8)``;
    transformers chose Python ints on purpose, its comment says, to keep those sizes static). While
    ``get_position_embeds`` runs on a symbolic length, ``list(range(seq_len))`` is an :class:`ArithmeticPositions`,
    which the two methods pool and measure as they do the list (the same ints; lists go to the originals). No
    upstream issue found; TODO (transformers): position ids from ``torch.arange`` on the symbolic length."""


@register_patch("dynamo", f"{_FUNNEL}.FunnelAttentionStructure.get_position_embeds")
def _patch_relative_shift_positions_of_symbolic_length(original):
    def get_position_embeds(self, seq_len, dtype, device):
        if not isinstance(seq_len, torch.SymInt):
            return original(self, seq_len, dtype, device)
        def range_(*args):
            return ArithmeticPositions(0, 1, seq_len) if len(args) == 1 and args[0] is seq_len else builtins.range(*args)

        def list_(value=(), /):
            return value if isinstance(value, ArithmeticPositions) else builtins.list(value)

        module = inspect.getmodule(original)
        # only while this call runs: the module's other code sees the builtins (the swap deletes what it added)
        with swap_attributes([(module, "range", range_), (module, "list", list_)]):
            return original(self, seq_len, dtype, device)

    return get_position_embeds


@register_patch("dynamo", f"{_FUNNEL}.FunnelAttentionStructure.stride_pool_pos")
def _patch_stride_pooled_positions(original):
    def stride_pool_pos(self, pos_id, block_index):
        if not isinstance(pos_id, ArithmeticPositions):
            return original(self, pos_id, block_index)
        if not self.config.separate_cls:
            return pos_id.every_other()
        pooled = pos_id.tail(drop_last=self.config.truncate_seq).every_other()
        pooled.head = -(2**block_index) + 1
        return pooled

    return stride_pool_pos


@register_patch("dynamo", f"{_FUNNEL}.FunnelAttentionStructure.relative_pos")
def _patch_relative_positions_as_arithmetic(original):
    def relative_pos(self, pos, stride, pooled_pos=None, shift=1, device=None):
        if not isinstance(pos, ArithmeticPositions):
            return original(self, pos, stride, pooled_pos, shift, device)
        pooled_pos = pos if pooled_pos is None else pooled_pos
        max_dist = pooled_pos.first - pos.first + shift * pooled_pos.size * stride
        min_dist = pooled_pos.first - pos.last
        return torch.arange(max_dist, min_dist - 1, -stride, dtype=torch.long, device=device)

    return relative_pos


for _factory in (_patch_relative_shift_positions_of_symbolic_length, _patch_stride_pooled_positions,
                 _patch_relative_positions_as_arithmetic):
    _factory.__doc__ = _FUNNEL_PATTERN


@register_patch("dynamo", f"{_FUNNEL}._relative_shift_gather")
def _patch_relative_shift_as_gather(original):
    """Pattern: ``_relative_shift_gather`` shifts each query row's relative scores by reshaping
    ``(seq, max_rel)`` to ``(max_rel, seq)``, dropping ``shift`` rows and reshaping back; on a symbolic length the
    reshape of the sliced view guards a divisibility of the traced sizes (``(...) % (1 + (seq - 1)//2) != 0``),
    which other lengths break. The same selection as the gather its own comment gives:
    ``scores[i, shift * (seq - i) + j]`` (exactly equal on every length the model accepts, tested). No upstream
    issue found; TODO (transformers): use the gather on the export path.
    """

    def relative_shift_gather(positional_attn, context_len, shift):
        batch, heads, seq, _ = positional_attn.shape
        rows = torch.arange(seq, device=positional_attn.device)[:, None]
        cols = torch.arange(context_len, device=positional_attn.device)[None]
        index = (shift * (seq - rows) + cols).expand(batch, heads, seq, context_len)
        return positional_attn.gather(3, index)

    return relative_shift_gather


@register_patch("dynamo", f"{_FUNNEL}.upsample")
def _patch_repeat_upsample_as_gather(original):
    """Pattern: the decoder's ``upsample`` repeats the pooled tokens ``stride`` times (``repeat_interleave``), pads and
    cuts them with ``output[:, :target_len - 1]``. On a symbolic length the slice's clamp and the cut view's contiguity
    are decided by the traced sizes (``Eq(128*((seq - 1)//4) + 96, 32*seq - 32)`` in ``check_contiguous_sizes_strides``
    at 8 tokens, stride 4), which other lengths break. Rewrite: the same rows as one gather: position ``p`` copies
    pooled token ``p // stride``, or zeros past the pooled tokens where ``truncate_seq`` pads. No upstream issue found;
    TODO (transformers): index the pooled tokens on the export path."""

    def upsample(x, stride, target_len, separate_cls=True, truncate_seq=False):
        if stride == 1:
            return original(x, stride, target_len, separate_cls, truncate_seq)
        if separate_cls:
            cls, x = x[:, :1], x[:, 1:]
            target_len = target_len - 1
        source = torch.arange(target_len, device=x.device) // stride
        rows = x.index_select(1, source.clamp(max=x.shape[1] - 1))
        if separate_cls and truncate_seq:  # the padded positions are zeros
            rows = torch.where((source < x.shape[1])[None, :, None], rows, 0)
        return torch.cat([cls, rows], dim=1) if separate_cls else rows

    return upsample


@register_patch("dynamo", "transformers.models.cpmant.modeling_cpmant.CpmAntModel._prepare_attention_mask")
def _patch_descending_positions_as_arange(original):
    """Pattern: ``CpmAntModel._prepare_attention_mask`` builds the left-padding mask from
    ``torch.tensor(list(range(seqlen - prompt_length))[::-1])``: a Python list sized by the sequence length, which
    pins it to the traced one (``Eq(seq, 8)``). The same descending positions are ``torch.arange(n - 1, -1, -1)``,
    which keeps the length symbolic; the rest of the mask is the original's. No upstream issue found; TODO
    (transformers): ``torch.arange`` there.
    """

    def _prepare_attention_mask(self, input_ids, span, context, length):
        batch, seqlen, device = input_ids.size(0), input_ids.size(1), input_ids.device
        directional_mask_2d = torch.arange(seqlen, device=device) <= torch.arange(seqlen, device=device).view(-1, 1)
        attention_mask = context[:, None, :] | (
            context[:, :, None].logical_not() & directional_mask_2d.view(1, seqlen, seqlen)
        )
        attention_mask = attention_mask & (span[:, None, :] == span[:, :, None])
        descending = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=device)
        mask_1d = descending[None, :].repeat(batch, 1) < length[:, None]
        mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
        return mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & attention_mask

    return _prepare_attention_mask


@register_patch("dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer."
                          "FastSpeech2ConformerRelPositionalEncoding.forward")
def _patch_relative_positions_for_the_length(original):
    """Pattern: FastSpeech2's relative positional encoding slices a 5,000-position table around its centre by the
    sequence length, after comparing the table with ``2 * length - 1`` in Python to decide whether to rebuild it
    (modeling_fastspeech2_conformer.py:727, 763-766): the decoder's length is the regulated frame count, read from the
    predicted durations, so both guard on a data-dependent size. The table's rows are one function of the position,
    so the encoding built for the length (the original's own ``extend_pos_enc`` without a table) holds the same values
    as the slice, for any length. TODO (transformers): no upstream issue found."""

    def forward(self, feature_representation):
        pos_emb = self.extend_pos_enc(feature_representation)
        return self.dropout(feature_representation * self.input_scale), self.dropout(pos_emb)

    return forward


def relative_shift(scores: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's relative shift of ``(..., T, 2T - 1)`` scores over relative positions ``T - 1 ... -(T - 1)``
    to ``(..., T, T)`` over keys: query ``i`` and key ``j`` read relative position ``i - j``, column ``T - 1 - i + j``;
    one gather instead of the pad-and-view trick."""
    length = scores.shape[-2]
    query = torch.arange(length, device=scores.device)
    column = (length - 1 - query[:, None] + query[None, :]).expand(*scores.shape[:-1], length)
    return scores.gather(-1, column)


@register_patch("dynamo", "transformers.models.fastspeech2_conformer.modeling_fastspeech2_conformer."
                          "FastSpeech2ConformerAttention.shift_relative_position_tensor")
def _patch_relative_shift_as_a_gather(original):
    """Pattern: the relative shift by padding a column and viewing the scores as ``(T + 1, T)``
    (``shift_relative_position_tensor``, modeling_fastspeech2_conformer.py:386-391): a view of a length that is
    data-dependent in FastSpeech2's decoder (the regulated frame count) guards on its contiguity. The same entries by
    one gather (:func:`relative_shift`). TODO (transformers): no upstream issue found."""

    def shift_relative_position_tensor(self, pos_tensor):
        return relative_shift(pos_tensor)

    return shift_relative_position_tensor
