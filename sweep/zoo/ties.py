"""Top-k selections among tied scores, and the wider random initialisation that removes them.

A tiny random model can score every candidate the same: RT-DETR's query selection takes
``torch.topk(enc_outputs_class.max(-1).values, num_queries)`` over scores that are all exactly ``-ln 2`` when its
encoder output vanishes under ``initializer_range=0.01`` (activations of ~1e-9, which LayerNorm's eps flattens), and
Afmoe's ``_init_weights`` zeroes its router gate, so every expert scores ``sigmoid(0)``. Which of the tied entries a
top-k returns is the kernel's choice: torch's CPU kernel and ONNX ``TopK`` (lowest index first) pick differently,
so the backends then compute with other queries or experts, and the comparison measures the tie-breaking rule, not
the export (pytorch/pytorch#27542). Trained weights do not tie. The zoo records, during one eager forward, the
floating-point ``topk`` calls whose top ``k + 1`` values hold a tie, and rebuilds such a model with every
``initializer_range`` of its config wider (x2, x4, then x10: the least that works) and every constant weight matrix
drawn at that width (:func:`widened`); the rebuild is kept only where it selects among distinct scores and is well
conditioned: its float32 eager outputs match its float64 eager outputs at the sweep's tolerance
(:func:`sweep.zoo.conditioning.well_conditioned`). At x10 DFine's encoder states reach 233 and float32 rounding
alone moves them by 6e-4, past 1e-4: a comparison of backends there measures rounding, so such a rebuild is not
kept (the model stays as built, its ties listed).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: ``initializer_range`` is multiplied by the first of these that removes a model's ties: the least widening,
#: since activations grow with it (DFine's encoder states reach 233 at x10, where float32 rounding alone moves
#: them by 5e-4)
WIDENINGS = (2.0, 4.0, 10.0)
#: top-k neighbours closer than this times the scores' largest magnitude count as tied
NEAR = 1e-5

_TOPK = {torch.topk, torch.Tensor.topk}


class RecordTiedSelections(TorchFunctionMode):
    """Counts the ``topk`` calls on floating-point scores whose ``k + 1`` largest (smallest) values hold a tie."""

    def __init__(self) -> None:
        super().__init__()
        self.tied = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in _TOPK and _ties(*args, **kwargs):
            self.tied += 1
        return out


def _ties(scores: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, **_) -> bool:  # noqa: A002
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point() or scores.dim() == 0:
        return False
    n = scores.shape[dim]
    with torch._C.DisableTorchFunction():
        top = torch.topk(scores.detach().float(), min(int(k) + 1, n), dim=dim, largest=largest).values
        finite = top.isfinite()
        if not bool(finite.any()):
            return False
        scale = top[finite].abs().max()
        # a gap float32 rounding can close (a few hundred ulps of the scores' scale) ties the order as surely
        return bool((top.diff(dim=dim).abs() <= NEAR * scale).logical_and(finite.narrow(dim, 1, top.shape[dim] - 1)).any())


def tied_selections(model: torch.nn.Module, inputs: dict[str, Any]) -> int:
    """How many ``topk`` calls of one eager ``model(**inputs)`` select among tied scores."""
    inputs = copy.deepcopy(inputs)  # a cache among them is updated in place
    with torch.no_grad(), RecordTiedSelections() as recorder:
        model(**inputs)
    return recorder.tied


def widened(config: Any, factor: float) -> bool:
    """Multiplies every ``initializer_range`` in ``config`` and its sub-configs by ``factor``; whether any."""
    from transformers import PreTrainedConfig

    found = False
    value = getattr(config, "initializer_range", None)
    if isinstance(value, float) and value > 0:
        config.initializer_range = value * factor
        found = True
    for child in vars(config).values():
        if isinstance(child, PreTrainedConfig):
            found = widened(child, factor) or found
    return found


def redraw_constant_matrices(model: torch.nn.Module, std: float, seed: int) -> int:
    """Draws every constant weight matrix (a zero-initialised router or head, as ``_init_weights`` leaves it) from
    ``N(0, std)``; how many. Vectors (norm scales, biases) keep their constants, as trained models mostly do."""
    generator = torch.Generator().manual_seed(seed)
    drawn = 0
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2 and parameter.is_floating_point() and parameter.numel() > 1 \
                    and bool((parameter == parameter.flatten()[0]).all()):
                parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * std)
                drawn += 1
    return drawn
