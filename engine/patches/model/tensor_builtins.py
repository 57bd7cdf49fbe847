"""Python builtins applied to tensors (``list``, ``len``, ``int``) replaced by shape-generic tensor code.

Pattern: ``list(t)``, ``len(t)`` and ``int(t)`` read a tensor as Python values, which pins the dim they read (or
fails on data). The patched builtins are installed as module globals of the named modeling modules only, so the
rest of transformers sees Python's own.
"""

from __future__ import annotations

import builtins

import torch

from engine.patches.registry import register_patch
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
