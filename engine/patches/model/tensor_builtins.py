"""Python builtins applied to tensors (``list``, ``len``, ``int``) replaced by shape-generic tensor code.

Pattern: ``list(t)``, ``len(t)`` and ``int(t)`` read a tensor as Python values, which pins the dim they read (or
fails on data). The patched builtins are installed as module globals of the named modeling modules only, so the
rest of transformers sees Python's own.
"""

from __future__ import annotations

import ast
import builtins
import re

import torch

from engine.patches.registry import register_patch
from engine.patches.source_rewrite import recompiled
from engine.stacked_rows import StackedRows


@register_patch("dynamo", "transformers.models.llava.modeling_llava.list")
def _patch_list_of_stacked_features_as_one_tensor(original):
    """Pattern: ``LlavaModel.get_image_features`` ends with ``list(image_features)``, one tensor per image; iterating a
    tensor pins its first dim, so the program accepts only the traced image count. Rewrite: within that module ``list``
    of a tensor returns a :class:`~engine.stacked_rows.StackedRows`: to the model's only consumer (``torch.cat(...,
    dim=0)``) the one concatenated tensor, and where transformers >= 5.24 returns the list one stacked output that every
    runner gives back per image. Up to 5.23, while generation steps are captured, the capture's own patch below
    (installed first) decides. No upstream issue found; TODO (transformers): return the features unsplit when
    ``image_sizes`` is None."""
    if original is not builtins.list:  # the generation capture's patch is installed: keep its structure
        return original

    def list_(value=(), /):
        if isinstance(value, torch.Tensor) and value.ndim >= 2:
            return StackedRows(value)
        return original(value)

    return list_


@register_patch("generation", "transformers.models.llava.modeling_llava.list", requires={"transformers": "<5.24"})
def _patch_list_of_stacked_features_as_one_tensor_in_capture(original):
    """The pattern above while generation steps are captured: ``list`` of a tensor is the one concatenated tensor,
    so that the captured feature structure (one tensor of rows, which the prefill's placeholder merge counts) is
    the exported one. Up to transformers 5.23, where the list is not an output of the model.
    """

    def list_(value=(), /):
        if isinstance(value, torch.Tensor) and value.ndim >= 2:
            return [value.flatten(0, 1)]
        return original(value)

    return list_


_TENSOR_LEN_MODULES = ("rt_detr", "rt_detr_v2", "d_fine", "deimv2", "pp_doclayout_v2", "pp_doclayout_v3", "depth_pro")


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.len" for m in _TENSOR_LEN_MODULES))
def _patch_len_of_tensor_as_symbolic_size(original):
    """Pattern: ``batch_size = len(source_flatten)`` on a tensor. Python's ``len()`` must return an ``int``, so
    under export it reads the tensor's first dim as its traced value and pins it (``Eq(batch, 2)``): the program
    accepts only the traced batch. Within the module, ``len`` of a tensor with a first dim returns
    ``tensor.shape[0]`` (the same number in eager, a symbolic size under export); anything else goes to the
    builtin. No upstream issue found; TODO (transformers): ``source_flatten.shape[0]`` in the RT-DETR family's
    decoder input preparation.
    """

    def len_(value, /):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
        return original(value)

    return len_


#: modules whose chunked gated delta rule solves its UT system with ``solve_triangular`` in eager and by an
#: unrolled forward substitution when ``is_torchdynamo_exporting()``
_TENSOR_INT_MODULES = ("kimi_k25",)


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.int" for m in _TENSOR_INT_MODULES))
def _patch_int_of_tensor_as_unbacked_value(original):
    """Pattern: ``num_patches = int(patches_per_video.sum())`` sizes the packed index tensors of a vectorized
    helper from a value read from an input. ``int()`` must return a Python int, so torch.export refuses it
    ("Could not extract specialized integer from data-dependent expression",
    https://github.com/pytorch/pytorch/issues/158786). Within the module, ``int`` of a one-element tensor is
    ``tensor.item()``: the same int in eager, a data-dependent size (an unbacked symbol) under export, which the
    helper's ``arange``/``zeros`` take. Anything else goes to the builtin.
    """

    def int_(value=0, *args):
        if not args and isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            return value.item()
        return builtins.int(value, *args)

    return int_


def _tensor_or(name: str, batched: ast.expr, listed: ast.expr) -> ast.IfExp:
    """``<batched> if isinstance(<name>, torch.Tensor) else <listed>``."""
    test = ast.parse(f"isinstance({name}, torch.Tensor)", mode="eval").body
    return ast.IfExp(test=test, body=batched, orelse=listed)


