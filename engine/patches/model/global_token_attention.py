"""Longformer-style global attention with every position as a candidate global slot, so no shape is data.

Pattern: Longformer (and LED's encoder, copied from it) give some tokens global attention. The model asks
``is_index_global_attn.flatten().any().item()`` and branches on it, then gathers the global tokens with
``nonzero()`` into ``max_num_global_attn_indices = num_global.max()`` slots: the branch is a guard on data and
every tensor of the global path has a data-dependent size, so torch.export fails (``Eq(u1, 1)``). Here the global
slots are the ``seq_len`` positions themselves: slot ``j`` of a row holds its ``j``-th global token (found by a
``searchsorted`` over the running count of global tokens) and the slots past the row's count are masked exactly
where the model masks its padding slots (``finfo.min`` scores, zero values). The scores of a real slot are the same
dot products, the masked ones add exact zeros to each softmax sum, and a row without global tokens computes the
local-only path's numbers, so one program serves every input; the global tokens' own outputs are gathered back by
their rank instead of an index_put on ``nonzero()`` positions. Cost: the global path is ``seq_len`` slots wide
(O(seq_len^2) scores per head), which export-sized inputs afford; a call asking for attention maps keeps the
model's own path (its maps are ``max_num_global_attn_indices`` wide, a data-dependent shape).
No upstream issue found; the model's own ``onnx_export`` switch covers only the chunking, not the global path.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math

import torch
import torch.nn.functional as F

from engine.patches.registry import register_patch
from engine.patches.source_rewrite import recompiled


def global_slots(is_index_global_attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(order, valid, rank)`` for ``is_index_global_attn`` ``[batch, seq]``: ``order[b, j]`` the position of row
    ``b``'s ``j``-th global token (clamped into range past the row's count), ``valid[b, j]`` whether slot ``j``
    holds one, ``rank[b, p]`` the slot of the global token at position ``p``."""
    seq_len = is_index_global_attn.shape[1]
    running = is_index_global_attn.long().cumsum(1)  # [batch, seq]: global tokens at or before each position
    slots = torch.arange(seq_len, device=is_index_global_attn.device)
    order = torch.searchsorted(running, slots.expand_as(running).contiguous(), right=True).clamp(max=seq_len - 1)
    valid = slots[None, :] < running[:, -1:]
    rank = (running - 1).clamp(min=0)
    return order, valid, rank


