"""Model patches (scope ``"dynamo"``, so every exporter traces with them): model code that torch.export cannot
trace with dynamic shapes, rewritten to compute the same numbers with shape-generic tensor ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.patches import register_patch

#: modules with the same (copied) ``mamba_selective_scan``
_SELECTIVE_SCAN_MODULES = ("mamba", "falcon_mamba", "jamba", "zamba")


def closed_form_selective_scan(
    hidden_states: torch.Tensor,  # [batch, intermediate, seq]
    dt: torch.Tensor,  # [batch, intermediate, seq]
    A: torch.Tensor,  # [intermediate, state]
    B: torch.Tensor,  # [batch, state, seq]
    C: torch.Tensor,  # [batch, state, seq]
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **_,
):
    """The selective scan ``h_t = exp(A dt_t) h_(t-1) + dt_t B_t x_t``, ``y_t = C_t h_t`` without a loop.

    ``h_t = sum_(s<=t) exp(L_t - L_s) dt_s B_s x_s`` with ``L = cumsum(A dt)``: the decay between two steps is
    one masked ``exp`` of a difference of cumulative sums (never above 1, since ``A dt <= 0``), so the result is
    stable and the sequence length stays symbolic. Memory is O(seq^2) per channel, which export-sized inputs
    afford.
    """
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2).float(), C.transpose(1, 2).float()  # [batch, seq, state]
    log_decay = A[None, :, None, :] * dt[:, :, :, None]  # [batch, inter, seq, state]
    cumulative = log_decay.cumsum(dim=2)
    seq = hidden_states.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=hidden_states.device).tril()  # [t, s]: s <= t
    between = cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :]  # [batch, inter, t, s, state]
    decay = torch.exp(between.masked_fill(~causal[None, None, :, :, None], float("-inf")))
    inputs = dt[:, :, :, None] * B[:, None, :, :] * hidden_states[:, :, :, None].float()  # [batch, inter, s, state]
    states = (decay * inputs[:, :, None, :, :]).sum(dim=3)  # [batch, inter, t, state]
    scan_output = (states.to(input_dtype) * C[:, None, :, :].to(input_dtype)).sum(dim=-1)  # [batch, inter, seq]
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, states[:, :, -1]
    return scan_output


@register_patch("dynamo", *(f"transformers.models.{m}.modeling_{m}.mamba_selective_scan" for m in _SELECTIVE_SCAN_MODULES))
def _patch_selective_scan_loop(original):
    """Pattern: ``mamba_selective_scan``'s torch path runs ``for index in range(seq_len)`` under export (its
    associative scan is disabled while exporting), so torch.export unrolls the loop and pins the sequence length
    to the traced one (``Eq(seq, 8)``: the program then rejects every other prompt length). Replaced by the
    closed-form scan above. No upstream issue found; TODO (transformers): a loop-free scan for the export path.
    """
    return closed_form_selective_scan


@register_patch("dynamo", "transformers.models.llava.modeling_llava.list")
@register_patch("generation", "transformers.models.llava.modeling_llava.list")
def _patch_llava_image_feature_list(original):
    """Pattern: ``LlavaModel.get_image_features`` ends with ``list(image_features)``, splitting the projected
    features into one tensor per image; iterating a tensor pins its first dim, so the exported program accepts
    only the traced number of images. Its only consumer concatenates the list again (``torch.cat(..., dim=0)``),
    so within that module ``list`` of a tensor returns the one already-concatenated tensor instead. Active while
    generation steps are captured too, so that the captured feature structure is the exported one. No upstream
    issue found; TODO (transformers): return the features unsplit when ``image_sizes`` is None.
    """

    def list_(value=(), /):
        if isinstance(value, torch.Tensor) and value.ndim >= 2:
            return [value.flatten(0, 1)]
        return original(value)

    return list_
