"""Attention masks as eager builds them: by broadcasting index tensors instead of ``torch.vmap``, and none at all for
unpadded bidirectional attention."""

from __future__ import annotations

import inspect


from engine.patches.registry import register_patch


def _mask_by_broadcasting_first(sdpa_mask):
    signature = inspect.signature(sdpa_mask)

    def sdpa_mask_(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if not bound.arguments.get("use_vmap"):
            return sdpa_mask(*args, **kwargs)
        bound.arguments["use_vmap"] = False
        try:
            return sdpa_mask(*bound.args, **bound.kwargs)
        except (RuntimeError, TypeError, IndexError):  # not index-based (a Python branch on an index): vmap it
            return sdpa_mask(*args, **kwargs)

    return sdpa_mask_


_MASK_PATTERN = """Pattern: a mask built with an ``and_mask_function``/``or_mask_function`` (sliding windows of
    T5Gemma2's bidirectional encoder, UnlimitedOcr's reference window) makes ``masking_utils`` build the 4-D mask with
    ``torch.vmap`` under ``TransformGetItemToIndex``. torch.export records that as a ``flat_apply`` HOP holding a
    TreeSpec constant, which ``torch.export.save`` cannot write (SerializeError), and ``run_decompositions`` re-traces
    the vmapped graph and fails ("tensor may have escaped from inside a function being vmapped"). The mask functions
    compare and index the four index tensors elementwise, so evaluating them once on broadcast indices (transformers'
    own non-vmap path) gives the same mask; a function that cannot broadcast (a Python branch on an index) raises and
    goes to the vmap path. Upstream: huggingface/transformers#41852 (the vmap path and export)."""


@register_patch("dynamo", "transformers.masking_utils.sdpa_mask")
def _patch_mask_functions_by_broadcasting(original):
    return _mask_by_broadcasting_first(original)


@register_patch("dynamo", "transformers.masking_utils.AttentionMaskInterface._global_mapping")
def _patch_mask_interface_by_broadcasting(original):
    return {name: _mask_by_broadcasting_first(fn) if name == "sdpa" else fn for name, fn in original.items()}


_patch_mask_functions_by_broadcasting.__doc__ = _patch_mask_interface_by_broadcasting.__doc__ = _MASK_PATTERN


@register_patch("dynamo", "transformers.masking_utils._ignore_bidirectional_mask_sdpa")
def _patch_unpadded_bidirectional_mask_skipped(original):
    """Pattern: ``create_bidirectional_mask`` without a padding mask returns ``None`` in eager, but while exporting
    ``_ignore_bidirectional_mask_sdpa`` never skips, so the program builds a mask of ones eager never builds, and
    models whose mask path is broken (Autoformer, Informer) fail only under export. With no padding mask and no
    local window the skip reads no tensor value, so it is taken as in eager: no guard, eager's numbers."""

    def ignore_bidirectional_mask(padding_mask, kv_length, local_attention_size=None):
        if padding_mask is None and local_attention_size is None:
            return True
        return original(padding_mask, kv_length, local_attention_size)

    return ignore_bidirectional_mask