def dense_global_self_attention(self, hidden_states, attention_mask=None, is_index_masked=None,
                                is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    """``LongformerSelfAttention.forward`` (and LED's encoder copy) without output attentions, computed with
    ``seq_len`` global slots (see the module docstring); ``is_global_attn`` is not read."""
    hidden_states = hidden_states.transpose(0, 1)  # [seq, batch, embed]
    seq_len, batch_size, embed_dim = hidden_states.size()
    heads, head_dim, window = self.num_heads, self.head_dim, self.one_sided_attn_window_size
    minimum = torch.finfo(hidden_states.dtype).min

    query = (self.query(hidden_states) / math.sqrt(head_dim)).view(seq_len, batch_size, heads, head_dim)
    query = query.transpose(0, 1)  # [batch, seq, heads, dim]
    key = self.key(hidden_states).view(seq_len, batch_size, heads, head_dim).transpose(0, 1)
    value = self.value(hidden_states).view(seq_len, batch_size, heads, head_dim).transpose(0, 1)

    local_scores = self._sliding_chunks_query_key_matmul(query, key, window)
    removed = (attention_mask != 0)[:, :, None, None]
    float_mask = removed.type_as(query).masked_fill(removed, minimum)
    local_scores = local_scores + self._sliding_chunks_query_key_matmul(float_mask.new_ones(float_mask.size()),
                                                                        float_mask, window)

    order, valid, rank = global_slots(is_index_global_attn)
    by_slot = order[:, :, None, None].expand(-1, -1, heads, head_dim)
    global_keys = key.gather(1, by_slot)  # [batch, slot, heads, dim]
    global_scores = torch.einsum("blhd,bshd->blhs", (query, global_keys))
    global_scores = global_scores.masked_fill(~valid[:, None, None, :], minimum)

    probs = F.softmax(torch.cat((global_scores, local_scores), dim=-1), dim=-1, dtype=torch.float32)
    probs = probs.masked_fill(is_index_masked[:, :, None, None], 0.0).type_as(local_scores)
    probs = F.dropout(probs, p=self.dropout, training=self.training)

    global_values = torch.where(valid[:, :, None, None], value.gather(1, by_slot), 0.0)
    from_global = torch.matmul(probs.narrow(-1, 0, seq_len).transpose(1, 2).clone(),
                               global_values.transpose(1, 2).clone()).transpose(1, 2)
    from_local = self._sliding_chunks_matmul_attn_probs_value(probs.narrow(-1, seq_len, 2 * window + 1).contiguous(),
                                                              value, window)
    attn_output = (from_global + from_local).transpose(0, 1).reshape(seq_len, batch_size, embed_dim).contiguous()

    # the global tokens' own outputs: their queries over every key
    global_hidden = torch.where(valid.T[:, :, None], hidden_states.gather(
        0, order.T[:, :, None].expand(-1, -1, embed_dim)), 0.0)  # [slot, batch, embed]
    global_query = (self.query_global(global_hidden) / math.sqrt(head_dim)).contiguous()
    global_query = global_query.view(seq_len, batch_size * heads, head_dim).transpose(0, 1)
    global_key = self.key_global(hidden_states).contiguous().view(-1, batch_size * heads, head_dim).transpose(0, 1)
    global_value = self.value_global(hidden_states).contiguous().view(-1, batch_size * heads, head_dim).transpose(0, 1)
    scores = torch.bmm(global_query, global_key.transpose(1, 2)).view(batch_size, heads, seq_len, seq_len)
    scores = scores.masked_fill(~valid[:, None, :, None], minimum)
    scores = scores.masked_fill(is_index_masked[:, None, None, :], minimum)
    global_probs = F.softmax(scores.view(batch_size * heads, seq_len, seq_len), dim=-1, dtype=torch.float32)
    global_probs = F.dropout(global_probs.type_as(scores), p=self.dropout, training=self.training)
    global_output = torch.bmm(global_probs, global_value).view(batch_size, heads, seq_len, head_dim)
    at_position = global_output.gather(2, rank[:, None, :, None].expand(-1, heads, -1, head_dim))
    at_position = at_position.permute(2, 0, 1, 3).reshape(seq_len, batch_size, embed_dim)
    attn_output = torch.where(is_index_global_attn.T[:, :, None], at_position, attn_output)
    return (attn_output.transpose(0, 1),)


class _SizeDivisionAsFloorDivision(ast.NodeTransformer):
    """``torch.div(a, b, rounding_mode="trunc"|"floor")`` -> ``a // b`` (for functions whose operands are sizes:
    non-negative ints, where the three agree)."""

    matched = 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        modes = [k.value for k in node.keywords if k.arg == "rounding_mode"]
        if (isinstance(func, ast.Attribute) and func.attr == "div" and isinstance(func.value, ast.Name)
                and func.value.id == "torch" and len(node.args) == 2 and len(node.keywords) == 1 and modes
                and isinstance(modes[0], ast.Constant) and modes[0].value in ("trunc", "floor")):
            self.matched += 1
            return ast.copy_location(ast.BinOp(left=node.args[0], op=ast.FloorDiv(), right=node.args[1]), node)
        return node


_GLOBAL_TOKEN_CLASSES = (("longformer", "LongformerSelfAttention"), ("led", "LEDEncoderSelfAttention"))


class _ZeroPaddingBranchTaken(ast.NodeTransformer):
    """``if padding_len > 0: <body>`` -> ``<body>``, with each ``x[..., :-padding_len]`` in it made
    ``x[..., : x.shape[d] - padding_len]`` (an empty slice at 0 otherwise)."""

    matched = 0

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt]:
        self.generic_visit(node)
        test = node.test
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "padding_len"
                and len(test.ops) == 1 and isinstance(test.ops[0], ast.Gt) and isinstance(test.comparators[0], ast.Constant)
                and test.comparators[0].value == 0 and not node.orelse):
            self.matched += 1
            return [self._end_slices(stmt) for stmt in node.body]
        return node

    @staticmethod
    def _end_slices(stmt: ast.stmt) -> ast.stmt:
        for sub in ast.walk(stmt):
            if not isinstance(sub, ast.Subscript):
                continue
            parts = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            for dim, part in enumerate(parts):
                upper = getattr(part, "upper", None) if isinstance(part, ast.Slice) else None
                if (isinstance(upper, ast.UnaryOp) and isinstance(upper.op, ast.USub)
                        and isinstance(upper.operand, ast.Name) and upper.operand.id == "padding_len"):
                    size = ast.Subscript(value=ast.Attribute(value=sub.value, attr="shape", ctx=ast.Load()),
                                         slice=ast.Constant(dim), ctx=ast.Load())
                    part.upper = ast.BinOp(left=size, op=ast.Sub(), right=upper.operand)
        return stmt


