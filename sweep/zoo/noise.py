"""Random draws inside a forward, and the ``noise`` input that replaces them.

Some forwards draw random numbers when the caller gives none: ViTMAE's and Hiera's pre-training masks shuffle
patches by ``torch.rand(batch, patches)``, PI0 starts its flow from ``torch.randn(...)``. Eager then differs from
itself between two calls, and an exported program (or an ONNX ``RandomUniformLike``) draws other numbers again, so
comparing the two says nothing about the exporter. Each of these forwards takes the draw as a ``noise`` argument;
the zoo records the draws of one eager forward and, when there is exactly one, passes a seeded tensor of the same
shape and kind as ``noise``, which makes the forward deterministic (checked: the forward with it draws nothing).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

#: the factories a forward draws its noise with -> the factory that draws the same kind from a seeded generator
_DRAWS: dict[Callable, Callable[..., torch.Tensor]] = {
    torch.rand: torch.rand, torch.rand_like: torch.rand,
    torch.randn: torch.randn, torch.randn_like: torch.randn, torch.normal: torch.randn,
}


class RecordDraws(TorchFunctionMode):
    """Records ``(factory, shape, dtype)`` of every random draw made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[tuple[Callable, tuple[int, ...], torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _DRAWS and isinstance(out, torch.Tensor):
            self.draws.append((func, tuple(out.shape), out.dtype))
        return out


def run_recording_draws(model: torch.nn.Module, inputs: dict[str, Any]) -> list[tuple[Callable, tuple[int, ...], torch.dtype]]:
    """Runs ``model(**inputs)`` without gradients; returns the random draws it made."""
    with torch.no_grad(), RecordDraws() as recorder:
        model(**inputs)
    return recorder.draws


def noise_for(draws: list[tuple[Callable, tuple[int, ...], torch.dtype]], seed: int) -> torch.Tensor | None:
    """A seeded stand-in for the forward's one draw; ``None`` unless it made exactly one."""
    if len(draws) != 1:
        return None
    func, shape, dtype = draws[0]
    return _DRAWS[func](shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)