class _SeriesRowsAsOneTensor(ast.NodeTransformer):
    """Over a batch-major tensor: ``[ts[s] for ts in X]`` -> ``X[:, s]``, ``torch.stack([torch.min(ts) for ts in
    X])`` -> ``X.amin(-1)`` and ``[0] * len(X)`` -> a zero tensor as long as ``X``, each kept as it was for a list."""

    matched = 0

    def visit_ListComp(self, node: ast.ListComp) -> ast.AST:
        gen = node.generators[0]
        if (len(node.generators) == 1 and not gen.ifs and isinstance(gen.target, ast.Name)
                and isinstance(gen.iter, ast.Name) and isinstance(node.elt, ast.Subscript)
                and isinstance(node.elt.value, ast.Name) and node.elt.value.id == gen.target.id
                and isinstance(node.elt.slice, ast.Slice)):
            self.matched += 1
            rows = ast.Subscript(value=ast.Name(gen.iter.id, ast.Load()), ctx=ast.Load(),
                                 slice=ast.Tuple([ast.Slice(), node.elt.slice], ast.Load()))
            return _tensor_or(gen.iter.id, rows, node)
        return node

    def _batched(self, node: ast.expr, pattern: str, batched: str) -> ast.expr:
        """``node`` as ``<batched> if isinstance(<rows>, torch.Tensor) else <node>`` where its source matches
        ``pattern`` (``rows`` and the template's other fields are the pattern's named groups)."""
        match = re.fullmatch(pattern, ast.unparse(node))
        if match is None:
            return node
        self.matched += 1
        return _tensor_or(match["rows"], ast.parse(batched.format(**match.groupdict()), mode="eval").body, node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        return self._batched(node, r"torch\.stack\(\[torch\.(?P<op>min|max)\((?P<row>\w+)\) for (?P=row) in (?P<rows>\w+)\]\)",
                             "{rows}.a{op}(-1)")

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        return self._batched(node, r"\[0\] \* len\((?P<rows>\w+)\)", "torch.zeros({rows}.shape[0], dtype=torch.long)")


def padded_series(model: torch.nn.Module, inputs: torch.Tensor, freq=None, context_len: int | None = None):
    """TimesFM's ``_preprocess`` for a batch-major tensor of series of one length: each front-padded with zeros or
    cut to ``context_len``, with its padding mask (ones over the front pad), and the frequencies as a column."""
    context_len = context_len or model.context_len
    length = inputs.shape[1]
    padding = inputs.new_zeros(inputs.shape[0], length + model.horizon_len)
    if length < context_len:
        front = inputs.new_zeros(inputs.shape[0], context_len - length)
        inputs, padding = torch.cat([front, inputs], dim=1), torch.cat([front + 1, padding], dim=1)
    elif length > context_len:
        inputs, padding = inputs[:, -context_len:], padding[:, -(context_len + model.horizon_len):]
    if freq is None:
        return inputs, padding
    return inputs, padding, torch.as_tensor(freq)[: inputs.shape[0]].to(torch.int32).reshape(-1, 1)


_SERIES_MODELS = {"timesfm": "TimesFmModelForPrediction", "timesfm2_5": "TimesFm2_5ModelForPrediction"}


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}.forward" for m, c in _SERIES_MODELS.items()))
def _patch_series_rows_as_one_tensor(original):
    """Pattern: TimesFM's forecast takes a list of series, and iterates the zoo's (batch, length) tensor as one:
    ``[ts[-n:] for ts in past_values]``, a min per row stacked, ``[0] * len(inputs)`` frequencies
    (modeling_timesfm.py:701-716, timesfm2_5:754-755): lists as long as the batch, which pin it. Rewrite: for a
    tensor, the same rows, minima and frequencies as tensor ops (the forward recompiled, decorators kept; a list
    takes its own path), and ``_preprocess`` below pads them at once. TODO (transformers): no upstream issue found."""
    return recompiled(original, _SeriesRowsAsOneTensor())


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.{c}._preprocess" for m, c in _SERIES_MODELS.items()))
def _patch_series_padded_at_once(original):
    """TimesFM's ``_preprocess`` for a batch-major tensor of series (:func:`padded_series`); a list goes to the
    original."""

    def _preprocess(self, inputs, freq=None, context_len=None):
        if isinstance(inputs, torch.Tensor):
            return padded_series(self, inputs, freq, context_len)
        return original(self, inputs, freq, context_len)

    return _preprocess