@register_patch("dynamo", "transformers.models.longformer.modeling_longformer.LongformerModel._pad_to_window_size",
                "transformers.models.led.modeling_led.LEDEncoder._pad_to_window_size",
                "transformers.models.led.modeling_led.LEDEncoder.forward")
def _patch_window_padding_without_its_branch(original):
    """Pad to the attention window (and cut the padding off again) whatever the padding length, 0 included.

    Pattern: Longformer and LED pad to a multiple of ``attention_window`` under ``if padding_len > 0:`` (LED also
    unpads): a guard on ``seq_len % window`` (``(4 - s % 4) % 4 <= 0``), so a program traced at a length needing padding
    rejects multiples of the window, and vice versa.

    Rewrite: the branch always taken (padding by 0 is a no-op), after a ``torch._check`` that the masks and ids padded
    along have the tokens' length (else ``pad != 0`` is guarded). Torch's layout probe of the sliced-off padding still
    guards ``pad != 0`` (pytorch/pytorch#165032). No upstream issue found for the branch."""
    rewritten = recompiled(original, _ZeroPaddingBranchTaken())
    if original.__name__ != "_pad_to_window_size" or rewritten is original:
        return rewritten

    signature = inspect.signature(original)

    @functools.wraps(original)
    def _pad_to_window_size(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        tokens = bound.get("input_ids") if bound.get("input_ids") is not None else bound.get("inputs_embeds")
        for name in ("attention_mask", "token_type_ids", "position_ids"):
            if tokens is not None and bound.get(name) is not None:
                torch._check(bound[name].shape[1] == tokens.shape[1])
        return rewritten(*args, **kwargs)

    return _pad_to_window_size


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.{method}" for m, c in _GLOBAL_TOKEN_CLASSES
                            for method in ("_sliding_chunks_query_key_matmul", "_sliding_chunks_matmul_attn_probs_value")))
def _patch_window_counts_as_integer_division(original):
    """Compute the sliding-window chunk counts with ``//`` on sizes, not ``torch.div``.

    Pattern: Longformer's and LED's windowed attention counts its chunks with
    ``torch.div(seq_len, window_overlap, rounding_mode="trunc")`` (and ``_chunk`` views with one): ``torch.div`` of
    two sizes returns a 0-d tensor, a view or ``new_zeros`` sized by it reads it back with ``.item()``, and the size
    is data to torch.export (``Eq(u1, 1)`` in the view's strides). The same quotient as an integer division of the
    sizes stays a symbolic size. No upstream issue found."""
    return recompiled(original, _SizeDivisionAsFloorDivision())


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}._chunk" for m, c in _GLOBAL_TOKEN_CLASSES))
def _patch_window_chunks_by_unfold(original):
    """Cut the overlapping attention chunks with the model's own ``unfold`` path (its ``onnx_export`` branch).

    Pattern: ``_chunk`` views the states into ``torch.div(seq_len, 2w)`` chunks (a 0-d tensor read back with
    ``.item()``: ``Eq(u1, 1)`` under torch.export, as above) and overlaps them with ``as_strided``; with the division
    made ``//`` the program exports, but the decomposed ``as_strided`` of that view computes other chunks on onnx and
    executorch (Longformer's hidden states off by 1.3e-4; dynamo exact; not isolated further). ``unfold(1, 2w, w)``
    is the same overlapping chunks (equal to eager within 1e-6 on all three backends). No upstream issue found."""
    def _chunk(hidden_states, window_overlap, onnx_export: bool = False):
        return original(hidden_states, window_overlap, True)

    return staticmethod(_chunk)


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.forward" for m, c in _GLOBAL_TOKEN_CLASSES))
def _patch_global_attention_over_every_slot(original):
    """Longformer's global attention without its data-dependent branch and ``nonzero()`` gathers:
    :func:`engine.patches.model.global_token_attention.dense_global_self_attention` (its docstring has the pattern); a call
    asking for attention maps keeps the model's path."""

    @functools.wraps(original)
    def forward(self, hidden_states, attention_mask=None, is_index_masked=None, is_index_global_attn=None,
                is_global_attn=None, output_attentions=False):
        if output_attentions:
            return original(self, hidden_states, attention_mask, is_index_masked, is_index_global_attn,
                            is_global_attn, output_attentions)
        return dense_global_self_attention(self, hidden_states, attention_mask, is_index_masked,
                                           is_index_global_attn)

    return forward



